// SPDX-License-Identifier: GPL-2.0
/*
 * kvd_umem - test-only dma-buf importer built on ib_core's dma-buf MR
 * code, so that a kvdmabuf proxy is exercised by exactly what real NICs
 * run: ib_umem_dmabuf_get() + ib_umem_dmabuf_map_pages() /
 * ib_umem_dmabuf_unmap_pages() (the dynamic path of mlx5, with its
 * sg-table trimming and fence wait), ib_umem_dmabuf_get_pinned() (the
 * pinned path of efa, bnxt_re), on 7.1+ the pinned revocable path of
 * irdma (ib_umem_dmabuf_get_pinned_revocable_and_lock()) and
 * ib_umem_find_best_pgsz() with
 * the DMA block iterator (how a driver builds its MR page list).
 *
 * The ib_devices are allocated with ib_alloc_device() and never
 * registered: the umem code only needs ->dma_device, here a platform
 * device of this module with a DMA mask (64-bit, and a second one with a
 * 32-bit mask). User space drives it through /dev/kvd_umem with the ABI of
 * /dev/kvd_importer (kvd_importer.h) plus KVD_UMEM_IOCTL_INFO.
 *
 * Bytes are read and written through the DMA addresses of the umem's
 * blocks. Without an IOMMU (dma-direct, as in the plain VM lanes) a DMA
 * address is a CPU physical address, so the copy goes through the page at
 * dma_to_phys(); an address without a struct page gives -EIO. That proves
 * which memory the addresses point at, not that a device could reach it:
 * the lane with an emulated IOMMU and a DMA engine (edu) is where real
 * DMA through the handed-out addresses is proven.
 *
 * Locking: kvd_umem_file.lock -> dma-buf resv. User memory is touched
 * only outside the resv (bounce buffer).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-buf.h>
#include <linux/dma-direct.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/highmem.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/platform_device.h>
#include <linux/scatterlist.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/iter.h>

#include "compat.h"
#include "kvd_imp_fence.h"
#include "kvd_umem.h"

#define KVD_UMEM_MAX_IMPORTS	64
#define KVD_UMEM_NDEV		2
#define KVD_UMEM_ACCESS		(IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ | \
				 IB_ACCESS_REMOTE_WRITE)

/* An unregistered ib_device: only what the umem code looks at is set. */
struct kvd_umem_ibdev {
	struct ib_device ibdev;		/* first: ib_alloc_device() */
};

static struct platform_device *kvd_umem_pdev[KVD_UMEM_NDEV];
static struct kvd_umem_ibdev *kvd_umem_ib[KVD_UMEM_NDEV];

struct kvd_umem_imp {
	struct ib_umem_dmabuf *umd;
	struct ib_device *ibdev;
	bool pinned;
	bool lazy;
	bool stale;			/* lazy: notified, not yet unmapped; resv */
	u32 revokes;			/* pinned revocable: callbacks; resv */
	unsigned long pgsz;		/* resv, as all below */
	u64 maps;
	u64 invalidations;
	u64 failed;
	u64 accesses;
};

struct kvd_umem_file {
	struct mutex lock;		/* imports[], fences */
	struct kvd_umem_imp *imports[KVD_UMEM_MAX_IMPORTS];
	struct kvd_imp_fences fences;
};

static struct dma_resv *kvd_umem_resv(struct kvd_umem_imp *imp)
{
	return imp->umd->attach->dmabuf->resv;
}

/*
 * The dynamic importer's invalidation callback, as mlx5's
 * mlx5_ib_dmabuf_invalidate_cb(): under the dma-buf's resv, forget the
 * page list and unmap at once; the next access faults the mapping in.
 */
static void kvd_umem_invalidate(struct dma_buf_attachment *attach)
{
	struct ib_umem_dmabuf *umd = attach->importer_priv;
	struct kvd_umem_imp *imp = umd->private;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (!imp)
		return;		/* not yet set up: nothing is mapped */
	imp->invalidations++;
	if (!umd->sgt)
		return;
	if (imp->lazy) {
		imp->stale = true;
		return;
	}
	ib_umem_dmabuf_unmap_pages(umd);
}

