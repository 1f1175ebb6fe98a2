// SPDX-License-Identifier: GPL-2.0
/*
 * The proxy's dma_buf_ops: what importers call. Each importer attachment
 * that maps DMA tables has a slot in the current backing; map hands it a
 * table of DMA addresses of that slot's mapping, lent or copied. vmap
 * hands out the current backing's CPU mapping.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/scatterlist.h>
#include <linux/slab.h>

#include "kvd.h"

static void kvd_attach_free(struct kref *ref)
{
	struct kvd_attach *ka = container_of(ref, struct kvd_attach, ref);

	put_device(ka->dev);
	kfree(ka);
}

/**
 * kvd_attach_put() - drop a reference to an importer attachment's state
 * @ka: the importer attachment (attach->priv)
 *
 * The proxy's attachment list holds one until the detach, each slot one
 * (a slot built with no lock held outlives a concurrent detach), and
 * kvd_backing_build() one while it builds a slot for @ka. The last put
 * drops the importer's device and frees @ka.
 */
void kvd_attach_put(struct kvd_attach *ka)
{
	kref_put(&ka->ref, kvd_attach_free);
}

/**
 * kvd_attach_pins() - the explicit pins of an importer attachment
 * @ka: the importer attachment (the proxy's resv held)
 *
 * Explicit pins (dma_buf_pin()) of an importer attachment, those the core
 * takes around a map left out. A pin of a revocable importer
 * (dma_buf_attach_revocable(), Linux 7.1+) does not block a revoke: the
 * revoke's invalidation takes the mapping away for good and the importer
 * unpins. It still blocks a replace: a pinned importer never maps again,
 * so it could not follow the new backing.
 *
 * Return: @ka's pins, less one per live map where the core pins around
 * each map (KVD_CORE_PINS_ON_MAP).
 */
unsigned int kvd_attach_pins(struct kvd_attach *ka)
{
	return ka->pins - (KVD_CORE_PINS_ON_MAP ? ka->maps : 0);
}

/**
 * kvd_attach_blocking() - the pins of @ka that refuse a revoke
 * @ka: the importer attachment (the proxy's resv held)
 *
 * Return: kvd_attach_pins() of an importer that is not revocable, else 0.
 */
unsigned int kvd_attach_blocking(struct kvd_attach *ka)
{
	return ka->revocable ? 0 : kvd_attach_pins(ka);
}

/**
 * kvd_attach_revocable_pins() - the pins of @ka that a revoke takes away
 * @ka: the importer attachment (the proxy's resv held)
 *
 * Return: kvd_attach_pins() of a revocable importer, else 0.
 */
unsigned int kvd_attach_revocable_pins(struct kvd_attach *ka)
{
	return ka->revocable ? kvd_attach_pins(ka) : 0;
}

/* @count summed over the proxy's importer attachments. */
static unsigned int kvd_sum_pins(struct kvd_proxy *proxy,
				 unsigned int (*count)(struct kvd_attach *ka))
{
	struct kvd_attach *ka;
	unsigned int n = 0;

	/* the list changes under proxy->lock, the pins under the resv */
	lockdep_assert_held(&proxy->lock);
	dma_resv_assert_held(proxy->dmabuf->resv);
	list_for_each_entry(ka, &proxy->attachments, node)
		n += count(ka);
	return n;
}

/**
 * kvd_blocking_pins() - pins that make a revoke fail with -EBUSY
 * @proxy: the proxy (its lock and its resv held)
 *
 * Without any, a CPU mapping an importer keeps still refuses it
 * (kvd_refusing_pins()).
 *
 * Return: kvd_attach_blocking() summed over the proxy's importer
 * attachments.
 */
unsigned int kvd_blocking_pins(struct kvd_proxy *proxy)
{
	return kvd_sum_pins(proxy, kvd_attach_blocking);
}

