/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * kvd_exporter - test-only *dynamic* dma-buf exporter (pin/unpin) whose
 * buffer its exporter can move or revoke: stands in for amdgpu/xe VRAM
 * (eviction, device reset, unplug) and, with KVD_EXP_CREATE_NOPAGES, for
 * CUDA BAR1 memory (tables of DMA addresses without struct pages, handed
 * only to peer2peer importers: others get -EOPNOTSUPP at attach).
 *
 * Every ioctl but CREATE names the buffer by its dma-buf fd.
 */
#ifndef _UAPI_KVD_EXPORTER_H
#define _UAPI_KVD_EXPORTER_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define KVD_EXPORTER_PATH		"/dev/kvd_exporter"

#define KVD_EXP_CREATE_NOPAGES		(1U << 0)
/*
 * With NOPAGES only: mark every DMA segment as a bus address
 * (sg_dma_mark_bus_address(), as PCI peer-to-peer through a switch is
 * marked). -EOPNOTSUPP on kernels without sg dma_flags
 * (CONFIG_NEED_SG_DMA_FLAGS, 6.2+).
 */
#define KVD_EXP_CREATE_BUS_ADDR		(1U << 1)
/*
 * Every map sleeps @slow_ms of struct kvd_exp_create first: an exporter
 * whose map is slow (amdgpu migrating a buffer into place).
 */
#define KVD_EXP_CREATE_SLOW_MAP		(1U << 2)
/* Every unmap sleeps @slow_ms first (an exporter evicting). */
#define KVD_EXP_CREATE_SLOW_UNMAP	(1U << 5)
#define KVD_EXP_SLOW_MAX_MS		10000
/*
 * The last unpin moves the buffer (TTM may evict what nobody pins any
 * more), notifying every attachment, the unpinning one too.
 */
#define KVD_EXP_CREATE_MOVE_ON_UNPIN	(1U << 6)
/* Every pin fails with -EBUSY: memory the exporter cannot place now. */
#define KVD_EXP_CREATE_PIN_BUSY		(1U << 7)
/*
 * REVOKE then waits, as vfio-pci's revoke does, until every importer has
 * unmapped, at most KVD_EXP_REVOKE_WAIT_MS: -ETIMEDOUT if maps remain.
 */
#define KVD_EXP_CREATE_REVOKE_WAITS	(1U << 8)
#define KVD_EXP_REVOKE_WAIT_MS		2000
/*
 * A pin while another attachment maps the buffer revokes it first (as
 * a device reset between two importers' attaches would) and fails with
 * -ENODEV: the second importer of a proxy attaches after the exporter's
 * move notification reached the first one's mapped attachment, every time.
 */
#define KVD_EXP_CREATE_REVOKE_ON_PIN	(1U << 9)
/*
 * REVOKE, after telling the importers, waits as an exporter of Linux 7.1+
 * does before it reuses the memory (dma_buf_invalidate_mappings(): past
 * the wait nobody writes to it), as vfio-pci's revoke does: for every
 * fence on its resv (DMA_RESV_USAGE_BOOKKEEP), with the resv held and no
 * bound of its own (interruptible: a test's timeout kills it). The old
 * pages are poisoned after the wait.
 */
#define KVD_EXP_CREATE_REVOKE_FENCED	(1U << 10)
/*
 * Linux 7.1+ only (-EOPNOTSUPP at CREATE before): attach admits only
 * attachments that give their mapping up on an invalidation
 * (dma_buf_attach_revocable()), -EOPNOTSUPP for the others, as vfio-pci.
 */
#define KVD_EXP_CREATE_REVOCABLE_ONLY	(1U << 11)
/*
 * The first pin moves the buffer before it pins it (new pages, a copy,
 * a move notification to every attachment, the pinning one included, the
 * old pages poisoned), as amdgpu_dma_buf_pin() migrating VRAM to GTT and
 * xe migrating before a pin do on Debian's 6.1 and 6.12.
 */
#define KVD_EXP_CREATE_MOVE_ON_PIN	(1U << 3)
/*
 * Moves copy asynchronously, as a GPU's copy engine does: the buffer
 * switches to new (zeroed) pages at once, a DMA_RESV_USAGE_KERNEL fence
 * on its resv signals when the copy is done, KVD_EXP_ASYNC_MOVE_MS
 * later. An importer that does not wait for that fence reads zeros.
 */
