// SPDX-License-Identifier: MIT
/*
 * preload.c - libkvdmabuf-preload.so: interposes an unmodified transfer
 * engine's memory registrations (LD_PRELOAD), records each one, makes
 * those in declared KV regions on the region's proxy dma-buf in the
 * engine's own PD, and refuses, by name, a sleep that would leave one of
 * the engine's registrations on released memory. API: kvdmabuf_preload.h.
 *
 * Entry points, each at every version libibverbs.so.1 exports (rdma-core
 * 44 and later; `objdump -T libibverbs.so.1`):
 *   ibv_reg_mr@IBVERBS_1.0 (the 1.0 ABI: its PD and MR are wrappers; it
 *     is forwarded as is, and libibverbs' own call of ibv_reg_mr_iova2 on
 *     the real PD lands here, where it is handled), ibv_reg_mr@@IBVERBS_1.1
 *     (what the ibv_reg_mr() macro calls without optional access flags),
 *   ibv_reg_mr_iova@@IBVERBS_1.7, ibv_reg_mr_iova2@@IBVERBS_1.8 (the
 *     macros' choice with IBV_ACCESS_OPTIONAL_RANGE flags),
 *   ibv_reg_dmabuf_mr@@IBVERBS_1.12,
 *   ibv_dereg_mr@IBVERBS_1.0 (forwarded; its inner ibv_dereg_mr lands
 *     here) and ibv_dereg_mr@@IBVERBS_1.1,
 *   ibv_rereg_mr@@IBVERBS_1.1 (its only version): forwarded and the
 *     record updated, or refused where the result would be an MR by
 *     address in a region that has a proxy (see kp_rereg_mr_1_1()),
 *   ibv_reg_mr_ex@@IBVERBS_1.15 (rdma-core 59; verbs_ex.h): by address or
 *     by dma-buf as its comp_mask says, made on the proxy by itself again
 *     (its DMA handle kept); with a provider's buffer or fields newer than
 *     this preload, made as asked and marked cannot follow;
 *   mlx5dv_reg_dmabuf_mr@@MLX5_1.25 (libmlx5.so.1, rdma-core 53): like
 *     ibv_reg_dmabuf_mr, its mlx5 access flags kept on the proxy.
 * Each forwards with dlvsym() to the same symbol at the same version.
 *
 * Global state: an interposer has no context to hang it on; it is all in
 * one struct (`kp`) under one mutex, held only while the tables are read
 * or changed, never across a call into libibverbs. The per-thread depth
 * lets libibverbs' internal calls (ibv_reg_mr@1.1 tail-calls
 * ibv_reg_mr_iova2 through its PLT) and libkvdmabuf's own registrations
 * (kvdmabuf_preload_own()) pass through unrecorded.
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
#include <sys/stat.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "internal.h"            /* lib/config.c's parser, built in */
#include "kvdmabuf_preload.h"
#include "dmabuf_origin.h"
#include "mr_table.h"
#include "preload_internal.h"
#include "state_file.h"
#include "verbs_ex.h"

#define EXPORT __attribute__((visibility("default")))
#define KP_TAGMAX 64

enum kp_entry {
	E_REG_MR_1_0, E_REG_MR_1_1, E_REG_MR_IOVA, E_REG_MR_IOVA2,
	E_REG_DMABUF, E_DEREG_1_0, E_DEREG_1_1, E_REREG_1_1, E_REG_MR_EX,
	E_MLX5_DMABUF, E_NR
};

/* Each entry point, and the library that defines it where that is not
 * libibverbs.so.1 (found by that name when loaded RTLD_LOCAL). */
static const struct {
	const char *name, *version, *lib;
} entries[E_NR] = {
	[E_REG_MR_1_0] = { "ibv_reg_mr", "IBVERBS_1.0" },
	[E_REG_MR_1_1] = { "ibv_reg_mr", "IBVERBS_1.1" },
	[E_REG_MR_IOVA] = { "ibv_reg_mr_iova", "IBVERBS_1.7" },
	[E_REG_MR_IOVA2] = { "ibv_reg_mr_iova2", "IBVERBS_1.8" },
	[E_REG_DMABUF] = { "ibv_reg_dmabuf_mr", "IBVERBS_1.12" },
	[E_DEREG_1_0] = { "ibv_dereg_mr", "IBVERBS_1.0" },
	[E_DEREG_1_1] = { "ibv_dereg_mr", "IBVERBS_1.1" },
	[E_REREG_1_1] = { "ibv_rereg_mr", "IBVERBS_1.1" },
	[E_REG_MR_EX] = { "ibv_reg_mr_ex", "IBVERBS_1.15" },
	[E_MLX5_DMABUF] = { "mlx5dv_reg_dmabuf_mr", "MLX5_1.25",
			    "libmlx5.so.1" },
};

struct kp_region {
	uintptr_t addr;
	size_t len;
	char tag[KP_TAGMAX];
	int proxy_fd;                   /* -1: none */
	uint64_t proxy_off;
	bool asleep;
	bool has_ops;                   /* set by the proxy's owner */
	struct kvdmabuf_preload_proxy_ops ops; /* preload_cuda.c */
	unsigned int held;              /* ops running (kp_region_hold) */
};

/* The interposer's whole state (see the head comment). */
static struct {
	pthread_mutex_t lock;
	pthread_once_t env_once;
	struct kp_region *regions;
	unsigned int nr_regions, cap_regions;
	struct kp_mr_table mrs;
	struct kp_origin_table origins; /* the engine's dma-bufs of GPU memory */
	int env_error;
	char env_msg[256];
	int cuda_mapping;               /* cuda_dmabuf_mapping of the config */
	void *_Atomic next[E_NR];
	_Atomic long long calls[E_NR];
	/* the state file (kvdmabuf_preload.h, "State file"), written once
	 * the process has something of its own to show (file_wanted) */
	struct kp_state_file file;
	bool file_wanted;
	uint64_t last_pending_id;
	/* Registrations inside the provider now: not recorded yet, but a
	 * sleep check must see them (reg_core()). */
	struct kp_pending {
		uint64_t id;
		uintptr_t addr;
		size_t len;
	} *pending;
	unsigned int nr_pending, cap_pending;
} kp = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.env_once = PTHREAD_ONCE_INIT,
};

/* Calls of this thread that are not the engine's: nested in our own
 * forwarding, or libkvdmabuf's. */
static _Thread_local int kp_depth;
/* This thread's last failed registration in a KV region (reg_failed()). */
static _Thread_local char kp_reg_err[KP_WHYMAX + 160];

