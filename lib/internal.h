/* SPDX-License-Identifier: MIT */
/*
 * internal.h - libkvdmabuf internals. Not installed. Names here start with
 * kvd_ and are local to the shared library (version script); the host unit
 * tests link the static library and use this header to swap backends.
 */
#ifndef KVDMABUF_INTERNAL_H
#define KVDMABUF_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvdmabuf.h"

#define KVD_ERRMAX 512

/*
 * Entry points of two symbol versions (libkvdmabuf.map): name@@ver, the
 * default, which programs link against now, and name@ver, kept for those
 * built before. Static archives take the default.
 */
#define KVD_SYMVER_DEFAULT(name, ver) __attribute__((symver(#name "@@" ver)))
#define KVD_SYMVER_OLD(name, ver) __attribute__((symver(#name "@" ver)))

/* syslib.c: libraries loaded at first use, by the calls that need them. */
enum kvd_syslib { KVD_SYSLIB_YAML, KVD_SYSLIB_DRM };
/*
 * Symbol @name of library @id, or NULL with @err saying that @use needs
 * it and which package to install (the caller returns -ELIBACC).
 */
void *kvd_syslib_sym(enum kvd_syslib id, const char *name, const char *use,
		     char *err, size_t errlen);

/* The output structs as 0.2-0.4 had them: without the reserved tail. */
#define KVD_REGION_INFO_SIZE_0_2 \
	offsetof(struct kvdmabuf_region_info, reserved)
#define KVD_STATE_SIZE_0_2 offsetof(struct kvdmabuf_state, reserved)
int kvd_region_info_0_2(struct kvdmabuf_region *r,
			struct kvdmabuf_region_info *info);
int kvd_region_info_0_5(struct kvdmabuf_region *r,
			struct kvdmabuf_region_info *info);
int kvd_query_0_2(struct kvdmabuf_ctx *ctx, struct kvdmabuf_state *st);
int kvd_query_0_5(struct kvdmabuf_ctx *ctx, struct kvdmabuf_state *st);
#define KVD_NAMEMAX 64
#define KVD_MAX_KV_REGIONS 64

/* ---- config (config.c) ---- */
enum kvd_protocol { KVD_PROTO_RDMA = 1, KVD_PROTO_TCP = 2, KVD_PROTO_OTHER = 3 };
/* cuda_dmabuf_mapping: the flags of the CUDA dma-buf export (cuda.c). */
enum kvd_cuda_mapping {
	KVD_CUDA_MAPPING_AUTO = 0,       /* PCIe mapping, 0 if the driver refuses */
	KVD_CUDA_MAPPING_PCIE = 1,       /* PCIe mapping or fail */
	KVD_CUDA_MAPPING_DEFAULT = 2,    /* flags 0 */
};

/*
 * host_on_demand: which NICs' on-demand paging host memory released at
 * sleep may use (mode ODP). AUTO leaves out soft-RoCE, whose in-tree ODP
 * copies ignore the page offset (Linux 6.14 to at least 7.3: wrong bytes,
 * successful completions; tests/rxe/patches/7.3/0002); ON takes every NIC
 * that advertises it; OFF none (REREGISTER).
 */
enum kvd_host_odp { KVD_HOST_ODP_AUTO = 0, KVD_HOST_ODP_ON, KVD_HOST_ODP_OFF };
/* registrations: who registers device regions with the NICs. LIBRARY: the
 * library, on every NIC (its keys); ENGINE: only the engine, under
 * libkvdmabuf-preload.so, on the proxies the library makes (proxy-only:
 * no NIC opened, no MR of the library's own). */
enum kvd_registrations { KVD_REGISTRATIONS_LIBRARY = 0,
			 KVD_REGISTRATIONS_ENGINE };

struct kvd_config {
	char protocol[KVD_NAMEMAX];
	int proto;                       /* enum kvd_protocol */
	char nics[KVDMABUF_MAX_NICS][KVD_NAMEMAX];
	unsigned int nr_nics;
	unsigned int drain_timeout_ms;
	int module;                      /* enum kvdmabuf_module_use */
	char cuda_library[256];          /* "" if not set */
	int cuda_mapping;                /* enum kvd_cuda_mapping */
	/* The engine's transfer library ("" if not set): "ucx" (and "nixl",
	 * which runs over UCX) makes the gate read UCX_TLS. */
	char transport[KVD_NAMEMAX];
	int host_odp;                    /* enum kvd_host_odp */
	int registrations;               /* enum kvd_registrations */
	/* prefetch_at_wake: after a wake, ask the NICs to map what FOLLOW
	 * and ODP MRs will read (ibv_advise_mr) before the first transfer */
	int prefetch_at_wake;
	char path[256];                  /* file it came from */
	/* kv_regions: KV memory by address for libkvdmabuf-preload.so
	 * (engines without hooks); the library itself does not use them. */
	struct kvd_kv_range {
		uint64_t addr, len;
		char tag[KVD_NAMEMAX];   /* "" if not given */
	} kv_regions[KVD_MAX_KV_REGIONS];
	unsigned int nr_kv_regions;
};

