/* SPDX-License-Identifier: MIT */
/*
 * kvdmabuf.h - carry RDMA registrations of KV-cache regions through an
 * engine's sleep (memory released) and wake (new memory at the same
 * addresses).
 *
 * Conventions:
 *  - every int-returning call returns >= 0 on success or a negative errno;
 *    nothing depends on the global errno;
 *  - a human-readable message for the last failure of a call on a context
 *    is available, per thread, from kvdmabuf_last_error();
 *  - a context and its regions may be used from several threads: sleep,
 *    wake, region add/remove, query and the getters serialise on a
 *    per-context lock; kvdmabuf_io_begin()/kvdmabuf_io_end() are lock-free
 *    and callable from any thread at any time while the region exists;
 *  - sleep drains and every callback runs without that lock, so a transfer
 *    path may read keys and state between io_begin and io_end and a
 *    callback may call the getters; sleep, wake, close and region changes
 *    made meanwhile fail with -EBUSY from other threads and -EDEADLK from
 *    the callback itself;
 *  - at wake, the key-change callback runs before I/O resumes;
 *  - fork: a child must not use a context it inherited: every call that
 *    changes something returns -EPERM there (its MRs, PDs and proxies are
 *    the parent's, and are never released by the child).
 *
 * Typical use (engine side):
 *
 *   kvdmabuf_open(&opts, &ctx, err, sizeof(err));
 *   kvdmabuf_region_add(ctx, &desc, &kv);   // once per KV region
 *   kvdmabuf_region_keys(kv, 0, &lkey, &rkey, &gen); // publish to peers
 *   ...
 *   if (kvdmabuf_io_begin(kv) == 0) { post transfer ...; on completion
 *                                      kvdmabuf_io_end(kv); }
 *   ...
 *   kvdmabuf_sleep(ctx, "kv_cache");  // before cuMemUnmap/cuMemRelease
 *   kvdmabuf_wake(ctx, "kv_cache");   // after cuMemCreate/cuMemMap
 */
#ifndef KVDMABUF_H
#define KVDMABUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this header; kvdmabuf_version() gives the library's. */
#define KVDMABUF_VERSION_MAJOR 0
#define KVDMABUF_VERSION_MINOR 6
#define KVDMABUF_VERSION_PATCH 0
#define KVDMABUF_VERSION_CODE(major, minor, patch) \
	(((major) << 16) | ((minor) << 8) | (patch))
#define KVDMABUF_VERSION \
	KVDMABUF_VERSION_CODE(KVDMABUF_VERSION_MAJOR, KVDMABUF_VERSION_MINOR, \
			      KVDMABUF_VERSION_PATCH)

/**
 * kvdmabuf_version() - KVDMABUF_VERSION of the library loaded at run time
 * (compare with the header's to detect a mismatch).
 */
unsigned int kvdmabuf_version(void);

struct ibv_pd;

/** Opaque library context: configuration, NICs, regions. */
struct kvdmabuf_ctx;
/** Opaque region: one address range registered on every NIC of a context. */
struct kvdmabuf_region;

/** Environment variable naming the YAML configuration file. */
#define KVDMABUF_CONFIG_ENV "KVDMABUF_CONFIG"
/**
 * Most NICs (protection domains) one context handles: the width of a
 * region's NIC set (struct kvdmabuf_region_desc.nics). The largest GPU
 * nodes have 8 GPUs with one or two NICs each, plus storage NICs.
 */
#define KVDMABUF_MAX_NICS 64
/** Default drain bound of kvdmabuf_sleep(), seconds. */
#define KVDMABUF_DRAIN_TIMEOUT_S_DEFAULT 480

/** Use of the kvdmabuf helper module (/dev/kvdmabuf). */
enum kvdmabuf_module_use {
	KVDMABUF_MODULE_DEFAULT = 0, /**< as configured (config default: auto) */
	KVDMABUF_MODULE_AUTO = 1,    /**< use it when loaded */
	KVDMABUF_MODULE_REQUIRE = 2, /**< kvdmabuf_open() fails without it */
	KVDMABUF_MODULE_OFF = 3,     /**< never use it */
};

