// SPDX-License-Identifier: GPL-2.0
/*
 * kvdmabuf - proxy dma-bufs with a revocable, replaceable backing.
 *
 * A proxy is a dynamic dma-buf exporter (it implements pin/unpin, so the
 * core never caches an importer's mapping). For every importer attachment
 * of the proxy the module holds its own static attachment to the current
 * backing, made with the importer's device and mapped outside the proxy's
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

#include <linux/cred.h>
#include <linux/debugfs.h>
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/kref.h>
#include <linux/limits.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/overflow.h>
#include <linux/poll.h>
#include <linux/scatterlist.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include <kvdmabuf.h>

#include "compat.h"

static unsigned int max_proxies = 1024;
module_param(max_proxies, uint, 0644);
MODULE_PARM_DESC(max_proxies,
		 "Maximum number of live proxies per open device fd (default: 1024)");

static unsigned int max_proxies_total = 65536;
module_param(max_proxies_total, uint, 0644);
MODULE_PARM_DESC(max_proxies_total,
		 "Maximum number of live proxies of all device fds together (default: 65536)");

#define KVD_EVENT_QUEUE		64
#define KVD_MAX_LENGTH		((u64)MAX_LFS_FILESIZE & PAGE_MASK)

/* Does the running kernel's dma-buf core pin around a dynamic map? */
static bool kvd_core_pins_on_map = KVD_CORE_PINS_ON_MAP;

/* One per open of /dev/kvdmabuf; each proxy it created holds a reference. */
struct kvd_ctx {
	struct kref ref;
	spinlock_t lock;		/* all fields below */
	wait_queue_head_t wq;
	struct kvdmabuf_event ev[KVD_EVENT_QUEUE];
	unsigned int head;
	unsigned int count;
	unsigned int nr_proxies;
	bool lost;
	bool closed;
};

/*
 * A backing dma-buf as used by one proxy. Referenced by the proxy while it
 * is current or stale, and by whoever builds a slot for it with no lock
 * held (the exporter's attach, pin and map may take long).
 */
struct kvd_backing {
	struct kref ref;
	struct list_head node;		/* proxy->stale; proxy->lock */
	struct dma_buf *dmabuf;		/* reference held */
	u64 offset;
	struct list_head slots;		/* struct kvd_slot; proxy->lock */
	unsigned int live_maps;		/* importer tables built from it; resv */
	bool invalidated;		/* its exporter sent a move notification */
};

/*
 * The module's attachment to a backing, for one importer attachment: a
 * dynamic, peer-to-peer capable attachment, pinned while mapped.
 */
struct kvd_slot {
	struct list_head node;		/* backing->slots */
	struct kvd_backing *b;
	struct kvd_proxy *proxy;
	struct kvd_attach *ka;		/* reference held */
	struct dma_buf_attachment *bat;
	struct sg_table *bsgt;
	bool dying;			/* unpinning; backing resv */
	bool whole;			/* the proxy's window is all of bsgt */
	struct list_head lent_node;	/* on ka->lent while lent; proxy resv */
};

/*
 * attach->priv of an importer attachment to a proxy. Referenced by the
 * attachment list and by each slot, so that a slot built with no lock held
 * outlives a concurrent detach (which sets @detached).
 */
struct kvd_attach {
	struct kref ref;
	struct list_head node;		/* proxy->attachments; proxy->lock */
	struct device *dev;		/* the importer's device */
	bool detached;			/* proxy->lock */
	struct kvd_slot *cur;		/* proxy->lock + resv to write */
	unsigned int pins;		/* resv */
	unsigned int maps;		/* resv */
	struct list_head lent;		/* slots whose bsgt it maps; resv */
	bool notified;			/* has an invalidation callback */
	bool revocable;			/* its pins give way to a revoke */
};

/*
 * One importer map built as a copy of a window of the backing's table (a
 * proxy narrower than its backing, or a second map of one attachment).
 */
struct kvd_map {
	struct sg_table sgt;
	struct kvd_backing *backing;
};

struct kvd_proxy {
	struct dma_buf *dmabuf;
	struct kvd_ctx *ctx;		/* reference held */
	u64 id;
	u64 length;
	/*
	 * ioctls, attach/detach callbacks; never held across an exporter's
	 * attach, pin or map of a backing, nor across a wait.
	 */
	struct mutex lock;
	struct list_head attachments;	/* struct kvd_attach; lock */
	struct list_head stale;		/* old backings still mapped; lock */
	struct kvd_backing *backing;	/* lock + resv to write */
	u32 state;			/* lock + resv to write */
	u64 generation;			/* lock + resv to write */
	u64 notifications;		/* lock + resv to write */
	unsigned int live_maps;		/* resv */
	unsigned int stale_maps;	/* maps of stale backings; resv to write */
	u32 revoke_reason;		/* KVDMABUF_REVOKE_*; lock + resv */
	struct work_struct inval_work;	/* the backing's exporter invalidated it */
	wait_queue_head_t wq;		/* stale_maps reached zero */
	struct work_struct reap_work;
	struct list_head global;	/* kvd_proxies; kvd_proxies_lock */
	pid_t owner_pid;		/* creator's tgid, for LIST */
	kuid_t owner_uid;		/* creator's euid: who may LIST it */
};

static const struct dma_buf_ops kvd_dmabuf_ops;

static DEFINE_MUTEX(kvd_proxies_lock);
static LIST_HEAD(kvd_proxies);
static atomic64_t kvd_next_id = ATOMIC64_INIT(0);
static atomic_t kvd_nr_proxies = ATOMIC_INIT(0);
static atomic_t kvd_nr_backings = ATOMIC_INIT(0);
static atomic_t kvd_nr_slots = ATOMIC_INIT(0);
static struct dentry *kvd_debugfs;

static unsigned int kvd_count(struct list_head *head)
{
	struct list_head *pos;
	unsigned int n = 0;

	list_for_each(pos, head)
		n++;
	return n;
}

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

/* ---- device fd context and events ---- */

static void kvd_ctx_free(struct kref *ref)
{
	kfree(container_of(ref, struct kvd_ctx, ref));
}

static void kvd_ctx_put(struct kvd_ctx *ctx)
{
	kref_put(&ctx->ref, kvd_ctx_free);
}