/*
 * Resolve the config path (@path or $KVDMABUF_CONFIG) and parse it.
 * On error returns -errno and writes a message into @err.
 */
int kvd_config_load(const char *path, struct kvd_config *cfg,
		    char *err, size_t errlen);
/* The same from YAML text (kvdmabuf_options.config_yaml). */
int kvd_config_load_yaml(const char *text, struct kvd_config *cfg,
			 char *err, size_t errlen);
/* Parse YAML text (for tests); @name is used in messages. */
int kvd_config_parse(const char *text, size_t len, const char *name,
		     struct kvd_config *cfg, char *err, size_t errlen);
/* One ADDR+LEN[:TAG] entry (@s, @n bytes; numbers in C syntax): 0, or
 * -EINVAL (empty or wrapping range, bad number, empty or long tag). Shared
 * by kv_regions and libkvdmabuf-preload.so's KVDMABUF_KV_REGIONS. */
int kvd_kv_range_parse(const char *s, size_t n, struct kvd_kv_range *r);
/* The gate on a parsed config: 1 accepted, 0 refused (reason in @reason). */
int kvd_gate_check(const struct kvd_config *cfg, char *reason, size_t len);

/* ---- in-flight accounting (inflight.c) ---- */
/* One word: transfers in flight, and KVD_IO_CLOSED once sleep began. */
#define KVD_IO_CLOSED (1ull << 63)
struct kvd_inflight {
	_Atomic uint64_t word;
	_Atomic int64_t busy_since_ns;  /* when the count last left zero */
	_Atomic uint64_t unbalanced;
	/* Futex the drain sleeps on: bumped when the last transfer of a
	 * closed region ends, so the drain proceeds at once. */
	_Atomic uint32_t ended;
	/* io_end calls on a closed region that may still touch this struct
	 * after their decrement (the drain's wake-up): freeing waits for 0. */
	_Atomic uint32_t wakers;
};
int kvd_io_begin(struct kvd_inflight *io);
void kvd_io_end(struct kvd_inflight *io);
/* Returns whether @io was closed already. */
bool kvd_io_close(struct kvd_inflight *io);
void kvd_io_open(struct kvd_inflight *io);
uint64_t kvd_io_count(struct kvd_inflight *io);
/* Waits until no io_end still touches @io (before it is freed). */
void kvd_io_quiesce(struct kvd_inflight *io);
/* Sleeps until @io's 'ended' moves from @seen, at most @ns nanoseconds. */
void kvd_io_wait_ended(struct kvd_inflight *io, uint32_t seen, int64_t ns);
int64_t kvd_now_ns(void);

/* range_io.c: transfers on parts of a region (kvdmabuf_io_begin_range()),
 * by unit of KVD_IO_UNIT bytes (a GPU page), each unit's count and
 * KVD_IO_CLOSED in one word. */
#define KVD_IO_UNIT ((size_t)2 << 20)
struct kvd_range_io {
	_Atomic uint64_t *unit;         /* NULL: the region has no proxy */
	size_t nr_units;
	_Atomic uint32_t ended;         /* futex: a closed unit went idle */
};
int kvd_range_io_init(struct kvd_range_io *rio, size_t len);
void kvd_range_io_free(struct kvd_range_io *rio);
struct kvdmabuf_region;
struct kvd_range;
/* Close the units of @k and wait (at most @timeout_ms) until no transfer
 * is in flight on them: 0 (closed: open them after the change) or
 * -EAGAIN (open again, message set). */
int kvd_range_io_drain(struct kvdmabuf_region *r, const struct kvd_range *k,
		       unsigned int n, unsigned int timeout_ms);
void kvd_range_io_open(struct kvdmabuf_region *r, const struct kvd_range *k,
		       unsigned int n);

