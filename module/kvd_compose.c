// SPDX-License-Identifier: GPL-2.0
/*
 * Layouts of ranges (KVDMABUF_IOCTL_RANGES): a proxy whose length is
 * covered by pieces, each a window of a backing dma-buf (a *source*) or
 * unbacked. A layout is an immutable dma-buf of the module's own (a
 * *composite*), never handed to user space: the proxy takes it as its
 * backing like any other, so a batch of range changes is one replace of
 * the proxy's backing, with one move notification, the drain and the
 * stale rules of a replace (kvd_ioctl.c, kvd_stale.c).
 *
 * A new layout shares the sources of the one it was made from (its
 * *family*: the layouts of one proxy), and a source keeps one mapping per
 * importer device for all the layouts that use it: a batch maps only the
 * backings it brings in. The proxy's slot prepares a layout in the call
 * (kvd_layout_prepare(): what may fail) and maps it at its importer's
 * first map after it (kvd_slot_map()): the preparation takes the pieces
 * kept whole from the base's (a reference and a window each, no lookup
 * nor walk), and only the map builds the table of the whole proxy that
 * dma-buf hands an importer. Unbacked pieces map to a zeroed scratch
 * buffer of the layout's own, which holds nobody's data.
 *
 * Locking: (proxy resv, at a first map) -> composite resv (a lockdep
 * class of its own) -> source->lock -> source resv; family->lock is
 * innermost. A source's move notification (its resv held) only queues
 * work.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-mapping.h>
#include <linux/bsearch.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/vmalloc.h>

#include "kvd.h"

/* The scratch behind unbacked pieces: up to 2 MiB, as few entries as can be. */
#define KVD_SCRATCH_MAX_ORDER	get_order(SZ_2M)

/* The layouts of one proxy, each made from the one before. */
struct kvd_family {
	struct kref ref;
	spinlock_t lock;		/* all below, and each layout's maps */
	struct list_head layouts;	/* struct kvd_composite, exported */
	u64 seq;			/* of the last layout exported */
};

/* A backing dma-buf that pieces of one family's layouts map windows of. */
struct kvd_source {
	struct kref ref;
	struct dma_buf *dmabuf;		/* reference held */
	struct kvd_family *fam;		/* reference held */
	struct mutex lock;		/* maps */
	struct list_head maps;		/* struct kvd_source_map */
	bool invalidated;		/* its exporter moved it; its resv */
};

/* A source's mapping for one device, shared by the layouts using it. */
struct kvd_source_map {
	struct list_head node;		/* source->maps */
	struct kvd_source *src;
	struct device *dev;		/* reference held */
	struct dma_buf_attachment *bat;
	struct sg_table *sgt;
	/* per piece of composite maps; drops to zero under source->lock */
	refcount_t users;
	bool dying;			/* unpinning: a move is ours */
};

struct kvd_piece {
	u64 start;			/* in the proxy */
	u64 length;
	struct kvd_source *src;		/* NULL: unbacked */
	u64 offset;			/* in src */
	unsigned int from;		/* 1 + the base's piece it is all of; 0 */
};

/* A source a composite's pieces use. */
struct kvd_use {
	struct kvd_source *src;		/* reference held */
	u64 bytes;			/* of the layout it backs */
};

struct kvd_composite {
	struct dma_buf *dmabuf;
	struct dma_resv resv;
	struct kvd_family *fam;		/* reference held */
	struct list_head node;		/* fam->layouts */
	u64 seq;			/* in the family, from 1 */
	u64 base_seq;			/* of the layout it was made from; 0 */
	struct list_head maps;		/* struct kvd_cmap; fam->lock */
	struct work_struct inval_work;	/* a source's exporter moved it */
	struct page *scratch;		/* NULL: no unbacked piece */
	unsigned int scratch_order;
	unsigned int nr_uses;
	struct kvd_use *uses;		/* one per distinct source, by dma-buf */
	unsigned int nr_novmap;		/* uses whose dma-buf has no vmap */
	struct iosys_map *src_vmaps;	/* per use, while CPU-mapped; resv */
	void *vaddr;			/* the layout's CPU mapping; resv */
	unsigned int nr;
	struct kvd_piece pieces[];
};

/* attach->priv of an attachment to a composite (a proxy's slot). */
struct kvd_cattach {
	struct kvd_cmap *m;		/* once prepared; composite resv */
	dma_addr_t scratch_dma;
	bool scratch_mapped;
};

/*
 * A layout's pieces mapped for one attachment (a proxy's slot): the source
 * maps, where each window lies, and the table built from them at the
 * first map. Referenced by the attachment, and briefly by the next
 * layout's preparation taking the pieces it keeps from it.
 */
struct kvd_cmap {
	struct kref ref;
	struct list_head node;		/* composite->maps; fam->lock */
	struct device *dev;
	unsigned int nr;
	struct kvd_source_map **sm;	/* per piece, NULL if unbacked */
	/*
	 * per backed piece: its window in its source map's table, the
	 * exporter's, which nobody edits while the source map lives (the
	 * proxy's importers may edit the composite's table they are lent:
	 * ib_umem trims the ends of its window in place while mapped)
	 */
	struct kvd_win *win;
	u64 nents;			/* of the table */
	struct sg_table sgt;		/* while mapped; composite resv */
};

