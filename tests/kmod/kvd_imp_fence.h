/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Fences of the test importers (KVD_IMP_IOCTL_FENCE): a BOOKKEEP fence on
 * an imported dma-buf's resv, signaled by a delayed work, as a DRM
 * importer tracks its DMA. Each open file of an importer keeps its own
 * (at most KVD_IMP_MAX_FENCES); closing it signals what is left.
 * Included by one .c file per module (KBUILD_MODNAME names the fences).
 */
#ifndef _KVD_IMP_FENCE_H
#define _KVD_IMP_FENCE_H

#include <linux/dma-fence.h>
#include <linux/dma-resv.h>
#include <linux/jiffies.h>
#include <linux/list.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>

#include "kvd_importer.h"

struct kvd_imp_fence_obj {
	struct dma_fence base;		/* first: dma_fence_free() frees all */
	spinlock_t lock;
	struct delayed_work work;
	struct list_head node;		/* kvd_imp_fences.list */
};

/* An open file's fences; under the file's lock. */
struct kvd_imp_fences {
	struct list_head list;
	unsigned int nr;
};

static const char *kvd_imp_fence_name(struct dma_fence *fence)
{
	return KBUILD_MODNAME;
}

static const struct dma_fence_ops kvd_imp_fence_ops = {
	.get_driver_name = kvd_imp_fence_name,
	.get_timeline_name = kvd_imp_fence_name,
};

static void kvd_imp_fence_work(struct work_struct *work)
{
	struct kvd_imp_fence_obj *kf =
		container_of(to_delayed_work(work), struct kvd_imp_fence_obj,
			     work);

	dma_fence_signal(&kf->base);
}

static void kvd_imp_fences_init(struct kvd_imp_fences *fs)
{
	INIT_LIST_HEAD(&fs->list);
	fs->nr = 0;
}

/* Adds a fence to @resv that signals @delay_ms from now. */
static int kvd_imp_fence_add(struct kvd_imp_fences *fs,
			     struct dma_resv *resv, u32 delay_ms)
{
	struct kvd_imp_fence_obj *kf;
	int ret;

	if (fs->nr >= KVD_IMP_MAX_FENCES)
		return -ENOSPC;
	kf = kzalloc(sizeof(*kf), GFP_KERNEL);
	if (!kf)
		return -ENOMEM;
	spin_lock_init(&kf->lock);
	INIT_DELAYED_WORK(&kf->work, kvd_imp_fence_work);
	/* A context of its own: the resv keeps it beside any other fence. */
	dma_fence_init(&kf->base, &kvd_imp_fence_ops, &kf->lock,
		       dma_fence_context_alloc(1), 1);

	ret = dma_resv_lock_interruptible(resv, NULL);
	if (ret)
		goto err_put;
	ret = dma_resv_reserve_fences(resv, 1);
	if (ret) {
		dma_resv_unlock(resv);
		goto err_put;
	}
	dma_resv_add_fence(resv, &kf->base, DMA_RESV_USAGE_BOOKKEEP);
	dma_resv_unlock(resv);

	list_add_tail(&kf->node, &fs->list);
	fs->nr++;
	schedule_delayed_work(&kf->work, msecs_to_jiffies(delay_ms));
	return 0;

err_put:
	/* Never published: signal it so that freeing it is legal. */
	dma_fence_signal(&kf->base);
	dma_fence_put(&kf->base);
	return ret;
}

/* The file is closing: every fence signals now. */
static void kvd_imp_fences_release(struct kvd_imp_fences *fs)
{
	struct kvd_imp_fence_obj *kf, *tmp;

	list_for_each_entry_safe(kf, tmp, &fs->list, node) {
		cancel_delayed_work_sync(&kf->work);
		dma_fence_signal(&kf->base);
		list_del(&kf->node);
		dma_fence_put(&kf->base);
	}
	fs->nr = 0;
}

#endif /* _KVD_IMP_FENCE_H */
