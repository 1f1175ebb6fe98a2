/* SPDX-License-Identifier: MIT */
/*
 * kvdmabuf_preload.h - the in-process API of libkvdmabuf-preload.so, the
 * interposer that an unmodified transfer engine runs under
 * (LD_PRELOAD=libkvdmabuf-preload.so).
 *
 * The preload interposes the engine's memory registrations (ibv_reg_mr in
 * every form, ibv_reg_dmabuf_mr, ibv_dereg_mr, ibv_rereg_mr, at every
 * symbol version libibverbs exports) and records each one. Registrations that lie in a
 * declared KV region are made on the region's proxy dma-buf, in the
 * engine's own PD, when the region has one and the NIC takes dma-buf MRs;
 * otherwise the engine's registration is made as asked and marked as one
 * that cannot follow a wake: every sleep of memory it covers is refused,
 * naming it, and nothing is released. Everything else passes through.
 *
 * These functions are found at run time, never linked: an engine's sleep
 * hook (the Python binding, kvdmabuf.preload_*) or libkvdmabuf itself
 * looks them up with dlsym(RTLD_DEFAULT, ...) and does without when the
 * preload is not loaded. Every int-returning call returns >= 0 or a
 * negative errno; messages go to the caller's buffer.
 */
#ifndef KVDMABUF_PRELOAD_H
#define KVDMABUF_PRELOAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Environment variable declaring KV regions before the engine starts:
 * comma-separated ADDR+LEN[:TAG] entries, numbers in C syntax (0x... hex),
 * e.g. "0x7e0000000000+0x40000000:kv_cache". A malformed value declares
 * nothing and makes every sleep check fail with the parse error (never a
 * silent pass-through of memory meant to be KV). The same entries are read
 * from kv_regions: of the library's configuration ($KVDMABUF_CONFIG) at
 * load, with the same rule for a configuration that does not load. Such
 * regions have no proxy until the same range is declared with one.
 */
#define KVDMABUF_PRELOAD_REGIONS_ENV "KVDMABUF_KV_REGIONS"

/**
 * State file: each process under the preload keeps a text file named by
 * its pid in a folder, rewritten (tmp file + rename) at every change of
 * its regions or of its registrations in them (never for one outside
 * every region: a pass-through call writes nothing), removed at exit; it is
 * what `kvdmabuf status` lists. The first is written once the process has
 * registered in a KV region, declared one with a proxy or slept one: a
 * process that only inherited KVDMABUF_KV_REGIONS writes none. The folder: $KVDMABUF_PRELOAD_DIR ("off":
 * no file), else KVDMABUF_PRELOAD_RUN_DIR when it exists or can be made
 * (mode 1777, as /tmp: each user writes its own pids there; needs root
 * the first time), else $XDG_RUNTIME_DIR/kvdmabuf-preload. Lines:
 *   kvdmabuf-preload 2
 *   pid PID STARTTIME            (field 22 of /proc/PID/stat)
 *   regions N asleep N in N proxy N cannot N env_error E
 *   region ADDR+LEN TAG proxy|no-proxy awake|asleep      (one per region)
 *   lkey 0xK ADDR+LEN NIC on-proxy|cannot-follow [WHY]   (MRs in regions)
 * A file whose pid is gone or has another start time is a dead process's
 * (killed, or ended by _exit without the destructor): the next process of
 * that user that writes its own file removes such files once.
 */
#define KVDMABUF_PRELOAD_DIR_ENV "KVDMABUF_PRELOAD_DIR"
#define KVDMABUF_PRELOAD_RUN_DIR "/run/kvdmabuf/preload"

/**
 * kvdmabuf_preload_declare() - [@addr, @addr+@len) is KV memory, tagged
 * @tag (NULL: "kv_cache"). @proxy_fd >= 0: the region's proxy dma-buf
 * (kvdmabuf_region_dmabuf(), owned by the caller, which keeps it open
 * while declared) at @proxy_offset; registrations in the region are made
 * on it from now on. -1: no proxy (host memory). Registrations already
 * made in the range are kept as they are and cannot follow. libkvdmabuf
 * declares each of its regions that has a proxy itself (with its proxy
 * operations); declaring the same range with the same proxy and offset
 * again returns 0 and changes only the tag, and so does declaring with a
 * proxy exactly the range of a region that has none (configuration,
 * environment), which then takes that proxy.
 * Return: 0; -EINVAL empty or wrapping range, or overlap with a declared
 * region; -ENOMEM.
 */
