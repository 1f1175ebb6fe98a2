// SPDX-License-Identifier: MIT
/*
 * registration.c - libkvdmabuf-preload.so's verbs registration entry
 * points: each builds one call, which reg_core() records, makes on a KV
 * region's proxy or as asked, and refuses to leave unseen; deregistration
 * and re-registration keep the records; kp_verbs_dlsym() answers dlsym/dlvsym on a libibverbs or
 * libmlx5 handle with these. The state they share: preload_state.h.
 *
 * Entry points, each at every version libibverbs.so.1 exports (rdma-core
 * 44 and later; `objdump -T libibverbs.so.1`):
 *   ibv_reg_mr@IBVERBS_1.0 (the 1.0 ABI: its PD and MR are wrappers; it
 *     is forwarded as is, and libibverbs' own call of ibv_reg_mr_iova2 on
 *     the real PD lands here, where it is handled), ibv_reg_mr@@IBVERBS_1.1
 *     (what the ibv_reg_mr() macro calls without optional access flags),
 *   ibv_reg_mr_iova@@IBVERBS_1.7, ibv_reg_mr_iova2@@IBVERBS_1.8 (the
 *     macros' choice with IBV_ACCESS_OPTIONAL_RANGE flags),
 *   ibv_reg_dmabuf_mr@@IBVERBS_1.12,
 *   ibv_dereg_mr@IBVERBS_1.0 (forwarded; its inner ibv_dereg_mr lands
 *     here) and ibv_dereg_mr@@IBVERBS_1.1,
 *   ibv_rereg_mr@@IBVERBS_1.1 (its only version): forwarded and the
 *     record updated, or refused where the result would be an MR by
 *     address in a region that has a proxy (see kp_rereg_mr_1_1()),
 *   ibv_reg_mr_ex@@IBVERBS_1.15 (rdma-core 59; verbs_ex.h): by address or
 *     by dma-buf as its comp_mask says, made on the proxy by itself again
 *     (its DMA handle kept); with a provider's buffer or fields newer than
 *     this preload, made as asked and marked cannot follow;
 *   mlx5dv_reg_dmabuf_mr@@MLX5_1.25 (libmlx5.so.1, rdma-core 53): like
 *     ibv_reg_dmabuf_mr, its mlx5 access flags kept on the proxy.
 * Each forwards with dlvsym() to the same symbol at the same version.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "preload_state.h"
#include "verbs_ex.h"

typedef struct ibv_mr *(*reg_mr_fn)(struct ibv_pd *, void *, size_t, int);
typedef struct ibv_mr *(*reg_iova_fn)(struct ibv_pd *, void *, size_t,
				      uint64_t, int);
typedef struct ibv_mr *(*reg_iova2_fn)(struct ibv_pd *, void *, size_t,
				       uint64_t, unsigned int);
typedef struct ibv_mr *(*reg_dmabuf_fn)(struct ibv_pd *, uint64_t, size_t,
					uint64_t, int, int);
typedef struct ibv_mr *(*mlx5_dmabuf_fn)(struct ibv_pd *, uint64_t, size_t,
					 uint64_t, int, int, int);
typedef int (*dereg_fn)(struct ibv_mr *);
typedef int (*rereg_fn)(struct ibv_mr *, int, struct ibv_pd *, void *,
			size_t, int);

/* What the engine asked for, to be made as asked when not on a proxy. */
struct kp_call {
	enum kp_entry e;
	struct ibv_pd *pd;
	void *addr;             /* address forms */
	size_t len;
	uint64_t iova;
	uint64_t offset;        /* dma-buf form */
	int fd;
	unsigned int access;
	struct kp_mr_init_attr *ex;     /* ibv_reg_mr_ex's, the engine's */
	int mlx5_access;                /* mlx5dv_reg_dmabuf_mr's */
};

/* A registration of a dma-buf (its fd and offset), not of an address. */
static bool by_fd(const struct kp_call *c)
{
	return c->e == E_REG_DMABUF || c->e == E_MLX5_DMABUF ||
	       (c->e == E_REG_MR_EX && (c->ex->comp_mask & KP_MR_MASK_FD));
}

