// SPDX-License-Identifier: GPL-2.0
/*
 * /dev/kvdmabuf: one context per open, which owns the proxies it creates
 * and queues their state changes as events for read() and poll().
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/poll.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "kvd.h"

static void kvd_ctx_free(struct kref *ref)
{
	kfree(container_of(ref, struct kvd_ctx, ref));
}

/**
 * kvd_ctx_put() - drop a reference to a context
 * @ctx: the context of an open of /dev/kvdmabuf
 *
 * The open file holds one, and each proxy it created one until the
 * proxy's release (its events go nowhere once the file is closed). The
 * last put frees @ctx.
 */
void kvd_ctx_put(struct kvd_ctx *ctx)
{
	kref_put(&ctx->ref, kvd_ctx_free);
}

/**
 * kvd_event() - queue a state change of @proxy for its context's reader
 * @proxy: the proxy (its lock held, or being released)
 * @state: its new state, KVDMABUF_STATE_*
 *
 * The record carries @proxy's id and current generation. A full queue
 * drops its oldest record and flags the oldest one kept with
 * KVDMABUF_EVENT_FLAG_LOST; a closed context drops the event. Readers
 * and pollers are woken only if one waits.
 *
 * Context: takes ctx->lock, a spinlock.
 */
void kvd_event(struct kvd_proxy *proxy, u32 state)
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

static int kvd_open(struct inode *inode, struct file *file)
{
	struct kvd_ctx *ctx;

	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);
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

struct miscdevice kvd_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kvdmabuf",
	.fops = &kvd_fops,
	.mode = 0600,
};