#define KVD_EXP_CREATE_ASYNC_MOVE	(1U << 4)
#define KVD_EXP_ASYNC_MOVE_MS		500

/**
 * struct kvd_exp_create - KVD_EXP_IOCTL_CREATE argument
 * @size: in: bytes, multiple of the page size, at most 64 MiB
 * @flags: in: KVD_EXP_CREATE_NOPAGES (optionally with
 *	KVD_EXP_CREATE_BUS_ADDR), KVD_EXP_CREATE_SLOW_MAP,
 *	KVD_EXP_CREATE_SLOW_UNMAP, KVD_EXP_CREATE_MOVE_ON_PIN,
 *	KVD_EXP_CREATE_MOVE_ON_UNPIN, KVD_EXP_CREATE_ASYNC_MOVE,
 *	KVD_EXP_CREATE_PIN_BUSY, KVD_EXP_CREATE_REVOKE_WAITS,
 *	KVD_EXP_CREATE_REVOKE_ON_PIN, KVD_EXP_CREATE_REVOKE_FENCED,
 *	KVD_EXP_CREATE_REVOCABLE_ONLY, or 0
 * @fd: out: the dma-buf fd (O_CLOEXEC)
 * @slow_ms: in: with KVD_EXP_CREATE_SLOW_MAP or KVD_EXP_CREATE_SLOW_UNMAP,
 *	how long each map or unmap sleeps, 1 to KVD_EXP_SLOW_MAX_MS; else 0
 * @pad: must be 0
 */
struct kvd_exp_create {
	__u64 size;
	__u32 flags;
	__u32 fd;
	__u32 slow_ms;
	__u32 pad;
};

/**
 * struct kvd_exp_fill - KVD_EXP_IOCTL_FILL argument
 * @fd: in: the dma-buf fd
 * @seed: in: fills the current pages with 32-bit words
 *	seed * 2654435761 + index (pattern_fill() of the tests)
 */
struct kvd_exp_fill {
	__u32 fd;
	__u32 seed;
};

#define KVD_EXP_MAX_DEVS		8
#define KVD_EXP_DEVNAME_LEN		32

/**
 * struct kvd_exp_info - KVD_EXP_IOCTL_INFO argument
 * @fd: in: the dma-buf fd
 * @attachments: out: live attachments
 * @pins: out: pins held
 * @live_maps: out: mappings not yet unmapped
 * @moves: out: moves made
 * @revoked: out: 1 once revoked
 * @pad: 0
 * @maps: out: mappings made so far
 * @dev_maps: out: mappings made so far, per device in @dev_names
 * @dev_names: out: devices mappings were made for (first KVD_EXP_MAX_DEVS)
 */
struct kvd_exp_info {
	__u32 fd;
	__u32 attachments;
	__u32 pins;
	__u32 live_maps;
	__u32 moves;
	__u32 revoked;
	__u64 maps;
	__u64 dev_maps[KVD_EXP_MAX_DEVS];
	char dev_names[KVD_EXP_MAX_DEVS][KVD_EXP_DEVNAME_LEN];
};

#define KVD_EXP_IOCTL_MAGIC		0xDD
#define KVD_EXP_IOCTL_CREATE	_IOWR(KVD_EXP_IOCTL_MAGIC, 1, struct kvd_exp_create)
#define KVD_EXP_IOCTL_FILL	_IOW(KVD_EXP_IOCTL_MAGIC, 2, struct kvd_exp_fill)
/*
 * MOVE (arg: __u32 dma-buf fd): new pages with a copy of the contents;
 * under the resv the buffer switches to them and the importers get a move
 * notification; the old pages are then poisoned (0xde bytes) and kept
 * until release. Done whatever the pins (a reset or a revocable exporter
 * does not ask).
 * REVOKE (same arg): under the resv, marked revoked, importers notified,
 * pages poisoned; every later map fails with -ENODEV.
 */
#define KVD_EXP_IOCTL_MOVE	_IOW(KVD_EXP_IOCTL_MAGIC, 3, __u32)
#define KVD_EXP_IOCTL_REVOKE	_IOW(KVD_EXP_IOCTL_MAGIC, 4, __u32)
#define KVD_EXP_IOCTL_INFO	_IOWR(KVD_EXP_IOCTL_MAGIC, 5, struct kvd_exp_info)

#endif /* _UAPI_KVD_EXPORTER_H */
