// SPDX-License-Identifier: GPL-2.0
/*
 * kvd_exporter - test-only dynamic dma-buf exporter whose buffer moves or
 * is revoked at its exporter's will (kvd_exporter.h has the ABI).
 *
 * Dynamic: pin/unpin, map_dma_buf/unmap_dma_buf with the resv held. A map
 * is made with dma_map_page() for the attachment's own device. Pages mode:
 * a table with struct pages. NOPAGES mode: DMA addresses and lengths only
 * (like a PCI BAR), so attach refuses importers without peer2peer.
 *
 * A move or a revoke poisons the old pages after the move notification:
 * an importer that keeps reading through old addresses reads 0xde bytes,
 * never silently the right ones.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/dma-buf.h>
#include <linux/dma-fence.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/file.h>
#include <linux/highmem.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include "compat.h"
#include "kvd_exporter.h"

#define KVD_EXP_MAX_SIZE	(64UL << 20)
#define KVD_EXP_POISON		0xde

struct kvd_exp_pages {
	struct list_head node;		/* kvd_exp_buf.retired */
	unsigned int npages;
	struct page *pages[];
};

/* The copy of an asynchronous move, fenced on the buffer's resv. */
struct kvd_exp_copy {
	struct dma_fence base;		/* first: dma_fence_free() frees all */
	spinlock_t lock;
	struct delayed_work work;
	struct kvd_exp_pages *from, *to;
};

struct kvd_exp_buf {
	struct dma_buf *dmabuf;
	bool nopages;
	bool bus_addr;			/* nopages: segments marked bus addresses */
	bool slow_map;
	bool slow_unmap;
	unsigned int slow_ms;
	bool move_on_pin;
	bool move_on_unpin;
	bool async_move;
	bool pin_busy;
	bool revoke_waits;
	bool revoke_on_pin;
	bool revoke_fenced;
	bool revocable_only;
	wait_queue_head_t unmapped;	/* live_maps went down */
	/* All below: dmabuf->resv. */
	struct kvd_exp_copy *copy;	/* the last asynchronous move's */
	struct kvd_exp_pages *cur;
	struct list_head retired;	/* moved away from, kept until release */
	bool revoked;
	unsigned int attachments, pins, live_maps, moves;
	u64 maps;
	u64 dev_maps[KVD_EXP_MAX_DEVS];
	char dev_names[KVD_EXP_MAX_DEVS][KVD_EXP_DEVNAME_LEN];
};

/* One map: how to undo it. */
struct kvd_exp_map {
	struct sg_table sgt;
	struct device *dev;
};

static const struct dma_buf_ops kvd_exp_ops;

static void kvd_exp_pages_free(struct kvd_exp_pages *p)
{
	unsigned int i;

	for (i = 0; i < p->npages; i++)
		if (p->pages[i])
			__free_page(p->pages[i]);
	kfree(p);
}

static struct kvd_exp_pages *kvd_exp_pages_alloc(unsigned int npages)
{
	struct kvd_exp_pages *p;
	unsigned int i;

	p = kzalloc(struct_size(p, pages, npages), GFP_KERNEL);
	if (!p)
		return NULL;
	p->npages = npages;
	INIT_LIST_HEAD(&p->node);
	for (i = 0; i < npages; i++) {
		/* Below 4 GiB, so that 32-bit importer devices reach them. */
		p->pages[i] = alloc_page(GFP_KERNEL | GFP_DMA32 | __GFP_ZERO);
		if (!p->pages[i]) {
			kvd_exp_pages_free(p);
			return NULL;
		}
	}
	return p;
}

static void kvd_exp_pages_poison(struct kvd_exp_pages *p)
{
	unsigned int i;

	for (i = 0; i < p->npages; i++)
		memset_page(p->pages[i], 0, KVD_EXP_POISON, PAGE_SIZE);
}

static int kvd_exp_attach(struct dma_buf *dmabuf,
			  struct dma_buf_attachment *attach)
{
	struct kvd_exp_buf *buf = dmabuf->priv;