int kvdmabuf_preload_declare(void *addr, size_t len, const char *tag,
			     int proxy_fd, uint64_t proxy_offset);

/** kvdmabuf_preload_undeclare() - forget the region starting at @addr.
 *  Return: 0; -ENOENT none starts there; -EBUSY its proxy operations are
 *  running (a cuMemUnmap or cuMemSetAccess of it): try again;
 *  -ENOTEMPTY an engine MR is on the region's proxy: the engine must
 *  deregister it first (forgotten, the proxy would serve it whatever the
 *  memory becomes). */
int kvdmabuf_preload_undeclare(void *addr);

/**
 * kvdmabuf_preload_check() - may memory [@addr, @addr+@len) be released
 * and replaced under the engine's registrations? 0: every registration of
 * the engine that covers it is on a proxy (or there is none); -EBUSY:
 * one cannot follow, named in @reason ("engine MR 0x... on NIC X pins:
 * cannot sleep transparently"); -EINVAL: the declaration from the
 * environment was malformed (the parse error in @reason).
 */
int kvdmabuf_preload_check(const void *addr, size_t len, char *reason,
			   size_t reason_len);

/**
 * kvdmabuf_preload_sleep() - the engine is about to release the declared
 * regions tagged @tag (NULL: all): refused (-EBUSY, reason in @err,
 * nothing changed) if a registration of the engine in any of them cannot
 * follow; else they are marked asleep until kvdmabuf_preload_wake().
 * The drain is the engine's (kvdmabuf_preload.h cannot see ibv_post_send
 * or peers' one-sided reads). Return: 0 or negative errno.
 */
int kvdmabuf_preload_sleep(const char *tag, char *err, size_t err_len);
int kvdmabuf_preload_wake(const char *tag, char *err, size_t err_len);

/**
 * kvdmabuf_preload_own() - @on != 0: the calling thread's registrations
 * are not the engine's (libkvdmabuf's own MRs, which it carries through
 * sleep itself) and pass through unrecorded until the matching call with
 * @on == 0. Nests.
 */
void kvdmabuf_preload_own(int on);

/** State of the interposer (kvdmabuf_preload_query()). */
struct kvdmabuf_preload_state {
	uint32_t nr_regions;       /**< declared */
	uint32_t nr_asleep;
	uint32_t nr_mrs;           /**< live registrations of the engine */
	uint32_t nr_in_regions;    /**< of those, in or across a region */
	uint32_t nr_on_proxy;      /**< of those, made on a proxy */
	uint32_t nr_cannot_follow; /**< of those, refusing sleep */
	int32_t env_error;         /**< 0 or the environment's parse error */
	uint32_t flags;            /**< KVDMABUF_PRELOAD_NO_DLSYM ... */
};
/* The CUDA runtime's own lookups of cuMemUnmap/cuMemMap/cuMemSetAccess
 * bypass the CUDA interposer: dlsym/dlvsym are not interposed (not
 * x86-64), or another dlsym interposer ahead of the preload in LD_PRELOAD
 * answers them with the driver's functions. */
#define KVDMABUF_PRELOAD_NO_DLSYM (1u << 0)
/* Another object in the process defines dlsym (a GPU-sharing layer such
 * as HAMi-core): ahead of the preload, it must hand the lookups on to the
 * next dlsym (else NO_DLSYM too); behind it, it is never called. Said on
 * stderr when a region gets proxy operations. */
#define KVDMABUF_PRELOAD_OTHER_DLSYM (1u << 1)
int kvdmabuf_preload_query(struct kvdmabuf_preload_state *state);

/**
 * kvdmabuf_preload_calls() - how many times the entry point @symbol
 * ("ibv_reg_mr@IBVERBS_1.1", ..., "ibv_reg_mr_ex@IBVERBS_1.15",
 * "cuMemUnmap", "cuMemMap",
 * "cuMemSetAccess", "cuMemAddressFree", "cuMemGetHandleForAddressRange",
 * "cuGetProcAddress", "cuGetProcAddress_v2") was
 * entered, from anywhere (nested calls of libibverbs included).
 * -ENOENT: not an interposed entry point.
 */