static struct lock_class_key kvd_composite_resv_key;

/* ---- families and sources ---- */

static struct kvd_family *kvd_family_new(void)
{
	struct kvd_family *fam = kzalloc(sizeof(*fam), GFP_KERNEL_ACCOUNT);

	if (!fam)
		return NULL;
	kref_init(&fam->ref);
	spin_lock_init(&fam->lock);
	INIT_LIST_HEAD(&fam->layouts);
	return fam;
}

static void kvd_family_free(struct kref *ref)
{
	struct kvd_family *fam = container_of(ref, struct kvd_family, ref);

	WARN_ON_ONCE(!list_empty(&fam->layouts));
	kfree(fam);
}

static void kvd_family_put(struct kvd_family *fam)
{
	kref_put(&fam->ref, kvd_family_free);
}

static struct kvd_source *kvd_source_new(struct dma_buf *dmabuf,
					 struct kvd_family *fam)
{
	struct kvd_source *src = kzalloc(sizeof(*src), GFP_KERNEL_ACCOUNT);

	if (!src)
		return NULL;
	kref_init(&src->ref);
	src->dmabuf = dmabuf;
	kref_get(&fam->ref);
	src->fam = fam;
	mutex_init(&src->lock);
	INIT_LIST_HEAD(&src->maps);
	return src;
}

static void kvd_source_free(struct kref *ref)
{
	struct kvd_source *src = container_of(ref, struct kvd_source, ref);

	WARN_ON_ONCE(!list_empty(&src->maps));
	dma_buf_put(src->dmabuf);
	kvd_family_put(src->fam);
	mutex_destroy(&src->lock);
	kfree(src);
}

static void kvd_source_put(struct kvd_source *src)
{
	kref_put(&src->ref, kvd_source_free);
}

static int kvd_use_cmp(const void *key, const void *elt)
{
	unsigned long x = (unsigned long)key;
	unsigned long y = (unsigned long)((const struct kvd_use *)elt)->src->dmabuf;

	return x < y ? -1 : x > y;
}

/* The use of @dmabuf's source among @n uses (in dma-buf order), or NULL. */
static struct kvd_use *kvd_use_find(struct kvd_use *u, unsigned int n,
				    const struct dma_buf *dmabuf)
{
	return bsearch(dmabuf, u, n, sizeof(*u), kvd_use_cmp);
}

/*
 * The source's exporter moved or revoked it, though pinned (device reset,
 * unplug): every layout using it tells its importers, so the proxy
 * revokes itself (REVOKE_EXPORTER). Its resv is held here: only queue.
 */
static void kvd_source_notify(struct dma_buf_attachment *bat)
{
	struct kvd_source_map *sm = bat->importer_priv;
	struct kvd_source *src = sm->src;
	struct kvd_composite *c;
	struct kvd_use *u;

	if (sm->dying || !sm->sgt)
		return;
	/*
	 * A layout being built now, not yet exported, must not take the
	 * stale mapping either: its preparation and its map check this.
	 */
	WRITE_ONCE(src->invalidated, true);
	spin_lock(&src->fam->lock);
	list_for_each_entry(c, &src->fam->layouts, node) {
		u = kvd_use_find(c->uses, c->nr_uses, src->dmabuf);
		if (u && u->src == src)
			queue_work(kvd_wq, &c->inval_work);
	}
	spin_unlock(&src->fam->lock);
}

static const struct dma_buf_attach_ops kvd_source_attach_ops = {
	.allow_peer2peer = true,
	.KVD_IMPORTER_NOTIFY_OP = kvd_source_notify,
};

static void kvd_source_map_destroy(struct kvd_source_map *sm)
{
	struct dma_resv *resv = sm->src->dmabuf->resv;

	dma_resv_lock(resv, NULL);
	sm->dying = true;
	if (sm->sgt)
		dma_buf_unmap_attachment(sm->bat, sm->sgt, DMA_BIDIRECTIONAL);
	dma_buf_unpin(sm->bat);
	dma_resv_unlock(resv);
	dma_buf_detach(sm->src->dmabuf, sm->bat);
	put_device(sm->dev);
	kfree(sm);
}

/*
 * The source's mapping for @dev, made (dynamic, peer-to-peer, pinned) on
 * first use: a layout's map takes one for each backed piece.
 */
static struct kvd_source_map *kvd_source_map_get(struct kvd_source *src,
						 struct device *dev)
{
	struct dma_resv *resv = src->dmabuf->resv;
	struct kvd_source_map *sm;
	struct sg_table *sgt;
	int ret;

