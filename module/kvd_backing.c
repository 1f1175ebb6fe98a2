// SPDX-License-Identifier: GPL-2.0
/*
 * Backings and their slots: the dma-bufs a proxy forwards to, and the
 * module's own attachment to each of them per importer attachment. Built
 * with no lock of ours held (an exporter's attach, pin and map may take
 * long), published and retired under proxy->lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/scatterlist.h>
#include <linux/slab.h>

#include "kvd.h"

/* Bytes of DMA address space a mapping covers. */
static u64 kvd_sgt_dma_len(struct sg_table *sgt)
{
	struct scatterlist *sg;
	unsigned int i;
	u64 len = 0;

	for_each_sgtable_dma_sg(sgt, sg, i)
		len += sg_dma_len(sg);
	return len;
}

/*
 * The backing's exporter moved or revoked it (device reset, unplug, a
 * revocable exporter): called with the backing's resv held, so only note
 * it and let a work item revoke the proxy under proxy->lock.
 */
static void kvd_backing_notify(struct dma_buf_attachment *bat)
{
	struct kvd_slot *slot = bat->importer_priv;

	dma_resv_assert_held(bat->dmabuf->resv);
	if (slot->dying)
		return;		/* our own unpin let it move: nothing to follow */
	/*
	 * Not mapped yet: this slot's own pin or map moved the buffer (amdgpu
	 * and xe migrate VRAM when pinned) and the map to come is of the new
	 * place. Nothing was handed out, so nothing went stale. A layout
	 * moves only when a piece's backing did, mapped or not.
	 */
	if (!slot->bsgt && !slot->layout)
		return;
	/* The exporter waits on this before it reuses the memory. */
	kvd_gate_close(slot->b);
	WRITE_ONCE(slot->b->invalidated, true);
	queue_work(kvd_wq, &slot->proxy->inval_work);
}

static const struct dma_buf_attach_ops kvd_backing_attach_ops = {
	.allow_peer2peer = true,
	.KVD_IMPORTER_NOTIFY_OP = kvd_backing_notify,
};

#ifdef KVD_HAVE_ATTACH_REVOCABLE
/*
 * Since Linux 7.1 an exporter that revokes (vfio-pci) admits only
 * attachments that give their mapping up in bounded time
 * (dma_buf_attach_revocable()), and its revoke waits for them without a
 * bound. The slot of a proxy importer that cannot (a pin without an
 * invalidation callback: efa, bnxt_re, mana) keeps its map for as long as
 * that importer likes, so it says so: such an exporter refuses it (the
 * importer's attach fails), and no revoke ever waits for it.
 */
static const struct dma_buf_attach_ops kvd_backing_pinned_attach_ops = {
	.allow_peer2peer = true,
};
#endif

static const struct dma_buf_attach_ops *
kvd_slot_attach_ops(struct kvd_attach *ka)
{
#ifdef KVD_HAVE_ATTACH_REVOCABLE
	if (!ka->notified)
		return &kvd_backing_pinned_attach_ops;
#endif
	return &kvd_backing_attach_ops;
}

/**
 * kvd_wait_kernel_fences() - wait for the exporter's moves and clears
 * @resv: the resv of a backing (or of a layout's source), not held
 *
 * Waits, bounded and interruptible, for the fences of the exporter's own
 * memory management on a backing (DMA_RESV_USAGE_KERNEL), with its resv
 * not held (the exporter's other users go on meanwhile). A pinned buffer
 * is not moved again, so once after mapping a slot is enough.
 *
 * Context: may sleep up to KVD_BACKING_FENCE_MS.
 *
 * Return: 0; -ETIMEDOUT after KVD_BACKING_FENCE_MS; -EINTR on a signal;
 * or another error a fence's wait returned.
 */