static void msg(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void msg(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!buf || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}

/*
 * The real entry point. RTLD_NEXT finds libibverbs when it is in the
 * global scope; a libibverbs loaded later with RTLD_LOCAL (a Python
 * extension) is reached by its name.
 */
static bool is_own_entry(const void *f);

static void *next_fn(enum kp_entry e)
{
	void *f = atomic_load(&kp.next[e]);
	void *h;

	if (f)
		return f;
	f = dlvsym(RTLD_NEXT, entries[e].name, entries[e].version);
	if (!f) {
		/* A libibverbs loaded RTLD_LOCAL (a Python extension's). */
		h = dlopen(entries[e].lib ? entries[e].lib : "libibverbs.so.1",
			   RTLD_LAZY | RTLD_NOLOAD);
		if (h) {
			f = dlvsym(h, entries[e].name, entries[e].version);
			dlclose(h);
		}
		/* Our own dlvsym answered (x86-64): it kept the real one. */
		if (f && is_own_entry(f))
			f = atomic_load(&kp.next[e]);
	}
	if (f)
		atomic_store(&kp.next[e], f);
	return f;
}

/* ---- declarations from the environment ---- */

static int parse_entry(const char *s, size_t n)
{
	struct kvd_kv_range r;

	if (kvd_kv_range_parse(s, n, &r))
		return -EINVAL;
	return kvdmabuf_preload_declare((void *)(uintptr_t)r.addr,
					(size_t)r.len, r.tag[0] ? r.tag : NULL,
					-1, 0);
}

/* kp.env_error and its message, once (the first error wins). */
static void env_fail(int rc, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void env_fail(int rc, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&kp.lock);
	if (!kp.env_error) {
		kp.env_error = rc;
		va_start(ap, fmt);
		vsnprintf(kp.env_msg, sizeof(kp.env_msg), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&kp.lock);
	fprintf(stderr, "kvdmabuf-preload: %s\n", kp.env_msg);
}

/*
 * The library's configuration ($KVDMABUF_CONFIG and the KVDMABUF_<KEY>
 * variables, parsed by the library's own parser, lib/config.c): its
 * kv_regions, regions without a proxy until the library or a hook declares
 * the same range with one, and its cuda_dmabuf_mapping. A configuration
 * that does not load trusts no region.
 */
static void config_load(void)
{
	struct kvd_config *cfg;
	char err[320];
	unsigned int i;
	int rc;

	cfg = malloc(sizeof(*cfg));
	if (!cfg) {
		env_fail(-ENOMEM, "configuration: out of memory");
		return;
	}
	rc = kvd_config_load(NULL, cfg, err, sizeof(err));
	if (rc)
		env_fail(rc, "configuration (%s): %s; no KV region is "
			 "trusted: sleep refused", KVDMABUF_CONFIG_ENV, err);
	else
		kp.cuda_mapping = cfg->cuda_mapping;
	for (i = 0; !rc && i < cfg->nr_kv_regions; i++) {
		const struct kvd_kv_range *r = &cfg->kv_regions[i];

		rc = kvdmabuf_preload_declare((void *)(uintptr_t)r->addr,
					      (size_t)r->len,
					      r->tag[0] ? r->tag : NULL, -1, 0);
		if (rc)
			env_fail(rc, "%s: kv_regions entry %#llx+%#llx "
				 "overlaps a region of %s (%s); no KV region "
				 "is trusted: sleep refused", cfg->path,
				 (unsigned long long)r->addr,
				 (unsigned long long)r->len,
				 KVDMABUF_PRELOAD_REGIONS_ENV, strerror(-rc));
	}
	free(cfg);
}

static void env_regions(void)
{
	const char *v = getenv(KVDMABUF_PRELOAD_REGIONS_ENV), *p, *c;
	int rc;

	if (!v)
		return;
	for (p = v; *p; p = *c ? c + 1 : c) {
		c = strchr(p, ',');
		if (!c)
			c = p + strlen(p);
		if (c == p)
			continue;
		rc = parse_entry(p, (size_t)(c - p));
		if (rc) {
			env_fail(rc, "%s: entry '%.*s' is not ADDR+LEN[:TAG] "
				 "or overlaps another (%s); no KV region is "
				 "trusted: sleep refused",
				 KVDMABUF_PRELOAD_REGIONS_ENV, (int)(c - p), p,
				 strerror(-rc));
			return;
		}
	}
}

/* Regions from the environment, then from the configuration. */
static void env_load(void)
{
	env_regions();
	config_load();
}

int kp_cuda_mapping(void)
{
	pthread_once(&kp.env_once, env_load);
	return kp.cuda_mapping;
}

/*
 * fork() (preload_cuda.c's handlers call these, inside its own lock): the
 * child gets kp.lock in the state it had at the fork, so it is held
 * across the fork (no registration or state-file rewrite is half done
 * then). The child owns none of its parent's MRs (each of its own calls
 * records its own) nor its state file: it publishes only what it
 * registers, under its own pid.
 */
void kp_fork_prepare(void)
{
	pthread_mutex_lock(&kp.lock);
}

void kp_fork_parent(void)
{
	pthread_mutex_unlock(&kp.lock);
}

void kp_fork_child(void)
{
	kp_mr_clear(&kp.mrs);
	kp.nr_pending = 0;
	kp_state_forget(&kp.file);
	kp.file_wanted = false;
	pthread_mutex_unlock(&kp.lock);
}

__attribute__((constructor)) static void kp_init(void)
{
	/* nothing is made before there is something to write */
	kp_state_unlink_stale();
	pthread_once(&kp.env_once, env_load);
}

/* ---- tables (kp.lock held) ---- */

static bool overlaps(uintptr_t a, size_t la, uintptr_t b, size_t lb)
{
	return a < b + lb && b < a + la;
}

static struct kp_region *region_containing(uintptr_t a, size_t len)
{
	unsigned int i;

	for (i = 0; i < kp.nr_regions; i++) {
		struct kp_region *r = &kp.regions[i];

		if (a >= r->addr && a - r->addr <= r->len &&
		    len <= r->len - (a - r->addr))
			return r;
	}
	return NULL;
}

static struct kp_region *region_overlapping(uintptr_t a, size_t len)
{
	unsigned int i;

	for (i = 0; i < kp.nr_regions; i++)
		if (overlaps(a, len, kp.regions[i].addr, kp.regions[i].len))
			return &kp.regions[i];
	return NULL;
}

static void nic_name(struct ibv_pd *pd, char *buf, size_t len)
{
	/* the public struct's field: no call into libibverbs needed */
	if (pd && pd->context && pd->context->device)
		snprintf(buf, len, "%s", pd->context->device->name);
	else
		snprintf(buf, len, "?");
}

/* A registration of [a, a+len) goes into the provider: its id, 0 if no memory. */
static uint64_t pending_add(uintptr_t a, size_t len)
{
	if (kp.nr_pending == kp.cap_pending) {
		unsigned int cap = kp.cap_pending ? kp.cap_pending * 2 : 16;
		struct kp_pending *p = realloc(kp.pending, cap * sizeof(*p));

		if (!p)
			return 0;
		kp.pending = p;
		kp.cap_pending = cap;
	}
	kp.pending[kp.nr_pending] = (struct kp_pending){
		.id = ++kp.last_pending_id, .addr = a, .len = len,
	};
	return kp.pending[kp.nr_pending++].id;
}

static void pending_done(uint64_t id)
{
	unsigned int i;

	for (i = 0; i < kp.nr_pending; i++)
		if (kp.pending[i].id == id) {
			kp.pending[i] = kp.pending[--kp.nr_pending];
			return;
		}
}

/* ---- the state file, for `kvdmabuf status` (kp.lock held) ---- */

static const char *const mode_name[] = { "outside", "on-proxy",
					 "cannot-follow" };

/* One line of kvdmabuf_preload_report() and of the state file. */
static int mr_line(const struct kp_mr *m, char *buf, size_t len)
{
	return snprintf(buf, len, "lkey 0x%x %#" PRIxPTR "+%#zx %s %s%s%s\n",
			m->lkey, m->addr, m->len, m->nic, mode_name[m->mode],
			m->why[0] ? " " : "", m->why);
}

/*
 * Writes the state file of this process (state_file.c), once it has
 * recorded a registration in a KV region or slept one: a process that
 * only inherited KVDMABUF_KV_REGIONS (every program an engine execs)
 * writes none. Best effort: the in-process API stays the reference; a
 * folder that cannot be written only costs the out-of-process listing.
 */
static void publish_locked(void)
{
	char line[KP_WHYMAX + 128];
	unsigned int i, asleep = 0, in = 0, proxy = 0, cannot = 0;
	const struct kp_mr *m;
	FILE *f;

	if (!kp.file_wanted)
		return;
	f = kp_state_begin(&kp.file);
	if (!f)
		return;
	for (i = 0; i < kp.nr_regions; i++)
		asleep += kp.regions[i].asleep;
	kp_mr_for_each(&kp.mrs, m) {
		in += m->mode != KP_OUTSIDE;
		proxy += m->mode == KP_ON_PROXY;
		cannot += m->mode == KP_CANNOT_FOLLOW;
	}
	fprintf(f, "regions %u asleep %u in %u proxy %u cannot %u "
		"env_error %d\n", kp.nr_regions, asleep, in, proxy, cannot,
		kp.env_error);
	for (i = 0; i < kp.nr_regions; i++) {
		const struct kp_region *r = &kp.regions[i];

		fprintf(f, "region %#" PRIxPTR "+%#zx %s %s %s\n", r->addr,
			r->len, r->tag, r->proxy_fd >= 0 ? "proxy" : "no-proxy",
			r->asleep ? "asleep" : "awake");
	}
	kp_mr_for_each(&kp.mrs, m)
		if (m->mode != KP_OUTSIDE) {
			mr_line(m, line, sizeof(line));
			fputs(line, f);
		}
	kp_state_commit(&kp.file, f);
}

__attribute__((destructor)) static void kp_fini(void)
{
	pthread_mutex_lock(&kp.lock);
	kp_state_remove(&kp.file);
	pthread_mutex_unlock(&kp.lock);
}

/* ---- registration ---- */

typedef struct ibv_mr *(*reg_mr_fn)(struct ibv_pd *, void *, size_t, int);
typedef struct ibv_mr *(*reg_iova_fn)(struct ibv_pd *, void *, size_t,
				      uint64_t, int);
typedef struct ibv_mr *(*reg_iova2_fn)(struct ibv_pd *, void *, size_t,
				       uint64_t, unsigned int);
typedef struct ibv_mr *(*reg_dmabuf_fn)(struct ibv_pd *, uint64_t, size_t,
					uint64_t, int, int);
typedef struct ibv_mr *(*mlx5_dmabuf_fn)(struct ibv_pd *, uint64_t, size_t,
					 uint64_t, int, int, int);
typedef int (*dereg_fn)(struct ibv_mr *);
typedef int (*rereg_fn)(struct ibv_mr *, int, struct ibv_pd *, void *,
			size_t, int);

/* What the engine asked for, to be made as asked when not on a proxy. */
struct kp_call {
	enum kp_entry e;
	struct ibv_pd *pd;
	void *addr;             /* address forms */
	size_t len;
	uint64_t iova;
	uint64_t offset;        /* dma-buf form */
	int fd;
	unsigned int access;
	struct kp_mr_init_attr *ex;     /* ibv_reg_mr_ex's, the engine's */
	int mlx5_access;                /* mlx5dv_reg_dmabuf_mr's */
};

/* A registration of a dma-buf (its fd and offset), not of an address. */
static bool by_fd(const struct kp_call *c)
{
	return c->e == E_REG_DMABUF || c->e == E_MLX5_DMABUF ||
	       (c->e == E_REG_MR_EX && (c->ex->comp_mask & KP_MR_MASK_FD));
}

/* ibv_reg_mr_ex attributes that cannot be carried over to the proxy: a
 * provider's buffer, or fields newer than this preload. */
static uint64_t ex_foreign(const struct kp_call *c)
{
	const uint64_t known = KP_MR_MASK_IOVA | KP_MR_MASK_ADDR |
			       KP_MR_MASK_FD | KP_MR_MASK_FD_OFFSET |
			       KP_MR_MASK_DMAH;

	return c->e == E_REG_MR_EX ? c->ex->comp_mask & ~known : 0;
}

static struct ibv_mr *forward(const struct kp_call *c)
{
	void *f = next_fn(c->e);
	struct ibv_mr *mr = NULL;

	if (!f) {
		errno = ENOSYS;
		return NULL;
	}
	kp_depth++;
	switch (c->e) {
	case E_REG_MR_1_0:
	case E_REG_MR_1_1:
		mr = ((reg_mr_fn)f)(c->pd, c->addr, c->len, (int)c->access);
		break;
	case E_REG_MR_IOVA:
		mr = ((reg_iova_fn)f)(c->pd, c->addr, c->len, c->iova,
				      (int)c->access);
		break;
	case E_REG_MR_IOVA2:
		mr = ((reg_iova2_fn)f)(c->pd, c->addr, c->len, c->iova,
				       c->access);
		break;
	case E_REG_DMABUF:
		mr = ((reg_dmabuf_fn)f)(c->pd, c->offset, c->len, c->iova,
					c->fd, (int)c->access);
		break;
	case E_REG_MR_EX:
		mr = ((reg_ex_fn)f)(c->pd, c->ex);
		break;
	case E_MLX5_DMABUF:
		mr = ((mlx5_dmabuf_fn)f)(c->pd, c->offset, c->len, c->iova,
					 c->fd, (int)c->access, c->mlx5_access);
		break;
	default:
		errno = EINVAL;
		break;
	}
	kp_depth--;
	return mr;
}

/* The same registration on the region's proxy, in the engine's PD. */
static struct ibv_mr *on_proxy(const struct kp_call *c, int proxy_fd,
			       uint64_t off, int *err)
{
	/* ibv_reg_mr_ex: by itself again, its DMA handle kept;
	 * mlx5dv_reg_dmabuf_mr: by itself again, its mlx5 access kept */
	void *f = next_fn(c->e == E_REG_MR_EX || c->e == E_MLX5_DMABUF ?
			  c->e : E_REG_DMABUF);
	struct kp_mr_init_attr ex;
	struct ibv_mr *mr;

	if (!f) {
		*err = ENOSYS;
		return NULL;
	}
	kp_depth++;
	errno = 0;
	if (c->e == E_REG_MR_EX) {
		ex = (struct kp_mr_init_attr){
			.length = c->len, .access = (int)c->access,
			.comp_mask = KP_MR_MASK_IOVA | KP_MR_MASK_FD |
				     KP_MR_MASK_FD_OFFSET |
				     (c->ex->comp_mask & KP_MR_MASK_DMAH),
			.iova = c->iova, .fd = proxy_fd, .fd_offset = off,
			.dmah = c->ex->comp_mask & KP_MR_MASK_DMAH ?
				c->ex->dmah : NULL,
		};
		mr = ((reg_ex_fn)f)(c->pd, &ex);
	} else if (c->e == E_MLX5_DMABUF) {
		mr = ((mlx5_dmabuf_fn)f)(c->pd, off, c->len, c->iova, proxy_fd,
					 (int)c->access, c->mlx5_access);
	} else {
		mr = ((reg_dmabuf_fn)f)(c->pd, off, c->len, c->iova, proxy_fd,
					(int)c->access);
	}
	*err = mr ? 0 : errno ? errno : EIO;
	kp_depth--;
	if (mr && !by_fd(c))
		mr->addr = c->addr;     /* as ibv_reg_mr reports it */
	else if (mr)
		mr->addr = (void *)(uintptr_t)c->offset;
	return mr;
}

/*
 * The registration of [@a, +c->len) in KV region @tag failed on its proxy
 * (@proxy_err) and as asked (@asked_err): both said on stderr and kept as
 * this thread's kvdmabuf_preload_reg_error(). Return: the errno the engine
 * gets, the proxy's (the cause), except EOPNOTSUPP (a NIC without dma-buf
 * MRs, for which the registration as asked is what was meant).
 */
static int reg_failed(const struct kp_call *c, uintptr_t a, const char *tag,
		      int proxy_err, int asked_err)
{
	if (!asked_err)
		asked_err = EIO;
	msg(kp_reg_err, sizeof(kp_reg_err), "%s of %#" PRIxPTR "+%#zx in KV "
	    "region '%s' failed: on the region's proxy dma-buf: %s (errno "
	    "%d); as asked: %s (errno %d)", entries[c->e].name, a, c->len, tag,
	    strerror(proxy_err), proxy_err, strerror(asked_err), asked_err);
	fprintf(stderr, "kvdmabuf-preload: %s\n", kp_reg_err);
	return proxy_err == EOPNOTSUPP ? asked_err : proxy_err;
}

void kp_dmabuf_exported(int fd, uintptr_t va, size_t len)
{
	struct stat st;

	if (fstat(fd, &st))
		return;
	pthread_mutex_lock(&kp.lock);
	kp_origin_note(&kp.origins, st.st_dev, st.st_ino, va, len);
	pthread_mutex_unlock(&kp.lock);
}

/*
 * The memory an engine's dma-buf MR covers: from the export it came from
 * where the engine exported it here (its iova is whatever the engine
 * chose: 0 for a zero-based MR), else its iova (taken to be the VA, as
 * Mooncake and NCCL register). kp.lock held; @st from fstat of its fd.
 */
static uintptr_t dmabuf_mr_start(const struct kp_call *c,
				 const struct stat *st)
{
	const struct kp_origin *o = st ? kp_origin_of(&kp.origins, st->st_dev,
						      st->st_ino) : NULL;

	if (o && c->offset <= o->len && c->len <= o->len - c->offset)
		return o->va + (uintptr_t)c->offset;
	return (uintptr_t)c->iova;
}

static struct ibv_mr *reg_core(struct kp_call *c)
{
	struct kp_mr rec = { .len = c->len, .mode = KP_OUTSIDE };
	struct kp_region *r;
	struct ibv_mr *mr = NULL;
	int proxy_fd = -1, err = 0;
	uint64_t poff = 0, pend;
	char tag[KP_TAGMAX] = "";
	bool in = false, known;
	struct stat st;
	uintptr_t a;

	if (kp_depth || !c->pd)
		return forward(c);
	pthread_once(&kp.env_once, env_load);
	nic_name(c->pd, rec.nic, sizeof(rec.nic));
	known = by_fd(c) && !fstat(c->fd, &st);
	pthread_mutex_lock(&kp.lock);
	a = by_fd(c) ? dmabuf_mr_start(c, known ? &st : NULL) :
	    (uintptr_t)c->addr;
	rec.addr = a;
	r = region_containing(a, c->len);
	if (r && ex_foreign(c)) {
		in = true;
		snprintf(tag, sizeof(tag), "%s", r->tag);
		snprintf(rec.why, sizeof(rec.why), "ibv_reg_mr_ex with "
			 "comp_mask %#" PRIx64 " (a provider's buffer, or "
			 "fields this preload does not know: %#" PRIx64 ") "
			 "cannot be made on KV region '%s''s proxy",
			 c->ex->comp_mask, ex_foreign(c), r->tag);
	} else if (r) {
		in = true;
		proxy_fd = r->proxy_fd;
		poff = r->proxy_off + (a - r->addr);
		snprintf(tag, sizeof(tag), "%s", r->tag);
	} else if (region_overlapping(a, c->len)) {
		in = true;
		r = region_overlapping(a, c->len);
		snprintf(tag, sizeof(tag), "%s", r->tag);
		snprintf(rec.why, sizeof(rec.why), "it reaches past KV region "
			 "'%s' %#" PRIxPTR "+%#zx (one MR over KV and other "
			 "memory)", r->tag, r->addr, r->len);
	}
	/* Seen by a sleep check from now until recorded (or failed). */
	pend = pending_add(a, c->len);
	pthread_mutex_unlock(&kp.lock);
	if (!pend) {
		errno = ENOMEM;
		return NULL;
	}

	if (in && proxy_fd >= 0) {
		mr = on_proxy(c, proxy_fd, poff, &err);
		if (mr) {
			rec.mode = KP_ON_PROXY;
		} else {
			snprintf(rec.why, sizeof(rec.why), "NIC %s could not "
				 "register region '%s''s proxy dma-buf (%s), so "
				 "the %s was made as asked", rec.nic, tag,
				 strerror(err), by_fd(c) ?
				 "engine's own dma-buf MR" :
				 "registration by address");
		}
	} else if (in && !rec.why[0]) {
		snprintf(rec.why, sizeof(rec.why), "KV region '%s' has no "
			 "proxy dma-buf (host memory, or declared without "
			 "one): the %s holds the pages it was made on", tag,
			 by_fd(c) ? "engine's own dma-buf MR" :
			 "registration by address");
	}
	if (!mr) {
		errno = 0;
		mr = forward(c);
		if (!mr) {
			/* nothing made: nothing to record */
			int asked = errno;

			pthread_mutex_lock(&kp.lock);
			pending_done(pend);
			pthread_mutex_unlock(&kp.lock);
			errno = asked;
			if (in && proxy_fd >= 0)
				errno = reg_failed(c, a, tag, err, errno);
			return NULL;
		}
		if (in)
			rec.mode = KP_CANNOT_FOLLOW;
	}
	rec.mr = mr;
	rec.lkey = mr->lkey;
	pthread_mutex_lock(&kp.lock);
	pending_done(pend);
	/* A region declared meanwhile: this registration cannot follow. */
	if (rec.mode == KP_OUTSIDE && (r = region_overlapping(a, c->len))) {
		rec.mode = KP_CANNOT_FOLLOW;
		snprintf(rec.why, sizeof(rec.why), "made while KV region '%s' "
			 "was being declared", r->tag);
	}
	err = kp_mr_add(&kp.mrs, &rec);
	/* MRs outside every region are not in the file: no rewrite */
	if (!err && rec.mode != KP_OUTSIDE) {
		kp.file_wanted = true;
		publish_locked();
	}
	pthread_mutex_unlock(&kp.lock);
	if (err && in) {
		/* unrecorded KV registration: never hand it out */
		void *f = next_fn(E_DEREG_1_1);

		if (f) {
			kp_depth++;
			((dereg_fn)f)(mr);
			kp_depth--;
		}
		errno = ENOMEM;
		return NULL;
	}
	return mr;
}

/* The entry points: global for .symver, hidden names (version script). */
struct ibv_mr *kp_reg_mr_1_0(struct ibv_pd *pd, void *addr, size_t len,
			     int access);
struct ibv_mr *kp_reg_mr_1_1(struct ibv_pd *pd, void *addr, size_t len,
			     int access);
struct ibv_mr *kp_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len,
			      uint64_t iova, int access);
struct ibv_mr *kp_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len,
			       uint64_t iova, unsigned int access);