/* ibv_reg_mr_ex attributes that cannot be carried over to the proxy: a
 * provider's buffer, or fields newer than this preload. */
static uint64_t ex_foreign(const struct kp_call *c)
{
	const uint64_t known = KP_MR_MASK_IOVA | KP_MR_MASK_ADDR |
			       KP_MR_MASK_FD | KP_MR_MASK_FD_OFFSET |
			       KP_MR_MASK_DMAH;

	return c->e == E_REG_MR_EX ? c->ex->comp_mask & ~known : 0;
}

static struct ibv_mr *forward(const struct kp_call *c)
{
	void *f = kp_next_fn(c->e);
	struct ibv_mr *mr = NULL;

	if (!f) {
		errno = ENOSYS;
		return NULL;
	}
	kp_depth++;
	switch (c->e) {
	case E_REG_MR_1_0:
	case E_REG_MR_1_1:
		mr = ((reg_mr_fn)f)(c->pd, c->addr, c->len, (int)c->access);
		break;
	case E_REG_MR_IOVA:
		mr = ((reg_iova_fn)f)(c->pd, c->addr, c->len, c->iova,
				      (int)c->access);
		break;
	case E_REG_MR_IOVA2:
		mr = ((reg_iova2_fn)f)(c->pd, c->addr, c->len, c->iova,
				       c->access);
		break;
	case E_REG_DMABUF:
		mr = ((reg_dmabuf_fn)f)(c->pd, c->offset, c->len, c->iova,
					c->fd, (int)c->access);
		break;
	case E_REG_MR_EX:
		mr = ((reg_ex_fn)f)(c->pd, c->ex);
		break;
	case E_MLX5_DMABUF:
		mr = ((mlx5_dmabuf_fn)f)(c->pd, c->offset, c->len, c->iova,
					 c->fd, (int)c->access, c->mlx5_access);
		break;
	default:
		errno = EINVAL;
		break;
	}
	kp_depth--;
	return mr;
}

/* The same registration on the region's proxy, in the engine's PD. */
static struct ibv_mr *on_proxy(const struct kp_call *c, int proxy_fd,
			       uint64_t off, int *err)
{
	/* ibv_reg_mr_ex: by itself again, its DMA handle kept;
	 * mlx5dv_reg_dmabuf_mr: by itself again, its mlx5 access kept */
	void *f = kp_next_fn(c->e == E_REG_MR_EX || c->e == E_MLX5_DMABUF ?
			  c->e : E_REG_DMABUF);
	struct kp_mr_init_attr ex;
	struct ibv_mr *mr;

	if (!f) {
		*err = ENOSYS;
		return NULL;
	}
	kp_depth++;
	errno = 0;
	if (c->e == E_REG_MR_EX) {
		ex = (struct kp_mr_init_attr){
			.length = c->len, .access = (int)c->access,
			.comp_mask = KP_MR_MASK_IOVA | KP_MR_MASK_FD |
				     KP_MR_MASK_FD_OFFSET |
				     (c->ex->comp_mask & KP_MR_MASK_DMAH),
			.iova = c->iova, .fd = proxy_fd, .fd_offset = off,
			.dmah = c->ex->comp_mask & KP_MR_MASK_DMAH ?
				c->ex->dmah : NULL,
		};
		mr = ((reg_ex_fn)f)(c->pd, &ex);
	} else if (c->e == E_MLX5_DMABUF) {
		mr = ((mlx5_dmabuf_fn)f)(c->pd, off, c->len, c->iova, proxy_fd,
					 (int)c->access, c->mlx5_access);
	} else {
		mr = ((reg_dmabuf_fn)f)(c->pd, off, c->len, c->iova, proxy_fd,
					(int)c->access);
	}
	*err = mr ? 0 : errno ? errno : EIO;
	kp_depth--;
	if (mr && !by_fd(c))
		mr->addr = c->addr;     /* as ibv_reg_mr reports it */
	else if (mr)
		mr->addr = (void *)(uintptr_t)c->offset;
	return mr;
}

/*
 * The registration of [@a, +c->len) in KV region @tag failed on its proxy
 * (@proxy_err) and as asked (@asked_err): both said on stderr and kept as
 * this thread's kvdmabuf_preload_reg_error(). Return: the errno the engine
 * gets, the proxy's (the cause), except EOPNOTSUPP (a NIC without dma-buf
 * MRs, for which the registration as asked is what was meant).
 */
