/* SPDX-License-Identifier: MIT */
/*
 * lib_fake.h - test backends for libkvdmabuf behind its internal ops table
 * (lib/internal.h), the same interface the real backends implement.
 *
 * What each fake stands for:
 *  - fake NIC ("fake0", ...): a verbs device with a PD. Per NIC one chooses
 *    whether it has dma-buf MRs (no: like rxe/siw, EOPNOTSUPP) and whether
 *    its dma-buf importer pins (like efa, bnxt_re) or follows moves (like
 *    mlx5). An MR on a dma-buf holds a reference to it (a dup of the fd),
 *    as an importer attachment does; keys are fresh on every registration.
 *  - fake export: a memfd named "fake-backing" standing in for the dma-buf
 *    that CUDA or a DRM driver exports for the current physical memory.
 *  - fake module: proxies are memfds named "fake-proxy"; attach keeps a
 *    dup of the backing (the module's reference), revoke drops it and
 *    fails with -EBUSY while a pinning importer is registered, registering
 *    on a revoked proxy fails with -ENODEV (mlx5 maps at registration).
 *  - injector: wraps any ops table (fakes here, the real verbs in the VM)
 *    and fails the n-th call of one operation with a chosen errno. With
 *    revoke_late, an injected revoke fails *after* revoking, as the
 *    module's REVOKE does when importers keep their mappings past the
 *    bound (-ETIMEDOUT) or a signal ends the wait (-EINTR).
 *
 * Open "fake-backing" fds in /proc/self/fd = references that keep some
 * old physical memory alive: while asleep there must be none.
 */
#ifndef KVDMABUF_TESTS_LIB_FAKE_H
#define KVDMABUF_TESTS_LIB_FAKE_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../lib/internal.h"

#define FAKE_MAX_MR 256
#define FAKE_MAX_PROXY 64
#define FAKE_MAX_PIECES 32

struct fake_mr {
	int used;
	unsigned int nic;
	uint64_t iova;
	size_t len;
	int ref_fd;          /* dup of the dma-buf it maps, -1 for by-address */
	int proxy;           /* index of the proxy registered on, or -1 */
	int pins;
	int on_demand;       /* KVD_REG_ON_DEMAND: follows the page tables */
	uint32_t key;
	/* prefetches asked (ibv_advise_mr), and the proxy's generation and
	 * state at the last: what the NIC would have mapped */
	unsigned int prefetched;
	uint64_t prefetch_gen;
	int prefetch_state;
	int prefetch_io_rc;  /* kvdmabuf_io_begin(fw.io_probe) then */
};

struct fake_proxy {
	int used;
	int fd;
	ino_t ino;           /* fd numbers are reused: match the memfd too */
	int backing;         /* dup of the backing, -1 when none */
	int state;           /* KVD_PROXY_* */
	uint64_t gen;
	uint32_t dynamic, pinned;
	uint32_t revocable;  /* of pinned: revocable pins (nic_pins 2) */
	uint64_t notifications;
	uint32_t revoke_reason;  /* KVD_REVOKE_* */
	/* an importer that lets go of the old backing this long after a
	 * revoke or replace asks (its fences, a stale mapping): the module
	 * waits up to the call's timeout, then answers -ETIMEDOUT with the
	 * proxy revoked all the same */
	unsigned int unmap_ms;
	char label[32];          /* the dma-buf's name (proxy_label) */
	uint64_t size;
	/* after RANGES: the layout, sorted; fd a dup, -1 unbacked */
	struct fake_piece {
		uint64_t start, len;
		int fd;
	} piece[FAKE_MAX_PIECES];
	unsigned int nr_pieces;
	unsigned int ranges_calls;
};

enum fake_op { OP_EXPORT, OP_REG, OP_DEREG, OP_ATTACH, OP_REVOKE,
	       OP_CREATE, OP_QUERY, OP_NR };
static const char *const fake_op_name[OP_NR] = {
	"export", "register", "deregister", "attach", "revoke", "create",
	"query",
};

