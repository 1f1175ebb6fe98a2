// SPDX-License-Identifier: GPL-2.0
/*
 * kvd_importer - test-only dynamic dma-buf importer standing in for a
 * move-capable NIC (dynamic mode) or a pinning NIC (pinned mode).
 *
 * Dynamic: attaches with peer2peer and a move_notify that unmaps at once;
 * the next access maps again, as a NIC page fault would. Lazy: dynamic,
 * but move_notify only marks the mapping stale and the next access unmaps
 * it first (an importer that defers its unmap). Pinned:
 * dma_buf_pin() and one map at import, kept until release; move_notify only
 * counts (Linux 7.1+: no invalidation callback at all, the shape of 7.x's
 * ib_umem_dmabuf_get_pinned(), since an importer with one declares itself
 * revocable). No-notify (7.1+ only): no invalidation callback, dynamic
 * unless pinned; the proxy refuses to map it while it holds no pin.
 * CPU (6.2+): no peer2peer and no DMA device, accesses through
 * dma_buf_vmap() (a software NIC such as rxe); lazy as above.
 * Accesses copy through the DMA addresses of the current mapping,
 * taken as CPU physical addresses (true in a VM without IOMMU).
 *
 * Locking: imp_file->lock -> dma-buf resv. User memory is only touched
 * outside the resv (bounce buffer), since mmap_lock may be taken under
 * nothing of ours but resv may be taken under mmap_lock by exporters.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-buf.h>
#include <linux/dma-direct.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/highmem.h>
#include <linux/iosys-map.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/platform_device.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>

#include "compat.h"
#include "kvd_imp_fence.h"
#include "kvd_importer.h"

#define KVD_IMP_MAX_IMPORTS	64

struct kvd_imp {
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	struct sg_table *sgt;		/* current mapping; resv */
	struct iosys_map vmap;		/* CPU: current mapping; resv */
	bool cpu;
	bool pinned;
	bool lazy;
	bool stale;			/* lazy: notified, not yet unmapped; resv */
	u64 maps;			/* resv, as all counters */
	u64 invalidations;
	u64 failed;
	u64 accesses;
};

struct kvd_imp_file {
	struct mutex lock;		/* imports[], fences */
	struct kvd_imp *imports[KVD_IMP_MAX_IMPORTS];
	struct kvd_imp_fences fences;
};

static struct platform_device *kvd_imp_pdev;
static struct miscdevice kvd_imp_misc;

/* resv held: gives the current mapping (DMA table or CPU) up. */
static void kvd_imp_unmap(struct kvd_imp *imp)
{
	if (imp->sgt)
		dma_buf_unmap_attachment(imp->attach, imp->sgt,
					 DMA_BIDIRECTIONAL);
	imp->sgt = NULL;
	if (!iosys_map_is_null(&imp->vmap))
		dma_buf_vunmap(imp->dmabuf, &imp->vmap);
	iosys_map_clear(&imp->vmap);
	imp->stale = false;
}

static void kvd_imp_move_notify(struct dma_buf_attachment *attach)
{
	struct kvd_imp *imp = attach->importer_priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	imp->invalidations++;
	if (imp->pinned) {
		pr_err("move notification on a pinned import\n");
		return;
	}
	if (imp->lazy) {
		imp->stale = imp->sgt || !iosys_map_is_null(&imp->vmap);
		return;
	}
	kvd_imp_unmap(imp);
}

static const struct dma_buf_attach_ops kvd_imp_attach_ops = {
	.allow_peer2peer = true,
	.KVD_IMPORTER_NOTIFY_OP = kvd_imp_move_notify,
};

/* CPU access only: the exporter's tables are never asked for. */
static const struct dma_buf_attach_ops kvd_imp_attach_cpu_ops = {
	.allow_peer2peer = false,
	.KVD_IMPORTER_NOTIFY_OP = kvd_imp_move_notify,
};

#ifdef KVD_HAVE_ATTACH_REVOCABLE
/* Linux 7.1+: the callback is optional; without it, never told of moves. */
static const struct dma_buf_attach_ops kvd_imp_attach_no_notify_ops = {
	.allow_peer2peer = true,
};
#endif

/* resv held. */
static int kvd_imp_map(struct kvd_imp *imp)
{
	struct sg_table *sgt;
	int ret;

	if (imp->stale)
		kvd_imp_unmap(imp);
	if (imp->sgt || !iosys_map_is_null(&imp->vmap))
		return 0;
	if (imp->cpu) {
		/*
		 * The core takes a failed vmap for an exporter's bug (it
		 * warns): a pin asks first whether the buffer can be mapped
		 * now (a revoked proxy says -ENODEV), and goes once mapped.
		 */
		ret = dma_buf_pin(imp->attach);
		if (ret)
			return ret;
		ret = dma_buf_vmap(imp->dmabuf, &imp->vmap);
		dma_buf_unpin(imp->attach);
		if (ret)
			return ret;
		imp->maps++;
		return 0;
	}
	sgt = dma_buf_map_attachment(imp->attach, DMA_BIDIRECTIONAL);
	if (IS_ERR_OR_NULL(sgt))
		return sgt ? PTR_ERR(sgt) : -ENOMEM;
	imp->sgt = sgt;
	imp->maps++;
	return 0;
}