int kvd_wait_kernel_fences(struct dma_resv *resv)
{
	long left;

	left = dma_resv_wait_timeout(resv, DMA_RESV_USAGE_KERNEL, true,
				     msecs_to_jiffies(KVD_BACKING_FENCE_MS));
	if (left == -ERESTARTSYS)
		return -EINTR;
	if (left < 0)
		return left;
	return left ? 0 : -ETIMEDOUT;
}

/**
 * kvd_slot_create() - the module's attachment to a backing for an importer
 * @proxy: the proxy (its lock not held)
 * @b: the backing
 * @ka: the importer attachment the slot stands for (referenced by it)
 *
 * The exporter's attach, pin and map, which may take long (amdgpu
 * migrates the buffer), so called with no lock of ours held. The slot is
 * not yet on b->slots.
 *
 * Return: the slot, or an ERR_PTR: the exporter's error, -ERANGE (it maps
 * less than offset + length), -ETIMEDOUT or -EINTR (its move fence).
 */
struct kvd_slot *kvd_slot_create(struct kvd_proxy *proxy,
				 struct kvd_backing *b,
				 struct kvd_attach *ka)
{
	struct dma_resv *bresv = b->dmabuf->resv;
	struct kvd_slot *slot;
	struct sg_table *sgt;
	u64 len;
	int ret;

	lockdep_assert_not_held(&proxy->lock);
	slot = kzalloc(sizeof(*slot), GFP_KERNEL_ACCOUNT);
	if (!slot)
		return ERR_PTR(-ENOMEM);

	slot->b = b;
	slot->ka = ka;
	slot->proxy = proxy;
	INIT_LIST_HEAD(&slot->lent_node);
	/* before attach: its move notifications are real from there on */
	slot->layout = kvd_is_layout(b->dmabuf);
	/*
	 * Dynamic and p2p: a static attachment would make exporters such as
	 * amdgpu or xe migrate the buffer to system memory and pin it there,
	 * and would never hear of the backing being moved or revoked.
	 */
	slot->bat = dma_buf_dynamic_attach(b->dmabuf, ka->dev,
					   kvd_slot_attach_ops(ka), slot);
	if (IS_ERR(slot->bat)) {
		ret = PTR_ERR(slot->bat);
		goto err_free;
	}
	/*
	 * Pinned while the module maps it (importers map the proxy at any
	 * time from the module's table). Only the backing's resv is taken
	 * here, never inside or around the proxy's.
	 */
	dma_resv_lock(bresv, NULL);
	ret = dma_buf_pin(slot->bat);
	if (ret)
		goto err_unlock;
	if (slot->layout) {
		/*
		 * A layout (RANGES) maps its pieces' backings now, where the
		 * call can still fail whole, and builds its table of the whole
		 * proxy at the importer's first map (kvd_slot_map()): a batch
		 * costs what it changes, not the pieces it keeps. It has no
		 * move fences, and its length is the proxy's.
		 */
		ret = kvd_layout_prepare(slot->bat);
		if (ret)
			goto err_unpin;
		dma_resv_unlock(bresv);
		slot->whole = true;
		goto out;
	}
	sgt = dma_buf_map_attachment(slot->bat, DMA_BIDIRECTIONAL);
	if (IS_ERR_OR_NULL(sgt)) {
		ret = sgt ? PTR_ERR(sgt) : -EIO;
		goto err_unpin;
	}
	/* From here on a move notification is about what we hold. */
	slot->bsgt = sgt;
	dma_resv_unlock(bresv);
	/*
	 * The exporter's moves and clears (its pin may just have migrated
	 * the buffer) are fenced with DMA_RESV_USAGE_KERNEL, which only
	 * dynamic importers of the backing are told to wait for: the proxy's
	 * importers wait on the proxy's resv, which never carries them. So
	 * nobody gets this table before the contents are in place.
	 */
	ret = kvd_wait_kernel_fences(bresv);
	if (ret)
		goto err_relock;
	/* An exporter may map less than its size: refuse it now, not at a fault. */
	len = kvd_sgt_dma_len(slot->bsgt);
	if (len < b->offset + proxy->length) {
		ret = -ERANGE;
		goto err_relock;
	}
	slot->whole = !b->offset && len == proxy->length;
out:
	kref_get(&ka->ref);
	atomic_inc(&kvd_nr_slots);
	return slot;