struct fake_world {
	unsigned int nr_nics;
	int nic_dmabuf[KVDMABUF_MAX_NICS];   /* has dma-buf MRs */
	int nic_pins[KVDMABUF_MAX_NICS];     /* importer pins; 2: revocable */
	uint64_t nic_max_mr[KVDMABUF_MAX_NICS]; /* max_mr_size; 0: unknown */
	/* on-demand paging: 1 advertised and taken, 2 advertised but an
	 * on-demand registration refused (-EOPNOTSUPP) */
	int nic_odp[KVDMABUF_MAX_NICS];
	/* ibv_advise_mr prefetch: 0 -EOPNOTSUPP (not every NIC has it) */
	int nic_prefetch[KVDMABUF_MAX_NICS];
	struct kvdmabuf_region *io_probe;    /* tried at each prefetch */
	int module;                          /* fake module present */
	int real_export;                     /* CUDA/DRM through the library */
	struct fake_mr mr[FAKE_MAX_MR];
	struct fake_proxy px[FAKE_MAX_PROXY];
	uint32_t next_key;
	unsigned int exports;
	uint32_t last_drm_handle;
	/* injector */
	const struct kvd_ops *inner;
	unsigned long calls[OP_NR];
	unsigned long fail_at[OP_NR];        /* 0: never; n: the n-th call */
	int fail_rc;
	int revoke_late;                     /* revoke first, then fail */
	unsigned long injected;
};

static struct fake_world fw;

static inline void fake_reset(unsigned int nr_nics)
{
	unsigned int i;

	memset(&fw, 0, sizeof(fw));
	fw.nr_nics = nr_nics;
	for (i = 0; i < KVDMABUF_MAX_NICS; i++)
		fw.nic_dmabuf[i] = 1;
	fw.next_key = 0x100;
	fw.fail_rc = -EIO;
}

static inline int fake_find_proxy(int fd)
{
	struct stat st;
	int i;

	if (fstat(fd, &st))
		return -1;
	for (i = 0; i < FAKE_MAX_PROXY; i++)
		if (fw.px[i].used && fw.px[i].fd == fd &&
		    fw.px[i].ino == st.st_ino)
			return i;
	return -1;
}

static int fake_nics_open(struct kvdmabuf_ctx *ctx,
			  const struct kvdmabuf_options *o)
{
	unsigned int i;

	(void)o;
	if (!fw.nr_nics)
		return kvd_err(ctx, -ENODEV, "protocol rdma but no RDMA "
			       "device (fake)");
	for (i = 0; i < fw.nr_nics; i++) {
		snprintf(ctx->nics[i].name, sizeof(ctx->nics[i].name),
			 "fake%u", i);
		ctx->nics[i].max_mr_size = fw.nic_max_mr[i];
		ctx->nics[i].odp = fw.nic_odp[i] != 0;
	}
	ctx->nr_nics = fw.nr_nics;
	return 0;
}

static void fake_nics_close(struct kvdmabuf_ctx *ctx)
{
	ctx->nr_nics = 0;
}

/* A NIC joining after open: the next "fakeN", with fw.nic_* of index N. */
static int fake_nic_add(struct kvdmabuf_ctx *ctx, struct ibv_pd *pd)
{
	unsigned int n = ctx->nr_nics;

	if (n == KVDMABUF_MAX_NICS)
		return kvd_err(ctx, -E2BIG, "fake: too many NICs");
	snprintf(ctx->nics[n].name, sizeof(ctx->nics[n].name), "fake%u", n);
	ctx->nics[n].pd = pd;
	ctx->nics[n].max_mr_size = fw.nic_max_mr[n];
	ctx->nics[n].odp = fw.nic_odp[n] != 0;
	ctx->nr_nics++;
	return 0;
}