/* ---- backends ---- */
struct kvd_mr {
	void *handle;           /* struct ibv_mr *, or the fake NIC's record */
	uint32_t lkey, rkey;
	/* where the MR starts for the NIC: libibverbs' ibv_mr.addr of a
	 * dma-buf MR is its offset in the dma-buf, not this */
	uint64_t iova;
};

struct kvd_nic {
	char name[KVD_NAMEMAX];
	struct ibv_pd *pd;      /* the caller's or owned_pd */
	struct ibv_pd *owned_pd;
	struct ibv_context *owned_ctx;
	uint64_t max_mr_size;   /* the device's limit on one MR; 0: unknown */
	/* on-demand paging of RC RDMA READ and WRITE on explicit MRs: an
	 * MR by address follows what the engine maps there */
	bool odp;
};

/* One range of a proxy for the module's RANGES (ranges.c). */
struct kvd_range {
	uint64_t start, len;		/* in the proxy */
	int fd;				/* dma-buf, not owned; -1: unbacked */
	uint64_t offset;		/* in @fd */
};

/* What the module reports about a proxy (subset of its query). */
struct kvd_proxy_info {
	uint32_t state;         /* KVD_PROXY_BACKED / _REVOKED / _EMPTY */
	uint64_t generation;
	uint32_t nr_dynamic;
	uint32_t nr_pinned;
	uint32_t nr_blocking_pins;
	uint32_t nr_revocable_pins; /* API 2.2+: pins a revoke ends for good */
	uint32_t nr_mappings;
	uint32_t revoke_reason;  /* KVD_REVOKE_* */
};
/* Why the module revoked a proxy (its KVDMABUF_REVOKE_*). */
#define KVD_REVOKE_NONE 0
#define KVD_REVOKE_USER 1
#define KVD_REVOKE_EXPORTER 2
#define KVD_PROXY_EMPTY 0
#define KVD_PROXY_BACKED 1
#define KVD_PROXY_REVOKED 2

#define KVD_ATTACH_REPLACE (1u << 0)

/*
 * Every side effect the sleep/wake engine has goes through this table:
 * the real backends (CUDA/DRM export, verbs, the module) or, in host unit
 * tests, fakes and fault injectors. Each returns 0 or -errno and, on
 * failure, may set the context message with kvd_err().
 */
#define KVD_REG_ON_DEMAND	(1u << 0)

struct kvd_ops {
	/* Fill ctx->nics (protocol rdma only). */
	int (*nics_open)(struct kvdmabuf_ctx *ctx,
			 const struct kvdmabuf_options *opts);
	void (*nics_close)(struct kvdmabuf_ctx *ctx);
	/* Append the caller's @pd as NIC ctx->nr_nics; drop NIC @i (and
	 * what the library opened for it; later NICs move down). */
	int (*nic_add)(struct kvdmabuf_ctx *ctx, struct ibv_pd *pd);
	void (*nic_remove)(struct kvdmabuf_ctx *ctx, unsigned int i);
	/* Export the current memory of a device region as a dma-buf fd. */
	int (*export_dmabuf)(struct kvdmabuf_ctx *ctx,
			     struct kvdmabuf_region *r, int *fd,
			     uint64_t *offset);
	int (*reg_dmabuf)(struct kvdmabuf_ctx *ctx, unsigned int nic, int fd,
			  uint64_t offset, size_t len, uint64_t iova,
			  struct kvd_mr *mr);
	/* @flags: KVD_REG_ON_DEMAND (an ODP MR: nothing pinned, it
	 * follows the process's page tables) or 0 */
	int (*reg_addr)(struct kvdmabuf_ctx *ctx, unsigned int nic,
			void *addr, size_t len, unsigned int flags,
			struct kvd_mr *mr);
	int (*dereg)(struct kvdmabuf_ctx *ctx, unsigned int nic,
		     struct kvd_mr *mr);
	/* Optional (NULL: -EOPNOTSUPP): have the NIC map all of @mr now
	 * (ibv_advise_mr PREFETCH_WRITE, synchronous); a hint, no message. */
	int (*prefetch)(struct kvdmabuf_ctx *ctx, unsigned int nic,
			struct kvd_mr *mr);
	/* Open the module's device: -ENOENT/-ENODEV when absent. */
	int (*proxy_open)(struct kvdmabuf_ctx *ctx, int *devfd);
	int (*proxy_create)(struct kvdmabuf_ctx *ctx, uint64_t size,
			    int *proxy_fd, uint64_t *id);
	int (*proxy_attach)(struct kvdmabuf_ctx *ctx, int proxy_fd,
			    int backing_fd, uint64_t offset, unsigned int flags);
	int (*proxy_revoke)(struct kvdmabuf_ctx *ctx, int proxy_fd,
			    unsigned int timeout_ms);
	int (*proxy_query)(struct kvdmabuf_ctx *ctx, int proxy_fd,
			   struct kvd_proxy_info *info);
	/* Optional: name the proxy dma-buf (what `kvdmabuf status` shows
	 * of it); sets no message, failure is not an error. */
	int (*proxy_label)(struct kvdmabuf_ctx *ctx, int proxy_fd,
			   const char *label);
	/* Optional (NULL: -EOPNOTSUPP): change ranges of the proxy in one
	 * step (the module's RANGES); fd -1: unbacked. */
	int (*proxy_ranges)(struct kvdmabuf_ctx *ctx, int proxy_fd,
			    const struct kvd_range *ranges, unsigned int n);
};

