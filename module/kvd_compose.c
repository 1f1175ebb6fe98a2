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
 * A layout's pieces lie in *blocks* (of kvd_layout_block_pieces), immutable
 * and shared: a new layout copies the blocks its batch touches and takes
 * a reference on the others, so a batch costs what it changes and a
 * share per block, never a step per piece it keeps. Each block keeps its
 * pieces mapped for each importer device (a *block map*: every backed
 * piece's source map and where its window lies), shared by the layouts
 * holding the block; a block rebuilt by a batch takes the pieces it keeps
 * whole from the block it was made from (its *origin*, held until the
 * call's slots are prepared: kvd_layout_settle()). A source (one per
 * dma-buf in a *family*, the layouts of one proxy) keeps one pinned
 * mapping per device for all of them: a batch maps only the backings it
 * brings in.
 *
 * The proxy's slot prepares a layout in the call (kvd_layout_prepare():
 * what may fail) and maps it at its importer's first map after it
 * (kvd_slot_map()): only that map builds the table of the whole proxy
 * dma-buf hands an importer. Unbacked pieces map to a zeroed scratch
 * buffer of the layout's own, which holds nobody's data.
 *
 * Locking: (proxy resv, at a first map) -> composite resv (a lockdep
 * class of its own) -> source->lock -> source resv; family->lock is
 * innermost, and sources and block maps drop their last reference under
 * it (nobody finds one going). A source's move notification (its resv
 * held) only queues work.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/rbtree.h>
#include <linux/scatterlist.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "kvd.h"

/* The scratch behind unbacked pieces: up to 2 MiB, as few entries as can be. */
#define KVD_SCRATCH_MAX_ORDER	get_order(SZ_2M)

/* The layouts of one proxy, each made from the one before. */
struct kvd_family {
	struct kref ref;
	spinlock_t lock;		/* all below, blocks' maps and origins */
	struct list_head layouts;	/* struct kvd_composite, exported */
	struct rb_root sources;		/* struct kvd_source, by dma-buf */
	bool moved;			/* a source's exporter moved it */
};

/* A backing dma-buf that pieces of one family's layouts map windows of. */
struct kvd_source {
	struct kref ref;		/* to zero under fam->lock */
	struct rb_node node;		/* fam->sources */
	struct dma_buf *dmabuf;		/* reference held */
	struct kvd_family *fam;		/* reference held */
	struct mutex lock;		/* maps, vmap */
	struct list_head maps;		/* struct kvd_source_map */
	struct iosys_map vmap;		/* while vmap_users */
	unsigned int vmap_users;	/* pieces of CPU-mapped layouts */
	bool invalidated;		/* its exporter moved it; its resv */
};

/* A source's mapping for one device, shared by the blocks using it. */
struct kvd_source_map {
	struct list_head node;		/* source->maps */
	struct kvd_source *src;
	struct device *dev;		/* reference held */
	struct dma_buf_attachment *bat;
	struct sg_table *sgt;
	/* per piece of block maps; drops to zero under source->lock */
	refcount_t users;
	bool dying;			/* unpinning: a move is ours */
};

struct kvd_piece {
	u64 start;			/* in the proxy */
	u64 length;
	struct kvd_source *src;		/* reference held; NULL: unbacked */
	u64 offset;			/* in src */
	unsigned int from;		/* 1 + the origin's piece it is all of; 0 */
};

/* Pieces of a layout in proxy order, shared by the layouts holding it. */
struct kvd_block {
	struct kref ref;
	struct kvd_block *origin;	/* made from, until settled; fam->lock */
	struct list_head maps;		/* struct kvd_bmap; fam->lock */
	unsigned int nr_novmap;		/* pieces whose source has no vmap */
	unsigned int nr_holes;		/* unbacked pieces */
	u64 hole_bytes;
	unsigned int nr;
	struct kvd_piece p[KVD_LAYOUT_BLOCK_MAX];
};

/*
 * A block's backed pieces mapped for one device: each one's source map
 * and where its window lies in that map's table, the exporter's, which
 * nobody edits while the source map lives (the proxy's importers may edit
 * the composite's table they are lent: ib_umem trims the ends of its
 * window in place while mapped). Referenced by the attachments of the
 * layouts holding the block.
 */
struct kvd_bmap {
	struct kref ref;		/* to zero under fam->lock */
	struct list_head node;		/* block->maps */
	struct kvd_family *fam;
	struct kvd_block *blk;		/* reference held */
	struct device *dev;
	u64 nents;			/* of its pieces' windows */
	struct kvd_source_map *sm[KVD_LAYOUT_BLOCK_MAX];	/* NULL if unbacked */
	struct kvd_win win[KVD_LAYOUT_BLOCK_MAX];
};