/* NIC @i leaves: later NICs (their names, properties, MRs) move down. */
static void fake_nic_remove(struct kvdmabuf_ctx *ctx, unsigned int i)
{
	unsigned int rest = ctx->nr_nics - i - 1;
	int m;

	memmove(&ctx->nics[i], &ctx->nics[i + 1], rest * sizeof(ctx->nics[0]));
	memset(&ctx->nics[--ctx->nr_nics], 0, sizeof(ctx->nics[0]));
	memmove(&fw.nic_dmabuf[i], &fw.nic_dmabuf[i + 1],
		rest * sizeof(fw.nic_dmabuf[0]));
	memmove(&fw.nic_pins[i], &fw.nic_pins[i + 1],
		rest * sizeof(fw.nic_pins[0]));
	memmove(&fw.nic_max_mr[i], &fw.nic_max_mr[i + 1],
		rest * sizeof(fw.nic_max_mr[0]));
	for (m = 0; m < FAKE_MAX_MR; m++)
		if (fw.mr[m].used && fw.mr[m].nic > i)
			fw.mr[m].nic--;
}

static int fake_export(struct kvdmabuf_ctx *ctx, struct kvdmabuf_region *r,
		       int *fd, uint64_t *off)
{
	int m;

	if (fw.real_export)
		return kvd_export_dmabuf(ctx, r, fd, off);
	if (r->mem == KVDMABUF_MEM_HOST)
		return kvd_err(ctx, -EOPNOTSUPP, "host memory: no export");
	m = memfd_create("fake-backing", MFD_CLOEXEC);
	if (m < 0)
		return kvd_err(ctx, -errno, "memfd_create");
	if (ftruncate(m, (off_t)r->len)) {
		close(m);
		return kvd_err(ctx, -EIO, "ftruncate");
	}
	fw.exports++;
	fw.last_drm_handle = r->drm_handle;
	*fd = m;
	*off = 0;
	return 0;
}

static struct fake_mr *fake_mr_new(void)
{
	int i;

	for (i = 0; i < FAKE_MAX_MR; i++)
		if (!fw.mr[i].used) {
			memset(&fw.mr[i], 0, sizeof(fw.mr[i]));
			fw.mr[i].used = 1;
			fw.mr[i].ref_fd = -1;
			fw.mr[i].proxy = -1;
			return &fw.mr[i];
		}
	return NULL;
}

static int fake_reg_dmabuf(struct kvdmabuf_ctx *ctx, unsigned int nic, int fd,
			   uint64_t off, size_t len, uint64_t iova,
			   struct kvd_mr *out)
{
	struct fake_mr *m;
	int p;

	(void)off;
	if (!fw.nic_dmabuf[nic])
		return kvd_err(ctx, -EOPNOTSUPP, "fake%u: no dma-buf MRs", nic);
	p = fake_find_proxy(fd);
	if (p >= 0 && fw.px[p].state != KVD_PROXY_BACKED)
		return kvd_err(ctx, -ENODEV, "fake%u: proxy not backed", nic);
	m = fake_mr_new();
	if (!m)
		return kvd_err(ctx, -ENOMEM, "fake: too many MRs");
	m->nic = nic;
	m->iova = iova;
	m->len = len;
	m->proxy = p;
	m->pins = fw.nic_pins[nic];
	m->key = fw.next_key++;
	if (p >= 0) {
		if (m->pins)
			fw.px[p].pinned++;
		else
			fw.px[p].dynamic++;
		if (m->pins == 2)
			fw.px[p].revocable++;
	} else {
		m->ref_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	}
	out->handle = m;
	out->lkey = m->key;
	out->rkey = m->key ^ 0x80000000u;
	return 0;
}

static int fake_reg_addr(struct kvdmabuf_ctx *ctx, unsigned int nic,
			 void *addr, size_t len, unsigned int flags,
			 struct kvd_mr *out)
{
	struct fake_mr *m;

	if ((flags & KVD_REG_ON_DEMAND) && fw.nic_odp[nic] != 1)
		return kvd_err(ctx, -EOPNOTSUPP, "fake: no on-demand MRs");
	m = fake_mr_new();
	if (!m)
		return kvd_err(ctx, -ENOMEM, "fake: too many MRs");
	m->nic = nic;
	m->iova = (uint64_t)(uintptr_t)addr;
	m->len = len;
	/* ibv_reg_mr pins the pages; an on-demand MR pins nothing */
	m->on_demand = !!(flags & KVD_REG_ON_DEMAND);
	m->pins = !m->on_demand;
	m->key = fw.next_key++;
	out->handle = m;
	out->lkey = m->key;
	out->rkey = m->key ^ 0x80000000u;
	return 0;
}