	/* Addresses without struct pages: peer-to-peer importers only. */
	if (buf->nopages && !attach->peer2peer)
		return -EOPNOTSUPP;
	if (buf->revocable_only && !kvd_attach_revocable(attach))
		return -EOPNOTSUPP;
	dma_resv_lock(dmabuf->resv, NULL);
	buf->attachments++;
	dma_resv_unlock(dmabuf->resv);
	return 0;
}

static void kvd_exp_detach(struct dma_buf *dmabuf,
			   struct dma_buf_attachment *attach)
{
	struct kvd_exp_buf *buf = dmabuf->priv;

	dma_resv_lock(dmabuf->resv, NULL);
	buf->attachments--;
	dma_resv_unlock(dmabuf->resv);
}

static const char *kvd_exp_fence_name(struct dma_fence *fence)
{
	return KBUILD_MODNAME;
}

static const struct dma_fence_ops kvd_exp_fence_ops = {
	.get_driver_name = kvd_exp_fence_name,
	.get_timeline_name = kvd_exp_fence_name,
};

/* The copy engine: contents into place, the old pages poisoned, signal. */
static void kvd_exp_copy_work(struct work_struct *work)
{
	struct kvd_exp_copy *c = container_of(to_delayed_work(work),
					      struct kvd_exp_copy, work);
	unsigned int i;

	for (i = 0; i < c->to->npages; i++)
		copy_highpage(c->to->pages[i], c->from->pages[i]);
	kvd_exp_pages_poison(c->from);
	dma_fence_signal(&c->base);
}

/* The last asynchronous copy is done (run now if still pending). */
static void kvd_exp_copy_finish(struct kvd_exp_buf *buf)
{
	if (!buf->copy)
		return;
	flush_delayed_work(&buf->copy->work);
	dma_fence_put(&buf->copy->base);
	buf->copy = NULL;
}

/* Starts copying @from to @to behind a KERNEL fence on the resv. */
static int kvd_exp_copy_start(struct kvd_exp_buf *buf,
			      struct kvd_exp_pages *from,
			      struct kvd_exp_pages *to)
{
	struct kvd_exp_copy *c;
	int ret;

	ret = dma_resv_reserve_fences(buf->dmabuf->resv, 1);
	if (ret)
		return ret;
	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c)
		return -ENOMEM;
	spin_lock_init(&c->lock);
	INIT_DELAYED_WORK(&c->work, kvd_exp_copy_work);
	c->from = from;
	c->to = to;
	dma_fence_init(&c->base, &kvd_exp_fence_ops, &c->lock,
		       dma_fence_context_alloc(1), 1);
	dma_resv_add_fence(buf->dmabuf->resv, &c->base,
			   DMA_RESV_USAGE_KERNEL);
	buf->copy = c;
	schedule_delayed_work(&c->work,
			      msecs_to_jiffies(KVD_EXP_ASYNC_MOVE_MS));
	return 0;
}

/*
 * Switch to @p (NULL: revoke) and tell every importer; the old pages are
 * poisoned once copied (they stay on buf->retired until release).
 */
static int kvd_exp_move_locked(struct kvd_exp_buf *buf,
			       struct kvd_exp_pages *p)
{
	struct kvd_exp_pages *old = buf->cur;
	unsigned int i;
	int ret;

	dma_resv_assert_held(buf->dmabuf->resv);
	/* One copy at a time; the copy engine never takes the resv. */
	kvd_exp_copy_finish(buf);
	if (!p) {
		buf->revoked = true;
	} else if (buf->async_move) {
		ret = kvd_exp_copy_start(buf, old, p);
		if (ret)
			return ret;
	} else {
		for (i = 0; i < p->npages; i++)
			copy_highpage(p->pages[i], old->pages[i]);
	}
	if (p) {
		buf->cur = p;
		list_add_tail(&old->node, &buf->retired);
		buf->moves++;
	}
	kvd_dma_buf_notify(buf->dmabuf);
	/* Whoever still reads the old pages reads poison. */
	if (!buf->copy && !(!p && buf->revoke_fenced))
		kvd_exp_pages_poison(old);
	return 0;
}