struct kvd_composite {
	struct dma_buf *dmabuf;
	struct dma_resv resv;
	struct kvd_family *fam;		/* reference held */
	struct list_head node;		/* fam->layouts */
	struct work_struct inval_work;	/* a source's exporter moved it */
	struct page *scratch;		/* NULL: no unbacked piece */
	unsigned int scratch_order;
	unsigned int nr_novmap;		/* pieces whose source has no vmap */
	void *vaddr;			/* the layout's CPU mapping; resv */
	unsigned int nr_blocks;
	struct kvd_block *blk[];	/* references held */
};

/* attach->priv of an attachment to a composite (a proxy's slot). */
struct kvd_cattach {
	struct kvd_bmap **bm;		/* per block, once prepared; resv */
	struct sg_table sgt;		/* while mapped; resv */
	dma_addr_t scratch_dma;
	bool scratch_mapped;
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
	fam->sources = RB_ROOT;
	return fam;
}

static void kvd_family_free(struct kref *ref)
{
	struct kvd_family *fam = container_of(ref, struct kvd_family, ref);

	WARN_ON_ONCE(!list_empty(&fam->layouts));
	WARN_ON_ONCE(!RB_EMPTY_ROOT(&fam->sources));
	kfree(fam);
}

static void kvd_family_put(struct kvd_family *fam)
{
	kref_put(&fam->ref, kvd_family_free);
}

static void kvd_source_destroy(struct kvd_source *src)
{
	WARN_ON_ONCE(!list_empty(&src->maps) || src->vmap_users);
	dma_buf_put(src->dmabuf);
	kvd_family_put(src->fam);
	mutex_destroy(&src->lock);
	kfree(src);
}

/* Called with fam->lock held; drops it. */
static void kvd_source_release(struct kref *ref)
{
	struct kvd_source *src = container_of(ref, struct kvd_source, ref);

	rb_erase(&src->node, &src->fam->sources);
	spin_unlock(&src->fam->lock);
	kvd_source_destroy(src);
}

static void kvd_source_put(struct kvd_source *src)
{
	kref_put_lock(&src->ref, kvd_source_release, &src->fam->lock);
}

static int kvd_source_cmp(const void *key, const struct rb_node *node)
{
	unsigned long x = (unsigned long)key;
	unsigned long y = (unsigned long)rb_entry(node, struct kvd_source,
						  node)->dmabuf;

	return x < y ? -1 : x > y;
}

static int kvd_source_node_cmp(struct rb_node *a, const struct rb_node *b)
{
	return kvd_source_cmp(rb_entry(a, struct kvd_source, node)->dmabuf, b);
}

/* @fam's source of @dmabuf (a reference), made if it has none; or NULL. */
static struct kvd_source *kvd_source_get(struct kvd_family *fam,
					 struct dma_buf *dmabuf)
{
	struct kvd_source *src = NULL, *new;
	struct rb_node *n;

	spin_lock(&fam->lock);
	n = rb_find(dmabuf, &fam->sources, kvd_source_cmp);
	if (n) {
		src = rb_entry(n, struct kvd_source, node);
		kref_get(&src->ref);
	}
	spin_unlock(&fam->lock);
	if (src)
		return src;

	new = kzalloc(sizeof(*new), GFP_KERNEL_ACCOUNT);
	if (!new)
		return NULL;
	kref_init(&new->ref);
	get_dma_buf(dmabuf);
	new->dmabuf = dmabuf;
	kref_get(&fam->ref);
	new->fam = fam;
	mutex_init(&new->lock);
	INIT_LIST_HEAD(&new->maps);

	/* Another call may have made one meanwhile: one source a dma-buf. */
	spin_lock(&fam->lock);
	n = rb_find_add(&new->node, &fam->sources, kvd_source_node_cmp);
	if (n) {
		src = rb_entry(n, struct kvd_source, node);
		kref_get(&src->ref);
	}
	spin_unlock(&fam->lock);
	if (!src)
		return new;
	kvd_source_destroy(new);
	return src;
}

/* Can a layout's CPU mapping take in @src's pages? (kvd_composite_vmap()) */
static bool kvd_source_vmaps(const struct kvd_source *src)
{
	return src->dmabuf->ops->vmap;
}