static int fake_dereg(struct kvdmabuf_ctx *ctx, unsigned int nic,
		      struct kvd_mr *mr)
{
	struct fake_mr *m = mr->handle;

	if (!m || !m->used || m->nic != nic)
		return kvd_err(ctx, -EINVAL, "fake: bad MR");
	if (m->proxy >= 0) {
		if (m->pins)
			fw.px[m->proxy].pinned--;
		else
			fw.px[m->proxy].dynamic--;
		if (m->pins == 2)
			fw.px[m->proxy].revocable--;
	}
	if (m->ref_fd >= 0)
		close(m->ref_fd);
	m->used = 0;
	memset(mr, 0, sizeof(*mr));
	return 0;
}

static int fake_prefetch(struct kvdmabuf_ctx *ctx, unsigned int nic,
			 struct kvd_mr *mr)
{
	struct fake_mr *m = mr->handle;

	(void)ctx;
	if (!m || !m->used || m->nic != nic)
		return -EINVAL;
	if (!fw.nic_prefetch[nic])
		return -EOPNOTSUPP;
	m->prefetched++;
	if (m->proxy >= 0) {
		m->prefetch_gen = fw.px[m->proxy].gen;
		m->prefetch_state = fw.px[m->proxy].state;
	}
	m->prefetch_io_rc = fw.io_probe ? kvdmabuf_io_begin(fw.io_probe) : 0;
	if (fw.io_probe && !m->prefetch_io_rc)
		kvdmabuf_io_end(fw.io_probe);
	return 0;
}

static int fake_proxy_open(struct kvdmabuf_ctx *ctx, int *devfd)
{
	if (!fw.module)
		return kvd_err(ctx, -ENOENT, "fake module not loaded");
	*devfd = memfd_create("fake-kvdmabuf-dev", MFD_CLOEXEC);
	return *devfd < 0 ? -errno : 0;
}

static int fake_proxy_create(struct kvdmabuf_ctx *ctx, uint64_t size,
			     int *fd, uint64_t *id)
{
	int i;

	for (i = 0; i < FAKE_MAX_PROXY; i++)
		if (!fw.px[i].used)
			break;
	if (i == FAKE_MAX_PROXY)
		return kvd_err(ctx, -ENOSPC, "fake: too many proxies");
	memset(&fw.px[i], 0, sizeof(fw.px[i]));
	fw.px[i].fd = memfd_create("fake-proxy", MFD_CLOEXEC);
	if (fw.px[i].fd < 0)
		return -errno;
	{
		struct stat st;

		fstat(fw.px[i].fd, &st);
		fw.px[i].ino = st.st_ino;
	}
	fw.px[i].used = 1;
	fw.px[i].backing = -1;
	fw.px[i].size = size;
	*fd = fw.px[i].fd;
	*id = (uint64_t)i + 1;
	return 0;
}

/* The layout of a RANGES call goes (attach, revoke, the proxy's end). */
static inline void fake_pieces_drop(struct fake_proxy *x)
{
	unsigned int i;

	for (i = 0; i < x->nr_pieces; i++)
		if (x->piece[i].fd >= 0)
			close(x->piece[i].fd);
	x->nr_pieces = 0;
}

/* A proxy whose fd was closed by the library is gone (dma-buf released). */
static inline void fake_proxy_gc(void)
{
	struct stat st;
	int i;

	for (i = 0; i < FAKE_MAX_PROXY; i++)
		if (fw.px[i].used && (fstat(fw.px[i].fd, &st) ||
				      st.st_ino != fw.px[i].ino)) {
			if (fw.px[i].backing >= 0)
				close(fw.px[i].backing);
			fake_pieces_drop(&fw.px[i]);
			fw.px[i].used = 0;
		}
}