static const struct dma_buf_attach_ops kvd_umem_attach_ops = {
	.allow_peer2peer = true,
	.KVD_IMPORTER_NOTIFY_OP = kvd_umem_invalidate,
};

#ifdef KVD_HAVE_UMEM_PINNED_REVOCABLE
/*
 * irdma's revoke callback (irdma_umem_dmabuf_revoke()) stops the MR; ib_core
 * then unmaps and unpins the umem. Called under the dma-buf's resv, at most
 * once, also from ib_umem_release() when nothing revoked it before.
 */
static void kvd_umem_revoke(void *priv)
{
	struct kvd_umem_imp *imp = priv;

	imp->revokes++;
	imp->invalidations++;
}

/* Returns with the dma-buf's resv held, as irdma gets it. */
static struct ib_umem_dmabuf *
kvd_umem_get_pinned_revocable(struct kvd_umem_imp *imp, size_t size, int fd)
{
	struct ib_umem_dmabuf *umd;

	umd = ib_umem_dmabuf_get_pinned_revocable_and_lock(imp->ibdev, 0, size,
							   fd, KVD_UMEM_ACCESS);
	if (!IS_ERR(umd))
		ib_umem_dmabuf_set_revoke_locked(umd, kvd_umem_revoke, imp);
	return umd;
}
#endif

/* resv held: map if not mapped (an mlx5 page fault), pick the page size. */
static int kvd_umem_map(struct kvd_umem_imp *imp)
{
	struct ib_umem_dmabuf *umd = imp->umd;
	unsigned long pgsz;
	int ret;

	if (imp->stale) {
		ib_umem_dmabuf_unmap_pages(umd);
		imp->stale = false;
	}
	if (umd->sgt)
		return 0;
	ret = ib_umem_dmabuf_map_pages(umd);
	if (ret)
		return ret;
	if (!umd->sgt)
		return -EIO;
	imp->maps++;
	/* mlx5 maps dma-buf MRs with PAGE_SIZE blocks; IOVA 0. */
	pgsz = ib_umem_find_best_pgsz(&umd->umem, PAGE_SIZE, 0);
	if (!pgsz) {
		ib_umem_dmabuf_unmap_pages(umd);
		return -EINVAL;
	}
	imp->pgsz = pgsz;
	return 0;
}

static void kvd_umem_destroy(struct kvd_umem_imp *imp)
{
	/* Unmaps (and unpins) under the resv, detaches, drops the dma-buf. */
	ib_umem_release(&imp->umd->umem);
	kfree(imp);
}

static long kvd_umem_import(struct kvd_umem_file *f, void __user *uarg)
{
	struct ib_umem_dmabuf *umd;
	struct kvd_imp_import arg;
	struct kvd_umem_imp *imp;
	struct dma_buf *dmabuf;
	unsigned long offset;
	size_t size;
	int slot, ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags & ~(KVD_IMP_IMPORT_PINNED | KVD_IMP_IMPORT_LAZY |
			  KVD_UMEM_IMPORT_DEV32 | KVD_UMEM_IMPORT_INNER |
			  KVD_UMEM_IMPORT_PINNED_REVOCABLE) || arg.pad)
		return -EINVAL;
	if ((arg.flags & KVD_UMEM_IMPORT_INNER) &&
	    (arg.flags & (KVD_IMP_IMPORT_LAZY | KVD_UMEM_IMPORT_PINNED_REVOCABLE)))
		return -EINVAL;
	if (hweight32(arg.flags & (KVD_IMP_IMPORT_PINNED | KVD_IMP_IMPORT_LAZY |
				   KVD_UMEM_IMPORT_PINNED_REVOCABLE)) > 1)
		return -EINVAL;
#ifndef KVD_HAVE_UMEM_PINNED_REVOCABLE
	if (arg.flags & KVD_UMEM_IMPORT_PINNED_REVOCABLE)
		return -EOPNOTSUPP;
