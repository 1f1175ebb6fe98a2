/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kvdmabuf internals shared by the module's files:
 *   kvd_main.c     module parameters, global state, load and unload
 *   kvd_dev.c      /dev/kvdmabuf: open, read and poll of state events
 *   kvd_ioctl.c    the ioctls that create, back, revoke and query proxies
 *   kvd_list.c     LIST and debugfs: what every proxy is doing
 *   kvd_ops.c      the proxy's dma_buf_ops (what importers call)
 *   kvd_backing.c  backings and their slots (what the module imports)
 *   kvd_stale.c    stale backings, the drain, the exporter's invalidation
 *   kvd_compose.c  layouts of ranges: the backing a RANGES call makes
 * Locking is described in kvd_main.c.
 */
#ifndef KVD_H
#define KVD_H

#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/uidgid.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include <kvdmabuf.h>

#include "compat.h"

#define KVD_EVENT_QUEUE		64
/*
 * How long a backing's exporter may take to finish a move or clear it
 * fenced (a GPU migrating a pinned buffer): tens of GB over PCIe is
 * seconds. Longer fails the slot with -ETIMEDOUT.
 */
#define KVD_BACKING_FENCE_MS	10000
#define KVD_MAX_LENGTH		((u64)MAX_LFS_FILESIZE & PAGE_MASK)

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
	/*
	 * Stale only: the importers' fences on the proxy's resv when it
	 * went stale (NULL: none; an ERR_PTR: no snapshot, all count), and
	 * the callback that queues the reap when they have signaled.
	 */
	struct dma_fence *fences;	/* proxy->lock */
	struct dma_fence_cb fences_cb;
	struct kvd_proxy *proxy;	/* for fences_cb */
	/*
	 * On the backing's resv since its exporter invalidated it: signals
	 * once the proxy's importers write to it no more (kvd_stale.c).
	 * Set under the backing's resv, reference held.
	 */
	struct dma_fence *gate;
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
	struct sg_table *bsgt;		/* a layout's: from its first map on */
	bool dying;			/* unpinning; backing resv */
	bool whole;			/* the proxy's window is all of bsgt */
	bool layout;			/* bsgt made at the first map */
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
	/* peer2peer: maps DMA tables; else CPU access (vmap), no slot */
	bool dma;
	bool notified;			/* has an invalidation callback */
	bool revocable;			/* its pins give way to a revoke */
	bool revoked;			/* a revoke took its pinned map for good;
					 * proxy->lock + resv to write */
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
	struct list_head graveyard;	/* buried slots for reap_work; lock */
	struct kvd_backing *backing;	/* lock + resv to write */
	u32 state;			/* lock + resv to write */
	u64 generation;			/* lock + resv to write */
	u64 notifications;		/* lock + resv to write */
	unsigned int live_maps;		/* resv */
	unsigned int stale_maps;	/* maps of stale backings; resv to write */
	u32 revoke_reason;		/* KVDMABUF_REVOKE_*; lock + resv */
	/*
	 * The CPU mapping the dma-buf core hands every vmap of the proxy:
	 * @vmap_b's (a live map of it), not necessarily the current
	 * backing's; resv.
	 */
	struct kvd_backing *vmap_b;
	struct iosys_map vmap_bmap;	/* @vmap_b's own mapping */
	/* dmabuf->resv, in a lockdep class of its own (kvd_ops.c) */
	struct dma_resv resv;
	struct work_struct inval_work;	/* the backing's exporter invalidated it */
	wait_queue_head_t wq;		/* stale_maps reached zero */
	struct work_struct reap_work;
	struct list_head global;	/* kvd_proxies; kvd_proxies_lock */
	struct pid *owner_pid;		/* creator's tgid (reference), for LIST */
	kuid_t owner_uid;		/* creator's euid: who may LIST it */
};

/*
 * Most pieces in a block of a RANGES layout (kvd_compose.c): a batch copies
 * the blocks it touches and shares the rest.
 */
#define KVD_LAYOUT_BLOCK_MAX	64

/* kvd_main.c */
extern unsigned int kvd_layout_block_pieces;
extern unsigned int kvd_max_proxies;
extern unsigned int kvd_max_proxies_total;
extern unsigned int kvd_max_proxies_per_uid;
extern struct workqueue_struct *kvd_wq;
extern struct mutex kvd_proxies_lock;
extern struct list_head kvd_proxies;
extern atomic64_t kvd_next_id;
extern atomic_t kvd_nr_proxies;
extern atomic_t kvd_nr_backings;
extern atomic_t kvd_nr_slots;

int kvd_uid_get(kuid_t uid);
void kvd_uid_put(kuid_t uid);

static inline unsigned int kvd_count(struct list_head *head)
{
	struct list_head *pos;
	unsigned int n = 0;

	list_for_each(pos, head)
		n++;
	return n;
}