	mutex_lock(&src->lock);
	list_for_each_entry(sm, &src->maps, node) {
		if (sm->dev == dev) {
			refcount_inc(&sm->users);
			goto out;
		}
	}
	sm = kzalloc(sizeof(*sm), GFP_KERNEL_ACCOUNT);
	if (!sm) {
		sm = ERR_PTR(-ENOMEM);
		goto out;
	}
	sm->src = src;
	sm->dev = get_device(dev);
	sm->bat = dma_buf_dynamic_attach(src->dmabuf, dev,
					 &kvd_source_attach_ops, sm);
	if (IS_ERR(sm->bat)) {
		ret = PTR_ERR(sm->bat);
		put_device(sm->dev);
		kfree(sm);
		sm = ERR_PTR(ret);
		goto out;
	}
	dma_resv_lock(resv, NULL);
	ret = dma_buf_pin(sm->bat);
	if (ret) {
		dma_resv_unlock(resv);
		dma_buf_detach(src->dmabuf, sm->bat);
		put_device(sm->dev);
		kfree(sm);
		sm = ERR_PTR(ret);
		goto out;
	}
	sgt = dma_buf_map_attachment(sm->bat, DMA_BIDIRECTIONAL);
	if (!IS_ERR_OR_NULL(sgt))
		sm->sgt = sgt;
	dma_resv_unlock(resv);
	/* Not before the exporter's move into place has finished. */
	ret = IS_ERR_OR_NULL(sgt) ? (sgt ? PTR_ERR(sgt) : -EIO) :
	      kvd_wait_kernel_fences(resv);
	if (ret) {
		kvd_source_map_destroy(sm);
		sm = ERR_PTR(ret);
		goto out;
	}
	refcount_set(&sm->users, 1);
	list_add_tail(&sm->node, &src->maps);
out:
	mutex_unlock(&src->lock);
	return sm;
}

static void kvd_source_map_put(struct kvd_source_map *sm)
{
	struct kvd_source *src = sm->src;

	/* Only the last user takes the lock: lookups never see it at zero. */
	if (!refcount_dec_and_mutex_lock(&sm->users, &src->lock))
		return;
	list_del(&sm->node);
	/* the map's own reference keeps src until it is destroyed */
	kref_get(&src->ref);
	mutex_unlock(&src->lock);
	kvd_source_map_destroy(sm);
	kvd_source_put(src);
}

/* ---- the composite's dma_buf_ops ---- */

static void kvd_cmap_free(struct kref *ref)
{
	struct kvd_cmap *m = container_of(ref, struct kvd_cmap, ref);
	unsigned int i;

	for (i = 0; i < m->nr; i++)
		if (m->sm[i])
			kvd_source_map_put(m->sm[i]);
	sg_free_table(&m->sgt);
	kvfree(m->win);
	kvfree(m->sm);
	kfree(m);
}

static void kvd_cmap_put(struct kvd_cmap *m)
{
	kref_put(&m->ref, kvd_cmap_free);
}

static int kvd_composite_attach(struct dma_buf *dmabuf,
				struct dma_buf_attachment *attach)
{
	struct kvd_cattach *cat;

	/* Only the module's own slots attach: dynamic and peer-to-peer. */
	if (!attach->importer_ops || !attach->peer2peer)
		return -EOPNOTSUPP;
	cat = kzalloc(sizeof(*cat), GFP_KERNEL_ACCOUNT);
	if (!cat)
		return -ENOMEM;
	attach->priv = cat;
	return 0;
}

static void kvd_composite_detach(struct dma_buf *dmabuf,
				 struct dma_buf_attachment *attach)
{
	struct kvd_composite *c = dmabuf->priv;
	struct kvd_cattach *cat = attach->priv;

	if (cat->m) {
		spin_lock(&c->fam->lock);
		list_del(&cat->m->node);
		spin_unlock(&c->fam->lock);
		kvd_cmap_put(cat->m);
	}
	if (cat->scratch_mapped)
		dma_unmap_page(attach->dev, cat->scratch_dma,
			       PAGE_SIZE << c->scratch_order,
			       DMA_BIDIRECTIONAL);
	kfree(cat);
}

/* Its pieces are pinned while prepared: nothing of a composite moves. */
static int kvd_composite_pin(struct dma_buf_attachment *attach)
{
	return 0;
}

static void kvd_composite_unpin(struct dma_buf_attachment *attach)
{
}

/*
 * The preparation for @dev of the layout @c was made from, while that is
 * still exported and attached for @dev: referenced, or NULL.
 */
static struct kvd_cmap *kvd_base_map(struct kvd_composite *c,
				     struct device *dev)
{
	struct kvd_cmap *m = NULL, *bm;
	struct kvd_composite *b;

	if (!c->base_seq)
		return NULL;
	spin_lock(&c->fam->lock);
	list_for_each_entry(b, &c->fam->layouts, node) {
		if (b->seq != c->base_seq)
			continue;
		list_for_each_entry(bm, &b->maps, node) {
			if (bm->dev == dev) {
				kref_get(&bm->ref);
				m = bm;
				break;
			}
		}
		break;
	}
	spin_unlock(&c->fam->lock);
	return m;
}

/* The base's piece that @p is all of, prepared in @bm; or -1. */
static long kvd_kept_piece(struct kvd_cmap *bm, const struct kvd_piece *p)
{
	unsigned int k = p->from - 1;

	if (!bm || !p->from || WARN_ON_ONCE(k >= bm->nr) || !bm->sm[k] ||
	    WARN_ON_ONCE(bm->sm[k]->src != p->src))
		return -1;
	return k;
}