/** Memory kind of a region. */
enum kvdmabuf_mem {
	KVDMABUF_MEM_HOST = 1, /**< host memory, by address */
	/** CUDA device memory, by device address (cuMemCreate + cuMemMap at a
	 *  reserved VA, or cudaMalloc). Region add and wake export it with
	 *  the driver API from any thread: the library pushes the primary
	 *  context of the memory's device (retained until kvdmabuf_close())
	 *  and pops it, so the caller needs no current context. The range
	 *  must be mapped, on one device and in one VA reservation; it may
	 *  span several allocations mapped back to back. Memory the driver
	 *  reports as not GPUDirect RDMA capable is -EOPNOTSUPP (create it
	 *  with allocFlags.gpuDirectRDMACapable = 1).
	 *  Order of calls: kvdmabuf_sleep() before cuMemUnmap/cuMemRelease
	 *  (the library drops its dma-buf, which otherwise keeps the memory
	 *  allocated), and kvdmabuf_wake() after cuMemMap of the new memory
	 *  at the same addresses. A wake while any part of the range is
	 *  unmapped fails with -EFAULT, naming where the mapping ends, and
	 *  the region stays asleep. */
	KVDMABUF_MEM_CUDA = 2,
	KVDMABUF_MEM_DRM = 3,  /**< DRM buffer: DRM device fd + GEM handle */
};

/** How a region is carried through sleep and wake (chosen, then reported). */
enum kvdmabuf_mode {
	/** Proxy dma-buf, every NIC follows moves: keys never change. */
	KVDMABUF_MODE_FOLLOW = 1,
	/** Deregistered at sleep, registered again at wake: keys change. */
	KVDMABUF_MODE_REREGISTER = 2,
	/** Host memory the engine keeps: registered, untouched by sleep. */
	KVDMABUF_MODE_HOST = 3,
	/** Protocol tcp: address recorded, nothing registered or pinned. */
	KVDMABUF_MODE_NOREG = 4,
	/** Host memory the engine releases at sleep, on NICs with on-demand
	 *  paging (IBV_ACCESS_ON_DEMAND): the MR follows what the engine
	 *  maps at its addresses; no proxy, no re-registration, keys never
	 *  change, nothing pinned. Since 0.3.0. */
	KVDMABUF_MODE_ODP = 5,
};

/**
 * Engine drain callback, called repeatedly while kvdmabuf_sleep() drains
 * (about every millisecond, without the context lock). Return 1 only when
 * nothing touches the regions any more: the engine's transfer queues hold
 * no queued or running task, *and* the peers that hold these regions'
 * rkeys (prefill/decode disaggregation: remote reads and writes that
 * kvdmabuf_io_begin() never sees) have confirmed that they stopped, for
 * instance after the sleep-start callback told them. Return 0 while not
 * yet, or a negative errno to abort the sleep (returned by
 * kvdmabuf_sleep(); everything stays awake).
 */
typedef int (*kvdmabuf_drain_fn)(void *arg);

/**
 * Sleep-start callback: @regions (@n of them) stop now. New local I/O is
 * already refused; their keys stop being valid when this sleep succeeds.
 * Tell the peers that use their rkeys to stop and to forget them, then
 * report their quiet through the drain callback. Called once per sleep
 * that has something to do, before the drain, from the thread that runs
 * kvdmabuf_sleep(), without the context lock (it may call the getters;
 * sleep, wake, add, remove and close give -EDEADLK). Return 0, or a
 * negative errno to abort the sleep (everything stays awake).
 */
typedef int (*kvdmabuf_sleep_fn)(struct kvdmabuf_region *const *regions,
				 unsigned int n, void *arg);

/**
 * Key-change callback: the keys of @regions (@n of them) changed; the
 * engine reads them (kvdmabuf_region_keys(), which also gives the new key
 * generation) and republishes them to its peers. One call per sleep,
 * wake, kvdmabuf_nic_add() or kvdmabuf_nic_remove() that changed keys,
 * from the thread that runs it, without the context lock. At sleep and
 * wake, I/O on those regions is still refused; at a NIC's add or removal
 * the regions stay awake with I/O open (the keys on the NICs that stay
 * are the same MRs; only their indexes above a removed NIC move down). It
 * may call the getters; sleep, wake, add, remove and close give -EDEADLK
 * (-EBUSY in other threads until it returns). @regions is valid during
 * the call.
 */
