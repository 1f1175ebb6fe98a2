/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * kvd_importer - test-only dynamic dma-buf importer (stands in for a NIC).
 *
 * /dev/kvd_importer imports dma-buf fds with the importer's own platform
 * device (64-bit DMA mask), either dynamically (peer2peer, move_notify
 * unmaps at once, the next access maps again, like a NIC page fault) or
 * pinned (dma_buf_pin() at import, one map kept until release, like a NIC
 * that pins). Accesses copy bytes through the current DMA mapping; they
 * assume DMA addresses are CPU physical addresses (no IOMMU).
 */
#ifndef _UAPI_KVD_IMPORTER_H
#define _UAPI_KVD_IMPORTER_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define KVD_IMPORTER_PATH		"/dev/kvd_importer"

#define KVD_IMP_IMPORT_PINNED		(1U << 0)
/*
 * Dynamic, but move_notify only marks the mapping stale; the next access
 * unmaps it and maps again (an importer that defers its unmap).
 */
#define KVD_IMP_IMPORT_LAZY		(1U << 1)
/*
 * Linux 7.1+ only (-EOPNOTSUPP before): attach without an invalidation
 * callback (never told of a move). Alone: dynamic, which a kvdmabuf proxy
 * refuses to map (-EOPNOTSUPP); with KVD_IMP_IMPORT_PINNED: what a pinned
 * import is anyway on 7.1+ (a pinned import with a callback would declare
 * itself revocable; before 7.1 it has a callback that only counts).
 */
#define KVD_IMP_IMPORT_NO_NOTIFY	(1U << 2)
/*
 * CPU access, the way a software NIC reads and writes (-EOPNOTSUPP before
 * Linux 6.2): attaches without peer2peer, with a device that has no DMA,
 * and copies through dma_buf_vmap() under the dma-buf's reservation lock,
 * mapped at the first access after a move notification. The notification
 * gives the mapping up at once; with KVD_IMP_IMPORT_LAZY it only marks it
 * stale and the next access gives it up (an importer that keeps its CPU
 * mapping through the notification). Not with PINNED nor NO_NOTIFY.
 */
#define KVD_IMP_IMPORT_CPU		(1U << 3)

/**
 * struct kvd_imp_import - KVD_IMP_IOCTL_IMPORT argument
 * @fd: in: dma-buf fd
 * @flags: in: KVD_IMP_IMPORT_PINNED, KVD_IMP_IMPORT_LAZY or 0 (dynamic),
 *	optionally KVD_IMP_IMPORT_NO_NOTIFY (not with LAZY); or
 *	KVD_IMP_IMPORT_CPU, optionally with LAZY
 * @handle: out: import handle for the other ioctls
 * @pad: must be 0
 *
 * Errors: -EINVAL (flags, LAZY with another flag, pad, not a dma-buf),
 * -EOPNOTSUPP (NO_NOTIFY before Linux 7.1, CPU before 6.2), -EBADF, -ENOSPC (too many
 * imports on this fd), errors of dma_buf_dynamic_attach(), dma_buf_pin()
 * and, pinned, of the map.
 */
struct kvd_imp_import {
	__u32 fd;
	__u32 flags;
	__u32 handle;
	__u32 pad;
};

#define KVD_IMP_ACCESS_WRITE		(1U << 0)
/*
 * Through a second map of the attachment, made while the first is held
 * and unmapped before the call returns (an importer mapping one
 * attachment twice): -EEXIST if the exporter handed out the same table
 * twice (each map must get its own).
 */
#define KVD_IMP_ACCESS_SECOND_MAP	(1U << 1)
#define KVD_IMP_MAX_ACCESS		(1U << 20)

/**
 * struct kvd_imp_access - KVD_IMP_IOCTL_ACCESS argument
 * @handle: in: import handle
 * @flags: in: KVD_IMP_ACCESS_WRITE to write, else read; optionally
 *	KVD_IMP_ACCESS_SECOND_MAP
 * @offset: in: byte offset into the dma-buf
 * @length: in: bytes, at most KVD_IMP_MAX_ACCESS
 * @buf: in: user buffer address
 *
 * Maps the dma-buf first if it has no current mapping (counts a map); a
 * lazy import first unmaps a mapping that a move notification made stale.
 * Errors: -EINVAL (flags, range), -ENOENT (handle), -EFAULT, the error of
 * the map (-ENODEV for a revoked kvdmabuf proxy; counted as failed),
 * -EIO (a DMA address without struct page).
 */
struct kvd_imp_access {
	__u32 handle;
	__u32 flags;
	__u64 offset;
	__u64 length;
	__u64 buf;
};

/**
 * struct kvd_imp_counters - KVD_IMP_IOCTL_COUNTERS argument
 * @handle: in: import handle
 * @mapped: out: 1 while the import holds a mapping (CPU: a vmap)
 * @maps: out: successful maps
 * @invalidations: out: move notifications received
 * @failed: out: accesses whose map failed
 * @accesses: out: successful accesses
 * @table_len: out: the DMA length of the current mapping's table (0 while
 *	unmapped): the proxy's length, never more of a larger backing
 */
struct kvd_imp_counters {
	__u32 handle;
	__u32 mapped;
	__u64 maps;
	__u64 invalidations;
	__u64 failed;
	__u64 accesses;
	__u64 table_len;
};

/**
 * struct kvd_imp_release - KVD_IMP_IOCTL_RELEASE argument
 * @handle: in: import handle (unmap, unpin, detach, drop the reference)
 * @pad: must be 0
 */
struct kvd_imp_release {
	__u32 handle;
	__u32 pad;
};

/**
 * struct kvd_imp_fence - KVD_IMP_IOCTL_FENCE argument
 * @handle: in: import handle
 * @delay_ms: in: the fence signals this long after the call (at most
 *	KVD_IMP_MAX_FENCE_DELAY_MS)
 *
 * Adds a new dma_fence to the imported dma-buf's reservation object with
 * DMA_RESV_USAGE_BOOKKEEP (as a DRM driver tracks its DMA) and signals it
 * from a delayed work item. Fences still pending when the importer fd is
 * closed are signaled then. Errors: -EINVAL (delay), -ENOENT (handle),
 * -ENOSPC (KVD_IMP_MAX_FENCES fences on this fd), -ENOMEM, -EINTR.
 */
struct kvd_imp_fence {
	__u32 handle;
	__u32 delay_ms;
};

#define KVD_IMP_MAX_FENCE_DELAY_MS	60000
#define KVD_IMP_MAX_FENCES		64

#define KVD_IMP_IOCTL_MAGIC		0xDC
#define KVD_IMP_IOCTL_IMPORT	_IOWR(KVD_IMP_IOCTL_MAGIC, 1, struct kvd_imp_import)
#define KVD_IMP_IOCTL_ACCESS	_IOW(KVD_IMP_IOCTL_MAGIC, 2, struct kvd_imp_access)
#define KVD_IMP_IOCTL_COUNTERS	_IOWR(KVD_IMP_IOCTL_MAGIC, 3, struct kvd_imp_counters)
#define KVD_IMP_IOCTL_RELEASE	_IOW(KVD_IMP_IOCTL_MAGIC, 4, struct kvd_imp_release)
#define KVD_IMP_IOCTL_FENCE	_IOW(KVD_IMP_IOCTL_MAGIC, 5, struct kvd_imp_fence)

#endif /* _UAPI_KVD_IMPORTER_H */
