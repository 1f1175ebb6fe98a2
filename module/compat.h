/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kvdmabuf: shims over kernel API differences, keyed on the KVD_HAVE_*
 * flags that module/Kbuild derives from the headers being built against.
 * Also used by the test importer under tests/kmod/.
 */
#ifndef _KVD_COMPAT_H
#define _KVD_COMPAT_H

#include <linux/dma-buf.h>
#include <linux/module.h>
#include <linux/scatterlist.h>

/*
 * Namespace import: MODULE_IMPORT_NS(DMA_BUF) up to 6.12, a string literal
 * from 6.13. Both expand to MODULE_INFO(import_ns, "DMA_BUF").
 */
#ifdef KVD_HAVE_IMPORT_NS_STRING
#define KVD_IMPORT_NS_DMA_BUF() MODULE_IMPORT_NS("DMA_BUF")
#else
#define KVD_IMPORT_NS_DMA_BUF() MODULE_IMPORT_NS(DMA_BUF)
#endif

/*
 * Mapping a static attachment without holding its reservation lock.
 * Before the _unlocked helpers existed, dma_buf_map_attachment() took the
 * lock itself where it was needed.
 */
#ifdef KVD_HAVE_MAP_UNLOCKED
#define kvd_map_attachment_unlocked	dma_buf_map_attachment_unlocked
#define kvd_unmap_attachment_unlocked	dma_buf_unmap_attachment_unlocked
#else
#define kvd_map_attachment_unlocked	dma_buf_map_attachment
#define kvd_unmap_attachment_unlocked	dma_buf_unmap_attachment
#endif

/*
 * The importer callback that tells of a moved or revoked buffer:
 * move_notify, renamed invalidate_mappings by the dma-buf revoke series,
 * and the exporter's call that fires it, dma_buf_move_notify() renamed
 * dma_buf_invalidate_mappings(). Probed separately (Kbuild.probes).
 */
#ifdef KVD_HAVE_INVALIDATE_MAPPINGS
#define KVD_IMPORTER_NOTIFY_OP		invalidate_mappings
#else
#define KVD_IMPORTER_NOTIFY_OP		move_notify
#endif
#ifdef KVD_HAVE_DMA_BUF_INVALIDATE_MAPPINGS
#define kvd_dma_buf_notify(dmabuf)	dma_buf_invalidate_mappings(dmabuf)
#else
#define kvd_dma_buf_notify(dmabuf)	dma_buf_move_notify(dmabuf)
#endif

/* Is an attachment dynamic? Private to dma-buf.c since the revoke series. */
#ifndef KVD_HAVE_ATTACHMENT_IS_DYNAMIC
static inline bool
dma_buf_attachment_is_dynamic(struct dma_buf_attachment *attach)
{
	return !!attach->importer_ops;
}
#endif

/*
 * Does the core pin a dynamic exporter around each map of a dynamic
 * importer? Never after the revoke series; before it, unless
 * CONFIG_DMABUF_MOVE_NOTIFY is set (an option that is gone reads as unset
 * here, so KVD_HAVE_NO_PIN_ON_DYNAMIC_MAP decides for such kernels).
 */
#ifdef KVD_HAVE_NO_PIN_ON_DYNAMIC_MAP
#define KVD_CORE_PINS_ON_MAP		0
#else
#define KVD_CORE_PINS_ON_MAP		(!IS_ENABLED(CONFIG_DMABUF_MOVE_NOTIFY))
#endif

/*
 * dma_buf_attach_revocable(): does an importer give its mapping up on an
 * invalidation (the revoke series' test for pinned importers)? Before the
 * series, an importer with the notify callback is the only such importer.
 */
#ifdef KVD_HAVE_ATTACH_REVOCABLE
#define kvd_attach_revocable(attach)	dma_buf_attach_revocable(attach)
#else
static inline bool kvd_attach_revocable(struct dma_buf_attachment *attach)
{
	return attach->importer_ops && attach->importer_ops->KVD_IMPORTER_NOTIFY_OP;
}
#endif

/*
 * Is a pin of this importer revocable, i.e. may the exporter take the
 * mapping away for good with an invalidation (the importer unmaps and
 * unpins in its callback, as ib_umem_dmabuf_revoke_locked() does for
 * irdma)? Only since the revoke series: before it, a pinned importer's
 * move_notify (ib_umem_dmabuf_get_pinned()'s) only logs an error, and
 * nothing tells it from one that revokes (Debian's 6.12 has ib_core's
 * revocable umems without dma_buf_attach_revocable()): every pin blocks.
 */
#ifdef KVD_HAVE_ATTACH_REVOCABLE
#define kvd_pin_revocable(attach)	dma_buf_attach_revocable(attach)
#else
#define kvd_pin_revocable(attach)	false
#endif

/*
 * Carry the bus-address mark of a DMA segment (PCI peer-to-peer through a
 * switch: no IOMMU mapping behind the address) from @src to @dst. Kernels
 * without sg dma_flags have no such mark.
 */
#if defined(KVD_HAVE_SG_DMA_IS_BUS_ADDRESS)
#define kvd_sg_is_bus_address(sg)	sg_dma_is_bus_address(sg)
#elif defined(KVD_HAVE_SG_IS_DMA_BUS_ADDRESS)
#define kvd_sg_is_bus_address(sg)	sg_is_dma_bus_address(sg)
#else
#define kvd_sg_is_bus_address(sg)	false
#endif

/* Can this kernel mark a DMA segment as a bus address at all? */
#if (defined(KVD_HAVE_SG_DMA_IS_BUS_ADDRESS) || \
     defined(KVD_HAVE_SG_IS_DMA_BUS_ADDRESS)) && \
	defined(CONFIG_NEED_SG_DMA_FLAGS)
#define KVD_SG_BUS_ADDRESS_MARKS	1
#else
#define KVD_SG_BUS_ADDRESS_MARKS	0
#endif

static inline void kvd_sg_copy_bus_address(struct scatterlist *dst,
					   struct scatterlist *src)
{
#if defined(KVD_HAVE_SG_DMA_IS_BUS_ADDRESS) || \
	defined(KVD_HAVE_SG_IS_DMA_BUS_ADDRESS)
	if (kvd_sg_is_bus_address(src))
		sg_dma_mark_bus_address(dst);
#endif
}

/* A per-CPU work queue: the default before WQ_PERCPU existed. */
#ifdef KVD_HAVE_WQ_PERCPU
#define KVD_WQ_PERCPU			WQ_PERCPU
#else
#define KVD_WQ_PERCPU			0
#endif

#endif /* _KVD_COMPAT_H */