/*
 * KVD_EXP_CREATE_REVOKE_FENCED: after the revoke's notification, wait for
 * every fence (resv held), then poison what importers may no longer touch.
 */
static int kvd_exp_revoke_wait_fences(struct kvd_exp_buf *buf)
{
	long left;

	dma_resv_assert_held(buf->dmabuf->resv);
	left = dma_resv_wait_timeout(buf->dmabuf->resv,
				     DMA_RESV_USAGE_BOOKKEEP, true,
				     MAX_SCHEDULE_TIMEOUT);
	kvd_exp_pages_poison(buf->cur);
	return left < 0 ? -EINTR : 0;
}

static int kvd_exp_pin(struct dma_buf_attachment *attach)
{
	struct kvd_exp_buf *buf = attach->dmabuf->priv;
	struct kvd_exp_pages *p;
	int ret;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (buf->revoked)
		return -ENODEV;
	if (buf->revoke_on_pin && buf->live_maps) {
		kvd_exp_move_locked(buf, NULL);
		return -ENODEV;
	}
	if (buf->pin_busy)
		return -EBUSY;
	if (buf->move_on_pin && !buf->pins) {
		/* TTM allocates the new placement with the resv held too. */
		p = kvd_exp_pages_alloc(buf->dmabuf->size >> PAGE_SHIFT);
		if (!p)
			return -ENOMEM;
		ret = kvd_exp_move_locked(buf, p);
		if (ret) {
			kvd_exp_pages_free(p);
			return ret;
		}
	}
	buf->pins++;
	return 0;
}

static void kvd_exp_unpin(struct dma_buf_attachment *attach)
{
	struct kvd_exp_buf *buf = attach->dmabuf->priv;
	struct kvd_exp_pages *p;

	dma_resv_assert_held(attach->dmabuf->resv);
	buf->pins--;
	if (!buf->move_on_unpin || buf->pins || buf->revoked)
		return;
	/* Best effort, as an eviction: no memory, no move. */
	p = kvd_exp_pages_alloc(buf->dmabuf->size >> PAGE_SHIFT);
	if (p && kvd_exp_move_locked(buf, p))
		kvd_exp_pages_free(p);
}

static void kvd_exp_note_dev(struct kvd_exp_buf *buf, struct device *dev)
{
	unsigned int i;

	buf->maps++;
	for (i = 0; i < KVD_EXP_MAX_DEVS; i++) {
		if (!buf->dev_names[i][0])
			strscpy(buf->dev_names[i], dev_name(dev),
				KVD_EXP_DEVNAME_LEN);
		if (!strncmp(buf->dev_names[i], dev_name(dev),
			     KVD_EXP_DEVNAME_LEN - 1)) {
			buf->dev_maps[i]++;
			return;
		}
	}
}

static void kvd_exp_unmap_pages(struct kvd_exp_map *map, unsigned int n,
				enum dma_data_direction dir)
{
	struct scatterlist *sg;
	unsigned int i;

	for_each_sg(map->sgt.sgl, sg, n, i)
		dma_unmap_page(map->dev, sg_dma_address(sg), sg_dma_len(sg),
			       dir);
}

static struct sg_table *kvd_exp_map(struct dma_buf_attachment *attach,
				    enum dma_data_direction dir)
{
	struct kvd_exp_buf *buf = attach->dmabuf->priv;
	struct kvd_exp_pages *p = buf->cur;
	struct kvd_exp_map *map;
	struct scatterlist *sg;
	unsigned int i;
	int ret;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (buf->revoked)
		return ERR_PTR(-ENODEV);
	if (buf->slow_map)
		msleep(buf->slow_ms);
	map = kzalloc(sizeof(*map), GFP_KERNEL);
	if (!map)
		return ERR_PTR(-ENOMEM);
	map->dev = attach->dev;
	ret = sg_alloc_table(&map->sgt, p->npages, GFP_KERNEL);
	if (ret)
		goto err_free;
	if (buf->nopages) {
		/* Each page mapped for this device; the table holds no page. */
		for_each_sgtable_sg(&map->sgt, sg, i) {
			dma_addr_t addr = dma_map_page(attach->dev, p->pages[i],
						       0, PAGE_SIZE, dir);

			if (dma_mapping_error(attach->dev, addr)) {
				kvd_exp_unmap_pages(map, i, dir);
				ret = -EIO;
				goto err_table;
			}
			sg_dma_address(sg) = addr;
			sg_dma_len(sg) = PAGE_SIZE;
#if KVD_SG_BUS_ADDRESS_MARKS
			/* Only a mark: unmapped page by page all the same. */
			if (buf->bus_addr)
				sg_dma_mark_bus_address(sg);
#endif
		}
	} else {
		for_each_sgtable_sg(&map->sgt, sg, i)
			sg_set_page(sg, p->pages[i], PAGE_SIZE, 0);
		ret = dma_map_sgtable(attach->dev, &map->sgt, dir, 0);
		if (ret)
			goto err_table;
	}
	buf->live_maps++;
	kvd_exp_note_dev(buf, attach->dev);
	return &map->sgt;

err_table:
	sg_free_table(&map->sgt);
err_free:
	kfree(map);
	return ERR_PTR(ret);
}