typedef void (*kvdmabuf_keys_fn)(struct kvdmabuf_region *const *regions,
				 unsigned int n, void *arg);

/** Options of kvdmabuf_open(). Zero-initialise, then set what is needed. */
struct kvdmabuf_options {
	/** YAML config file; NULL: $KVDMABUF_CONFIG; neither: the built-in
	 *  defaults (protocol rdma, module auto, drain 480 s, every verbs
	 *  device): a file is only needed to change them. */
	const char *config_path;
	/**
	 * One protection domain per NIC (the transfer engine's own). With
	 * none, the library opens the devices listed under `nics` in the
	 * config (or every verbs device when none is listed) and allocates a
	 * PD on each; see kvdmabuf_pd().
	 */
	struct ibv_pd *const *pds;
	unsigned int nr_pds;
	/** enum kvdmabuf_module_use; 0: as configured. */
	int module;
	/** Optional engine drain callback and its argument. */
	kvdmabuf_drain_fn drain;
	void *drain_arg;
	/** Optional key-change callback and its argument. */
	kvdmabuf_keys_fn key_change;
	void *key_change_arg;
	/** Optional sleep-start callback and its argument. */
	kvdmabuf_sleep_fn sleep_begin;
	void *sleep_begin_arg;
	/** Path of the CUDA driver library; NULL: config, else libcuda.so.1. */
	const char *cuda_library;
	/** Drain bound in milliseconds; 0: config drain_timeout_s. */
	unsigned int drain_timeout_ms;
	/** ibv_access_flags of every MR; 0: local write, remote read/write. */
	unsigned int access;
	/** The configuration as YAML text instead of a file (config_path
	 *  must then be NULL; at most 1 MiB); KVDMABUF_<KEY> variables still
	 *  apply over it. NULL: config_path's rules. */
	const char *config_yaml;
	/** Must be zero. */
	uint64_t reserved[7];
};

/**
 * kvdmabuf_open() - open a context.
 * @opts: options (see struct kvdmabuf_options)
 * @ctxp: the new context on success
 * @err, @errlen: optional buffer for the reason of a failure
 *
 * Reads and checks the config, applies the gate (kvdmabuf_gate()), checks
 * the machine against it (protocol rdma needs a usable verbs device) and
 * opens the helper module as asked.
 *
 * Return: 0; -EINVAL bad options or config; -ENOENT the config file named
 * (option or $KVDMABUF_CONFIG) does not exist;
 * -EPROTONOSUPPORT sleep refused by the gate (reason in @err); -ENODEV no
 * verbs device for protocol rdma, or module required and absent;
 * -ELIBACC a configuration to read (file, config_yaml, $KVDMABUF_<KEY>)
 * and libyaml not installed; -ENOMEM; other negative errno from verbs or
 * the module.
 */
int kvdmabuf_open(const struct kvdmabuf_options *opts,
		  struct kvdmabuf_ctx **ctxp, char *err, size_t errlen);

/**
 * kvdmabuf_close() - remove every region (deregister, close every fd) and
 * free the context. While a transfer is in flight on any region nothing
 * is removed. No other thread may use the context or its regions once it
 * returns 0. When a NIC refuses to deregister a region's MR, the other
 * regions are removed, that one stays, broken (struct
 * kvdmabuf_region_info), and the context stays open: call it again.
 *
 * Return: 0; -EBUSY a transfer is in flight, or a sleep is draining;
 * -EDEADLK from a callback; -EINVAL @ctx is NULL; the error of a refused
 * deregistration (context still open, message names the region).
 */
int kvdmabuf_close(struct kvdmabuf_ctx *ctx);

/**
 * kvdmabuf_last_error() - message of the calling thread's last failed call
 * on @ctx ("" if none). Per thread: a failure in another thread does not
 * change it. The string stays valid until this thread's next failing call.
 * A message about a closed context is never shown for a context opened
 * later, even at the same address.
 */
const char *kvdmabuf_last_error(const struct kvdmabuf_ctx *ctx);

