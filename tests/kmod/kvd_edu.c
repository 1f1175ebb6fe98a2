// SPDX-License-Identifier: GPL-2.0
/*
 * kvd_edu - test-only dma-buf importer that moves bytes with a real DMA
 * engine: qemu's edu PCI device (1234:11e8), behind an emulated IOMMU.
 *
 * The other test importers read a mapping by taking its DMA addresses as
 * CPU physical addresses, so a table made for the wrong device, or an
 * address that was already unmapped, still "works" there. Here the only
 * way to the bytes is the edu's DMA engine, through the addresses in the
 * table, translated by the IOMMU of the edu's own device: an address the
 * IOMMU does not map for it faults (a DMAR report) and never reaches the
 * pages.
 *
 * The engine copies between memory (a DMA address) and its own 4 KiB
 * buffer at device address 0x40000, one transfer at a time, each ending
 * about 100 ms later (qemu's timer). A read gathers the mapping's pieces
 * into that buffer, then copies the buffer to a coherent bounce buffer;
 * a write does the reverse. Before a read the buffer is poisoned, so a
 * transfer that moved nothing cannot pass for one that moved the right
 * bytes.
 *
 * Imports are dynamic and peer-to-peer capable, with a move callback that
 * unmaps at once (an mlx5-like NIC); PINNED pins and maps at import until
 * release (on 7.1+ without a callback: a pinning NIC that is not
 * revocable). The DMA runs with the buffer's resv held, so a revoke's
 * notification waits for a transfer in flight, as a NIC's would for its
 * fence.
 *
 * Locking: file->lock -> dma-buf resv -> edu->dma_lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/io.h>
#include <linux/iommu.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "compat.h"
#include "kvd_edu.h"

#define EDU_VENDOR		0x1234
#define EDU_DEVICE		0x11e8
#define EDU_REG_IDENT		0x00	/* 0xRRrr00ed */
#define EDU_REG_DMA_SRC		0x80
#define EDU_REG_DMA_DST		0x88
#define EDU_REG_DMA_CNT		0x90
#define EDU_REG_DMA_CMD		0x98
#define EDU_DMA_RUN		0x1
#define EDU_DMA_TO_RAM		0x2	/* else from RAM to the edu buffer */
#define EDU_BUF			0x40000	/* the engine's buffer, device side */
#define EDU_DMA_BITS		28	/* the engine drops higher bits */
#define EDU_DMA_TIMEOUT_MS	10000	/* 100 ms each, TCG may be slow */

#define KVD_EDU_MAX_IMPORTS	16

struct kvd_edu {
	struct pci_dev *pdev;
	void __iomem *mmio;
	struct mutex dma_lock;		/* the engine, its buffer, bounce */
	void *bounce;			/* coherent, KVD_EDU_MAX_ACCESS bytes */
	dma_addr_t bounce_dma;
	u64 dmas;			/* dma_lock */
	struct miscdevice misc;
};

/* One edu device is driven (the test VM has one). */
static struct kvd_edu *kvd_edu;
static DEFINE_MUTEX(kvd_edu_bind_lock);

struct kvd_edu_imp {
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	struct sg_table *sgt;		/* current mapping; resv */
	dma_addr_t last_dma;		/* first address of the latest map */
	bool ever_mapped;
	bool pinned;
	u64 maps;			/* resv, as all counters */
	u64 invalidations;
	u64 failed;
	u64 accesses;
};

struct kvd_edu_file {
	struct mutex lock;		/* imports[] */
	struct kvd_edu_imp *imports[KVD_EDU_MAX_IMPORTS];
};

/* ---- the engine ---- */

/* One transfer of @len bytes; edu->dma_lock held. 0 or -ETIMEDOUT. */
static int edu_dma(struct kvd_edu *edu, u64 src, u64 dst, u32 len, u32 dir)
{
	unsigned long end = jiffies + msecs_to_jiffies(EDU_DMA_TIMEOUT_MS);

	lockdep_assert_held(&edu->dma_lock);
	writeq(src, edu->mmio + EDU_REG_DMA_SRC);
	writeq(dst, edu->mmio + EDU_REG_DMA_DST);
	writeq(len, edu->mmio + EDU_REG_DMA_CNT);
	writeq(EDU_DMA_RUN | dir, edu->mmio + EDU_REG_DMA_CMD);
	while (readq(edu->mmio + EDU_REG_DMA_CMD) & EDU_DMA_RUN) {
		if (time_after(jiffies, end)) {
			pci_err(edu->pdev, "DMA of %u bytes did not finish\n", len);
			return -ETIMEDOUT;
		}
		usleep_range(2000, 5000);
	}
	edu->dmas++;
	return 0;
}

