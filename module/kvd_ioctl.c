// SPDX-License-Identifier: GPL-2.0
/*
 * The ioctls of /dev/kvdmabuf: VERSION, CREATE, ATTACH (and replace),
 * RANGES, REVOKE and QUERY; LIST is in kvd_list.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cred.h>
#include <linux/fs.h>
#include <linux/limits.h>
#include <linux/overflow.h>
#include <linux/pid.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/uaccess.h>

#include "kvd.h"

/* ---- ioctl helpers ---- */

/**
 * kvd_copy_in() - copy in an ioctl's extensible struct
 * @karg: the module's struct
 * @ksize: its size
 * @ver0: the size of its first version
 * @uarg: the caller's struct, whose first field (a u32) is its size
 * @usize: out: that size, for kvd_copy_out()
 *
 * Copy in an extensible struct: @usize is the caller's struct size, read
 * from its first field. Smaller than the first version: -EINVAL; larger
 * than ours: the extra bytes must be zero (-E2BIG). What an older caller
 * lacks is zeroed.
 *
 * Return: 0, -EFAULT, -EINVAL, or -E2BIG (also for a size over a page).
 */
int kvd_copy_in(void *karg, size_t ksize, size_t ver0,
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

/**
 * kvd_copy_out() - copy out an ioctl's extensible struct
 * @uarg: the caller's struct
 * @karg: the module's struct
 * @ksize: its size
 * @usize: the caller's size, from kvd_copy_in()
 *
 * Only what both sizes cover: the caller's bytes past @ksize are left
 * alone (kvd_copy_in() found them zero).
 *
 * Return: 0 or -EFAULT.
 */
int kvd_copy_out(void __user *uarg, const void *karg, size_t ksize,
		 u32 usize)
{
	if (copy_to_user(uarg, karg, min_t(size_t, ksize, usize)))
		return -EFAULT;
	return 0;
}

/*
 * The answer of an ATTACH or REVOKE: @karg copied out, then @ret, unless
 * the copy faults. User memory is touched without proxy->lock held. An
 * -EINTR or -ETIMEDOUT of the wait comes after the change: the copied
 * generation says which it was; an -EBUSY copies out whose pins refused.
 */
static long kvd_reply(void __user *uarg, const void *karg, size_t ksize,
		      u32 usize, long ret)
{
	int err = kvd_copy_out(uarg, karg, ksize, usize);

	return err ? err : ret;
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
		       KVDMABUF_FEATURE_LIST | KVDMABUF_FEATURE_RANGES;
	if (!KVD_CORE_PINS_ON_MAP)
		arg.features |= KVDMABUF_FEATURE_MOVE_NOTIFY_CORE;
#ifdef KVD_HAVE_ATTACH_REVOCABLE
	arg.features |= KVDMABUF_FEATURE_REVOCABLE_PINS;
#endif
#ifdef KVD_HAVE_VMAP_UNLOCKED
	arg.features |= KVDMABUF_FEATURE_VMAP;
#endif
	return kvd_copy_out(uarg, &arg, sizeof(arg), usize);
}

/*
 * Count one more live proxy unless kvd_max_proxies_total are live (the bound
 * may be lowered at run time below the count: nothing is created then).
 */
static bool kvd_reserve_proxy(void)
{
	unsigned int limit = min_t(unsigned int, READ_ONCE(kvd_max_proxies_total),
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
	kuid_t uid = current_euid();
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
	if (ctx->nr_proxies >= READ_ONCE(kvd_max_proxies)) {
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
	/* Nor a group's members, who share the node, each other's share. */
	mutex_lock(&kvd_proxies_lock);
	ret = kvd_uid_get(uid);
	mutex_unlock(&kvd_proxies_lock);
	if (ret)
		goto err_total;

	proxy = kzalloc(sizeof(*proxy), GFP_KERNEL_ACCOUNT);
	if (!proxy) {
		ret = -ENOMEM;
		goto err_uid;
	}
	mutex_init(&proxy->lock);
	INIT_LIST_HEAD(&proxy->attachments);
	INIT_LIST_HEAD(&proxy->stale);
	INIT_LIST_HEAD(&proxy->graveyard);
	INIT_LIST_HEAD(&proxy->global);
	init_waitqueue_head(&proxy->wq);
	INIT_WORK(&proxy->reap_work, kvd_reap_work);
	INIT_WORK(&proxy->inval_work, kvd_inval_work);
	proxy->length = arg.length;
	proxy->state = KVDMABUF_STATE_UNBACKED;
	proxy->id = atomic64_inc_return(&kvd_next_id);
	proxy->ctx = ctx;
	proxy->owner_pid = get_pid(task_tgid(current));
	proxy->owner_uid = uid;

	kvd_proxy_resv_init(proxy);
	exp_info.resv = &proxy->resv;
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
	dma_resv_fini(&proxy->resv);
	put_pid(proxy->owner_pid);
	mutex_destroy(&proxy->lock);
	kfree(proxy);
err_uid:
	mutex_lock(&kvd_proxies_lock);
	kvd_uid_put(uid);
	mutex_unlock(&kvd_proxies_lock);
err_total:
	atomic_dec(&kvd_nr_proxies);
err_count:
	spin_lock(&ctx->lock);
	ctx->nr_proxies--;
	spin_unlock(&ctx->lock);
	return ret;
}

/* May a backing be attached now (@flags of struct kvdmabuf_attach)? */
static int kvd_attach_check(struct kvd_proxy *proxy, u32 flags,
			    struct list_head *dead)
{
	lockdep_assert_held(&proxy->lock);
	if (proxy->state == KVDMABUF_STATE_BACKED &&
	    !(flags & KVDMABUF_ATTACH_REPLACE))
		return -EEXIST;
	/*
	 * Invalidations by the backing's exporter make backings stale with
	 * no bound of their own; a plain attach after them is bounded here.
	 */
	return kvd_stale_room(proxy, dead) ? 0 : -EAGAIN;
}

/*
 * Fails early, before any allocation or exporter work, so that pins
 * answer -EBUSY even when memory is short; kvd_swap() checks again.
 */
static int kvd_swap_check(struct kvd_proxy *proxy, u32 flags, u32 *pins)
{
	LIST_HEAD(dead);
	int ret;

	mutex_lock(&proxy->lock);
	ret = kvd_attach_check(proxy, flags, &dead);
	if (!ret) {
		dma_resv_lock(proxy->dmabuf->resv, NULL);
		*pins = kvd_all_pins(proxy);
		dma_resv_unlock(proxy->dmabuf->resv);
		if (*pins)
			ret = -EBUSY;
	}
	mutex_unlock(&proxy->lock);
	kvd_bury(&dead);
	return ret;
}

/**
 * kvd_swap() - make a built backing the proxy's, and wait for the old one
 * @proxy: the proxy, its lock held (dropped on return)
 * @b: the new backing, kvd_backing_build() done; the proxy's from here on,
 *	or buried on failure
 * @dead: kvd_backing_build()'s list (slots of importers that detached
 *	meanwhile): buried here, with what the swap lets go
 * @flags: KVDMABUF_ATTACH_REPLACE or 0
 * @timeout_ms: how long to wait for the old backing's mappings
 * @generation: out: the new generation (left alone if nothing changed)
 * @pins: out: the pins that refused it, with -EBUSY
 *
 * Return: 0; before the swap -EEXIST, -EAGAIN, -EBUSY (nothing changed);
 * after it, kvd_drain()'s -EINTR or -ETIMEDOUT.
 */
static int kvd_swap(struct kvd_proxy *proxy, struct kvd_backing *b,
		    struct list_head *dead, u32 flags, u32 timeout_ms,
		    u64 *generation, u32 *pins)
{
	struct kvd_backing *old;
	struct kvd_attach *ka;
	bool told = false;
	int ret;

	ret = kvd_attach_check(proxy, flags, dead);
	if (ret)
		goto err;
	dma_resv_lock(proxy->dmabuf->resv, NULL);
	/* Revocable pins too: a pinned importer cannot follow. */
	*pins = kvd_refusing_pins(proxy, kvd_all_pins(proxy), &told);
	if (*pins) {
		dma_resv_unlock(proxy->dmabuf->resv);
		ret = -EBUSY;
		goto err;
	}
	old = proxy->backing;
	proxy->backing = b;
	list_for_each_entry(ka, &proxy->attachments, node)
		ka->cur = kvd_slot_find(b, ka);
	/* Its exporter invalidated it while it was being built. */
	if (READ_ONCE(b->invalidated))
		queue_work(kvd_wq, &proxy->inval_work);
	proxy->state = KVDMABUF_STATE_BACKED;
	proxy->revoke_reason = KVDMABUF_REVOKE_NONE;
	proxy->generation++;
	if (old)
		kvd_backing_stale(proxy, old, told);
	*generation = proxy->generation;
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
	if (!old)
		kvd_reap(proxy, dead);
	mutex_unlock(&proxy->lock);
	kvd_bury(dead);
	return old ? kvd_drain(proxy, timeout_ms) : 0;

err:
	kvd_backing_bury(b, dead);
	mutex_unlock(&proxy->lock);
	kvd_bury(dead);
	return ret;
}

static long kvd_ioctl_attach(struct kvd_ctx *ctx, void __user *uarg)
{
	struct kvdmabuf_attach arg;
	struct kvd_proxy *proxy;
	struct dma_buf *backing;
	struct kvd_backing *b;
	LIST_HEAD(dead);
	u64 end;
	u32 usize;
	int ret;

	ret = kvd_copy_in(&arg, sizeof(arg), KVDMABUF_ATTACH_SIZE_VER0, uarg,
			  &usize);
	if (ret)
		return ret;
	if (arg.flags & ~KVDMABUF_ATTACH_VALID_FLAGS || arg.pad || arg.reserved)
		return -EINVAL;
	arg.pins = 0;		/* out only */
	arg.generation = 0;	/* out only: set once swapped */
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

	ret = kvd_swap_check(proxy, arg.flags, &arg.pins);
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
	ret = kvd_backing_build(proxy, b, &dead);
	if (ret) {
		kvd_backing_bury(b, &dead);
		goto out_dead;
	}
	ret = kvd_swap(proxy, b, &dead, arg.flags, arg.timeout_ms,
		       &arg.generation, &arg.pins);
	kvd_proxy_put(proxy);
	/* Swapped (a wait's error after it), or the pins' -EBUSY: answered. */
	if (arg.generation || ret == -EBUSY)
		return kvd_reply(uarg, &arg, sizeof(arg), usize, ret);
	return ret;

out_dead:
	kvd_bury(&dead);
out_backing:
	if (backing)
		dma_buf_put(backing);
out_proxy:
	kvd_proxy_put(proxy);
	/* Whose -EBUSY it is: the importers' pins, or the exporter's (0). */
	if (ret == -EBUSY)
		return kvd_reply(uarg, &arg, sizeof(arg), usize, ret);
	return ret;
}

static long kvd_ioctl_revoke(struct kvd_ctx *ctx, void __user *uarg)
{
	struct kvd_backing *old = NULL;
	struct kvdmabuf_revoke arg;
	struct kvd_proxy *proxy;
	LIST_HEAD(dead);
	bool told = false;
	u32 usize;
	int ret;

	ret = kvd_copy_in(&arg, sizeof(arg), KVDMABUF_REVOKE_SIZE_VER0, uarg,
			  &usize);
	if (ret)
		return ret;
	if (arg.flags || arg.reserved || arg.timeout_ms > KVDMABUF_MAX_TIMEOUT_MS)
		return -EINVAL;
	arg.pins = 0;		/* out only */

	proxy = kvd_proxy_get(arg.proxy_fd);
	if (IS_ERR(proxy))
		return PTR_ERR(proxy);
	if (proxy->ctx != ctx) {
		kvd_proxy_put(proxy);
		return -EPERM;
	}

	mutex_lock(&proxy->lock);
	if (proxy->state == KVDMABUF_STATE_BACKED &&
	    !kvd_stale_room(proxy, &dead)) {
		ret = -EAGAIN;
		goto out_unlock;
	}
	dma_resv_lock(proxy->dmabuf->resv, NULL);
	/*
	 * Only pins that cannot be revoked refuse it, and only a proxy that
	 * has a backing to take away: of one already revoked (by its
	 * exporter too) a pin holds only a stale backing, which the drain
	 * below waits for. Revocable importers holding a pin get the
	 * invalidation below as a permanent revoke: they unmap and unpin in
	 * their callback and never map again.
	 */
	if (proxy->state == KVDMABUF_STATE_BACKED)
		arg.pins = kvd_refusing_pins(proxy, kvd_blocking_pins(proxy),
					     &told);
	if (arg.pins) {
		dma_resv_unlock(proxy->dmabuf->resv);
		ret = -EBUSY;
		goto out_unlock;
	}
	if (proxy->state == KVDMABUF_STATE_BACKED)
		old = kvd_unback(proxy, KVDMABUF_REVOKE_USER, told);
	arg.generation = proxy->generation;
	dma_resv_unlock(proxy->dmabuf->resv);

	if (old) {
		pr_debug("proxy %llu: revoked, generation %llu\n", proxy->id,
			 proxy->generation);
		kvd_event(proxy, KVDMABUF_STATE_REVOKED);
	}
	mutex_unlock(&proxy->lock);
	kvd_bury(&dead);
	ret = kvd_drain(proxy, arg.timeout_ms);
	kvd_proxy_put(proxy);
	return kvd_reply(uarg, &arg, sizeof(arg), usize, ret);

out_unlock:
	mutex_unlock(&proxy->lock);
	kvd_bury(&dead);
	kvd_proxy_put(proxy);
	if (ret == -EBUSY)
		return kvd_reply(uarg, &arg, sizeof(arg), usize, ret);
	return ret;
}

static int kvd_change_start_cmp(const void *a, const void *b)
{
	u64 x = ((const struct kvd_change *)a)->start;
	u64 y = ((const struct kvd_change *)b)->start;

	return x < y ? -1 : x > y;
}

static void kvd_changes_free(struct kvd_change *ch, unsigned int nr)
{
	unsigned int i;

	for (i = 0; i < nr; i++)
		if (ch[i].dmabuf)
			dma_buf_put(ch[i].dmabuf);
	kvfree(ch);
}

/* One range of a RANGES call, checked; its backing referenced. */
static int kvd_range_read(struct kvd_proxy *proxy, const void __user *uptr,
			  u32 usize, struct kvd_change *c)
{
	struct kvdmabuf_range r;
	struct dma_buf *dmabuf;
	u64 end;
	int ret;

	ret = copy_struct_from_user(&r, sizeof(r), uptr, usize);
	if (ret)
		return ret;
	if (r.flags || r.reserved || !r.length || !PAGE_ALIGNED(r.start) ||
	    !PAGE_ALIGNED(r.length) || !PAGE_ALIGNED(r.backing_offset))
		return -EINVAL;
	if (check_add_overflow(r.start, r.length, &end))
		return -EOVERFLOW;
	if (end > proxy->length)
		return -ERANGE;
	c->start = r.start;
	c->length = r.length;
	c->offset = r.backing_offset;
	if (r.backing_fd == KVDMABUF_RANGE_UNBACKED)
		return r.backing_offset ? -EINVAL : 0;
	if (r.backing_fd < 0)
		return -EBADF;
	dmabuf = dma_buf_get(r.backing_fd);
	if (IS_ERR(dmabuf))
		return PTR_ERR(dmabuf);
	c->dmabuf = dmabuf;		/* the caller puts it, whatever comes */
	if (dmabuf->ops == &kvd_dmabuf_ops)
		return -ELOOP;
	if (check_add_overflow(r.backing_offset, r.length, &end))
		return -EOVERFLOW;
	return end > dmabuf->size ? -ERANGE : 0;
}

/* The ranges of a RANGES call, checked, sorted and not overlapping. */
static struct kvd_change *kvd_ranges_read(struct kvd_proxy *proxy,
					  const struct kvdmabuf_ranges *arg)
{
	const char __user *uptr = u64_to_user_ptr(arg->ranges);
	struct kvd_change *ch;
	unsigned int i;
	int ret = 0;

	ch = kvcalloc(arg->count, sizeof(*ch), GFP_KERNEL_ACCOUNT);
	if (!ch)
		return ERR_PTR(-ENOMEM);
	for (i = 0; i < arg->count && !ret; i++) {
		ret = kvd_range_read(proxy, uptr + (size_t)i * arg->range_size,
				     arg->range_size, &ch[i]);
		cond_resched();
	}
	if (!ret) {
		sort(ch, arg->count, sizeof(*ch), kvd_change_start_cmp, NULL);
		for (i = 1; i < arg->count; i++)
			if (ch[i].start < ch[i - 1].start + ch[i - 1].length)
				ret = -EINVAL;
	}
	if (ret) {
		kvd_changes_free(ch, arg->count);
		return ERR_PTR(ret);
	}
	return ch;
}

static long kvd_ioctl_ranges(struct kvd_ctx *ctx, void __user *uarg)
{
	struct kvdmabuf_ranges arg;
	struct kvd_proxy *proxy;
	struct dma_buf *base = NULL, *layout;
	struct kvd_change *ch;
	struct kvd_backing *b;
	u64 base_offset = 0, gen;
	LIST_HEAD(dead);
	u32 usize;
	int ret;

	ret = kvd_copy_in(&arg, sizeof(arg), KVDMABUF_RANGES_SIZE_VER0, uarg,
			  &usize);
	if (ret)
		return ret;
	if (arg.flags || arg.reserved || !arg.count ||
	    arg.range_size < KVDMABUF_RANGE_SIZE_VER0 ||
	    arg.timeout_ms > KVDMABUF_MAX_TIMEOUT_MS)
		return -EINVAL;
	if (arg.count > KVDMABUF_MAX_RANGES || arg.range_size > PAGE_SIZE)
		return -E2BIG;
	arg.pins = 0;		/* out only */
	arg.generation = 0;	/* out only: set once swapped */

	proxy = kvd_proxy_get(arg.proxy_fd);
	if (IS_ERR(proxy))
		return PTR_ERR(proxy);
	if (proxy->ctx != ctx) {
		ret = -EPERM;
		goto out_proxy;
	}
	ch = kvd_ranges_read(proxy, &arg);
	if (IS_ERR(ch)) {
		ret = PTR_ERR(ch);
		goto out_proxy;
	}

	ret = kvd_swap_check(proxy, KVDMABUF_ATTACH_REPLACE, &arg.pins);
	if (ret) {
		kvd_changes_free(ch, arg.count);
		goto out_proxy;
	}
	/*
	 * The layout the batch changes, noted with its generation: another
	 * change meanwhile makes the call -EAGAIN.
	 */
	mutex_lock(&proxy->lock);
	if (proxy->state == KVDMABUF_STATE_BACKED) {
		base = proxy->backing->dmabuf;
		base_offset = proxy->backing->offset;
		get_dma_buf(base);
	}
	gen = proxy->generation;
	mutex_unlock(&proxy->lock);

	layout = kvd_compose(proxy->length, base, base_offset, ch, arg.count);
	kvfree(ch);		/* kvd_compose() took or put its references */
	if (base)
		dma_buf_put(base);
	if (IS_ERR(layout)) {
		ret = PTR_ERR(layout);
		goto out_proxy;
	}
	b = kvd_backing_alloc(layout, 0);
	if (!b) {
		dma_buf_put(layout);
		ret = -ENOMEM;
		goto out_proxy;
	}
	ret = kvd_backing_build(proxy, b, &dead);
	/* its slots are prepared: its new blocks need their origins no more */
	kvd_layout_settle(layout);
	if (ret) {
		kvd_backing_bury(b, &dead);
		kvd_bury(&dead);
		goto out_proxy;
	}
	if (proxy->generation != gen) {
		kvd_backing_bury(b, &dead);
		mutex_unlock(&proxy->lock);
		kvd_bury(&dead);
		ret = -EAGAIN;
		goto out_proxy;
	}
	ret = kvd_swap(proxy, b, &dead, KVDMABUF_ATTACH_REPLACE,
		       arg.timeout_ms, &arg.generation, &arg.pins);
out_proxy:
	kvd_proxy_put(proxy);
	if (arg.generation || ret == -EBUSY)
		return kvd_reply(uarg, &arg, sizeof(arg), usize, ret);
	return ret;
}

static long kvd_ioctl_query(void __user *uarg)
{
	struct kvd_importer_counts c;
	struct kvdmabuf_query arg;
	struct kvd_proxy *proxy;
	struct kvd_backing *b;
	LIST_HEAD(dead);
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
	kvd_reap(proxy, &dead);
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
	kvd_count_importers(proxy, &c);
	arg.dynamic_importers = c.dynamic;
	arg.pinned_importers = c.pinned;
	arg.revocable_importers = c.revocable;
	arg.blocking_pins = c.blocking_pins;
	arg.revocable_pins = c.revocable_pins;
	arg.live_mappings = proxy->live_maps;
	arg.notifications = proxy->notifications;
	arg.revoke_reason = proxy->revoke_reason;
	dma_resv_unlock(proxy->dmabuf->resv);
	/* Their teardown calls the exporter: never wait for it here. */
	kvd_bury_later(proxy, &dead);
	mutex_unlock(&proxy->lock);

	kvd_proxy_put(proxy);
	return kvd_copy_out(uarg, &arg, sizeof(arg), usize);
}

/* The size bits of the command are ignored: the struct's size field rules. */
#define KVD_CMD(cmd)	((cmd) & ~(_IOC_SIZEMASK << _IOC_SIZESHIFT))

/**
 * kvd_ioctl() - the ioctls of /dev/kvdmabuf
 * @file: an open of /dev/kvdmabuf, whose context is file->private_data
 * @cmd: KVDMABUF_IOCTL_*; its size bits are ignored (KVD_CMD())
 * @arg: the caller's struct
 *
 * Also the compat ioctl, through compat_ptr_ioctl().
 *
 * Return: the command's result, or -ENOTTY for an unknown command.
 */
long kvd_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
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
	case KVD_CMD(KVDMABUF_IOCTL_RANGES):
		return kvd_ioctl_ranges(ctx, uarg);
	default:
		return -ENOTTY;
	}
}