long long kvdmabuf_preload_calls(const char *symbol);

/**
 * kvdmabuf_preload_report() - one line per live registration of the
 * engine in or across a declared region ("lkey 0x.. addr+len NIC mode
 * reason"), NUL-terminated in @buf. Return: the length it needed.
 */
int kvdmabuf_preload_report(char *buf, size_t len);

/**
 * kvdmabuf_preload_reg_error() - the calling thread's last registration in
 * a KV region with a proxy that failed both on the proxy and as asked
 * ("" if none): both errors, NUL-terminated in @buf (also on stderr). The
 * registration itself returned NULL with errno the proxy's error, except
 * EOPNOTSUPP (a NIC without dma-buf MRs: then the error as asked).
 * Return: its length.
 */
int kvdmabuf_preload_reg_error(char *buf, size_t len);

/*
 * Sleep and wake driven by the CUDA driver (lib/preload/preload_cuda.c).
 * The preload also interposes cuMemUnmap, cuMemMap, cuMemSetAccess,
 * cuMemAddressFree, cuMemGetHandleForAddressRange (forwarded; each dma-buf
 * it makes is noted with the memory it holds, so that the engine's own
 * ibv_reg_dmabuf_mr of it is checked against the regions by that memory,
 * whatever its iova) and cuGetProcAddress (both the CUDA 11.3 symbol and
 * cuGetProcAddress_v2, which hand back the preload's own entry point for
 * each of those names, everything else as the driver answers), and, on
 * x86-64, dlsym and dlvsym (the same seven names looked up on a handle of
 * libcuda, as the CUDA runtime does, and the verbs registration calls
 * above looked up on a handle of libibverbs, as NCCL's ibvwrap and
 * engines that load it RTLD_LOCAL do; everything else goes on to glibc's;
 * elsewhere those lookups bypass the interposer: flags
 * KVDMABUF_PRELOAD_NO_DLSYM, and a line on stderr when a region gets proxy
 * operations):
 *  - a cuMemUnmap over part of an awake declared region whose owner set a
 *    ranges operation (kvdmabuf_preload_set_ranges_op(): an elastic pool
 *    whose NIC follows moves) gives that part back and leaves the region
 *    awake: ranges() of it with @restore 0, then the unmap is forwarded
 *    (the driver refused it: ranges() with @restore 1 puts it back). Peers
 *    reading there get zeros, the rest keeps its bytes and every key.
 *    A cuMemSetAccess over a part given back so brings it in again:
 *    ranges() with @restore 1 of what it covers, after the forwarded call
 *    (failed: that cuMemSetAccess returns CUDA_ERROR_NOT_PERMITTED, the
 *    part stays given back, a later cuMemSetAccess tries again);
 *  - a cuMemUnmap over all of an awake declared region, or over part of
 *    one without a ranges operation (or whose ranges() answers
 *    -EOPNOTSUPP: a NIC that pins), puts the region to
 *    sleep first: the check of kvdmabuf_preload_check(), then the proxy's
 *    revoke(), then the unmap is forwarded. Refused (an engine MR that
 *    cannot follow, a region with a proxy but no operations, revoke()
 *    failed): cuMemUnmap returns CUDA_ERROR_NOT_PERMITTED (800), nothing
 *    is unmapped, the reason is on stderr and in
 *    kvdmabuf_preload_cuda_error();
 *  - a region the interposer put to sleep wakes when all of it is mapped
 *    and accessible again: what stayed mapped counts, what any cuMemUnmap
 *    took out must be covered by successful cuMemSetAccess calls (an
 *    engine that gives back one chunk wakes the region by mapping that
 *    chunk again). After the last of them, its memory is exported as a
 *    dma-buf
 *    (cuMemGetHandleForAddressRange, in the primary context of the
 *    memory's device) and handed to the proxy's replace(). A failed wake
 *    leaves the region asleep and that cuMemSetAccess returns the export's
 *    error, or CUDA_ERROR_NOT_PERMITTED when replace() failed (the access
 *    is set all the same);
 *  - anything outside the declared regions, and calls into regions that
 *    are asleep already (kvdmabuf_preload_sleep()), pass through.
 */