/* Fills the engine's buffer [0, @len) with KVD_EDU_POISON. */
static int edu_poison(struct kvd_edu *edu, u32 len)
{
	memset(edu->bounce, KVD_EDU_POISON, len);
	return edu_dma(edu, edu->bounce_dma, EDU_BUF, len, 0);
}

/* ---- imports ---- */

static void kvd_edu_unmap(struct kvd_edu_imp *imp)
{
	if (!imp->sgt)
		return;
	dma_buf_unmap_attachment(imp->attach, imp->sgt, DMA_BIDIRECTIONAL);
	imp->sgt = NULL;
}

static void kvd_edu_move_notify(struct dma_buf_attachment *attach)
{
	struct kvd_edu_imp *imp = attach->importer_priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	imp->invalidations++;
	if (imp->pinned) {
		pr_err("move notification on a pinned import\n");
		return;
	}
	kvd_edu_unmap(imp);
}

static const struct dma_buf_attach_ops kvd_edu_attach_ops = {
	.allow_peer2peer = true,
	.KVD_IMPORTER_NOTIFY_OP = kvd_edu_move_notify,
};

#ifdef KVD_HAVE_ATTACH_REVOCABLE
/*
 * Linux 7.1+: a pinned importer with a callback would claim to be
 * revocable (dma_buf_attach_revocable()); this one is a plain pinning NIC.
 */
static const struct dma_buf_attach_ops kvd_edu_pinned_ops = {
	.allow_peer2peer = true,
};
#endif

/* resv held. */
static int kvd_edu_map(struct kvd_edu_imp *imp)
{
	struct sg_table *sgt;

	if (imp->sgt)
		return 0;
	sgt = dma_buf_map_attachment(imp->attach, DMA_BIDIRECTIONAL);
	if (IS_ERR_OR_NULL(sgt))
		return sgt ? PTR_ERR(sgt) : -ENOMEM;
	if (!sgt->nents) {
		dma_buf_unmap_attachment(imp->attach, sgt, DMA_BIDIRECTIONAL);
		return -EIO;
	}
	imp->sgt = sgt;
	imp->last_dma = sg_dma_address(sgt->sgl);
	imp->ever_mapped = true;
	imp->maps++;
	return 0;
}

static void kvd_edu_destroy(struct kvd_edu_imp *imp)
{
	dma_resv_lock(imp->dmabuf->resv, NULL);
	kvd_edu_unmap(imp);
	if (imp->pinned)
		dma_buf_unpin(imp->attach);
	dma_resv_unlock(imp->dmabuf->resv);
	dma_buf_detach(imp->dmabuf, imp->attach);
	dma_buf_put(imp->dmabuf);
	kfree(imp);
}

static struct kvd_edu_imp *kvd_edu_lookup(struct kvd_edu_file *f, u32 h)
{
	return h < KVD_EDU_MAX_IMPORTS ? f->imports[h] : NULL;
}

static long kvd_edu_import(struct kvd_edu_file *f, void __user *uarg)
{
	const struct dma_buf_attach_ops *ops;
	struct kvd_imp_import arg;
	struct kvd_edu_imp *imp;
	int slot, ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags & ~KVD_IMP_IMPORT_PINNED || arg.pad)
		return -EINVAL;
	for (slot = 0; slot < KVD_EDU_MAX_IMPORTS; slot++)
		if (!f->imports[slot])
			break;
	if (slot == KVD_EDU_MAX_IMPORTS)
		return -ENOSPC;

	imp = kzalloc(sizeof(*imp), GFP_KERNEL);
	if (!imp)
		return -ENOMEM;
	imp->pinned = arg.flags & KVD_IMP_IMPORT_PINNED;
	imp->dmabuf = dma_buf_get(arg.fd);
	if (IS_ERR(imp->dmabuf)) {
		ret = PTR_ERR(imp->dmabuf);
		goto err_free;
	}
	ops = &kvd_edu_attach_ops;
#ifdef KVD_HAVE_ATTACH_REVOCABLE
	if (imp->pinned)
		ops = &kvd_edu_pinned_ops;