/**
 * kvdmabuf_gate() - is sleep supported with this configuration?
 * @config_path: config file, NULL: $KVDMABUF_CONFIG, else the built-in
 * defaults (protocol rdma)
 * @reason, @reason_len: optional buffer for the reason (either answer)
 *
 * Accepts protocols rdma and tcp; refuses nvlink and any other protocol,
 * and refuses whenever MC_FORCE_MNNVL, MC_INTRANODE_NVLINK,
 * MC_INTRA_NVLINK or MC_ENABLE_MNNVL is set to any value (also "0"), or
 * MOONCAKE_PROTOCOL names nvlink (nvlink, nvlink_intra), or
 * SGLANG_MOONCAKE_CUSTOM_MEM_POOL names an NVLink pool or is true or 1
 * (its older boolean form), or transport ucx/nixl runs with cuda_ipc
 * (UCX_TLS), since a transfer engine then hands peers handles to GPU
 * memory that re-registering cannot reach. It knows these variables only:
 * a transport configured some other way is not seen.
 * Loads no CUDA library and opens no device.
 *
 * Return: 1 supported, 0 refused, negative errno when the config file
 * named is missing (-ENOENT, naming the variable and path) or invalid
 * (-EINVAL).
 */
int kvdmabuf_gate(const char *config_path, char *reason, size_t reason_len);

/** Region flag: the engine releases this host memory at sleep and maps new
 *  memory at wake, so it goes through deregister/register like device
 *  memory (mode REREGISTER instead of HOST). */
#define KVDMABUF_REGION_RELEASED_AT_SLEEP (1u << 0)
/** Region flag: an elastic pool (device memory) that starts with nothing
 *  mapped: nothing is exported at add, the proxy maps every page to the
 *  module's zeroed scratch and the NICs register it once; pages come and go
 *  with kvdmabuf_region_ranges() (or, under libkvdmabuf-preload.so, the
 *  engine's own cuMemSetAccess and cuMemUnmap). Needs the module with
 *  ranges (API 3.2) and NICs that follow moves (mode FOLLOW): -EOPNOTSUPP
 *  otherwise, naming which. Since 0.4.0. */
#define KVDMABUF_REGION_EMPTY (1u << 1)

/** Description of a region for kvdmabuf_region_add(). Zero-initialise. */
struct kvdmabuf_region_desc {
	void *addr;           /**< start, page aligned */
	size_t len;           /**< length, page aligned, > 0 */
	int mem;              /**< enum kvdmabuf_mem */
	unsigned int flags;   /**< KVDMABUF_REGION_* */
	const char *tag;      /**< e.g. "kv_cache", "weights"; copied; NULL: "" */
	int drm_fd;           /**< KVDMABUF_MEM_DRM: DRM device fd (not owned) */
	uint32_t drm_handle;  /**< KVDMABUF_MEM_DRM: GEM handle */
	/** NICs to register on: bit i for NIC i; 0: every NIC of the
	 *  context, including NICs added later (kvdmabuf_nic_add()). */
	uint64_t nics;
	uint64_t reserved[3]; /**< must be zero */
};

/**
 * kvdmabuf_region_add() - export and register a region on every NIC.
 *
 * Chooses the mode: host memory the engine keeps -> HOST (registered
 * for protocol rdma, untouched by sleep); any other region with protocol
 * tcp -> NOREG; host memory with KVDMABUF_REGION_RELEASED_AT_SLEEP ->
 * ODP (ibv_reg_mr with IBV_ACCESS_ON_DEMAND) when every NIC of the region
 * has on-demand paging for RC RDMA READ and WRITE and takes such an MR,
 * else REREGISTER (ibv_reg_mr); device memory ->
 * exported as a dma-buf, placed behind a proxy when the module is in use
 * and registered with ibv_reg_dmabuf_mr(); FOLLOW only when the module
 * reports that no importer of the proxy pins it, else REREGISTER.
 * A NIC without dma-buf MRs (EOPNOTSUPP) gets ibv_reg_mr() for
 * CPU-visible memory; device memory then fails with -EOPNOTSUPP.
 *
 * Each region is one MR per NIC: it must fit in the NIC's max_mr_size.
 *
 * Under libkvdmabuf-preload.so, a region with a proxy is declared to it
 * with the library's revoke/replace, so that the engine's own cuMemUnmap
 * and cuMemMap + cuMemSetAccess of it sleep and wake it (lib/README.md);
 * an overlap with a range declared otherwise fails it (-EINVAL, named).
 *
 * Return: 0; -EINVAL bad description (alignment, overlap, flags);
 * -EFBIG longer than a NIC's max_mr_size (the message names the NIC and
 * its limit: add it as several regions);
 * -EOPNOTSUPP no way to register this memory; -ELIBACC CUDA driver
 * library (CUDA) or libdrm (DRM) cannot be loaded; -ENODEV device without dma-buf support;
 * -EDEADLK from a callback; other negative errno.
 */