static void kvd_imp_destroy(struct kvd_imp *imp)
{
	dma_resv_lock(imp->dmabuf->resv, NULL);
	kvd_imp_unmap(imp);
	if (imp->pinned)
		dma_buf_unpin(imp->attach);
	dma_resv_unlock(imp->dmabuf->resv);
	dma_buf_detach(imp->dmabuf, imp->attach);
	dma_buf_put(imp->dmabuf);
	kfree(imp);
}

static long kvd_imp_import(struct kvd_imp_file *f, void __user *uarg)
{
	const struct dma_buf_attach_ops *ops;
	struct kvd_imp_import arg;
	struct kvd_imp *imp;
	int slot, ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags & ~(KVD_IMP_IMPORT_PINNED | KVD_IMP_IMPORT_LAZY |
			  KVD_IMP_IMPORT_NO_NOTIFY | KVD_IMP_IMPORT_CPU) ||
	    arg.pad)
		return -EINVAL;
	if ((arg.flags & KVD_IMP_IMPORT_CPU) &&
	    (arg.flags & (KVD_IMP_IMPORT_PINNED | KVD_IMP_IMPORT_NO_NOTIFY)))
		return -EINVAL;
#ifndef KVD_HAVE_VMAP_UNLOCKED
	if (arg.flags & KVD_IMP_IMPORT_CPU)
		return -EOPNOTSUPP;	/* dma_buf_vmap() not under the resv */
#endif
	if ((arg.flags & KVD_IMP_IMPORT_LAZY) &&
	    (arg.flags & (KVD_IMP_IMPORT_PINNED | KVD_IMP_IMPORT_NO_NOTIFY)))
		return -EINVAL;
#ifndef KVD_HAVE_ATTACH_REVOCABLE
	if (arg.flags & KVD_IMP_IMPORT_NO_NOTIFY)
		return -EOPNOTSUPP;	/* the core requires the callback */
#endif

	for (slot = 0; slot < KVD_IMP_MAX_IMPORTS; slot++)
		if (!f->imports[slot])
			break;
	if (slot == KVD_IMP_MAX_IMPORTS)
		return -ENOSPC;

	imp = kzalloc(sizeof(*imp), GFP_KERNEL);
	if (!imp)
		return -ENOMEM;
	imp->pinned = arg.flags & KVD_IMP_IMPORT_PINNED;
	imp->lazy = arg.flags & KVD_IMP_IMPORT_LAZY;
	imp->cpu = arg.flags & KVD_IMP_IMPORT_CPU;
	imp->dmabuf = dma_buf_get(arg.fd);
	if (IS_ERR(imp->dmabuf)) {
		ret = PTR_ERR(imp->dmabuf);
		goto err_free;
	}
	ops = &kvd_imp_attach_ops;
#ifdef KVD_HAVE_ATTACH_REVOCABLE
	/* A pinned importer with a callback would claim to be revocable. */
	if (imp->pinned || (arg.flags & KVD_IMP_IMPORT_NO_NOTIFY))
		ops = &kvd_imp_attach_no_notify_ops;
#endif
	if (imp->cpu)
		ops = &kvd_imp_attach_cpu_ops;
	/* CPU access: a device without DMA, as a software NIC has. */
	imp->attach = dma_buf_dynamic_attach(imp->dmabuf,
					     imp->cpu ? kvd_imp_misc.this_device :
							&kvd_imp_pdev->dev,
					     ops, imp);
	if (IS_ERR(imp->attach)) {
		ret = PTR_ERR(imp->attach);
		goto err_put;
	}
	if (imp->pinned) {
		dma_resv_lock(imp->dmabuf->resv, NULL);
		ret = dma_buf_pin(imp->attach);
		if (!ret) {
			ret = kvd_imp_map(imp);
			if (ret)
				dma_buf_unpin(imp->attach);
		}
		dma_resv_unlock(imp->dmabuf->resv);
		if (ret)
			goto err_detach;
	}

	arg.handle = slot;
	if (copy_to_user(uarg, &arg, sizeof(arg))) {
		ret = -EFAULT;
		kvd_imp_destroy(imp);
		return ret;
	}
	f->imports[slot] = imp;
	return 0;

err_detach:
	dma_buf_detach(imp->dmabuf, imp->attach);