#endif
	imp->attach = dma_buf_dynamic_attach(imp->dmabuf, &kvd_edu->pdev->dev,
					     ops, imp);
	if (IS_ERR(imp->attach)) {
		ret = PTR_ERR(imp->attach);
		goto err_put;
	}
	if (imp->pinned) {
		dma_resv_lock(imp->dmabuf->resv, NULL);
		ret = dma_buf_pin(imp->attach);
		if (!ret) {
			ret = kvd_edu_map(imp);
			if (ret)
				dma_buf_unpin(imp->attach);
		}
		dma_resv_unlock(imp->dmabuf->resv);
		if (ret)
			goto err_detach;
	}

	arg.handle = slot;
	if (copy_to_user(uarg, &arg, sizeof(arg))) {
		kvd_edu_destroy(imp);
		return -EFAULT;
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

/*
 * Moves [@off, @off + @len) between the mapping and the engine's buffer
 * (at 0), one transfer per contiguous piece of DMA addresses; resv and
 * edu->dma_lock held.
 */
static int kvd_edu_gather(struct kvd_edu *edu, struct kvd_edu_imp *imp,
			  u64 off, u32 len, bool to_ram)
{
	u64 pos = 0, end = off + len;
	struct scatterlist *sg;
	unsigned int i;
	int ret;

	for_each_sgtable_dma_sg(imp->sgt, sg, i) {
		u64 seg_end = pos + sg_dma_len(sg);
		u64 from = max(pos, off), to = min(seg_end, end);

		if (from < to) {
			u64 mem = sg_dma_address(sg) + (from - pos);
			u64 dev = EDU_BUF + (from - off);

			ret = to_ram ?
			      edu_dma(edu, dev, mem, to - from, EDU_DMA_TO_RAM) :
			      edu_dma(edu, mem, dev, to - from, 0);
			if (ret)
				return ret;
		}
		pos = seg_end;
		if (pos >= end)
			return 0;
	}
	return -EIO;	/* mapping shorter than the dma-buf */
}

/* resv held; @buf is kernel memory of @len bytes. */
static int kvd_edu_rw(struct kvd_edu *edu, struct kvd_edu_imp *imp,
		      void *buf, u64 off, u32 len, bool write)
{
	int ret;

	mutex_lock(&edu->dma_lock);
	if (write) {
		memcpy(edu->bounce, buf, len);
		ret = edu_dma(edu, edu->bounce_dma, EDU_BUF, len, 0);
		if (!ret)
			ret = kvd_edu_gather(edu, imp, off, len, true);
	} else {
		ret = edu_poison(edu, len);
		if (!ret)
			ret = kvd_edu_gather(edu, imp, off, len, false);
		if (!ret) {
			memset(edu->bounce, 0, len);
			ret = edu_dma(edu, EDU_BUF, edu->bounce_dma, len,
				      EDU_DMA_TO_RAM);
		}
		if (!ret)
			memcpy(buf, edu->bounce, len);
	}
	mutex_unlock(&edu->dma_lock);
	return ret;
}

static long kvd_edu_access(struct kvd_edu_file *f, void __user *uarg)
{
	struct kvd_imp_access arg;
	struct kvd_edu_imp *imp;
	u8 *buf;
	bool write;
	int ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags & ~KVD_IMP_ACCESS_WRITE)
		return -EINVAL;
	if (!arg.length || arg.length > KVD_EDU_MAX_ACCESS)
		return -EINVAL;
	imp = kvd_edu_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	if (arg.offset > imp->dmabuf->size ||
	    arg.length > imp->dmabuf->size - arg.offset)
		return -EINVAL;

	write = arg.flags & KVD_IMP_ACCESS_WRITE;
	buf = kmalloc(arg.length, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	if (write && copy_from_user(buf, u64_to_user_ptr(arg.buf), arg.length)) {
		ret = -EFAULT;
		goto out;
	}

	dma_resv_lock(imp->dmabuf->resv, NULL);
	ret = kvd_edu_map(imp);
	if (ret) {
		imp->failed++;
	} else {
		ret = kvd_edu_rw(kvd_edu, imp, buf, arg.offset, arg.length,
				 write);
		if (!ret)
			imp->accesses++;
	}
	dma_resv_unlock(imp->dmabuf->resv);

	if (!ret && !write &&
	    copy_to_user(u64_to_user_ptr(arg.buf), buf, arg.length))
		ret = -EFAULT;
out:
	kfree(buf);
	return ret;
}

static long kvd_edu_counters(struct kvd_edu_file *f, void __user *uarg)
{
	struct kvd_imp_counters arg;
	struct kvd_edu_imp *imp;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	imp = kvd_edu_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	dma_resv_lock(imp->dmabuf->resv, NULL);
	arg.mapped = !!imp->sgt;
	arg.maps = imp->maps;
	arg.invalidations = imp->invalidations;
	arg.failed = imp->failed;
	arg.accesses = imp->accesses;
	dma_resv_unlock(imp->dmabuf->resv);
	return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
}

static long kvd_edu_release(struct kvd_edu_file *f, void __user *uarg)
{
	struct kvd_imp_release arg;
	struct kvd_edu_imp *imp;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.pad)
		return -EINVAL;
	imp = kvd_edu_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	f->imports[arg.handle] = NULL;
	kvd_edu_destroy(imp);
	return 0;
}