static void kvd_event(struct kvd_proxy *proxy, u32 state)
{
	struct kvd_ctx *ctx = proxy->ctx;
	struct kvdmabuf_event *ev;

	spin_lock(&ctx->lock);
	if (ctx->closed) {
		spin_unlock(&ctx->lock);
		return;
	}
	if (ctx->count == KVD_EVENT_QUEUE) {
		ctx->head = (ctx->head + 1) % KVD_EVENT_QUEUE;
		ctx->count--;
		ctx->lost = true;
	}
	ev = &ctx->ev[(ctx->head + ctx->count) % KVD_EVENT_QUEUE];
	memset(ev, 0, sizeof(*ev));
	ev->size = sizeof(*ev);
	ev->type = KVDMABUF_EVENT_STATE;
	ev->id = proxy->id;
	ev->generation = proxy->generation;
	ev->state = state;
	if (ctx->lost) {
		/* Flag the oldest record still queued. */
		ctx->ev[ctx->head].flags |= KVDMABUF_EVENT_FLAG_LOST;
		ctx->lost = false;
	}
	ctx->count++;
	spin_unlock(&ctx->lock);
	/* Most contexts never read events: no wake-up lock per change. */
	if (wq_has_sleeper(&ctx->wq))
		wake_up_interruptible(&ctx->wq);
}

/*
 * Put back at the head of the queue @n records that read() dequeued but
 * could not copy out. Newer events may have filled the queue meanwhile:
 * the oldest records that no longer fit are dropped and the new head
 * carries KVDMABUF_EVENT_FLAG_LOST.
 */
static void kvd_requeue(struct kvd_ctx *ctx, const struct kvdmabuf_event *ev,
			unsigned int n)
{
	bool lost = false, wake;

	spin_lock(&ctx->lock);
	if (ctx->closed) {
		spin_unlock(&ctx->lock);
		return;
	}
	while (n--) {
		if (ctx->count == KVD_EVENT_QUEUE) {
			lost = true;
			break;
		}
		ctx->head = (ctx->head + KVD_EVENT_QUEUE - 1) % KVD_EVENT_QUEUE;
		ctx->ev[ctx->head] = ev[n];
		ctx->count++;
	}
	if (lost)
		ctx->ev[ctx->head].flags |= KVDMABUF_EVENT_FLAG_LOST;
	wake = ctx->count;
	spin_unlock(&ctx->lock);
	if (wake)
		wake_up_interruptible(&ctx->wq);
}

/* ---- backings and slots (proxy->lock held, proxy resv not held) ---- */

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
	WRITE_ONCE(slot->b->invalidated, true);
	schedule_work(&slot->proxy->inval_work);
}

static const struct dma_buf_attach_ops kvd_backing_attach_ops = {
	.allow_peer2peer = true,
	.KVD_IMPORTER_NOTIFY_OP = kvd_backing_notify,
};

static void kvd_attach_free(struct kref *ref)
{
	kfree(container_of(ref, struct kvd_attach, ref));
}

static void kvd_attach_put(struct kvd_attach *ka)
{
	kref_put(&ka->ref, kvd_attach_free);
}

/*
 * The module's attachment to @b for importer attachment @ka: the
 * exporter's attach, pin and map, which may take long (amdgpu migrates
 * the buffer), so called with no lock of ours held. The slot is not yet
 * on b->slots.
 */
static struct kvd_slot *kvd_slot_create(struct kvd_proxy *proxy,
					struct kvd_backing *b,
					struct kvd_attach *ka)
{
	struct dma_resv *bresv = b->dmabuf->resv;
	struct kvd_slot *slot;
	u64 len;
	int ret;

	lockdep_assert_not_held(&proxy->lock);
	slot = kzalloc(sizeof(*slot), GFP_KERNEL);
	if (!slot)
		return ERR_PTR(-ENOMEM);

	slot->b = b;
	slot->ka = ka;
	slot->proxy = proxy;
	INIT_LIST_HEAD(&slot->lent_node);
	/*
	 * Dynamic and p2p: a static attachment would make exporters such as
	 * amdgpu or xe migrate the buffer to system memory and pin it there,
	 * and would never hear of the backing being moved or revoked.
	 */
	slot->bat = dma_buf_dynamic_attach(b->dmabuf, ka->dev,
					   &kvd_backing_attach_ops, slot);
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
	slot->bsgt = dma_buf_map_attachment(slot->bat, DMA_BIDIRECTIONAL);
	if (IS_ERR_OR_NULL(slot->bsgt)) {
		ret = slot->bsgt ? PTR_ERR(slot->bsgt) : -EIO;
		goto err_unpin;
	}
	/* An exporter may map less than its size: refuse it now, not at a fault. */
	len = kvd_sgt_dma_len(slot->bsgt);
	if (len < b->offset + proxy->length) {
		ret = -ERANGE;
		goto err_unmap;
	}
	slot->whole = !b->offset && len == proxy->length;
	dma_resv_unlock(bresv);
	kref_get(&ka->ref);
	atomic_inc(&kvd_nr_slots);
	return slot;

err_unmap:
	slot->dying = true;
	dma_buf_unmap_attachment(slot->bat, slot->bsgt, DMA_BIDIRECTIONAL);
err_unpin:
	slot->dying = true;
	dma_buf_unpin(slot->bat);
err_unlock:
	dma_resv_unlock(bresv);
	dma_buf_detach(b->dmabuf, slot->bat);
err_free:
	kfree(slot);
	return ERR_PTR(ret);
}

/* Undoes kvd_slot_create(); the slot is off b->slots. */
static void kvd_slot_destroy(struct kvd_slot *slot)
{
	struct kvd_backing *b = slot->b;
	struct dma_resv *bresv = b->dmabuf->resv;

	/* the importer unmaps before detach */
	WARN_ON_ONCE(!list_empty(&slot->lent_node));
	dma_resv_lock(bresv, NULL);
	slot->dying = true;
	dma_buf_unmap_attachment(slot->bat, slot->bsgt, DMA_BIDIRECTIONAL);
	dma_buf_unpin(slot->bat);
	dma_resv_unlock(bresv);
	dma_buf_detach(b->dmabuf, slot->bat);
	kvd_attach_put(slot->ka);
	kfree(slot);
	atomic_dec(&kvd_nr_slots);
}

static void kvd_slot_unlink(struct kvd_slot *slot)
{
	list_del(&slot->node);
	kvd_slot_destroy(slot);
}

/* Attachments of @b that are dynamic and peer-to-peer (all of them). */
static unsigned int kvd_count_p2p(struct kvd_backing *b)
{
	struct kvd_slot *slot;
	unsigned int n = 0;

	list_for_each_entry(slot, &b->slots, node)
		if (dma_buf_attachment_is_dynamic(slot->bat) &&
		    slot->bat->peer2peer)
			n++;
	return n;
}

static struct kvd_slot *kvd_slot_find(struct kvd_backing *b,
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
	dma_buf_put(b->dmabuf);
	kfree(b);
	atomic_dec(&kvd_nr_backings);
}

static void kvd_backing_put(struct kvd_backing *b)
{
	kref_put(&b->ref, kvd_backing_free);
}

