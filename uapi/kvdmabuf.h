/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * kvdmabuf - proxy dma-bufs with a revocable, replaceable backing.
 *
 * A process opens /dev/kvdmabuf and creates *proxy* dma-bufs through it.
 * A proxy has a fixed length and forwards importer mappings to a *backing*
 * dma-buf (any exporter) that the process can revoke and later replace.
 * Importers (NICs) attach to the proxy, never to the backing.
 *
 * All ioctls are issued on the /dev/kvdmabuf file descriptor. Proxies are
 * named by a proxy dma-buf fd. Only the open file description of
 * /dev/kvdmabuf that created a proxy (the fd passed to
 * KVDMABUF_IOCTL_CREATE, or a dup() of it, or the same file inherited
 * across fork()) may control it: KVDMABUF_IOCTL_ATTACH (with or without
 * KVDMABUF_ATTACH_REPLACE) and KVDMABUF_IOCTL_REVOKE give -EPERM on any
 * other opener of the device. KVDMABUF_IOCTL_QUERY works from any of them.
 * Handing the proxy fd to another process (a transfer engine, an RDMA
 * library) thus lets it import the proxy, not change its backing. Once the
 * creating file is closed, nobody can control the proxy any more; it keeps
 * its current state until its dma-buf is released.
 *
 * Extensible structures: every argument struct starts with ``__u32 size``
 * (the caller's sizeof) and ``__u32 flags``. The kernel ignores the size
 * bits encoded in the ioctl command number and uses @size instead:
 *
 * - @size smaller than the first published version (the ``*_SIZE_VER0``
 *   constants): -EINVAL;
 * - @size larger than the kernel's struct: the extra bytes must be zero,
 *   else -E2BIG (also -E2BIG when @size exceeds the page size);
 * - otherwise min(@size, kernel size) bytes are read, missing fields are
 *   taken as zero, and min(@size, kernel size) bytes are written back.
 *
 * So zero the whole struct before filling in the "in" fields: a caller
 * built against a newer header than the running module's passes the newer
 * fields, and the module accepts them only as zero (an out-only field such
 * as QUERY's newer counters must be zero on input for the same reason).
 *
 * Unknown flags, and non-zero ``pad``/``reserved`` fields, give -EINVAL.
 * Fields marked "out" are ignored on input, within the kernel's size. Every ioctl may also fail with
 * -EFAULT (bad argument pointer) and -ENOTTY (unknown command).
 *
 * Common errnos for a ``proxy_fd``: -EBADF (not an open fd), -EINVAL (not
 * a dma-buf, or a dma-buf that is not a kvdmabuf proxy).
 */
#ifndef _UAPI_KVDMABUF_H
#define _UAPI_KVDMABUF_H

#include <linux/ioctl.h>
#include <linux/types.h>

/**
 * KVDMABUF_DEVICE_PATH - path of the misc device node
 */
#define KVDMABUF_DEVICE_PATH		"/dev/kvdmabuf"

/**
 * KVDMABUF_API_VERSION_MAJOR - incompatible ABI revision
 *
 * 2: ioctl magic 0xDA (was 0xDB, taken by mwave), control limited to the
 * creating device fd, bounded stale backings, a maximum timeout.
 * 3: ioctl magic 0xC9 (0xDA is gdrcopy's gdrdrv, on the same GPU nodes);
 * LIST reports pid and uid as the caller's namespaces see them; ATTACH
 * and REVOKE report the importer pins behind an -EBUSY (@pins).
 */
#define KVDMABUF_API_VERSION_MAJOR	3
/**
 * KVDMABUF_API_VERSION_MINOR - compatible additions within a major
 *
 * Within major 2: 1: KVDMABUF_IOCTL_LIST. 2: revocable pins (Linux 7.1+
 * importers that pin and can be revoked) in QUERY and LIST; mapping
 * refused to an importer without an invalidation callback that holds no
 * pin; max_proxies_total. Major 3 starts again at 0.
 * Within major 3: 1: CPU access (KVDMABUF_FEATURE_VMAP). 2: ranges
 * (KVDMABUF_FEATURE_RANGES, KVDMABUF_IOCTL_RANGES).
 */
#define KVDMABUF_API_VERSION_MINOR	2
/**
 * KVDMABUF_API_VERSION - major << 16 | minor, as VERSION reports it
 */
#define KVDMABUF_API_VERSION \
	((KVDMABUF_API_VERSION_MAJOR << 16) | KVDMABUF_API_VERSION_MINOR)

/* Feature bits reported by KVDMABUF_IOCTL_VERSION. */
/**
 * KVDMABUF_FEATURE_REPLACE - KVDMABUF_ATTACH_REPLACE is supported
 */
#define KVDMABUF_FEATURE_REPLACE	(1ULL << 0)
/**
 * KVDMABUF_FEATURE_EVENTS - read()/poll() of events on the device fd
 */
#define KVDMABUF_FEATURE_EVENTS		(1ULL << 1)
/**
 * KVDMABUF_FEATURE_MOVE_NOTIFY_CORE - the running kernel's dma-buf core
 * does not pin a dynamic exporter around each map of a dynamic importer
 * (CONFIG_DMABUF_MOVE_NOTIFY set, or Linux 7.1+ where the option is gone).
 * The module finds this out when it loads, by mapping a throw-away dynamic
 * dma-buf once; if that probe cannot run, it reports the configuration of
 * the kernel it was built against. Without it, every mapped importer is
 * pinned by the core while mapped (such pins are not counted as blocking).
 */
#define KVDMABUF_FEATURE_MOVE_NOTIFY_CORE (1ULL << 2)
/**
 * KVDMABUF_FEATURE_LIST - KVDMABUF_IOCTL_LIST is supported (API 2.1)
 */
#define KVDMABUF_FEATURE_LIST		(1ULL << 3)
/**
 * KVDMABUF_FEATURE_REVOCABLE_PINS - the module tells revocable pins apart
 * (API 2.2; built for a dma-buf core with dma_buf_attach_revocable(),
 * Linux 7.1+): REVOKE revokes pinned revocable importers for good instead
 * of failing with -EBUSY. Without it every pin blocks REVOKE and ATTACH,
 * even that of an importer which could give its mapping up (Debian's
 * 6.12 has ib_core's revocable dma-buf umems without that core API).
 */
#define KVDMABUF_FEATURE_REVOCABLE_PINS	(1ULL << 4)
/**
 * KVDMABUF_FEATURE_VMAP - CPU access to a proxy (API 3.1; Linux 6.2+, where
 * dma_buf_vmap() runs under the buffer's reservation lock): dma_buf_vmap()
 * of a backed proxy gives its backing's kernel mapping at the proxy's
 * offset (-ENODEV unbacked or revoked; the backing exporter's error, such
 * as -EINVAL for one without vmap). The dma-buf core warns about a failed
 * vmap, so an importer asks first with dma_buf_pin() under the same hold
 * of the reservation lock (-ENODEV while not backed, -EOPNOTSUPP for a
 * backing without vmap) and unpins once mapped. Dynamic importers without
 * peer2peer may attach for this (software NICs): their map fails with
 * -EOPNOTSUPP (static importers are refused at attach, as before). The
 * mapping must be given up from the importer's invalidation callback: one
 * kept through it makes REVOKE and ATTACH fail with -EBUSY, counted as one
 * pin, since the dma-buf core would go on handing it out.
 */
#define KVDMABUF_FEATURE_VMAP		(1ULL << 5)
/**
 * KVDMABUF_FEATURE_RANGES - KVDMABUF_IOCTL_RANGES is supported (API 3.2):
 * a proxy's length is covered by ranges, each backed by a dma-buf of its
 * own or by nothing, changed in batches (an elastic KV pool)
 */
#define KVDMABUF_FEATURE_RANGES		(1ULL << 6)

/* Proxy states (struct kvdmabuf_query.state, struct kvdmabuf_event.state). */
/**
 * KVDMABUF_STATE_UNBACKED - created, never backed; map and pin fail
 */
#define KVDMABUF_STATE_UNBACKED		0
/**
 * KVDMABUF_STATE_BACKED - a backing is attached; importers can map
 */
#define KVDMABUF_STATE_BACKED		1
/**
 * KVDMABUF_STATE_REVOKED - backing revoked; map and pin fail with -ENODEV
 */
#define KVDMABUF_STATE_REVOKED		2
/**
 * KVDMABUF_STATE_RELEASED - (events only) the proxy dma-buf was freed
 */
#define KVDMABUF_STATE_RELEASED		3

/* Why a proxy is revoked (struct kvdmabuf_query.revoke_reason). */
/**
 * KVDMABUF_REVOKE_NONE - not revoked (unbacked or backed)
 */
#define KVDMABUF_REVOKE_NONE		0
/**
 * KVDMABUF_REVOKE_USER - revoked by KVDMABUF_IOCTL_REVOKE
 */
#define KVDMABUF_REVOKE_USER		1
/**
 * KVDMABUF_REVOKE_EXPORTER - the backing's exporter invalidated it (moved
 * or revoked it: device reset, unplug, a revocable exporter); the module
 * revoked the proxy on its own, notified the importers and queued a
 * KVDMABUF_STATE_REVOKED event. Attach a new backing to go on.
 */
#define KVDMABUF_REVOKE_EXPORTER	2

/**
 * struct kvdmabuf_version - KVDMABUF_IOCTL_VERSION argument
 * @size: in: sizeof(struct kvdmabuf_version)
 * @flags: in: must be 0
 * @version: out: KVDMABUF_API_VERSION of the module
 * @pad: must be 0
 * @features: out: KVDMABUF_FEATURE_* bits
 * @reserved: must be 0
 *
 * Errors: -EFAULT, -EINVAL (size, flags, pad, reserved), -E2BIG.
 */
struct kvdmabuf_version {
	__u32 size;
	__u32 flags;
	__u32 version;
	__u32 pad;
	__u64 features;
	__u64 reserved;
};

/**
 * KVDMABUF_CREATE_NO_CLOEXEC - create the proxy fd without O_CLOEXEC
 */
#define KVDMABUF_CREATE_NO_CLOEXEC	(1U << 0)
/**
 * KVDMABUF_CREATE_VALID_FLAGS - every flag CREATE accepts
 */
#define KVDMABUF_CREATE_VALID_FLAGS	(KVDMABUF_CREATE_NO_CLOEXEC)

/**
 * struct kvdmabuf_create - KVDMABUF_IOCTL_CREATE argument
 * @size: in: sizeof(struct kvdmabuf_create)
 * @flags: in: KVDMABUF_CREATE_NO_CLOEXEC to create the fd without
 *	O_CLOEXEC (O_CLOEXEC is the default)
 * @length: in: proxy length in bytes; non-zero, multiple of the page size
 * @id: out: proxy id, unique while the module is loaded (never 0); used
 *	in events and in debugfs
 * @fd: out: the new proxy dma-buf fd (O_RDWR)
 * @pad: must be 0
 * @reserved: must be 0
 *
 * The proxy starts in KVDMABUF_STATE_UNBACKED. It lives as long as its
 * dma-buf: closing the device fd does not destroy it.
 *
 * Errors: -EFAULT; -EINVAL (size, flags, pad, reserved, length zero or not
 * page aligned); -E2BIG; -EFBIG (length larger than the kernel can map);
 * -ENOSPC (the device fd already owns ``max_proxies`` live proxies,
 * ``max_proxies_total`` proxies of all device fds together are live, or
 * the caller's effective uid made ``max_proxies_per_uid`` live ones: module
 * parameters, 1024, 65536 and 16384 by default);
 * -ENOMEM; -EMFILE/-ENFILE (no free fd). The fd is installed only after
 * the struct was written back: on -EFAULT no fd and no proxy is left.
 */
struct kvdmabuf_create {
	__u32 size;
	__u32 flags;
	__u64 length;
	__u64 id;
	__u32 fd;
	__u32 pad;
	__u64 reserved;
};

/**
 * KVDMABUF_ATTACH_REPLACE - swap the backing of a backed proxy
 */
#define KVDMABUF_ATTACH_REPLACE		(1U << 0)
/**
 * KVDMABUF_ATTACH_VALID_FLAGS - every flag ATTACH accepts
 */
#define KVDMABUF_ATTACH_VALID_FLAGS	(KVDMABUF_ATTACH_REPLACE)

/**
 * struct kvdmabuf_attach - KVDMABUF_IOCTL_ATTACH argument
 * @size: in: sizeof(struct kvdmabuf_attach)
 * @flags: in: KVDMABUF_ATTACH_REPLACE to swap the backing of a proxy that
 *	is already backed (without it, a backed proxy gives -EEXIST). With
 *	REPLACE on an unbacked or revoked proxy, it acts as a plain attach.
 * @proxy_fd: in: the proxy dma-buf fd
 * @backing_fd: in: the backing dma-buf fd (any exporter except kvdmabuf)
 * @offset: in: byte offset into the backing, multiple of the page size;
 *	the proxy maps backing bytes [offset, offset + proxy length)
 * @timeout_ms: in: REPLACE only: how long to wait for importers to drop
 *	their mappings of the old backing (0: poll: do not wait, and report
 *	-ETIMEDOUT if they still map it or their fences are pending); at most
 *	KVDMABUF_MAX_TIMEOUT_MS
 * @pad: must be 0
 * @generation: out: the proxy's generation after the call
 * @pins: out, on -EBUSY too: the importers' pins that refused the call
 *	(a CPU mapping kept through the notification counts as one,
 *	KVDMABUF_FEATURE_VMAP); 0 with -EBUSY means the backing's exporter
 *	refused (its pin or map: memory it cannot place), not an importer
 * @reserved: must be 0
 *
 * The module attaches to the backing once per importer attachment of the
 * proxy (with the importer's device) and maps it, before changing any state.
 * REPLACE then swaps atomically under the proxy's reservation lock, sends a
 * move notification to the importers, waits (as REVOKE does) for the fences
 * importers had on the proxy's reservation object then and for their old
 * mappings to go
 * and drops every attachment to the old backing and its reference. The
 * module holds its own reference to the backing; the caller may close
 * @backing_fd afterwards.
 *
 * Errors: -EFAULT; -EINVAL (size, flags, pad, reserved, offset not page
 * aligned, @timeout_ms above KVDMABUF_MAX_TIMEOUT_MS, @proxy_fd not a
 * proxy, @backing_fd not a dma-buf); -E2BIG;
 * -EBADF (@proxy_fd or @backing_fd not open); -EPERM (the proxy was not
 * created by this device fd); -ELOOP (the backing is a
 * kvdmabuf proxy); -EOVERFLOW (@offset + length overflows); -ERANGE
 * (backing smaller than @offset + length, by its size or by the length of
 * its mapping for an importer's device); -EEXIST (already backed, no
 * REPLACE); -EAGAIN (the proxy already holds KVDMABUF_MAX_STALE_BACKINGS
 * old backings still mapped, left by revokes, replaces or its backings'
 * exporters: nothing changed); -EBUSY (@pins > 0: an importer holds a
 * pin, blocking or revocable: a pinned importer never maps again, so it
 * could not follow a new backing; @pins 0: the backing's exporter
 * returned -EBUSY; nothing changed either way); -EINTR (a signal while
 * the backing's exporter finished moving it into place, before the swap:
 * nothing changed, @generation is not written; or, REPLACE of a backed
 * proxy only, a signal while waiting after the swap: the swap was made,
 * @generation is the new one, the old backing is dropped when its last
 * mapping goes); -ETIMEDOUT (REPLACE, after the swap, on timeout). A plain attach (nothing to
 * replace) never waits and never fails after the swap: stale backings of
 * an earlier timed-out revoke are dropped if idle, else left to the revoke
 * that timed out;
 * -ENOMEM; any error of the backing exporter's attach or map (for example
 * -EOPNOTSUPP, -ENODEV, -EIO): nothing changed.
 */
struct kvdmabuf_attach {
	__u32 size;
	__u32 flags;
	__u32 proxy_fd;
	__u32 backing_fd;
	__u64 offset;
	__u32 timeout_ms;
	__u32 pad;
	__u64 generation;
	__u32 pins;
	__u32 reserved;
};

/**
 * struct kvdmabuf_revoke - KVDMABUF_IOCTL_REVOKE argument
 * @size: in: sizeof(struct kvdmabuf_revoke)
 * @flags: in: must be 0
 * @proxy_fd: in: the proxy dma-buf fd
 * @timeout_ms: in: how long to wait for importers to drop their mappings
 *	(0: poll: do not wait, and report -ETIMEDOUT if they still map it or
 *	their fences are pending; the revoke is done either way); at most
 *	KVDMABUF_MAX_TIMEOUT_MS
 * @generation: out: the proxy's generation after the call
 * @pins: out, on -EBUSY too: the blocking pins that refused the revoke
 *	(a CPU mapping kept through the notification counts as one)
 * @reserved: must be 0
 *
 * Marks the proxy revoked and sends a move notification to the importers
 * under the proxy's reservation lock; from then on pin and map fail with
 * -ENODEV. Revocable importers that hold a pin (Linux 7.1+:
 * dma_buf_attach_revocable(), such as irdma's dma-buf MRs) take that
 * notification as a permanent revoke: they unmap and unpin in their
 * callback and never map the proxy again (their memory region is dead and
 * must be registered anew). They do not make the revoke fail. Then waits
 * for the fences importers had on the proxy's reservation object once
 * told (DMA_RESV_USAGE_BOOKKEEP: importers such as DRM drivers track their
 * DMA with them; fences added later are work on a later backing), then
 * until no importer mapping of the backing remains (both
 * within @timeout_ms), and drops every attachment to the backing and the
 * module's reference to it,
 * so that its memory can be freed once user space closes its own fds.
 * Revoking a proxy that is not backed changes nothing (and waits again for
 * a backing left over from an earlier timed-out call).
 *
 * Errors: -EFAULT; -EINVAL (size, flags, reserved, @timeout_ms above
 * KVDMABUF_MAX_TIMEOUT_MS, not a proxy); -E2BIG; -EBADF; -EPERM (the proxy was not created by this device fd); -EAGAIN
 * (the proxy is backed and already holds KVDMABUF_MAX_STALE_BACKINGS old
 * backings: nothing changed); -EBUSY (the proxy is backed and an importer
 * that cannot be revoked holds a pin, see @blocking_pins of struct
 * kvdmabuf_query: nothing changed; a proxy already revoked, by REVOKE or
 * by its backing's exporter, never answers -EBUSY: such a pin keeps only
 * the stale backing, and the call waits for it as below); -EINTR (signal while waiting) and -ETIMEDOUT
 * (timeout): the proxy *is* revoked; the backing is dropped once those
 * fences have signaled and the last mapping is gone, by the module on its
 * own (the last unmap or the fences' signal queue it)
 * (struct kvdmabuf_query.stale_backings tells; call revoke again to wait).
 */
struct kvdmabuf_revoke {
	__u32 size;
	__u32 flags;
	__u32 proxy_fd;
	__u32 timeout_ms;
	__u64 generation;
	__u32 pins;
	__u32 reserved;
};

/**
 * struct kvdmabuf_query - KVDMABUF_IOCTL_QUERY argument
 * @size: in: sizeof(struct kvdmabuf_query)
 * @flags: in: must be 0
 * @proxy_fd: in: the proxy dma-buf fd
 * @state: out: KVDMABUF_STATE_*
 * @length: out: proxy length in bytes
 * @id: out: proxy id
 * @generation: out: incremented by every attach, replace and revoke
 * @offset: out: offset into the current backing (0 when not backed)
 * @dynamic_importers: out: importer attachments holding no pin
 * @pinned_importers: out: importer attachments holding a pin, blocking or
 *	revocable (such importers never follow a replace: a library should
 *	register their memory anew after each one)
 * @blocking_pins: out: sum of blocking pins (explicit dma_buf_pin() calls
 *	of importers that cannot be revoked; pins the core takes around a map
 *	are not counted): they make REVOKE and ATTACH fail with -EBUSY
 * @live_mappings: out: importer mappings (sg tables) not yet unmapped
 * @notifications: out: move notifications sent to the importers (one per
 *	revoke or replace, whatever the number of importers)
 * @backing_attachments: out: attachments the module holds to backings
 * @stale_backings: out: old backings still held because importers have
 *	not yet dropped their mappings
 * @reserved: must be 0
 * @revoke_reason: out: KVDMABUF_REVOKE_* (since _VER1)
 * @p2p_backing_attachments: out: how many of @backing_attachments are
 *	dynamic, peer-to-peer capable attachments (since _VER1; the module
 *	makes no other kind: each is pinned while the module maps it, and a
 *	move notification on it revokes the proxy)
 * @revocable_pins: out: sum of the pins of revocable importers (since
 *	_VER2; Linux 7.1+ only, 0 before): they make ATTACH (REPLACE) fail
 *	with -EBUSY but not REVOKE, which revokes those importers for good
 * @revocable_importers: out: how many of @pinned_importers hold only
 *	revocable pins (since _VER2)
 *
 * An importer without an invalidation callback (allowed since Linux 7.1)
 * is never told of a revoke or replace: it may attach and pin, but its
 * map fails with -EOPNOTSUPP unless it holds a pin, and its pin is a
 * blocking one.
 *
 * Errors: -EFAULT; -EINVAL (size, flags, reserved, not a proxy); -E2BIG;
 * -EBADF.
 */
struct kvdmabuf_query {
	__u32 size;
	__u32 flags;
	__u32 proxy_fd;
	__u32 state;
	__u64 length;
	__u64 id;
	__u64 generation;
	__u64 offset;
	__u32 dynamic_importers;
	__u32 pinned_importers;
	__u32 blocking_pins;
	__u32 live_mappings;
	__u64 notifications;
	__u32 backing_attachments;
	__u32 stale_backings;
	__u64 reserved;
	__u32 revoke_reason;
	__u32 p2p_backing_attachments;
	__u32 revocable_pins;
	__u32 revocable_importers;
};

/**
 * KVDMABUF_EVENT_STATE - struct kvdmabuf_event.type of a state change
 */
#define KVDMABUF_EVENT_STATE		1

/**
 * KVDMABUF_EVENT_FLAG_LOST - events were dropped before this one
 */
#define KVDMABUF_EVENT_FLAG_LOST	(1U << 0)

/**
 * struct kvdmabuf_event - record returned by read() on the device fd
 * @size: this record's size as the kernel wrote it. Records may grow in a
 *	later API version (new fields at the end): a reader walks a read()
 *	buffer by @size, not by its own sizeof, and reads the fields it knows
 * @type: KVDMABUF_EVENT_STATE
 * @id: proxy id
 * @generation: the proxy's generation after the transition
 * @state: the new KVDMABUF_STATE_*
 * @flags: KVDMABUF_EVENT_FLAG_* bits
 * @reserved: 0
 *
 * The device fd reports the transitions (attach, replace, revoke, release)
 * of the proxies it created. read() returns as many whole records as fit
 * (-EINVAL if the buffer cannot hold one), blocks when none is queued
 * unless O_NONBLOCK (-EAGAIN); poll() reports POLLIN. The queue is bounded;
 * on overflow the oldest records are dropped and the next record read
 * carries KVDMABUF_EVENT_FLAG_LOST. If read() cannot write the records to
 * the buffer (-EFAULT), they are put back at the head of the queue; any
 * that no longer fit (newer events filled it meanwhile) are dropped and
 * the head then carries KVDMABUF_EVENT_FLAG_LOST.
 */
struct kvdmabuf_event {
	__u32 size;
	__u32 type;
	__u64 id;
	__u64 generation;
	__u32 state;
	__u32 flags;
	__u64 reserved;
};

/**
 * KVDMABUF_MAX_STALE_BACKINGS - old backings a proxy holds at most
 *
 * A revoke or replace that would make one more backing stale (dropped by
 * the proxy but still mapped by a slow importer) while this many are
 * already held fails with -EAGAIN and changes nothing. Invalidations by a
 * backing's exporter are not refused (the memory is going anyway), so an
 * ATTACH after them fails the same way while this many are held.
 */
#define KVDMABUF_MAX_STALE_BACKINGS	4

/**
 * KVDMABUF_MAX_TIMEOUT_MS - largest timeout_ms of ATTACH and REVOKE
 *
 * Larger values give -EINVAL. The waits are interruptible (-EINTR) and
 * are made without holding any lock that importers need to attach to or
 * detach from the proxy, or that other ioctls on the proxy take.
 */
#define KVDMABUF_MAX_TIMEOUT_MS		60000

/**
 * KVDMABUF_STAT_BUSY - kvdmabuf_proxy_stat.flags: the proxy was busy (an
 * ioctl or an importer callback held it); only id, length, owner_pid and
 * owner_uid are filled in
 */
#define KVDMABUF_STAT_BUSY		(1U << 0)

/**
 * struct kvdmabuf_proxy_stat - one proxy in KVDMABUF_IOCTL_LIST
 * @id: proxy id
 * @length: proxy length in bytes
 * @generation: as in struct kvdmabuf_query
 * @state: KVDMABUF_STATE_*
 * @revoke_reason: as in struct kvdmabuf_query
 * @dynamic_importers: importer attachments holding no pin
 * @pinned_importers: importer attachments holding a pin (as in struct
 *	kvdmabuf_query: blocking or revocable)
 * @live_mappings: importer mappings not yet unmapped
 * @stale_backings: old backings still held for importers' mappings
 * @owner_pid: thread-group id of the process that created the proxy, in
 *	the caller's pid namespace (0 if it is not visible there or has
 *	exited)
 * @owner_uid: its effective uid in the caller's user namespace (the
 *	overflow uid, 65534, if unmapped there)
 * @flags: KVDMABUF_STAT_* bits
 * @pad: 0
 * @reserved: 0
 * @revocable_importers: how many of @pinned_importers hold only revocable
 *	pins (since _VER1)
 * @revocable_pins: sum of their pins (since _VER1)
 */
struct kvdmabuf_proxy_stat {
	__u64 id;
	__u64 length;
	__u64 generation;
	__u32 state;
	__u32 revoke_reason;
	__u32 dynamic_importers;
	__u32 pinned_importers;
	__u32 live_mappings;
	__u32 stale_backings;
	__s32 owner_pid;
	__u32 owner_uid;
	__u32 flags;
	__u32 pad;
	__u64 reserved;
	__u32 revocable_importers;
	__u32 revocable_pins;
};

/**
 * struct kvdmabuf_list - KVDMABUF_IOCTL_LIST argument
 * @size: in: sizeof(struct kvdmabuf_list)
 * @flags: in: must be 0
 * @stat_size: in: sizeof(struct kvdmabuf_proxy_stat) as the caller knows
 *	it (at least KVDMABUF_PROXY_STAT_SIZE_VER0, at most the page size);
 *	each entry is written with that size, missing fields as zero
 * @count: in: entries @stats has room for; out: proxies visible to the
 *	caller, which may exceed the room given (call again with more)
 * @stats: in: user address of the array
 * @reserved: must be 0
 *
 * Lists the live proxies the caller may see: those created by a process
 * with the caller's effective uid, or every proxy for CAP_SYS_ADMIN. Needs
 * no debugfs. A proxy that is busy is listed with KVDMABUF_STAT_BUSY.
 *
 * Errors: -EFAULT; -EINVAL (size, flags, reserved, @stat_size too small);
 * -E2BIG (@stat_size above the page size); -EINTR; -ENOMEM.
 */
struct kvdmabuf_list {
	__u32 size;
	__u32 flags;
	__u32 stat_size;
	__u32 count;
	__u64 stats;
	__u64 reserved;
};

/*
 * First published struct sizes, for the extensible-struct rules above;
 * a _VER1 size is that of the first revision that grew the struct.
 */
/**
 * KVDMABUF_VERSION_SIZE_VER0 - first size of struct kvdmabuf_version
 */
#define KVDMABUF_VERSION_SIZE_VER0	32
/**
 * KVDMABUF_CREATE_SIZE_VER0 - first size of struct kvdmabuf_create
 */
#define KVDMABUF_CREATE_SIZE_VER0	40
/**
 * KVDMABUF_ATTACH_SIZE_VER0 - first size of struct kvdmabuf_attach
 */
#define KVDMABUF_ATTACH_SIZE_VER0	48
/**
 * KVDMABUF_REVOKE_SIZE_VER0 - first size of struct kvdmabuf_revoke
 */
#define KVDMABUF_REVOKE_SIZE_VER0	32
/**
 * KVDMABUF_QUERY_SIZE_VER0 - first size of struct kvdmabuf_query
 */
#define KVDMABUF_QUERY_SIZE_VER0	88
/**
 * KVDMABUF_QUERY_SIZE_VER1 - size of struct kvdmabuf_query with
 * revoke_reason and p2p_backing_attachments
 */
#define KVDMABUF_QUERY_SIZE_VER1	96
/**
 * KVDMABUF_QUERY_SIZE_VER2 - size of struct kvdmabuf_query with
 * revocable_pins and revocable_importers (API 2.2)
 */
#define KVDMABUF_QUERY_SIZE_VER2	104
/**
 * KVDMABUF_LIST_SIZE_VER0 - first size of struct kvdmabuf_list
 */
#define KVDMABUF_LIST_SIZE_VER0		32
/**
 * KVDMABUF_PROXY_STAT_SIZE_VER0 - first size of struct kvdmabuf_proxy_stat
 */
#define KVDMABUF_PROXY_STAT_SIZE_VER0	72
/**
 * KVDMABUF_PROXY_STAT_SIZE_VER1 - size of struct kvdmabuf_proxy_stat with
 * revocable_importers and revocable_pins (API 2.2)
 */
#define KVDMABUF_PROXY_STAT_SIZE_VER1	80

/**
 * KVDMABUF_RANGE_UNBACKED - struct kvdmabuf_range.backing_fd of a range
 * that is to be backed by nothing
 */
#define KVDMABUF_RANGE_UNBACKED		(-1)

/**
 * KVDMABUF_MAX_RANGES - most ranges one KVDMABUF_IOCTL_RANGES may change,
 * and most pieces a proxy's layout may have after it
 */
#define KVDMABUF_MAX_RANGES		65536

/**
 * struct kvdmabuf_range - one range of a KVDMABUF_IOCTL_RANGES batch
 * @start: in: byte offset of the range in the proxy, page aligned
 * @length: in: its length in bytes, page aligned, not zero; the range
 *	must lie within the proxy
 * @backing_fd: in: the dma-buf that backs the range from now on (any
 *	exporter except kvdmabuf), or KVDMABUF_RANGE_UNBACKED
 * @flags: in: must be 0
 * @backing_offset: in: where the range starts in the backing, page
 *	aligned (0 for an unbacked range): the range maps backing bytes
 *	[backing_offset, backing_offset + length)
 * @reserved: must be 0
 *
 * An unbacked range still maps for the proxy's importers, to memory the
 * module owns and that holds nobody's data: transfers to the proxy's other
 * ranges never fail because of it. It reads as zeros after each
 * KVDMABUF_IOCTL_RANGES that leaves it unbacked; what a peer writes there
 * is dropped at the next one and never reaches a backing.
 */
struct kvdmabuf_range {
	__u64 start;
	__u64 length;
	__s32 backing_fd;
	__u32 flags;
	__u64 backing_offset;
	__u64 reserved;
};

/**
 * struct kvdmabuf_ranges - KVDMABUF_IOCTL_RANGES argument
 * @size: in: sizeof(struct kvdmabuf_ranges)
 * @flags: in: must be 0
 * @proxy_fd: in: the proxy dma-buf fd
 * @count: in: number of entries at @ranges, 1 to KVDMABUF_MAX_RANGES
 * @ranges: in: user pointer to @count struct kvdmabuf_range, each
 *	@range_size bytes long; they must not overlap (any order)
 * @range_size: in: sizeof(struct kvdmabuf_range) (extensible as the
 *	structs are: at least KVDMABUF_RANGE_SIZE_VER0, at most the page
 *	size, bytes beyond the kernel's struct zero)
 * @timeout_ms: in: how long to wait for importers to drop their mappings
 *	of what the call replaced, as ATTACH with KVDMABUF_ATTACH_REPLACE
 *	(0: poll); at most KVDMABUF_MAX_TIMEOUT_MS
 * @generation: out: the proxy's generation after the call
 * @pins: out, on -EBUSY too: the importers' pins that refused the call
 * @reserved: must be 0
 *
 * Changes the listed ranges of the proxy in one step and leaves the rest
 * as it was: what a backed proxy maps outside the listed ranges stays
 * mapped to the same backing bytes (a proxy attached whole with
 * KVDMABUF_IOCTL_ATTACH is one range; an unbacked or revoked proxy is all
 * unbacked). The module attaches to and maps every new backing for every
 * importer of the proxy first (a backing kept from before is not mapped
 * again), then swaps the proxy's layout under its reservation lock, sends
 * the importers one move notification for the whole batch and waits, as
 * REPLACE does, for their old mappings to go: after a successful return no
 * importer maps the bytes of a range that was replaced or unbacked, and the
 * module holds no reference to a backing no range uses any more. The proxy
 * is then KVDMABUF_STATE_BACKED, even if every range is unbacked.
 * REVOKE and ATTACH work on it as on any proxy (a revoke drops every
 * range; an ATTACH with REPLACE makes it one range again). A range's
 * backing invalidated by its exporter (device reset, unplug) revokes the
 * whole proxy (KVDMABUF_REVOKE_EXPORTER; a RANGES call meanwhile fails
 * with -ENODEV): the next RANGES starts from an unbacked proxy. CPU access
 * (KVDMABUF_FEATURE_VMAP, software NICs) gets one kernel mapping of the
 * whole layout where every range's backing has a kernel mapping of memory
 * with struct pages (shmem, udmabuf); otherwise such an importer's pin
 * answers -EOPNOTSUPP.
 *
 * Errors: -EFAULT; -EINVAL (size, flags, reserved, @count 0, @range_size,
 * @timeout_ms above KVDMABUF_MAX_TIMEOUT_MS, a range's flags, reserved
 * field, alignment or zero length, ranges that overlap, a backing_fd that
 * is not a dma-buf, @proxy_fd not a proxy); -E2BIG (@count above
 * KVDMABUF_MAX_RANGES, or a layout of more pieces than that);
 * -EBADF; -EPERM (not the proxy's creating device fd); -ELOOP (a backing is
 * a kvdmabuf proxy); -EOVERFLOW (start + length or backing_offset + length
 * overflows); -ERANGE (a range beyond the proxy's end, or beyond its
 * backing's size or mapping); -EAGAIN (the proxy's backing changed while
 * the call mapped the new backings, or it holds
 * KVDMABUF_MAX_STALE_BACKINGS old layouts still mapped: nothing changed);
 * -EBUSY, -EINTR, -ETIMEDOUT, -ENOMEM and the exporters' errors as for
 * KVDMABUF_IOCTL_ATTACH with KVDMABUF_ATTACH_REPLACE.
 */
struct kvdmabuf_ranges {
	__u32 size;
	__u32 flags;
	__u32 proxy_fd;
	__u32 count;
	__u64 ranges;
	__u32 range_size;
	__u32 timeout_ms;
	__u64 generation;
	__u32 pins;
	__u32 reserved;
};

/**
 * KVDMABUF_RANGE_SIZE_VER0 - first size of struct kvdmabuf_range
 */
#define KVDMABUF_RANGE_SIZE_VER0	40
/**
 * KVDMABUF_RANGES_SIZE_VER0 - first size of struct kvdmabuf_ranges
 */
#define KVDMABUF_RANGES_SIZE_VER0	48

/**
 * KVDMABUF_IOCTL_MAGIC - ioctl type of the module's commands
 *
 * Free in the kernel's Documentation/userspace-api/ioctl/ioctl-number.rst
 * (as of Linux 7.3), and not 0xDA, which gdrcopy's gdrdrv uses without
 * being listed there.
 */
#define KVDMABUF_IOCTL_MAGIC		0xC9

/**
 * KVDMABUF_IOCTL_VERSION - report the API version and features
 */
#define KVDMABUF_IOCTL_VERSION	_IOWR(KVDMABUF_IOCTL_MAGIC, 0x00, struct kvdmabuf_version)
/**
 * KVDMABUF_IOCTL_CREATE - create a proxy dma-buf
 */
#define KVDMABUF_IOCTL_CREATE	_IOWR(KVDMABUF_IOCTL_MAGIC, 0x01, struct kvdmabuf_create)
/**
 * KVDMABUF_IOCTL_ATTACH - attach or replace a proxy's backing
 */
#define KVDMABUF_IOCTL_ATTACH	_IOWR(KVDMABUF_IOCTL_MAGIC, 0x02, struct kvdmabuf_attach)
/**
 * KVDMABUF_IOCTL_REVOKE - revoke a proxy's backing and drop it
 */
#define KVDMABUF_IOCTL_REVOKE	_IOWR(KVDMABUF_IOCTL_MAGIC, 0x03, struct kvdmabuf_revoke)
/**
 * KVDMABUF_IOCTL_QUERY - read a proxy's state and counters
 */
#define KVDMABUF_IOCTL_QUERY	_IOWR(KVDMABUF_IOCTL_MAGIC, 0x04, struct kvdmabuf_query)
/**
 * KVDMABUF_IOCTL_LIST - the proxies the caller may see (API 2.1)
 */
#define KVDMABUF_IOCTL_LIST	_IOWR(KVDMABUF_IOCTL_MAGIC, 0x05, struct kvdmabuf_list)
/**
 * KVDMABUF_IOCTL_RANGES - change ranges of a proxy in one step (API 3.2)
 */
#define KVDMABUF_IOCTL_RANGES	_IOWR(KVDMABUF_IOCTL_MAGIC, 0x06, struct kvdmabuf_ranges)

#endif /* _UAPI_KVDMABUF_H */