static int reg_failed(const struct kp_call *c, uintptr_t a, const char *tag,
		      int proxy_err, int asked_err)
{
	if (!asked_err)
		asked_err = EIO;
	kp_msg(kp_reg_err, sizeof(kp_reg_err), "%s of %#" PRIxPTR "+%#zx in KV "
	    "region '%s' failed: on the region's proxy dma-buf: %s (errno "
	    "%d); as asked: %s (errno %d)", kp_entries[c->e].name, a, c->len, tag,
	    strerror(proxy_err), proxy_err, strerror(asked_err), asked_err);
	fprintf(stderr, "kvdmabuf-preload: %s\n", kp_reg_err);
	return proxy_err == EOPNOTSUPP ? asked_err : proxy_err;
}

void kp_dmabuf_exported(int fd, uintptr_t va, size_t len)
{
	struct stat st;

	if (fstat(fd, &st))
		return;
	pthread_mutex_lock(&kp.lock);
	kp_origin_note(&kp.origins, st.st_dev, st.st_ino, va, len);
	kp_unlock();
}

/*
 * The memory an engine's dma-buf MR covers: from the export it came from
 * where the engine exported it here (its iova is whatever the engine
 * chose: 0 for a zero-based MR), else its iova (taken to be the VA, as
 * Mooncake and NCCL register). kp.lock held; @st from fstat of its fd.
 */
static uintptr_t dmabuf_mr_start(const struct kp_call *c,
				 const struct stat *st)
{
	const struct kp_origin *o = st ? kp_origin_of(&kp.origins, st->st_dev,
						      st->st_ino) : NULL;

	if (o && c->offset <= o->len && c->len <= o->len - c->offset)
		return o->va + (uintptr_t)c->offset;
	return (uintptr_t)c->iova;
}

static struct ibv_mr *reg_core(struct kp_call *c)
{
	struct kp_mr rec = { .len = c->len, .mode = KP_OUTSIDE };
	struct kp_region *r;
	struct ibv_mr *mr = NULL;
	int proxy_fd = -1, err = 0;
	uint64_t poff = 0, pend;
	char tag[KP_TAGMAX] = "";
	bool in = false, known;
	struct stat st;
	uintptr_t a;

	atomic_fetch_add(&kp.calls[c->e], 1);
	if (kp_depth || !c->pd)
		return forward(c);
	pthread_once(&kp.env_once, kp_env_load);
	kp_nic_name(c->pd, rec.nic, sizeof(rec.nic));
	known = by_fd(c) && !fstat(c->fd, &st);
	pthread_mutex_lock(&kp.lock);
	a = by_fd(c) ? dmabuf_mr_start(c, known ? &st : NULL) :
	    (uintptr_t)c->addr;
	rec.addr = a;
	r = kp_region_containing(a, c->len);
	if (r && ex_foreign(c)) {
		in = true;
		snprintf(tag, sizeof(tag), "%s", r->tag);
		snprintf(rec.why, sizeof(rec.why), "ibv_reg_mr_ex with "
			 "comp_mask %#" PRIx64 " (a provider's buffer, or "
			 "fields this preload does not know: %#" PRIx64 ") "
			 "cannot be made on KV region '%s''s proxy",
			 c->ex->comp_mask, ex_foreign(c), r->tag);
	} else if (r) {
		in = true;
		proxy_fd = r->proxy_fd;
		poff = r->proxy_off + (a - r->addr);
		snprintf(tag, sizeof(tag), "%s", r->tag);
	} else if (kp_region_overlapping(a, c->len)) {
		in = true;
		r = kp_region_overlapping(a, c->len);
		snprintf(tag, sizeof(tag), "%s", r->tag);
		snprintf(rec.why, sizeof(rec.why), "it reaches past KV region "
			 "'%s' %#" PRIxPTR "+%#zx (one MR over KV and other "
			 "memory)", r->tag, r->addr, r->len);
	}
	/* Seen by a sleep check from now until recorded (or failed). */
	pend = kp_pending_add(a, c->len);
	kp_unlock();
	if (!pend) {
		errno = ENOMEM;
		return NULL;
	}