#endif

	for (slot = 0; slot < KVD_UMEM_MAX_IMPORTS; slot++)
		if (!f->imports[slot])
			break;
	if (slot == KVD_UMEM_MAX_IMPORTS)
		return -ENOSPC;

	/* The MR covers the whole dma-buf, as a registration of it would. */
	dmabuf = dma_buf_get(arg.fd);
	if (IS_ERR(dmabuf))
		return PTR_ERR(dmabuf);
	size = dmabuf->size;
	dma_buf_put(dmabuf);
	offset = 0;
	if (arg.flags & KVD_UMEM_IMPORT_INNER) {
		if (size <= 2 * KVD_UMEM_INNER_GAP)
			return -EINVAL;
		offset = KVD_UMEM_INNER_GAP;
		size -= 2 * KVD_UMEM_INNER_GAP;
	}

	imp = kzalloc(sizeof(*imp), GFP_KERNEL);
	if (!imp)
		return -ENOMEM;
	imp->pinned = arg.flags & (KVD_IMP_IMPORT_PINNED |
				   KVD_UMEM_IMPORT_PINNED_REVOCABLE);
	imp->lazy = arg.flags & KVD_IMP_IMPORT_LAZY;
	imp->ibdev = &kvd_umem_ib[arg.flags & KVD_UMEM_IMPORT_DEV32 ? 1 : 0]->ibdev;

#ifdef KVD_HAVE_UMEM_PINNED_REVOCABLE
	if (arg.flags & KVD_UMEM_IMPORT_PINNED_REVOCABLE)
		umd = kvd_umem_get_pinned_revocable(imp, size, arg.fd);
	else
#endif
	if (imp->pinned)
		umd = ib_umem_dmabuf_get_pinned(imp->ibdev, offset, size,
						arg.fd, KVD_UMEM_ACCESS);
	else
		umd = ib_umem_dmabuf_get(imp->ibdev, offset, size, arg.fd,
					 KVD_UMEM_ACCESS, &kvd_umem_attach_ops);
	if (IS_ERR(umd)) {
		ret = PTR_ERR(umd);
		kfree(imp);
		return ret;
	}
	imp->umd = umd;
	/* The pinned revocable umem comes with the resv held. */
	if (!(arg.flags & KVD_UMEM_IMPORT_PINNED_REVOCABLE))
		dma_resv_lock(kvd_umem_resv(imp), NULL);
	if (imp->pinned) {
		/* get_pinned() mapped it already. */
		imp->maps++;
		imp->pgsz = ib_umem_find_best_pgsz(&umd->umem, PAGE_SIZE, 0);
	}
	umd->private = imp;
	dma_resv_unlock(kvd_umem_resv(imp));

	arg.handle = slot;
	if (copy_to_user(uarg, &arg, sizeof(arg))) {
		kvd_umem_destroy(imp);
		return -EFAULT;
	}
	f->imports[slot] = imp;
	return 0;
}

static struct kvd_umem_imp *kvd_umem_lookup(struct kvd_umem_file *f,
					    u32 handle)
{
	if (handle >= KVD_UMEM_MAX_IMPORTS)
		return NULL;
	return f->imports[handle];
}

/*
 * resv held, mapped: copy between the MR and @buf through the DMA address
 * of each PAGE_SIZE block, as the NIC would address them.
 */
static int kvd_umem_copy(struct kvd_umem_imp *imp, void *buf, u64 offset,
			 u64 len, bool write)
{
	struct device *dev = imp->ibdev->dma_device;
	struct ib_umem *umem = &imp->umd->umem;
	struct ib_block_iter biter;
	u64 end = offset + len, pos = 0, done = 0;
	unsigned long pgsz = imp->pgsz;

	if (!pgsz)
		return -EINVAL;
	rdma_umem_for_each_dma_block(umem, &biter, pgsz) {
		dma_addr_t dma = rdma_block_iter_dma_address(&biter);
		u64 cur = max(pos, offset), stop = min(pos + pgsz, end);

		while (cur < stop) {
			phys_addr_t phys = dma_to_phys(dev, dma + (cur - pos));
			size_t in_page = offset_in_page(phys);
			size_t n = min_t(u64, PAGE_SIZE - in_page, stop - cur);
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
			done += n;
		}
		pos += pgsz;
		if (pos >= end)
			break;
	}
	return done == len ? 0 : -EIO;	/* fewer blocks than the MR */
}

