// SPDX-License-Identifier: MIT
/*
 * preload_cuda.c - libkvdmabuf-preload.so's CUDA driver interposer: sleep
 * and wake of declared KV regions driven by the engine's own cuMemUnmap,
 * cuMemMap and cuMemSetAccess (semantics: kvdmabuf_preload.h).
 *
 * Entry points (libcuda exports them unversioned; the version script gives
 * them the preload's default version, which unversioned references and
 * dlsym() bind to):
 *   cuMemUnmap, cuMemMap, cuMemSetAccess, cuMemAddressFree (CUDA 10.2,
 *     one ABI each);
 *   cuMemGetHandleForAddressRange (11.7): forwarded; a dma-buf it makes
 *     is noted with the memory it holds (the engine's own dma-buf MRs);
 *   cuGetProcAddress (the CUDA 11.3 symbol: symbol, pfn, cudaVersion,
 *     flags) and cuGetProcAddress_v2 (12.0: the same and symbolStatus; what
 *     cuda.h's cuGetProcAddress macro names): forwarded, then where the
 *     driver returned an entry point for one of the seven names, the
 *     preload's own is handed back instead (for "cuGetProcAddress", the
 *     wrapper of the ABI the driver chose: the pointer it returned, else
 *     _v2 from cudaVersion 12000 on). Flags pass through untouched.
 * Each forwards to the driver's symbol found with dlsym(RTLD_NEXT), else
 * in an already loaded libcuda.so.1 (an engine's libcuda loaded with
 * RTLD_LOCAL), else to the pointer the driver's cuGetProcAddress returned.
 *
 * Not reached: a caller that looks these up with dlsym() on its own
 * handle of libcuda (dlopen("libcuda.so.1") then dlsym(handle, ...): the
 * CUDA runtime does so for cuGetProcAddress itself) binds to the driver
 * directly, past any LD_PRELOAD; libkvdmabuf's own exports do so on
 * purpose.
 *
 * Locking: one mutex (kc.transition) around each sleep (check, revoke,
 * the forwarded unmap) and each wake (the forwarded set-access, export,
 * replace), so that a second thread unmapping the same region waits for
 * the revoke; calls outside declared regions never take it. Nested calls
 * (from the proxy operations, or the driver) pass through (kc_depth).
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "cuda_export.h"
#include "kvdmabuf_preload.h"
#include "preload_internal.h"

#define EXPORT __attribute__((visibility("default")))
/* Regions one call may cover (more: refused, named). */
#define KC_MAX_REGIONS 64
#define KC_ERRMAX 512
/* cudaVersion from which cuGetProcAddress("cuGetProcAddress") is _v2 */
#define KC_GET_PROC_V2_SINCE 12000

/* The driver's functions: the seven interposed ones, then those a wake
 * calls. */
enum kc_sym {
	S_MEM_UNMAP, S_MEM_MAP, S_MEM_SET_ACCESS, S_ADDRESS_FREE, S_GET_PROC,
	S_GET_PROC_V2, S_EXPORT, S_NR_ENTRIES,
	S_POINTER_ATTR = S_NR_ENTRIES, S_DEVICE_GET, S_PRIMARY_RETAIN,
	S_PRIMARY_RELEASE, S_CTX_PUSH, S_CTX_POP, S_NR
};

static const char *const kc_symbol[S_NR] = {
	[S_MEM_UNMAP] = "cuMemUnmap",
	[S_MEM_MAP] = "cuMemMap",
	[S_MEM_SET_ACCESS] = "cuMemSetAccess",
	[S_ADDRESS_FREE] = "cuMemAddressFree",
	[S_GET_PROC] = "cuGetProcAddress",
	[S_GET_PROC_V2] = "cuGetProcAddress_v2",
	[S_POINTER_ATTR] = "cuPointerGetAttribute",
	[S_DEVICE_GET] = "cuDeviceGet",
	[S_PRIMARY_RETAIN] = "cuDevicePrimaryCtxRetain",
	[S_PRIMARY_RELEASE] = "cuDevicePrimaryCtxRelease_v2",
	[S_CTX_PUSH] = "cuCtxPushCurrent_v2",
	[S_CTX_POP] = "cuCtxPopCurrent_v2",
	[S_EXPORT] = "cuMemGetHandleForAddressRange",
};

/* Intervals [a, b) of a sleeping region: sorted, disjoint. */
struct kc_ivs {
	struct { uintptr_t a, b; } *v;
	unsigned int n;
};

/*
 * A region this interposer put to sleep: what of it is mapped and
 * accessible (all of it at the sleep, less each cuMemUnmap seen since,
 * plus each cuMemSetAccess), and what cuMemSetAccess covered since the
 * sleep (the rest of "mapped" is taken on trust: an unmap that bypassed
 * the interposer is not seen).
 */
struct kc_sleeper {
	uintptr_t addr;
	size_t len;
	struct kc_ivs mapped, accessed;
};

/*
 * An awake region with parts given back (an elastic pool: its ranges
 * operation): what the engine unmapped of it and has not mapped and made
 * accessible again. Those parts map to nothing in the proxy.
 */
struct kc_given {
	uintptr_t addr;
	size_t len;
	struct kc_ivs out;
};

static struct {
	pthread_mutex_t transition;
	void *_Atomic real[S_NR];
	_Atomic long long calls[S_NR_ENTRIES];
	struct kc_sleeper *sleepers;    /* under transition */
	unsigned int nr_sleepers;
	_Atomic unsigned int nr_asleep; /* fast path of cuMemSetAccess */
	struct kc_given *given;         /* under transition */
	unsigned int nr_given;
	_Atomic unsigned int nr_giving; /* nr_given, for the fast path */
	bool pcie_refused;              /* the driver said no: flags 0 now */
} kc = {
	.transition = PTHREAD_MUTEX_INITIALIZER,
};

static _Thread_local int kc_depth;
static _Thread_local char kc_err[KC_ERRMAX];

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The reason of a refusal or failure: this thread's, and on stderr. */
static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(kc_err, sizeof(kc_err), fmt, ap);
	va_end(ap);
	fprintf(stderr, "kvdmabuf-preload: %s\n", kc_err);
}

/* The interposer's own entry points (their exported names are aliases). */
KP_HIDDEN kvd_cuMemUnmap_fn kc_mem_unmap;
KP_HIDDEN kvd_cuMemMap_fn kc_mem_map;
KP_HIDDEN kvd_cuMemSetAccess_fn kc_mem_set_access;
KP_HIDDEN kvd_cuMemAddressFree_fn kc_address_free;
KP_HIDDEN kvd_cuGetProcAddress_v1_fn kc_get_proc;
KP_HIDDEN kvd_cuGetProcAddress_fn kc_get_proc_v2;
KP_HIDDEN kvd_cuMemGetHandleForAddressRange_fn kc_get_handle;

static void *const kc_own[S_NR_ENTRIES] = {
	[S_MEM_UNMAP] = (void *)kc_mem_unmap,
	[S_MEM_MAP] = (void *)kc_mem_map,
	[S_MEM_SET_ACCESS] = (void *)kc_mem_set_access,
	[S_ADDRESS_FREE] = (void *)kc_address_free,
	[S_GET_PROC] = (void *)kc_get_proc,
	[S_GET_PROC_V2] = (void *)kc_get_proc_v2,
	[S_EXPORT] = (void *)kc_get_handle,
};

