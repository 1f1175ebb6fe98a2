// SPDX-License-Identifier: GPL-2.0
/*
 * Stale backings and the invalidation: what a revoke, a replace or the
 * backing's exporter leaves behind (old backings importers may still map
 * or have DMA in flight to), when it is reaped, how REVOKE and REPLACE
 * wait for it (the drain), and how an exporter's invalidation revokes
 * the proxy.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-fence.h>
#include <linux/file.h>
#include <linux/module.h>
#include <linux/slab.h>

#include "kvd.h"

/*
 * The gate: a fence the module adds to a backing's resv when the backing's
 * exporter invalidates the module's attachment. An exporter that wants
 * its memory back waits for the resv's fences once it has told its
 * importers (dma_buf_invalidate_mappings(), Linux 7.1+); past that wait
 * nothing may write to the memory. The module is that importer on behalf
 * of the proxy's importers, who keep writing until the invalidation work
 * has told them and the fences they had then have signaled: the gate
 * opens at that point (kvd_reap()), or when the backing goes.
 */
struct kvd_gate {
	struct dma_fence base;		/* first: dma_fence_free() frees all */
	spinlock_t lock;
};

static const char *kvd_gate_name(struct dma_fence *fence)
{
	return KBUILD_MODNAME;
}

/* The backing's resv may drop it after the module's last proxy went. */
static void kvd_gate_release(struct dma_fence *fence)
{
	dma_fence_free(fence);
	module_put(THIS_MODULE);
}

static const struct dma_fence_ops kvd_gate_ops = {
	.get_driver_name = kvd_gate_name,
	.get_timeline_name = kvd_gate_name,
	.release = kvd_gate_release,
};

/**
 * kvd_gate_close() - hold the exporter of @b until the proxy's importers stop
 * @b: a backing whose exporter invalidated a slot (its resv held)
 *
 * Once per backing. Without memory the exporter is not held (as before
 * Linux 7.1, when nothing waited): said in the log.
 */
void kvd_gate_close(struct kvd_backing *b)
{
	struct dma_resv *resv = b->dmabuf->resv;
	struct kvd_gate *g;

	dma_resv_assert_held(resv);
	if (b->gate)
		return;
	g = kzalloc(sizeof(*g), GFP_KERNEL);
	if (!g || dma_resv_reserve_fences(resv, 1)) {
		kfree(g);
		pr_warn_ratelimited("no memory to hold an exporter's revoke until the proxy's importers have stopped\n");
		return;
	}
	__module_get(THIS_MODULE);
	spin_lock_init(&g->lock);
	dma_fence_init(&g->base, &kvd_gate_ops, &g->lock,
		       dma_fence_context_alloc(1), 1);
	dma_resv_add_fence(resv, &g->base, DMA_RESV_USAGE_BOOKKEEP);
	/* Our reference, from dma_fence_init(); read without the resv. */
	smp_store_release(&b->gate, &g->base);
}

/**
 * kvd_gate_open() - let the exporter of @b go on
 * @b: a backing the proxy's importers no longer write to
 *
 * Any context; opening an open gate, or a backing without one, is a no-op.
 */
void kvd_gate_open(struct kvd_backing *b)
{
	struct dma_fence *gate = smp_load_acquire(&b->gate);

	if (gate)
		dma_fence_signal(gate);
}

static void kvd_fences_cb(struct dma_fence *fence, struct dma_fence_cb *cb)
{
	struct kvd_backing *b = container_of(cb, struct kvd_backing,
					     fences_cb);

	queue_work(kvd_wq, &b->proxy->reap_work);
}

/**
 * kvd_backing_stale() - tell the importers that @b is no longer theirs
 * @proxy: the proxy (its lock and its resv held)
 * @b: its backing until now, no longer proxy->backing
 * @told: the importers were notified under this hold of the resv already
 *	(kvd_refusing_pins()): they cannot have mapped anything since
 *
 * What the importers may still be doing to @b once told is what their
 * fences on the proxy's resv say then; work they fence later is on the
 * backing that follows. Snapshots those and queues the reap when they
 * signal. Revocable importers holding a pin are revoked for good.
 */