/**
 * kvd_layout_prepare() - map a layout's pieces for a slot's attachment
 * @attach: the slot's attachment to the layout (its resv held)
 *
 * What may fail, done while the RANGES call can still fail whole: each
 * backed piece's source mapped for the device, and the scratch behind
 * unbacked ones. A piece kept whole from the base takes its source map (a
 * reference) and where its window lies from the base's preparation for
 * the device: no lookup under the source's lock, no walk of its table.
 * The table itself is built at the first map (kvd_composite_map()).
 *
 * Return: 0; -ENOMEM; -ENODEV (a piece's backing was moved or revoked);
 * -ERANGE (its exporter maps less than its size); -E2BIG (a table of
 * more than UINT_MAX entries); a backing exporter's error.
 */
int kvd_layout_prepare(struct dma_buf_attachment *attach)
{
	struct kvd_composite *c = attach->dmabuf->priv;
	struct kvd_cattach *cat = attach->priv;
	u64 chunk = PAGE_SIZE << c->scratch_order;
	struct kvd_cmap *m, *bm;
	struct kvd_piece *p;
	unsigned int i;
	long k;
	int ret;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (cat->m)
		return 0;
	m = kzalloc(sizeof(*m), GFP_KERNEL_ACCOUNT);
	if (!m)
		return -ENOMEM;
	kref_init(&m->ref);
	INIT_LIST_HEAD(&m->node);
	m->dev = attach->dev;
	m->nr = c->nr;
	m->sm = kvcalloc(c->nr, sizeof(*m->sm), GFP_KERNEL_ACCOUNT);
	/* only backed pieces' windows are written and read */
	m->win = kvmalloc_array(c->nr, sizeof(*m->win), GFP_KERNEL_ACCOUNT);
	if (!m->sm || !m->win) {
		kvd_cmap_put(m);
		return -ENOMEM;
	}
	if (c->scratch && !cat->scratch_mapped) {
		cat->scratch_dma = dma_map_page(attach->dev, c->scratch, 0,
						chunk, DMA_BIDIRECTIONAL);
		if (dma_mapping_error(attach->dev, cat->scratch_dma)) {
			kvd_cmap_put(m);
			return -EIO;
		}
		cat->scratch_mapped = true;
	}
	bm = kvd_base_map(c, attach->dev);
	for (i = 0; i < c->nr; i++) {
		p = &c->pieces[i];
		if (!p->src) {
			m->nents += DIV_ROUND_UP(p->length, chunk);
			continue;
		}
		/* as a backing's: the proxy revokes itself (kvd_attach()) */
		if (READ_ONCE(p->src->invalidated)) {
			ret = -ENODEV;
			goto err;
		}
		k = kvd_kept_piece(bm, p);
		if (k >= 0) {
			m->sm[i] = bm->sm[k];
			refcount_inc(&m->sm[i]->users);
			m->win[i] = bm->win[k];
		} else {
			m->sm[i] = kvd_source_map_get(p->src, attach->dev);
			if (IS_ERR(m->sm[i])) {
				ret = PTR_ERR(m->sm[i]);
				m->sm[i] = NULL;
				goto err;
			}
			ret = kvd_sg_window_find(m->sm[i]->sgt, p->offset,
						 p->length, &m->win[i]);
			if (ret)
				goto err;
		}
		m->nents += m->win[i].nents;
	}
	if (m->nents > UINT_MAX) {
		ret = -E2BIG;
		goto err;
	}
	if (bm)
		kvd_cmap_put(bm);
	spin_lock(&c->fam->lock);
	list_add_tail(&m->node, &c->maps);
	spin_unlock(&c->fam->lock);
	cat->m = m;
	return 0;

err:
	if (bm)
		kvd_cmap_put(bm);
	kvd_cmap_put(m);
	return ret;
}

/*
 * The pieces' DMA table for the attachment's device, from its preparation:
 * each backed piece a window of its source's mapping, each unbacked one
 * the scratch. Built here, at the first map after a RANGES call (the
 * proxy's importer's first map), not in the call: one chunk's call costs
 * what it changes, and the calls between two transfers build one table.
 */
static struct sg_table *kvd_composite_map(struct dma_buf_attachment *attach,
					  enum dma_data_direction dir)
{
	struct kvd_composite *c = attach->dmabuf->priv;
	struct kvd_cattach *cat = attach->priv;
	u64 chunk = PAGE_SIZE << c->scratch_order, left;
	struct scatterlist *dsg;
	struct kvd_piece *p;
	struct kvd_cmap *m;
	unsigned int i;
	int ret;

	dma_resv_assert_held(attach->dmabuf->resv);
	ret = kvd_layout_prepare(attach);
	if (ret)
		return ERR_PTR(ret);
	m = cat->m;
	/* One map at a time: a slot maps its attachment once. */
	if (WARN_ON_ONCE(m->sgt.sgl))
		return ERR_PTR(-EBUSY);
	/* a piece's backing moved since: its mapping is gone, or going */
	for (i = 0; i < c->nr; i++)
		if (c->pieces[i].src && READ_ONCE(c->pieces[i].src->invalidated))
			return ERR_PTR(-ENODEV);
	ret = sg_alloc_table(&m->sgt, m->nents, GFP_KERNEL_ACCOUNT);
	if (ret)
		return ERR_PTR(ret);
	dsg = m->sgt.sgl;
	for (i = 0; i < c->nr; i++) {
		p = &c->pieces[i];
		if (p->src) {
			dsg = kvd_sg_window_copy(dsg, &m->win[i], p->length);
			continue;
		}
		for (left = p->length; left; left -= min(left, chunk)) {
			sg_dma_address(dsg) = cat->scratch_dma;
			sg_dma_len(dsg) = min(left, chunk);
			dsg = sg_next(dsg);
		}
	}
	m->sgt.nents = m->nents;
	return &m->sgt;
}