static int fake_proxy_attach(struct kvdmabuf_ctx *ctx, int pfd, int bfd,
			     uint64_t off, unsigned int flags)
{
	int p = fake_find_proxy(pfd);

	(void)off;
	if (p < 0)
		return kvd_err(ctx, -EINVAL, "fake: not a proxy");
	if (fake_find_proxy(bfd) >= 0)
		return kvd_err(ctx, -ELOOP, "fake: backing is a proxy");
	if (fw.px[p].state == KVD_PROXY_BACKED && !(flags & KVD_ATTACH_REPLACE))
		return kvd_err(ctx, -EEXIST, "fake: proxy already backed");
	if (fw.px[p].backing >= 0)
		close(fw.px[p].backing);
	fake_pieces_drop(&fw.px[p]);
	fw.px[p].backing = fcntl(bfd, F_DUPFD_CLOEXEC, 0);
	if (fw.px[p].backing < 0)
		return kvd_err(ctx, -EBADF, "fake: bad backing fd");
	fw.px[p].state = KVD_PROXY_BACKED;
	fw.px[p].revoke_reason = KVD_REVOKE_NONE;
	fw.px[p].gen++;
	return 0;
}

static int fake_proxy_revoke(struct kvdmabuf_ctx *ctx, int pfd,
			     unsigned int timeout_ms)
{
	int p = fake_find_proxy(pfd);

	if (p < 0)
		return kvd_err(ctx, -EINVAL, "fake: not a proxy");
	/* As the module (API 2.2): revocable pins do not block a revoke. */
	if (fw.px[p].pinned - fw.px[p].revocable)
		return kvd_err(ctx, -EBUSY, "fake: importer pins the proxy");
	if (fw.px[p].unmap_ms) {
		unsigned int ms = fw.px[p].unmap_ms < timeout_ms ?
				  fw.px[p].unmap_ms : timeout_ms;
		struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

		nanosleep(&ts, NULL);
	}
	if (fw.px[p].backing >= 0)
		close(fw.px[p].backing);
	fw.px[p].backing = -1;
	fake_pieces_drop(&fw.px[p]);
	if (fw.px[p].state == KVD_PROXY_BACKED) {
		fw.px[p].state = KVD_PROXY_REVOKED;
		fw.px[p].gen++;
		fw.px[p].notifications++;
	}
	if (fw.px[p].unmap_ms > timeout_ms)
		return kvd_err(ctx, -ETIMEDOUT, "fake: an importer still maps "
			       "the old backing after %u ms", timeout_ms);
	return 0;
}

static int fake_proxy_query(struct kvdmabuf_ctx *ctx, int pfd,
			    struct kvd_proxy_info *info)
{
	int p = fake_find_proxy(pfd);

	if (p < 0)
		return kvd_err(ctx, -EINVAL, "fake: not a proxy");
	memset(info, 0, sizeof(*info));
	info->state = (uint32_t)fw.px[p].state;
	info->generation = fw.px[p].gen;
	info->nr_dynamic = fw.px[p].dynamic;
	info->nr_pinned = fw.px[p].pinned;
	info->nr_blocking_pins = fw.px[p].pinned - fw.px[p].revocable;
	info->nr_revocable_pins = fw.px[p].revocable;
	info->revoke_reason = fw.px[p].revoke_reason;
	return 0;
}

static int fake_proxy_label(struct kvdmabuf_ctx *ctx, int pfd,
			    const char *label)
{
	int p = fake_find_proxy(pfd);

	(void)ctx;
	if (p < 0)
		return -EINVAL;
	snprintf(fw.px[p].label, sizeof(fw.px[p].label), "%s", label);
	return 0;
}

/* [s, s + l) of the layout @x cut out (pieces split, fds dup'ed). */
static inline int fake_pieces_cut(struct fake_proxy *x, uint64_t s,
				  uint64_t l)
{
	struct fake_piece out[FAKE_MAX_PIECES];
	unsigned int i, n = 0;

	for (i = 0; i < x->nr_pieces; i++) {
		struct fake_piece c = x->piece[i];

		if (c.start + c.len <= s || c.start >= s + l) {
			out[n++] = c;
			continue;
		}
		if (n + 2 > FAKE_MAX_PIECES)
			return -E2BIG;
		if (c.start < s)
			out[n++] = (struct fake_piece){ c.start, s - c.start,
				c.fd < 0 ? -1 : fcntl(c.fd, F_DUPFD_CLOEXEC, 0) };
		if (c.start + c.len > s + l)
			out[n++] = (struct fake_piece){ s + l,
				c.start + c.len - s - l,
				c.fd < 0 ? -1 : fcntl(c.fd, F_DUPFD_CLOEXEC, 0) };
		if (c.fd >= 0)
			close(c.fd);
	}
	memcpy(x->piece, out, n * sizeof(out[0]));
	x->nr_pieces = n;
	return 0;
}