void kvd_backing_stale(struct kvd_proxy *proxy, struct kvd_backing *b,
		       bool told)
{
	struct dma_fence *f = NULL;
	int ret;

	lockdep_assert_held(&proxy->lock);
	dma_resv_assert_held(proxy->dmabuf->resv);
	/* Before the notification: importers unmap from inside it. */
	WRITE_ONCE(proxy->stale_maps, proxy->stale_maps + b->live_maps);
	if (!told)
		kvd_notify(proxy);
	list_add_tail(&b->node, &proxy->stale);
	ret = dma_resv_get_singleton(proxy->dmabuf->resv,
				     DMA_RESV_USAGE_BOOKKEEP, &f);
	if (ret) {
		b->fences = ERR_PTR(ret);	/* every fence counts */
		return;
	}
	b->fences = f;
	b->proxy = proxy;
	if (f && dma_fence_add_callback(f, &b->fences_cb, kvd_fences_cb)) {
		dma_fence_put(f);		/* signaled meanwhile */
		b->fences = NULL;
	}
}

/**
 * kvd_notify() - tell the importers their mappings are invalid
 * @proxy: the proxy (its lock and its resv held)
 *
 * Revocable importers holding a pin take it as a permanent revoke.
 */
void kvd_notify(struct kvd_proxy *proxy)
{
	struct kvd_attach *ka;

	lockdep_assert_held(&proxy->lock);
	dma_resv_assert_held(proxy->dmabuf->resv);
	list_for_each_entry(ka, &proxy->attachments, node)
		if (ka->revocable && kvd_attach_pins(ka))
			ka->revoked = true;
	proxy->notifications++;
	kvd_dma_buf_notify(proxy->dmabuf);
}

/**
 * kvd_refusing_pins() - what refuses a change of the backing
 * @proxy: the proxy (its lock and its resv held)
 * @pins: the importers' pins that refuse it (all, or only blocking ones)
 * @told: set when the importers were notified here
 *
 * Without such pins, a CPU mapping counts as one: the dma-buf core hands
 * its cached CPU mapping to every vmap of the proxy until the last vunmap,
 * so that mapping must go before the backing changes. Importers give it
 * up from their invalidation callback, sent here (once for the change:
 * the caller's own notification is skipped).
 *
 * Return: @pins, 1 if an importer kept its CPU mapping through the
 * notification, or 0: the change may go on.
 */
unsigned int kvd_refusing_pins(struct kvd_proxy *proxy, unsigned int pins,
			       bool *told)
{
	dma_resv_assert_held(proxy->dmabuf->resv);
	*told = false;
	if (pins || !proxy->vmap_b)
		return pins;
	kvd_notify(proxy);
	*told = true;
	return proxy->vmap_b ? 1 : 0;
}

/* Have the fences of @b's importers signaled? */
static bool kvd_fences_signaled(struct kvd_proxy *proxy,
				struct kvd_backing *b)
{
	if (IS_ERR(b->fences))
		return dma_resv_test_signaled(proxy->dmabuf->resv,
					      DMA_RESV_USAGE_BOOKKEEP);
	return !b->fences || dma_fence_is_signaled(b->fences);
}

/**
 * kvd_reap() - let go of the stale backings nobody uses any more
 * @proxy: the proxy (its lock held)
 * @dead: where the dropped backings' slots go, for kvd_bury()
 *
 * A stale backing goes once no importer map refers to it and the fences
 * importers had on the proxy's resv when it went stale (any usage,
 * BOOKKEEP included: an importer may still do DMA to a backing it has
 * unmapped) have signaled. Those fences signaled, its gate opens too.
 */
void kvd_reap(struct kvd_proxy *proxy, struct list_head *dead)
{
	struct kvd_backing *b, *tmp;

	lockdep_assert_held(&proxy->lock);
	/* No map is ever built from a stale backing: zero stays zero. */
	list_for_each_entry_safe(b, tmp, &proxy->stale, node) {
		if (!kvd_fences_signaled(proxy, b))
			continue;
		/*
		 * Told, and their DMA of then is done: an importer that still
		 * maps it may read it until it unmaps, never write.
		 */
		kvd_gate_open(b);
		if (READ_ONCE(b->live_maps))
			continue;
		list_del(&b->node);
		pr_debug("proxy %llu: dropping backing %p\n", proxy->id, b->dmabuf);
		kvd_backing_bury(b, dead);
	}
}