	if (in && proxy_fd >= 0) {
		mr = on_proxy(c, proxy_fd, poff, &err);
		if (mr) {
			rec.mode = KP_ON_PROXY;
		} else {
			snprintf(rec.why, sizeof(rec.why), "NIC %s could not "
				 "register region '%s''s proxy dma-buf (%s), so "
				 "the %s was made as asked", rec.nic, tag,
				 strerror(err), by_fd(c) ?
				 "engine's own dma-buf MR" :
				 "registration by address");
		}
	} else if (in && !rec.why[0]) {
		snprintf(rec.why, sizeof(rec.why), "KV region '%s' has no "
			 "proxy dma-buf (host memory, or declared without "
			 "one): the %s holds the pages it was made on", tag,
			 by_fd(c) ? "engine's own dma-buf MR" :
			 "registration by address");
	}
	if (!mr) {
		errno = 0;
		mr = forward(c);
		if (!mr) {
			/* nothing made: nothing to record */
			int asked = errno;

			pthread_mutex_lock(&kp.lock);
			kp_pending_done(pend);
			kp_unlock();
			errno = asked;
			if (in && proxy_fd >= 0)
				errno = reg_failed(c, a, tag, err, errno);
			return NULL;
		}
		if (in)
			rec.mode = KP_CANNOT_FOLLOW;
	}
	rec.mr = mr;
	rec.lkey = mr->lkey;
	pthread_mutex_lock(&kp.lock);
	kp_pending_done(pend);
	/* A region declared meanwhile: this registration cannot follow. */
	if (rec.mode == KP_OUTSIDE && (r = kp_region_overlapping(a, c->len))) {
		rec.mode = KP_CANNOT_FOLLOW;
		snprintf(rec.why, sizeof(rec.why), "made while KV region '%s' "
			 "was being declared", r->tag);
	}
	err = kp_mr_add(&kp.mrs, &rec);
	/* MRs outside every region are not in the file: no rewrite */
	if (!err && rec.mode != KP_OUTSIDE) {
		kp.file_wanted = true;
		kp_publish_locked();
	}
	kp_unlock();
	if (err && in) {
		/* unrecorded KV registration: never hand it out */
		void *f = kp_next_fn(E_DEREG_1_1);

		if (f) {
			kp_depth++;
			((dereg_fn)f)(mr);
			kp_depth--;
		}
		errno = ENOMEM;
		return NULL;
	}
	return mr;
}

/* The entry points: global for .symver, hidden names (version script). */
struct ibv_mr *kp_reg_mr_1_0(struct ibv_pd *pd, void *addr, size_t len,
			     int access);
struct ibv_mr *kp_reg_mr_1_1(struct ibv_pd *pd, void *addr, size_t len,
			     int access);
struct ibv_mr *kp_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len,
			      uint64_t iova, int access);
struct ibv_mr *kp_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len,
			       uint64_t iova, unsigned int access);
struct ibv_mr *kp_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				size_t len, uint64_t iova, int fd, int access);
int kp_dereg_mr_1_0(struct ibv_mr *mr);
int kp_dereg_mr_1_1(struct ibv_mr *mr);
int kp_rereg_mr_1_1(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
		    void *addr, size_t len, int access);
struct ibv_mr *kp_reg_mr_ex(struct ibv_pd *pd, struct kp_mr_init_attr *in);
struct ibv_mr *kp_mlx5_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				     size_t len, uint64_t iova, int fd,
				     int access, int mlx5_access);

struct ibv_mr *kp_reg_mr_1_1(struct ibv_pd *pd, void *addr,
				    size_t len, int access)
{
	struct kp_call c = { .e = E_REG_MR_1_1, .pd = pd, .addr = addr,
			     .len = len, .iova = (uintptr_t)addr,
			     .access = (unsigned int)access };

	return reg_core(&c);
}

struct ibv_mr *kp_reg_mr_iova(struct ibv_pd *pd, void *addr,
				     size_t len, uint64_t iova, int access)
{
	struct kp_call c = { .e = E_REG_MR_IOVA, .pd = pd, .addr = addr,
			     .len = len, .iova = iova,
			     .access = (unsigned int)access };

	return reg_core(&c);
}