/**
 * kvd_count_importers() - count the importers as QUERY and LIST show them
 * @proxy: the proxy (its lock and its resv held)
 * @c: out: the counts, zeroed first
 *
 * An importer attachment holding a pin is a pinned importer, else a
 * dynamic one. A revocable importer whose pinned map a revoke took is
 * still a pinned importer (it never maps again: its MR is dead until
 * registered anew), not a dynamic one, although it holds no pin any more.
 * The revocable importers are the pinned ones without a blocking pin.
 */
void kvd_count_importers(struct kvd_proxy *proxy,
			 struct kvd_importer_counts *c)
{
	struct kvd_attach *ka;

	lockdep_assert_held(&proxy->lock);
	dma_resv_assert_held(proxy->dmabuf->resv);
	memset(c, 0, sizeof(*c));
	list_for_each_entry(ka, &proxy->attachments, node) {
		unsigned int n = kvd_attach_blocking(ka);
		unsigned int r = kvd_attach_revocable_pins(ka);

		if (n || r || ka->revoked)
			c->pinned++;
		else
			c->dynamic++;
		if (!n && (r || ka->revoked))
			c->revocable++;
		c->blocking_pins += n;
		c->revocable_pins += r;
	}
}

/**
 * kvd_all_pins() - pins that make an attach or a replace fail with -EBUSY
 * @proxy: the proxy (its lock and its resv held)
 *
 * All of them, revocable ones too: a pinned importer never maps again, so
 * it could not follow the new backing.
 *
 * Return: kvd_attach_pins() summed over the proxy's importer attachments.
 */
unsigned int kvd_all_pins(struct kvd_proxy *proxy)
{
	return kvd_sum_pins(proxy, kvd_attach_pins);
}

static int kvd_attach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct kvd_proxy *proxy = dmabuf->priv;
	struct kvd_backing *b;
	struct kvd_attach *ka;
	struct kvd_slot *slot;
	LIST_HEAD(dead);
	int ret;

	/*
	 * A static importer is never told of a change, and may neither
	 * take the proxy's tables (below) nor keep its CPU mapping.
	 */
	if (!attach->importer_ops) {
		pr_debug("proxy %llu: refusing static importer %s\n",
			 proxy->id, dev_name(attach->dev));
		return -EOPNOTSUPP;
	}
	ka = kzalloc(sizeof(*ka), GFP_KERNEL_ACCOUNT);
	if (!ka)
		return -ENOMEM;
	/*
	 * Importer tables are DMA addresses of memory that may be a device's
	 * (CUDA, VRAM): only peer-to-peer capable importers can take them.
	 * Others may still attach for CPU access (vmap, a software NIC): no
	 * slot is made for them, their map fails.
	 */
	ka->dma = attach->peer2peer;
	kref_init(&ka->ref);
	INIT_LIST_HEAD(&ka->lent);
	/*
	 * A backing build may still use it after the importer detached and
	 * its driver went away: each slot holds @ka, @ka holds the device.
	 */
	ka->dev = get_device(attach->dev);
	/*
	 * Since Linux 7.1 an importer may come without an invalidation
	 * callback: it is never told of a revoke or replace. It may attach
	 * and pin (ib_umem_dmabuf_get_pinned() does so), but map refuses it
	 * unless it holds a pin (which keeps the backing where it is).
	 */
	ka->notified = attach->importer_ops &&
		       attach->importer_ops->KVD_IMPORTER_NOTIFY_OP;
	ka->revocable = kvd_pin_revocable(attach);

	/*
	 * A slot in the current backing, built with proxy->lock dropped (the
	 * exporter may take long); if the backing changed meanwhile, again
	 * for the new one. Not yet on dmabuf->attachments: nothing maps it.
	 */
	mutex_lock(&proxy->lock);
	while (ka->dma && (b = proxy->backing)) {
		kref_get(&b->ref);
		mutex_unlock(&proxy->lock);
		slot = kvd_slot_create(proxy, b, ka);
		mutex_lock(&proxy->lock);
		if (proxy->backing == b) {
			kvd_backing_put(b);
			/*
			 * Its exporter revoked it: after we looked (a pin or
			 * map of a revoked buffer fails) and the work that
			 * revokes the proxy has not run yet, or while nothing
			 * of ours was attached to hear it (no importer), when
			 * the exporter says so with -ENODEV. Revoke it here,
			 * as the work would, and attach to the revoked proxy,
			 * as a moment later.
			 */
			if (PTR_ERR_OR_ZERO(slot) == -ENODEV)
				WRITE_ONCE(b->invalidated, true);
			if (IS_ERR(slot) && kvd_revoke_invalidated(proxy, &dead))
				continue;
			if (IS_ERR(slot)) {
				ret = PTR_ERR(slot);
				goto err_unlock;
			}
			list_add_tail(&slot->node, &b->slots);
			ka->cur = slot;
			break;
		}
		/* Changed meanwhile: undo it unlocked, then the new one. */
		mutex_unlock(&proxy->lock);
		if (!IS_ERR(slot))
			kvd_slot_destroy(slot);
		kvd_backing_put(b);
		mutex_lock(&proxy->lock);
	}
	list_add_tail(&ka->node, &proxy->attachments);
	attach->priv = ka;
	mutex_unlock(&proxy->lock);
	kvd_bury(&dead);
	pr_debug("proxy %llu: importer %s attached\n", proxy->id,
		 dev_name(attach->dev));
	return 0;