struct ibv_mr *kp_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				size_t len, uint64_t iova, int fd, int access);
int kp_dereg_mr_1_0(struct ibv_mr *mr);
int kp_dereg_mr_1_1(struct ibv_mr *mr);
int kp_rereg_mr_1_1(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
		    void *addr, size_t len, int access);
struct ibv_mr *kp_reg_mr_ex(struct ibv_pd *pd, struct kp_mr_init_attr *in);
struct ibv_mr *kp_mlx5_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				     size_t len, uint64_t iova, int fd,
				     int access, int mlx5_access);

struct ibv_mr *kp_reg_mr_1_1(struct ibv_pd *pd, void *addr,
				    size_t len, int access)
{
	struct kp_call c = { .e = E_REG_MR_1_1, .pd = pd, .addr = addr,
			     .len = len, .iova = (uintptr_t)addr,
			     .access = (unsigned int)access };

	atomic_fetch_add(&kp.calls[c.e], 1);
	return reg_core(&c);
}

struct ibv_mr *kp_reg_mr_iova(struct ibv_pd *pd, void *addr,
				     size_t len, uint64_t iova, int access)
{
	struct kp_call c = { .e = E_REG_MR_IOVA, .pd = pd, .addr = addr,
			     .len = len, .iova = iova,
			     .access = (unsigned int)access };

	atomic_fetch_add(&kp.calls[c.e], 1);
	return reg_core(&c);
}