/*
 * As the module's RANGES: the proxy's backing becomes a layout of pieces
 * (the named ones changed, the rest kept), in one step, one notification;
 * a blocking pin refuses it (-EBUSY), so does a range out of the proxy.
 */
static int fake_proxy_ranges(struct kvdmabuf_ctx *ctx, int pfd,
			     const struct kvd_range *r, unsigned int n)
{
	int p = fake_find_proxy(pfd);
	struct fake_proxy *x;
	unsigned int i, j;
	int rc = 0;

	if (p < 0)
		return kvd_err(ctx, -EINVAL, "fake: not a proxy");
	x = &fw.px[p];
	for (i = 0; i < n; i++)
		if (!r[i].len || r[i].start + r[i].len > x->size)
			return kvd_err(ctx, -EINVAL, "fake: range %u out of "
				       "the proxy", i);
	if (x->pinned - x->revocable)
		return kvd_err(ctx, -EBUSY, "fake: importer pins the proxy");
	if (x->backing >= 0) {          /* whole: one piece now */
		x->piece[0] = (struct fake_piece){ 0, x->size, x->backing };
		x->nr_pieces = 1;
		x->backing = -1;
	} else if (x->state != KVD_PROXY_BACKED) {
		x->piece[0] = (struct fake_piece){ 0, x->size, -1 };
		x->nr_pieces = 1;
	}
	for (i = 0; i < n && !rc; i++)
		rc = fake_pieces_cut(x, r[i].start, r[i].len);
	for (i = 0; i < n && !rc; i++) {
		if (x->nr_pieces == FAKE_MAX_PIECES) {
			rc = -E2BIG;
			break;
		}
		for (j = x->nr_pieces; j > 0 &&
		     x->piece[j - 1].start > r[i].start; j--)
			x->piece[j] = x->piece[j - 1];
		x->piece[j] = (struct fake_piece){ r[i].start, r[i].len,
			r[i].fd < 0 ? -1 : fcntl(r[i].fd, F_DUPFD_CLOEXEC, 0) };
		x->nr_pieces++;
	}
	if (rc)
		return kvd_err(ctx, rc, "fake: too many pieces");
	x->state = KVD_PROXY_BACKED;
	x->gen++;
	x->notifications++;
	x->ranges_calls++;
	return 0;
}

/* The piece of proxy @p holding byte @at, or NULL. */
static inline const struct fake_piece *fake_piece_at(int p, uint64_t at)
{
	unsigned int i;

	for (i = 0; i < fw.px[p].nr_pieces; i++)
		if (fw.px[p].piece[i].start <= at &&
		    at < fw.px[p].piece[i].start + fw.px[p].piece[i].len)
			return &fw.px[p].piece[i];
	return NULL;
}

static const struct kvd_ops fake_ops = {
	.nics_open = fake_nics_open,
	.nics_close = fake_nics_close,
	.nic_add = fake_nic_add,
	.nic_remove = fake_nic_remove,
	.export_dmabuf = fake_export,
	.reg_dmabuf = fake_reg_dmabuf,
	.reg_addr = fake_reg_addr,
	.dereg = fake_dereg,
	.prefetch = fake_prefetch,
	.proxy_open = fake_proxy_open,
	.proxy_create = fake_proxy_create,
	.proxy_attach = fake_proxy_attach,
	.proxy_revoke = fake_proxy_revoke,
	.proxy_query = fake_proxy_query,
	.proxy_label = fake_proxy_label,
	.proxy_ranges = fake_proxy_ranges,
};

/* ---- injector: fail the n-th call of one operation ---- */

