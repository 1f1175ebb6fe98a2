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
 * which also drops CONFIG_DMABUF_MOVE_NOTIFY and the pin taken around the
 * map of a dynamic importer.
 */
#ifdef KVD_HAVE_INVALIDATE_MAPPINGS
#define KVD_IMPORTER_NOTIFY_OP		invalidate_mappings
#define kvd_dma_buf_notify(dmabuf)	dma_buf_invalidate_mappings(dmabuf)
#define KVD_CORE_PINS_ON_MAP		0
#else
#define KVD_IMPORTER_NOTIFY_OP		move_notify
#define kvd_dma_buf_notify(dmabuf)	dma_buf_move_notify(dmabuf)
/*
 * Without CONFIG_DMABUF_MOVE_NOTIFY the core calls the exporter's pin
 * before every map of a dynamic importer and unpin after the unmap.
 */
#define KVD_CORE_PINS_ON_MAP		(!IS_ENABLED(CONFIG_DMABUF_MOVE_NOTIFY))
#endif

#endif /* _KVD_COMPAT_H */