int kvdmabuf_region_add(struct kvdmabuf_ctx *ctx,
			const struct kvdmabuf_region_desc *desc,
			struct kvdmabuf_region **regionp);

/**
 * kvdmabuf_region_remove() - deregister, drop every fd and free @region.
 * New I/O is refused first; no thread may use @region once it returns 0.
 * Return: 0; -EBUSY a transfer is in flight (the region is left as it
 * was), or a sleep is draining, or libkvdmabuf-preload.so is running the
 * region's revoke/replace right now (try again); -EDEADLK from a
 * callback; the error of a
 * deregistration the NIC refused: @region is kept, broken (I/O refused,
 * no keys, the refused MR still registered), and a later remove tries
 * again.
 */
int kvdmabuf_region_remove(struct kvdmabuf_region *region);

/**
 * kvdmabuf_region_set_drm_handle() - new GEM handle of a DRM region, for
 * the next kvdmabuf_wake() (a DRM engine's "new memory at the same
 * address"). Only while the region is asleep. Return: 0; -EBUSY awake;
 * -EINVAL not a DRM region.
 */
int kvdmabuf_region_set_drm_handle(struct kvdmabuf_region *region,
				   int drm_fd, uint32_t handle);

/**
 * kvdmabuf_region_find() - the region containing [addr, addr+len), or NULL.
 */
struct kvdmabuf_region *kvdmabuf_region_find(struct kvdmabuf_ctx *ctx,
					     const void *addr, size_t len);

/**
 * kvdmabuf_region_keys() - keys of @region on NIC @nic.
 * @key_gen: optional; the key generation, which changes exactly when keys
 * change (starts at 1).
 * Return: 0; -ENOENT not registered (NOREG, or asleep in REREGISTER, or
 * broken, or @nic not in the region's NIC set); -EINVAL bad NIC index.
 */
int kvdmabuf_region_keys(struct kvdmabuf_region *region, unsigned int nic,
			 uint32_t *lkey, uint32_t *rkey, uint64_t *key_gen);

/**
 * kvdmabuf_region_dmabuf() - the proxy dma-buf of @region, for engines that
 * register memory themselves (UCX/NIXL, libfabric FI_MR_DMABUF, NCCL net
 * plugins): register @fd at @offset for the region's length and the
 * registration follows sleep and wake like the library's own (FOLLOW).
 * Only on NICs that follow moves (move notification, like mlx5): a NIC
 * that pins the proxy (efa, bnxt_re; irdma's revocable pin on Linux 7.1+,
 * which a revoke would end for good) cannot follow a wake, and while such
 * a registration of the engine's own exists every kvdmabuf_sleep() of the
 * region fails with -EBUSY naming it. Register such NICs through the
 * library (kvdmabuf_nic_add()) instead. The library still runs
 * sleep and wake. The fd belongs to the library and stays valid until the
 * region is removed (dup() it to keep it longer).
 *
 * Return: 0; -ENOENT the region has no proxy (host memory, protocol tcp,
 * or the module not in use).
 */
int kvdmabuf_region_dmabuf(struct kvdmabuf_region *region, int *fd,
			   uint64_t *offset);

/** kvdmabuf_region_range.fd: the range gives its memory back. */
#define KVDMABUF_RANGE_RELEASE	(-1)
/** kvdmabuf_region_range.fd: a CUDA region's range is backed by what is
 *  mapped there now, exported by the library (cuMemGetHandleForAddressRange
 *  of the range, as at wake). */
#define KVDMABUF_RANGE_EXPORT	(-2)

/** One change of kvdmabuf_region_ranges(). Zero-initialise. */
struct kvdmabuf_region_range {
	size_t offset;        /**< in the region, page aligned */
	size_t len;           /**< page aligned, > 0, within the region */
	/** KVDMABUF_RANGE_RELEASE, KVDMABUF_RANGE_EXPORT, or a dma-buf fd of
	 *  the new memory (not taken: the caller may close it after) */
	int fd;
	uint64_t fd_offset;   /**< where the range starts in @fd */
	uint64_t reserved[2]; /**< must be zero */
};