extern const struct kvd_ops kvd_default_ops;

/* Real backends, for test ops that wrap them. */
int kvd_verbs_nics_open(struct kvdmabuf_ctx *ctx,
			const struct kvdmabuf_options *opts);
void kvd_verbs_nics_close(struct kvdmabuf_ctx *ctx);
int kvd_verbs_nic_add(struct kvdmabuf_ctx *ctx, struct ibv_pd *pd);
void kvd_verbs_nic_remove(struct kvdmabuf_ctx *ctx, unsigned int i);
int kvd_verbs_reg_dmabuf(struct kvdmabuf_ctx *ctx, unsigned int nic, int fd,
			 uint64_t offset, size_t len, uint64_t iova,
			 struct kvd_mr *mr);
int kvd_verbs_reg_addr(struct kvdmabuf_ctx *ctx, unsigned int nic,
		       void *addr, size_t len, unsigned int flags,
		       struct kvd_mr *mr);
int kvd_verbs_dereg(struct kvdmabuf_ctx *ctx, unsigned int nic,
		    struct kvd_mr *mr);
int kvd_verbs_prefetch(struct kvdmabuf_ctx *ctx, unsigned int nic,
		       struct kvd_mr *mr);
int kvd_export_dmabuf(struct kvdmabuf_ctx *ctx, struct kvdmabuf_region *r,
		      int *fd, uint64_t *offset);
int kvd_cuda_export(struct kvdmabuf_ctx *ctx, void *addr, size_t len,
		    int *fd);
/* cuda.c: how much of [addr, addr+len) one allocation holds from @addr. */
int kvd_cuda_piece(struct kvdmabuf_ctx *ctx, void *addr, size_t len,
		   size_t *piece);
void kvd_cuda_unload(struct kvdmabuf_ctx *ctx);
int kvd_cuda_survey(const char *path, unsigned int *ndev, uint64_t *dmabuf,
		    char *err, size_t errlen);
int kvd_drm_export(struct kvdmabuf_ctx *ctx, int drm_fd, uint32_t handle,
		   int *fd);
int kvd_proxy_dev_open(struct kvdmabuf_ctx *ctx, int *devfd);
int kvd_proxy_dev_check(struct kvdmabuf_ctx *ctx, int fd);
int kvd_proxy_dev_create(struct kvdmabuf_ctx *ctx, uint64_t size,
			 int *proxy_fd, uint64_t *id);
int kvd_proxy_dev_attach(struct kvdmabuf_ctx *ctx, int proxy_fd,
			 int backing_fd, uint64_t offset, unsigned int flags);
int kvd_proxy_dev_revoke(struct kvdmabuf_ctx *ctx, int proxy_fd,
			 unsigned int timeout_ms);
int kvd_proxy_dev_query(struct kvdmabuf_ctx *ctx, int proxy_fd,
			struct kvd_proxy_info *info);
int kvd_proxy_dev_ranges(struct kvdmabuf_ctx *ctx, int proxy_fd,
			 const struct kvd_range *ranges, unsigned int n);
int kvd_proxy_dev_label(struct kvdmabuf_ctx *ctx, int proxy_fd,
			const char *label);

/* ---- objects ---- */
struct kvd_cuda;
struct kvdmabuf_preload_proxy_ops;
struct kvdmabuf_preload_range;

struct kvdmabuf_region {
	struct kvd_inflight io;          /* first: the hot part */
	struct kvd_range_io rio;         /* elastic pools: per page */
	struct kvdmabuf_ctx *ctx;
	void *addr;
	size_t len;
	int mem;
	unsigned int flags;
	char *tag;
	int drm_fd;
	uint32_t drm_handle;
	uint64_t nic_set;                /* bit i: NIC i; 0: every NIC */