/**
 * kvd_stale_room() - can one more backing go stale?
 * @proxy: the proxy (its lock held)
 * @dead: as for kvd_reap(), which runs first
 *
 * Return: whether fewer than KVDMABUF_MAX_STALE_BACKINGS are held.
 */
bool kvd_stale_room(struct kvd_proxy *proxy, struct list_head *dead)
{
	kvd_reap(proxy, dead);
	return kvd_count(&proxy->stale) < KVDMABUF_MAX_STALE_BACKINGS;
}

/*
 * The first stale backing whose importers' fences have not signaled: a
 * reference to them, or NULL with *@all set when that backing has no
 * snapshot (then the whole resv counts), or NULL.
 */
static struct dma_fence *kvd_stale_fences(struct kvd_proxy *proxy,
					  bool *all)
{
	struct dma_fence *f = NULL;
	struct kvd_backing *b;

	*all = false;
	mutex_lock(&proxy->lock);
	list_for_each_entry(b, &proxy->stale, node) {
		if (kvd_fences_signaled(proxy, b))
			continue;
		if (IS_ERR(b->fences))
			*all = true;
		else
			f = dma_fence_get(b->fences);
		break;
	}
	mutex_unlock(&proxy->lock);
	return f;
}

/*
 * The documented revoke order, after the invalidation: wait for the
 * fences importers had on the proxy's reservation object when each stale
 * backing went stale (DMA_RESV_USAGE_BOOKKEEP: every fence; later ones are
 * work on the backing that followed), then until no importer maps a
 * stale backing any more. Bounded by @timeout_ms
 * in all, interruptible. Called without any lock: importer
 * attach/detach callbacks (MR registration, deregistration, process exit)
 * must not block behind it. The caller holds a reference to the proxy's
 * dma-buf.
 */
static int kvd_wait_idle(struct kvd_proxy *proxy, u32 timeout_ms)
{
	long left = msecs_to_jiffies(timeout_ms);
	struct dma_fence *f;
	bool all;

	lockdep_assert_not_held(&proxy->lock);
	while ((f = kvd_stale_fences(proxy, &all)) || all) {
		if (!timeout_ms) {
			dma_fence_put(f);
			return -ETIMEDOUT;
		}
		if (f) {
			left = dma_fence_wait_timeout(f, true, left);
			dma_fence_put(f);
		} else {
			left = dma_resv_wait_timeout(proxy->dmabuf->resv,
						     DMA_RESV_USAGE_BOOKKEEP,
						     true, left);
		}
		if (left == -ERESTARTSYS)
			return -EINTR;
		if (left < 0)
			return left;
		if (!left)
			return -ETIMEDOUT;
	}
	if (!READ_ONCE(proxy->stale_maps))
		return 0;
	if (!timeout_ms)
		return -ETIMEDOUT;
	left = wait_event_interruptible_timeout(proxy->wq,
						!READ_ONCE(proxy->stale_maps),
						left);
	if (left < 0)
		return -EINTR;
	return left ? 0 : -ETIMEDOUT;
}

/*
 * Drop the stale backings that are idle now and what others left in the
 * graveyard: their teardown (an exporter's unmap may be slow) runs with
 * no lock of the proxy held, so QUERY and the next ioctl are not held up.
 */
static void kvd_reap_now(struct kvd_proxy *proxy)
{
	LIST_HEAD(dead);

	mutex_lock(&proxy->lock);
	kvd_reap(proxy, &dead);
	list_splice_tail_init(&proxy->graveyard, &dead);
	mutex_unlock(&proxy->lock);
	kvd_bury(&dead);
}

/**
 * kvd_drain() - the wait of REVOKE and REPLACE for the stale backings
 * @proxy: the proxy (no lock held; the caller holds a dma-buf reference)
 * @timeout_ms: the bound of the whole wait (0: only look)
 *
 * Waits as kvd_wait_idle() does, then drops what has become idle, and
 * returns once teardowns already under way are done too.
 *
 * Return: 0, -ETIMEDOUT or -EINTR.
 */
