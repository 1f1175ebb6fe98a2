/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * kvd_edu.h - ABI of the test-only importer bound to qemu's edu PCI device
 * (tests/kmod/kvd_edu.c). IMPORT, ACCESS, COUNTERS and RELEASE are
 * kvd_importer.h's ioctls with their structs (PINNED is the only import
 * flag; an access moves at most KVD_EDU_MAX_ACCESS bytes); INFO and PROBE
 * are its own.
 */
#ifndef _UAPI_KVD_EDU_H
#define _UAPI_KVD_EDU_H

#include <linux/ioctl.h>
#include <linux/types.h>

#include "kvd_importer.h"

#define KVD_EDU_PATH			"/dev/kvd_edu"

/* qemu 7.2's edu aborts the VM on a DMA of its whole 4 KiB buffer. */
#define KVD_EDU_MAX_ACCESS		2048
#define KVD_EDU_PROBE_LEN		64
/* What the engine's buffer holds before each read into it. */
#define KVD_EDU_POISON			0xee

/**
 * struct kvd_edu_info - KVD_EDU_IOCTL_INFO argument (all out)
 * @translated: the edu device's DMA goes through an IOMMU paging domain
 * @strict: that domain invalidates the IOTLB at each unmap (no flush queue)
 * @dma_mask_bits: the DMA mask the driver set (the edu's 28 bits)
 * @pci_slot: bus:device.function of the edu device
 * @dmas: DMA transfers the engine has done since the module loaded
 */
struct kvd_edu_info {
	__u32 translated;
	__u32 strict;
	__u32 dma_mask_bits;
	__u32 pad;
	char pci_slot[16];
	__u64 dmas;
};

/**
 * struct kvd_edu_probe - KVD_EDU_IOCTL_PROBE argument
 * @handle: in: an import
 * @pad: must be 0
 * @dma_addr: out: the address read: the first DMA address of the import's
 *	most recent mapping, whether or not that mapping still exists
 * @data: out: the KVD_EDU_PROBE_LEN bytes the engine read there (its
 *	buffer is filled with KVD_EDU_POISON first)
 *
 * A negative control: after the mapping is gone, a DMA to its old
 * address must fault in the IOMMU (a DMAR report in the kernel log)
 * instead of reading the old pages.
 * Errors: -EINVAL (pad), -ENOENT (no such import), -ENODATA (never
 * mapped), -ETIMEDOUT (the engine did not finish).
 */
struct kvd_edu_probe {
	__u32 handle;
	__u32 pad;
	__u64 dma_addr;
	__u8 data[KVD_EDU_PROBE_LEN];
};

#define KVD_EDU_IOCTL_INFO	_IOR(KVD_IMP_IOCTL_MAGIC, 32, struct kvd_edu_info)
#define KVD_EDU_IOCTL_PROBE	_IOWR(KVD_IMP_IOCTL_MAGIC, 33, struct kvd_edu_probe)

#endif /* _UAPI_KVD_EDU_H */
