// SPDX-License-Identifier: MIT
/*
 * preload.c - libkvdmabuf-preload.so: interposes an unmodified transfer
 * engine's memory registrations (LD_PRELOAD), records each one, makes
 * those in declared KV regions on the region's proxy dma-buf in the
 * engine's own PD, and refuses, by name, a sleep that would leave one of
 * the engine's registrations on released memory. API: kvdmabuf_preload.h.
 *
 * This file: the declared regions (from the environment, the
 * configuration and the API), the records' state file, the API of
 * kvdmabuf_preload.h and the region calls of the CUDA interposer
 * (preload_cuda.c). The registration entry points: registration.c.
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
#include "preload_state.h"

#define EXPORT __attribute__((visibility("default")))

/* Each entry point, and the library that defines it where that is not
 * libibverbs.so.1 (found by that name when loaded RTLD_LOCAL). */
const struct kp_entry_name kp_entries[E_NR] = {
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

struct kp_state kp = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.file_lock = PTHREAD_MUTEX_INITIALIZER,
	.env_once = PTHREAD_ONCE_INIT,
};

_Thread_local int kp_depth;
_Thread_local char kp_reg_err[KP_WHYMAX + 160];

void kp_msg(char *buf, size_t len, const char *fmt, ...)
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
void *kp_next_fn(enum kp_entry e)
{
	void *f = atomic_load(&kp.next[e]);
	void *h;

	if (f)
		return f;
	f = dlvsym(RTLD_NEXT, kp_entries[e].name, kp_entries[e].version);
	if (!f) {
		/* A libibverbs loaded RTLD_LOCAL (a Python extension's). */
		h = dlopen(kp_entries[e].lib ? kp_entries[e].lib : "libibverbs.so.1",
			   RTLD_LAZY | RTLD_NOLOAD);
		if (h) {
			f = dlvsym(h, kp_entries[e].name, kp_entries[e].version);
			dlclose(h);
		}
		/* Our own dlvsym answered (x86-64): it kept the real one. */
		if (f && kp_is_own_entry(f))
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
	kp_unlock();
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
void kp_env_load(void)
{
	env_regions();
	config_load();
}

int kp_cuda_mapping(void)
{
	pthread_once(&kp.env_once, kp_env_load);
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
/* Lock order: file_lock, then lock (nobody takes file_lock holding lock). */
void kp_fork_prepare(void)
{
	pthread_mutex_lock(&kp.file_lock);
	pthread_mutex_lock(&kp.lock);
}

void kp_fork_parent(void)
{
	pthread_mutex_unlock(&kp.lock);
	pthread_mutex_unlock(&kp.file_lock);
}

void kp_fork_child(void)
{
	kp_mr_clear(&kp.mrs);
	kp.nr_pending = 0;
	kp_state_forget(&kp.file);
	kp.file_gen = 0;
	kp.file_wanted = false;
	pthread_mutex_unlock(&kp.lock);
	pthread_mutex_unlock(&kp.file_lock);
}

__attribute__((constructor)) static void kp_init(void)
{
	/* nothing is made before there is something to write */
	kp_state_unlink_stale();
	pthread_once(&kp.env_once, kp_env_load);
}

/* ---- tables (kp.lock held) ---- */

static bool overlaps(uintptr_t a, size_t la, uintptr_t b, size_t lb)
{
	return a < b + lb && b < a + la;
}

struct kp_region *kp_region_containing(uintptr_t a, size_t len)
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

struct kp_region *kp_region_overlapping(uintptr_t a, size_t len)
{
	unsigned int i;

	for (i = 0; i < kp.nr_regions; i++)
		if (overlaps(a, len, kp.regions[i].addr, kp.regions[i].len))
			return &kp.regions[i];
	return NULL;
}

void kp_nic_name(struct ibv_pd *pd, char *buf, size_t len)
{
	/* the public struct's field: no call into libibverbs needed */
	if (pd && pd->context && pd->context->device)
		snprintf(buf, len, "%s", pd->context->device->name);
	else
		snprintf(buf, len, "?");
}

/* A registration of [a, a+len) goes into the provider: its id, 0 if no memory. */
uint64_t kp_pending_add(uintptr_t a, size_t len)
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

void kp_pending_done(uint64_t id)
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
 * The state file of this process (state_file.c), once it has recorded a
 * registration in a KV region or slept one: a process that only inherited
 * KVDMABUF_KV_REGIONS (every program an engine execs) writes none. The
 * body is made here, under kp.lock; kp_unlock() writes it after letting
 * the lock go, so that no other thread's registration waits on the
 * folder. Best effort: the in-process API stays the reference; a folder
 * that cannot be written only costs the out-of-process listing.
 */
void kp_publish_locked(void)
{
	char line[KP_WHYMAX + 128];
	unsigned int i, asleep = 0, in = 0, proxy = 0, cannot = 0;
	const struct kp_mr *m;
	size_t size;
	char *body;
	FILE *f;

	if (!kp.file_wanted)
		return;
	f = open_memstream(&body, &size);
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
	if (fclose(f)) {
		free(body);
		return;
	}
	free(kp.body);                  /* an older one nobody wrote yet */
	kp.body = body;
	kp.body_gen = ++kp.gen;
}

/* The newest body, in place of the file, unless a newer one is there. */
static void write_body(char *body, uint64_t gen)
{
	FILE *f;

	pthread_mutex_lock(&kp.file_lock);
	if (gen > kp.file_gen && !kp.file_closed) {
		f = kp_state_begin(&kp.file);
		if (f) {
			fputs(body, f);
			kp_state_commit(&kp.file, f);
		}
		kp.file_gen = gen;
	}
	pthread_mutex_unlock(&kp.file_lock);
	free(body);
}

void kp_unlock(void)
{
	char *body = kp.body;
	uint64_t gen = kp.body_gen;

	kp.body = NULL;
	pthread_mutex_unlock(&kp.lock);
	if (body)
		write_body(body, gen);
}

__attribute__((destructor)) static void kp_fini(void)
{
	pthread_mutex_lock(&kp.file_lock);
	kp_state_remove(&kp.file);
	kp.file_closed = true;
	pthread_mutex_unlock(&kp.file_lock);
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
	r = kp_region_overlapping(a, len);
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
		kp_publish_locked();
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
	kp_publish_locked();
out:
	kp_unlock();
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
		kp_publish_locked();
	}
	kp_unlock();
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
		kp_msg(reason, rlen, "%s", kp.env_msg);
		return -EINVAL;
	}
	if (pc->bypass) {
		kp_msg(reason, rlen, "%s; nothing was released", pc->why);
		return -EBUSY;
	}
	for (i = 0; i < kp.nr_pending; i++) {
		const struct kp_pending *p = &kp.pending[i];

		if (!overlaps(p->addr, p->len, a, len))
			continue;
		kp_msg(reason, rlen, "an engine registration of %#" PRIxPTR
		    "+%#zx is being made right now (in the NIC's provider): "
		    "nothing was released, try again", p->addr, p->len);
		return -EBUSY;
	}
	kp_mr_for_each(&kp.mrs, m) {
		if (m->mode == KP_ON_PROXY || !overlaps(m->addr, m->len, a, len))
			continue;
		kp_msg(reason, rlen, "engine MR 0x%x (%#" PRIxPTR "+%#zx) on NIC "
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

	pthread_once(&kp.env_once, kp_env_load);
	kp_msg(reason, reason_len, "%s", "");
	precheck(&pc);
	pthread_mutex_lock(&kp.lock);
	rc = check_locked(&pc, (uintptr_t)addr, len, reason, reason_len);
	kp_unlock();
	return rc;
}

static int set_asleep(const char *tag, bool asleep, char *err, size_t len)
{
	char why[KP_WHYMAX + 200];
	struct kp_precheck pc = { 0 };
	unsigned int i;
	int rc = 0;

	pthread_once(&kp.env_once, kp_env_load);
	kp_msg(err, len, "%s", "");
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
			kp_msg(err, len, "sleep of KV region '%s' %#" PRIxPTR
			    "+%#zx refused: %s", r->tag, r->addr, r->len, why);
			goto out;
		}
	}
	if (asleep && kp.env_error) {
		kp_msg(err, len, "sleep refused: %s", kp.env_msg);
		rc = -EINVAL;
		goto out;
	}
	for (i = 0; i < kp.nr_regions; i++)
		if (!tag || !strcmp(tag, kp.regions[i].tag))
			kp.regions[i].asleep = asleep;
	kp.file_wanted |= asleep;
	kp_publish_locked();
out:
	kp_unlock();
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
	pthread_once(&kp.env_once, kp_env_load);
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
	kp_unlock();
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
		snprintf(name, sizeof(name), "%s@%s", kp_entries[e].name,
			 kp_entries[e].version);
		if (!strcmp(name, symbol))
			return atomic_load(&kp.calls[e]);
	}
	return kp_cuda_calls(symbol);
}