int kvd_drain(struct kvd_proxy *proxy, u32 timeout_ms)
{
	int ret;

	ret = kvd_wait_idle(proxy, timeout_ms);
	kvd_reap_now(proxy);
	/*
	 * What the reap work or an exporter's invalidation was burying
	 * meanwhile (outside proxy->lock) is gone too.
	 */
	flush_work(&proxy->inval_work);
	flush_work(&proxy->reap_work);
	/*
	 * A backing the work let go was put from a kworker, whose file
	 * releases the kernel defers: run them now, so that the backing's
	 * memory is freed (once user space closed its fds) when REVOKE or
	 * REPLACE returns, not a moment later.
	 */
	flush_delayed_fput();
	return ret;
}

/**
 * kvd_reap_work() - proxy->reap_work: reap the stale backings now idle
 * @work: the proxy's reap_work
 *
 * Queued when a last unmap or the importers' fences made a stale backing
 * idle (kvd_map_put() queues it on every unmap of a stale backing), and
 * by kvd_bury_later(). Reaps under proxy->lock, then destroys what that
 * buried and what the graveyard holds with no lock of the proxy held.
 */
void kvd_reap_work(struct work_struct *work)
{
	kvd_reap_now(container_of(work, struct kvd_proxy, reap_work));
}

/**
 * kvd_unback() - take the current backing away from the importers
 * @proxy: a backed proxy (its lock and its resv held)
 * @reason: KVDMABUF_REVOKE_USER or KVDMABUF_REVOKE_EXPORTER
 * @told: as for kvd_backing_stale()
 *
 * The common part of REVOKE and of an invalidation by the backing's
 * exporter: the proxy becomes REVOKED, one generation on.
 *
 * Return: the old backing, now on the stale list.
 */
struct kvd_backing *kvd_unback(struct kvd_proxy *proxy, u32 reason,
			       bool told)
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
	kvd_backing_stale(proxy, old, told);
	return old;
}

/**
 * kvd_revoke_invalidated() - revoke a proxy whose backing's exporter took it
 * @proxy: the proxy (its lock held)
 * @dead: as for kvd_reap(), which runs once the proxy is revoked
 *
 * Not refused by blocking pins nor by the stale bound (the backing is
 * going away whatever we do); nothing waits here, the stale backing is
 * reaped once idle.
 *
 * Return: whether it revoked: false if the current backing (if any) was
 * not invalidated, e.g. a REVOKE or a REPLACE took it away first.
 */
bool kvd_revoke_invalidated(struct kvd_proxy *proxy, struct list_head *dead)
{
	struct kvd_backing *b = proxy->backing;

	lockdep_assert_held(&proxy->lock);
	if (!b || !READ_ONCE(b->invalidated))
		return false;
	dma_resv_lock(proxy->dmabuf->resv, NULL);
	/*
	 * Not refused: a CPU mapping an importer keeps goes stale with the
	 * backing (the exporters that revoke, CUDA's, have no vmap).
	 */
	kvd_unback(proxy, KVDMABUF_REVOKE_EXPORTER, false);
	dma_resv_unlock(proxy->dmabuf->resv);
	pr_debug("proxy %llu: backing invalidated by its exporter, revoked, generation %llu\n",
		 proxy->id, proxy->generation);
	kvd_event(proxy, KVDMABUF_STATE_REVOKED);
	/*
	 * Let it go now if no importer maps it (else the last unmap or its
	 * fences' callback queues the reap): an exporter that revokes may
	 * wait for its pins and maps to go (vfio-pci).
	 */
	kvd_reap(proxy, dead);
	return true;
}

/**
 * kvd_inval_work() - proxy->inval_work: follow a backing's invalidation
 * @work: the proxy's inval_work
 *
 * Queued by a slot's invalidation callback, which runs under the
 * backing's resv, where proxy->lock cannot be taken; and by kvd_swap()
 * for a backing invalidated while it was built. Revokes the proxy if its
 * current backing was invalidated, else reaps: a stale backing's exporter
 * may wait for its gate.
 */
void kvd_inval_work(struct work_struct *work)
{
	struct kvd_proxy *proxy = container_of(work, struct kvd_proxy,
					       inval_work);
	LIST_HEAD(dead);

	mutex_lock(&proxy->lock);
	/* A stale backing's exporter may wait for its gate. */
	if (!kvd_revoke_invalidated(proxy, &dead))
		kvd_reap(proxy, &dead);
	mutex_unlock(&proxy->lock);
	kvd_bury(&dead);
}