static void kvd_exp_unmap(struct dma_buf_attachment *attach,
			  struct sg_table *sgt, enum dma_data_direction dir)
{
	struct kvd_exp_buf *buf = attach->dmabuf->priv;
	struct kvd_exp_map *map = container_of(sgt, struct kvd_exp_map, sgt);

	dma_resv_assert_held(attach->dmabuf->resv);
	if (buf->slow_unmap)
		msleep(buf->slow_ms);
	if (buf->nopages)
		kvd_exp_unmap_pages(map, sgt->orig_nents, dir);
	else
		dma_unmap_sgtable(map->dev, sgt, dir, 0);
	sg_free_table(sgt);
	kfree(map);
	buf->live_maps--;
	wake_up(&buf->unmapped);
}

static void kvd_exp_release(struct dma_buf *dmabuf)
{
	struct kvd_exp_buf *buf = dmabuf->priv;
	struct kvd_exp_pages *p, *tmp;

	kvd_exp_copy_finish(buf);
	list_for_each_entry_safe(p, tmp, &buf->retired, node)
		kvd_exp_pages_free(p);
	kvd_exp_pages_free(buf->cur);
	kfree(buf);
}

static const struct dma_buf_ops kvd_exp_ops = {
	.attach = kvd_exp_attach,
	.detach = kvd_exp_detach,
	.pin = kvd_exp_pin,
	.unpin = kvd_exp_unpin,
	.map_dma_buf = kvd_exp_map,
	.unmap_dma_buf = kvd_exp_unmap,
	.release = kvd_exp_release,
};

static long kvd_exp_create(void __user *uarg)
{
	DEFINE_DMA_BUF_EXPORT_INFO(exp_info);
	struct kvd_exp_create arg;
	struct kvd_exp_buf *buf;
	struct dma_buf *dmabuf;
	bool slow_ok;
	int fd;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags & ~(KVD_EXP_CREATE_NOPAGES | KVD_EXP_CREATE_BUS_ADDR |
			  KVD_EXP_CREATE_SLOW_MAP |
			  KVD_EXP_CREATE_SLOW_UNMAP |
			  KVD_EXP_CREATE_MOVE_ON_PIN |
			  KVD_EXP_CREATE_MOVE_ON_UNPIN |
			  KVD_EXP_CREATE_PIN_BUSY |
			  KVD_EXP_CREATE_REVOKE_WAITS |
			  KVD_EXP_CREATE_REVOKE_ON_PIN |
			  KVD_EXP_CREATE_REVOKE_FENCED |
			  KVD_EXP_CREATE_REVOCABLE_ONLY |
			  KVD_EXP_CREATE_ASYNC_MOVE) ||
	    arg.pad)
		return -EINVAL;
	/* a sleep, 1 ms to 10 s, with the slow flags; none without them */
	if (!(arg.flags & (KVD_EXP_CREATE_SLOW_MAP | KVD_EXP_CREATE_SLOW_UNMAP)))
		slow_ok = !arg.slow_ms;
	else
		slow_ok = arg.slow_ms && arg.slow_ms <= KVD_EXP_SLOW_MAX_MS;
	if (!slow_ok)
		return -EINVAL;
