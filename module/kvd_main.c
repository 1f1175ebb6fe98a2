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
 *   inside the dma-buf helpers) -> proxy resv (dmabuf->resv)
 *   -> backing resv (only inside vmap and vunmap of the proxy, and a
 *   layout's first map, kvd_slot_map(): kvd_compose.c).
 * A backing's resv is never held while a proxy's is taken (the proxy's
 * resv has a lockdep class of its own for that one nesting), and
 * proxy->lock is never taken under the proxy's resv. proxy->lock serialises the ioctls and the
 * attach/detach callbacks; the proxy's resv protects what the map path
 * reads (state, current backing, per attachment slot) and the counters
 * the map/pin path writes. Waits for importers (revoke, replace) are made
 * with no lock held, so that the attach/detach callbacks, which run inside
 * MR registration, deregistration and process exit, never wait behind
 * them; debugfs only trylocks a proxy under kvd_proxies_lock.
 *
 * Device permissions are root-only (0600); module/README.md says how to
 * grant a group access.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/device.h>
#include <linux/module.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>

#include "kvd.h"

unsigned int kvd_max_proxies = 1024;
module_param_named(max_proxies, kvd_max_proxies, uint, 0644);
MODULE_PARM_DESC(max_proxies,
		 "Maximum number of live proxies per open device fd (default: 1024)");

unsigned int kvd_max_proxies_total = 65536;
module_param_named(max_proxies_total, kvd_max_proxies_total, uint, 0644);
MODULE_PARM_DESC(max_proxies_total,
		 "Maximum number of live proxies of all device fds together (default: 65536)");

unsigned int kvd_max_proxies_per_uid = 16384;
module_param_named(max_proxies_per_uid, kvd_max_proxies_per_uid, uint, 0644);
MODULE_PARM_DESC(max_proxies_per_uid,
		 "Maximum number of live proxies created by one user (effective uid), over all device fds (default: 16384)");

/*
 * Pieces of a RANGES layout per block (kvd_compose.c). Fewer than the
 * default only to test: every batch of a few ranges then crosses blocks
 * (the debug lane loads the module with 3).
 */
unsigned int kvd_layout_block_pieces = KVD_LAYOUT_BLOCK_MAX;
module_param_named(layout_block_pieces, kvd_layout_block_pieces, uint, 0444);
MODULE_PARM_DESC(layout_block_pieces,
		 "Pieces of a ranges layout per block, 2 to 64, fewer only to test (default: 64)");

DEFINE_MUTEX(kvd_proxies_lock);
LIST_HEAD(kvd_proxies);
atomic64_t kvd_next_id = ATOMIC64_INIT(0);
atomic_t kvd_nr_proxies = ATOMIC_INIT(0);
atomic_t kvd_nr_backings = ATOMIC_INIT(0);
atomic_t kvd_nr_slots = ATOMIC_INIT(0);

/* Live proxies per creator's uid (in the initial namespace); kvd_proxies_lock. */
static DEFINE_XARRAY(kvd_uid_proxies);

/**
 * kvd_uid_get() - count one more live proxy of @uid
 * @uid: the creator's effective uid
 *
 * Context: kvd_proxies_lock held.
 *
 * Return: 0, -ENOSPC at kvd_max_proxies_per_uid, or -ENOMEM.
 */
int kvd_uid_get(kuid_t uid)
{
	unsigned long key = from_kuid(&init_user_ns, uid);
	unsigned long n = xa_to_value(xa_load(&kvd_uid_proxies, key));

	lockdep_assert_held(&kvd_proxies_lock);
	if (n >= READ_ONCE(kvd_max_proxies_per_uid))
		return -ENOSPC;
	return xa_err(xa_store(&kvd_uid_proxies, key, xa_mk_value(n + 1),
			       GFP_KERNEL));
}

/**
 * kvd_uid_put() - count one live proxy of @uid less
 * @uid: the creator's effective uid, as given to kvd_uid_get()
 *
 * Undoes kvd_uid_get(): at the proxy's release, or when its creation
 * fails. The last one erases @uid's entry.
 *
 * Context: kvd_proxies_lock held.
 */
void kvd_uid_put(kuid_t uid)
{
	unsigned long key = from_kuid(&init_user_ns, uid);
	unsigned long n = xa_to_value(xa_load(&kvd_uid_proxies, key));

	lockdep_assert_held(&kvd_proxies_lock);
	if (WARN_ON_ONCE(!n))
		return;
	if (n == 1)
		xa_erase(&kvd_uid_proxies, key);
	else	/* an entry that exists: no allocation */
		xa_store(&kvd_uid_proxies, key, xa_mk_value(n - 1), GFP_KERNEL);
}

/*
 * The proxies' invalidation and reap work. Its own queue, not system_wq:
 * a reap calls exporters' unmaps, which may take seconds, and the
 * invalidation work opens the fence an exporter's revoke waits on
 * (kvd_stale.c), so it must run under memory pressure too. Per CPU, as
 * system_wq: the work runs where the exporter's notification came.
 */
struct workqueue_struct *kvd_wq;

static int __init kvd_init(void)
{
	int ret;

	if (kvd_layout_block_pieces < 2 ||
	    kvd_layout_block_pieces > KVD_LAYOUT_BLOCK_MAX) {
		pr_err("layout_block_pieces=%u: 2 to %u\n",
		       kvd_layout_block_pieces, KVD_LAYOUT_BLOCK_MAX);
		return -EINVAL;
	}
	kvd_wq = alloc_workqueue("kvdmabuf", WQ_MEM_RECLAIM | KVD_WQ_PERCPU, 0);
	if (!kvd_wq)
		return -ENOMEM;
	ret = misc_register(&kvd_misc);
	if (ret) {
		destroy_workqueue(kvd_wq);
		return ret;
	}
	kvd_debugfs_init();
	return 0;
}

/* No proxy is left (each holds a module reference), so no work either. */
static void __exit kvd_exit(void)
{
	kvd_debugfs_exit();
	misc_deregister(&kvd_misc);
	destroy_workqueue(kvd_wq);
	WARN_ON_ONCE(!xa_empty(&kvd_uid_proxies));
	xa_destroy(&kvd_uid_proxies);
}

module_init(kvd_init);
module_exit(kvd_exit);

MODULE_DESCRIPTION("Proxy dma-bufs with a revocable, replaceable backing");
MODULE_LICENSE("GPL");
KVD_IMPORT_NS_DMA_BUF();