err_unlock:
	mutex_unlock(&proxy->lock);
	kvd_bury(&dead);
	kvd_attach_put(ka);
	return ret;
}

static void kvd_detach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct kvd_proxy *proxy = dmabuf->priv;
	struct kvd_attach *ka = attach->priv;
	struct kvd_backing *b;
	struct kvd_slot *slot;
	LIST_HEAD(reaped);
	LIST_HEAD(dead);

	mutex_lock(&proxy->lock);
	list_del(&ka->node);
	/* A backing being built drops its slot for @ka when it sees this. */
	WRITE_ONCE(ka->detached, true);
	if (proxy->backing) {
		slot = kvd_slot_find(proxy->backing, ka);
		if (slot)
			kvd_slot_bury(slot, &dead);
	}
	list_for_each_entry(b, &proxy->stale, node) {
		slot = kvd_slot_find(b, ka);
		if (slot)
			kvd_slot_bury(slot, &dead);
	}
	/* Others' stale backings: for the reap work, not for this detach. */
	kvd_reap(proxy, &reaped);
	kvd_bury_later(proxy, &reaped);
	mutex_unlock(&proxy->lock);
	kvd_bury(&dead);
	WARN_ON_ONCE(ka->maps || ka->pins);
	pr_debug("proxy %llu: importer %s detached\n", proxy->id,
		 dev_name(attach->dev));
	kvd_attach_put(ka);
}

static int kvd_pin(struct dma_buf_attachment *attach)
{
	struct kvd_proxy *proxy = attach->dmabuf->priv;
	struct kvd_attach *ka = attach->priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (proxy->state != KVDMABUF_STATE_BACKED)
		return -ENODEV;
	/*
	 * CPU access only: importers ask with a pin before they vmap (the
	 * core warns on a failed vmap); a backing without vmap cannot serve.
	 */
	if (!ka->dma && !proxy->backing->dmabuf->ops->vmap)
		return -EOPNOTSUPP;
	ka->pins++;
	return 0;
}

static void kvd_unpin(struct dma_buf_attachment *attach)
{
	struct kvd_attach *ka = attach->priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (!WARN_ON_ONCE(!ka->pins))
		ka->pins--;
}

/*
 * The table an importer's map gets for @slot: the slot's own, lent as it
 * is, when the proxy's window is all of it and no other map of this
 * attachment holds it. Each attachment has its own slot, hence its own
 * table, mapped for its own device; it goes back to the exporter only
 * after the importer returned it (stale backings wait for live maps).
 * A copy costs an allocation and two walks of the table per map, that is
 * per wake and importer (about as much as the importer's own map, see
 * docs/bench.md), which is why the common case lends.
 */