struct ibv_mr *kp_reg_mr_iova2(struct ibv_pd *pd, void *addr,
				      size_t len, uint64_t iova,
				      unsigned int access)
{
	struct kp_call c = { .e = E_REG_MR_IOVA2, .pd = pd, .addr = addr,
			     .len = len, .iova = iova, .access = access };

	return reg_core(&c);
}

struct ibv_mr *kp_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				       size_t len, uint64_t iova, int fd,
				       int access)
{
	struct kp_call c = { .e = E_REG_DMABUF, .pd = pd, .offset = offset,
			     .len = len, .iova = iova, .fd = fd,
			     .access = (unsigned int)access };

	return reg_core(&c);
}

/*
 * mlx5dv_reg_dmabuf_mr@@MLX5_1.25 (libmlx5, rdma-core 53): a dma-buf MR
 * with mlx5 access flags (data direct), made by the provider without
 * libibverbs' ibv_reg_dmabuf_mr. On a proxy it is made by itself again,
 * the flags kept.
 */
struct ibv_mr *kp_mlx5_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				     size_t len, uint64_t iova, int fd,
				     int access, int mlx5_access)
{
	struct kp_call c = { .e = E_MLX5_DMABUF, .pd = pd, .offset = offset,
			     .len = len, .iova = iova, .fd = fd,
			     .access = (unsigned int)access,
			     .mlx5_access = mlx5_access };

	return reg_core(&c);
}

/*
 * ibv_reg_mr_ex@@IBVERBS_1.15: by address or by dma-buf, as its comp_mask
 * says; the engine's struct is read only where comp_mask sets a field.
 */
struct ibv_mr *kp_reg_mr_ex(struct ibv_pd *pd, struct kp_mr_init_attr *in)
{
	struct kp_call c = { .e = E_REG_MR_EX, .pd = pd, .ex = in, .fd = -1 };

	if (!in) {
		atomic_fetch_add(&kp.calls[c.e], 1);
		return forward(&c);     /* libibverbs answers */
	}
	c.len = in->length;
	c.access = (unsigned int)in->access;
	if (in->comp_mask & KP_MR_MASK_ADDR)
		c.addr = in->addr;
	c.iova = in->comp_mask & KP_MR_MASK_IOVA ? in->iova :
		 (uintptr_t)c.addr;
	if (in->comp_mask & KP_MR_MASK_FD) {
		c.fd = in->fd;
		if (in->comp_mask & KP_MR_MASK_FD_OFFSET)
			c.offset = in->fd_offset;
	}
	return reg_core(&c);
}

/*
 * The 1.0 ABI: the PD is libibverbs' wrapper (struct ibv_pd_1_0), not
 * ours to read. Forwarded at our depth, so that its inner call of
 * ibv_reg_mr_iova2 with the real PD is handled above.
 */
struct ibv_mr *kp_reg_mr_1_0(struct ibv_pd *pd, void *addr,
				    size_t len, int access)
{
	reg_mr_fn f = (reg_mr_fn)kp_next_fn(E_REG_MR_1_0);

	atomic_fetch_add(&kp.calls[E_REG_MR_1_0], 1);
	if (!f) {
		errno = ENOSYS;
		return NULL;
	}
	return f(pd, addr, len, access);
}

int kp_dereg_mr_1_0(struct ibv_mr *mr)
{
	dereg_fn f = (dereg_fn)kp_next_fn(E_DEREG_1_0);

	atomic_fetch_add(&kp.calls[E_DEREG_1_0], 1);
	return f ? f(mr) : ENOSYS;
}