/**
 * struct kvdmabuf_preload_proxy_ops - what the owner of a region's proxy
 * (the process's kvdmabuf context: only the /dev/kvdmabuf file that
 * created a proxy may change its backing) does for the CUDA interposer.
 * Called from the thread that called cuMemUnmap/cuMemSetAccess, with the
 * CUDA interposer's lock held (other threads' sleeps and wakes wait: an
 * operation must not wait for one); CUDA calls made inside pass through.
 * @revoke: the region [@addr, @addr+@len) is about to be unmapped: the
 *	proxy must stop mapping it (KVDMABUF_IOCTL_REVOKE). 0 or a negative
 *	errno with the reason in @err (the unmap is then refused).
 * @replace: the region's new memory, exported as the dma-buf @dmabuf_fd
 *	(the region's bytes from offset 0; the preload closes it after the
 *	call): make it the proxy's backing (KVDMABUF_IOCTL_ATTACH with
 *	KVDMABUF_ATTACH_REPLACE). 0 or a negative errno, reason in @err.
 * @arg: passed to both.
 */
struct kvdmabuf_preload_proxy_ops {
	int (*revoke)(void *arg, void *addr, size_t len, char *err,
		      size_t err_len);
	int (*replace)(void *arg, void *addr, size_t len, int dmabuf_fd,
		       char *err, size_t err_len);
	void *arg;
};

/**
 * kvdmabuf_preload_set_proxy_ops() - the proxy operations of the declared
 * region that starts at @addr (copied; NULL: none). A region with a proxy
 * and no operations refuses a cuMemUnmap while awake.
 * Until the call returns 0 for new operations (or @ops NULL) or the region
 * is undeclared, the old operations may still be called; never after.
 * Return: 0; -ENOENT no region starts at @addr; -EINVAL an operation is
 * missing; -EBUSY the region's operations are running now.
 */
int kvdmabuf_preload_set_proxy_ops(void *addr,
				   const struct kvdmabuf_preload_proxy_ops *ops);

/**
 * struct kvdmabuf_preload_range - bytes [@offset, @offset + @len) of a
 * declared region.
 */
struct kvdmabuf_preload_range {
	size_t offset;
	size_t len;
};

/**
 * kvdmabuf_preload_ranges_fn - what the owner of a region's proxy does when
 * the engine unmaps or maps part of the region while it is awake (the
 * region's operations' @arg; called as they are, see above).
 * @ranges, @n: the parts, sorted, disjoint, page aligned.
 * @restore: 0: the engine is about to unmap them: the proxy must stop
 *	mapping them (KVDMABUF_IOCTL_RANGES, unbacked); 1: new memory there is
 *	mapped and accessible: the proxy maps it (its export per allocation).
 * Return: 0; -EOPNOTSUPP: the region cannot change by parts (its NIC pins,
 * or no module with ranges): the preload sleeps the whole region instead;
 * another negative errno, reason in @err: the engine's call is refused.
 */
typedef int kvdmabuf_preload_ranges_fn(void *arg, void *addr,
				       const struct kvdmabuf_preload_range
				       *ranges, unsigned int n, int restore,
				       char *err, size_t err_len);

/** kvdmabuf_preload_set_ranges_op() flag: all of the region is given back
 * now (an elastic pool that starts empty): each part comes in at the
 * engine's first cuMemSetAccess over it. */
#define KVDMABUF_PRELOAD_RANGES_EMPTY (1u << 0)

/**
 * kvdmabuf_preload_set_ranges_op() - the ranges operation of the declared
 * region that starts at @addr, called with the arg of its proxy
 * operations (NULL: none; kvdmabuf_preload_set_proxy_ops(NULL) clears it
 * too), and @flags (KVDMABUF_PRELOAD_RANGES_*).
 * Return: 0; -ENOENT no region starts at @addr, or it has no proxy
 * operations; -EBUSY its operations are running now, or the call comes
 * from inside a region's operation; -EINVAL unknown
 * flags, or a flag without @ranges; -ENOMEM.
 */
int kvdmabuf_preload_set_ranges_op(void *addr,
				   kvdmabuf_preload_ranges_fn *ranges,
				   unsigned int flags);

/**
 * kvdmabuf_preload_cuda_error() - the calling thread's last refusal or
 * failure of the CUDA interposer ("" if none), NUL-terminated in @buf.
 * Return: its length.
 */
int kvdmabuf_preload_cuda_error(char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVDMABUF_PRELOAD_H */