static struct sg_table *kvd_map_lend(struct kvd_attach *ka,
				     struct kvd_slot *slot)
{
	if (!slot->whole || !list_empty(&slot->lent_node))
		return NULL;
	list_add(&slot->lent_node, &ka->lent);
	return slot->bsgt;
}

/**
 * kvd_sg_window_find() - where a window of a DMA table lies
 * @sgt: a DMA table: a backing's, or a layout source's
 * @start: the offset of the window's first byte in the table
 * @len: the window's length in bytes
 * @w: filled in: the entry holding @start, the bytes of it before @start,
 *	and the number of segments the window takes
 *
 * A window [@start, @start + @len) of a backing's DMA table, for a proxy
 * at an offset of its backing and for a layout's pieces; the segments are
 * then copied with kvd_sg_window_copy() while @sgt lives.
 *
 * Return: 0, or -ERANGE where the exporter mapped less than @start + @len.
 */
int kvd_sg_window_find(struct sg_table *sgt, u64 start, u64 len,
		       struct kvd_win *w)
{
	u64 pos = 0, end = start + len;
	struct scatterlist *sg;
	unsigned int i;

	*w = (struct kvd_win){ 0 };
	for_each_sgtable_dma_sg(sgt, sg, i) {
		if (max(pos, start) < min(pos + sg_dma_len(sg), end)) {
			if (!w->sg) {
				w->sg = sg;
				w->skip = start - pos;
			}
			w->nents++;
		}
		pos += sg_dma_len(sg);
		if (pos >= end)
			return 0;
	}
	return -ERANGE;
}

/**
 * kvd_sg_window_copy() - copy a window of a DMA table
 * @dsg: where the segments go, with room for @w->nents of them
 * @w: the window, as kvd_sg_window_find() found it
 * @len: the window's length in bytes, as given to kvd_sg_window_find()
 *
 * Each segment's DMA address and length, cut to the window, and its
 * bus-address mark; no struct page.
 *
 * Return: the entry after the segments copied (NULL after the last entry
 * of @dsg's table), where the next window goes.
 */
struct scatterlist *kvd_sg_window_copy(struct scatterlist *dsg,
				       const struct kvd_win *w, u64 len)
{
	struct scatterlist *sg = w->sg;
	u64 skip = w->skip, n;

	for (;;) {
		n = min_t(u64, sg_dma_len(sg) - skip, len);
		if (n) {
			sg_dma_address(dsg) = sg_dma_address(sg) + skip;
			sg_dma_len(dsg) = n;
			kvd_sg_copy_bus_address(dsg, sg);
			dsg = sg_next(dsg);
			len -= n;
		}
		if (!len)
			return dsg;
		skip = 0;
		sg = sg_next(sg);
	}
}

/*
 * A copy of the proxy's window of the backing's table: DMA addresses,
 * lengths and bus-address marks, no struct page. An importer may edit
 * what it is given in place (ib_umem trims its first and last entry until
 * unmap): a second map of an attachment whose table is lent would copy
 * those edits, so an importer that does that must map an attachment once
 * at a time (ib_umem does).
 */
static struct sg_table *kvd_map_copy(struct kvd_backing *b,
				     struct sg_table *bsgt, u64 length)
{
	struct kvd_map *map;
	struct kvd_win w;
	int ret;

	if (kvd_sg_window_find(bsgt, b->offset, length, &w))
		return ERR_PTR(-EIO);	/* backing map shorter than its size */

	map = kzalloc(sizeof(*map), GFP_KERNEL_ACCOUNT);
	if (!map)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table(&map->sgt, w.nents, GFP_KERNEL);
	if (ret) {
		kfree(map);
		return ERR_PTR(ret);
	}
	kvd_sg_window_copy(map->sgt.sgl, &w, length);
	map->sgt.nents = w.nents;
	map->backing = b;
	return &map->sgt;
}