	int mode;
	bool asleep;
	int backing_fd;                  /* -1 when none */
	uint64_t backing_off;
	int proxy_fd;                    /* -1 when no proxy */
	uint64_t proxy_id;
	bool registered;                 /* mr[] valid on every NIC */
	struct kvd_mr mr[KVDMABUF_MAX_NICS]; /* handle NULL: not registered */
	struct kvd_mr last[KVDMABUF_MAX_NICS]; /* keys of the last registration */
	uint64_t key_gen;
	bool keys_changed;               /* callback pending */
	/* Keys as the engine knows them when a wake began: a wake that is
	 * rolled back restores them (its keys were never published). */
	uint64_t wake_key_gen;
	struct kvd_mr wake_last[KVDMABUF_MAX_NICS];
	/* A rollback failed and left the region in no known state: 0, or
	 * the negative errno. I/O stays stopped, sleep and wake skip it. */
	int broken;
	int mapping;                     /* enum kvdmabuf_mapping */
	int labelled;                    /* mapping the proxy's name says */
	bool preload_declared;           /* to libkvdmabuf-preload.so */
};

struct kvdmabuf_ctx {
	pthread_mutex_t lock;            /* recursive */
	/* A sleep or wake runs with the lock released (its drain, its
	 * callbacks): other threads' changes get -EBUSY, its own thread's
	 * (a callback re-entering) -EDEADLK. */
	bool busy;
	pthread_t busy_thread;
	pid_t pid;                       /* of the process that opened it */
	uint64_t serial;                 /* unique per open, for messages */

	const struct kvd_ops *ops;
	void *ops_arg;                   /* for test backends */
	/* what the preload calls on a declared region (interpose.c) */
	const struct kvdmabuf_preload_proxy_ops *engine_ops;
	int (*engine_ranges)(void *arg, void *addr,
			     const struct kvdmabuf_preload_range *ranges,
			     unsigned int n, int restore, char *err,
			     size_t err_len);

	struct kvd_config cfg;
	unsigned int drain_timeout_ms;
	unsigned int revoke_timeout_ms;
	unsigned int access;
	kvdmabuf_drain_fn drain;
	void *drain_arg;
	kvdmabuf_keys_fn key_change;
	void *key_change_arg;
	kvdmabuf_sleep_fn sleep_begin;
	void *sleep_begin_arg;
	char cuda_library[256];
	struct kvd_cuda *cuda;           /* loaded at first use */
	/* flags of the last successful CUDA export (cuda.c) */
	unsigned long long cuda_export_flags;

	struct kvd_nic nics[KVDMABUF_MAX_NICS];
	unsigned int nr_nics;
	int module_fd;                   /* -1: module not in use */

	struct kvdmabuf_region **regions;
	unsigned int nr_regions, cap_regions;
	uint64_t sleeps, wakes;
	uint64_t prefetches, prefetch_failures; /* prefetch_at_wake, per MR */
	uint64_t unbalanced_removed;     /* from removed regions */
};

/*
 * busy.c. With ctx->lock held: 0 when @what (sleep, wake, region changes)
 * may run now; -EDEADLK from a callback; -EBUSY while another thread's
 * sleep or wake runs without the lock.
 */
int kvd_may_change(struct kvdmabuf_ctx *ctx, const char *what);
/* 0, or -EPERM in a forked child (called before taking ctx->lock). */
int kvd_not_forked(struct kvdmabuf_ctx *ctx, const char *what);
/* Mark @ctx busy (lock held) for a sleep or wake of this thread. */
void kvd_busy_begin(struct kvdmabuf_ctx *ctx);
void kvd_busy_end(struct kvdmabuf_ctx *ctx);

/* context.c: open with a given backend table (tests); kvdmabuf_open()
 * uses the defaults. */
int kvd_open_ops(const struct kvdmabuf_options *opts,
		 const struct kvd_ops *ops, void *ops_arg,
		 struct kvdmabuf_ctx **ctxp, char *err, size_t errlen);

/*
 * msg.c. Messages are per thread (several threads share a context): the
 * buffer of the calling thread, now holding a message about @ctx.
 */
char *kvd_msg(const struct kvdmabuf_ctx *ctx);