/**
 * kvdmabuf_region_ranges() - give ranges of an awake region back and bring
 * new memory in, in one step, with the region's keys unchanged (an elastic
 * KV pool: pages mapped and unmapped while serving; docs/elastic-kv.md).
 *
 * The region's proxy maps each listed range from then on to its new
 * memory, or, released, to memory of the module's that holds nobody's
 * data (reads give zeros, a peer's write there is dropped); the rest of
 * the region keeps its memory. One move notification for the batch: a
 * NIC that follows moves maps again under the same keys. When the call
 * returns, no NIC maps a released range's old memory and neither the
 * module nor the library holds it: the engine may unmap and free it.
 * Transfers begun on the listed ranges with kvdmabuf_io_begin_range() are
 * waited for first (new ones there are refused meanwhile), at most the
 * context's drain timeout (-EAGAIN, nothing changed); transfers on the
 * rest go on throughout. Transfers the library is not told of (the
 * engine's own, kvdmabuf_io_begin() on the whole region) must have ended
 * (an engine gives a page back once no request uses it).
 * After it the region holds no export of its own: a later sleep and wake
 * make it one range again (the wake exports the whole region).
 *
 * Return: 0; -EINVAL bad range (alignment, bounds, overlap, reserved
 * fields, an fd below -2, EXPORT on a region that is not CUDA memory),
 * the message names it; -ENOENT the region has no proxy (host memory,
 * protocol tcp, the module not in use); -EOPNOTSUPP a NIC of the region
 * pins (REREGISTER mode: it cannot follow a range change) or the module
 * is older than API 3.2; -EBUSY the region is asleep, or an importer's
 * pin refused the change; -EIO the region is broken; the module's and
 * the CUDA driver's errors; -EAGAIN transfers on the ranges did not end
 * in time (try again). On failure nothing changed, except with -ETIMEDOUT
 * (changed, but an importer kept mapping what was replaced past the
 * bound).
 */
int kvdmabuf_region_ranges(struct kvdmabuf_region *region,
			   const struct kvdmabuf_region_range *ranges,
			   unsigned int n);

/** Mapping of a CUDA region's dma-buf (kvdmabuf_region_info.mapping). */
enum kvdmabuf_mapping {
	/** not CUDA memory, or not exported yet */
	KVDMABUF_MAPPING_NONE = 0,
	/** CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE: reachable over PCIe */
	KVDMABUF_MAPPING_PCIE = 1,
	/** flags 0: the driver's default mapping (config `default`, or
	 *  `auto` after the driver refused the PCIe flag) */
	KVDMABUF_MAPPING_DEFAULT = 2,
};

/** State of one region (kvdmabuf_region_info()). */
struct kvdmabuf_region_info {
	void *addr;
	size_t len;
	int mem;             /**< enum kvdmabuf_mem */
	int mode;            /**< enum kvdmabuf_mode */
	int asleep;          /**< 1 between a successful sleep and wake */
	int proxied;         /**< registered on a proxy dma-buf */
	const char *tag;     /**< valid while the region exists */
	uint64_t key_gen;
	uint64_t inflight;   /**< transfers between io_begin and io_end */
	uint64_t proxy_id;   /**< module's proxy id, 0 if none */
	/**
	 * 0, or the negative errno of a rollback that failed and left the
	 * region in no known state, or of a deregistration that remove or
	 * close could not make (named in that call's message): its I/O
	 * stays stopped, it has no keys, sleep and wake skip it. Remove it
	 * (again) and add it again.
	 */
	int broken;
	/**
	 * 1: the backing's exporter took the memory away from an awake
	 * region (GPU reset, device unplug, a driver's eviction): the module
	 * revoked the proxy and every transfer on it fails. Sleep and wake
	 * it (with memory that exists again) or remove it.
	 */
	int backing_lost;
	/**
	 * enum kvdmabuf_mapping: the flags of the region's last CUDA export
	 * (at add or wake), so that `auto`'s fallback to the default mapping
	 * is seen (on GH200/GB200 a PCIe NIC needs the PCIe mapping).
	 */
	int mapping;
	/**
	 * Zero. Later versions fill fields in here: a program built with
	 * this header gets the struct it was built with, whatever the
	 * library (from 0.5.0 on; before, the struct had no tail).
	 */
	uint64_t reserved[8];
};
int kvdmabuf_region_info(struct kvdmabuf_region *region,
			 struct kvdmabuf_region_info *info);