static void kvd_composite_unmap(struct dma_buf_attachment *attach,
				struct sg_table *sgt,
				enum dma_data_direction dir)
{
	struct kvd_cattach *cat = attach->priv;

	if (WARN_ON_ONCE(!cat->m || sgt != &cat->m->sgt))
		return;
	sg_free_table(sgt);
	memset(sgt, 0, sizeof(*sgt));
}

#ifdef KVD_HAVE_VMAP_UNLOCKED
/* The page behind a source's kernel mapping at @addr, if it has one. */
static struct page *kvd_mapped_page(void *addr)
{
	if (is_vmalloc_addr(addr))
		return vmalloc_to_page(addr);
	return virt_addr_valid(addr) ? virt_to_page(addr) : NULL;
}

static void kvd_composite_src_vunmap(struct kvd_composite *c, unsigned int n)
{
	while (n--)
		dma_buf_vunmap_unlocked(c->uses[n].src->dmabuf,
					&c->src_vmaps[n]);
	kvfree(c->src_vmaps);
	c->src_vmaps = NULL;
}

/*
 * CPU access (a software NIC, kvd_ops.c's kvd_vmap()): one kernel mapping
 * of the whole layout, made of the pages behind each source's own kernel
 * mapping (held while it lasts) and of the scratch. Only sources whose
 * mapping is memory with struct pages (vmalloc or the linear map: shmem,
 * udmabuf) can take part: I/O memory gives -EOPNOTSUPP. The pages are
 * mapped cached, whatever the source's own mapping is: this serves
 * software importers, not a device's coherent view.
 */
static int kvd_composite_vmap(struct dma_buf *dmabuf, struct iosys_map *map)
{
	struct kvd_composite *c = dmabuf->priv;
	unsigned long npages = dmabuf->size >> PAGE_SHIFT, pg = 0, k;
	struct page **pages;
	struct kvd_use *u;
	struct kvd_piece *p;
	unsigned int i, n = 0;
	void *vaddr;
	int ret = 0;

	dma_resv_assert_held(dmabuf->resv);
	pages = kvmalloc_array(npages, sizeof(*pages), GFP_KERNEL);
	c->src_vmaps = kvcalloc(max(c->nr_uses, 1U), sizeof(*c->src_vmaps),
				GFP_KERNEL);
	if (!pages || !c->src_vmaps) {
		ret = -ENOMEM;
		goto out;
	}
	for (n = 0; n < c->nr_uses && !ret; n++) {
		ret = dma_buf_vmap_unlocked(c->uses[n].src->dmabuf,
					    &c->src_vmaps[n]);
		if (!ret && c->src_vmaps[n].is_iomem)
			ret = -EOPNOTSUPP;
		else if (ret)
			n--;	/* not mapped: nothing to undo for it */
	}
	for (i = 0; i < c->nr && !ret; i++) {
		p = &c->pieces[i];
		for (k = 0; k < p->length >> PAGE_SHIFT && !ret; k++, pg++) {
			if (!p->src) {
				/* one buddy block: within one memmap section */
				pages[pg] = c->scratch +
					    (k & ((1UL << c->scratch_order) - 1));
				continue;
			}
			u = kvd_use_find(c->uses, c->nr_uses, p->src->dmabuf);
			pages[pg] = kvd_mapped_page(c->src_vmaps[u - c->uses].vaddr +
						    p->offset + k * PAGE_SIZE);
			if (!pages[pg])
				ret = -EOPNOTSUPP;
		}
	}
	if (!ret) {
		vaddr = vmap(pages, npages, VM_MAP, PAGE_KERNEL);
		if (!vaddr)
			ret = -ENOMEM;
	}
out:
	kvfree(pages);
	if (ret) {
		if (c->src_vmaps)
			kvd_composite_src_vunmap(c, n);
		return ret;
	}
	c->vaddr = vaddr;
	iosys_map_set_vaddr(map, vaddr);
	return 0;
}

static void kvd_composite_vunmap(struct dma_buf *dmabuf, struct iosys_map *map)
{
	struct kvd_composite *c = dmabuf->priv;

	dma_resv_assert_held(dmabuf->resv);
	vunmap(c->vaddr);
	c->vaddr = NULL;
	kvd_composite_src_vunmap(c, c->nr_uses);
}
#endif

static void kvd_composite_release(struct dma_buf *dmabuf)
{
	struct kvd_composite *c = dmabuf->priv;
	unsigned int i;

	spin_lock(&c->fam->lock);
	WARN_ON_ONCE(!list_empty(&c->maps));
	list_del(&c->node);
	spin_unlock(&c->fam->lock);
	/* No source can queue it any more. */
	cancel_work_sync(&c->inval_work);
	for (i = 0; i < c->nr_uses; i++)
		kvd_source_put(c->uses[i].src);
	kvfree(c->uses);
	if (c->scratch)
		__free_pages(c->scratch, c->scratch_order);
	dma_resv_fini(&c->resv);
	kvd_family_put(c->fam);
	kvfree(c);
}

