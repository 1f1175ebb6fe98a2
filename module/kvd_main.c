// SPDX-License-Identifier: GPL-2.0
/*
 * kvdmabuf - proxy dma-bufs with a revocable, replaceable backing.
 *
 * A proxy is a dynamic dma-buf exporter (it implements pin/unpin, so the
 * core never caches an importer's mapping). For every importer attachment
 * of the proxy the module holds its own attachment to the current backing
 * (a slot: dynamic, peer-to-peer, pinned while mapped, kvd_backing.c),
 * made with the importer's device and mapped outside the proxy's
 * reservation lock. map_dma_buf (called with the proxy's reservation lock
 * held) hands each importer map a fresh table holding only DMA addresses
 * and lengths of the slice [offset, offset + length) of that backing map.
 *
 * Locking:
 *   kvd_proxies_lock -> proxy->lock -> (backing resv, taken and released
 *   inside the dma-buf helpers) -> proxy resv (dmabuf->resv).
 * Two reservation locks are never nested and proxy->lock is never taken
 * under the proxy's resv. proxy->lock serialises the ioctls and the
 * attach/detach callbacks; the proxy's resv protects what the map path
 * reads (state, current backing, per attachment slot) and the counters
 * the map/pin path writes. Waits for importers (revoke, replace) are made
 * with no lock held, so that the attach/detach callbacks, which run inside
 * MR registration, deregistration and process exit, never wait behind
 * them; debugfs only trylocks a proxy under kvd_proxies_lock.
 *
 * Device permissions are root-only (0600). To grant a group access, an
 * admin installs a udev rule such as
 *   KERNEL=="kvdmabuf", SUBSYSTEM=="misc", GROUP="kvdmabuf", MODE="0660"
 * in /etc/udev/rules.d/70-kvdmabuf.rules.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt


#include <linux/device.h>
#include <linux/module.h>

#include "kvd.h"

unsigned int max_proxies = 1024;
module_param(max_proxies, uint, 0644);
MODULE_PARM_DESC(max_proxies,
		 "Maximum number of live proxies per open device fd (default: 1024)");

unsigned int max_proxies_total = 65536;
module_param(max_proxies_total, uint, 0644);
MODULE_PARM_DESC(max_proxies_total,
		 "Maximum number of live proxies of all device fds together (default: 65536)");

/* Does the running kernel's dma-buf core pin around a dynamic map? */
bool kvd_core_pins_on_map = KVD_CORE_PINS_ON_MAP;

DEFINE_MUTEX(kvd_proxies_lock);
LIST_HEAD(kvd_proxies);
atomic64_t kvd_next_id = ATOMIC64_INIT(0);
atomic_t kvd_nr_proxies = ATOMIC_INIT(0);
atomic_t kvd_nr_backings = ATOMIC_INIT(0);
atomic_t kvd_nr_slots = ATOMIC_INIT(0);

/*
 * Find out whether the running kernel's dma-buf core pins a dynamic
 * exporter around each map of a dynamic importer (CONFIG_DMABUF_MOVE_NOTIFY
 * unset, before the 7.1 revoke series): map a throw-away dynamic dma-buf
 * once from a dynamic attachment and see whether pin was called. The map
 * fails on purpose, so no memory or DMA is involved.
 */
static bool kvd_probe_pinned;

static int kvd_probe_pin(struct dma_buf_attachment *attach)
{
	kvd_probe_pinned = true;
	return 0;
}

static void kvd_probe_unpin(struct dma_buf_attachment *attach)
{
}

static struct sg_table *kvd_probe_map(struct dma_buf_attachment *attach,
				      enum dma_data_direction dir)
{
	return ERR_PTR(-ENODEV);
}

static void kvd_probe_unmap(struct dma_buf_attachment *attach,
			    struct sg_table *sgt, enum dma_data_direction dir)
{
}

static void kvd_probe_release(struct dma_buf *dmabuf)
{
}

static const struct dma_buf_ops kvd_probe_ops = {
	.pin = kvd_probe_pin,
	.unpin = kvd_probe_unpin,
	.map_dma_buf = kvd_probe_map,
	.unmap_dma_buf = kvd_probe_unmap,
	.release = kvd_probe_release,
};

static void kvd_probe_notify(struct dma_buf_attachment *attach)
{
}

static const struct dma_buf_attach_ops kvd_probe_attach_ops = {
	.allow_peer2peer = true,
	.KVD_IMPORTER_NOTIFY_OP = kvd_probe_notify,
};

/* Falls back to what the build's configuration says if the probe fails. */
static void kvd_probe_core(struct device *dev)
{
	DEFINE_DMA_BUF_EXPORT_INFO(exp_info);
	struct dma_buf_attachment *attach;
	struct dma_buf *dmabuf;
	struct sg_table *sgt;

	exp_info.ops = &kvd_probe_ops;
	exp_info.priv = &kvd_probe_pinned;	/* must not be NULL */
	exp_info.size = PAGE_SIZE;
	exp_info.flags = O_RDWR;
	dmabuf = dma_buf_export(&exp_info);
	if (IS_ERR(dmabuf))
		return;
	attach = dma_buf_dynamic_attach(dmabuf, dev, &kvd_probe_attach_ops,
					NULL);
	if (!IS_ERR(attach)) {
		dma_resv_lock(dmabuf->resv, NULL);
		sgt = dma_buf_map_attachment(attach, DMA_BIDIRECTIONAL);
		dma_resv_unlock(dmabuf->resv);
		if (!IS_ERR_OR_NULL(sgt)) {
			/* Not ours: leave the build's answer. */
			dma_resv_lock(dmabuf->resv, NULL);
			dma_buf_unmap_attachment(attach, sgt, DMA_BIDIRECTIONAL);
			dma_resv_unlock(dmabuf->resv);
		} else {
			kvd_core_pins_on_map = kvd_probe_pinned;
		}
		dma_buf_detach(dmabuf, attach);
	}
	dma_buf_put(dmabuf);
}

static int __init kvd_init(void)
{
	struct device *probe_dev;
	int ret;

	/*
	 * Before the device node exists: no proxy is ever made under the
	 * build's guess. The probe needs a device to attach with, any will do.
	 */
	probe_dev = root_device_register("kvdmabuf_probe");
	if (!IS_ERR(probe_dev)) {
		kvd_probe_core(probe_dev);
		root_device_unregister(probe_dev);
	}
	pr_debug("dma-buf core %s dynamic exporters around a map\n",
		 kvd_core_pins_on_map ? "pins" : "does not pin");
	ret = misc_register(&kvd_misc);
	if (ret)
		return ret;
	kvd_debugfs_init();
	return 0;
}

static void __exit kvd_exit(void)
{
	kvd_debugfs_exit();
	misc_deregister(&kvd_misc);
}

module_init(kvd_init);
module_exit(kvd_exit);

MODULE_DESCRIPTION("Proxy dma-bufs with a revocable, replaceable backing");
MODULE_LICENSE("GPL");
KVD_IMPORT_NS_DMA_BUF();