err_put:
	dma_buf_put(imp->dmabuf);
err_free:
	kfree(imp);
	return ret;
}

static struct kvd_imp *kvd_imp_lookup(struct kvd_imp_file *f, u32 handle)
{
	if (handle >= KVD_IMP_MAX_IMPORTS)
		return NULL;
	return f->imports[handle];
}

/* resv held; copies between the mapping and @buf. */
static int kvd_imp_copy(struct kvd_imp *imp, void *buf, u64 offset, u64 len,
			bool write)
{
	struct device *dev = &kvd_imp_pdev->dev;
	struct scatterlist *sg;
	u64 pos = 0, end = offset + len;
	unsigned int i;

	if (imp->cpu) {
		if (write)
			iosys_map_memcpy_to(&imp->vmap, offset, buf, len);
		else
			iosys_map_memcpy_from(buf, &imp->vmap, offset, len);
		return 0;
	}

	for_each_sgtable_dma_sg(imp->sgt, sg, i) {
		u64 seg_end = pos + sg_dma_len(sg);
		u64 cur = max(pos, offset);

		while (cur < min(seg_end, end)) {
			phys_addr_t phys = dma_to_phys(dev, sg_dma_address(sg) +
						       (cur - pos));
			size_t in_page = offset_in_page(phys);
			size_t n = min_t(u64, PAGE_SIZE - in_page,
					 min(seg_end, end) - cur);
			void *vaddr;

			if (!pfn_valid(PHYS_PFN(phys)))
				return -EIO;
			vaddr = kmap_local_page(pfn_to_page(PHYS_PFN(phys)));
			if (write)
				memcpy(vaddr + in_page, buf + (cur - offset), n);
			else
				memcpy(buf + (cur - offset), vaddr + in_page, n);
			kunmap_local(vaddr);
			cur += n;
		}
		pos = seg_end;
		if (pos >= end)
			return 0;
	}
	return -EIO;	/* mapping shorter than the dma-buf */
}

/* resv held, first map held: the same through a map of its own. */
static int kvd_imp_copy_second(struct kvd_imp *imp, void *buf, u64 offset,
			       u64 len, bool write)
{
	struct sg_table *first = imp->sgt, *second;
	int ret;

	second = dma_buf_map_attachment(imp->attach, DMA_BIDIRECTIONAL);
	if (IS_ERR_OR_NULL(second))
		return second ? PTR_ERR(second) : -ENOMEM;
	if (second == first) {
		ret = -EEXIST;
	} else {
		imp->sgt = second;
		ret = kvd_imp_copy(imp, buf, offset, len, write);
		imp->sgt = first;
	}
	dma_buf_unmap_attachment(imp->attach, second, DMA_BIDIRECTIONAL);
	return ret;
}

static long kvd_imp_access(struct kvd_imp_file *f, void __user *uarg)
{
	struct kvd_imp_access arg;
	void __user *ubuf;
	struct kvd_imp *imp;
	bool write;
	void *buf;
	int ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags & ~(KVD_IMP_ACCESS_WRITE | KVD_IMP_ACCESS_SECOND_MAP))
		return -EINVAL;
	if (!arg.length || arg.length > KVD_IMP_MAX_ACCESS)
		return -EINVAL;
	imp = kvd_imp_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	if (arg.offset > imp->dmabuf->size ||
	    arg.length > imp->dmabuf->size - arg.offset)
		return -EINVAL;

	write = arg.flags & KVD_IMP_ACCESS_WRITE;
	ubuf = u64_to_user_ptr(arg.buf);
	buf = kvmalloc(arg.length, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	if (write && copy_from_user(buf, ubuf, arg.length)) {
		ret = -EFAULT;
		goto out;
	}

	dma_resv_lock(imp->dmabuf->resv, NULL);
	ret = kvd_imp_map(imp);
	if (ret) {
		imp->failed++;
	} else if (arg.flags & KVD_IMP_ACCESS_SECOND_MAP && imp->cpu) {
		ret = -EINVAL;
	} else if (arg.flags & KVD_IMP_ACCESS_SECOND_MAP) {
		ret = kvd_imp_copy_second(imp, buf, arg.offset, arg.length,
					  write);
	} else {
		ret = kvd_imp_copy(imp, buf, arg.offset, arg.length, write);
		if (!ret)
			imp->accesses++;
	}
	dma_resv_unlock(imp->dmabuf->resv);

	if (!ret && !write && copy_to_user(ubuf, buf, arg.length))
		ret = -EFAULT;
out:
	kvfree(buf);
	return ret;
}