	/* Each step below marks the slot dying: what it undoes may move it. */
err_relock:
	dma_resv_lock(bresv, NULL);
	slot->dying = true;
	dma_buf_unmap_attachment(slot->bat, slot->bsgt, DMA_BIDIRECTIONAL);
err_unpin:
	slot->dying = true;
	dma_buf_unpin(slot->bat);
err_unlock:
	slot->dying = true;
	dma_resv_unlock(bresv);
	dma_buf_detach(b->dmabuf, slot->bat);
err_free:
	kfree(slot);
	return ERR_PTR(ret);
}

/**
 * kvd_slot_map() - a slot's table, for an importer's map
 * @slot: the slot (the proxy's resv held)
 *
 * A layout's slot builds it at the first map (the layout's resv nests
 * inside the proxy's, as for vmap); any other slot has it already.
 *
 * Return: 0, or the layout's error: -ENOMEM, -ENODEV (a piece's backing
 * was moved or revoked since the call).
 */
int kvd_slot_map(struct kvd_slot *slot)
{
	struct dma_resv *bresv = slot->b->dmabuf->resv;
	struct sg_table *sgt;

	if (slot->bsgt)
		return 0;
	dma_resv_lock(bresv, NULL);
	sgt = dma_buf_map_attachment(slot->bat, DMA_BIDIRECTIONAL);
	if (!IS_ERR_OR_NULL(sgt))
		slot->bsgt = sgt;
	dma_resv_unlock(bresv);
	if (!sgt)
		return -EIO;
	return PTR_ERR_OR_ZERO(sgt);
}

/**
 * kvd_slot_destroy() - undo kvd_slot_create()
 * @slot: a slot off b->slots, no importer map lent from it (no lock held)
 */
void kvd_slot_destroy(struct kvd_slot *slot)
{
	struct kvd_backing *b = slot->b;
	struct dma_resv *bresv = b->dmabuf->resv;

	/* the importer unmaps before detach */
	WARN_ON_ONCE(!list_empty(&slot->lent_node));
	dma_resv_lock(bresv, NULL);
	slot->dying = true;
	if (slot->bsgt)
		dma_buf_unmap_attachment(slot->bat, slot->bsgt,
					 DMA_BIDIRECTIONAL);
	dma_buf_unpin(slot->bat);
	dma_resv_unlock(bresv);
	dma_buf_detach(b->dmabuf, slot->bat);
	kvd_attach_put(slot->ka);
	kfree(slot);
	atomic_dec(&kvd_nr_slots);
}

/**
 * kvd_slot_bury() - take a slot off its backing, for kvd_bury()
 * @slot: a slot on b->slots (proxy->lock held, unless its backing is not
 *	published yet)
 * @dead: the caller's list of slots to destroy
 *
 * Teardown calls the exporter (unmap, unpin, detach, maybe its release),
 * which may take long: under proxy->lock slots and backings are only put
 * on a caller's @dead list, and kvd_bury() destroys them with no lock of
 * ours held. A buried slot holds a reference to its backing.
 */
void kvd_slot_bury(struct kvd_slot *slot, struct list_head *dead)
{
	kref_get(&slot->b->ref);
	list_move_tail(&slot->node, dead);
}

/**
 * kvd_backing_bury() - the proxy lets go of a backing
 * @b: a backing off every list of the proxy (proxy->lock held, unless @b
 *	was never published)
 * @dead: where its slots go, for kvd_bury()
 *
 * Removes the callback on its importers' fences (kvd_backing_stale()),
 * buries its slots and drops the proxy's reference: each buried slot
 * holds one of its own.
 */
