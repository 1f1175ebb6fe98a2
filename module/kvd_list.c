// SPDX-License-Identifier: GPL-2.0
/*
 * What every proxy is doing: the LIST ioctl (per-uid, for `kvdmabuf
 * status`) and debugfs (kvdmabuf/proxies, kvdmabuf/stats). Both only
 * trylock a proxy while they hold the global list.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cred.h>
#include <linux/debugfs.h>
#include <linux/pid.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "kvd.h"

static struct dentry *kvd_debugfs;

static const char *kvd_state_name(u32 state)
{
	switch (state) {
	case KVDMABUF_STATE_UNBACKED:
		return "unbacked";
	case KVDMABUF_STATE_BACKED:
		return "backed";
	case KVDMABUF_STATE_REVOKED:
		return "revoked";
	default:
		return "released";
	}
}

/* A snapshot of @proxy for LIST; false when it is busy (only trylocked:
 * a listing never waits behind a proxy while holding the global list). */
static bool kvd_stat(struct kvd_proxy *proxy, struct kvdmabuf_proxy_stat *st)
{
	struct kvd_backing *b;
	struct kvd_importer_counts c;

	st->id = proxy->id;
	st->length = proxy->length;
	/* As the caller's namespaces see them (0 or the overflow uid). */
	st->owner_pid = pid_vnr(proxy->owner_pid);
	st->owner_uid = from_kuid_munged(current_user_ns(), proxy->owner_uid);
	if (!mutex_trylock(&proxy->lock)) {
		st->flags = KVDMABUF_STAT_BUSY;
		return false;
	}
	list_for_each_entry(b, &proxy->stale, node)
		st->stale_backings++;
	if (!dma_resv_trylock(proxy->dmabuf->resv)) {
		mutex_unlock(&proxy->lock);
		st->stale_backings = 0;
		st->flags = KVDMABUF_STAT_BUSY;
		return false;
	}
	st->state = proxy->state;
	st->generation = proxy->generation;
	st->revoke_reason = proxy->revoke_reason;
	st->live_mappings = proxy->live_maps;
	kvd_count_importers(proxy, &c);
	st->pinned_importers = c.pinned;
	st->dynamic_importers = c.dynamic;
	st->revocable_importers = c.revocable;
	st->revocable_pins = c.revocable_pins;
	dma_resv_unlock(proxy->dmabuf->resv);
	mutex_unlock(&proxy->lock);
	return true;
}

/**
 * kvd_ioctl_list() - LIST: a snapshot of the proxies the caller may see
 * @uarg: the caller's struct kvdmabuf_list
 *
 * CAP_SYS_ADMIN sees every proxy, others those their effective uid
 * created. Up to the given count of entries, each truncated or
 * zero-extended to the caller's stat_size; a busy proxy comes with
 * KVDMABUF_STAT_BUSY, its id, length and owner only. The count comes back
 * as the number of proxies the caller may see, which may be more than the
 * entries written.
 *
 * Context: takes kvd_proxies_lock, interruptible; only trylocks a proxy
 * and its resv.
 *
 * Return: 0; kvd_copy_in()'s errors; -EINVAL (flags, reserved or a
 * stat_size below the first version's); -E2BIG (a stat_size over a page);
 * -ENOMEM; -EINTR; -EFAULT.
 */