static long kvd_imp_counters(struct kvd_imp_file *f, void __user *uarg)
{
	struct kvd_imp_counters arg;
	struct scatterlist *sg;
	struct kvd_imp *imp;
	unsigned int i;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	imp = kvd_imp_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	dma_resv_lock(imp->dmabuf->resv, NULL);
	arg.mapped = imp->sgt || !iosys_map_is_null(&imp->vmap);
	arg.table_len = 0;
	if (imp->sgt)
		for_each_sgtable_dma_sg(imp->sgt, sg, i)
			arg.table_len += sg_dma_len(sg);
	arg.maps = imp->maps;
	arg.invalidations = imp->invalidations;
	arg.failed = imp->failed;
	arg.accesses = imp->accesses;
	dma_resv_unlock(imp->dmabuf->resv);
	if (copy_to_user(uarg, &arg, sizeof(arg)))
		return -EFAULT;
	return 0;
}

static long kvd_imp_release(struct kvd_imp_file *f, void __user *uarg)
{
	struct kvd_imp_release arg;
	struct kvd_imp *imp;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.pad)
		return -EINVAL;
	imp = kvd_imp_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	f->imports[arg.handle] = NULL;
	kvd_imp_destroy(imp);
	return 0;
}

static long kvd_imp_fence(struct kvd_imp_file *f, void __user *uarg)
{
	struct kvd_imp_fence arg;
	struct kvd_imp *imp;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.delay_ms > KVD_IMP_MAX_FENCE_DELAY_MS)
		return -EINVAL;
	imp = kvd_imp_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	return kvd_imp_fence_add(&f->fences, imp->dmabuf->resv, arg.delay_ms);
}

static long kvd_imp_ioctl(struct file *file, unsigned int cmd,
			  unsigned long arg)
{
	struct kvd_imp_file *f = file->private_data;
	void __user *uarg = (void __user *)arg;
	long ret;

	mutex_lock(&f->lock);
	switch (cmd) {
	case KVD_IMP_IOCTL_IMPORT:
		ret = kvd_imp_import(f, uarg);
		break;
	case KVD_IMP_IOCTL_ACCESS:
		ret = kvd_imp_access(f, uarg);
		break;
	case KVD_IMP_IOCTL_COUNTERS:
		ret = kvd_imp_counters(f, uarg);
		break;
	case KVD_IMP_IOCTL_RELEASE:
		ret = kvd_imp_release(f, uarg);
		break;
	case KVD_IMP_IOCTL_FENCE:
		ret = kvd_imp_fence(f, uarg);
		break;
	default:
		ret = -ENOTTY;
	}
	mutex_unlock(&f->lock);
	return ret;
}

static int kvd_imp_open(struct inode *inode, struct file *file)
{
	struct kvd_imp_file *f;

	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	kvd_imp_fences_init(&f->fences);
	file->private_data = f;
	return nonseekable_open(inode, file);
}

static int kvd_imp_file_release(struct inode *inode, struct file *file)
{
	struct kvd_imp_file *f = file->private_data;
	int i;

	kvd_imp_fences_release(&f->fences);
	for (i = 0; i < KVD_IMP_MAX_IMPORTS; i++)
		if (f->imports[i])
			kvd_imp_destroy(f->imports[i]);
	mutex_destroy(&f->lock);
	kfree(f);
	return 0;
}

static const struct file_operations kvd_imp_fops = {
	.owner = THIS_MODULE,
	.open = kvd_imp_open,
	.release = kvd_imp_file_release,
	.unlocked_ioctl = kvd_imp_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice kvd_imp_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kvd_importer",
	.fops = &kvd_imp_fops,
	.mode = 0600,
};

static int __init kvd_imp_init(void)
{
	struct platform_device_info info = {
		.name = "kvd_importer",
		.id = PLATFORM_DEVID_NONE,
		.dma_mask = DMA_BIT_MASK(64),
	};
	int ret;

	kvd_imp_pdev = platform_device_register_full(&info);
	if (IS_ERR(kvd_imp_pdev))
		return PTR_ERR(kvd_imp_pdev);
	/*
	 * A NIC takes long DMA segments (mlx5_core sets 2 GiB): the default
	 * of a device that sets nothing is 64 KiB, and DMA API debugging
	 * reports an exporter's longer segments mapped for it.
	 */
	dma_set_max_seg_size(&kvd_imp_pdev->dev, SZ_2G);
	ret = misc_register(&kvd_imp_misc);
	if (ret)
		goto err_pdev;
	return 0;

err_pdev:
	platform_device_unregister(kvd_imp_pdev);
	return ret;
}

static void __exit kvd_imp_exit(void)
{
	misc_deregister(&kvd_imp_misc);
	platform_device_unregister(kvd_imp_pdev);
}

module_init(kvd_imp_init);
module_exit(kvd_imp_exit);

MODULE_DESCRIPTION("kvdmabuf test-only dynamic dma-buf importer");
MODULE_LICENSE("GPL");
KVD_IMPORT_NS_DMA_BUF();
