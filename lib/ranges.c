// SPDX-License-Identifier: MIT
/*
 * ranges.c - kvdmabuf_region_ranges(): pages of an elastic KV pool given
 * back and brought in while the region stays registered (issue 38). The
 * module's RANGES changes them behind the region's proxy in one step; a
 * NIC that follows moves keeps its keys.
 */
#include <errno.h>
#include <stdlib.h>
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

static int apply(struct kvdmabuf_region *r,
		 const struct kvdmabuf_region_range *ranges, unsigned int n,
		 struct kvd_range *k)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	unsigned int i;
	int rc = 0;

	for (i = 0; i < n && !rc; i++) {
		rc = range_check(r, i, &ranges[i], &k[i]);
		if (!rc && ranges[i].fd == KVDMABUF_RANGE_EXPORT) {
			rc = kvd_cuda_export(ctx, (char *)r->addr +
					     ranges[i].offset, ranges[i].len,
					     &k[i].fd);
			if (rc)
				kvd_err_prefix(ctx, rc, "range %u: export", i);
		}
	}
	if (!rc)
		rc = ctx->ops->proxy_ranges(ctx, r->proxy_fd, k, n);
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
	for (i = 0; i < n; i++)
		if (ranges[i].fd == KVDMABUF_RANGE_EXPORT && k[i].fd >= 0)
			close(k[i].fd);
	return rc;
}

int kvdmabuf_region_ranges(struct kvdmabuf_region *r,
			   const struct kvdmabuf_region_range *ranges,
			   unsigned int n)
{
	struct kvdmabuf_ctx *ctx;
	struct kvd_range *k;
	unsigned int i;
	int rc;

	if (!r)
		return -EINVAL;
	ctx = r->ctx;
	if (!ranges || !n)
		return kvd_err(ctx, -EINVAL, "ranges: no range given");
	rc = kvd_not_forked(ctx, "ranges");
	if (rc)
		return rc;
	k = calloc(n, sizeof(*k));
	if (!k)
		return kvd_err(ctx, -ENOMEM, "ranges: out of memory");
	for (i = 0; i < n; i++)
		k[i].fd = -1;
	pthread_mutex_lock(&ctx->lock);
	rc = kvd_may_change(ctx, "ranges");
	if (!rc)
		rc = region_check(r);
	if (!rc)
		rc = apply(r, ranges, n, k);
	pthread_mutex_unlock(&ctx->lock);
	free(k);
	return rc;
}