void kvd_backing_bury(struct kvd_backing *b, struct list_head *dead)
{
	struct kvd_slot *slot, *tmp;

	/* Returns once a callback already running has finished. */
	if (!IS_ERR_OR_NULL(b->fences))
		dma_fence_remove_callback(b->fences, &b->fences_cb);

	list_for_each_entry_safe(slot, tmp, &b->slots, node)
		kvd_slot_bury(slot, dead);
	kvd_backing_put(b);
}

/**
 * kvd_bury() - destroy buried slots
 * @dead: slots kvd_slot_bury() put there; empty on return
 *
 * Each slot's teardown calls the exporter (kvd_slot_destroy()), then drops
 * the slot's reference to its backing, maybe the last one.
 *
 * Context: no lock of ours held: the exporter may take long. Takes each
 * backing's resv.
 */
void kvd_bury(struct list_head *dead)
{
	struct kvd_slot *slot, *tmp;
	struct kvd_backing *b;

	list_for_each_entry_safe(slot, tmp, dead, node) {
		list_del(&slot->node);
		b = slot->b;
		kvd_slot_destroy(slot);
		kvd_backing_put(b);
	}
}

/**
 * kvd_count_p2p() - the attachments of @b that are dynamic and peer-to-peer
 * @b: a backing of the proxy (proxy->lock held)
 *
 * All of them: kvd_slot_create() makes no other kind. For QUERY.
 *
 * Return: how many of @b's slots are attached dynamic and peer-to-peer.
 */
unsigned int kvd_count_p2p(struct kvd_backing *b)
{
	struct kvd_slot *slot;
	unsigned int n = 0;

	list_for_each_entry(slot, &b->slots, node)
		if (dma_buf_attachment_is_dynamic(slot->bat) &&
		    slot->bat->peer2peer)
			n++;
	return n;
}

/**
 * kvd_slot_find() - the slot of an importer attachment in a backing
 * @b: the backing (proxy->lock held, unless @b is not published yet)
 * @ka: the importer attachment
 *
 * Return: @ka's slot on b->slots, or NULL if it has none there.
 */
struct kvd_slot *kvd_slot_find(struct kvd_backing *b,
			       struct kvd_attach *ka)
{
	struct kvd_slot *slot;

	list_for_each_entry(slot, &b->slots, node)
		if (slot->ka == ka)
			return slot;
	return NULL;
}

static void kvd_backing_free(struct kref *ref)
{
	struct kvd_backing *b = container_of(ref, struct kvd_backing, ref);

	WARN_ON_ONCE(!list_empty(&b->slots));
	if (!IS_ERR_OR_NULL(b->fences))
		dma_fence_put(b->fences);
	/* Nothing of ours maps it any more. */
	kvd_gate_open(b);
	if (b->gate)
		dma_fence_put(b->gate);
	dma_buf_put(b->dmabuf);
	kfree(b);
	atomic_dec(&kvd_nr_backings);
}

/**
 * kvd_backing_put() - drop a reference to a backing
 * @b: the backing
 *
 * The proxy holds one while @b is current or stale, each buried slot one,
 * and whoever builds a slot for @b with no lock held one. The last put
 * opens its gate (nothing of ours maps it any more), drops its fences and
 * puts the backing dma-buf, whose file the kernel releases later (fput()):
 * a caller may hold proxy->lock.
 */
void kvd_backing_put(struct kvd_backing *b)
{
	kref_put(&b->ref, kvd_backing_free);
}

/**
 * kvd_bury_later() - have reap_work destroy buried slots
 * @proxy: the proxy (its lock held)
 * @dead: slots kvd_slot_bury() put there; moved to proxy->graveyard
 *
 * For a caller that must not wait for the exporter (QUERY, and a detach
 * for the stale backings of other importers): reap_work destroys them.
 */
void kvd_bury_later(struct kvd_proxy *proxy, struct list_head *dead)
{
	lockdep_assert_held(&proxy->lock);
	if (list_empty(dead))
		return;
	list_splice_tail_init(dead, &proxy->graveyard);
	queue_work(kvd_wq, &proxy->reap_work);
}