static long kvd_edu_info(void __user *uarg)
{
	struct iommu_domain *dom = iommu_get_domain_for_dev(&kvd_edu->pdev->dev);
	struct kvd_edu_info arg = {
		.translated = dom && (dom->type & __IOMMU_DOMAIN_PAGING),
		.strict = dom && dom->type == IOMMU_DOMAIN_DMA,
		.dma_mask_bits = EDU_DMA_BITS,
	};

	strscpy(arg.pci_slot, pci_name(kvd_edu->pdev), sizeof(arg.pci_slot));
	mutex_lock(&kvd_edu->dma_lock);
	arg.dmas = kvd_edu->dmas;
	mutex_unlock(&kvd_edu->dma_lock);
	return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
}

/* A read of KVD_EDU_PROBE_LEN bytes at the import's last DMA address. */
static long kvd_edu_probe_stale(struct kvd_edu_file *f, void __user *uarg)
{
	struct kvd_edu *edu = kvd_edu;
	struct kvd_edu_probe arg;
	struct kvd_edu_imp *imp;
	int ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.pad)
		return -EINVAL;
	imp = kvd_edu_lookup(f, arg.handle);
	if (!imp)
		return -ENOENT;
	dma_resv_lock(imp->dmabuf->resv, NULL);
	if (!imp->ever_mapped) {
		dma_resv_unlock(imp->dmabuf->resv);
		return -ENODATA;
	}
	arg.dma_addr = imp->last_dma;
	mutex_lock(&edu->dma_lock);
	ret = edu_poison(edu, KVD_EDU_PROBE_LEN);
	if (!ret)
		ret = edu_dma(edu, arg.dma_addr, EDU_BUF, KVD_EDU_PROBE_LEN, 0);
	if (!ret)
		ret = edu_dma(edu, EDU_BUF, edu->bounce_dma, KVD_EDU_PROBE_LEN,
			      EDU_DMA_TO_RAM);
	if (!ret)
		memcpy(arg.data, edu->bounce, KVD_EDU_PROBE_LEN);
	mutex_unlock(&edu->dma_lock);
	dma_resv_unlock(imp->dmabuf->resv);
	if (ret)
		return ret;
	return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
}

static long kvd_edu_ioctl(struct file *file, unsigned int cmd,
			  unsigned long arg)
{
	struct kvd_edu_file *f = file->private_data;
	void __user *uarg = (void __user *)arg;
	long ret;

	mutex_lock(&f->lock);
	switch (cmd) {
	case KVD_IMP_IOCTL_IMPORT:
		ret = kvd_edu_import(f, uarg);
		break;
	case KVD_IMP_IOCTL_ACCESS:
		ret = kvd_edu_access(f, uarg);
		break;
	case KVD_IMP_IOCTL_COUNTERS:
		ret = kvd_edu_counters(f, uarg);
		break;
	case KVD_IMP_IOCTL_RELEASE:
		ret = kvd_edu_release(f, uarg);
		break;
	case KVD_EDU_IOCTL_INFO:
		ret = kvd_edu_info(uarg);
		break;
	case KVD_EDU_IOCTL_PROBE:
		ret = kvd_edu_probe_stale(f, uarg);
		break;
	default:
		ret = -ENOTTY;
	}
	mutex_unlock(&f->lock);
	return ret;
}

static int kvd_edu_open(struct inode *inode, struct file *file)
{
	struct kvd_edu_file *f;

	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	file->private_data = f;
	return nonseekable_open(inode, file);
}

static int kvd_edu_file_release(struct inode *inode, struct file *file)
{
	struct kvd_edu_file *f = file->private_data;
	int i;

	for (i = 0; i < KVD_EDU_MAX_IMPORTS; i++)
		if (f->imports[i])
			kvd_edu_destroy(f->imports[i]);
	mutex_destroy(&f->lock);
	kfree(f);
	return 0;
}

