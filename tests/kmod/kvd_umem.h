/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * kvd_umem - test-only importer on the kernel's own dma-buf MR code.
 *
 * /dev/kvd_umem speaks the ABI of /dev/kvd_importer (kvd_importer.h: the
 * same structs and ioctl numbers), but every import is an ib_umem_dmabuf
 * of ib_core, made for an unregistered ib_device whose dma_device is a
 * platform device of this module:
 *
 * - dynamic (flags 0): ib_umem_dmabuf_get() with an invalidation callback
 *   that, like mlx5's, unmaps at once under the dma-buf's resv
 *   (ib_umem_dmabuf_unmap_pages()); the next access maps again with
 *   ib_umem_dmabuf_map_pages() (its sg-table trimming and fence wait), as
 *   an mlx5 page fault does;
 * - lazy (KVD_IMP_IMPORT_LAZY): dynamic, but the callback only marks the
 *   mapping stale and the next access unmaps it first;
 * - pinned (KVD_IMP_IMPORT_PINNED): ib_umem_dmabuf_get_pinned(), the path
 *   of efa and bnxt_re (pinned and mapped until release);
 * - pinned revocable (KVD_UMEM_IMPORT_PINNED_REVOCABLE, Linux 7.1+ ib_core
 *   only, -EOPNOTSUPP before): ib_umem_dmabuf_get_pinned_revocable_and_lock()
 *   with a revoke callback set by ib_umem_dmabuf_set_revoke_locked(), the
 *   path of irdma: an invalidation unmaps and unpins the umem for good
 *   (KVD_UMEM_IOCTL_INFO counts the callbacks; later accesses fail).
 *
 * Accesses walk the umem's DMA blocks of the page size that
 * ib_umem_find_best_pgsz() picks (PAGE_SIZE, as mlx5 does for dma-buf
 * MRs) and copy through them, taking DMA addresses as CPU physical
 * addresses (dma-direct, no IOMMU).
 *
 * Two devices: import flag KVD_UMEM_IMPORT_DEV32 imports with a second
 * ib_device whose dma_device has a 32-bit DMA mask (the default one has a
 * 64-bit mask). KVD_UMEM_IOCTL_INFO tells what an import mapped for.
 *
 * An MR inside the dma-buf: with KVD_UMEM_IMPORT_INNER (dynamic or pinned
 * only) the MR covers [KVD_UMEM_INNER_GAP, size - KVD_UMEM_INNER_GAP) and
 * access offsets count from its first byte. ib_umem then edits the table
 * it maps in place (its first entry starts later, its last ends earlier)
 * and undoes that before it unmaps; KVD_UMEM_IOCTL_INFO reports the edit.
 */
#ifndef _UAPI_KVD_UMEM_H
#define _UAPI_KVD_UMEM_H

#include <linux/ioctl.h>
#include <linux/types.h>

#include "kvd_importer.h"

#define KVD_UMEM_PATH			"/dev/kvd_umem"

/* Import with the second device (32-bit DMA mask). */
#define KVD_UMEM_IMPORT_DEV32		(1U << 8)
/* Pinned and revocable (irdma), see above. */
#define KVD_UMEM_IMPORT_PINNED_REVOCABLE	(1U << 9)
/* The MR leaves KVD_UMEM_INNER_GAP bytes out at both ends, see above. */
#define KVD_UMEM_IMPORT_INNER		(1U << 10)
#define KVD_UMEM_INNER_GAP		8192

#define KVD_UMEM_DEVNAME_LEN		32

/**
 * struct kvd_umem_info - KVD_UMEM_IOCTL_INFO argument
 * @handle: in: import handle
 * @nmap: out: DMA entries of the current mapping (0: not mapped)
 * @dma_mask: out: DMA mask of the device the import maps for
 * @max_dma_end: out: highest DMA address + 1 of the current mapping
 * @pgsz: out: page size ib_umem_find_best_pgsz() picked at the last map
 * @dev_name: out: name of the device the import maps for
 * @revokes: out: revoke callbacks of a pinned revocable import
 * @revoked: out: 1 once ib_core revoked the umem (it never maps again)
 * @bus_addr_nents: out: entries of the current mapping marked as bus
 *	addresses (sg_dma_is_bus_address())
 * @first_sg_offset: out: bytes ib_umem cut off the front of the first entry
 *	of the table it maps (in place, until unmap)
 * @last_sg_trim: out: bytes it cut off the end of the last one
 */
struct kvd_umem_info {
	__u32 handle;
	__u32 nmap;
	__u64 dma_mask;
	__u64 max_dma_end;
	__u64 pgsz;
	char dev_name[KVD_UMEM_DEVNAME_LEN];
	__u32 revokes;
	__u32 revoked;
	__u32 bus_addr_nents;
	__u32 first_sg_offset;
	__u32 last_sg_trim;
	__u32 pad;
};

#define KVD_UMEM_IOCTL_INFO	_IOWR(KVD_IMP_IOCTL_MAGIC, 0x20, struct kvd_umem_info)

/* KVD_UMEM_IOCTL_REMAP: at most this many repetitions per call. */
#define KVD_UMEM_MAX_REMAP_REPS		4096

/**
 * struct kvd_umem_remap - KVD_UMEM_IOCTL_REMAP argument (benchmarks)
 * @handle: in: a dynamic (not pinned, not lazy) import
 * @reps: in: repetitions, 1..KVD_UMEM_MAX_REMAP_REPS
 * @unmap_ns: in: user address of __u64[@reps]: per repetition, the ns of
 *	ib_umem_dmabuf_unmap_pages() (what the invalidation callback runs;
 *	0 when the import was not mapped)
 * @map_ns: in: user address of __u64[@reps]: per repetition, the ns of
 *	ib_umem_dmabuf_map_pages() + ib_umem_find_best_pgsz() (an mlx5 page
 *	fault's re-map and MR page list walk)
 * @nmap: out: DMA entries of the last mapping
 * @pad: must be 0
 *
 * Each repetition takes the dma-buf's resv, unmaps the import if mapped,
 * maps it again and drops the resv; both steps are timed in the kernel
 * (ktime_get_ns()). The import's maps counter grows by @reps. Errors:
 * -ENOENT no such handle, -EINVAL pinned or lazy import, bad @reps or
 * @pad, -EFAULT, or the map's error (the import is then left unmapped).
 */
struct kvd_umem_remap {
	__u32 handle;
	__u32 reps;
	__u64 unmap_ns;
	__u64 map_ns;
	__u32 nmap;
	__u32 pad;
};

#define KVD_UMEM_IOCTL_REMAP	_IOWR(KVD_IMP_IOCTL_MAGIC, 0x28, struct kvd_umem_remap)

#endif /* _UAPI_KVD_UMEM_H */
