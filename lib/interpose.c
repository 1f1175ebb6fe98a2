// SPDX-License-Identifier: MIT
/*
 * interpose.c - the top of the preload's path: what libkvdmabuf-preload.so
 * calls when the engine itself unmaps a region's memory (its cuMemUnmap:
 * that region sleeps, alone, as in kvdmabuf_sleep()) or maps new memory
 * there (its cuMemSetAccess: the region wakes on it). The context's
 * engine_ops point here (set at open); preload_link.c hands them to the
 * preload with each region it declares, and the preload holds the region
 * while one of them runs, so that it is not freed meanwhile (see
 * kvd_preload_undeclare()). Called without ctx->lock.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kvdmabuf_preload.h"

/* 0 with ctx locked when @r may change now; else the error, unlocked. */
static int engine_enter(struct kvdmabuf_region *r, const char *what)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	int rc;

	rc = kvd_not_forked(ctx, what);
	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->lock);
	rc = kvd_may_change(ctx, what);
	if (!rc && r->broken)
		rc = kvd_err(ctx, -EIO, "%s: region %p+%zu is broken (%s)",
			     what, r->addr, r->len, strerror(-r->broken));
	if (rc)
		pthread_mutex_unlock(&ctx->lock);
	return rc;
}

/* The preload's message: this thread's, copied while still about @r. */
static int engine_result(struct kvdmabuf_region *r, int rc, char *err,
			 size_t err_len)
{
	if (rc && err && err_len)
		snprintf(err, err_len, "%s", kvd_msg(r->ctx));
	return rc;
}

static int engine_sleep(void *arg, void *addr, size_t len, char *err,
			size_t err_len)
{
	struct kvdmabuf_region *r = arg;
	int rc;

	(void)addr;
	(void)len;
	rc = engine_enter(r, "sleep (the engine's cuMemUnmap)");
	if (!rc) {
		rc = kvd_sleep_region(r);
		pthread_mutex_unlock(&r->ctx->lock);
	}
	return engine_result(r, rc, err, err_len);
}

static int engine_wake(void *arg, void *addr, size_t len, int dmabuf_fd,
		       char *err, size_t err_len)
{
	const char *what = "wake (the engine's cuMemSetAccess)";
	struct kvdmabuf_region *r = arg;
	int rc;

	(void)addr;
	(void)len;
	rc = engine_enter(r, what);
	if (!rc) {
		rc = kvd_wake_region(r, dmabuf_fd, what);
		pthread_mutex_unlock(&r->ctx->lock);
	}
	return engine_result(r, rc, err, err_len);
}

/*
 * Part of the region unmapped (@restore 0) or mapped again (1) by the
 * engine while it is awake: kvdmabuf_region_ranges() of those parts,
 * released or exported by the library. -EOPNOTSUPP (a NIC that pins, no
 * module with ranges) tells the preload to sleep the whole region.
 */
int kvd_engine_ranges(void *arg, void *addr,
		      const struct kvdmabuf_preload_range *ranges,
		      unsigned int n, int restore, char *err, size_t err_len)
{
	const char *what = restore ? "ranges (the engine's cuMemSetAccess)" :
				     "ranges (the engine's cuMemUnmap)";
	struct kvdmabuf_region_range *c;
	struct kvdmabuf_region *r = arg;
	unsigned int i;
	int rc;

	(void)addr;
	c = calloc(n ? n : 1, sizeof(*c));
	if (!c)
		return engine_result(r, kvd_err(r->ctx, -ENOMEM, "%s: out of "
						 "memory", what), err, err_len);
	for (i = 0; i < n; i++) {
		c[i].offset = ranges[i].offset;
		c[i].len = ranges[i].len;
		c[i].fd = restore ? KVDMABUF_RANGE_EXPORT :
				    KVDMABUF_RANGE_RELEASE;
	}
	rc = engine_enter(r, what);
	if (!rc) {
		rc = kvd_region_ranges(r, c, n);
		pthread_mutex_unlock(&r->ctx->lock);
	}
	free(c);
	return engine_result(r, rc, err, err_len);
}

const struct kvdmabuf_preload_proxy_ops kvd_engine_ops = {
	.revoke = engine_sleep,
	.replace = engine_wake,
};