#ifndef KVD_HAVE_ATTACH_REVOCABLE
	if (arg.flags & KVD_EXP_CREATE_REVOCABLE_ONLY)
		return -EOPNOTSUPP;
#endif
	if ((arg.flags & KVD_EXP_CREATE_BUS_ADDR) &&
	    !(arg.flags & KVD_EXP_CREATE_NOPAGES))
		return -EINVAL;
	if ((arg.flags & KVD_EXP_CREATE_BUS_ADDR) && !KVD_SG_BUS_ADDRESS_MARKS)
		return -EOPNOTSUPP;
	if (!arg.size || !PAGE_ALIGNED(arg.size) ||
	    arg.size > KVD_EXP_MAX_SIZE)
		return -EINVAL;
	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	INIT_LIST_HEAD(&buf->retired);
	buf->nopages = arg.flags & KVD_EXP_CREATE_NOPAGES;
	buf->bus_addr = arg.flags & KVD_EXP_CREATE_BUS_ADDR;
	buf->slow_map = arg.flags & KVD_EXP_CREATE_SLOW_MAP;
	buf->slow_unmap = arg.flags & KVD_EXP_CREATE_SLOW_UNMAP;
	buf->slow_ms = arg.slow_ms;
	buf->move_on_pin = arg.flags & KVD_EXP_CREATE_MOVE_ON_PIN;
	buf->move_on_unpin = arg.flags & KVD_EXP_CREATE_MOVE_ON_UNPIN;
	buf->pin_busy = arg.flags & KVD_EXP_CREATE_PIN_BUSY;
	buf->revoke_waits = arg.flags & KVD_EXP_CREATE_REVOKE_WAITS;
	buf->revoke_on_pin = arg.flags & KVD_EXP_CREATE_REVOKE_ON_PIN;
	buf->revoke_fenced = arg.flags & KVD_EXP_CREATE_REVOKE_FENCED;
	buf->revocable_only = arg.flags & KVD_EXP_CREATE_REVOCABLE_ONLY;
	init_waitqueue_head(&buf->unmapped);
	buf->async_move = arg.flags & KVD_EXP_CREATE_ASYNC_MOVE;
	buf->cur = kvd_exp_pages_alloc(arg.size >> PAGE_SHIFT);
	if (!buf->cur) {
		kfree(buf);
		return -ENOMEM;
	}
	exp_info.ops = &kvd_exp_ops;
	exp_info.size = arg.size;
	exp_info.flags = O_RDWR;
	exp_info.priv = buf;
	dmabuf = dma_buf_export(&exp_info);
	if (IS_ERR(dmabuf)) {
		kvd_exp_pages_free(buf->cur);
		kfree(buf);
		return PTR_ERR(dmabuf);
	}
	buf->dmabuf = dmabuf;
	fd = dma_buf_fd(dmabuf, O_CLOEXEC);
	if (fd < 0) {
		dma_buf_put(dmabuf);
		return fd;
	}
	arg.fd = fd;
	if (copy_to_user(uarg, &arg, sizeof(arg)))
		return -EFAULT;	/* the fd stays: the test closes its fds */
	return 0;
}

static struct kvd_exp_buf *kvd_exp_get(u32 fd)
{
	struct dma_buf *dmabuf = dma_buf_get(fd);

	if (IS_ERR(dmabuf))
		return ERR_CAST(dmabuf);
	if (dmabuf->ops != &kvd_exp_ops) {
		dma_buf_put(dmabuf);
		return ERR_PTR(-EINVAL);
	}
	return dmabuf->priv;
}

static long kvd_exp_fill(void __user *uarg)
{
	struct kvd_exp_fill arg;
	struct kvd_exp_buf *buf;
	unsigned int i, j;
	u32 *w;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	buf = kvd_exp_get(arg.fd);
	if (IS_ERR(buf))
		return PTR_ERR(buf);
	dma_resv_lock(buf->dmabuf->resv, NULL);
	for (i = 0; i < buf->cur->npages; i++) {
		w = kmap_local_page(buf->cur->pages[i]);
		for (j = 0; j < PAGE_SIZE / 4; j++)
			w[j] = arg.seed * 2654435761u +
			       (u32)(i * (PAGE_SIZE / 4) + j);
		kunmap_local(w);
	}
	dma_resv_unlock(buf->dmabuf->resv);
	dma_buf_put(buf->dmabuf);
	return 0;
}