static long kvd_umem_access(struct kvd_umem_file *f, void __user *uarg)
{
	struct kvd_imp_access arg;
	struct kvd_umem_imp *imp;
	void __user *ubuf;
	bool write;
	void *buf;
	int ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags & ~KVD_IMP_ACCESS_WRITE)
		return -EINVAL;
	if (!arg.length || arg.length > KVD_IMP_MAX_ACCESS)
		return -EINVAL;
	imp = kvd_umem_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	if (arg.offset > imp->umd->umem.length ||
	    arg.length > imp->umd->umem.length - arg.offset)
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

	dma_resv_lock(kvd_umem_resv(imp), NULL);
	ret = kvd_umem_map(imp);
	if (ret) {
		imp->failed++;
	} else {
		ret = kvd_umem_copy(imp, buf, arg.offset, arg.length, write);
		if (!ret)
			imp->accesses++;
	}
	dma_resv_unlock(kvd_umem_resv(imp));

	if (!ret && !write && copy_to_user(ubuf, buf, arg.length))
		ret = -EFAULT;
out:
	kvfree(buf);
	return ret;
}

static long kvd_umem_counters(struct kvd_umem_file *f, void __user *uarg)
{
	struct kvd_imp_counters arg;
	struct kvd_umem_imp *imp;
	struct scatterlist *sg;
	unsigned int i;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	imp = kvd_umem_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	dma_resv_lock(kvd_umem_resv(imp), NULL);
	arg.mapped = !!imp->umd->sgt;
	/*
	 * the exporter's table as it came: ib_umem_dmabuf trimmed its first
	 * and last entries in place to the MR's range
	 */
	arg.table_len = 0;
	if (imp->umd->sgt) {
		for_each_sgtable_dma_sg(imp->umd->sgt, sg, i)
			arg.table_len += sg_dma_len(sg);
		arg.table_len += imp->umd->first_sg_offset +
				 imp->umd->last_sg_trim;
	}
	arg.maps = imp->maps;
	arg.invalidations = imp->invalidations;
	arg.failed = imp->failed;
	arg.accesses = imp->accesses;
	dma_resv_unlock(kvd_umem_resv(imp));
	if (copy_to_user(uarg, &arg, sizeof(arg)))
		return -EFAULT;
	return 0;
}

static long kvd_umem_info(struct kvd_umem_file *f, void __user *uarg)
{
	struct device *dev;
	struct kvd_umem_info arg;
	struct kvd_umem_imp *imp;
	struct scatterlist *sg;
	unsigned int i;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	imp = kvd_umem_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	dev = imp->ibdev->dma_device;
	arg = (struct kvd_umem_info){ .handle = arg.handle };
	arg.dma_mask = dma_get_mask(dev);
	strscpy(arg.dev_name, dev_name(dev), sizeof(arg.dev_name));
	dma_resv_lock(kvd_umem_resv(imp), NULL);
	arg.revokes = imp->revokes;
#ifdef KVD_HAVE_UMEM_PINNED_REVOCABLE
	arg.revoked = imp->umd->revoked;
#endif
	if (imp->umd->sgt) {
		arg.first_sg_offset = imp->umd->first_sg_offset;
		arg.last_sg_trim = imp->umd->last_sg_trim;
		arg.nmap = imp->umd->umem.sgt_append.sgt.nents;
		for_each_sgtable_dma_sg(&imp->umd->umem.sgt_append.sgt, sg, i) {
			arg.max_dma_end = max_t(u64, arg.max_dma_end,
						sg_dma_address(sg) +
						sg_dma_len(sg));
			if (kvd_sg_is_bus_address(sg))
				arg.bus_addr_nents++;
		}
		arg.pgsz = imp->pgsz;
	}
	dma_resv_unlock(kvd_umem_resv(imp));
	if (copy_to_user(uarg, &arg, sizeof(arg)))
		return -EFAULT;
	return 0;
}