/** State of a context (kvdmabuf_query()). */
struct kvdmabuf_state {
	unsigned int nr_regions;
	unsigned int nr_asleep;
	unsigned int nr_broken;
	/* regions per mode (enum kvdmabuf_mode) */
	unsigned int nr_follow;   /**< FOLLOW and ODP: keys never change */
	unsigned int nr_reregister;
	unsigned int nr_host;
	unsigned int nr_noreg;
	unsigned int nr_nics;
	int module;               /**< 1: helper module in use */
	int protocol_rdma;        /**< 1: rdma, 0: tcp */
	uint64_t inflight;        /**< sum over regions */
	uint64_t sleeps, wakes;   /**< successful calls that did work */
	uint64_t unbalanced_io_end; /**< io_end without io_begin (ignored) */
	/** prefetch_at_wake (0.6): MRs the NICs were asked to map at a wake,
	 *  and of those the ones a NIC could not (mapped at the first
	 *  transfer instead: EOPNOTSUPP where the NIC has no prefetch). */
	uint64_t prefetches, prefetch_failures;
	/** Zero: room for later versions, as in kvdmabuf_region_info. */
	uint64_t reserved[6];
};
int kvdmabuf_query(struct kvdmabuf_ctx *ctx, struct kvdmabuf_state *state);

/** kvdmabuf_pd() - protection domain of NIC @nic, or NULL (takes the
 *  context lock: NICs join and leave under it). */
struct ibv_pd *kvdmabuf_pd(struct kvdmabuf_ctx *ctx, unsigned int nic);

/**
 * kvdmabuf_nic_add() - a NIC (the caller's protection domain, which it
 * keeps owning) joins the context after open: every region whose NIC set
 * is "every NIC" is registered on it, all or nothing. Their keys change:
 * the new NIC's are added, key generation + 1, and a key-change callback
 * lists them before this returns (I/O stays open: the keys on the other
 * NICs are unchanged). A FOLLOW region whose proxy the new NIC pins
 * becomes REREGISTER. Only while no region is asleep.
 * @index: the new NIC's index (the highest).
 *
 * Return: 0; -EBUSY a region is asleep, or another thread's sleep or wake
 * runs; -E2BIG KVDMABUF_MAX_NICS reached; -EINVAL @pd NULL or already a
 * NIC of the context; -EPROTONOSUPPORT protocol is not rdma; -EDEADLK from
 * a callback; -EFBIG a region is longer than the new NIC's max_mr_size;
 * error of a registration (nothing changed).
 */
int kvdmabuf_nic_add(struct kvdmabuf_ctx *ctx, struct ibv_pd *pd,
		     unsigned int *index);

/**
 * kvdmabuf_nic_remove() - deregister every region from NIC @nic and drop
 * it (and the device, if the library opened it). NICs above @nic move down
 * by one index, as do the bits of every region's NIC set. The keys of a
 * region registered on @nic or above change (per index): key generation
 * + 1 and a key-change callback before this returns, with I/O open (stop
 * using NIC @nic first). Only while no region is asleep. A
 * deregistration that fails leaves that region broken.
 *
 * Return: 0; -EINVAL bad index; -EBUSY as for kvdmabuf_nic_add();
 * -EDEADLK from a callback; the first deregistration error (the NIC is
 * removed all the same).
 */
int kvdmabuf_nic_remove(struct kvdmabuf_ctx *ctx, unsigned int nic);

/** kvdmabuf_mode_name() - "follow", "reregister", "host", "noreg", "odp",
 *  "?". */
const char *kvdmabuf_mode_name(int mode);

/**
 * kvdmabuf_io_begin() - a transfer touching @region starts.
 * Lock-free, any thread.
 * Return: 0, then call kvdmabuf_io_end() exactly once when the transfer
 * has completed; -ESHUTDOWN the region is going to sleep or asleep (do not
 * touch it).
 */