int kp_dereg_mr_1_1(struct ibv_mr *mr)
{
	dereg_fn f = (dereg_fn)kp_next_fn(E_DEREG_1_1);
	struct kp_mr *m;
	bool in;
	int rc;

	atomic_fetch_add(&kp.calls[E_DEREG_1_1], 1);
	if (!f)
		return ENOSYS;
	if (kp_depth)
		return f(mr);
	/*
	 * The record stays (a sleep check still sees the MR) but leaves the
	 * lookup, and only this call forgets it: once the provider freed the
	 * struct, another thread's registration may get it and record it
	 * under the same pointer, and that record must survive this dereg.
	 */
	pthread_mutex_lock(&kp.lock);
	m = kp_mr_find(&kp.mrs, mr);
	if (m)
		kp_mr_dying(&kp.mrs, m);
	kp_unlock();
	kp_depth++;
	rc = f(mr);
	kp_depth--;
	if (m) {
		pthread_mutex_lock(&kp.lock);
		in = m->mode != KP_OUTSIDE;
		if (rc) {
			kp_mr_revive(&kp.mrs, m); /* still registered */
		} else {
			kp_mr_forget(&kp.mrs, m);
			if (in)
				kp_publish_locked();
		}
		kp_unlock();
	}
	return rc;
}

/*
 * kp.lock held: why ibv_rereg_mr(@m's MR, @flags, [@a, @a+@len)) must be
 * refused, in @why, or "" when it may be forwarded. A new translation
 * would take an MR made on a proxy off it (the provider re-pins by
 * address), or put one by address into a region whose memory the proxy
 * serves (it would not follow a wake): neither can be re-done on the
 * proxy in place (the engine holds the struct ibv_mr, whose handle the
 * provider owns), so the engine must deregister and register again.
 */
static void rereg_refusal(const struct kp_mr *m, int flags, uintptr_t a,
			  size_t len, char *why, size_t wlen)
{
	const struct kp_region *r;

	why[0] = '\0';
	if (!(flags & IBV_REREG_MR_CHANGE_TRANSLATION))
		return;
	if (m && m->mode == KP_ON_PROXY) {
		kp_msg(why, wlen, "it is made on a KV region's proxy dma-buf; a "
		    "new translation would pin memory by address instead");
		return;
	}
	r = kp_region_overlapping(a, len);
	if (r && r->proxy_fd >= 0)
		kp_msg(why, wlen, "the new range %#" PRIxPTR "+%#zx lies in KV "
		    "region '%s', served by its proxy: an MR by address there "
		    "would not follow a wake", a, len, r->tag);
}

/* kp.lock held: @m after a successful rereg of its MR. */
static void rereg_record(struct kp_mr *m, int flags, struct ibv_pd *pd,
			 uintptr_t a, size_t len)
{
	const struct kp_region *r;

	if (flags & IBV_REREG_MR_CHANGE_PD)
		kp_nic_name(pd, m->nic, sizeof(m->nic));
	if (!(flags & IBV_REREG_MR_CHANGE_TRANSLATION))
		return;         /* a proxy MR stays on its proxy */
	m->addr = a;
	m->len = len;
	m->why[0] = '\0';
	m->mode = KP_OUTSIDE;
	r = kp_region_overlapping(a, len);
	if (r) {
		m->mode = KP_CANNOT_FOLLOW;
		kp_msg(m->why, sizeof(m->why), "re-registered (ibv_rereg_mr) by "
		    "address into KV region '%s', which has no proxy", r->tag);
	}
}

/*
 * ibv_rereg_mr@@IBVERBS_1.1: forwarded, and the engine's record follows
 * it (new range: in a region or not again; new PD: its NIC). Refused with
 * IBV_REREG_MR_ERR_INPUT (the MR is unchanged and valid), errno
 * EOPNOTSUPP and a line on stderr where rereg_refusal() says so.
 */