static long kvd_umem_release(struct kvd_umem_file *f, void __user *uarg)
{
	struct kvd_imp_release arg;
	struct kvd_umem_imp *imp;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.pad)
		return -EINVAL;
	imp = kvd_umem_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	f->imports[arg.handle] = NULL;
	kvd_umem_destroy(imp);
	return 0;
}

/* A BOOKKEEP fence on the dma-buf's resv, as a DRM importer tracks DMA. */
static long kvd_umem_fence(struct kvd_umem_file *f, void __user *uarg)
{
	struct kvd_imp_fence arg;
	struct kvd_umem_imp *imp;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.delay_ms > KVD_IMP_MAX_FENCE_DELAY_MS)
		return -EINVAL;
	imp = kvd_umem_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	return kvd_imp_fence_add(&f->fences, kvd_umem_resv(imp), arg.delay_ms);
}

/*
 * Benchmarks: unmap + map an import @reps times under its resv, each step
 * timed here, so that user space compares the re-map through a proxy with
 * the re-map of the backing itself without the ioctl's own cost.
 */
static long kvd_umem_remap(struct kvd_umem_file *f, void __user *uarg)
{
	struct kvd_umem_remap arg;
	struct kvd_umem_imp *imp;
	u64 *ns, t0, t1, t2;
	u32 i;
	long ret = 0;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (!arg.reps || arg.reps > KVD_UMEM_MAX_REMAP_REPS || arg.pad)
		return -EINVAL;
	imp = kvd_umem_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	if (imp->pinned || imp->lazy)
		return -EINVAL;
	ns = kvmalloc_array(2 * (size_t)arg.reps, sizeof(*ns), GFP_KERNEL);
	if (!ns)
		return -ENOMEM;
	for (i = 0; i < arg.reps && !ret; i++) {
		ret = dma_resv_lock_interruptible(kvd_umem_resv(imp), NULL);
		if (ret)
			break;
		t0 = ktime_get_ns();
		if (imp->umd->sgt)
			ib_umem_dmabuf_unmap_pages(imp->umd);
		t1 = ktime_get_ns();
		ret = kvd_umem_map(imp);
		t2 = ktime_get_ns();
		if (ret)
			imp->failed++;
		arg.nmap = imp->umd->sgt ? imp->umd->umem.sgt_append.sgt.nents : 0;
		dma_resv_unlock(kvd_umem_resv(imp));
		ns[i] = t1 - t0;
		ns[arg.reps + i] = t2 - t1;
		cond_resched();
	}
	if (!ret &&
	    ((arg.unmap_ns && copy_to_user(u64_to_user_ptr(arg.unmap_ns), ns,
					   arg.reps * sizeof(*ns))) ||
	     (arg.map_ns && copy_to_user(u64_to_user_ptr(arg.map_ns),
					 ns + arg.reps, arg.reps * sizeof(*ns))) ||
	     copy_to_user(uarg, &arg, sizeof(arg))))
		ret = -EFAULT;
	kvfree(ns);
	return ret;
}