static bool is_own(void *f)
{
	unsigned int i;

	for (i = 0; i < S_NR_ENTRIES; i++)
		if (f == kc_own[i])
			return true;
	return false;
}

/* The driver's @s (NULL while no libcuda is loaded: looked up again). */
static void *real(enum kc_sym s)
{
	void *f = atomic_load(&kc.real[s]);
	void *h;

	if (f)
		return f;
	f = dlsym(RTLD_NEXT, kc_symbol[s]);
	if (!f || is_own(f)) {
		f = NULL;
		h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
		if (h) {
			f = dlsym(h, kc_symbol[s]);
			dlclose(h);
		}
		/* our own dlsym answered (x86-64): it kept the driver's */
		if (is_own(f))
			f = atomic_load(&kc.real[s]);
	}
	if (f && !is_own(f))
		atomic_store(&kc.real[s], f);
	else
		f = NULL;
	return f;
}

long long kp_cuda_calls(const char *symbol)
{
	unsigned int i;

	for (i = 0; i < S_NR_ENTRIES; i++)
		if (!strcmp(kc_symbol[i], symbol))
			return atomic_load(&kc.calls[i]);
	return -ENOENT;
}

/*
 * fork(): a sleep or wake of this process (kc.transition) and the
 * registration tables (kp.lock, preload.c) are whole in the child, so both
 * locks are held across the fork, in their order (a transition calls into
 * the tables).
 */
static void kc_fork_prepare(void)
{
	pthread_mutex_lock(&kc.transition);
	kp_fork_prepare();
}

static void kc_fork_parent(void)
{
	kp_fork_parent();
	pthread_mutex_unlock(&kc.transition);
}

static void kc_fork_child(void)
{
	kp_fork_child();
	pthread_mutex_unlock(&kc.transition);
}

__attribute__((constructor)) static void kc_init(void)
{
	pthread_atfork(kc_fork_prepare, kc_fork_parent, kc_fork_child);
}

/* ---- the sleepers' coverage ---- */

static struct kc_sleeper *sleeper_at(uintptr_t addr)
{
	unsigned int i;

	for (i = 0; i < kc.nr_sleepers; i++)
		if (kc.sleepers[i].addr == addr)
			return &kc.sleepers[i];
	return NULL;
}

static void sleeper_free(struct kc_sleeper *s)
{
	free(s->mapped.v);
	free(s->accessed.v);
}

static void sleeper_drop(struct kc_sleeper *s)
{
	sleeper_free(s);
	*s = kc.sleepers[--kc.nr_sleepers];
	atomic_store(&kc.nr_asleep, kc.nr_sleepers);
}

/* Whether [a, a + size) meets @s's range. */
static bool sleeper_overlaps(const struct kc_sleeper *s, uintptr_t a,
			     size_t size)
{
	return a < s->addr + s->len && s->addr < a + size;
}

/* [a, b) (clipped to [@base, @base + @len)) joins @l (@add) or leaves
 * it; -ENOMEM. */