int kp_rereg_mr_1_1(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
		    void *addr, size_t len, int access)
{
	rereg_fn f = (rereg_fn)kp_next_fn(E_REREG_1_1);
	char why[KP_WHYMAX];
	struct kp_mr *m;
	uintptr_t a;
	size_t l;
	int rc;

	atomic_fetch_add(&kp.calls[E_REREG_1_1], 1);
	if (!f) {
		errno = ENOSYS;
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (kp_depth || !mr)
		return f(mr, flags, pd, addr, len, access);
	pthread_once(&kp.env_once, kp_env_load);
	pthread_mutex_lock(&kp.lock);
	m = kp_mr_find(&kp.mrs, mr);
	a = m ? m->addr : (uintptr_t)mr->addr;
	l = m ? m->len : mr->length;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		a = (uintptr_t)addr;
		l = len;
	}
	rereg_refusal(m, flags, a, l, why, sizeof(why));
	kp_unlock();
	if (why[0]) {
		fprintf(stderr, "kvdmabuf-preload: ibv_rereg_mr of MR 0x%x "
			"refused: %s; deregister it and register the new "
			"range instead (nothing was changed)\n", mr->lkey, why);
		errno = EOPNOTSUPP;
		return IBV_REREG_MR_ERR_INPUT;
	}
	kp_depth++;
	rc = f(mr, flags, pd, addr, len, access);
	kp_depth--;
	if (rc)
		return rc;
	pthread_mutex_lock(&kp.lock);
	m = kp_mr_find(&kp.mrs, mr);
	if (m) {
		bool was_in = m->mode != KP_OUTSIDE;

		rereg_record(m, flags, pd, a, l);
		m->lkey = mr->lkey;     /* a new translation may change it */
		kp.file_wanted |= m->mode != KP_OUTSIDE;
		if (was_in || m->mode != KP_OUTSIDE)
			kp_publish_locked();
	}
	kp_unlock();
	return 0;
}

/* Global, named by .symver; the version script hides the kp_ names. */
__asm__(".symver kp_reg_mr_1_0, ibv_reg_mr@IBVERBS_1.0");
__asm__(".symver kp_reg_mr_1_1, ibv_reg_mr@@IBVERBS_1.1");
__asm__(".symver kp_reg_mr_iova, ibv_reg_mr_iova@@IBVERBS_1.7");
__asm__(".symver kp_reg_mr_iova2, ibv_reg_mr_iova2@@IBVERBS_1.8");
__asm__(".symver kp_reg_dmabuf_mr, ibv_reg_dmabuf_mr@@IBVERBS_1.12");
__asm__(".symver kp_dereg_mr_1_0, ibv_dereg_mr@IBVERBS_1.0");
__asm__(".symver kp_dereg_mr_1_1, ibv_dereg_mr@@IBVERBS_1.1");
__asm__(".symver kp_rereg_mr_1_1, ibv_rereg_mr@@IBVERBS_1.1");
__asm__(".symver kp_reg_mr_ex, ibv_reg_mr_ex@@IBVERBS_1.15");
__asm__(".symver kp_mlx5_reg_dmabuf_mr, mlx5dv_reg_dmabuf_mr@@MLX5_1.25");

/* Our entry point of each, as dlsym/dlvsym on a handle hand it out. */
static void *const own[E_NR] = {
	[E_REG_MR_1_0] = (void *)kp_reg_mr_1_0,
	[E_REG_MR_1_1] = (void *)kp_reg_mr_1_1,
	[E_REG_MR_IOVA] = (void *)kp_reg_mr_iova,
	[E_REG_MR_IOVA2] = (void *)kp_reg_mr_iova2,
	[E_REG_DMABUF] = (void *)kp_reg_dmabuf_mr,
	[E_DEREG_1_0] = (void *)kp_dereg_mr_1_0,
	[E_DEREG_1_1] = (void *)kp_dereg_mr_1_1,
	[E_REREG_1_1] = (void *)kp_rereg_mr_1_1,
	[E_REG_MR_EX] = (void *)kp_reg_mr_ex,
	[E_MLX5_DMABUF] = (void *)kp_mlx5_reg_dmabuf_mr,
};

bool kp_is_own_entry(const void *f)
{
	int e;

	for (e = 0; e < E_NR; e++)
		if (f == own[e])
			return true;
	return false;
}

void *kp_verbs_dlsym(const char *name, const char *version, void *real)
{
	int e, found = -1;

	for (e = 0; e < E_NR; e++) {
		if (strcmp(name, kp_entries[e].name))
			continue;
		if (version && strcmp(version, kp_entries[e].version))
			continue;
		found = e;      /* without a version: the newest, the default */
	}
	if (found < 0 || !real || real == own[found])
		return NULL;
	/* A libibverbs only that handle reaches (RTLD_LOCAL): its own. */
	if (!atomic_load(&kp.next[found]))
		atomic_store(&kp.next[found], real);
	return own[found];
}