struct ibv_mr *kp_reg_mr_iova2(struct ibv_pd *pd, void *addr,
				      size_t len, uint64_t iova,
				      unsigned int access)
{
	struct kp_call c = { .e = E_REG_MR_IOVA2, .pd = pd, .addr = addr,
			     .len = len, .iova = iova, .access = access };

	atomic_fetch_add(&kp.calls[c.e], 1);
	return reg_core(&c);
}

struct ibv_mr *kp_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				       size_t len, uint64_t iova, int fd,
				       int access)
{
	struct kp_call c = { .e = E_REG_DMABUF, .pd = pd, .offset = offset,
			     .len = len, .iova = iova, .fd = fd,
			     .access = (unsigned int)access };

	atomic_fetch_add(&kp.calls[c.e], 1);
	return reg_core(&c);
}

/*
 * mlx5dv_reg_dmabuf_mr@@MLX5_1.25 (libmlx5, rdma-core 53): a dma-buf MR
 * with mlx5 access flags (data direct), made by the provider without
 * libibverbs' ibv_reg_dmabuf_mr. On a proxy it is made by itself again,
 * the flags kept.
 */
struct ibv_mr *kp_mlx5_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				     size_t len, uint64_t iova, int fd,
				     int access, int mlx5_access)
{
	struct kp_call c = { .e = E_MLX5_DMABUF, .pd = pd, .offset = offset,
			     .len = len, .iova = iova, .fd = fd,
			     .access = (unsigned int)access,
			     .mlx5_access = mlx5_access };

	atomic_fetch_add(&kp.calls[c.e], 1);
	return reg_core(&c);
}

