// SPDX-License-Identifier: MIT
/*
 * ranges.c - kvdmabuf_region_ranges(): pages of an elastic KV pool given
 * back and brought in while the region stays registered (issue 38). The
 * module's RANGES changes them behind the region's proxy in one step; a
 * NIC that follows moves keeps its keys.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Change @i checked against region @r; its fd for the module in *@out. */
static int range_check(struct kvdmabuf_region *r, unsigned int i,
		       const struct kvdmabuf_region_range *c,
		       struct kvd_range *out)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	if (c->reserved[0] || c->reserved[1])
		return kvd_err(r->ctx, -EINVAL, "range %u: reserved fields "
			       "must be zero", i);
	if (!c->len || c->offset % page || c->len % page ||
	    c->fd_offset % page)
		return kvd_err(r->ctx, -EINVAL, "range %u (offset %zu, length "
			       "%zu, fd offset %llu): not page aligned or "
			       "empty", i, c->offset, c->len,
			       (unsigned long long)c->fd_offset);
	if (c->offset > r->len || c->len > r->len - c->offset)
		return kvd_err(r->ctx, -EINVAL, "range %u (offset %zu, length "
			       "%zu) is not within the region (%zu bytes)", i,
			       c->offset, c->len, r->len);
	if (c->fd < KVDMABUF_RANGE_EXPORT)
		return kvd_err(r->ctx, -EINVAL, "range %u: fd %d", i, c->fd);
	if (c->fd == KVDMABUF_RANGE_EXPORT && r->mem != KVDMABUF_MEM_CUDA)
		return kvd_err(r->ctx, -EINVAL, "range %u: the library exports "
			       "only CUDA memory (pass the dma-buf of the new "
			       "memory)", i);
	out->start = c->offset;
	out->len = c->len;
	out->fd = c->fd == KVDMABUF_RANGE_RELEASE ? -1 : c->fd;
	out->offset = c->fd_offset;
	return 0;
}

/* May @r's ranges change now (context locked)? */
static int region_check(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;

	if (r->broken)
		return kvd_err(ctx, -EIO, "region %p is broken (%d): remove "
			       "it and add it again", r->addr, r->broken);
	if (r->proxy_fd < 0)
		return kvd_err(ctx, -ENOENT, "region %p has no proxy (host "
			       "memory, protocol tcp, or the module not in "
			       "use): its ranges cannot change", r->addr);
	if (r->mode != KVDMABUF_MODE_FOLLOW)
		return kvd_err(ctx, -EOPNOTSUPP, "region %p is in %s mode: a "
			       "NIC of it pins, and a pinned registration "
			       "cannot follow a range change (sleep and wake "
			       "the region instead)", r->addr,
			       kvdmabuf_mode_name(r->mode));
	if (r->asleep)
		return kvd_err(ctx, -EBUSY, "region %p is asleep: wake it "
			       "before changing its ranges", r->addr);
	if (!ctx->ops->proxy_ranges)
		return kvd_err(ctx, -EOPNOTSUPP, "this proxy backend has no "
			       "ranges");
	return 0;
}

/* The batch for the module: the caller's changes, with the library's
 * exports (@own: closed after the call) split one allocation each. */
struct batch {
	struct kvd_range *k;
	bool *own;
	unsigned int n, cap;
};

static int batch_add(struct kvdmabuf_ctx *ctx, struct batch *b,
		     uint64_t start, uint64_t len, int fd, uint64_t off,
		     bool own)
{
	unsigned int cap = b->cap ? 2 * b->cap : 16;
	struct kvd_range *k;
	bool *o;

	if (b->n == b->cap) {
		k = realloc(b->k, cap * sizeof(*k));
		if (k)
			b->k = k;
		o = k ? realloc(b->own, cap * sizeof(*o)) : NULL;
		if (!o)
			return kvd_err(ctx, -ENOMEM, "ranges: out of memory");
		b->own = o;
		b->cap = cap;
	}
	b->k[b->n] = (struct kvd_range){ .start = start, .len = len,
					 .fd = fd, .offset = off };
	b->own[b->n++] = own;
	return 0;
}

static void batch_free(struct batch *b)
{
	unsigned int i;

	for (i = 0; i < b->n; i++)
		if (b->own[i])
			close(b->k[i].fd);
	free(b->k);
	free(b->own);
}

/*
 * [start, start+len) of CUDA region @r exported one allocation at a time:
 * a dma-buf of several allocations holds every one of them until it goes,
 * so a page given back later would stay held by its neighbours' export.
 */