int kvdmabuf_io_begin(struct kvdmabuf_region *region);
/** kvdmabuf_io_end() - the transfer begun by kvdmabuf_io_begin() ended. */
void kvdmabuf_io_end(struct kvdmabuf_region *region);

/**
 * kvdmabuf_io_begin_many() - kvdmabuf_io_begin() on @n regions, all or
 * nothing: on -ESHUTDOWN none of them is counted.
 *
 * Wrap a transfer *batch* (the slices of one request, or one engine step's
 * posts to a peer), not every slice: one begin/end pair per region per
 * batch costs two atomic operations, and a sleep waits for the batch as a
 * whole. End it with kvdmabuf_io_end_many() on the same regions when the
 * batch's last completion is polled.
 */
int kvdmabuf_io_begin_many(struct kvdmabuf_region *const *regions,
			   unsigned int n);
/** kvdmabuf_io_end_many() - kvdmabuf_io_end() on @n regions. */
void kvdmabuf_io_end_many(struct kvdmabuf_region *const *regions,
			  unsigned int n);

/**
 * kvdmabuf_io_begin_range() - a transfer touching bytes [@offset,
 * @offset + @len) of @region starts (an elastic pool's pages). As
 * kvdmabuf_io_begin() (a sleep waits for it too), and besides:
 * kvdmabuf_region_ranges() waits for it before it changes any of those
 * bytes, and refuses new ones there meanwhile. Counted per 2 MiB of the
 * region; lock-free, any thread. Transfers begun with kvdmabuf_io_begin()
 * are not waited for by kvdmabuf_region_ranges().
 * Return: 0, then call kvdmabuf_io_end_range() with the same arguments
 * exactly once when it completed; -ESHUTDOWN the region is going to sleep
 * or asleep, or those bytes are changing now (try again after);
 * -EINVAL outside the region. Since 0.4.0.
 */
int kvdmabuf_io_begin_range(struct kvdmabuf_region *region, size_t offset,
			    size_t len);
/** kvdmabuf_io_end_range() - the transfer begun by
 *  kvdmabuf_io_begin_range() with the same arguments ended. */
void kvdmabuf_io_end_range(struct kvdmabuf_region *region, size_t offset,
			   size_t len);

/**
 * kvdmabuf_sleep() - release the registrations of the regions tagged @tag
 * (NULL: every region) before the engine unmaps their memory.
 *
 * Stops new I/O on those regions, drains (no transfer in flight and the
 * drain callback says idle) within the drain bound, then per region:
 * FOLLOW -> revoke the proxy; REREGISTER -> deregister (and revoke);
 * finally closes the old backing fds so nothing holds the old memory.
 * HOST regions are untouched; NOREG regions only stop I/O.
 * All or nothing: on failure every region is awake and registered again,
 * with the old memory (new keys, if a rollback had to register again, reach
 * the key-change callback before I/O resumes), or broken (see struct
 * kvdmabuf_region_info) when a rollback failed too. Regions already asleep
 * are skipped: sleeping twice succeeds and does nothing.
 *
 * Return: 0; -ETIMEDOUT drain bound reached (message says how many
 * transfers were in flight and for how long); error of the drain callback;
 * -EBUSY an importer pins a proxy (one that is not the library's own, such
 * as the engine's registration of kvdmabuf_region_dmabuf() on a NIC that
 * pins, is named as such, before anything is revoked); -EDEADLK from a
 * callback; other negative errno of a failed step.
 */
int kvdmabuf_sleep(struct kvdmabuf_ctx *ctx, const char *tag);

/**
 * kvdmabuf_wake() - after the engine mapped new memory at the same
 * addresses: export it and attach it behind the proxies (FOLLOW: keys
 * unchanged) or register again (REREGISTER: new keys, key generation + 1,
 * key-change callback), then allow I/O again.
 * All or nothing: on failure every region of the call is asleep again (no
 * fd or MR of the new memory kept; keys and key generation as before the
 * call, no key-change callback) so a retry starts clean, or broken when a
 * rollback failed too. Regions already awake are skipped.
 *
 * Return: 0; negative errno of the failed step.
 */
int kvdmabuf_wake(struct kvdmabuf_ctx *ctx, const char *tag);

#ifdef __cplusplus
}
#endif

#endif /* KVDMABUF_H */