static int cover(uintptr_t base, size_t len, struct kc_ivs *l, uintptr_t a,
		 uintptr_t b, bool add)
{
	unsigned int i, j, n = 0;
	uintptr_t ta, tb;
	__typeof__(l->v) v;

	a = a < base ? base : a;
	b = b > base + len ? base + len : b;
	if (a >= b)
		return 0;
	v = malloc((l->n + 2) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (i = 0; i < l->n; i++) {
		ta = l->v[i].a;
		tb = l->v[i].b;
		if (tb <= a || ta >= b) {
			v[n].a = ta;
			v[n++].b = tb;
			continue;
		}
		if (ta < a) {
			v[n].a = ta;
			v[n++].b = a;
		}
		if (tb > b) {
			v[n].a = b;
			v[n++].b = tb;
		}
	}
	if (add) {
		v[n].a = a;
		v[n++].b = b;
	}
	/* sort (few intervals), then merge touching ones */
	for (i = 1; i < n; i++)
		for (j = i; j > 0 && v[j - 1].a > v[j].a; j--) {
			ta = v[j].a, tb = v[j].b;
			v[j] = v[j - 1];
			v[j - 1].a = ta, v[j - 1].b = tb;
		}
	for (i = 0, j = 0; i < n; i++) {
		if (j && v[i].a <= v[j - 1].b) {
			if (v[i].b > v[j - 1].b)
				v[j - 1].b = v[i].b;
		} else {
			v[j++] = v[i];
		}
	}
	free(l->v);
	l->v = v;
	l->n = j;
	return 0;
}

/* Whether @l is all of @s. */
static bool covered(const struct kc_sleeper *s, const struct kc_ivs *l)
{
	return l->n == 1 && l->v[0].a == s->addr &&
	       l->v[0].b == s->addr + s->len;
}

/* @to becomes a copy of @from; -ENOMEM. */
static int ivs_copy(struct kc_ivs *to, const struct kc_ivs *from)
{
	__typeof__(to->v) v = malloc((from->n + 1) * sizeof(*v));

	if (!v)
		return -ENOMEM;
	memcpy(v, from->v, from->n * sizeof(*v));
	free(to->v);
	to->v = v;
	to->n = from->n;
	return 0;
}

/* ---- the parts given back of awake regions ---- */

static struct kc_given *given_at(uintptr_t addr)
{
	unsigned int i;

	for (i = 0; i < kc.nr_given; i++)
		if (kc.given[i].addr == addr)
			return &kc.given[i];
	return NULL;
}

/* The record of @v's parts given back, made empty where it has none;
 * NULL: out of memory. */
static struct kc_given *given_get(const struct kp_region_view *v)
{
	struct kc_given *g = given_at(v->addr);

	if (g && g->len != v->len) {    /* declared again, another size */
		free(g->out.v);
		g->out = (struct kc_ivs){ 0 };
		g->len = v->len;
	}
	if (g)
		return g;
	if (kc.nr_given % 16 == 0) {
		g = realloc(kc.given, (kc.nr_given + 16) * sizeof(*g));
		if (!g)
			return NULL;
		kc.given = g;
	}
	g = &kc.given[kc.nr_given++];
	*g = (struct kc_given){ .addr = v->addr, .len = v->len };
	atomic_store(&kc.nr_giving, kc.nr_given);
	return g;
}

static void given_drop(struct kc_given *g)
{
	free(g->out.v);
	*g = kc.given[--kc.nr_given];
	atomic_store(&kc.nr_giving, kc.nr_given);
}

/* ---- export of the region's new memory ---- */

static const char *cu_err(kvd_CUresult r)
{
	static const struct { kvd_CUresult r; const char *name; } n[] = {
		{ KVD_CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE" },
		{ KVD_CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE" },
		{ KVD_CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT" },
		{ KVD_CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED" },
		{ KVD_CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED" },
	};
	unsigned int i;

	for (i = 0; i < sizeof(n) / sizeof(n[0]); i++)
		if (n[i].r == r)
			return n[i].name;
	return "CUDA error";
}

/*
 * [addr, addr+len) as a dma-buf fd, in the primary context of the memory's
 * device (pushed and popped: the caller's current context is kept), with
 * the flags the configuration's cuda_dmabuf_mapping asks for, as the
 * library exports (lib/cuda_export.c). kc.transition held.
 */
static kvd_CUresult kc_export(uintptr_t addr, size_t len, int *fd)
{
	kvd_cuPointerGetAttribute_fn *attr = real(S_POINTER_ATTR);
	kvd_cuDeviceGet_fn *get = real(S_DEVICE_GET);
	kvd_cuDevicePrimaryCtxRetain_fn *retain = real(S_PRIMARY_RETAIN);
	kvd_cuDevicePrimaryCtxRelease_fn *release = real(S_PRIMARY_RELEASE);
	kvd_cuCtxPushCurrent_fn *push = real(S_CTX_PUSH);
	kvd_cuCtxPopCurrent_fn *pop = real(S_CTX_POP);
	kvd_cuMemGetHandleForAddressRange_fn *ex = real(S_EXPORT);
	kvd_CUdeviceptr p = (kvd_CUdeviceptr)addr;
	kvd_CUcontext pctx = NULL, popped;
	unsigned long long flags = 0;
	kvd_CUdevice dev;
	kvd_CUresult r;
	int ordinal = -1;

	if (!attr || !get || !retain || !release || !push || !pop || !ex) {
		fail("wake of %#" PRIxPTR "+%#zx: the CUDA driver lacks "
		     "cuMemGetHandleForAddressRange or the context calls "
		     "(before CUDA 11.7?)", addr, len);
		return KVD_CUDA_ERROR_NOT_SUPPORTED;
	}
	r = attr(&ordinal, KVD_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
	if (r == KVD_CUDA_SUCCESS)
		r = get(&dev, ordinal);
	if (r == KVD_CUDA_SUCCESS)
		r = retain(&pctx, dev);
	if (r != KVD_CUDA_SUCCESS) {
		fail("wake of %#" PRIxPTR "+%#zx: no device context for its "
		     "memory (%s, %u)", addr, len, cu_err(r), r);
		return r;
	}
	r = push(pctx);
	if (r == KVD_CUDA_SUCCESS) {
		r = kvd_cuda_export_range(ex, kp_cuda_mapping(),
					  &kc.pcie_refused, p, len, fd, &flags);
		pop(&popped);
	}
	release(dev);
	if (r != KVD_CUDA_SUCCESS)
		fail("wake of %#" PRIxPTR "+%#zx: cuMemGetHandleForAddressRange "
		     "(flags %#llx) failed on device %d: %s (%u); the region "
		     "stays asleep", addr, len, flags, ordinal, cu_err(r), r);
	return r;
}

/* ---- sleep and wake of one region (kc.transition held) ---- */

static kvd_CUresult region_sleep(const struct kp_region_view *v)
{
	struct kvdmabuf_preload_proxy_ops ops;
	char why[KC_ERRMAX - 128];
	struct kc_sleeper *s;
	struct kc_given *g;
	unsigned int i;
	bool held;
	int rc;

	/* the operations as they are now, held until they returned */
	held = !kp_region_hold(v->addr, &ops, NULL);
	if (v->proxy_fd >= 0 && !held) {
		fail("cuMemUnmap refused: KV region '%s' %#" PRIxPTR "+%#zx "
		     "is awake and has a proxy dma-buf but no proxy operations "
		     "(kvdmabuf_preload_set_proxy_ops): its registrations "
		     "would stay on the old memory; nothing was unmapped "
		     "(sleep it first: kvdmabuf_sleep + kvdmabuf_preload_sleep)",
		     v->tag, v->addr, v->len);
		return KVD_CUDA_ERROR_NOT_PERMITTED;
	}
	if (kc.nr_sleepers % 16 == 0) {
		s = realloc(kc.sleepers, (kc.nr_sleepers + 16) *
			    sizeof(*s));
		if (!s) {
			fail("cuMemUnmap refused: out of memory");
			rc = -ENOMEM;
			goto out;
		}
		kc.sleepers = s;
	}
	rc = kp_region_set_asleep(v->addr, true, why, sizeof(why));
	if (rc) {
		fail("cuMemUnmap refused: KV region '%s' %#" PRIxPTR "+%#zx "
		     "cannot sleep: %s", v->tag, v->addr, v->len,
		     rc == -ENOENT ? "undeclared meanwhile" : why);
		goto out;
	}
	if (held) {
		why[0] = '\0';
		kc_depth++;
		rc = ops.revoke(ops.arg, (void *)v->addr, v->len, why,
				sizeof(why));
		kc_depth--;
		if (rc) {
			kp_region_set_asleep(v->addr, false, NULL, 0);
			fail("cuMemUnmap refused: revoke of KV region '%s' %#"
			     PRIxPTR "+%#zx's proxy failed (%s): %s; nothing "
			     "was unmapped", v->tag, v->addr, v->len,
			     strerror(rc < 0 ? -rc : rc), why);
			goto out;
		}
	}
	/* one entry per region (woken by the hooks meanwhile: renewed) */
	s = sleeper_at(v->addr);
	if (s)
		sleeper_free(s);
	else
		s = &kc.sleepers[kc.nr_sleepers++];
	*s = (struct kc_sleeper){ .addr = v->addr, .len = v->len };
	/* mapped and accessible, all of it: the caller's unmap (and any
	 * later one while asleep) takes its range out again, so the region
	 * wakes once what was unmapped is accessible again (out of memory:
	 * nothing counts as mapped, a set-access over all of it wakes it) */
	cover(s->addr, s->len, &s->mapped, v->addr, v->addr + v->len, true);
	/* the parts it gave back before are unmapped already: they too must
	 * be mapped again before it wakes */
	g = given_at(v->addr);
	for (i = 0; g && i < g->out.n; i++)
		cover(s->addr, s->len, &s->mapped, g->out.v[i].a,
		      g->out.v[i].b, false);
	if (g)
		given_drop(g);
	atomic_store(&kc.nr_asleep, kc.nr_sleepers);
out:
	if (held)
		kp_region_unhold(v->addr);
	return rc ? KVD_CUDA_ERROR_NOT_PERMITTED : KVD_CUDA_SUCCESS;
}

/*
 * New memory of @s is mapped and accessible: export, replace, awake, with
 * the region's operations as they are now. On failure @s stays asleep (a
 * later cuMemSetAccess tries again). A region undeclared meanwhile is
 * forgotten: its owner took it back.
 */
static kvd_CUresult region_wake(struct kc_sleeper *s, bool deferrable)
{
	struct kvdmabuf_preload_proxy_ops ops;
	char why[KC_ERRMAX - 128];
	kvd_CUresult r = KVD_CUDA_SUCCESS;
	struct kp_region_view v;
	int fd = -1, rc;

	if (kp_regions_overlapping(s->addr, s->len, &v, 1) != 1 ||
	    v.addr != s->addr || v.len != s->len) {
		sleeper_drop(s);
		return KVD_CUDA_SUCCESS;
	}
	if (!kp_region_hold(s->addr, &ops, NULL)) {
		r = kc_export(s->addr, s->len, &fd);
		if (r != KVD_CUDA_SUCCESS) {
			kp_region_unhold(s->addr);
			/*
			 * Part of it was taken as mapped on trust: an unmap
			 * that bypassed us (the runtime's own lookup) may have
			 * taken it. Only what cuMemSetAccess covered counts
			 * from now on: the engine's call itself succeeded.
			 */
			if (deferrable && !covered(s, &s->accessed) &&
			    !ivs_copy(&s->mapped, &s->accessed))
				return KVD_CUDA_SUCCESS;
			return r;
		}
		why[0] = '\0';
		kc_depth++;
		rc = ops.replace(ops.arg, (void *)s->addr, s->len, fd, why,
				 sizeof(why));
		kc_depth--;
		close(fd);
		kp_region_unhold(s->addr);
		if (rc) {
			fail("wake of %#" PRIxPTR "+%#zx: replace of its "
			     "proxy's backing failed (%s): %s; the region "
			     "stays asleep", s->addr, s->len,
			     strerror(rc < 0 ? -rc : rc), why);
			return KVD_CUDA_ERROR_NOT_PERMITTED;
		}
	}
	kp_region_set_asleep(s->addr, false, NULL, 0);
	sleeper_drop(s);
	return r;
}

/*
 * [a, b) of awake region @v given back (@restore false) before the engine
 * unmaps it, or brought in (@restore true: the parts of @g in it, mapped
 * and accessible now), through the region's ranges operation.
 * Return: 0 done; 1 the region has no ranges operation or cannot change
 * by parts (-EOPNOTSUPP: it sleeps whole instead); -errno refused, said.
 */
static int region_ranges(const struct kp_region_view *v, struct kc_given *g,
			 uintptr_t a, uintptr_t b, bool restore)
{
	struct kvdmabuf_preload_proxy_ops ops;
	kvdmabuf_preload_ranges_fn *fn = NULL;
	struct kvdmabuf_preload_range *rg;
	struct kc_ivs next = { 0 };
	char why[KC_ERRMAX - 160];
	unsigned int i, n = 0;
	int rc;

	a = a < v->addr ? v->addr : a;
	b = b > v->addr + v->len ? v->addr + v->len : b;
	if (kp_region_hold(v->addr, &ops, &fn))
		return 1;
	rg = malloc((g->out.n + 1) * sizeof(*rg));
	rc = rg ? ivs_copy(&next, &g->out) : -ENOMEM;
	if (!rc)
		rc = cover(v->addr, v->len, &next, a, b, !restore);
	if (rc) {
		fail("%s of KV region '%s' %#" PRIxPTR "+%#zx: out of memory",
		     restore ? "cuMemSetAccess" : "cuMemUnmap", v->tag,
		     v->addr, v->len);
		goto out;
	}
	if (!fn) {
		rc = 1;
		goto out;
	}
	if (!restore)
		rg[n++] = (struct kvdmabuf_preload_range){ a - v->addr, b - a };
	for (i = 0; restore && i < g->out.n; i++) {
		uintptr_t pa = g->out.v[i].a > a ? g->out.v[i].a : a;
		uintptr_t pb = g->out.v[i].b < b ? g->out.v[i].b : b;

		if (pa < pb)
			rg[n++] = (struct kvdmabuf_preload_range){
				pa - v->addr, pb - pa };
	}
	if (!n)
		goto out;
	why[0] = '\0';
	kc_depth++;
	rc = fn(ops.arg, (void *)v->addr, rg, n, restore, why, sizeof(why));
	kc_depth--;
	if (rc == -EOPNOTSUPP && !restore) {
		rc = 1;
	} else if (rc) {
		fail("%s refused: %s %#zx bytes of KV region '%s' %#" PRIxPTR
		     "+%#zx at offset %#zx failed (%s): %s%s",
		     restore ? "cuMemSetAccess" : "cuMemUnmap",
		     restore ? "bringing in" : "giving back", b - a, v->tag,
		     v->addr, v->len, a - v->addr, strerror(rc < 0 ? -rc : rc),
		     why, restore ? "; the part stays given back (a later "
		     "cuMemSetAccess tries again)" : "; nothing was unmapped");
		rc = -EIO;
	} else {
		free(g->out.v);
		g->out = next;
		next = (struct kc_ivs){ 0 };
	}
out:
	kp_region_unhold(v->addr);
	free(next.v);
	free(rg);
	return rc;
}

/*
 * [a, b) of awake region @v (part of it) is about to be unmapped: given
 * back. Return as region_ranges().
 */
static int region_give(const struct kp_region_view *v, uintptr_t a,
		       uintptr_t b)
{
	struct kc_given *g;
	int rc;

	if (!v->ranges)
		return 1;
	g = given_get(v);
	if (!g) {
		fail("cuMemUnmap refused: out of memory");
		return -ENOMEM;
	}
	rc = region_ranges(v, g, a, b, false);
	if (!g->out.n)
		given_drop(g);
	return rc;
}

/*
 * [a, b) was made accessible: the parts of awake regions given back in it
 * are brought in. 0, or the first failure (said; others tried still).
 */
static int regions_take(uintptr_t a, uintptr_t b)
{
	struct kp_region_view v;
	struct kc_given *g;
	unsigned int i;
	int rc = 0, r;

	for (i = 0; i < kc.nr_given; ) {
		g = &kc.given[i];
		if (b <= g->addr || g->addr + g->len <= a) {
			i++;
			continue;
		}
		if (kp_regions_overlapping(g->addr, g->len, &v, 1) != 1 ||
		    v.addr != g->addr || v.len != g->len || v.asleep) {
			given_drop(g);  /* undeclared, or slept: not ours */
			continue;
		}
		r = region_ranges(&v, g, a, b, true);
		if (r == 1) {
			given_drop(g);  /* its owner took the operation back */
			continue;
		}
		if (r && !rc)
			rc = r;
		if (!g->out.n)
			given_drop(g);  /* the last moves to i */
		else
			i++;
	}
	return rc;
}

/*
 * The regions a refused cuMemUnmap (@r) put to sleep, woken again on the
 * memory still mapped. One that cannot be stays asleep (a cuMemSetAccess
 * over it tries again), said after the first reason.
 */
static void rollback(kvd_CUdeviceptr ptr, size_t size, kvd_CUresult r,
		     const uintptr_t *slept, unsigned int n,
		     const struct kp_region_view *const *gave,
		     unsigned int nr_gave)
{
	uintptr_t a = (uintptr_t)ptr, b = a + size;
	char first[KC_ERRMAX];
	struct kc_sleeper *s;
	struct kc_given *g;
	unsigned int stuck = 0, unbacked = 0;

	if (r != KVD_CUDA_ERROR_NOT_PERMITTED)  /* the driver's refusal */
		snprintf(kc_err, sizeof(kc_err), "cuMemUnmap(0x%llx, %#zx): "
			 "the driver refused it (%s, %u)", ptr, size,
			 cu_err(r), r);
	memcpy(first, kc_err, sizeof(first));
	while (n) {
		s = sleeper_at(slept[--n]);
		if (s && region_wake(s, false) != KVD_CUDA_SUCCESS)
			stuck++;
	}
	while (nr_gave) {
		g = given_at(gave[--nr_gave]->addr);
		if (g && region_ranges(gave[nr_gave], g, a, b, true))
			unbacked++;
		if (g && !g->out.n)
			given_drop(g);
	}
	if (stuck || unbacked)
		fail("%s; %u KV region(s) it put to sleep stay asleep and %u "
		     "keep the part it gave back unbacked, on memory still "
		     "mapped (the wake failed: a cuMemSetAccess over them "
		     "tries again)", first, stuck, unbacked);
	else
		memcpy(kc_err, first, sizeof(first));
}

/* ---- the entry points ---- */

kvd_CUresult kc_mem_unmap(kvd_CUdeviceptr ptr, size_t size)
{
	kvd_cuMemUnmap_fn *f = real(S_MEM_UNMAP);
	struct kp_region_view v[KC_MAX_REGIONS];
	uintptr_t slept[KC_MAX_REGIONS];
	unsigned int n, i, nr_slept = 0, nr_gave = 0;
	const struct kp_region_view *gave[KC_MAX_REGIONS];
	uintptr_t a = (uintptr_t)ptr, b = a + size;
	kvd_CUresult r = KVD_CUDA_SUCCESS;
	int rc;

	atomic_fetch_add(&kc.calls[S_MEM_UNMAP], 1);
	if (!f)
		return KVD_CUDA_ERROR_NOT_SUPPORTED;
	if (kc_depth || !size ||
	    !kp_regions_overlapping((uintptr_t)ptr, size, NULL, 0))
		return f(ptr, size);
	pthread_mutex_lock(&kc.transition);
	n = kp_regions_overlapping((uintptr_t)ptr, size, v, KC_MAX_REGIONS);
	if (n > KC_MAX_REGIONS) {
		fail("cuMemUnmap(0x%llx, %#zx) refused: it covers %u KV "
		     "regions, more than %u; nothing was unmapped", ptr, size,
		     n, KC_MAX_REGIONS);
		r = KVD_CUDA_ERROR_NOT_PERMITTED;
		n = 0;
	}
	/* every awake region first, all or nothing: part of one with a
	 * ranges operation is given back, else the region sleeps */
	for (i = 0; i < n && r == KVD_CUDA_SUCCESS; i++) {
		if (v[i].asleep)
			continue;
		if (a > v[i].addr || b < v[i].addr + v[i].len) {
			rc = region_give(&v[i], a, b);
			if (!rc)
				gave[nr_gave++] = &v[i];
			if (rc <= 0) {
				r = rc ? KVD_CUDA_ERROR_NOT_PERMITTED : r;
				continue;
			}
		}
		r = region_sleep(&v[i]);
		if (r == KVD_CUDA_SUCCESS)
			slept[nr_slept++] = v[i].addr;
	}
	if (r == KVD_CUDA_SUCCESS) {
		kc_depth++;
		r = f(ptr, size);
		kc_depth--;
	}
	/* what set-access covered of a sleeping region is unmapped again
	 * (out of memory: all of it counts as not covered) */
	for (i = 0; r == KVD_CUDA_SUCCESS && i < kc.nr_sleepers; i++)
		if (cover(kc.sleepers[i].addr, kc.sleepers[i].len,
			  &kc.sleepers[i].mapped, (uintptr_t)ptr,
			  (uintptr_t)ptr + size, false))
			kc.sleepers[i].mapped.n = 0;
	/* refused, or the driver refused the unmap: the memory is still
	 * there, so the regions slept here wake on it again */
	if (r != KVD_CUDA_SUCCESS && (nr_slept || nr_gave))
		rollback(ptr, size, r, slept, nr_slept, gave, nr_gave);
	pthread_mutex_unlock(&kc.transition);
	return r;
}

kvd_CUresult kc_mem_map(kvd_CUdeviceptr ptr, size_t size, size_t offset,
			kvd_CUmemGenericAllocationHandle handle,
			unsigned long long flags)
{
	kvd_cuMemMap_fn *f = real(S_MEM_MAP);

	atomic_fetch_add(&kc.calls[S_MEM_MAP], 1);
	return f ? f(ptr, size, offset, handle, flags) :
		   KVD_CUDA_ERROR_NOT_SUPPORTED;
}

kvd_CUresult kc_mem_set_access(kvd_CUdeviceptr ptr, size_t size,
			       const kvd_CUmemAccessDesc *desc, size_t count)
{
	kvd_cuMemSetAccess_fn *f = real(S_MEM_SET_ACCESS);
	uintptr_t a = (uintptr_t)ptr;
	kvd_CUresult r, w;
	struct kc_sleeper *s;
	unsigned int i;

	atomic_fetch_add(&kc.calls[S_MEM_SET_ACCESS], 1);
	if (!f)
		return KVD_CUDA_ERROR_NOT_SUPPORTED;
	if (kc_depth || (!atomic_load(&kc.nr_asleep) &&
			 !atomic_load(&kc.nr_giving)))
		return f(ptr, size, desc, count);
	pthread_mutex_lock(&kc.transition);
	kc_depth++;
	r = f(ptr, size, desc, count);
	kc_depth--;
	if (r == KVD_CUDA_SUCCESS && regions_take(a, a + size))
		r = KVD_CUDA_ERROR_NOT_PERMITTED;
	for (i = 0; r == KVD_CUDA_SUCCESS && i < kc.nr_sleepers; ) {
		s = &kc.sleepers[i];
		if (!sleeper_overlaps(s, a, size)) {
			i++;
			continue;
		}
		if (cover(s->addr, s->len, &s->mapped, a, a + size, true) ||
		    cover(s->addr, s->len, &s->accessed, a, a + size, true)) {
			fail("wake of %#" PRIxPTR "+%#zx: out of memory",
			     s->addr, s->len);
			r = KVD_CUDA_ERROR_NOT_PERMITTED;
			break;
		}
		if (!covered(s, &s->mapped)) {
			i++;
			continue;
		}
		w = region_wake(s, true); /* drops s (the last moves to i) */
		if (w != KVD_CUDA_SUCCESS) {
			r = w;
			break;
		}
	}
	pthread_mutex_unlock(&kc.transition);
	return r;
}

/*
 * The engine gives a range of virtual addresses back (the driver allows it
 * only once nothing is mapped there). A region in it that this interposer
 * put to sleep is asleep for good: new memory that a later reservation
 * maps at the same addresses is someone else's, never the region's new
 * backing (its proxy stays revoked, and peers' keys reach nothing). The
 * region's owner undeclares it; `kvdmabuf status` shows it asleep.
 */
kvd_CUresult kc_address_free(kvd_CUdeviceptr ptr, size_t size)
{
	kvd_cuMemAddressFree_fn *f = real(S_ADDRESS_FREE);
	uintptr_t a = (uintptr_t)ptr;
	struct kc_sleeper *s;
	kvd_CUresult r;
	unsigned int i;

	atomic_fetch_add(&kc.calls[S_ADDRESS_FREE], 1);
	if (!f)
		return KVD_CUDA_ERROR_NOT_SUPPORTED;
	if (kc_depth || (!atomic_load(&kc.nr_asleep) &&
			 !atomic_load(&kc.nr_giving)))
		return f(ptr, size);
	pthread_mutex_lock(&kc.transition);
	kc_depth++;
	r = f(ptr, size);
	kc_depth--;
	for (i = 0; r == KVD_CUDA_SUCCESS && i < kc.nr_given; ) {
		if (a + size <= kc.given[i].addr ||
		    kc.given[i].addr + kc.given[i].len <= a)
			i++;
		else
			given_drop(&kc.given[i]);  /* the last moves to i */
	}
	for (i = 0; r == KVD_CUDA_SUCCESS && i < kc.nr_sleepers; ) {
		s = &kc.sleepers[i];
		if (!sleeper_overlaps(s, a, size))
			i++;
		else
			sleeper_drop(s);        /* the last moves to i */
	}
	pthread_mutex_unlock(&kc.transition);
	return r;
}

/*
 * The engine's own export of device memory: forwarded as is, and what the
 * dma-buf holds noted, so that the engine's ibv_reg_dmabuf_mr of it is
 * checked against the KV regions by that memory, not by the iova it asks
 * for (preload.c, kp_dmabuf_exported()).
 */
kvd_CUresult kc_get_handle(void *handle, kvd_CUdeviceptr dptr, size_t size,
			   kvd_CUmemRangeHandleType type,
			   unsigned long long flags)
{
	kvd_cuMemGetHandleForAddressRange_fn *f = real(S_EXPORT);
	kvd_CUresult r;

	atomic_fetch_add(&kc.calls[S_EXPORT], 1);
	if (!f)
		return KVD_CUDA_ERROR_NOT_SUPPORTED;
	r = f(handle, dptr, size, type, flags);
	if (r == KVD_CUDA_SUCCESS && handle &&
	    type == KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
		kp_dmabuf_exported(*(int *)handle, (uintptr_t)dptr, size);
	return r;
}

/* The entry points the driver handed back, swapped for ours. */
static void hand_back(const char *symbol, void **pfn, int version)
{
	void *got;
	unsigned int i;

	if (!symbol || !pfn || !*pfn || is_own(*pfn))
		return;
	got = *pfn;
	for (i = 0; i < S_NR_ENTRIES; i++) {
		if (i == S_GET_PROC_V2 || strcmp(symbol, kc_symbol[i]))
			continue;
		if (i == S_GET_PROC &&
		    (got == real(S_GET_PROC_V2) ||
		     (got != real(S_GET_PROC) &&
		      version >= KC_GET_PROC_V2_SINCE)))
			i = S_GET_PROC_V2;
		if (!atomic_load(&kc.real[i]))
			atomic_store(&kc.real[i], got);
		*pfn = kc_own[i];
		return;
	}
}

kvd_CUresult kc_get_proc(const char *symbol, void **pfn, int cudaVersion,
			 kvd_cuuint64_t flags)
{
	kvd_cuGetProcAddress_v1_fn *f = real(S_GET_PROC);
	kvd_CUresult r;

	atomic_fetch_add(&kc.calls[S_GET_PROC], 1);
	if (!f)
		return KVD_CUDA_ERROR_NOT_SUPPORTED;
	r = f(symbol, pfn, cudaVersion, flags);
	if (r == KVD_CUDA_SUCCESS)
		hand_back(symbol, pfn, cudaVersion);
	return r;
}

kvd_CUresult kc_get_proc_v2(const char *symbol, void **pfn, int cudaVersion,
			    kvd_cuuint64_t flags,
			    kvd_CUdriverProcAddressQueryResult *status)
{
	kvd_cuGetProcAddress_fn *f = real(S_GET_PROC_V2);
	kvd_CUresult r;

	atomic_fetch_add(&kc.calls[S_GET_PROC_V2], 1);
	if (!f)
		return KVD_CUDA_ERROR_NOT_SUPPORTED;
	r = f(symbol, pfn, cudaVersion, flags, status);
	if (r == KVD_CUDA_SUCCESS)
		hand_back(symbol, pfn, cudaVersion);
	return r;
}

/* The exported names (version script: libkvdmabuf-preload.map). */
EXPORT kvd_cuMemUnmap_fn cuMemUnmap __attribute__((alias("kc_mem_unmap")));
EXPORT kvd_cuMemMap_fn cuMemMap __attribute__((alias("kc_mem_map")));
EXPORT kvd_cuMemSetAccess_fn cuMemSetAccess
	__attribute__((alias("kc_mem_set_access")));
EXPORT kvd_cuMemAddressFree_fn cuMemAddressFree
	__attribute__((alias("kc_address_free")));
EXPORT kvd_cuGetProcAddress_v1_fn cuGetProcAddress
	__attribute__((alias("kc_get_proc")));
EXPORT kvd_cuGetProcAddress_fn cuGetProcAddress_v2
	__attribute__((alias("kc_get_proc_v2")));
EXPORT kvd_cuMemGetHandleForAddressRange_fn cuMemGetHandleForAddressRange
	__attribute__((alias("kc_get_handle")));

/*
 * ---- dlsym() and dlvsym() on a handle of libcuda (x86-64) ----
 * The CUDA runtime opens libcuda itself and looks cuGetProcAddress_v2 up
 * with dlsym(handle, ...), which no symbol interposition reaches; every
 * other entry point it (and PyTorch, NCCL through it) uses comes from
 * that function. So dlsym and dlvsym are interposed too (@@GLIBC_2.34 and
 * the @GLIBC_2.2.5 older programs bind to; libcuda's symbols have no
 * versions, so dlvsym(handle, name, any version) finds them too): a
 * lookup of one of the seven names on a real handle gets the preload's
 * entry point (the driver's is kept to forward to); every other call is a
 * tail jump into glibc's function, so that what depends on the caller
 * (RTLD_NEXT, RTLD_DEFAULT from a library loaded RTLD_LOCAL, dlmopen
 * namespaces) still sees the real caller, the preload's own lookups
 * included. glibc's two functions are found in its symbol table
 * (kc_glibc()), never by dlsym/dlvsym, which are ours.
 * The jump needs assembly: x86-64 only. Elsewhere neither is interposed,
 * those lookups reach the driver directly and the CUDA-driven sleep and
 * wake do not see such an engine: said on stderr when a region gets proxy
 * operations, and KVDMABUF_PRELOAD_NO_DLSYM in kvdmabuf_preload_query().
 */
#if defined(__x86_64__) && defined(__ELF__) && !defined(KVD_PRELOAD_NO_DLSYM)
#include "elf_dyn.h"

KP_HIDDEN void *kc_dlsym_next;  /* glibc's dlsym */
KP_HIDDEN void *kc_dlvsym_next; /* glibc's dlvsym */
KP_HIDDEN void *kc_dlsym_filter(void *handle, const char *name,
				const char *version);

/* The number of symbols of a dynamic symbol table (DT_HASH's nchain, or
 * past the last chain of DT_GNU_HASH). */
static size_t nr_syms(const Elf64_Word *hash, const Elf64_Word *gnu)
{
	const Elf64_Word *buckets, *chains;
	Elf64_Word nb, off, i, last = 0;

	if (hash)
		return hash[1];
	nb = gnu[0];
	off = gnu[1];
	buckets = gnu + 4 + 2 * gnu[2];         /* after 64-bit bloom words */
	chains = buckets + nb;
	for (i = 0; i < nb; i++)
		if (buckets[i] > last)
			last = buckets[i];
	if (last < off)
		return off;
	while (!(chains[last - off] & 1))
		last++;
	return (size_t)last + 1;
}

struct kc_find {
	const char *name;
	void *found;
};

/* The default version of a function named f->name defined by glibc's
 * libc.so.6 (2.34+) or libdl.so.2 (before). */
static int find_in(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct kc_find *f = arg;
	const char *base = strrchr(info->dlpi_name, '/');
	struct kp_dyn d;
	size_t i, n;

	(void)size;
	base = base ? base + 1 : info->dlpi_name;
	if ((strncmp(base, "libc.so.", 8) && strncmp(base, "libdl.so.", 9)) ||
	    !kp_dyn_read(info, &d) || (!d.hash && !d.gnu_hash))
		return 0;
	n = nr_syms(d.hash, d.gnu_hash);
	for (i = 0; i < n; i++) {
		const ElfW(Sym) *s = &d.sym[i];

		if (s->st_shndx == SHN_UNDEF || !s->st_value ||
		    ELF64_ST_TYPE(s->st_info) != STT_FUNC ||
		    (d.versym && (d.versym[i] & 0x8000)) ||
		    strcmp(d.str + s->st_name, f->name))
			continue;
		f->found = (void *)(info->dlpi_addr + s->st_value);
		return 1;
	}
	return 0;
}

static void *kc_glibc(const char *name)
{
	struct kc_find f = { .name = name };

	dl_iterate_phdr(find_in, &f);
	if (!f.found) {
		fprintf(stderr, "kvdmabuf-preload: glibc's %s not found\n",
			name);
		abort();
	}
	return f.found;
}

/* glibc's dlsym (@version NULL) or dlvsym of @name on @handle. */
static void *handle_lookup(void *handle, const char *name,
			   const char *version)
{
	return version ?
	       ((void *(*)(void *, const char *, const char *))
		kc_dlvsym_next)(handle, name, version) :
	       ((void *(*)(void *, const char *))kc_dlsym_next)(handle, name);
}

/* Is @f the loaded libcuda's own @name? */
static bool from_driver(const char *name, void *f)
{
	void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
	void *d = NULL;

	if (h) {
		d = handle_lookup(h, name, NULL);
		dlclose(h);
	}
	return d && d == f;
}

/*
 * Our answer to dlsym (@version NULL) or dlvsym, or NULL: on to glibc's
 * (whose pointers are set here, first of all).
 */
/* glibc's dlsym and dlvsym, where the stubs go on to (found once). */
static void kc_glibc_lookups(void)
{
	if (!__atomic_load_n(&kc_dlvsym_next, __ATOMIC_ACQUIRE)) {
		__atomic_store_n(&kc_dlsym_next, kc_glibc("dlsym"),
				 __ATOMIC_RELEASE);
		__atomic_store_n(&kc_dlvsym_next, kc_glibc("dlvsym"),
				 __ATOMIC_RELEASE);
	}
}

void *kc_dlsym_filter(void *handle, const char *name, const char *version)
{
	void *f;
	unsigned int i;

	kc_glibc_lookups();
	if (handle == RTLD_DEFAULT || handle == RTLD_NEXT || !name)
		return NULL;
	if (!strncmp(name, "ibv_", 4) || !strncmp(name, "mlx5dv_", 7)) {
		f = handle_lookup(handle, name, version);
		return f ? kp_verbs_dlsym(name, version, f) : NULL;
	}
	if (name[0] != 'c' || name[1] != 'u')
		return NULL;
	for (i = 0; i < S_NR_ENTRIES; i++) {
		if (strcmp(name, kc_symbol[i]))
			continue;
		/* the handle's own (its caller is not asked for) */
		f = handle_lookup(handle, name, version);
		if (!f || is_own(f))
			return NULL;    /* glibc answers, dlerror() and all */
		/*
		 * Only the driver's own is taken and answered for: on the
		 * whole program's handle the first definition may be another
		 * interposer's (ahead of us in LD_PRELOAD), which calls ours
		 * as its next: taking it as the driver's would make the two
		 * call each other for ever. Its caller gets it as glibc says.
		 */
		if (!from_driver(name, f))
			return NULL;
		if (!atomic_load(&kc.real[i]))
			atomic_store(&kc.real[i], f);
		return kc_own[i];
	}
	return NULL;
}

/* dlsym, dlvsym: the filter's answer, or on to glibc with the caller's
 * return address still on the stack. dlsym's third argument register is
 * cleared for the filter (version NULL). */
__asm__(".text\n"
	".p2align 4\n"
	".type kc_dlsym, @function\n"
	".type kc_dlsym_old, @function\n"
	".globl kc_dlsym\n"
	".globl kc_dlsym_old\n"
	"kc_dlsym:\n"
	"kc_dlsym_old:\n"
	"	.cfi_startproc\n"
#ifdef __CET__
	"	endbr64\n"
#endif
	"	push %rdi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	push %rsi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	sub $8, %rsp\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	xor %edx, %edx\n"
	"	call kc_dlsym_filter\n"
	"	add $8, %rsp\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	pop %rsi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	pop %rdi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	test %rax, %rax\n"
	"	jz 1f\n"
	"	ret\n"
	"1:	jmp *kc_dlsym_next(%rip)\n"
	"	.cfi_endproc\n"
	".size kc_dlsym, .-kc_dlsym\n"
	".size kc_dlsym_old, .-kc_dlsym_old\n"
	".symver kc_dlsym, dlsym@@GLIBC_2.34\n"
	".symver kc_dlsym_old, dlsym@GLIBC_2.2.5\n"
	".p2align 4\n"
	".type kc_dlvsym, @function\n"
	".type kc_dlvsym_old, @function\n"
	".globl kc_dlvsym\n"
	".globl kc_dlvsym_old\n"
	"kc_dlvsym:\n"
	"kc_dlvsym_old:\n"
	"	.cfi_startproc\n"
#ifdef __CET__
	"	endbr64\n"
#endif
	"	push %rdi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	push %rsi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	push %rdx\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	call kc_dlsym_filter\n"
	"	pop %rdx\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	pop %rsi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	pop %rdi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	test %rax, %rax\n"
	"	jz 1f\n"
	"	ret\n"
	"1:	jmp *kc_dlvsym_next(%rip)\n"
	"	.cfi_endproc\n"
	".size kc_dlvsym, .-kc_dlvsym\n"
	".size kc_dlvsym_old, .-kc_dlvsym_old\n"
	".symver kc_dlvsym, dlvsym@@GLIBC_2.34\n"
	".symver kc_dlvsym_old, dlvsym@GLIBC_2.2.5\n");

extern char kc_dlsym[];

static bool from_glibc(void *f)
{
	const char *b;
	Dl_info di;

	if (!f || !dladdr(f, &di) || !di.dli_fname)
		return false;
	b = strrchr(di.dli_fname, '/');
	b = b ? b + 1 : di.dli_fname;
	return !strncmp(b, "libc.so.", 8) || !strncmp(b, "libdl.so.", 9);
}

static const char *file_of(void *f)
{
	Dl_info di;

	return f && dladdr(f, &di) && di.dli_fname ? di.dli_fname : "?";
}

/*
 * Another object of the global scope that defines dlsym, as GPU-sharing
 * layers (HAMi-core) do. Ahead of the preload in LD_PRELOAD it answers
 * the CUDA runtime's lookups first: harmless when it hands them on to the
 * next dlsym (ours), a bypass when it goes to glibc's; a lookup of
 * cuMemUnmap on libcuda's handle through it tells which. Behind the
 * preload it is never called: ours goes on to glibc's. *@final: the
 * answer holds for the life of the process (the order of LD_PRELOAD is
 * fixed at start; the probe needs libcuda loaded).
 */
static uint32_t dlsym_flags_probe(char *why, size_t len, bool *final)
{
	void *(*gl)(void *, const char *);
	void *(*reached)(void *, const char *);
	void *h, *f;

	kc_glibc_lookups();
	gl = (void *(*)(void *, const char *))
		__atomic_load_n(&kc_dlsym_next, __ATOMIC_ACQUIRE);
	*final = true;
	*(void **)&reached = gl(RTLD_DEFAULT, "dlsym");
	if (reached && (void *)reached != (void *)kc_dlsym &&
	    !from_glibc((void *)reached)) {
		h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
		*final = h != NULL;
		f = h ? reached(h, kc_symbol[S_MEM_UNMAP]) : NULL;
		if (h)
			dlclose(h);
		if (f == kc_own[S_MEM_UNMAP] || !h) {
			snprintf(why, len, "%s also interposes dlsym, ahead of "
				 "the preload; %s", file_of((void *)reached),
				 h ? "it hands the CUDA runtime's lookups on "
				 "to the preload" : "not probed (no libcuda "
				 "loaded)");
			return KVDMABUF_PRELOAD_OTHER_DLSYM;
		}
		snprintf(why, len, "%s interposes dlsym ahead of "
			 "libkvdmabuf-preload.so in LD_PRELOAD and answers the "
			 "CUDA runtime's lookups with the driver's own "
			 "functions: cuMemUnmap, cuMemMap and cuMemSetAccess "
			 "that the runtime (PyTorch, NCCL) fetches do not sleep "
			 "or wake KV regions; put libkvdmabuf-preload.so first "
			 "in LD_PRELOAD, or sleep them through the hooks "
			 "(kvdmabuf_sleep + kvdmabuf_preload_sleep)",
			 file_of((void *)reached));
		return KVDMABUF_PRELOAD_OTHER_DLSYM | KVDMABUF_PRELOAD_NO_DLSYM;
	}
	f = gl(RTLD_NEXT, "dlsym");
	if (f && !from_glibc(f)) {
		snprintf(why, len, "%s also interposes dlsym but comes after "
			 "libkvdmabuf-preload.so in LD_PRELOAD: the preload "
			 "hands the lookups it does not answer to glibc, so "
			 "that dlsym is never called and its own hooks of the "
			 "CUDA runtime do not work", file_of(f));
		return KVDMABUF_PRELOAD_OTHER_DLSYM;
	}
	return 0;
}

/* The probe's answer, kept once it is final: a query (kvdmabuf status, a
 * sleep hook) then costs a copy, not a dlopen and lookups through
 * another layer. */
uint32_t kp_dlsym_flags(char *why, size_t len)
{
	static _Atomic int state;       /* 0 none, 1 being kept, 2 kept */
	static char kept_why[KC_ERRMAX];
	static uint32_t kept;
	char w[KC_ERRMAX];
	bool final;
	uint32_t f;
	int none = 0;

	if (atomic_load_explicit(&state, memory_order_acquire) == 2) {
		snprintf(why, len, "%s", kept_why);
		return kept;
	}
	w[0] = '\0';
	f = dlsym_flags_probe(w, sizeof(w), &final);
	if (final && atomic_compare_exchange_strong(&state, &none, 1)) {
		memcpy(kept_why, w, sizeof(w));
		kept = f;
		atomic_store_explicit(&state, 2, memory_order_release);
	}
	snprintf(why, len, "%s", w);
	return f;
}
#else
uint32_t kp_dlsym_flags(char *why, size_t len)
{
	snprintf(why, len, "dlsym and dlvsym are not interposed on this "
		 "architecture: cuMemUnmap, cuMemMap and cuMemSetAccess that "
		 "the CUDA runtime (PyTorch, NCCL) fetches through its own "
		 "handle of libcuda reach the driver directly and do not sleep "
		 "or wake KV regions; sleep them through the hooks "
		 "(kvdmabuf_sleep + kvdmabuf_preload_sleep)");
	return KVDMABUF_PRELOAD_NO_DLSYM;
}
#endif

/* ---- the API (kvdmabuf_preload.h) ---- */

EXPORT int kvdmabuf_preload_set_proxy_ops(void *addr,
				const struct kvdmabuf_preload_proxy_ops *ops)
{
	static atomic_flag said = ATOMIC_FLAG_INIT;
	int rc;

	if (ops && (!ops->revoke || !ops->replace))
		return -EINVAL;
	rc = kp_region_set_ops((uintptr_t)addr, ops);
	if (!rc && ops && !atomic_flag_test_and_set(&said)) {
		char why[KC_ERRMAX];

		if (kp_dlsym_flags(why, sizeof(why)))
			fprintf(stderr, "kvdmabuf-preload: %s\n", why);
	}
	return rc;
}

EXPORT int kvdmabuf_preload_set_ranges_op(void *addr,
					  kvdmabuf_preload_ranges_fn *ranges,
					  unsigned int flags)
{
	struct kp_region_view v;
	struct kc_given *g;
	uintptr_t a = (uintptr_t)addr;
	int rc;

	if ((flags & ~KVDMABUF_PRELOAD_RANGES_EMPTY) || (flags && !ranges))
		return -EINVAL;
	/* from inside an operation (this thread holds the lock): the
	 * records of the parts given back are in use */
	if (kc_depth)
		return -EBUSY;
	pthread_mutex_lock(&kc.transition);
	rc = kp_region_set_ranges(a, ranges);
	g = given_at(a);
	if (!rc && g)           /* what was given back is the old owner's */
		given_drop(g);
	if (!rc && (flags & KVDMABUF_PRELOAD_RANGES_EMPTY)) {
		rc = -ENOMEM;
		if (kp_regions_overlapping(a, 1, &v, 1) == 1 && v.addr == a &&
		    (g = given_get(&v)) != NULL) {
			rc = cover(v.addr, v.len, &g->out, v.addr,
				   v.addr + v.len, true);
			if (rc)
				given_drop(g);
		}
		if (rc)
			kp_region_set_ranges(a, NULL);
	}
	pthread_mutex_unlock(&kc.transition);
	return rc;
}

EXPORT int kvdmabuf_preload_cuda_error(char *buf, size_t len)
{
	if (buf && len)
		snprintf(buf, len, "%s", kc_err);
	return (int)strlen(kc_err);
}