/* Set the message; returns @rc (negative errno) for tail calls. */
int kvd_err(struct kvdmabuf_ctx *ctx, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Prefix the current message: "<prefix>: <old message>". Returns @rc. */
int kvd_err_prefix(struct kvdmabuf_ctx *ctx, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* region.c */
int kvd_region_reg_all(struct kvdmabuf_region *r);
int kvd_region_dereg_all(struct kvdmabuf_region *r);
/* Is NIC @i in @r's NIC set? */
static inline bool kvd_on_nic(const struct kvdmabuf_region *r, unsigned int i)
{
	return !r->nic_set || (r->nic_set >> i & 1);
}
/* Register @r on NIC @i alone (nic.c); dereg_one drops that MR. */
int kvd_region_reg_one(struct kvdmabuf_region *r, unsigned int i);
int kvd_region_dereg_one(struct kvdmabuf_region *r, unsigned int i);
/* Name the proxy after the region's CUDA mapping, when that changed. */
void kvd_region_label(struct kvdmabuf_region *r);
/* FOLLOW or REREGISTER for a proxied region, from the module's counts. */
int kvd_region_measure_mode(struct kvdmabuf_region *r);
/* Record that @r is broken (see struct kvdmabuf_region.broken). */
void kvd_region_break(struct kvdmabuf_region *r, int rc);
/* Stop @r's I/O before it is freed: -EBUSY (and as before) while a
 * transfer is in flight; unretire undoes a retire that was not followed. */
int kvd_region_retire(struct kvdmabuf_region *r);
void kvd_region_unretire(struct kvdmabuf_region *r);
void kvd_region_destroy(struct kvdmabuf_region *r);
/* Deregister every MR of @r before it is destroyed: 0, or the error of a
 * deregistration the NIC refused (@r then broken, kept; message set). */
int kvd_region_release(struct kvdmabuf_region *r, const char *what);
/* With the lock held once and @ctx busy: one key-change callback for the
 * regions of @t whose keys changed, called with the lock released. */
void kvd_fire_key_callbacks(struct kvdmabuf_ctx *ctx,
			    struct kvdmabuf_region *const *t, unsigned int n);

/* preload_link.c: under libkvdmabuf-preload.so (no-ops without it). The
 * library's own registrations are not the engine's: between own(1) and
 * own(0) they pass the interposer unrecorded. check: 0, or the preload's
 * refusal of a sleep of @r (message set). present: whether the preload
 * is loaded (registrations: engine needs it). */
bool kvd_preload_present(void);
void kvd_preload_own(int on);
int kvd_preload_check(struct kvdmabuf_region *r);
/* A region with a proxy declared to the preload (ctx locked), with the
 * context's engine_ops; 0 or the preload's refusal (message set).
 * undeclare: 0, or -EBUSY while the preload runs one of them (the caller
 * keeps the region as it was; message set). */
int kvd_preload_declare(struct kvdmabuf_region *r);
int kvd_preload_undeclare(struct kvdmabuf_region *r);

/* sleep.c, for interpose.c (ctx locked, @r may change): the engine itself
 * unmapped the memory of @r: @r sleeps as in kvdmabuf_sleep(), alone; wake:
 * its new memory becomes @r's backing, as in kvdmabuf_wake() (CUDA: the
 * library's own export of it, with its mapping and checks; else
 * @dmabuf_fd, the preload's export, not taken; @what names the call in
 * messages). 0 or negative errno, message set. */
int kvd_sleep_region(struct kvdmabuf_region *r);
int kvd_wake_region(struct kvdmabuf_region *r, int dmabuf_fd,
		    const char *what);

/* ranges.c (ctx locked): kvdmabuf_region_ranges() of @r. */
int kvd_region_ranges(struct kvdmabuf_region *r,
		      const struct kvdmabuf_region_range *ranges,
		      unsigned int n);

/* interpose.c: the operations the preload calls on a declared region
 * (struct kvdmabuf_preload_proxy_ops, .arg the region): the engine's own
 * unmap and map, through the two calls above; and, where the engine
 * unmaps or maps part of a region, its ranges (kvd_region_ranges()). */
extern const struct kvdmabuf_preload_proxy_ops kvd_engine_ops;
int kvd_engine_ranges(void *arg, void *addr,
		      const struct kvdmabuf_preload_range *ranges,
		      unsigned int n, int restore, char *err, size_t err_len);

/* proc_start.c: field 22 of /proc/PID/stat (@pid 0: this process), 0 if
 * there is no such process. Also built into the preload, used by the CLI. */
unsigned long long kvd_proc_start_time(int pid);

#endif /* KVDMABUF_INTERNAL_H */