static inline int inj(struct kvdmabuf_ctx *ctx, enum fake_op op)
{
	if (++fw.calls[op] != fw.fail_at[op])
		return 0;
	fw.injected++;
	return kvd_err(ctx, fw.fail_rc, "injected failure of %s call %lu",
		       fake_op_name[op], fw.calls[op]);
}

static int inj_export(struct kvdmabuf_ctx *c, struct kvdmabuf_region *r,
		      int *fd, uint64_t *off)
{
	return inj(c, OP_EXPORT) ?: fw.inner->export_dmabuf(c, r, fd, off);
}

static int inj_reg_dmabuf(struct kvdmabuf_ctx *c, unsigned int nic, int fd,
			  uint64_t off, size_t len, uint64_t iova,
			  struct kvd_mr *mr)
{
	return inj(c, OP_REG) ?:
	       fw.inner->reg_dmabuf(c, nic, fd, off, len, iova, mr);
}

static int inj_reg_addr(struct kvdmabuf_ctx *c, unsigned int nic, void *a,
			size_t len, unsigned int flags, struct kvd_mr *mr)
{
	return inj(c, OP_REG) ?:
	       fw.inner->reg_addr(c, nic, a, len, flags, mr);
}

static int inj_dereg(struct kvdmabuf_ctx *c, unsigned int nic,
		     struct kvd_mr *mr)
{
	return inj(c, OP_DEREG) ?: fw.inner->dereg(c, nic, mr);
}

static int inj_create(struct kvdmabuf_ctx *c, uint64_t size, int *fd,
		      uint64_t *id)
{
	return inj(c, OP_CREATE) ?: fw.inner->proxy_create(c, size, fd, id);
}

static int inj_attach(struct kvdmabuf_ctx *c, int p, int b, uint64_t off,
		      unsigned int flags)
{
	return inj(c, OP_ATTACH) ?: fw.inner->proxy_attach(c, p, b, off, flags);
}

static int inj_revoke(struct kvdmabuf_ctx *c, int p, unsigned int t)
{
	int rc;

	if (!fw.revoke_late)
		return inj(c, OP_REVOKE) ?: fw.inner->proxy_revoke(c, p, t);
	rc = fw.inner->proxy_revoke(c, p, t);
	return inj(c, OP_REVOKE) ?: rc;
}

static int inj_query(struct kvdmabuf_ctx *c, int p, struct kvd_proxy_info *i)
{
	return inj(c, OP_QUERY) ?: fw.inner->proxy_query(c, p, i);
}

static int inj_label(struct kvdmabuf_ctx *c, int p, const char *label)
{
	return fw.inner->proxy_label ? fw.inner->proxy_label(c, p, label) :
	       -EOPNOTSUPP;
}

static int inj_nics_open(struct kvdmabuf_ctx *c,
			 const struct kvdmabuf_options *o)
{
	return fw.inner->nics_open(c, o);
}

static void inj_nics_close(struct kvdmabuf_ctx *c)
{
	fw.inner->nics_close(c);
}

static int inj_nic_add(struct kvdmabuf_ctx *c, struct ibv_pd *pd)
{
	return fw.inner->nic_add(c, pd);
}

static void inj_nic_remove(struct kvdmabuf_ctx *c, unsigned int i)
{
	fw.inner->nic_remove(c, i);
}

static int inj_proxy_open(struct kvdmabuf_ctx *c, int *fd)
{
	return fw.inner->proxy_open(c, fd);
}

static int inj_ranges(struct kvdmabuf_ctx *c, int p, const struct kvd_range *r,
		      unsigned int n)
{
	if (!fw.inner->proxy_ranges)
		return kvd_err(c, -EOPNOTSUPP, "no ranges");
	return fw.inner->proxy_ranges(c, p, r, n);
}

static int inj_prefetch(struct kvdmabuf_ctx *c, unsigned int nic,
			struct kvd_mr *mr)
{
	return fw.inner->prefetch ? fw.inner->prefetch(c, nic, mr) :
	       -EOPNOTSUPP;
}