/*
 * The proxy lets go of @b (off every list): its slots go now (proxy->lock
 * held if it was ever published), the memory when the last builder that
 * still references it lets go too.
 */
static void kvd_backing_retire(struct kvd_backing *b)
{
	struct kvd_slot *slot, *tmp;

	list_for_each_entry_safe(slot, tmp, &b->slots, node)
		kvd_slot_unlink(slot);
	kvd_backing_put(b);
}

/* A new backing, not yet published; takes over the caller's @dmabuf ref. */
static struct kvd_backing *kvd_backing_alloc(struct dma_buf *dmabuf,
					     u64 offset)
{
	struct kvd_backing *b;

	b = kzalloc(sizeof(*b), GFP_KERNEL);
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
 * Gives @b, not yet published, a slot for every importer attachment of
 * the proxy, calling the exporter with proxy->lock dropped; importers that
 * attach meanwhile get theirs in the next round, the slots of those that
 * detach go. Returns 0 with proxy->lock held and a slot in @b for every
 * attachment, or -errno with it dropped.
 */
static int kvd_backing_build(struct kvd_proxy *proxy, struct kvd_backing *b)
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
				kvd_slot_unlink(slot);
		n = 0;
		list_for_each_entry(ka, &proxy->attachments, node)
			if (!kvd_slot_find(b, ka))
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
			if (!kvd_slot_find(b, ka)) {
				kref_get(&ka->ref);
				todo[i++] = ka;
			}
		}
		mutex_unlock(&proxy->lock);

		/* Only this thread sees b->slots until b is published. */
		ret = 0;
		for (i = 0; i < n; i++) {
			if (!ret) {
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

/*
 * Drop the stale backings no importer map refers to any more, once the
 * fences importers track their DMA with (any usage, BOOKKEEP included) on
 * the proxy's reservation object have all signaled: an importer may still
 * be doing DMA to a backing it has already unmapped.
 */
static void kvd_reap(struct kvd_proxy *proxy)
{
	struct kvd_backing *b, *tmp;

	lockdep_assert_held(&proxy->lock);
	if (list_empty(&proxy->stale) ||
	    !dma_resv_test_signaled(proxy->dmabuf->resv,
				    DMA_RESV_USAGE_BOOKKEEP))
		return;
	/* No map is ever built from a stale backing: zero stays zero. */
	list_for_each_entry_safe(b, tmp, &proxy->stale, node) {
		if (READ_ONCE(b->live_maps))
			continue;
		list_del(&b->node);
		pr_debug("proxy %llu: dropping backing %p\n", proxy->id, b->dmabuf);
		kvd_backing_retire(b);
	}
}

/*
 * Can one more backing go stale? Reaps idle ones first; at most
 * KVDMABUF_MAX_STALE_BACKINGS old backings are held per proxy.
 */
static bool kvd_stale_room(struct kvd_proxy *proxy)
{
	kvd_reap(proxy);
	return kvd_count(&proxy->stale) < KVDMABUF_MAX_STALE_BACKINGS;
}

/*
 * The documented revoke order, after the invalidation: wait for the
 * fences on the proxy's reservation object (DMA_RESV_USAGE_BOOKKEEP: every
 * fence), then until no importer maps a stale backing any more. Bounded by
 * @timeout_ms in all, interruptible. Called without any lock: importer
 * attach/detach callbacks (MR registration, deregistration, process exit)
 * must not block behind it. The caller holds a reference to the proxy's
 * dma-buf.
 */
static int kvd_wait_idle(struct kvd_proxy *proxy, u32 timeout_ms)
{
	struct dma_resv *resv = proxy->dmabuf->resv;
	long left;

	lockdep_assert_not_held(&proxy->lock);
	if (!timeout_ms)
		return dma_resv_test_signaled(resv, DMA_RESV_USAGE_BOOKKEEP) &&
		       !READ_ONCE(proxy->stale_maps) ? 0 : -ETIMEDOUT;

	/* The remaining time when the fences have signaled. */
	left = dma_resv_wait_timeout(resv, DMA_RESV_USAGE_BOOKKEEP, true,
				     msecs_to_jiffies(timeout_ms));
	if (left == -ERESTARTSYS)
		return -EINTR;
	if (left < 0)
		return left;
	if (!left)
		return -ETIMEDOUT;
	if (!READ_ONCE(proxy->stale_maps))
		return 0;
	left = wait_event_interruptible_timeout(proxy->wq,
						!READ_ONCE(proxy->stale_maps),
						left);
	if (left < 0)
		return -EINTR;
	return left ? 0 : -ETIMEDOUT;
}

/* Wait as above, then drop what has become idle. */
static int kvd_drain(struct kvd_proxy *proxy, u32 timeout_ms)
{
	int ret;

	ret = kvd_wait_idle(proxy, timeout_ms);
	mutex_lock(&proxy->lock);
	kvd_reap(proxy);
	mutex_unlock(&proxy->lock);
	return ret;
}

static void kvd_reap_work(struct work_struct *work)
{
	struct kvd_proxy *proxy = container_of(work, struct kvd_proxy,
					       reap_work);

	mutex_lock(&proxy->lock);
	kvd_reap(proxy);
	mutex_unlock(&proxy->lock);
}

/*
 * Take the current backing away from the importers, under the proxy's resv
 * (proxy->lock held): the common part of REVOKE and of an invalidation by
 * the backing's exporter. Returns the old backing, now on the stale list.
 */
static struct kvd_backing *kvd_unback(struct kvd_proxy *proxy, u32 reason)
{
	struct kvd_backing *old = proxy->backing;
	struct kvd_attach *ka;

	lockdep_assert_held(&proxy->lock);
	dma_resv_assert_held(proxy->dmabuf->resv);
	proxy->backing = NULL;
	list_for_each_entry(ka, &proxy->attachments, node)
		ka->cur = NULL;
	proxy->state = KVDMABUF_STATE_REVOKED;
	proxy->revoke_reason = reason;
	proxy->generation++;
	WRITE_ONCE(proxy->stale_maps, proxy->stale_maps + old->live_maps);
	proxy->notifications++;
	kvd_dma_buf_notify(proxy->dmabuf);
	list_add_tail(&old->node, &proxy->stale);
	return old;
}

/*
 * The exporter of the current backing invalidated it: revoke the proxy.
 * Not refused by blocking pins nor by the stale bound (the backing is
 * going away whatever we do); nothing waits here, the stale backing is
 * reaped once idle.
 */
static void kvd_inval_work(struct work_struct *work)
{
	struct kvd_proxy *proxy = container_of(work, struct kvd_proxy,
					       inval_work);
	struct kvd_backing *b;

	mutex_lock(&proxy->lock);
	b = proxy->backing;
	if (b && READ_ONCE(b->invalidated)) {
		dma_resv_lock(proxy->dmabuf->resv, NULL);
		kvd_unback(proxy, KVDMABUF_REVOKE_EXPORTER);
		dma_resv_unlock(proxy->dmabuf->resv);
		pr_debug("proxy %llu: backing invalidated by its exporter, revoked, generation %llu\n",
			 proxy->id, proxy->generation);
		kvd_event(proxy, KVDMABUF_STATE_REVOKED);
	}
	mutex_unlock(&proxy->lock);
}

/*
 * Explicit pins (dma_buf_pin()) of an importer attachment, those the core
 * takes around a map left out. A pin of a revocable importer
 * (dma_buf_attach_revocable(), Linux 7.1+) does not block a revoke: the
 * revoke's invalidation takes the mapping away for good and the importer
 * unpins. It still blocks a replace: a pinned importer never maps again,
 * so it could not follow the new backing.
 */
static unsigned int kvd_attach_pins(struct kvd_attach *ka)
{
	return ka->pins - (kvd_core_pins_on_map ? ka->maps : 0);
}

static unsigned int kvd_attach_blocking(struct kvd_attach *ka)
{
	return ka->revocable ? 0 : kvd_attach_pins(ka);
}

static unsigned int kvd_attach_revocable_pins(struct kvd_attach *ka)
{
	return ka->revocable ? kvd_attach_pins(ka) : 0;
}

/* @count summed over the proxy's importer attachments. */
static unsigned int kvd_sum_pins(struct kvd_proxy *proxy,
				 unsigned int (*count)(struct kvd_attach *ka))
{
	struct kvd_attach *ka;
	unsigned int n = 0;

	dma_resv_assert_held(proxy->dmabuf->resv);
	list_for_each_entry(ka, &proxy->attachments, node)
		n += count(ka);
	return n;
}

/* Pins that make a revoke fail with -EBUSY. */
static unsigned int kvd_blocking_pins(struct kvd_proxy *proxy)
{
	return kvd_sum_pins(proxy, kvd_attach_blocking);
}

/* Pins that make an attach or a replace fail with -EBUSY: all of them. */
static unsigned int kvd_all_pins(struct kvd_proxy *proxy)
{
	return kvd_sum_pins(proxy, kvd_attach_pins);
}

/* ---- dma_buf_ops ---- */

static int kvd_attach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct kvd_proxy *proxy = dmabuf->priv;
	struct kvd_backing *b;
	struct kvd_attach *ka;
	struct kvd_slot *slot;
	int ret;

	/*
	 * Importer tables are DMA addresses of memory that may be a device's
	 * (CUDA, VRAM): only peer-to-peer capable (hence dynamic) importers
	 * can take them.
	 */
	if (!attach->peer2peer) {
		pr_debug("proxy %llu: refusing importer %s without peer2peer\n",
			 proxy->id, dev_name(attach->dev));
		return -EOPNOTSUPP;
	}

	ka = kzalloc(sizeof(*ka), GFP_KERNEL);
	if (!ka)
		return -ENOMEM;
	kref_init(&ka->ref);
	INIT_LIST_HEAD(&ka->lent);
	ka->dev = attach->dev;
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
	while ((b = proxy->backing)) {
		kref_get(&b->ref);
		mutex_unlock(&proxy->lock);
		slot = kvd_slot_create(proxy, b, ka);
		mutex_lock(&proxy->lock);
		if (proxy->backing == b) {
			kvd_backing_put(b);
			if (IS_ERR(slot)) {
				ret = PTR_ERR(slot);
				goto err_unlock;
			}
			list_add_tail(&slot->node, &b->slots);
			ka->cur = slot;
			break;
		}
		if (!IS_ERR(slot))
			kvd_slot_destroy(slot);
		kvd_backing_put(b);
	}
	list_add_tail(&ka->node, &proxy->attachments);
	attach->priv = ka;
	mutex_unlock(&proxy->lock);
	pr_debug("proxy %llu: importer %s attached\n", proxy->id,
		 dev_name(attach->dev));
	return 0;

err_unlock:
	mutex_unlock(&proxy->lock);
	kvd_attach_put(ka);
	return ret;
}

static void kvd_detach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct kvd_proxy *proxy = dmabuf->priv;
	struct kvd_attach *ka = attach->priv;
	struct kvd_backing *b;
	struct kvd_slot *slot;

	mutex_lock(&proxy->lock);
	list_del(&ka->node);
	/* A backing being built drops its slot for @ka when it sees this. */
	ka->detached = true;
	if (proxy->backing) {
		slot = kvd_slot_find(proxy->backing, ka);
		if (slot)
			kvd_slot_unlink(slot);
	}
	list_for_each_entry(b, &proxy->stale, node) {
		slot = kvd_slot_find(b, ka);
		if (slot)
			kvd_slot_unlink(slot);
	}
	kvd_reap(proxy);
	mutex_unlock(&proxy->lock);
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
 * A copy costs an allocation and two walks per map, that is per wake and
 * importer (for 64 MiB of vgem under TCG, 70-90 us: more than ib_umem's
 * own map), which is why the common case lends.
 */
static struct sg_table *kvd_map_lend(struct kvd_attach *ka,
				     struct kvd_slot *slot)
{
	if (!slot->whole || !list_empty(&slot->lent_node))
		return NULL;
	list_add(&slot->lent_node, &ka->lent);
	return slot->bsgt;
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
	u64 start = b->offset, end = b->offset + length;
	u64 pos, seg_start, seg_end;
	struct scatterlist *sg, *dsg;
	struct kvd_map *map;
	unsigned int nents = 0;
	unsigned int i;
	int ret;

	pos = 0;
	for_each_sgtable_dma_sg(bsgt, sg, i) {
		seg_start = max(pos, start);
		seg_end = min(pos + sg_dma_len(sg), end);
		if (seg_start < seg_end)
			nents++;
		pos += sg_dma_len(sg);
		if (pos >= end)
			break;
	}
	if (pos < end || !nents)
		return ERR_PTR(-EIO);	/* backing map shorter than its size */

	map = kzalloc(sizeof(*map), GFP_KERNEL);
	if (!map)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table(&map->sgt, nents, GFP_KERNEL);
	if (ret) {
		kfree(map);
		return ERR_PTR(ret);
	}

	dsg = map->sgt.sgl;
	pos = 0;
	for_each_sgtable_dma_sg(bsgt, sg, i) {
		seg_start = max(pos, start);
		seg_end = min(pos + sg_dma_len(sg), end);
		if (seg_start < seg_end) {
			sg_dma_address(dsg) = sg_dma_address(sg) +
					      (seg_start - pos);
			sg_dma_len(dsg) = seg_end - seg_start;
			kvd_sg_copy_bus_address(dsg, sg);
			dsg = sg_next(dsg);
		}
		pos += sg_dma_len(sg);
		if (pos >= end)
			break;
	}
	map->sgt.nents = nents;
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

	dma_resv_assert_held(attach->dmabuf->resv);
	/* Never told of a move: only a pin keeps its mapping valid. */
	if (!ka->notified && !kvd_attach_pins(ka))
		return ERR_PTR(-EOPNOTSUPP);
	if (proxy->state != KVDMABUF_STATE_BACKED || !ka->cur)
		return ERR_PTR(-ENODEV);

	b = proxy->backing;
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

static void kvd_unmap_dma_buf(struct dma_buf_attachment *attach,
			      struct sg_table *sgt,
			      enum dma_data_direction dir)
{
	struct kvd_proxy *proxy = attach->dmabuf->priv;
	struct kvd_attach *ka = attach->priv;
	struct kvd_backing *b;
	bool stale;

	dma_resv_assert_held(attach->dmabuf->resv);
	b = kvd_map_return(ka, sgt);
	ka->maps--;
	proxy->live_maps--;
	stale = b != proxy->backing;
	/* A stale backing may be freed as soon as this reaches zero. */
	WRITE_ONCE(b->live_maps, b->live_maps - 1);
	if (stale) {
		WRITE_ONCE(proxy->stale_maps, proxy->stale_maps - 1);
		if (!proxy->stale_maps)
			wake_up(&proxy->wq);
		schedule_work(&proxy->reap_work);
	}
}

static void kvd_release(struct dma_buf *dmabuf)
{
	struct kvd_proxy *proxy = dmabuf->priv;
	struct kvd_ctx *ctx = proxy->ctx;
	struct kvd_backing *b, *tmp;

	mutex_lock(&kvd_proxies_lock);
	list_del(&proxy->global);
	mutex_unlock(&kvd_proxies_lock);

	/* No attachment is left, so no map and no new reap work. */
	cancel_work_sync(&proxy->reap_work);
	mutex_lock(&proxy->lock);
	if (proxy->backing)
		kvd_backing_retire(proxy->backing);
	proxy->backing = NULL;
	list_for_each_entry_safe(b, tmp, &proxy->stale, node) {
		list_del(&b->node);
		kvd_backing_retire(b);
	}
	mutex_unlock(&proxy->lock);
	/* Every backing attachment is gone: no new invalidation can come. */
	cancel_work_sync(&proxy->inval_work);

	pr_debug("proxy %llu: released\n", proxy->id);
	kvd_event(proxy, KVDMABUF_STATE_RELEASED);
	spin_lock(&ctx->lock);
	ctx->nr_proxies--;
	spin_unlock(&ctx->lock);
	kvd_ctx_put(ctx);
	mutex_destroy(&proxy->lock);
	kfree(proxy);
	atomic_dec(&kvd_nr_proxies);
}

static const struct dma_buf_ops kvd_dmabuf_ops = {
	.attach = kvd_attach,
	.detach = kvd_detach,
	.pin = kvd_pin,
	.unpin = kvd_unpin,
	.map_dma_buf = kvd_map_dma_buf,
	.unmap_dma_buf = kvd_unmap_dma_buf,
	.release = kvd_release,
};

/* ---- ioctl helpers ---- */

/*
 * Copy in an extensible struct: @usize is the caller's struct size, read
 * from its first field. Smaller than the first version: -EINVAL; larger
 * than ours: the extra bytes must be zero (-E2BIG).
 */
static int kvd_copy_in(void *karg, size_t ksize, size_t ver0,
		       const void __user *uarg, u32 *usize)
{
	u32 size;
	int ret;

	if (get_user(size, (const u32 __user *)uarg))
		return -EFAULT;
	if (size < ver0)
		return -EINVAL;
	if (size > PAGE_SIZE)
		return -E2BIG;
	ret = copy_struct_from_user(karg, ksize, uarg, size);
	if (ret)
		return ret;
	*usize = size;
	return 0;
}

static int kvd_copy_out(void __user *uarg, const void *karg, size_t ksize,
			u32 usize)
{
	if (copy_to_user(uarg, karg, min_t(size_t, ksize, usize)))
		return -EFAULT;
	return 0;
}

static struct kvd_proxy *kvd_proxy_get(u32 fd)
{
	struct dma_buf *dmabuf;

	dmabuf = dma_buf_get(fd);
	if (IS_ERR(dmabuf))
		return ERR_CAST(dmabuf);
	if (dmabuf->ops != &kvd_dmabuf_ops) {
		dma_buf_put(dmabuf);
		return ERR_PTR(-EINVAL);
	}
	return dmabuf->priv;
}

static void kvd_proxy_put(struct kvd_proxy *proxy)
{
	dma_buf_put(proxy->dmabuf);
}

/* ---- ioctls ---- */

static long kvd_ioctl_version(void __user *uarg)
{
	struct kvdmabuf_version arg;
	u32 usize;
	int ret;

	ret = kvd_copy_in(&arg, sizeof(arg), KVDMABUF_VERSION_SIZE_VER0, uarg,
			  &usize);
	if (ret)
		return ret;
	if (arg.flags || arg.pad || arg.reserved)
		return -EINVAL;

	arg.version = KVDMABUF_API_VERSION;
	arg.features = KVDMABUF_FEATURE_REPLACE | KVDMABUF_FEATURE_EVENTS |
		       KVDMABUF_FEATURE_LIST;
	if (!kvd_core_pins_on_map)
		arg.features |= KVDMABUF_FEATURE_MOVE_NOTIFY_CORE;
#ifdef KVD_HAVE_ATTACH_REVOCABLE
	arg.features |= KVDMABUF_FEATURE_REVOCABLE_PINS;
#endif
	return kvd_copy_out(uarg, &arg, sizeof(arg), usize);
}

/*
 * Count one more live proxy unless max_proxies_total are live (the bound
 * may be lowered at run time below the count: nothing is created then).
 */
static bool kvd_reserve_proxy(void)
{
	unsigned int limit = min_t(unsigned int, READ_ONCE(max_proxies_total),
				   INT_MAX);
	int n = atomic_read(&kvd_nr_proxies);

	do {
		if (n >= (int)limit)
			return false;
	} while (!atomic_try_cmpxchg(&kvd_nr_proxies, &n, n + 1));
	return true;
}

static long kvd_ioctl_create(struct kvd_ctx *ctx, void __user *uarg)
{
	DEFINE_DMA_BUF_EXPORT_INFO(exp_info);
	struct kvdmabuf_create arg;
	struct kvd_proxy *proxy;
	struct dma_buf *dmabuf;
	u32 usize;
	int ret, fd;

	ret = kvd_copy_in(&arg, sizeof(arg), KVDMABUF_CREATE_SIZE_VER0, uarg,
			  &usize);
	if (ret)
		return ret;
	if (arg.flags & ~KVDMABUF_CREATE_VALID_FLAGS || arg.pad || arg.reserved)
		return -EINVAL;
	if (!arg.length || !PAGE_ALIGNED(arg.length))
		return -EINVAL;
	if (arg.length > KVD_MAX_LENGTH)
		return -EFBIG;

	spin_lock(&ctx->lock);
	if (ctx->nr_proxies >= READ_ONCE(max_proxies)) {
		spin_unlock(&ctx->lock);
		return -ENOSPC;
	}
	ctx->nr_proxies++;
	spin_unlock(&ctx->lock);
	/* Reopening the device must not get around the per-fd bound. */
	if (!kvd_reserve_proxy()) {
		ret = -ENOSPC;
		goto err_count;
	}

	proxy = kzalloc(sizeof(*proxy), GFP_KERNEL);
	if (!proxy) {
		ret = -ENOMEM;
		goto err_total;
	}
	mutex_init(&proxy->lock);
	INIT_LIST_HEAD(&proxy->attachments);
	INIT_LIST_HEAD(&proxy->stale);
	INIT_LIST_HEAD(&proxy->global);
	init_waitqueue_head(&proxy->wq);
	INIT_WORK(&proxy->reap_work, kvd_reap_work);
	INIT_WORK(&proxy->inval_work, kvd_inval_work);
	proxy->length = arg.length;
	proxy->state = KVDMABUF_STATE_UNBACKED;
	proxy->id = atomic64_inc_return(&kvd_next_id);
	proxy->ctx = ctx;
	proxy->owner_pid = task_tgid_nr(current);
	proxy->owner_uid = current_euid();

	exp_info.ops = &kvd_dmabuf_ops;
	exp_info.size = arg.length;
	exp_info.flags = O_RDWR;
	exp_info.priv = proxy;
	dmabuf = dma_buf_export(&exp_info);
	if (IS_ERR(dmabuf)) {
		ret = PTR_ERR(dmabuf);
		goto err_free;
	}
	proxy->dmabuf = dmabuf;
	/* From here on, .release undoes everything. */
	kref_get(&ctx->ref);
	mutex_lock(&kvd_proxies_lock);
	list_add_tail(&proxy->global, &kvd_proxies);
	mutex_unlock(&kvd_proxies_lock);

	arg.id = proxy->id;
	pr_debug("proxy %llu: created, length %llu\n", proxy->id, proxy->length);

	/* Reserve the fd, tell user space, and only then install it. */
	fd = get_unused_fd_flags(arg.flags & KVDMABUF_CREATE_NO_CLOEXEC ?
				 0 : O_CLOEXEC);
	if (fd < 0) {
		dma_buf_put(dmabuf);
		return fd;
	}
	arg.fd = fd;
	ret = kvd_copy_out(uarg, &arg, sizeof(arg), usize);
	if (ret) {
		put_unused_fd(fd);
		dma_buf_put(dmabuf);
		return ret;
	}
	/* From here on another thread may close the fd: no proxy-> below. */
	fd_install(fd, dmabuf->file);
	return 0;

err_free:
	mutex_destroy(&proxy->lock);
	kfree(proxy);
err_total:
	atomic_dec(&kvd_nr_proxies);
err_count:
	spin_lock(&ctx->lock);
	ctx->nr_proxies--;
	spin_unlock(&ctx->lock);
	return ret;
}

/* May a backing be attached now (@flags of struct kvdmabuf_attach)? */
static int kvd_attach_check(struct kvd_proxy *proxy, u32 flags)
{
	lockdep_assert_held(&proxy->lock);
	if (proxy->state != KVDMABUF_STATE_BACKED)
		return 0;
	if (!(flags & KVDMABUF_ATTACH_REPLACE))
		return -EEXIST;
	return kvd_stale_room(proxy) ? 0 : -EAGAIN;
}

static long kvd_ioctl_attach(struct kvd_ctx *ctx, void __user *uarg)
{
	struct kvd_backing *b, *old = NULL;
	struct kvdmabuf_attach arg;
	struct kvd_proxy *proxy;
	struct dma_buf *backing;
	struct kvd_attach *ka;
	u64 end;
	u32 usize;
	int ret;

	ret = kvd_copy_in(&arg, sizeof(arg), KVDMABUF_ATTACH_SIZE_VER0, uarg,
			  &usize);
	if (ret)
		return ret;
	if (arg.flags & ~KVDMABUF_ATTACH_VALID_FLAGS || arg.pad || arg.reserved)
		return -EINVAL;
	if (!PAGE_ALIGNED(arg.offset) || arg.timeout_ms > KVDMABUF_MAX_TIMEOUT_MS)
		return -EINVAL;

	proxy = kvd_proxy_get(arg.proxy_fd);
	if (IS_ERR(proxy))
		return PTR_ERR(proxy);
	if (proxy->ctx != ctx) {
		ret = -EPERM;
		goto out_proxy;
	}
	backing = dma_buf_get(arg.backing_fd);
	if (IS_ERR(backing)) {
		ret = PTR_ERR(backing);
		goto out_proxy;
	}
	if (backing->ops == &kvd_dmabuf_ops) {
		ret = -ELOOP;
		goto out_backing;
	}
	if (check_add_overflow(arg.offset, proxy->length, &end)) {
		ret = -EOVERFLOW;
		goto out_backing;
	}
	if (end > backing->size) {
		ret = -ERANGE;
		goto out_backing;
	}

	/* Fail early, before any exporter work; checked again below. */
	mutex_lock(&proxy->lock);
	ret = kvd_attach_check(proxy, arg.flags);
	mutex_unlock(&proxy->lock);
	if (ret)
		goto out_backing;

	/*
	 * Attach and map the new backing for every importer with proxy->lock
	 * dropped; it comes back held, and the state may have changed
	 * meanwhile (another ioctl, the exporter of the old backing).
	 */
	b = kvd_backing_alloc(backing, arg.offset);
	if (!b) {
		ret = -ENOMEM;
		goto out_backing;
	}
	backing = NULL;		/* b owns the reference now */
	ret = kvd_backing_build(proxy, b);
	if (ret) {
		kvd_backing_retire(b);
		goto out_proxy;
	}
	ret = kvd_attach_check(proxy, arg.flags);
	if (ret) {
		kvd_backing_retire(b);
		goto out_unlock;
	}

	dma_resv_lock(proxy->dmabuf->resv, NULL);
	if (kvd_all_pins(proxy)) {
		/* Revocable pins too: a pinned importer cannot follow. */
		dma_resv_unlock(proxy->dmabuf->resv);
		kvd_backing_retire(b);
		ret = -EBUSY;
		goto out_unlock;
	}
	old = proxy->backing;
	proxy->backing = b;
	list_for_each_entry(ka, &proxy->attachments, node)
		ka->cur = kvd_slot_find(b, ka);
	/* Its exporter invalidated it while it was being built. */
	if (READ_ONCE(b->invalidated))
		schedule_work(&proxy->inval_work);
	proxy->state = KVDMABUF_STATE_BACKED;
	proxy->revoke_reason = KVDMABUF_REVOKE_NONE;
	proxy->generation++;
	if (old) {
		WRITE_ONCE(proxy->stale_maps, proxy->stale_maps + old->live_maps);
		proxy->notifications++;
		kvd_dma_buf_notify(proxy->dmabuf);
	}
	arg.generation = proxy->generation;
	dma_resv_unlock(proxy->dmabuf->resv);

	pr_debug("proxy %llu: %s, generation %llu, backing %p offset %llu\n",
		 proxy->id, old ? "replaced" : "backed", proxy->generation,
		 b->dmabuf, b->offset);
	kvd_event(proxy, KVDMABUF_STATE_BACKED);

	/*
	 * A plain attach has nothing of its own to wait for: a stale backing
	 * left by an earlier timed-out revoke is only reaped if it is idle,
	 * never waited for, so success is never reported as a failure.
	 */
	ret = 0;
	if (old)
		list_add_tail(&old->node, &proxy->stale);
	else
		kvd_reap(proxy);
	mutex_unlock(&proxy->lock);
	if (old)
		ret = kvd_drain(proxy, arg.timeout_ms);
	kvd_proxy_put(proxy);
	/* User memory is touched without proxy->lock held. */
	if (ret != -EINTR) {
		int err = kvd_copy_out(uarg, &arg, sizeof(arg), usize);

		if (err)
			ret = err;
	}
	return ret;

out_unlock:
	mutex_unlock(&proxy->lock);
out_backing:
	if (backing)
		dma_buf_put(backing);
out_proxy:
	kvd_proxy_put(proxy);
	return ret;
}

static long kvd_ioctl_revoke(struct kvd_ctx *ctx, void __user *uarg)
{
	struct kvd_backing *old = NULL;
	struct kvdmabuf_revoke arg;
	struct kvd_proxy *proxy;
	u32 usize;
	int ret;

	ret = kvd_copy_in(&arg, sizeof(arg), KVDMABUF_REVOKE_SIZE_VER0, uarg,
			  &usize);
	if (ret)
		return ret;
	if (arg.flags || arg.reserved || arg.timeout_ms > KVDMABUF_MAX_TIMEOUT_MS)
		return -EINVAL;

	proxy = kvd_proxy_get(arg.proxy_fd);
	if (IS_ERR(proxy))
		return PTR_ERR(proxy);
	if (proxy->ctx != ctx) {
		kvd_proxy_put(proxy);
		return -EPERM;
	}

	mutex_lock(&proxy->lock);
	if (proxy->state == KVDMABUF_STATE_BACKED && !kvd_stale_room(proxy)) {
		ret = -EAGAIN;
		goto out_unlock;
	}
	dma_resv_lock(proxy->dmabuf->resv, NULL);
	/*
	 * Only pins that cannot be revoked refuse it. Revocable importers
	 * holding a pin get the invalidation below as a permanent revoke:
	 * they unmap and unpin in their callback and never map again.
	 */
	if (kvd_blocking_pins(proxy)) {
		dma_resv_unlock(proxy->dmabuf->resv);
		ret = -EBUSY;
		goto out_unlock;
	}
	if (proxy->state == KVDMABUF_STATE_BACKED)
		old = kvd_unback(proxy, KVDMABUF_REVOKE_USER);
	arg.generation = proxy->generation;
	dma_resv_unlock(proxy->dmabuf->resv);

	if (old) {
		pr_debug("proxy %llu: revoked, generation %llu\n", proxy->id,
			 proxy->generation);
		kvd_event(proxy, KVDMABUF_STATE_REVOKED);
	}
	mutex_unlock(&proxy->lock);
	ret = kvd_drain(proxy, arg.timeout_ms);
	kvd_proxy_put(proxy);
	/* User memory is touched without proxy->lock held. */
	if (ret != -EINTR) {
		int err = kvd_copy_out(uarg, &arg, sizeof(arg), usize);

		if (err)
			ret = err;
	}
	return ret;

out_unlock:
	mutex_unlock(&proxy->lock);
	kvd_proxy_put(proxy);
	return ret;
}

static long kvd_ioctl_query(void __user *uarg)
{
	struct kvdmabuf_query arg;
	struct kvd_proxy *proxy;
	struct kvd_backing *b;
	struct kvd_attach *ka;
	u32 usize;
	int ret;

	ret = kvd_copy_in(&arg, sizeof(arg), KVDMABUF_QUERY_SIZE_VER0, uarg,
			  &usize);
	if (ret)
		return ret;
	if (arg.flags || arg.reserved)
		return -EINVAL;

	proxy = kvd_proxy_get(arg.proxy_fd);
	if (IS_ERR(proxy))
		return PTR_ERR(proxy);

	mutex_lock(&proxy->lock);
	kvd_reap(proxy);
	arg.stale_backings = 0;
	arg.backing_attachments = 0;
	arg.p2p_backing_attachments = 0;
	list_for_each_entry(b, &proxy->stale, node) {
		arg.stale_backings++;
		arg.backing_attachments += kvd_count(&b->slots);
		arg.p2p_backing_attachments += kvd_count_p2p(b);
	}
	if (proxy->backing) {
		arg.backing_attachments +=
			kvd_count(&proxy->backing->slots);
		arg.p2p_backing_attachments += kvd_count_p2p(proxy->backing);
	}

	dma_resv_lock(proxy->dmabuf->resv, NULL);
	arg.state = proxy->state;
	arg.length = proxy->length;
	arg.id = proxy->id;
	arg.generation = proxy->generation;
	arg.offset = proxy->backing ? proxy->backing->offset : 0;
	arg.dynamic_importers = 0;
	arg.pinned_importers = 0;
	arg.blocking_pins = 0;
	arg.revocable_pins = 0;
	arg.revocable_importers = 0;
	list_for_each_entry(ka, &proxy->attachments, node) {
		unsigned int n = kvd_attach_blocking(ka);
		unsigned int r = kvd_attach_revocable_pins(ka);

		if (n || r)
			arg.pinned_importers++;
		else
			arg.dynamic_importers++;
		if (!n && r)
			arg.revocable_importers++;
		arg.blocking_pins += n;
		arg.revocable_pins += r;
	}
	arg.live_mappings = proxy->live_maps;
	arg.notifications = proxy->notifications;
	arg.revoke_reason = proxy->revoke_reason;
	dma_resv_unlock(proxy->dmabuf->resv);
	mutex_unlock(&proxy->lock);

	kvd_proxy_put(proxy);
	return kvd_copy_out(uarg, &arg, sizeof(arg), usize);
}

/* The size bits of the command are ignored: the struct's size field rules. */
#define KVD_CMD(cmd)	((cmd) & ~(_IOC_SIZEMASK << _IOC_SIZESHIFT))

/* A snapshot of @proxy for LIST; false when it is busy (only trylocked:
 * a listing never waits behind a proxy while holding the global list). */
static bool kvd_stat(struct kvd_proxy *proxy, struct kvdmabuf_proxy_stat *st)
{
	struct kvd_backing *b;
	struct kvd_attach *ka;

	st->id = proxy->id;
	st->length = proxy->length;
	st->owner_pid = proxy->owner_pid;
	st->owner_uid = from_kuid_munged(&init_user_ns, proxy->owner_uid);
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
	list_for_each_entry(ka, &proxy->attachments, node) {
		unsigned int r = kvd_attach_revocable_pins(ka);

		if (kvd_attach_blocking(ka) || r)
			st->pinned_importers++;
		else
			st->dynamic_importers++;
		if (r && !kvd_attach_blocking(ka))
			st->revocable_importers++;
		st->revocable_pins += r;
	}
	dma_resv_unlock(proxy->dmabuf->resv);
	mutex_unlock(&proxy->lock);
	return true;
}

static long kvd_ioctl_list(void __user *uarg)
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

static long kvd_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct kvd_ctx *ctx = file->private_data;
	void __user *uarg = (void __user *)arg;

	switch (KVD_CMD(cmd)) {
	case KVD_CMD(KVDMABUF_IOCTL_VERSION):
		return kvd_ioctl_version(uarg);
	case KVD_CMD(KVDMABUF_IOCTL_CREATE):
		return kvd_ioctl_create(ctx, uarg);
	case KVD_CMD(KVDMABUF_IOCTL_ATTACH):
		return kvd_ioctl_attach(ctx, uarg);
	case KVD_CMD(KVDMABUF_IOCTL_REVOKE):
		return kvd_ioctl_revoke(ctx, uarg);
	case KVD_CMD(KVDMABUF_IOCTL_QUERY):
		return kvd_ioctl_query(uarg);
	case KVD_CMD(KVDMABUF_IOCTL_LIST):
		return kvd_ioctl_list(uarg);
	default:
		return -ENOTTY;
	}
}

/* ---- device file ---- */

static int kvd_open(struct inode *inode, struct file *file)
{
	struct kvd_ctx *ctx;

	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL);
	if (!ctx)
		return -ENOMEM;
	kref_init(&ctx->ref);
	spin_lock_init(&ctx->lock);
	init_waitqueue_head(&ctx->wq);
	file->private_data = ctx;
	return nonseekable_open(inode, file);
}

