// SPDX-License-Identifier: MIT
/*
 * preload_link.c - the calls into libkvdmabuf-preload.so, when an engine
 * runs under it: the library's own registrations are marked as such (the
 * library carries them through sleep itself), and a sleep asks the
 * preload first whether the engine registered any of the memory in a way
 * that cannot follow (refused by name, nothing released). Each region
 * with a proxy is declared to the preload, with the proxy and the
 * context's engine operations (interpose.c: what the preload's CUDA
 * interposer calls when the engine itself unmaps or maps the memory
 * again), and undeclared before it is freed. Found at run time with
 * dlvsym(), by the preload's symbol versions: without the preload all of
 * it is a no-op. Calls nothing of
 * the library but msg.c, so verbs, regions and sleep all reach it down.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "kvdmabuf_preload.h"

static struct {
	pthread_once_t once;
	void (*own)(int on);
	int (*check)(const void *addr, size_t len, char *reason, size_t n);
	int (*declare)(void *addr, size_t len, const char *tag, int proxy_fd,
		       uint64_t proxy_offset);
	int (*undeclare)(void *addr);
	int (*set_ops)(void *addr,
		       const struct kvdmabuf_preload_proxy_ops *ops);
	/* preload 0.2 on: parts of an elastic pool (absent: whole sleeps) */
	int (*set_ranges)(void *addr, kvdmabuf_preload_ranges_fn *ranges,
			  unsigned int flags);
} preload = { .once = PTHREAD_ONCE_INIT };

/*
 * By symbol version (the preload's version script): an object that merely
 * defines these names (another interposer, an older or newer preload with
 * another contract) is not taken for the preload. 0.2 added the ranges.
 */
#define PRELOAD_V1 "KVDMABUF_PRELOAD_0.1"
#define PRELOAD_V2 "KVDMABUF_PRELOAD_0.2"

static void preload_find(void)
{
	*(void **)&preload.own = dlvsym(RTLD_DEFAULT, "kvdmabuf_preload_own",
					PRELOAD_V1);
	*(void **)&preload.check = dlvsym(RTLD_DEFAULT,
					  "kvdmabuf_preload_check", PRELOAD_V1);
	*(void **)&preload.declare = dlvsym(RTLD_DEFAULT,
					    "kvdmabuf_preload_declare",
					    PRELOAD_V1);
	*(void **)&preload.undeclare = dlvsym(RTLD_DEFAULT,
					      "kvdmabuf_preload_undeclare",
					      PRELOAD_V1);
	*(void **)&preload.set_ops = dlvsym(RTLD_DEFAULT,
					    "kvdmabuf_preload_set_proxy_ops",
					    PRELOAD_V1);
	*(void **)&preload.set_ranges = dlvsym(RTLD_DEFAULT,
					       "kvdmabuf_preload_set_ranges_op",
					       PRELOAD_V2);
}

bool kvd_preload_present(void)
{
	pthread_once(&preload.once, preload_find);
	return preload.declare && preload.undeclare && preload.set_ops &&
	       preload.check && preload.own;
}

void kvd_preload_own(int on)
{
	pthread_once(&preload.once, preload_find);
	if (preload.own)
		preload.own(on);
}

int kvd_preload_check(struct kvdmabuf_region *r)
{
	char reason[KVD_ERRMAX - 128];
	int rc;

	pthread_once(&preload.once, preload_find);
	if (!preload.check)
		return 0;
	rc = preload.check(r->addr, r->len, reason, sizeof(reason));
	if (!rc)
		return 0;
	return kvd_err(r->ctx, rc, "sleep: region %p+%zu (tag '%s'): %s",
		       r->addr, r->len, r->tag, reason);
}

int kvd_preload_declare(struct kvdmabuf_region *r)
{
	struct kvdmabuf_preload_proxy_ops ops;
	int rc;

	pthread_once(&preload.once, preload_find);
	if (r->proxy_fd < 0 || !r->ctx->engine_ops || !preload.declare ||
	    !preload.undeclare || !preload.set_ops)
		return 0;
	ops = *r->ctx->engine_ops;
	ops.arg = r;
	rc = preload.declare(r->addr, r->len, r->tag[0] ? r->tag : NULL,
			     r->proxy_fd, 0);
	if (rc)
		return kvd_err(r->ctx, rc, "libkvdmabuf-preload.so refused "
			       "the region: %s (it overlaps a KV region "
			       "declared otherwise: %s, or an engine hook?)",
			       strerror(-rc), KVDMABUF_PRELOAD_REGIONS_ENV);
	rc = preload.set_ops(r->addr, &ops);
	if (!rc && preload.set_ranges)
		rc = preload.set_ranges(r->addr, r->ctx->engine_ranges,
					r->flags & KVDMABUF_REGION_EMPTY ?
					KVDMABUF_PRELOAD_RANGES_EMPTY : 0);
	if (rc) {
		preload.undeclare(r->addr);
		return kvd_err(r->ctx, rc, "libkvdmabuf-preload.so refused "
			       "the region's proxy operations: %s",
			       strerror(-rc));
	}
	r->preload_declared = true;
	return 0;
}

int kvd_preload_undeclare(struct kvdmabuf_region *r)
{
	int rc;

	if (!r->preload_declared)
		return 0;
	rc = preload.undeclare(r->addr);
	if (rc == -EBUSY)
		return kvd_err(r->ctx, rc, "region %p+%zu (tag '%s'): the "
			       "engine's cuMemUnmap or cuMemSetAccess of it is "
			       "being handled by libkvdmabuf-preload.so right "
			       "now: try again", r->addr, r->len, r->tag);
	if (rc == -ENOTEMPTY)
		return kvd_err(r->ctx, -EBUSY, "region %p+%zu (tag '%s'): the "
			       "engine has an MR on its proxy (kvdmabuf status "
			       "lists it): the engine deregisters it first, "
			       "else peers would go on reaching this memory "
			       "through it", r->addr, r->len, r->tag);
	/* -ENOENT: undeclared by someone else already */
	r->preload_declared = false;
	return 0;
}