static long kvd_umem_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	struct kvd_umem_file *f = file->private_data;
	void __user *uarg = (void __user *)arg;
	long ret;

	mutex_lock(&f->lock);
	switch (cmd) {
	case KVD_IMP_IOCTL_IMPORT:
		ret = kvd_umem_import(f, uarg);
		break;
	case KVD_IMP_IOCTL_ACCESS:
		ret = kvd_umem_access(f, uarg);
		break;
	case KVD_IMP_IOCTL_COUNTERS:
		ret = kvd_umem_counters(f, uarg);
		break;
	case KVD_IMP_IOCTL_RELEASE:
		ret = kvd_umem_release(f, uarg);
		break;
	case KVD_IMP_IOCTL_FENCE:
		ret = kvd_umem_fence(f, uarg);
		break;
	case KVD_UMEM_IOCTL_INFO:
		ret = kvd_umem_info(f, uarg);
		break;
	case KVD_UMEM_IOCTL_REMAP:
		ret = kvd_umem_remap(f, uarg);
		break;
	default:
		ret = -ENOTTY;
	}
	mutex_unlock(&f->lock);
	return ret;
}

static int kvd_umem_open(struct inode *inode, struct file *file)
{
	struct kvd_umem_file *f;

	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	kvd_imp_fences_init(&f->fences);
	file->private_data = f;
	return nonseekable_open(inode, file);
}

static int kvd_umem_file_release(struct inode *inode, struct file *file)
{
	struct kvd_umem_file *f = file->private_data;
	int i;

	kvd_imp_fences_release(&f->fences);
	for (i = 0; i < KVD_UMEM_MAX_IMPORTS; i++)
		if (f->imports[i])
			kvd_umem_destroy(f->imports[i]);
	mutex_destroy(&f->lock);
	kfree(f);
	return 0;
}

static const struct file_operations kvd_umem_fops = {
	.owner = THIS_MODULE,
	.open = kvd_umem_open,
	.release = kvd_umem_file_release,
	.unlocked_ioctl = kvd_umem_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice kvd_umem_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kvd_umem",
	.fops = &kvd_umem_fops,
	.mode = 0600,
};

static void kvd_umem_cleanup(void)
{
	int i;

	for (i = 0; i < KVD_UMEM_NDEV; i++) {
		if (kvd_umem_ib[i])
			ib_dealloc_device(&kvd_umem_ib[i]->ibdev);
		kvd_umem_ib[i] = NULL;
		if (!IS_ERR_OR_NULL(kvd_umem_pdev[i]))
			platform_device_unregister(kvd_umem_pdev[i]);
		kvd_umem_pdev[i] = NULL;
	}
}

static int __init kvd_umem_init(void)
{
	static const u64 masks[KVD_UMEM_NDEV] = {
		DMA_BIT_MASK(64), DMA_BIT_MASK(32),
	};
	int i, ret;

	for (i = 0; i < KVD_UMEM_NDEV; i++) {
		struct platform_device_info info = {
			.name = "kvd_umem",
			.id = i,
			.dma_mask = masks[i],
		};

		kvd_umem_pdev[i] = platform_device_register_full(&info);
		if (IS_ERR(kvd_umem_pdev[i])) {
			ret = PTR_ERR(kvd_umem_pdev[i]);
			goto err;
		}
		/*
		 * As a NIC (mlx5_core sets 2 GiB): a device that sets nothing
		 * takes 64 KiB segments, and DMA API debugging reports an
		 * exporter's longer ones (physically contiguous vgem pages)
		 * mapped for it.
		 */
		dma_set_max_seg_size(&kvd_umem_pdev[i]->dev, SZ_2G);
		kvd_umem_ib[i] = ib_alloc_device(kvd_umem_ibdev, ibdev);
		if (!kvd_umem_ib[i]) {
			ret = -ENOMEM;
			goto err;
		}
		kvd_umem_ib[i]->ibdev.dma_device = &kvd_umem_pdev[i]->dev;
	}
	ret = misc_register(&kvd_umem_misc);
	if (ret)
		goto err;
	return 0;

err:
	kvd_umem_cleanup();
	return ret;
}

static void __exit kvd_umem_exit(void)
{
	misc_deregister(&kvd_umem_misc);
	kvd_umem_cleanup();
}

module_init(kvd_umem_init);
module_exit(kvd_umem_exit);

MODULE_DESCRIPTION("kvdmabuf test-only importer on ib_core's dma-buf umem code");
MODULE_LICENSE("GPL");
KVD_IMPORT_NS_DMA_BUF();