#define KVD_COMPOSITE_OPS					\
	.attach = kvd_composite_attach,				\
	.detach = kvd_composite_detach,				\
	.pin = kvd_composite_pin,				\
	.unpin = kvd_composite_unpin,				\
	.map_dma_buf = kvd_composite_map,			\
	.unmap_dma_buf = kvd_composite_unmap,			\
	.release = kvd_composite_release

static const struct dma_buf_ops kvd_composite_ops = {
	KVD_COMPOSITE_OPS,
};

/*
 * A layout whose every source has a kernel mapping: CPU importers may
 * vmap the proxy (its pin checks for .vmap, so they are told before).
 */
static const struct dma_buf_ops kvd_composite_vmap_ops = {
	KVD_COMPOSITE_OPS,
#ifdef KVD_HAVE_VMAP_UNLOCKED
	.vmap = kvd_composite_vmap,
	.vunmap = kvd_composite_vunmap,
#endif
};

/* Is @dmabuf a layout (a RANGES call's backing)? */
bool kvd_is_layout(const struct dma_buf *dmabuf)
{
	return dmabuf->ops == &kvd_composite_ops ||
	       dmabuf->ops == &kvd_composite_vmap_ops;
}

static void kvd_composite_inval_work(struct work_struct *work)
{
	struct kvd_composite *c = container_of(work, struct kvd_composite,
					       inval_work);

	dma_resv_lock(&c->resv, NULL);
	kvd_dma_buf_notify(c->dmabuf);
	dma_resv_unlock(&c->resv);
}

/* ---- building a layout ---- */

/* A layout being built: pieces in proxy order. */
struct kvd_layout {
	struct kvd_piece *p;
	unsigned int nr, room;
	bool numbered;		/* the base is a layout: pieces note theirs */
};

/*
 * Appends a piece, merged into the last one where it continues it (and
 * then all of no base piece). @from: 1 + the base's piece it is all of.
 */
static int kvd_layout_add(struct kvd_layout *l, u64 start, u64 length,
			  struct kvd_source *src, u64 offset,
			  unsigned int from)
{
	struct kvd_piece *last = l->nr ? &l->p[l->nr - 1] : NULL;

	if (last && last->src == src &&
	    (!src || last->offset + last->length == offset)) {
		last->length += length;
		last->from = 0;
		return 0;
	}
	if (l->nr == KVDMABUF_MAX_RANGES)
		return -E2BIG;
	if (WARN_ON_ONCE(l->nr == l->room))
		return -EINVAL;
	l->p[l->nr++] = (struct kvd_piece){ start, length, src, offset, from };
	return 0;
}

/* The pieces of @base that lie in [@lo, @hi), clipped; *@i moves on. */
static int kvd_layout_keep(struct kvd_layout *l, const struct kvd_piece *base,
			   unsigned int nr, unsigned int *i, u64 lo, u64 hi)
{
	const struct kvd_piece *b;
	bool all;
	u64 s, e;
	int ret;

	for (; *i < nr && lo < hi; ) {
		b = &base[*i];
		s = max(lo, b->start);
		e = min(hi, b->start + b->length);
		all = s == b->start && e == b->start + b->length;
		if (s < e) {
			ret = kvd_layout_add(l, s, e - s, b->src,
					     b->src ? b->offset + (s - b->start) : 0,
					     l->numbered && all ? *i + 1 : 0);
			if (ret)
				return ret;
		}
		if (b->start + b->length > hi)
			break;		/* the rest of it comes after */
		(*i)++;
	}
	return 0;
}

static int kvd_change_cmp(const void *a, const void *b)
{
	unsigned long x = (unsigned long)(*(struct kvd_change * const *)a)->dmabuf;
	unsigned long y = (unsigned long)(*(struct kvd_change * const *)b)->dmabuf;

	return x < y ? -1 : x > y;
}

/*
 * A source for each change's backing: the base layout's source of that
 * dma-buf (@bu, its uses), so that its mappings are shared, or a new one,
 * shared by the batch's changes with that dma-buf and put in @fresh (in
 * dma-buf order). Only the batch is sorted: a lookup in the base costs
 * the log of its sources, not a sort of them.
 */
static int kvd_change_sources(struct kvd_change *ch, unsigned int nr,
			      struct kvd_use *bu, unsigned int bun,
			      struct kvd_family *fam,
			      struct kvd_source **fresh, unsigned int *nfresh)
{
	struct kvd_source *src = NULL;
	unsigned int nc = 0, i;
	struct kvd_change **c;
	struct kvd_use *hit;
	int ret = 0;

	c = kvmalloc_array(nr, sizeof(*c), GFP_KERNEL_ACCOUNT);
	if (!c)
		return -ENOMEM;
	for (i = 0; i < nr; i++)
		if (ch[i].dmabuf)
			c[nc++] = &ch[i];
	sort(c, nc, sizeof(*c), kvd_change_cmp, NULL);

	/* Changes with one dma-buf are adjacent now: one source each. */
	for (i = 0; i < nc; i++) {
		if (src && c[i]->dmabuf == src->dmabuf) {
			kref_get(&src->ref);
		} else if ((hit = kvd_use_find(bu, bun, c[i]->dmabuf))) {
			src = hit->src;
			kref_get(&src->ref);
		} else {
			src = kvd_source_new(c[i]->dmabuf, fam);
			if (!src) {
				ret = -ENOMEM;
				break;
			}
			c[i]->dmabuf = NULL;	/* the source holds it */
			fresh[(*nfresh)++] = src;
		}
		c[i]->src = src;
	}
	kvfree(c);
	return ret;
}