EXPORT int kvdmabuf_preload_reg_error(char *buf, size_t len)
{
	kp_msg(buf, len, "%s", kp_reg_err);
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
	kp_unlock();
	return (int)used;
}

/* ---- for the CUDA interposer (preload_internal.h) ---- */

unsigned int kp_regions_overlapping(uintptr_t a, size_t len,
				    struct kp_region_view *v, unsigned int max)
{
	unsigned int i, n = 0;

	pthread_once(&kp.env_once, kp_env_load);
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
				.ops = r->ops, .ranges = r->ranges,
			};
			snprintf(v[n].tag, sizeof(v[n].tag), "%s", r->tag);
		}
		n++;
	}
	kp_unlock();
	return n;
}

int kp_region_set_asleep(uintptr_t addr, bool asleep, char *err,
			 size_t err_len)
{
	struct kp_precheck pc = { 0 };
	struct kp_region *r;
	int rc = 0;

	pthread_once(&kp.env_once, kp_env_load);
	kp_msg(err, err_len, "%s", "");
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
		kp_publish_locked();
	}
	kp_unlock();
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
		r->ranges = NULL;
		if (ops)
			r->ops = *ops;
	}
	kp_unlock();
	return rc;
}

int kp_region_set_ranges(uintptr_t addr, kvdmabuf_preload_ranges_fn *ranges)
{
	struct kp_region *r;
	int rc = 0;

	pthread_mutex_lock(&kp.lock);
	r = region_at(addr);
	if (!r || !r->has_ops)
		rc = -ENOENT;
	else if (r->held)
		rc = -EBUSY;
	else
		r->ranges = ranges;
	kp_unlock();
	return rc;
}

int kp_region_hold(uintptr_t addr, struct kvdmabuf_preload_proxy_ops *ops,
		   kvdmabuf_preload_ranges_fn **ranges)
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
		if (ranges)
			*ranges = r->ranges;
	}
	kp_unlock();
	return rc;
}

void kp_region_unhold(uintptr_t addr)
{
	struct kp_region *r;

	pthread_mutex_lock(&kp.lock);
	r = region_at(addr);
	if (r && r->held)
		r->held--;
	kp_unlock();
}