static const struct file_operations kvd_edu_fops = {
	.owner = THIS_MODULE,
	.open = kvd_edu_open,
	.release = kvd_edu_file_release,
	.unlocked_ioctl = kvd_edu_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

/* ---- the PCI driver ---- */

static int kvd_edu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct kvd_edu *edu;
	u32 ident;
	int ret;

	mutex_lock(&kvd_edu_bind_lock);
	if (kvd_edu) {
		ret = -EBUSY;
		goto out_unlock;
	}
	ret = -ENOMEM;
	edu = kzalloc(sizeof(*edu), GFP_KERNEL);
	if (!edu)
		goto out_unlock;
	edu->pdev = pdev;
	mutex_init(&edu->dma_lock);
	ret = pci_enable_device_mem(pdev);
	if (ret)
		goto err_free;
	ret = pci_request_region(pdev, 0, KBUILD_MODNAME);
	if (ret)
		goto err_disable;
	ret = -ENOMEM;
	edu->mmio = pci_iomap(pdev, 0, 0);
	if (!edu->mmio)
		goto err_release;
	ret = -ENODEV;
	ident = readl(edu->mmio + EDU_REG_IDENT);
	if ((ident & 0xff) != 0xed) {
		pci_err(pdev, "not an edu device (ident %#x)\n", ident);
		goto err_unmap;
	}
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(EDU_DMA_BITS));
	if (ret)
		goto err_unmap;
	pci_set_master(pdev);
	ret = -ENOMEM;
	edu->bounce = dma_alloc_coherent(&pdev->dev, KVD_EDU_MAX_ACCESS,
					 &edu->bounce_dma, GFP_KERNEL);
	if (!edu->bounce)
		goto err_master;
	edu->misc.minor = MISC_DYNAMIC_MINOR;
	edu->misc.name = "kvd_edu";
	edu->misc.fops = &kvd_edu_fops;
	edu->misc.mode = 0600;
	pci_set_drvdata(pdev, edu);
	kvd_edu = edu;		/* before the node appears */
	ret = misc_register(&edu->misc);
	if (ret)
		goto err_coherent;
	mutex_unlock(&kvd_edu_bind_lock);
	pci_info(pdev, "edu %u.%u, DMA mask %u bits\n", ident >> 24,
		 (ident >> 16) & 0xff, EDU_DMA_BITS);
	return 0;

err_coherent:
	kvd_edu = NULL;
	dma_free_coherent(&pdev->dev, KVD_EDU_MAX_ACCESS, edu->bounce,
			  edu->bounce_dma);
err_master:
	pci_clear_master(pdev);
err_unmap:
	pci_iounmap(pdev, edu->mmio);
err_release:
	pci_release_region(pdev, 0);
err_disable:
	pci_disable_device(pdev);
err_free:
	kfree(edu);
out_unlock:
	mutex_unlock(&kvd_edu_bind_lock);
	return ret;
}

/*
 * Open files pin the module, so on rmmod none is left here. (Unbinding
 * the device through sysfs while a file is open is not supported: this
 * is a test module.)
 */
static void kvd_edu_remove(struct pci_dev *pdev)
{
	struct kvd_edu *edu = pci_get_drvdata(pdev);

	misc_deregister(&edu->misc);
	mutex_lock(&kvd_edu_bind_lock);
	kvd_edu = NULL;
	mutex_unlock(&kvd_edu_bind_lock);
	dma_free_coherent(&pdev->dev, KVD_EDU_MAX_ACCESS, edu->bounce,
			  edu->bounce_dma);
	pci_clear_master(pdev);
	pci_iounmap(pdev, edu->mmio);
	pci_release_region(pdev, 0);
	pci_disable_device(pdev);
	mutex_destroy(&edu->dma_lock);
	kfree(edu);
}

static const struct pci_device_id kvd_edu_ids[] = {
	{ PCI_DEVICE(EDU_VENDOR, EDU_DEVICE) },
	{ }
};
MODULE_DEVICE_TABLE(pci, kvd_edu_ids);

static struct pci_driver kvd_edu_driver = {
	.name = "kvd_edu",
	.id_table = kvd_edu_ids,
	.probe = kvd_edu_probe,
	.remove = kvd_edu_remove,
};
module_pci_driver(kvd_edu_driver);

MODULE_DESCRIPTION("kvdmabuf test-only importer doing real DMA with qemu's edu device");
MODULE_LICENSE("GPL");
KVD_IMPORT_NS_DMA_BUF();