/* The index of the piece of @p (covering the proxy in order) at @pos. */
static unsigned int kvd_piece_at(const struct kvd_piece *p, unsigned int nr,
				 u64 pos)
{
	unsigned int lo = 0, hi = nr - 1, mid;

	while (lo < hi) {
		mid = lo + (hi - lo + 1) / 2;
		if (p[mid].start <= pos)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* Can a layout's CPU mapping take in @src's pages? (kvd_composite_vmap()) */
static bool kvd_source_vmaps(const struct kvd_source *src)
{
	return src->dmabuf->ops->vmap;
}

/*
 * The uses of the new layout @c: the base's (@bu, in dma-buf order; @bnv
 * of them without vmap) and the batch's new sources merged, each with the
 * bytes it backs after the batch, those left with none dropped. Only the
 * changed ranges are looked at: the pieces kept keep their sources'
 * counts, and only the sources added or dropped change c->nr_novmap.
 */
static int kvd_layout_uses(struct kvd_composite *c, u64 length,
			   const struct kvd_piece *bp, unsigned int bnr,
			   struct kvd_use *bu, unsigned int bun,
			   unsigned int bnv,
			   struct kvd_source **fresh, unsigned int nfresh,
			   const struct kvd_change *ch, unsigned int nr)
{
	unsigned int i = 0, j = 0, n = 0, k;
	const struct kvd_piece *b;
	struct kvd_use *u, *hit;
	u64 end;

	u = kvmalloc_array(max(bun + nfresh, 1U), sizeof(*u),
			   GFP_KERNEL_ACCOUNT);
	if (!u)
		return -ENOMEM;
	c->nr_novmap = bnv;
	while (i < bun || j < nfresh) {
		if (j == nfresh || (i < bun && (unsigned long)bu[i].src->dmabuf <
					      (unsigned long)fresh[j]->dmabuf)) {
			u[n++] = bu[i++];
		} else {
			c->nr_novmap += !kvd_source_vmaps(fresh[j]);
			u[n].src = fresh[j++];
			u[n++].bytes = 0;
		}
	}
	for (i = 0; i < nr; i++) {
		end = ch[i].start + ch[i].length;
		for (k = kvd_piece_at(bp, bnr, ch[i].start);
		     k < bnr && bp[k].start < end; k++) {
			b = &bp[k];
			if (!b->src)
				continue;
			hit = kvd_use_find(u, n, b->src->dmabuf);
			if (WARN_ON_ONCE(!hit))
				goto err;
			hit->bytes -= min(end, b->start + b->length) -
				      max(ch[i].start, b->start);
		}
		if (!ch[i].src)
			continue;
		hit = kvd_use_find(u, n, ch[i].src->dmabuf);
		if (WARN_ON_ONCE(!hit))
			goto err;
		hit->bytes += ch[i].length;
	}
	for (i = 0; i < n; i++) {
		if (WARN_ON_ONCE(u[i].bytes > length))
			goto err;
		if (!u[i].bytes) {
			/* a base's source that no piece uses any more */
			c->nr_novmap -= !kvd_source_vmaps(u[i].src);
			continue;
		}
		u[c->nr_uses] = u[i];
		kref_get(&u[i].src->ref);
		c->nr_uses++;
	}
	c->uses = u;
	return 0;
err:
	kvfree(u);
	return -EINVAL;
}

static struct page *kvd_scratch_alloc(u64 length, unsigned int *order)
{
	unsigned int o = min_t(unsigned int, KVD_SCRATCH_MAX_ORDER,
			       get_order(length));
	struct page *page;

	/* Any order will do: fewer, larger entries are only cheaper. */
	for (;; o--) {
		page = alloc_pages(GFP_KERNEL_ACCOUNT | __GFP_ZERO |
				   (o ? __GFP_NORETRY | __GFP_NOWARN : 0), o);
		if (page || !o)
			break;
	}
	*order = o;
	return page;
}

/**
 * kvd_compose() - the layout of a proxy after a batch of range changes
 * @length: the proxy's length
 * @base: its backing now (a composite, a plain backing), or NULL: unbacked
 * @base_offset: the plain backing's offset
 * @ch: the changes, sorted by start, not overlapping, within @length;
 *	each backing's reference passes to the layout (or is dropped)
 * @nr: their number
 *
 * Return: the new composite's dma-buf (one reference), or an ERR_PTR:
 * -ENOMEM, -E2BIG (more than KVDMABUF_MAX_RANGES pieces), -EINVAL (the
 * bytes counted per backing disagree with the pieces: a bug, warned).
 */
struct dma_buf *kvd_compose(u64 length, struct dma_buf *base, u64 base_offset,
			    struct kvd_change *ch, unsigned int nr)
{
	DEFINE_DMA_BUF_EXPORT_INFO(exp_info);
	struct kvd_piece whole = { 0, length, NULL, base_offset };
	struct kvd_use plain_use = { .bytes = length };
	const struct kvd_piece *bp = &whole;
	struct kvd_composite *base_c = NULL, *c;
	struct kvd_source **fresh = NULL;
	struct kvd_layout l = { 0 };
	struct kvd_source *plain = NULL;
	unsigned int bnr = 1, bi = 0, bun = 0, bnv = 0, nfresh = 0, i;
	struct kvd_family *fam = NULL;
	struct kvd_use *bu = NULL;
	struct dma_buf *dmabuf;
	bool holes = false;
	u64 pos = 0;
	int ret;

	if (base && kvd_is_layout(base)) {
		base_c = base->priv;
		bp = base_c->pieces;
		bnr = base_c->nr;
		bu = base_c->uses;
		bun = base_c->nr_uses;
		bnv = base_c->nr_novmap;
		fam = base_c->fam;
		kref_get(&fam->ref);
	} else {
		fam = kvd_family_new();
		if (!fam) {
			ret = -ENOMEM;
			goto err_changes;
		}
	}
	if (base && !base_c) {
		get_dma_buf(base);
		plain = kvd_source_new(base, fam);
		if (!plain) {
			dma_buf_put(base);
			ret = -ENOMEM;
			goto err_changes;
		}
		whole.src = plain;
		plain_use.src = plain;
		bu = &plain_use;
		bun = 1;
		bnv = !kvd_source_vmaps(plain);
	}

	/* Each change can split one kept piece in two. */
	l.room = min_t(u64, (u64)bnr + 2ULL * nr + 1, KVDMABUF_MAX_RANGES);
	/* the pieces are all written, as they are added */
	c = kvmalloc(struct_size(c, pieces, l.room), GFP_KERNEL_ACCOUNT);
	if (!c) {
		ret = -ENOMEM;
		goto err_changes;
	}
	memset(c, 0, sizeof(*c));
	l.p = c->pieces;
	l.numbered = base_c;
	c->fam = fam;
	INIT_LIST_HEAD(&c->node);
	INIT_LIST_HEAD(&c->maps);
	if (base_c)
		c->base_seq = base_c->seq;

	fresh = kvmalloc_array(nr, sizeof(*fresh), GFP_KERNEL_ACCOUNT);
	if (!fresh) {
		ret = -ENOMEM;
		goto err_c;
	}
	ret = kvd_change_sources(ch, nr, bu, bun, fam, fresh, &nfresh);
	if (ret)
		goto err_c;

	for (i = 0; i < nr; i++) {
		ret = kvd_layout_keep(&l, bp, bnr, &bi, pos, ch[i].start);
		if (!ret)
			ret = kvd_layout_add(&l, ch[i].start, ch[i].length,
					     ch[i].src, ch[i].offset, 0);
		if (ret)
			goto err_c;
		pos = ch[i].start + ch[i].length;
	}
	ret = kvd_layout_keep(&l, bp, bnr, &bi, pos, length);
	if (ret)
		goto err_c;
	c->nr = l.nr;
	for (i = 0; i < c->nr; i++)
		holes |= !c->pieces[i].src;

	ret = kvd_layout_uses(c, length, bp, bnr, bu, bun, bnv, fresh, nfresh,
			      ch, nr);
	if (ret)
		goto err_c;
	if (holes) {
		c->scratch = kvd_scratch_alloc(length, &c->scratch_order);
		if (!c->scratch) {
			ret = -ENOMEM;
			goto err_uses;
		}
	}
	INIT_WORK(&c->inval_work, kvd_composite_inval_work);
	dma_resv_init(&c->resv);
	lockdep_set_class(&c->resv.lock.base, &kvd_composite_resv_key);
	exp_info.exp_name = "kvdmabuf-ranges";
	exp_info.ops = c->nr_novmap ? &kvd_composite_ops :
				      &kvd_composite_vmap_ops;
	exp_info.size = length;
	exp_info.flags = O_RDWR;
	exp_info.resv = &c->resv;
	exp_info.priv = c;
	dmabuf = dma_buf_export(&exp_info);
	if (IS_ERR(dmabuf)) {
		ret = PTR_ERR(dmabuf);
		dma_resv_fini(&c->resv);
		goto err_scratch;
	}
	c->dmabuf = dmabuf;
	/* From here on .release undoes it all. */
	spin_lock(&fam->lock);
	c->seq = ++fam->seq;
	list_add_tail(&c->node, &fam->layouts);
	spin_unlock(&fam->lock);
	fam = NULL;
	ret = 0;
	goto out;

err_scratch:
	if (c->scratch)
		__free_pages(c->scratch, c->scratch_order);
err_uses:
	for (i = 0; i < c->nr_uses; i++)
		kvd_source_put(c->uses[i].src);
	kvfree(c->uses);
err_c:
	kvfree(c);
err_changes:
	dmabuf = ERR_PTR(ret);
out:
	/* The pieces' references are the uses' now (or gone with them). */
	for (i = 0; i < nr; i++) {
		if (ch[i].src)
			kvd_source_put(ch[i].src);
		if (ch[i].dmabuf)
			dma_buf_put(ch[i].dmabuf);
		ch[i].src = NULL;
		ch[i].dmabuf = NULL;
	}
	if (plain)
		kvd_source_put(plain);
	if (fam)
		kvd_family_put(fam);
	kvfree(fresh);
	return dmabuf;
}