/*
 * ibv_reg_mr_ex@@IBVERBS_1.15: by address or by dma-buf, as its comp_mask
 * says; the engine's struct is read only where comp_mask sets a field.
 */
struct ibv_mr *kp_reg_mr_ex(struct ibv_pd *pd, struct kp_mr_init_attr *in)
{
	struct kp_call c = { .e = E_REG_MR_EX, .pd = pd, .ex = in, .fd = -1 };

	atomic_fetch_add(&kp.calls[c.e], 1);
	if (!in)
		return forward(&c);     /* libibverbs answers */
	c.len = in->length;
	c.access = (unsigned int)in->access;
	if (in->comp_mask & KP_MR_MASK_ADDR)
		c.addr = in->addr;
	c.iova = in->comp_mask & KP_MR_MASK_IOVA ? in->iova :
		 (uintptr_t)c.addr;
	if (in->comp_mask & KP_MR_MASK_FD) {
		c.fd = in->fd;
		if (in->comp_mask & KP_MR_MASK_FD_OFFSET)
			c.offset = in->fd_offset;
	}
	return reg_core(&c);
}

/*
 * The 1.0 ABI: the PD is libibverbs' wrapper (struct ibv_pd_1_0), not
 * ours to read. Forwarded at our depth, so that its inner call of
 * ibv_reg_mr_iova2 with the real PD is handled above.
 */
struct ibv_mr *kp_reg_mr_1_0(struct ibv_pd *pd, void *addr,
				    size_t len, int access)
{
	reg_mr_fn f = (reg_mr_fn)next_fn(E_REG_MR_1_0);

	atomic_fetch_add(&kp.calls[E_REG_MR_1_0], 1);
	if (!f) {
		errno = ENOSYS;
		return NULL;
	}
	return f(pd, addr, len, access);
}

int kp_dereg_mr_1_0(struct ibv_mr *mr)
{
	dereg_fn f = (dereg_fn)next_fn(E_DEREG_1_0);

	atomic_fetch_add(&kp.calls[E_DEREG_1_0], 1);
	return f ? f(mr) : ENOSYS;
}

int kp_dereg_mr_1_1(struct ibv_mr *mr)
{
	dereg_fn f = (dereg_fn)next_fn(E_DEREG_1_1);
	struct kp_mr *m;
	bool in;
	int rc;

	atomic_fetch_add(&kp.calls[E_DEREG_1_1], 1);
	if (!f)
		return ENOSYS;
	if (kp_depth)
		return f(mr);
	/*
	 * The record stays (a sleep check still sees the MR) but leaves the
	 * lookup, and only this call forgets it: once the provider freed the
	 * struct, another thread's registration may get it and record it
	 * under the same pointer, and that record must survive this dereg.
	 */
	pthread_mutex_lock(&kp.lock);
	m = kp_mr_find(&kp.mrs, mr);
	if (m)
		kp_mr_dying(&kp.mrs, m);
	pthread_mutex_unlock(&kp.lock);
	kp_depth++;
	rc = f(mr);
	kp_depth--;
	if (m) {
		pthread_mutex_lock(&kp.lock);
		in = m->mode != KP_OUTSIDE;
		if (rc) {
			kp_mr_revive(&kp.mrs, m); /* still registered */
		} else {
			kp_mr_forget(&kp.mrs, m);
			if (in)
				publish_locked();
		}
		pthread_mutex_unlock(&kp.lock);
	}
	return rc;
}