static int batch_export(struct kvdmabuf_region *r, struct batch *b,
			uint64_t start, uint64_t len, const char *what)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	size_t piece;
	int fd, rc;

	while (len) {
		fd = -1;
		rc = kvd_cuda_piece(ctx, (char *)r->addr + start, len, &piece);
		if (!rc)
			rc = kvd_cuda_export(ctx, (char *)r->addr + start,
					     piece, &fd);
		if (!rc)
			rc = batch_add(ctx, b, start, piece, fd, 0, true);
		if (rc) {
			if (fd >= 0)
				close(fd);
			return kvd_err_prefix(ctx, rc, "%s: export of offset "
					      "%llu", what,
					      (unsigned long long)start);
		}
		start += piece;
		len -= piece;
	}
	return 0;
}

static int by_offset(const void *a, const void *b)
{
	const struct kvd_range *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

/*
 * The first change of a CUDA region still backed by its whole export: the
 * parts no change names are exported again, an allocation each, so that
 * the whole export (which holds every page, the ones given back too) is
 * no longer in the proxy once the call returns.
 */
static int batch_rest(struct kvdmabuf_region *r, struct batch *b)
{
	unsigned int i, n = b->n;
	struct kvd_range *named;
	uint64_t at = 0;
	int rc = 0;

	named = malloc(n * sizeof(*named));
	if (!named)
		return kvd_err(r->ctx, -ENOMEM, "ranges: out of memory");
	memcpy(named, b->k, n * sizeof(*named));
	qsort(named, n, sizeof(*named), by_offset);
	for (i = 0; i <= n && !rc; i++) {
		uint64_t next = i < n ? named[i].start : r->len;

		if (next > at)
			rc = batch_export(r, b, at, next - at,
					  "the rest of the region");
		if (i < n && named[i].start + named[i].len > at)
			at = named[i].start + named[i].len;
	}
	free(named);
	return rc;
}

static int apply(struct kvdmabuf_region *r,
		 const struct kvdmabuf_region_range *ranges, unsigned int n)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	struct batch b = { 0 };
	struct kvd_range *named;
	char what[32];
	unsigned int i;
	int rc = 0;

	named = calloc(n, sizeof(*named));
	if (!named)
		return kvd_err(ctx, -ENOMEM, "ranges: out of memory");
	for (i = 0; i < n && !rc; i++)
		rc = range_check(r, i, &ranges[i], &named[i]);
	/* the transfers on those pages end first; new ones wait */
	if (!rc)
		rc = kvd_range_io_drain(r, named, n, ctx->drain_timeout_ms);
	if (rc) {
		free(named);
		return rc;
	}
	for (i = 0; i < n && !rc; i++) {
		snprintf(what, sizeof(what), "range %u", i);
		if (ranges[i].fd == KVDMABUF_RANGE_EXPORT)
			rc = batch_export(r, &b, named[i].start, named[i].len,
					  what);
		else
			rc = batch_add(ctx, &b, named[i].start, named[i].len,
				       named[i].fd, named[i].offset, false);
	}
	if (!rc && r->mem == KVDMABUF_MEM_CUDA && r->backing_fd >= 0)
		rc = batch_rest(r, &b);
	if (!rc)
		rc = ctx->ops->proxy_ranges(ctx, r->proxy_fd, b.k, b.n);
	/*
	 * Changed (-ETIMEDOUT too): the module holds what it maps. The
	 * region's own export of its whole memory would keep released pages
	 * alive (a CUDA dma-buf holds its allocations), so it goes.
	 */
	if (!rc || rc == -ETIMEDOUT) {
		if (r->backing_fd >= 0)
			close(r->backing_fd);
		r->backing_fd = -1;
		r->backing_off = 0;
	}
	kvd_range_io_open(r, named, n);
	batch_free(&b);
	free(named);
	return rc;
}

int kvd_region_ranges(struct kvdmabuf_region *r,
		      const struct kvdmabuf_region_range *ranges,
		      unsigned int n)
{
	int rc = region_check(r);

	return rc ? rc : apply(r, ranges, n);
}

int kvdmabuf_region_ranges(struct kvdmabuf_region *r,
			   const struct kvdmabuf_region_range *ranges,
			   unsigned int n)
{
	struct kvdmabuf_ctx *ctx;
	int rc;

	if (!r)
		return -EINVAL;
	ctx = r->ctx;
	if (!ranges || !n)
		return kvd_err(ctx, -EINVAL, "ranges: no range given");
	rc = kvd_not_forked(ctx, "ranges");
	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->lock);
	rc = kvd_may_change(ctx, "ranges");
	if (!rc)
		rc = kvd_region_ranges(r, ranges, n);
	pthread_mutex_unlock(&ctx->lock);
	return rc;
}