/* kvd_dev.c */
extern struct miscdevice kvd_misc;
void kvd_ctx_put(struct kvd_ctx *ctx);
void kvd_event(struct kvd_proxy *proxy, u32 state);

/* kvd_ioctl.c */
long kvd_ioctl(struct file *file, unsigned int cmd, unsigned long arg);
int kvd_copy_in(void *karg, size_t ksize, size_t ver0,
		const void __user *uarg, u32 *usize);
int kvd_copy_out(void __user *uarg, const void *karg, size_t ksize,
		 u32 usize);

/* kvd_list.c */
long kvd_ioctl_list(void __user *uarg);
void kvd_debugfs_init(void);
void kvd_debugfs_exit(void);

/* kvd_ops.c */
extern const struct dma_buf_ops kvd_dmabuf_ops;
void kvd_proxy_resv_init(struct kvd_proxy *proxy);
void kvd_attach_put(struct kvd_attach *ka);
unsigned int kvd_attach_pins(struct kvd_attach *ka);
unsigned int kvd_attach_blocking(struct kvd_attach *ka);
unsigned int kvd_attach_revocable_pins(struct kvd_attach *ka);
unsigned int kvd_blocking_pins(struct kvd_proxy *proxy);

/* The importers of a proxy as QUERY and LIST count them. */
struct kvd_importer_counts {
	u32 dynamic, pinned, revocable;		/* importers */
	u32 blocking_pins, revocable_pins;
};
void kvd_count_importers(struct kvd_proxy *proxy,
			 struct kvd_importer_counts *c);
unsigned int kvd_all_pins(struct kvd_proxy *proxy);
/* Where a window of a DMA table lies (kvd_sg_window_find()). */
struct kvd_win {
	struct scatterlist *sg;		/* the entry holding its first byte */
	u64 skip;			/* the bytes of @sg before it */
	unsigned int nents;		/* the entries it takes */
};
int kvd_sg_window_find(struct sg_table *sgt, u64 start, u64 len,
		       struct kvd_win *w);
struct scatterlist *kvd_sg_window_copy(struct scatterlist *dsg,
				       const struct kvd_win *w, u64 len);

/* kvd_backing.c */
struct kvd_slot *kvd_slot_create(struct kvd_proxy *proxy,
				 struct kvd_backing *b,
				 struct kvd_attach *ka);
void kvd_slot_destroy(struct kvd_slot *slot);
void kvd_slot_bury(struct kvd_slot *slot, struct list_head *dead);
void kvd_backing_bury(struct kvd_backing *b, struct list_head *dead);
void kvd_bury(struct list_head *dead);
void kvd_bury_later(struct kvd_proxy *proxy, struct list_head *dead);
struct kvd_slot *kvd_slot_find(struct kvd_backing *b, struct kvd_attach *ka);
int kvd_slot_map(struct kvd_slot *slot);
unsigned int kvd_count_p2p(struct kvd_backing *b);
struct kvd_backing *kvd_backing_alloc(struct dma_buf *dmabuf, u64 offset);
int kvd_backing_build(struct kvd_proxy *proxy, struct kvd_backing *b,
		      struct list_head *dead);
void kvd_backing_put(struct kvd_backing *b);
int kvd_wait_kernel_fences(struct dma_resv *resv);

/* kvd_stale.c */
void kvd_gate_close(struct kvd_backing *b);
void kvd_gate_open(struct kvd_backing *b);
void kvd_reap(struct kvd_proxy *proxy, struct list_head *dead);
bool kvd_stale_room(struct kvd_proxy *proxy, struct list_head *dead);
int kvd_drain(struct kvd_proxy *proxy, u32 timeout_ms);
struct kvd_backing *kvd_unback(struct kvd_proxy *proxy, u32 reason,
			       bool told);
void kvd_backing_stale(struct kvd_proxy *proxy, struct kvd_backing *b,
		       bool told);
void kvd_notify(struct kvd_proxy *proxy);
unsigned int kvd_refusing_pins(struct kvd_proxy *proxy, unsigned int pins,
			       bool *told);
void kvd_reap_work(struct work_struct *work);
bool kvd_revoke_invalidated(struct kvd_proxy *proxy, struct list_head *dead);
void kvd_inval_work(struct work_struct *work);

/* kvd_compose.c */
struct kvd_source;

/* One range of a RANGES call, checked, in proxy order. */
struct kvd_change {
	u64 start;
	u64 length;
	u64 offset;			/* in @dmabuf */
	struct dma_buf *dmabuf;		/* reference held; NULL: unbacked */
	struct kvd_source *src;		/* kvd_compose()'s */
};

struct dma_buf *kvd_compose(u64 length, struct dma_buf *base, u64 base_offset,
			    struct kvd_change *ch, unsigned int nr);
bool kvd_is_layout(const struct dma_buf *dmabuf);
int kvd_layout_prepare(struct dma_buf_attachment *attach);
void kvd_layout_settle(struct dma_buf *dmabuf);

#endif /* KVD_H */