/*
 * kp.lock held: why ibv_rereg_mr(@m's MR, @flags, [@a, @a+@len)) must be
 * refused, in @why, or "" when it may be forwarded. A new translation
 * would take an MR made on a proxy off it (the provider re-pins by
 * address), or put one by address into a region whose memory the proxy
 * serves (it would not follow a wake): neither can be re-done on the
 * proxy in place (the engine holds the struct ibv_mr, whose handle the
 * provider owns), so the engine must deregister and register again.
 */
static void rereg_refusal(const struct kp_mr *m, int flags, uintptr_t a,
			  size_t len, char *why, size_t wlen)
{
	const struct kp_region *r;

	why[0] = '\0';
	if (!(flags & IBV_REREG_MR_CHANGE_TRANSLATION))
		return;
	if (m && m->mode == KP_ON_PROXY) {
		msg(why, wlen, "it is made on a KV region's proxy dma-buf; a "
		    "new translation would pin memory by address instead");
		return;
	}
	r = region_overlapping(a, len);
	if (r && r->proxy_fd >= 0)
		msg(why, wlen, "the new range %#" PRIxPTR "+%#zx lies in KV "
		    "region '%s', served by its proxy: an MR by address there "
		    "would not follow a wake", a, len, r->tag);
}

/* kp.lock held: @m after a successful rereg of its MR. */
static void rereg_record(struct kp_mr *m, int flags, struct ibv_pd *pd,
			 uintptr_t a, size_t len)
{
	const struct kp_region *r;

	if (flags & IBV_REREG_MR_CHANGE_PD)
		nic_name(pd, m->nic, sizeof(m->nic));
	if (!(flags & IBV_REREG_MR_CHANGE_TRANSLATION))
		return;         /* a proxy MR stays on its proxy */
	m->addr = a;
	m->len = len;
	m->why[0] = '\0';
	m->mode = KP_OUTSIDE;
	r = region_overlapping(a, len);
	if (r) {
		m->mode = KP_CANNOT_FOLLOW;
		msg(m->why, sizeof(m->why), "re-registered (ibv_rereg_mr) by "
		    "address into KV region '%s', which has no proxy", r->tag);
	}
}

/*
 * ibv_rereg_mr@@IBVERBS_1.1: forwarded, and the engine's record follows
 * it (new range: in a region or not again; new PD: its NIC). Refused with
 * IBV_REREG_MR_ERR_INPUT (the MR is unchanged and valid), errno
 * EOPNOTSUPP and a line on stderr where rereg_refusal() says so.
 */
int kp_rereg_mr_1_1(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
		    void *addr, size_t len, int access)
{
	rereg_fn f = (rereg_fn)next_fn(E_REREG_1_1);
	char why[KP_WHYMAX];
	struct kp_mr *m;
	uintptr_t a;
	size_t l;
	int rc;

	atomic_fetch_add(&kp.calls[E_REREG_1_1], 1);
	if (!f) {
		errno = ENOSYS;
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (kp_depth || !mr)
		return f(mr, flags, pd, addr, len, access);
	pthread_once(&kp.env_once, env_load);
	pthread_mutex_lock(&kp.lock);
	m = kp_mr_find(&kp.mrs, mr);
	a = m ? m->addr : (uintptr_t)mr->addr;
	l = m ? m->len : mr->length;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		a = (uintptr_t)addr;
		l = len;
	}
	rereg_refusal(m, flags, a, l, why, sizeof(why));
	pthread_mutex_unlock(&kp.lock);
	if (why[0]) {
		fprintf(stderr, "kvdmabuf-preload: ibv_rereg_mr of MR 0x%x "
			"refused: %s; deregister it and register the new "
			"range instead (nothing was changed)\n", mr->lkey, why);
		errno = EOPNOTSUPP;
		return IBV_REREG_MR_ERR_INPUT;
	}
	kp_depth++;
	rc = f(mr, flags, pd, addr, len, access);
	kp_depth--;
	if (rc)
		return rc;
	pthread_mutex_lock(&kp.lock);
	m = kp_mr_find(&kp.mrs, mr);
	if (m) {
		bool was_in = m->mode != KP_OUTSIDE;

		rereg_record(m, flags, pd, a, l);
		m->lkey = mr->lkey;     /* a new translation may change it */
		kp.file_wanted |= m->mode != KP_OUTSIDE;
		if (was_in || m->mode != KP_OUTSIDE)
			publish_locked();
	}
	pthread_mutex_unlock(&kp.lock);
	return 0;
}

/* Global, named by .symver; the version script hides the kp_ names. */
__asm__(".symver kp_reg_mr_1_0, ibv_reg_mr@IBVERBS_1.0");
__asm__(".symver kp_reg_mr_1_1, ibv_reg_mr@@IBVERBS_1.1");
__asm__(".symver kp_reg_mr_iova, ibv_reg_mr_iova@@IBVERBS_1.7");
__asm__(".symver kp_reg_mr_iova2, ibv_reg_mr_iova2@@IBVERBS_1.8");
__asm__(".symver kp_reg_dmabuf_mr, ibv_reg_dmabuf_mr@@IBVERBS_1.12");
__asm__(".symver kp_dereg_mr_1_0, ibv_dereg_mr@IBVERBS_1.0");
__asm__(".symver kp_dereg_mr_1_1, ibv_dereg_mr@@IBVERBS_1.1");
__asm__(".symver kp_rereg_mr_1_1, ibv_rereg_mr@@IBVERBS_1.1");
__asm__(".symver kp_reg_mr_ex, ibv_reg_mr_ex@@IBVERBS_1.15");
__asm__(".symver kp_mlx5_reg_dmabuf_mr, mlx5dv_reg_dmabuf_mr@@MLX5_1.25");

/* Our entry point of each, as dlsym/dlvsym on a handle hand it out. */
static void *const own[E_NR] = {
	[E_REG_MR_1_0] = (void *)kp_reg_mr_1_0,
	[E_REG_MR_1_1] = (void *)kp_reg_mr_1_1,
	[E_REG_MR_IOVA] = (void *)kp_reg_mr_iova,
	[E_REG_MR_IOVA2] = (void *)kp_reg_mr_iova2,
	[E_REG_DMABUF] = (void *)kp_reg_dmabuf_mr,
	[E_DEREG_1_0] = (void *)kp_dereg_mr_1_0,
	[E_DEREG_1_1] = (void *)kp_dereg_mr_1_1,
	[E_REREG_1_1] = (void *)kp_rereg_mr_1_1,
	[E_REG_MR_EX] = (void *)kp_reg_mr_ex,
	[E_MLX5_DMABUF] = (void *)kp_mlx5_reg_dmabuf_mr,
};

static bool is_own_entry(const void *f)
{
	int e;

	for (e = 0; e < E_NR; e++)
		if (f == own[e])
			return true;
	return false;
}