static int kvd_file_release(struct inode *inode, struct file *file)
{
	struct kvd_ctx *ctx = file->private_data;

	/* Live proxies keep ctx; their events now go nowhere. */
	spin_lock(&ctx->lock);
	ctx->closed = true;
	ctx->count = 0;
	spin_unlock(&ctx->lock);
	kvd_ctx_put(ctx);
	return 0;
}

static ssize_t kvd_read(struct file *file, char __user *buf, size_t count,
			loff_t *ppos)
{
	struct kvd_ctx *ctx = file->private_data;
	struct kvdmabuf_event *ev;
	unsigned int n, i;
	ssize_t ret;

	if (count < sizeof(*ev))
		return -EINVAL;
	n = min_t(size_t, count / sizeof(*ev), KVD_EVENT_QUEUE);
	ev = kmalloc_array(n, sizeof(*ev), GFP_KERNEL);
	if (!ev)
		return -ENOMEM;

	spin_lock(&ctx->lock);
	while (!ctx->count) {
		spin_unlock(&ctx->lock);
		if (file->f_flags & O_NONBLOCK) {
			ret = -EAGAIN;
			goto out;
		}
		if (wait_event_interruptible(ctx->wq, READ_ONCE(ctx->count))) {
			ret = -ERESTARTSYS;
			goto out;
		}
		spin_lock(&ctx->lock);
	}
	n = min(n, ctx->count);
	for (i = 0; i < n; i++) {
		ev[i] = ctx->ev[ctx->head];
		ctx->head = (ctx->head + 1) % KVD_EVENT_QUEUE;
	}
	ctx->count -= n;
	spin_unlock(&ctx->lock);

	ret = n * sizeof(*ev);
	if (copy_to_user(buf, ev, ret)) {
		kvd_requeue(ctx, ev, n);
		ret = -EFAULT;
	}
out:
	kfree(ev);
	return ret;
}