static struct sg_table *kvd_map_dma_buf(struct dma_buf_attachment *attach,
					enum dma_data_direction dir)
{
	struct kvd_proxy *proxy = attach->dmabuf->priv;
	struct kvd_attach *ka = attach->priv;
	struct kvd_backing *b;
	struct sg_table *sgt;
	int ret;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (!ka->dma)
		return ERR_PTR(-EOPNOTSUPP);	/* no peer2peer: see kvd_attach() */
	/* Never told of a move: only a pin keeps its mapping valid. */
	if (!ka->notified && !kvd_attach_pins(ka))
		return ERR_PTR(-EOPNOTSUPP);
	if (proxy->state != KVDMABUF_STATE_BACKED || !ka->cur)
		return ERR_PTR(-ENODEV);

	b = proxy->backing;
	ret = kvd_slot_map(ka->cur);
	if (ret)
		return ERR_PTR(ret);
	sgt = kvd_map_lend(ka, ka->cur);
	if (!sgt) {
		sgt = kvd_map_copy(b, ka->cur->bsgt, proxy->length);
		if (IS_ERR(sgt))
			return sgt;
	}
	b->live_maps++;
	proxy->live_maps++;
	ka->maps++;
	return sgt;
}

/* The backing @sgt was mapped from: a lent table's slot, or a copy's. */
static struct kvd_backing *kvd_map_return(struct kvd_attach *ka,
					  struct sg_table *sgt)
{
	struct kvd_backing *b;
	struct kvd_slot *slot;
	struct kvd_map *map;

	list_for_each_entry(slot, &ka->lent, lent_node) {
		if (slot->bsgt == sgt) {
			list_del_init(&slot->lent_node);
			return slot->b;
		}
	}
	map = container_of(sgt, struct kvd_map, sgt);
	b = map->backing;
	sg_free_table(&map->sgt);
	kfree(map);
	return b;
}

/* A map of @b (an importer's table or the CPU mapping) went; resv held. */
static void kvd_map_put(struct kvd_proxy *proxy, struct kvd_backing *b)
{
	proxy->live_maps--;
	/* A stale backing may be freed as soon as this reaches zero. */
	WRITE_ONCE(b->live_maps, b->live_maps - 1);
	if (b != proxy->backing) {
		WRITE_ONCE(proxy->stale_maps, proxy->stale_maps - 1);
		if (!proxy->stale_maps)
			wake_up(&proxy->wq);
		queue_work(kvd_wq, &proxy->reap_work);
	}
}

static void kvd_unmap_dma_buf(struct dma_buf_attachment *attach,
			      struct sg_table *sgt,
			      enum dma_data_direction dir)
{
	struct kvd_proxy *proxy = attach->dmabuf->priv;
	struct kvd_attach *ka = attach->priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	ka->maps--;
	kvd_map_put(proxy, kvd_map_return(ka, sgt));
}

/*
 * The proxy's resv nests the backing's (vmap takes it inside): a lockdep
 * class of its own says they are different locks. The module never takes
 * a backing's resv and then a proxy's.
 */
static struct lock_class_key kvd_proxy_resv_key;

/**
 * kvd_proxy_resv_init() - initialise a proxy's resv, in its own lockdep class
 * @proxy: a proxy being created, before dma_buf_export() takes its resv
 *
 * The proxy's resv nests the backing's: see kvd_proxy_resv_key above.
 */
void kvd_proxy_resv_init(struct kvd_proxy *proxy)
{
	dma_resv_init(&proxy->resv);
	lockdep_set_class(&proxy->resv.lock.base, &kvd_proxy_resv_key);
}