/* Does layout @c have a piece of @src? (fam->lock held) */
static bool kvd_layout_uses(struct kvd_composite *c, struct kvd_source *src)
{
	struct kvd_piece *p;
	unsigned int i, j;

	for (i = 0; i < c->nr_blocks; i++)
		for (j = 0, p = c->blk[i]->p; j < c->blk[i]->nr; j++, p++)
			if (p->src == src)
				return true;
	return false;
}

/* Has a piece's backing been moved since? Its mapping is gone, or going. */
static bool kvd_layout_moved(struct kvd_composite *c)
{
	struct kvd_piece *p;
	unsigned int i, j;

	if (!READ_ONCE(c->fam->moved))
		return false;
	for (i = 0; i < c->nr_blocks; i++)
		for (j = 0, p = c->blk[i]->p; j < c->blk[i]->nr; j++, p++)
			if (p->src && READ_ONCE(p->src->invalidated))
				return true;
	return false;
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
	struct kvd_family *fam = src->fam;
	struct kvd_composite *c;

	if (sm->dying || !sm->sgt)
		return;
	/*
	 * A layout being built now, not yet exported, must not take the
	 * stale mapping either: its preparation and its map check this.
	 */
	WRITE_ONCE(src->invalidated, true);
	spin_lock(&fam->lock);
	WRITE_ONCE(fam->moved, true);
	list_for_each_entry(c, &fam->layouts, node)
		if (kvd_layout_uses(c, src))
			queue_work(kvd_wq, &c->inval_work);
	spin_unlock(&fam->lock);
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

/* ---- blocks and their maps ---- */

static struct kvd_block *kvd_block_new(struct kvd_block *origin)
{
	struct kvd_block *blk = kmalloc(sizeof(*blk), GFP_KERNEL_ACCOUNT);

	if (!blk)
		return NULL;
	/* the pieces are written as they are added */
	memset(blk, 0, offsetof(struct kvd_block, p));
	kref_init(&blk->ref);
	INIT_LIST_HEAD(&blk->maps);
	if (origin)
		kref_get(&origin->ref);
	blk->origin = origin;
	return blk;
}

static void kvd_block_free(struct kref *ref)
{
	struct kvd_block *blk = container_of(ref, struct kvd_block, ref);
	struct kvd_block *origin = blk->origin;
	unsigned int j;

	WARN_ON_ONCE(!list_empty(&blk->maps));
	for (j = 0; j < blk->nr; j++)
		if (blk->p[j].src)
			kvd_source_put(blk->p[j].src);
	kfree(blk);
	if (origin)
		kref_put(&origin->ref, kvd_block_free);
}

static void kvd_block_put(struct kvd_block *blk)
{
	kref_put(&blk->ref, kvd_block_free);
}

static u64 kvd_block_end(const struct kvd_block *blk)
{
	const struct kvd_piece *last = &blk->p[blk->nr - 1];

	return last->start + last->length;
}

static void kvd_bmap_destroy(struct kvd_bmap *bm)
{
	unsigned int j;

	for (j = 0; j < bm->blk->nr; j++)
		if (bm->sm[j])
			kvd_source_map_put(bm->sm[j]);
	kvd_block_put(bm->blk);
	kfree(bm);
}

/* Called with fam->lock held; drops it. */
static void kvd_bmap_release(struct kref *ref)
{
	struct kvd_bmap *bm = container_of(ref, struct kvd_bmap, ref);

	list_del(&bm->node);
	spin_unlock(&bm->fam->lock);
	kvd_bmap_destroy(bm);
}

static void kvd_bmap_put(struct kvd_bmap *bm)
{
	kref_put_lock(&bm->ref, kvd_bmap_release, &bm->fam->lock);
}

/* @blk's map for @dev, referenced, or NULL (fam->lock held). */
static struct kvd_bmap *kvd_bmap_find(struct kvd_block *blk,
				      struct device *dev)
{
	struct kvd_bmap *bm;

	list_for_each_entry(bm, &blk->maps, node) {
		if (bm->dev == dev) {
			kref_get(&bm->ref);
			return bm;
		}
	}
	return NULL;
}

/* The origin's piece that @p is all of, mapped in @ob; or -1. */
static long kvd_kept_piece(struct kvd_bmap *ob, const struct kvd_piece *p)
{
	unsigned int k = p->from - 1;

	if (!ob || !p->from || WARN_ON_ONCE(k >= ob->blk->nr) || !ob->sm[k] ||
	    WARN_ON_ONCE(ob->sm[k]->src != p->src))
		return -1;
	return k;
}

/*
 * Maps @blk's backed pieces for @dev: a piece kept whole from the origin
 * takes its source map (a reference) and where its window lies from the
 * origin's map @ob (no lookup under the source's lock, no walk of its
 * table); any other maps its source for @dev, or shares the source's map.
 */
static struct kvd_bmap *kvd_bmap_build(struct kvd_family *fam,
				       struct kvd_block *blk,
				       struct device *dev, struct kvd_bmap *ob)
{
	struct kvd_bmap *bm = kzalloc(sizeof(*bm), GFP_KERNEL_ACCOUNT);
	struct kvd_piece *p;
	unsigned int j;
	long k;
	int ret;

	if (!bm)
		return ERR_PTR(-ENOMEM);
	kref_init(&bm->ref);
	INIT_LIST_HEAD(&bm->node);
	bm->fam = fam;
	kref_get(&blk->ref);
	bm->blk = blk;
	bm->dev = dev;
	for (j = 0; j < blk->nr; j++) {
		p = &blk->p[j];
		if (!p->src)
			continue;
		k = kvd_kept_piece(ob, p);
		if (k >= 0) {
			bm->sm[j] = ob->sm[k];
			refcount_inc(&bm->sm[j]->users);
			bm->win[j] = ob->win[k];
		} else {
			bm->sm[j] = kvd_source_map_get(p->src, dev);
			if (IS_ERR(bm->sm[j])) {
				ret = PTR_ERR(bm->sm[j]);
				bm->sm[j] = NULL;
				goto err;
			}
			ret = kvd_sg_window_find(bm->sm[j]->sgt, p->offset,
						 p->length, &bm->win[j]);
			if (ret)
				goto err;
		}
		bm->nents += bm->win[j].nents;
	}
	return bm;
err:
	kvd_bmap_destroy(bm);
	return ERR_PTR(ret);
}

/* @blk's map for @dev (a reference), made if it has none; or an ERR_PTR. */
static struct kvd_bmap *kvd_bmap_get(struct kvd_family *fam,
				     struct kvd_block *blk, struct device *dev)
{
	struct kvd_bmap *bm, *ob = NULL, *other;

	spin_lock(&fam->lock);
	bm = kvd_bmap_find(blk, dev);
	if (!bm && blk->origin)
		ob = kvd_bmap_find(blk->origin, dev);
	spin_unlock(&fam->lock);
	if (bm)
		return bm;

	bm = kvd_bmap_build(fam, blk, dev, ob);
	if (ob)
		kvd_bmap_put(ob);
	if (IS_ERR(bm))
		return bm;
	/* Another layout holding the block may have mapped it meanwhile. */
	spin_lock(&fam->lock);
	other = kvd_bmap_find(blk, dev);
	if (!other)
		list_add_tail(&bm->node, &blk->maps);
	spin_unlock(&fam->lock);
	if (!other)
		return bm;
	kvd_bmap_destroy(bm);
	return other;
}

/* ---- the composite's dma_buf_ops ---- */

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

static void kvd_cattach_unprepare(struct kvd_composite *c,
				  struct kvd_cattach *cat)
{
	unsigned int i;

	for (i = 0; i < c->nr_blocks; i++)
		if (cat->bm[i])
			kvd_bmap_put(cat->bm[i]);
	kvfree(cat->bm);
	cat->bm = NULL;
}

static void kvd_composite_detach(struct dma_buf *dmabuf,
				 struct dma_buf_attachment *attach)
{
	struct kvd_composite *c = dmabuf->priv;
	struct kvd_cattach *cat = attach->priv;

	sg_free_table(&cat->sgt);
	if (cat->bm)
		kvd_cattach_unprepare(c, cat);
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

/**
 * kvd_layout_prepare() - map a layout's pieces for a slot's attachment
 * @attach: the slot's attachment to the layout (its resv held)
 *
 * What may fail, done while the RANGES call can still fail whole: each
 * block's map for the device (shared with the layouts holding the block:
 * only the blocks the batch made are mapped here), and the scratch behind
 * unbacked pieces. The table itself is built at the first map
 * (kvd_composite_map()).
 *
 * Return: 0; -ENOMEM; -ENODEV (a piece's backing was moved or revoked);
 * -ERANGE (its exporter maps less than its size); -E2BIG (a table of
 * more than UINT_MAX entries); a backing exporter's error.
 */
int kvd_layout_prepare(struct dma_buf_attachment *attach)
{
	struct kvd_composite *c = attach->dmabuf->priv;
	struct kvd_cattach *cat = attach->priv;
	unsigned int shift = PAGE_SHIFT + c->scratch_order, i;
	u64 chunk = 1ULL << shift, nents = 0;
	struct kvd_block *blk;
	int ret;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (cat->bm)
		return 0;
	/* as a backing's: the proxy revokes itself (kvd_attach()) */
	if (kvd_layout_moved(c))
		return -ENODEV;
	cat->bm = kvcalloc(c->nr_blocks, sizeof(*cat->bm), GFP_KERNEL_ACCOUNT);
	if (!cat->bm)
		return -ENOMEM;
	if (c->scratch && !cat->scratch_mapped) {
		cat->scratch_dma = dma_map_page(attach->dev, c->scratch, 0,
						chunk, DMA_BIDIRECTIONAL);
		if (dma_mapping_error(attach->dev, cat->scratch_dma)) {
			ret = -EIO;
			goto err;
		}
		cat->scratch_mapped = true;
	}
	for (i = 0; i < c->nr_blocks; i++) {
		blk = c->blk[i];
		cat->bm[i] = kvd_bmap_get(c->fam, blk, attach->dev);
		if (IS_ERR(cat->bm[i])) {
			ret = PTR_ERR(cat->bm[i]);
			cat->bm[i] = NULL;
			goto err;
		}
		/* at most: each hole's entries, the last one short */
		nents += cat->bm[i]->nents + blk->nr_holes +
			 (blk->hole_bytes >> shift);
	}
	if (nents > UINT_MAX) {
		ret = -E2BIG;
		goto err;
	}
	return 0;
err:
	kvd_cattach_unprepare(c, cat);
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
	u64 chunk = PAGE_SIZE << c->scratch_order, left, nents = 0;
	struct scatterlist *dsg;
	struct kvd_piece *p;
	unsigned int i, j;
	int ret;

	dma_resv_assert_held(attach->dmabuf->resv);
	ret = kvd_layout_prepare(attach);
	if (ret)
		return ERR_PTR(ret);
	/* One map at a time: a slot maps its attachment once. */
	if (WARN_ON_ONCE(cat->sgt.sgl))
		return ERR_PTR(-EBUSY);
	if (kvd_layout_moved(c))
		return ERR_PTR(-ENODEV);
	for (i = 0; i < c->nr_blocks; i++) {
		nents += cat->bm[i]->nents;
		for (j = 0, p = c->blk[i]->p; j < c->blk[i]->nr; j++, p++)
			if (!p->src)
				nents += DIV_ROUND_UP(p->length, chunk);
	}
	ret = sg_alloc_table(&cat->sgt, nents, GFP_KERNEL_ACCOUNT);
	if (ret)
		return ERR_PTR(ret);
	dsg = cat->sgt.sgl;
	for (i = 0; i < c->nr_blocks; i++) {
		for (j = 0, p = c->blk[i]->p; j < c->blk[i]->nr; j++, p++) {
			if (p->src) {
				dsg = kvd_sg_window_copy(dsg,
							 &cat->bm[i]->win[j],
							 p->length);
				continue;
			}
			for (left = p->length; left; left -= min(left, chunk)) {
				sg_dma_address(dsg) = cat->scratch_dma;
				sg_dma_len(dsg) = min(left, chunk);
				dsg = sg_next(dsg);
			}
		}
	}
	cat->sgt.nents = nents;
	return &cat->sgt;
}

static void kvd_composite_unmap(struct dma_buf_attachment *attach,
				struct sg_table *sgt,
				enum dma_data_direction dir)
{
	struct kvd_cattach *cat = attach->priv;

	if (WARN_ON_ONCE(sgt != &cat->sgt))
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

/* @src's kernel mapping, made for its first CPU-mapped piece. */
static int kvd_source_vmap(struct kvd_source *src)
{
	int ret = 0;

	mutex_lock(&src->lock);
	if (!src->vmap_users) {
		ret = dma_buf_vmap_unlocked(src->dmabuf, &src->vmap);
		if (!ret && src->vmap.is_iomem) {
			dma_buf_vunmap_unlocked(src->dmabuf, &src->vmap);
			ret = -EOPNOTSUPP;
		}
	}
	if (!ret)
		src->vmap_users++;
	mutex_unlock(&src->lock);
	return ret;
}

static void kvd_source_vunmap(struct kvd_source *src)
{
	mutex_lock(&src->lock);
	if (!--src->vmap_users)
		dma_buf_vunmap_unlocked(src->dmabuf, &src->vmap);
	mutex_unlock(&src->lock);
}

/* Lets go of the sources' mappings of the first @n backed pieces. */
static void kvd_composite_src_vunmap(struct kvd_composite *c,
				     unsigned long n)
{
	struct kvd_piece *p;
	unsigned int i, j;

	for (i = 0; i < c->nr_blocks; i++) {
		for (j = 0, p = c->blk[i]->p; j < c->blk[i]->nr; j++, p++) {
			if (!n)
				return;
			if (p->src) {
				kvd_source_vunmap(p->src);
				n--;
			}
		}
	}
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
	unsigned long mapped = 0;
	struct page **pages;
	struct kvd_piece *p;
	unsigned int i, j;
	void *vaddr = NULL;
	int ret = 0;

	dma_resv_assert_held(dmabuf->resv);
	pages = kvmalloc_array(npages, sizeof(*pages), GFP_KERNEL);
	if (!pages)
		return -ENOMEM;
	for (i = 0; i < c->nr_blocks; i++) {
		for (j = 0; j < c->blk[i]->nr; j++) {
			p = &c->blk[i]->p[j];
			if (p->src) {
				ret = kvd_source_vmap(p->src);
				if (ret)
					goto out;
				mapped++;
			}
			for (k = 0; k < p->length >> PAGE_SHIFT; k++, pg++) {
				if (!p->src) {
					/* one buddy block: one memmap section */
					pages[pg] = c->scratch +
						(k & ((1UL << c->scratch_order) - 1));
					continue;
				}
				pages[pg] = kvd_mapped_page(p->src->vmap.vaddr +
							    p->offset +
							    k * PAGE_SIZE);
				if (!pages[pg]) {
					ret = -EOPNOTSUPP;
					goto out;
				}
			}
		}
	}
	vaddr = vmap(pages, npages, VM_MAP, PAGE_KERNEL);
	if (!vaddr)
		ret = -ENOMEM;
out:
	kvfree(pages);
	if (ret) {
		kvd_composite_src_vunmap(c, mapped);
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
	kvd_composite_src_vunmap(c, ULONG_MAX);
}
#endif

static void kvd_composite_free(struct kvd_composite *c)
{
	unsigned int i;

	for (i = 0; i < c->nr_blocks; i++)
		kvd_block_put(c->blk[i]);
	if (c->scratch)
		__free_pages(c->scratch, c->scratch_order);
	kvd_family_put(c->fam);
	kvfree(c);
}

static void kvd_composite_release(struct dma_buf *dmabuf)
{
	struct kvd_composite *c = dmabuf->priv;

	spin_lock(&c->fam->lock);
	list_del(&c->node);
	spin_unlock(&c->fam->lock);
	/* No source can queue it any more. */
	cancel_work_sync(&c->inval_work);
	dma_resv_fini(&c->resv);
	kvd_composite_free(c);
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

/**
 * kvd_layout_settle() - let go of what a call's new blocks were made from
 * @dmabuf: a layout kvd_compose() made, its call's slots prepared
 *
 * The blocks a batch made hold the ones they were made from while the
 * call's slots take the pieces kept whole from those blocks' maps; after
 * that they would only hold the pieces the batch replaced (and their
 * backings' memory). An attachment made later maps them without help.
 */
void kvd_layout_settle(struct dma_buf *dmabuf)
{
	struct kvd_composite *c = dmabuf->priv;
	struct kvd_block *origin;
	unsigned int i;

	for (i = 0; i < c->nr_blocks; i++) {
		if (!READ_ONCE(c->blk[i]->origin))
			continue;
		spin_lock(&c->fam->lock);
		origin = c->blk[i]->origin;
		c->blk[i]->origin = NULL;
		spin_unlock(&c->fam->lock);
		if (origin)
			kvd_block_put(origin);
	}
}

/* ---- building a layout ---- */

/* A layout being built: its blocks, in proxy order. */
struct kvd_build {
	struct kvd_block **blk;
	unsigned int nr, room;
	unsigned int run;		/* the first block the batch made now */
	struct kvd_block *origin;	/* what they are made from, or NULL */
	u64 pieces;
};

/*
 * Appends a piece to the blocks being made, merged into the last one
 * where it continues it (and then all of no origin's piece). @from: 1 +
 * the origin's piece it is all of.
 */
static int kvd_build_add(struct kvd_build *bd, u64 start, u64 length,
			 struct kvd_source *src, u64 offset,
			 unsigned int from)
{
	struct kvd_block *blk = bd->nr > bd->run ? bd->blk[bd->nr - 1] : NULL;
	struct kvd_piece *last = blk ? &blk->p[blk->nr - 1] : NULL;

	if (last && last->src == src &&
	    (!src || last->offset + last->length == offset)) {
		last->length += length;
		last->from = 0;
		return 0;
	}
	if (!blk || blk->nr == kvd_layout_block_pieces) {
		if (WARN_ON_ONCE(bd->nr == bd->room))
			return -EINVAL;
		blk = kvd_block_new(bd->origin);
		if (!blk)
			return -ENOMEM;
		bd->blk[bd->nr++] = blk;
	}
	if (src)
		kref_get(&src->ref);
	blk->p[blk->nr++] = (struct kvd_piece){ start, length, src, offset,
						from };
	return 0;
}

/* The pieces of @b that lie in [@lo, @hi), clipped; *@i moves on. */
static int kvd_build_keep(struct kvd_build *bd, const struct kvd_block *b,
			  unsigned int *i, u64 lo, u64 hi)
{
	const struct kvd_piece *p;
	bool all;
	u64 s, e;
	int ret;

	for (; *i < b->nr && lo < hi; ) {
		p = &b->p[*i];
		s = max(lo, p->start);
		e = min(hi, p->start + p->length);
		all = s == p->start && e == p->start + p->length;
		if (s < e) {
			ret = kvd_build_add(bd, s, e - s, p->src,
					    p->src ? p->offset + (s - p->start) : 0,
					    bd->origin && all ? *i + 1 : 0);
			if (ret)
				return ret;
		}
		if (p->start + p->length > hi)
			break;		/* the rest of it comes after */
		(*i)++;
	}
	return 0;
}

/*
 * Closes the run of blocks made from one base block: its last two share
 * their pieces evenly (no block of a piece or two after a full one), and
 * each counts what its pieces are.
 */
static void kvd_build_close(struct kvd_build *bd)
{
	struct kvd_block *a, *z, *blk;
	unsigned int n, i, j;
	struct kvd_piece *p;

	if (bd->nr - bd->run >= 2) {
		a = bd->blk[bd->nr - 2];
		z = bd->blk[bd->nr - 1];
		n = a->nr - (a->nr + z->nr + 1) / 2;
		memmove(z->p + n, z->p, z->nr * sizeof(*p));
		memcpy(z->p, a->p + a->nr - n, n * sizeof(*p));
		a->nr -= n;
		z->nr += n;
	}
	for (i = bd->run; i < bd->nr; i++) {
		blk = bd->blk[i];
		for (j = 0; j < blk->nr; j++) {
			p = &blk->p[j];
			if (p->src) {
				blk->nr_novmap += !kvd_source_vmaps(p->src);
			} else {
				blk->nr_holes++;
				blk->hole_bytes += p->length;
			}
		}
		bd->pieces += blk->nr;
	}
}

/*
 * Base block @b with the changes that reach into it (from *@ci on) made
 * into new blocks; *@ci moves past those that end in it.
 */
static int kvd_build_rebuild(struct kvd_build *bd, struct kvd_block *b,
			     bool origin, const struct kvd_change *ch,
			     unsigned int nr, unsigned int *ci)
{
	u64 bs = b->p[0].start, be = kvd_block_end(b), pos = bs, s, e;
	const struct kvd_change *x;
	unsigned int i = 0;
	int ret;

	bd->run = bd->nr;
	bd->origin = origin ? b : NULL;
	for (; *ci < nr && ch[*ci].start < be; (*ci)++) {
		x = &ch[*ci];
		s = max(x->start, bs);
		e = min(x->start + x->length, be);
		ret = kvd_build_keep(bd, b, &i, pos, s);
		if (!ret)
			ret = kvd_build_add(bd, s, e - s, x->src,
					    x->src ? x->offset + (s - x->start) : 0,
					    0);
		if (ret)
			return ret;
		pos = e;
		if (x->start + x->length > be)
			break;		/* the rest of it is in the next block */
	}
	ret = kvd_build_keep(bd, b, &i, pos, be);
	kvd_build_close(bd);
	return ret;
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
 *	each backing's reference is dropped (the layout takes its own)
 * @nr: their number
 *
 * The blocks of @base that no change reaches are shared; those it does
 * are made anew (kvd_layout_settle() once the call's slots are prepared).
 *
 * Return: the new composite's dma-buf (one reference), or an ERR_PTR:
 * -ENOMEM, -E2BIG (more than KVDMABUF_MAX_RANGES pieces).
 */
struct dma_buf *kvd_compose(u64 length, struct dma_buf *base, u64 base_offset,
			    struct kvd_change *ch, unsigned int nr)
{
	DEFINE_DMA_BUF_EXPORT_INFO(exp_info);
	struct kvd_composite *base_c = NULL, *c = NULL;
	struct kvd_block *plain = NULL, **bblk;
	unsigned int bnb = 1, ci = 0, i;
	struct kvd_build bd = { 0 };
	struct kvd_family *fam;
	struct dma_buf *dmabuf;
	bool holes = false;
	int ret;

	if (base && kvd_is_layout(base)) {
		base_c = base->priv;
		fam = base_c->fam;
		kref_get(&fam->ref);
		bblk = base_c->blk;
		bnb = base_c->nr_blocks;
	} else {
		fam = kvd_family_new();
		if (!fam) {
			ret = -ENOMEM;
			goto err_changes;
		}
		/* a block of one piece, all of the plain backing or a hole */
		plain = kvd_block_new(NULL);
		if (!plain) {
			ret = -ENOMEM;
			goto err_changes;
		}
		plain->nr = 1;
		plain->p[0] = (struct kvd_piece){ 0, length, NULL, base_offset };
		if (base) {
			plain->p[0].src = kvd_source_get(fam, base);
			if (!plain->p[0].src) {
				ret = -ENOMEM;
				goto err_changes;
			}
		}
		bblk = &plain;
	}
	for (i = 0; i < nr; i++) {
		if (!ch[i].dmabuf)
			continue;
		ch[i].src = kvd_source_get(fam, ch[i].dmabuf);
		if (!ch[i].src) {
			ret = -ENOMEM;
			goto err_changes;
		}
	}

	/*
	 * Each block a change reaches makes at most two more than its own
	 * (it splits a piece and adds one); others are shared.
	 */
	bd.room = 2 * bnb +
		  2 * DIV_ROUND_UP(nr + bnb, kvd_layout_block_pieces) + 2;
	c = kvzalloc(struct_size(c, blk, bd.room), GFP_KERNEL_ACCOUNT);
	if (!c) {
		ret = -ENOMEM;
		goto err_changes;
	}
	bd.blk = c->blk;
	for (i = 0; i < bnb; i++) {
		if (ci < nr && ch[ci].start < kvd_block_end(bblk[i])) {
			ret = kvd_build_rebuild(&bd, bblk[i], base_c, ch, nr,
						&ci);
			if (ret)
				goto err_blocks;
			continue;
		}
		kref_get(&bblk[i]->ref);
		bd.blk[bd.nr++] = bblk[i];
		bd.pieces += bblk[i]->nr;
	}
	c->nr_blocks = bd.nr;
	if (bd.pieces > KVDMABUF_MAX_RANGES) {
		ret = -E2BIG;
		goto err_blocks;
	}
	for (i = 0; i < c->nr_blocks; i++) {
		c->nr_novmap += c->blk[i]->nr_novmap;
		holes |= c->blk[i]->nr_holes;
	}
	if (holes) {
		c->scratch = kvd_scratch_alloc(length, &c->scratch_order);
		if (!c->scratch) {
			ret = -ENOMEM;
			goto err_blocks;
		}
	}
	c->fam = fam;
	INIT_LIST_HEAD(&c->node);
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
		c->fam = NULL;
		goto err_blocks;
	}
	c->dmabuf = dmabuf;
	/* From here on .release undoes it all. */
	spin_lock(&fam->lock);
	list_add_tail(&c->node, &fam->layouts);
	spin_unlock(&fam->lock);
	fam = NULL;
	goto out;

err_blocks:
	for (i = 0; i < bd.nr; i++)
		kvd_block_put(bd.blk[i]);
	if (c->scratch)
		__free_pages(c->scratch, c->scratch_order);
	kvfree(c);
err_changes:
	dmabuf = ERR_PTR(ret);
out:
	/* The blocks hold their pieces' sources now. */
	for (i = 0; i < nr; i++) {
		if (ch[i].src)
			kvd_source_put(ch[i].src);
		if (ch[i].dmabuf)
			dma_buf_put(ch[i].dmabuf);
		ch[i].src = NULL;
		ch[i].dmabuf = NULL;
	}
	if (plain)
		kvd_block_put(plain);
	if (fam)
		kvd_family_put(fam);
	return dmabuf;
}