static long kvd_exp_move(u32 fd, bool revoke)
{
	struct kvd_exp_pages *p = NULL;
	struct kvd_exp_buf *buf;
	int ret = 0;

	buf = kvd_exp_get(fd);
	if (IS_ERR(buf))
		return PTR_ERR(buf);
	if (!revoke) {
		p = kvd_exp_pages_alloc(buf->dmabuf->size >> PAGE_SHIFT);
		if (!p) {
			ret = -ENOMEM;
			goto out;
		}
	}
	dma_resv_lock(buf->dmabuf->resv, NULL);
	if (buf->revoked) {
		dma_resv_unlock(buf->dmabuf->resv);
		ret = -ENODEV;
		goto out;
	}
	ret = kvd_exp_move_locked(buf, p);
	if (!ret)
		p = NULL;
	if (!ret && revoke && buf->revoke_fenced)
		ret = kvd_exp_revoke_wait_fences(buf);
	dma_resv_unlock(buf->dmabuf->resv);
	/* Unlocked, so importers can unmap; READ_ONCE: no resv held. */
	if (!ret && revoke && buf->revoke_waits &&
	    !wait_event_timeout(buf->unmapped, !READ_ONCE(buf->live_maps),
				msecs_to_jiffies(KVD_EXP_REVOKE_WAIT_MS)))
		ret = -ETIMEDOUT;
out:
	if (p)
		kvd_exp_pages_free(p);
	dma_buf_put(buf->dmabuf);
	return ret;
}

static long kvd_exp_info(void __user *uarg)
{
	struct kvd_exp_info arg;
	struct kvd_exp_buf *buf;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	buf = kvd_exp_get(arg.fd);
	if (IS_ERR(buf))
		return PTR_ERR(buf);
	dma_resv_lock(buf->dmabuf->resv, NULL);
	arg.attachments = buf->attachments;
	arg.pins = buf->pins;
	arg.live_maps = buf->live_maps;
	arg.moves = buf->moves;
	arg.revoked = buf->revoked;
	arg.maps = buf->maps;
	memcpy(arg.dev_maps, buf->dev_maps, sizeof(arg.dev_maps));
	memcpy(arg.dev_names, buf->dev_names, sizeof(arg.dev_names));
	dma_resv_unlock(buf->dmabuf->resv);
	dma_buf_put(buf->dmabuf);
	if (copy_to_user(uarg, &arg, sizeof(arg)))
		return -EFAULT;
	return 0;
}

static long kvd_exp_ioctl(struct file *file, unsigned int cmd,
			  unsigned long arg)
{
	void __user *uarg = (void __user *)arg;
	u32 fd;

	switch (cmd) {
	case KVD_EXP_IOCTL_CREATE:
		return kvd_exp_create(uarg);
	case KVD_EXP_IOCTL_FILL:
		return kvd_exp_fill(uarg);
	case KVD_EXP_IOCTL_MOVE:
	case KVD_EXP_IOCTL_REVOKE:
		if (get_user(fd, (u32 __user *)uarg))
			return -EFAULT;
		return kvd_exp_move(fd, cmd == KVD_EXP_IOCTL_REVOKE);
	case KVD_EXP_IOCTL_INFO:
		return kvd_exp_info(uarg);
	default:
		return -ENOTTY;
	}
}

static const struct file_operations kvd_exp_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = kvd_exp_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice kvd_exp_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kvd_exporter",
	.fops = &kvd_exp_fops,
	.mode = 0600,
};

module_misc_device(kvd_exp_misc);

MODULE_DESCRIPTION("kvdmabuf test-only dynamic dma-buf exporter that moves and revokes");
MODULE_LICENSE("GPL");
KVD_IMPORT_NS_DMA_BUF();