void *kp_verbs_dlsym(const char *name, const char *version, void *real)
{
	int e, found = -1;

	for (e = 0; e < E_NR; e++) {
		if (strcmp(name, entries[e].name))
			continue;
		if (version && strcmp(version, entries[e].version))
			continue;
		found = e;      /* without a version: the newest, the default */
	}
	if (found < 0 || !real || real == own[found])
		return NULL;
	/* A libibverbs only that handle reaches (RTLD_LOCAL): its own. */
	if (!atomic_load(&kp.next[found]))
		atomic_store(&kp.next[found], real);
	return own[found];
}


/* ---- the API (kvdmabuf_preload.h) ---- */

EXPORT int kvdmabuf_preload_declare(void *addr, size_t len, const char *tag,
				    int proxy_fd, uint64_t proxy_offset)
{
	uintptr_t a = (uintptr_t)addr;
	struct kp_region *r;
	struct kp_mr *m;
	int rc = 0;

	if (!addr || !len || a + len < a || (tag && strlen(tag) >= KP_TAGMAX))
		return -EINVAL;
	pthread_mutex_lock(&kp.lock);
	/* a proxy comes from libkvdmabuf or the engine's hooks, never from
	 * the environment: such a process shows in `kvdmabuf status` */
	kp.file_wanted |= proxy_fd >= 0;
	r = region_overlapping(a, len);
	if (r && r->addr == a && r->len == len &&
	    ((r->proxy_fd == proxy_fd && r->proxy_off == proxy_offset) ||
	     (r->proxy_fd < 0 && proxy_fd >= 0))) {
		/* declared so already (libkvdmabuf at region add, then the
		 * engine's hook), or without a proxy (the configuration,
		 * KVDMABUF_KV_REGIONS) and now with one: registrations from
		 * now on are made on it; the later tag */
		r->proxy_fd = proxy_fd;
		r->proxy_off = proxy_offset;
		if (tag)
			snprintf(r->tag, sizeof(r->tag), "%s", tag);
		publish_locked();
		goto out;
	}
	if (r) {
		rc = -EINVAL;
		goto out;
	}
	if (kp.nr_regions == kp.cap_regions) {
		unsigned int cap = kp.cap_regions ? kp.cap_regions * 2 : 8;

		r = realloc(kp.regions, cap * sizeof(*r));
		if (!r) {
			rc = -ENOMEM;
			goto out;
		}
		kp.regions = r;
		kp.cap_regions = cap;
	}
	r = &kp.regions[kp.nr_regions++];
	memset(r, 0, sizeof(*r));
	r->addr = a;
	r->len = len;
	snprintf(r->tag, sizeof(r->tag), "%s", tag ? tag : "kv_cache");
	r->proxy_fd = proxy_fd;
	r->proxy_off = proxy_offset;
	/* registrations made before: as they were, by address */
	kp_mr_for_each(&kp.mrs, m) {
		if (m->mode != KP_OUTSIDE || !overlaps(m->addr, m->len, a, len))
			continue;
		m->mode = KP_CANNOT_FOLLOW;
		kp.file_wanted = true;
		snprintf(m->why, sizeof(m->why), "registered before KV region "
			 "'%s' was declared", r->tag);
	}
	publish_locked();
out:
	pthread_mutex_unlock(&kp.lock);
	return rc;
}

/* kp.lock held: the region declared at @addr, or NULL. */
static struct kp_region *region_at(uintptr_t addr)
{
	unsigned int i;

	for (i = 0; i < kp.nr_regions; i++)
		if (kp.regions[i].addr == addr)
			return &kp.regions[i];
	return NULL;
}

/* kp.lock held: does an engine MR live on @r's proxy? */
static bool mr_on_proxy(const struct kp_region *r)
{
	const struct kp_mr *m;

	kp_mr_for_each(&kp.mrs, m)
		if (m->mode == KP_ON_PROXY &&
		    overlaps(m->addr, m->len, r->addr, r->len))
			return true;
	return false;
}

EXPORT int kvdmabuf_preload_undeclare(void *addr)
{
	struct kp_region *r;
	int rc = -ENOENT;

	pthread_mutex_lock(&kp.lock);
	r = region_at((uintptr_t)addr);
	if (r && r->held) {
		rc = -EBUSY;    /* its proxy operations are running */
	} else if (r && mr_on_proxy(r)) {
		/*
		 * Forgotten, the region's proxy would go on serving that MR
		 * whatever the memory becomes, and a region declared again
		 * there would count it as following its new proxy.
		 */
		rc = -ENOTEMPTY;
	} else if (r) {
		memmove(r, r + 1,
			(size_t)(kp.regions + kp.nr_regions - r - 1) * sizeof(*r));
		kp.nr_regions--;
		rc = 0;
		publish_locked();
	}
	pthread_mutex_unlock(&kp.lock);
	return rc;
}

/*
 * What a sleep check reads before it takes kp.lock (bypass.c walks the
 * loader's lists): a loaded object that registers past the preload.
 */
struct kp_precheck {
	bool bypass;
	char why[KP_WHYMAX + 200];
};

static void precheck(struct kp_precheck *pc)
{
	pc->bypass = kp_bypass_find(pc->why, sizeof(pc->why));
}

/* kp.lock held: the first registration over [a, a+len) that cannot follow. */
static int check_locked(const struct kp_precheck *pc, uintptr_t a, size_t len,
			char *reason, size_t rlen)
{
	const struct kp_mr *m;
	unsigned int i;

	if (kp.env_error) {
		msg(reason, rlen, "%s", kp.env_msg);
		return -EINVAL;
	}
	if (pc->bypass) {
		msg(reason, rlen, "%s; nothing was released", pc->why);
		return -EBUSY;
	}
	for (i = 0; i < kp.nr_pending; i++) {
		const struct kp_pending *p = &kp.pending[i];

		if (!overlaps(p->addr, p->len, a, len))
			continue;
		msg(reason, rlen, "an engine registration of %#" PRIxPTR
		    "+%#zx is being made right now (in the NIC's provider): "
		    "nothing was released, try again", p->addr, p->len);
		return -EBUSY;
	}
	kp_mr_for_each(&kp.mrs, m) {
		if (m->mode == KP_ON_PROXY || !overlaps(m->addr, m->len, a, len))
			continue;
		msg(reason, rlen, "engine MR 0x%x (%#" PRIxPTR "+%#zx) on NIC "
		    "%s pins: cannot sleep transparently (%s); nothing was "
		    "released", m->lkey, m->addr, m->len, m->nic,
		    m->why[0] ? m->why : "registered by address over this "
		    "memory, in no declared KV region");
		return -EBUSY;
	}
	return 0;
}

EXPORT int kvdmabuf_preload_check(const void *addr, size_t len, char *reason,
				  size_t reason_len)
{
	struct kp_precheck pc;
	int rc;

	pthread_once(&kp.env_once, env_load);
	msg(reason, reason_len, "%s", "");
	precheck(&pc);
	pthread_mutex_lock(&kp.lock);
	rc = check_locked(&pc, (uintptr_t)addr, len, reason, reason_len);
	pthread_mutex_unlock(&kp.lock);
	return rc;
}