#ifdef KVD_HAVE_VMAP_UNLOCKED
/*
 * CPU access (a software NIC): the current backing's own kernel mapping at
 * the proxy's offset, under the proxy's resv (Linux 6.2+), so the backing
 * cannot change meanwhile. The core hands that one mapping to every vmap
 * until the last vunmap: before a change importers give it up from their
 * invalidation callback, and a mapping kept through it refuses REVOKE and
 * REPLACE like a pin (kvd_refusing_pins()). It counts as a live map of
 * its backing.
 */
static int kvd_vmap(struct dma_buf *dmabuf, struct iosys_map *map)
{
	struct kvd_proxy *proxy = dmabuf->priv;
	struct kvd_backing *b = proxy->backing;
	int ret;

	dma_resv_assert_held(dmabuf->resv);
	if (proxy->state != KVDMABUF_STATE_BACKED)
		return -ENODEV;
	if (WARN_ON_ONCE(proxy->vmap_b))
		return -EBUSY;
	ret = dma_buf_vmap_unlocked(b->dmabuf, &proxy->vmap_bmap);
	if (ret)
		return ret;
	*map = proxy->vmap_bmap;
	iosys_map_incr(map, b->offset);
	proxy->vmap_b = b;
	b->live_maps++;
	proxy->live_maps++;
	return 0;
}

static void kvd_vunmap(struct dma_buf *dmabuf, struct iosys_map *map)
{
	struct kvd_proxy *proxy = dmabuf->priv;
	struct kvd_backing *b = proxy->vmap_b;

	dma_resv_assert_held(dmabuf->resv);
	if (WARN_ON_ONCE(!b))
		return;
	dma_buf_vunmap_unlocked(b->dmabuf, &proxy->vmap_bmap);
	iosys_map_clear(&proxy->vmap_bmap);
	proxy->vmap_b = NULL;
	kvd_map_put(proxy, b);
}
#endif

static void kvd_release(struct dma_buf *dmabuf)
{
	struct kvd_proxy *proxy = dmabuf->priv;
	struct kvd_ctx *ctx = proxy->ctx;
	struct kvd_backing *b, *tmp;
	LIST_HEAD(dead);

	mutex_lock(&kvd_proxies_lock);
	list_del(&proxy->global);
	kvd_uid_put(proxy->owner_uid);
	mutex_unlock(&kvd_proxies_lock);

	/*
	 * No attachment is left, so no map. Burying the stale backings
	 * removes their fence callbacks: after that nothing queues reap work.
	 */
	mutex_lock(&proxy->lock);
	if (proxy->backing)
		kvd_backing_bury(proxy->backing, &dead);
	proxy->backing = NULL;
	list_for_each_entry_safe(b, tmp, &proxy->stale, node) {
		list_del(&b->node);
		kvd_backing_bury(b, &dead);
	}
	mutex_unlock(&proxy->lock);
	cancel_work_sync(&proxy->reap_work);
	list_splice_tail_init(&proxy->graveyard, &dead);
	kvd_bury(&dead);
	/* Every backing attachment is gone: no new invalidation can come. */
	cancel_work_sync(&proxy->inval_work);

	pr_debug("proxy %llu: released\n", proxy->id);
	kvd_event(proxy, KVDMABUF_STATE_RELEASED);
	spin_lock(&ctx->lock);
	ctx->nr_proxies--;
	spin_unlock(&ctx->lock);
	kvd_ctx_put(ctx);
	put_pid(proxy->owner_pid);
	mutex_destroy(&proxy->lock);
	dma_resv_fini(&proxy->resv);
	kfree(proxy);
	atomic_dec(&kvd_nr_proxies);
}

const struct dma_buf_ops kvd_dmabuf_ops = {
	.attach = kvd_attach,
	.detach = kvd_detach,
	.pin = kvd_pin,
	.unpin = kvd_unpin,
	.map_dma_buf = kvd_map_dma_buf,
	.unmap_dma_buf = kvd_unmap_dma_buf,
#ifdef KVD_HAVE_VMAP_UNLOCKED
	.vmap = kvd_vmap,
	.vunmap = kvd_vunmap,
#endif
	.release = kvd_release,
};