static __poll_t kvd_poll(struct file *file, poll_table *wait)
{
	struct kvd_ctx *ctx = file->private_data;

	poll_wait(file, &ctx->wq, wait);
	/* Pairs with wq_has_sleeper() in kvd_event(), as sock_poll_wait(). */
	smp_mb();
	return READ_ONCE(ctx->count) ? EPOLLIN | EPOLLRDNORM : 0;
}

static const struct file_operations kvd_fops = {
	.owner = THIS_MODULE,
	.open = kvd_open,
	.release = kvd_file_release,
	.read = kvd_read,
	.poll = kvd_poll,
	.unlocked_ioctl = kvd_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice kvd_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kvdmabuf",
	.fops = &kvd_fops,
	.mode = 0600,
};

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

/* ---- init/exit ---- */

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
	int ret;

	ret = misc_register(&kvd_misc);
	if (ret)
		return ret;
	kvd_probe_core(kvd_misc.this_device);
	pr_debug("dma-buf core %s dynamic exporters around a map\n",
		 kvd_core_pins_on_map ? "pins" : "does not pin");
	kvd_debugfs = debugfs_create_dir("kvdmabuf", NULL);
	debugfs_create_file("proxies", 0400, kvd_debugfs, NULL,
			    &kvd_proxies_fops);
	debugfs_create_file("stats", 0400, kvd_debugfs, NULL, &kvd_stats_fops);
	return 0;
}

static void __exit kvd_exit(void)
{
	debugfs_remove_recursive(kvd_debugfs);
	misc_deregister(&kvd_misc);
}

module_init(kvd_init);
module_exit(kvd_exit);

MODULE_DESCRIPTION("Proxy dma-bufs with a revocable, replaceable backing");
MODULE_LICENSE("GPL");
KVD_IMPORT_NS_DMA_BUF();