static int set_asleep(const char *tag, bool asleep, char *err, size_t len)
{
	char why[KP_WHYMAX + 200];
	struct kp_precheck pc = { 0 };
	unsigned int i;
	int rc = 0;

	pthread_once(&kp.env_once, env_load);
	msg(err, len, "%s", "");
	if (asleep)
		precheck(&pc);
	pthread_mutex_lock(&kp.lock);
	/* every region checked before any changes: all or nothing */
	for (i = 0; asleep && i < kp.nr_regions; i++) {
		const struct kp_region *r = &kp.regions[i];

		if (tag && strcmp(tag, r->tag))
			continue;
		rc = check_locked(&pc, r->addr, r->len, why, sizeof(why));
		if (rc) {
			msg(err, len, "sleep of KV region '%s' %#" PRIxPTR
			    "+%#zx refused: %s", r->tag, r->addr, r->len, why);
			goto out;
		}
	}
	if (asleep && kp.env_error) {
		msg(err, len, "sleep refused: %s", kp.env_msg);
		rc = -EINVAL;
		goto out;
	}
	for (i = 0; i < kp.nr_regions; i++)
		if (!tag || !strcmp(tag, kp.regions[i].tag))
			kp.regions[i].asleep = asleep;
	kp.file_wanted |= asleep;
	publish_locked();
out:
	pthread_mutex_unlock(&kp.lock);
	return rc;
}

EXPORT int kvdmabuf_preload_sleep(const char *tag, char *err, size_t err_len)
{
	return set_asleep(tag, true, err, err_len);
}

EXPORT int kvdmabuf_preload_wake(const char *tag, char *err, size_t err_len)
{
	return set_asleep(tag, false, err, err_len);
}

EXPORT void kvdmabuf_preload_own(int on)
{
	if (on)
		kp_depth++;
	else if (kp_depth > 0)
		kp_depth--;
}

EXPORT int kvdmabuf_preload_query(struct kvdmabuf_preload_state *st)
{
	const struct kp_mr *m;
	char why[512];
	unsigned int i;

	if (!st)
		return -EINVAL;
	pthread_once(&kp.env_once, env_load);
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&kp.lock);
	st->nr_regions = kp.nr_regions;
	for (i = 0; i < kp.nr_regions; i++)
		st->nr_asleep += kp.regions[i].asleep;
	st->nr_mrs = kp.mrs.nr;
	kp_mr_for_each(&kp.mrs, m) {
		st->nr_in_regions += m->mode != KP_OUTSIDE;
		st->nr_on_proxy += m->mode == KP_ON_PROXY;
		st->nr_cannot_follow += m->mode == KP_CANNOT_FOLLOW;
	}
	st->env_error = kp.env_error;
	pthread_mutex_unlock(&kp.lock);
	/* outside the lock: it calls another layer's dlsym */
	st->flags = kp_dlsym_flags(why, sizeof(why));
	return 0;
}

EXPORT long long kvdmabuf_preload_calls(const char *symbol)
{
	char name[96];
	unsigned int e;

	if (!symbol)
		return -EINVAL;
	for (e = 0; e < E_NR; e++) {
		snprintf(name, sizeof(name), "%s@%s", entries[e].name,
			 entries[e].version);
		if (!strcmp(name, symbol))
			return atomic_load(&kp.calls[e]);
	}
	return kp_cuda_calls(symbol);
}

EXPORT int kvdmabuf_preload_reg_error(char *buf, size_t len)
{
	msg(buf, len, "%s", kp_reg_err);
	return (int)strlen(kp_reg_err);
}

EXPORT int kvdmabuf_preload_report(char *buf, size_t len)
{
	size_t used = 0;
	const struct kp_mr *m;
	int n;

	if (buf && len)
		buf[0] = '\0';
	pthread_mutex_lock(&kp.lock);
	kp_mr_for_each(&kp.mrs, m) {
		if (m->mode == KP_OUTSIDE)
			continue;
		n = mr_line(m, buf && used < len ? buf + used : NULL,
			    buf && used < len ? len - used : 0);
		if (n > 0)
			used += (size_t)n;
	}
	pthread_mutex_unlock(&kp.lock);
	return (int)used;
}

/* ---- for the CUDA interposer (preload_internal.h) ---- */

unsigned int kp_regions_overlapping(uintptr_t a, size_t len,
				    struct kp_region_view *v, unsigned int max)
{
	unsigned int i, n = 0;

	pthread_once(&kp.env_once, env_load);
	pthread_mutex_lock(&kp.lock);
	for (i = 0; i < kp.nr_regions; i++) {
		const struct kp_region *r = &kp.regions[i];

		if (!overlaps(a, len, r->addr, r->len))
			continue;
		if (n < max) {
			v[n] = (struct kp_region_view){
				.addr = r->addr, .len = r->len,
				.proxy_fd = r->proxy_fd,
				.proxy_off = r->proxy_off,
				.asleep = r->asleep, .has_ops = r->has_ops,
				.ops = r->ops,
			};
			snprintf(v[n].tag, sizeof(v[n].tag), "%s", r->tag);
		}
		n++;
	}
	pthread_mutex_unlock(&kp.lock);
	return n;
}

int kp_region_set_asleep(uintptr_t addr, bool asleep, char *err,
			 size_t err_len)
{
	struct kp_precheck pc = { 0 };
	struct kp_region *r;
	int rc = 0;

	pthread_once(&kp.env_once, env_load);
	msg(err, err_len, "%s", "");
	if (asleep)
		precheck(&pc);
	pthread_mutex_lock(&kp.lock);
	r = region_at(addr);
	if (!r)
		rc = -ENOENT;
	else if (asleep)
		rc = check_locked(&pc, r->addr, r->len, err, err_len);
	if (!rc) {
		r->asleep = asleep;
		kp.file_wanted |= asleep;
		publish_locked();
	}
	pthread_mutex_unlock(&kp.lock);
	return rc;
}

int kp_region_set_ops(uintptr_t addr,
		      const struct kvdmabuf_preload_proxy_ops *ops)
{
	struct kp_region *r;
	int rc = 0;

	pthread_mutex_lock(&kp.lock);
	r = region_at(addr);
	if (!r) {
		rc = -ENOENT;
	} else if (r->held) {
		rc = -EBUSY;
	} else {
		r->has_ops = ops != NULL;
		memset(&r->ops, 0, sizeof(r->ops));
		if (ops)
			r->ops = *ops;
	}
	pthread_mutex_unlock(&kp.lock);
	return rc;
}

int kp_region_hold(uintptr_t addr, struct kvdmabuf_preload_proxy_ops *ops)
{
	struct kp_region *r;
	int rc = 0;

	pthread_mutex_lock(&kp.lock);
	r = region_at(addr);
	if (!r || !r->has_ops) {
		rc = -ENOENT;
	} else {
		r->held++;
		*ops = r->ops;
	}
	pthread_mutex_unlock(&kp.lock);
	return rc;
}

void kp_region_unhold(uintptr_t addr)
{
	struct kp_region *r;

	pthread_mutex_lock(&kp.lock);
	r = region_at(addr);
	if (r && r->held)
		r->held--;
	pthread_mutex_unlock(&kp.lock);
}