/**
 * kvd_backing_alloc() - a new backing, not yet published
 * @dmabuf: the backing dma-buf; its reference passes to the backing
 * @offset: where the proxy's window starts in it
 *
 * Return: the backing (one reference), or NULL without memory.
 */
struct kvd_backing *kvd_backing_alloc(struct dma_buf *dmabuf,
				      u64 offset)
{
	struct kvd_backing *b;

	b = kzalloc(sizeof(*b), GFP_KERNEL_ACCOUNT);
	if (!b)
		return NULL;
	kref_init(&b->ref);
	INIT_LIST_HEAD(&b->slots);
	INIT_LIST_HEAD(&b->node);
	b->dmabuf = dmabuf;
	b->offset = offset;
	atomic_inc(&kvd_nr_backings);
	return b;
}

/*
 * Does importer attachment @ka still need a slot in @b (proxy->lock held)?
 * Not if it has one, nor if it never maps DMA tables (CPU access only),
 * nor if a revoke took its pinned map for good (it never maps again: a
 * slot would pin the backing for nothing).
 */
static bool kvd_slot_wanted(struct kvd_backing *b, struct kvd_attach *ka)
{
	return ka->dma && !ka->revoked && !kvd_slot_find(b, ka);
}

/**
 * kvd_backing_build() - slots in a new backing for the proxy's importers
 * @proxy: the proxy (its lock not held)
 * @b: the backing, not yet published
 * @dead: where the slots of importers that detach meanwhile go
 *
 * Gives @b a slot for every importer attachment of the proxy but those
 * revoked for good, calling the exporter with proxy->lock dropped;
 * importers that attach meanwhile get theirs in the next round, the slots
 * of those that detach go onto @dead (for kvd_bury() once the lock is
 * dropped).
 *
 * Return: 0 with proxy->lock held and a slot in @b for every attachment
 * that wants one, or -errno (kvd_slot_create()'s, -ENOMEM) with it
 * dropped.
 */
int kvd_backing_build(struct kvd_proxy *proxy, struct kvd_backing *b,
		      struct list_head *dead)
{
	struct kvd_attach *few[4];	/* a proxy has an importer or two */
	struct kvd_slot *slot, *tmp;
	struct kvd_attach *ka, **todo;
	unsigned int n, i;
	int ret;

	mutex_lock(&proxy->lock);
	for (;;) {
		list_for_each_entry_safe(slot, tmp, &b->slots, node)
			if (slot->ka->detached)
				kvd_slot_bury(slot, dead);
		n = 0;
		list_for_each_entry(ka, &proxy->attachments, node)
			if (kvd_slot_wanted(b, ka))
				n++;
		if (!n)
			return 0;
		todo = n <= ARRAY_SIZE(few) ? few :
		       kcalloc(n, sizeof(*todo), GFP_KERNEL);
		if (!todo) {
			mutex_unlock(&proxy->lock);
			return -ENOMEM;
		}
		i = 0;
		list_for_each_entry(ka, &proxy->attachments, node) {
			if (kvd_slot_wanted(b, ka)) {
				kref_get(&ka->ref);
				todo[i++] = ka;
			}
		}
		mutex_unlock(&proxy->lock);
		kvd_bury(dead);

		/* Only this thread sees b->slots until b is published. */
		ret = 0;
		for (i = 0; i < n; i++) {
			/* One that detached meanwhile needs no slot. */
			if (!ret && !READ_ONCE(todo[i]->detached)) {
				slot = kvd_slot_create(proxy, b, todo[i]);
				if (IS_ERR(slot))
					ret = PTR_ERR(slot);
				else
					list_add_tail(&slot->node, &b->slots);
			}
			kvd_attach_put(todo[i]);
		}
		if (todo != few)
			kfree(todo);
		if (ret)
			return ret;
		mutex_lock(&proxy->lock);
	}
}