long kvd_ioctl_list(void __user *uarg)
{
	struct kvdmabuf_proxy_stat *stats;
	struct kvdmabuf_list arg;
	struct kvd_proxy *proxy;
	bool all = capable(CAP_SYS_ADMIN);
	kuid_t me = current_euid();
	u32 usize, n = 0, room, i;
	u8 __user *dst;
	int ret;

	ret = kvd_copy_in(&arg, sizeof(arg), KVDMABUF_LIST_SIZE_VER0, uarg,
			  &usize);
	if (ret)
		return ret;
	if (arg.flags || arg.reserved ||
	    arg.stat_size < KVDMABUF_PROXY_STAT_SIZE_VER0)
		return -EINVAL;
	if (arg.stat_size > PAGE_SIZE)
		return -E2BIG;
	room = min_t(u32, arg.count, atomic_read(&kvd_nr_proxies));
	stats = kvcalloc(room ?: 1, sizeof(*stats), GFP_KERNEL);
	if (!stats)
		return -ENOMEM;
	if (mutex_lock_interruptible(&kvd_proxies_lock)) {
		kvfree(stats);
		return -EINTR;
	}
	list_for_each_entry(proxy, &kvd_proxies, global) {
		if (!all && !uid_eq(proxy->owner_uid, me))
			continue;
		if (n < room)
			kvd_stat(proxy, &stats[n]);
		n++;
	}
	mutex_unlock(&kvd_proxies_lock);

	/* each entry with the caller's size: truncated, or zero-extended */
	dst = u64_to_user_ptr(arg.stats);
	for (i = 0; i < min(n, room); i++, dst += arg.stat_size) {
		if (copy_to_user(dst, &stats[i], min_t(size_t, sizeof(*stats),
							arg.stat_size)) ||
		    (arg.stat_size > sizeof(*stats) &&
		     clear_user(dst + sizeof(*stats),
				arg.stat_size - sizeof(*stats)))) {
			kvfree(stats);
			return -EFAULT;
		}
	}
	kvfree(stats);
	arg.count = n;
	return kvd_copy_out(uarg, &arg, sizeof(arg), usize);
}

/* ---- debugfs ---- */

static int kvd_proxies_show(struct seq_file *m, void *unused)
{
	struct kvd_proxy *proxy;
	struct kvd_backing *b;
	unsigned int nstale;

	seq_puts(m, "id length state generation offset importers live_maps notifications stale_backings\n");
	mutex_lock(&kvd_proxies_lock);
	list_for_each_entry(proxy, &kvd_proxies, global) {
		/*
		 * Never wait for a proxy while holding the list lock, which
		 * every proxy's release takes: a busy proxy is shown as such.
		 */
		if (!mutex_trylock(&proxy->lock)) {
			seq_printf(m, "%llu %llu busy\n", proxy->id,
				   proxy->length);
			continue;
		}
		nstale = 0;
		list_for_each_entry(b, &proxy->stale, node)
			nstale++;
		seq_printf(m, "%llu %llu %s %llu %llu %u %u %llu %u\n",
			   proxy->id, proxy->length,
			   kvd_state_name(proxy->state), proxy->generation,
			   proxy->backing ? proxy->backing->offset : 0,
			   kvd_count(&proxy->attachments),
			   READ_ONCE(proxy->live_maps), proxy->notifications,
			   nstale);
		mutex_unlock(&proxy->lock);
	}
	mutex_unlock(&kvd_proxies_lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(kvd_proxies);

static int kvd_stats_show(struct seq_file *m, void *unused)
{
	seq_printf(m, "proxies %d\n", atomic_read(&kvd_nr_proxies));
	seq_printf(m, "backings %d\n", atomic_read(&kvd_nr_backings));
	seq_printf(m, "backing_attachments %d\n", atomic_read(&kvd_nr_slots));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(kvd_stats);

/**
 * kvd_debugfs_init() - create kvdmabuf/proxies and kvdmabuf/stats in debugfs
 *
 * At module load. Errors are not checked, as debugfs wants: it is
 * optional, and a debugfs call given the error of a failed one does
 * nothing.
 */
void kvd_debugfs_init(void)
{
	kvd_debugfs = debugfs_create_dir("kvdmabuf", NULL);
	debugfs_create_file("proxies", 0400, kvd_debugfs, NULL,
			    &kvd_proxies_fops);
	debugfs_create_file("stats", 0400, kvd_debugfs, NULL, &kvd_stats_fops);
}

/**
 * kvd_debugfs_exit() - remove the module's debugfs files
 *
 * At module unload; a no-op if kvd_debugfs_init() failed.
 */
void kvd_debugfs_exit(void)
{
	debugfs_remove_recursive(kvd_debugfs);
}