static const struct kvd_ops inj_ops = {
	.nics_open = inj_nics_open,
	.nics_close = inj_nics_close,
	.nic_add = inj_nic_add,
	.nic_remove = inj_nic_remove,
	.export_dmabuf = inj_export,
	.reg_dmabuf = inj_reg_dmabuf,
	.reg_addr = inj_reg_addr,
	.dereg = inj_dereg,
	.prefetch = inj_prefetch,
	.proxy_open = inj_proxy_open,
	.proxy_create = inj_create,
	.proxy_attach = inj_attach,
	.proxy_revoke = inj_revoke,
	.proxy_query = inj_query,
	.proxy_label = inj_label,
	.proxy_ranges = inj_ranges,
};

/* Reset the call counters; fail the @n-th call of @op from now on. */
static inline void inj_arm(enum fake_op op, unsigned long n, int rc)
{
	memset(fw.calls, 0, sizeof(fw.calls));
	memset(fw.fail_at, 0, sizeof(fw.fail_at));
	fw.fail_at[op] = n;
	fw.fail_rc = rc;
	fw.injected = 0;
}

static inline void inj_disarm(void)
{
	memset(fw.fail_at, 0, sizeof(fw.fail_at));
	fw.revoke_late = 0;
}

/* ---- observations ---- */

/* Open fds of this process whose link contains @what ("fake-backing"). */
static inline int fds_named(const char *what)
{
	char link[PATH_MAX];
	struct dirent *de;
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	ssize_t l;

	if (!d)
		return -1;
	while ((de = readdir(d))) {
		l = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
		if (l <= 0)
			continue;
		link[l] = '\0';
		if (strstr(link, what))
			n++;
	}
	closedir(d);
	return n;
}

static inline int fds_open(void)
{
	return fds_named("");
}

/* Number of live MRs covering exactly [iova, iova+len) on @nic. */
static inline int fake_mrs_at(unsigned int nic, const void *addr, size_t len)
{
	int i, n = 0;

	for (i = 0; i < FAKE_MAX_MR; i++)
		if (fw.mr[i].used && fw.mr[i].nic == nic &&
		    fw.mr[i].iova == (uint64_t)(uintptr_t)addr &&
		    fw.mr[i].len == len)
			n++;
	return n;
}

static inline int fake_mrs_live(void)
{
	int i, n = 0;

	for (i = 0; i < FAKE_MAX_MR; i++)
		n += fw.mr[i].used;
	return n;
}

/* Write a config file and return its path (static buffer). */
static inline const char *write_config(const char *text)
{
	static char path[64];
	int fd;

	snprintf(path, sizeof(path), "/tmp/kvdmabuf-test-%d.yaml", getpid());
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return NULL;
	if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
		close(fd);
		return NULL;
	}
	close(fd);
	return path;
}

/* Page-aligned anonymous memory standing in for a KV region. */
static inline void *region_mem(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/* What an engine does at sleep + wake: new memory at the same address. */
static inline int remap_fresh(void *addr, size_t len)
{
	void *p = mmap(addr, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);

	return p == addr ? 0 : -1;
}

/*
 * Open a context on the fakes (through the injector) with *@o as it is:
 * its configuration given as a file, as text (config_yaml) or not at all.
 */
static inline int fake_open_options(struct kvdmabuf_options *o,
				    struct kvdmabuf_ctx **ctx, char *err,
				    size_t len)
{
	if (!fw.inner)
		fw.inner = &fake_ops;
	return kvd_open_ops(o, &inj_ops, NULL, ctx, err, len);
}

/* The same with the configuration @yaml written to a file. */
static inline int fake_open(const char *yaml, struct kvdmabuf_options *o,
			    struct kvdmabuf_ctx **ctx, char *err, size_t len)
{
	struct kvdmabuf_options def;
	const char *path = write_config(yaml);
	int rc;

	if (!path)
		return -EIO;
	if (!o) {
		memset(&def, 0, sizeof(def));
		o = &def;
	}
	o->config_path = path;
	rc = fake_open_options(o, ctx, err, len);
	unlink(path);
	return rc;
}

#endif /* KVDMABUF_TESTS_LIB_FAKE_H */
