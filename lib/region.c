// SPDX-License-Identifier: MIT
/*
 * region.c - regions: add (export, proxy, register, choose the mode),
 * remove, registration on every NIC, getters.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static bool region_cpu_visible(const struct kvdmabuf_region *r)
{
	return r->mem == KVDMABUF_MEM_HOST;
}

/* Register on NIC @i: on the proxy, else the backing, else by address. */
int kvd_region_reg_one(struct kvdmabuf_region *r, unsigned int i)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	const struct kvd_ops *ops = ctx->ops;
	struct kvd_mr *mr = &r->mr[i];
	int fd = r->proxy_fd >= 0 ? r->proxy_fd : r->backing_fd;
	uint64_t off = r->proxy_fd >= 0 ? 0 : r->backing_off;
	uint64_t max = ctx->nics[i].max_mr_size;
	int rc;

	/* One MR per region and NIC: a longer region is refused, by name,
	 * rather than left to the NIC's own error. */
	if (max && r->len > max)
		return kvd_err(ctx, -EFBIG, "%zu bytes are more than NIC %s "
			       "takes in one memory region (max_mr_size %llu "
			       "bytes): add it as several regions of at most "
			       "that length", r->len, ctx->nics[i].name,
			       (unsigned long long)max);
	if (fd < 0 && r->mode == KVDMABUF_MODE_ODP && !ctx->nics[i].odp)
		return kvd_err(ctx, -EOPNOTSUPP, "the region follows the "
			       "engine's mappings by on-demand paging (mode "
			       "odp) and NIC %s has none: add this NIC before "
			       "the region, or register the region on the "
			       "other NICs only (nics)", ctx->nics[i].name);
	if (fd < 0)
		return ops->reg_addr(ctx, i, r->addr, r->len,
				     r->mode == KVDMABUF_MODE_ODP ?
				     KVD_REG_ON_DEMAND : 0, mr);
	rc = ops->reg_dmabuf(ctx, i, fd, off, r->len,
			     (uint64_t)(uintptr_t)r->addr, mr);
	if (rc != -EOPNOTSUPP)
		return rc;
	if (!region_cpu_visible(r))
		return kvd_err_prefix(ctx, rc, "NIC %s has no dma-buf memory "
				      "regions and this device memory is not "
				      "CPU-visible", ctx->nics[i].name);
	return ops->reg_addr(ctx, i, r->addr, r->len, 0, mr);
}

/* An MR with no handle was never made or is gone already. */
int kvd_region_dereg_one(struct kvdmabuf_region *r, unsigned int i)
{
	int rc;

	if (!r->mr[i].handle)
		return 0;
	rc = r->ctx->ops->dereg(r->ctx, i, &r->mr[i]);
	if (!rc)
		memset(&r->mr[i], 0, sizeof(r->mr[i]));
	return rc;
}

/* Keys changed against @old (or first registration): new generation. */
static void keys_update(struct kvdmabuf_region *r, const struct kvd_mr *old)
{
	unsigned int i;
	bool changed = r->key_gen == 0;

	for (i = 0; i < r->ctx->nr_nics; i++)
		if (old[i].lkey != r->mr[i].lkey ||
		    old[i].rkey != r->mr[i].rkey)
			changed = true;
	if (changed) {
		r->key_gen++;
		r->keys_changed = r->key_gen > 1;
	}
}

/* All NICs or none. */
int kvd_region_reg_all(struct kvdmabuf_region *r)
{
	struct kvd_mr old[KVDMABUF_MAX_NICS];
	unsigned int i;
	int rc;

	memcpy(old, r->last, sizeof(old));
	for (i = 0; i < r->ctx->nr_nics; i++) {
		if (!kvd_on_nic(r, i))
			continue;
		rc = kvd_region_reg_one(r, i);
		if (rc) {
			/* an MR we cannot drop breaks the region */
			while (i--)
				if (kvd_region_dereg_one(r, i))
					kvd_region_break(r, rc);
			return rc;
		}
	}
	r->registered = true;
	keys_update(r, old);
	memcpy(r->last, r->mr, sizeof(r->last));
	return 0;
}

/*
 * All NICs or none: a failed deregistration registers the others again;
 * when that fails too, the region is broken (its remaining MRs are
 * released at remove).
 */
int kvd_region_dereg_all(struct kvdmabuf_region *r)
{
	struct kvd_mr old[KVDMABUF_MAX_NICS];
	unsigned int i, j;
	int rc, rc2;

	if (!r->registered)
		return 0;
	for (i = 0; i < r->ctx->nr_nics; i++) {
		rc = kvd_region_dereg_one(r, i);
		if (!rc)
			continue;
		memcpy(old, r->last, sizeof(old));
		for (j = 0; j < i; j++) {
			if (!kvd_on_nic(r, j))
				continue;
			rc2 = kvd_region_reg_one(r, j);
			if (rc2) {
				kvd_err_prefix(r->ctx, rc, "registering "
					       "NIC %s again after a failed "
					       "deregistration also failed "
					       "(region broken)",
					       r->ctx->nics[j].name);
				kvd_region_break(r, rc);
				return rc;
			}
		}
		keys_update(r, old);
		memcpy(r->last, r->mr, sizeof(r->last));
		return rc;
	}
	r->registered = false;
	return 0;
}

void kvd_region_break(struct kvdmabuf_region *r, int rc)
{
	r->broken = rc < 0 ? rc : -EIO;
	r->keys_changed = false;
	kvd_io_close(&r->io);
}

static void fd_close(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/*
 * Before a region of the context is freed (ctx locked, I/O stopped):
 * undeclare it to the preload (-EBUSY while the preload runs one of its
 * operations: kept as it was), then drop every MR it still has. One that
 * the NIC refuses to deregister stays, the region broken with that error
 * and still listed (and declared again), so that the engine sees it and a
 * later remove or close tries again; the others are gone.
 */
int kvd_region_release(struct kvdmabuf_region *r, const char *what)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	unsigned int i, failed = 0, first = 0;
	int rc, err = 0;

	rc = kvd_preload_undeclare(r);
	if (rc) {
		kvd_region_unretire(r);
		return kvd_err_prefix(ctx, rc, "%s", what);
	}
	for (i = 0; i < ctx->nr_nics; i++) {
		rc = kvd_region_dereg_one(r, i);
		if (!rc)
			continue;
		if (!err) {
			err = rc;
			first = i;
		}
		failed++;
	}
	if (!err)
		return 0;
	r->registered = false;
	kvd_region_break(r, err);
	kvd_preload_declare(r);         /* still there: still refused */
	return kvd_err(ctx, err, "%s: region %p+%zu (tag '%s'): deregistration "
		       "on NIC %s%s failed: %s; the region stays, broken, its "
		       "MR still registered there: remove it again", what,
		       r->addr, r->len, r->tag, ctx->nics[first].name,
		       failed > 1 ? " and others" : "", strerror(-err));
}

/* Undo everything of a region (ctx locked) and free it. */
void kvd_region_destroy(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	unsigned int i;

	for (i = 0; i < ctx->nr_nics; i++)
		kvd_region_dereg_one(r, i);
	r->registered = false;
	kvd_io_quiesce(&r->io);
	fd_close(&r->proxy_fd);
	fd_close(&r->backing_fd);
	for (i = 0; i < ctx->nr_regions; i++)
		if (ctx->regions[i] == r) {
			memmove(&ctx->regions[i], &ctx->regions[i + 1],
				(ctx->nr_regions - i - 1) * sizeof(r));
			ctx->nr_regions--;
			break;
		}
	ctx->unbalanced_removed += atomic_load(&r->io.unbalanced);
	kvd_range_io_free(&r->rio);
	free(r->tag);
	free(r);
}

static int desc_check(struct kvdmabuf_ctx *ctx,
		      const struct kvdmabuf_region_desc *d)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)d->addr;
	unsigned int i;

	for (i = 0; i < 3; i++)
		if (d->reserved[i])
			return kvd_err(ctx, -EINVAL, "region: reserved fields "
				       "must be zero");
	if (ctx->nr_nics < 64 && d->nics >> ctx->nr_nics)
		return kvd_err(ctx, -EINVAL, "region: NIC set 0x%llx names "
			       "NICs beyond the %u of this context",
			       (unsigned long long)d->nics, ctx->nr_nics);
	if (!d->addr || !d->len || a + d->len < a)
		return kvd_err(ctx, -EINVAL, "region %p+%zu: address and length "
			       "must be non-zero and page aligned", d->addr,
			       d->len);
	if (a % (uintptr_t)page || d->len % (size_t)page) {
		/* a tensor of any size: say what would cover it */
		uintptr_t start = a - a % (uintptr_t)page;
		uintptr_t end = a + d->len + ((uintptr_t)page - 1);

		end -= end % (uintptr_t)page;
		return kvd_err(ctx, -EINVAL, "region %p+%zu: address and length "
			       "must be page aligned (%ld bytes); the pages "
			       "that hold it are %p+%zu: register those (or the "
			       "allocation around it) once, not each tensor",
			       d->addr, d->len, page, (void *)start,
			       (size_t)(end - start));
	}
	if (d->mem < KVDMABUF_MEM_HOST || d->mem > KVDMABUF_MEM_DRM)
		return kvd_err(ctx, -EINVAL, "region: unknown memory kind %d",
			       d->mem);
	if (d->flags & ~(KVDMABUF_REGION_RELEASED_AT_SLEEP |
			 KVDMABUF_REGION_EMPTY))
		return kvd_err(ctx, -EINVAL, "region: unknown flags 0x%x",
			       d->flags);
	if ((d->flags & KVDMABUF_REGION_EMPTY) && d->mem == KVDMABUF_MEM_HOST)
		return kvd_err(ctx, -EINVAL, "region: EMPTY is for device "
			       "memory (an elastic pool of CUDA or DRM pages)");
	if ((d->flags & KVDMABUF_REGION_RELEASED_AT_SLEEP) &&
	    d->mem != KVDMABUF_MEM_HOST)
		return kvd_err(ctx, -EINVAL, "region: RELEASED_AT_SLEEP is for "
			       "host memory (device memory is always "
			       "released)");
	if (d->mem == KVDMABUF_MEM_DRM && d->drm_fd < 0 &&
	    !(d->flags & KVDMABUF_REGION_EMPTY))
		return kvd_err(ctx, -EINVAL, "region: DRM memory needs drm_fd");
	if (d->tag && strlen(d->tag) >= KVD_NAMEMAX)
		return kvd_err(ctx, -EINVAL, "region: tag too long");
	for (i = 0; i < ctx->nr_regions; i++) {
		const struct kvdmabuf_region *o = ctx->regions[i];
		uintptr_t oa = (uintptr_t)o->addr;

		if (a < oa + o->len && oa < a + d->len)
			return kvd_err(ctx, -EINVAL, "region %p+%zu overlaps "
				       "region %p+%zu", d->addr, d->len,
				       o->addr, o->len);
	}
	return 0;
}

/*
 * Host memory the engine releases at sleep and maps again at wake. Where
 * every NIC of the region pages on demand, an ODP MR follows what the
 * engine maps at its addresses: mode ODP (no re-registration, keys
 * unchanged, nothing pinned). Measured, not assumed: a NIC that refuses
 * the on-demand registration makes it REREGISTER; so does the
 * configuration's host_on_demand: off (and auto on soft-RoCE, verbs.c).
 */
static int host_released_setup(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	unsigned int i, n = 0;
	int rc;

	r->mode = KVDMABUF_MODE_REREGISTER;
	if (ctx->cfg.host_odp == KVD_HOST_ODP_OFF)
		return kvd_region_reg_all(r);
	for (i = 0; i < ctx->nr_nics; i++) {
		if (!kvd_on_nic(r, i))
			continue;
		if (!ctx->nics[i].odp)
			return kvd_region_reg_all(r);
		n++;
	}
	if (!n)
		return kvd_region_reg_all(r);
	r->mode = KVDMABUF_MODE_ODP;
	rc = kvd_region_reg_all(r);
	if ((rc != -EOPNOTSUPP && rc != -EINVAL) || r->broken)
		return rc;
	r->mode = KVDMABUF_MODE_REREGISTER;
	return kvd_region_reg_all(r);
}

/*
 * An elastic pool that starts empty: a proxy whose one range is unbacked
 * (the module's zeroed scratch), registered once; FOLLOW or refused, since
 * a NIC that pins could never see the pages that come later.
 */
static int empty_setup(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	const struct kvd_ops *ops = ctx->ops;
	struct kvd_range all = { .start = 0, .len = r->len, .fd = -1 };
	int rc;

	if (ctx->module_fd < 0 || !ops->proxy_ranges)
		return kvd_err(ctx, -EOPNOTSUPP, "an empty pool "
			       "(KVDMABUF_REGION_EMPTY) needs the kvdmabuf "
			       "module: its proxy maps the pages as they come");
	rc = ops->proxy_create(ctx, r->len, &r->proxy_fd, &r->proxy_id);
	if (rc) {
		r->proxy_fd = -1;
		return rc;
	}
	rc = ops->proxy_ranges(ctx, r->proxy_fd, &all, 1);
	if (rc)
		return kvd_err_prefix(ctx, rc, "empty pool");
	r->mode = KVDMABUF_MODE_REREGISTER;
	rc = kvd_region_reg_all(r);
	if (!rc)
		rc = kvd_region_measure_mode(r);
	if (!rc && r->mode != KVDMABUF_MODE_FOLLOW)
		rc = kvd_err(ctx, -EOPNOTSUPP, "an empty pool "
			     "(KVDMABUF_REGION_EMPTY) needs NICs that follow "
			     "moves: a NIC of it pins the proxy, and could "
			     "never reach the pages mapped later");
	return rc;
}

static int region_setup(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	const struct kvd_ops *ops = ctx->ops;
	int rc;

	if (r->mem == KVDMABUF_MEM_HOST &&
	    !(r->flags & KVDMABUF_REGION_RELEASED_AT_SLEEP)) {
		/* the engine keeps it: untouched by sleep, whatever the
		 * protocol (registered only for rdma) */
		r->mode = KVDMABUF_MODE_HOST;
		if (ctx->cfg.proto == KVD_PROTO_RDMA)
			return kvd_region_reg_all(r);
		r->key_gen = 1;
		return 0;
	}
	if (ctx->cfg.proto != KVD_PROTO_RDMA) {
		r->mode = KVDMABUF_MODE_NOREG;
		r->key_gen = 1;
		return 0;
	}
	if (ctx->cfg.registrations == KVD_REGISTRATIONS_ENGINE &&
	    r->mem == KVDMABUF_MEM_HOST)
		return kvd_err(ctx, -EINVAL, "registrations: engine: host "
			       "memory released at sleep has no proxy to "
			       "follow (the engine's MRs of it would pin it)");
	if (r->mem == KVDMABUF_MEM_HOST)
		return host_released_setup(r);
	if (r->flags & KVDMABUF_REGION_EMPTY)
		return empty_setup(r);
	rc = ops->export_dmabuf(ctx, r, &r->backing_fd, &r->backing_off);
	if (rc) {
		r->backing_fd = -1;
		return kvd_err_prefix(ctx, rc, "export");
	}
	r->mode = KVDMABUF_MODE_REREGISTER;
	if (ctx->module_fd >= 0) {
		rc = ops->proxy_create(ctx, r->len, &r->proxy_fd, &r->proxy_id);
		if (rc) {
			r->proxy_fd = -1;
			return rc;
		}
		kvd_region_label(r);
		rc = ops->proxy_attach(ctx, r->proxy_fd, r->backing_fd,
				       r->backing_off, 0);
		if (rc)
			return rc;
	}
	/* registrations: engine: no NIC, no MR; follow (the engine's MRs
	 * that cannot are the preload's to refuse at each sleep) */
	rc = kvd_region_reg_all(r);
	if (rc)
		return rc;
	return kvd_region_measure_mode(r);
}

/*
 * "kvd:<proxy id>:<mapping>" on a CUDA region's proxy, for `kvdmabuf
 * status` (which lists proxies by id and finds their names in the owner's
 * /proc/PID/fdinfo). At most DMA_BUF_NAME_LEN (32) bytes with its NUL.
 */
void kvd_region_label(struct kvdmabuf_region *r)
{
	const struct kvd_ops *ops = r->ctx->ops;
	char name[48];
	int n;

	if (r->proxy_fd < 0 || !r->mapping || r->mapping == r->labelled ||
	    !ops->proxy_label)
		return;
	n = snprintf(name, sizeof(name), "kvd:%llu:%s",
		     (unsigned long long)r->proxy_id,
		     r->mapping == KVDMABUF_MAPPING_PCIE ? "pcie" : "default");
	if (n < 0 || n >= 32)      /* DMA_BUF_NAME_LEN, its NUL included */
		return;
	if (!ops->proxy_label(r->ctx, r->proxy_fd, name))
		r->labelled = r->mapping;
}

/*
 * Measured, never assumed: FOLLOW only if nothing pins the proxy. A
 * revocable pin (irdma on Linux 7.1+) counts: such a NIC never maps again
 * after a revoke, so its MRs must be registered anew at every wake.
 */
int kvd_region_measure_mode(struct kvdmabuf_region *r)
{
	struct kvd_proxy_info pi;
	int rc;

	if (r->proxy_fd < 0)
		return 0;
	rc = r->ctx->ops->proxy_query(r->ctx, r->proxy_fd, &pi);
	if (rc)
		return rc;
	r->mode = !pi.nr_pinned && !pi.nr_blocking_pins &&
		  !pi.nr_revocable_pins ?
		  KVDMABUF_MODE_FOLLOW : KVDMABUF_MODE_REREGISTER;
	return 0;
}

const char *kvdmabuf_mode_name(int mode)
{
	switch (mode) {
	case KVDMABUF_MODE_FOLLOW:
		return "follow";
	case KVDMABUF_MODE_REREGISTER:
		return "reregister";
	case KVDMABUF_MODE_HOST:
		return "host";
	case KVDMABUF_MODE_NOREG:
		return "noreg";
	case KVDMABUF_MODE_ODP:
		return "odp";
	default:
		return "?";
	}
}

int kvdmabuf_region_add(struct kvdmabuf_ctx *ctx,
			const struct kvdmabuf_region_desc *desc,
			struct kvdmabuf_region **regionp)
{
	struct kvdmabuf_region *r, **arr;
	int rc;

	if (!ctx || !desc || !regionp)
		return -EINVAL;
	rc = kvd_not_forked(ctx, "region_add");
	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->lock);
	rc = kvd_may_change(ctx, "region_add");
	if (rc)
		goto out;
	rc = desc_check(ctx, desc);
	if (rc)
		goto out;
	if (ctx->nr_regions == ctx->cap_regions) {
		unsigned int cap = ctx->cap_regions ? ctx->cap_regions * 2 : 8;

		arr = realloc(ctx->regions, cap * sizeof(*arr));
		if (!arr) {
			rc = kvd_err(ctx, -ENOMEM, "out of memory");
			goto out;
		}
		ctx->regions = arr;
		ctx->cap_regions = cap;
	}
	r = calloc(1, sizeof(*r));
	if (!r || !(r->tag = strdup(desc->tag ? desc->tag : ""))) {
		free(r);
		rc = kvd_err(ctx, -ENOMEM, "out of memory");
		goto out;
	}
	r->ctx = ctx;
	r->addr = desc->addr;
	r->len = desc->len;
	r->mem = desc->mem;
	r->flags = desc->flags;
	r->drm_fd = desc->drm_fd;
	r->drm_handle = desc->drm_handle;
	r->nic_set = desc->nics;
	r->backing_fd = -1;
	r->proxy_fd = -1;

	rc = region_setup(r);
	if (!rc && r->proxy_fd >= 0 &&
	    kvd_range_io_init(&r->rio, r->len))
		rc = kvd_err(ctx, -ENOMEM, "out of memory");
	if (!rc)
		rc = kvd_preload_declare(r);
	if (rc) {
		kvd_err_prefix(ctx, rc, "region %p+%zu (tag '%s')", r->addr,
			       r->len, r->tag);
		kvd_region_destroy(r);   /* not in ctx->regions yet */
		goto out;
	}
	ctx->regions[ctx->nr_regions++] = r;
	r->keys_changed = false;
	*regionp = r;
out:
	pthread_mutex_unlock(&ctx->lock);
	return rc;
}

int kvdmabuf_region_remove(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx;
	int rc = 0;

	if (!r)
		return -EINVAL;
	ctx = r->ctx;
	rc = kvd_not_forked(ctx, "region_remove");
	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->lock);
	rc = kvd_may_change(ctx, "region_remove");
	if (!rc)
		rc = kvd_region_retire(r);
	if (!rc)
		rc = kvd_region_release(r, "region_remove");
	if (!rc)
		kvd_region_destroy(r);
	pthread_mutex_unlock(&ctx->lock);
	return rc;
}

/* I/O stopped first, so that no io_begin succeeds on a region being freed. */
int kvd_region_retire(struct kvdmabuf_region *r)
{
	uint64_t n;

	kvd_io_close(&r->io);
	n = kvd_io_count(&r->io);
	if (!n)
		return 0;
	kvd_region_unretire(r);
	return kvd_err(r->ctx, -EBUSY, "region %p+%zu: %llu transfer(s) in "
		       "flight", r->addr, r->len, (unsigned long long)n);
}

/* Under the context lock, I/O is open exactly on awake, sound regions. */
void kvd_region_unretire(struct kvdmabuf_region *r)
{
	if (!r->asleep && !r->broken)
		kvd_io_open(&r->io);
}

int kvdmabuf_region_set_drm_handle(struct kvdmabuf_region *r, int drm_fd,
				   uint32_t handle)
{
	struct kvdmabuf_ctx *ctx;
	int rc = 0;

	if (!r || drm_fd < 0)
		return -EINVAL;
	ctx = r->ctx;
	rc = kvd_not_forked(ctx, "region_set_drm_handle");
	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->lock);
	rc = kvd_may_change(ctx, "region_set_drm_handle");
	if (rc) {
		;
	} else if (r->mem != KVDMABUF_MEM_DRM) {
		rc = kvd_err(ctx, -EINVAL, "not a DRM region");
	} else if (!r->asleep) {
		rc = kvd_err(ctx, -EBUSY, "DRM handle can only change while "
			     "the region is asleep");
	} else {
		r->drm_fd = drm_fd;
		r->drm_handle = handle;
	}
	pthread_mutex_unlock(&ctx->lock);
	return rc;
}

struct kvdmabuf_region *kvdmabuf_region_find(struct kvdmabuf_ctx *ctx,
					     const void *addr, size_t len)
{
	struct kvdmabuf_region *found = NULL;
	uintptr_t a = (uintptr_t)addr;
	unsigned int i;

	if (!ctx)
		return NULL;
	pthread_mutex_lock(&ctx->lock);
	for (i = 0; i < ctx->nr_regions; i++) {
		struct kvdmabuf_region *r = ctx->regions[i];
		uintptr_t ra = (uintptr_t)r->addr;

		if (a >= ra && a - ra <= r->len && len <= r->len - (a - ra)) {
			found = r;
			break;
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	return found;
}

int kvdmabuf_region_keys(struct kvdmabuf_region *r, unsigned int nic,
			 uint32_t *lkey, uint32_t *rkey, uint64_t *key_gen)
{
	struct kvdmabuf_ctx *ctx;
	int rc = 0;

	if (!r)
		return -EINVAL;
	ctx = r->ctx;
	pthread_mutex_lock(&ctx->lock);
	if (!r->registered || r->broken) {
		rc = -ENOENT;
	} else if (nic >= ctx->nr_nics) {
		rc = -EINVAL;
	} else if (!kvd_on_nic(r, nic)) {
		rc = -ENOENT;
	} else {
		if (lkey)
			*lkey = r->mr[nic].lkey;
		if (rkey)
			*rkey = r->mr[nic].rkey;
	}
	if (key_gen)
		*key_gen = r->key_gen;
	pthread_mutex_unlock(&ctx->lock);
	return rc;
}

int kvdmabuf_region_dmabuf(struct kvdmabuf_region *r, int *fd,
			   uint64_t *offset)
{
	int rc = -ENOENT;

	if (!r || !fd)
		return -EINVAL;
	pthread_mutex_lock(&r->ctx->lock);
	if (r->proxy_fd >= 0) {
		*fd = r->proxy_fd;
		if (offset)
			*offset = 0;
		rc = 0;
	}
	pthread_mutex_unlock(&r->ctx->lock);
	return rc;
}

/* Asked of the module: an awake region's proxy revoked by its exporter. */
static int region_backing_lost(struct kvdmabuf_region *r)
{
	struct kvd_proxy_info pi;

	if (r->proxy_fd < 0 || r->asleep ||
	    r->ctx->ops->proxy_query(r->ctx, r->proxy_fd, &pi))
		return 0;
	return pi.state == KVD_PROXY_REVOKED &&
	       pi.revoke_reason == KVD_REVOKE_EXPORTER;
}

/* The first @size bytes of the region's info into @out. */
static int region_info(struct kvdmabuf_region *r, void *out, size_t size)
{
	struct kvdmabuf_region_info info, *i = &info;
	struct kvdmabuf_ctx *ctx;

	if (!r || !out)
		return -EINVAL;
	ctx = r->ctx;
	memset(i, 0, sizeof(*i));
	pthread_mutex_lock(&ctx->lock);
	i->addr = r->addr;
	i->len = r->len;
	i->mem = r->mem;
	i->mode = r->mode;
	i->asleep = r->asleep;
	i->proxied = r->proxy_fd >= 0;
	i->tag = r->tag;
	i->key_gen = r->key_gen;
	i->inflight = kvd_io_count(&r->io);
	i->proxy_id = r->proxy_id;
	i->broken = r->broken;
	i->backing_lost = region_backing_lost(r);
	i->mapping = r->mapping;
	pthread_mutex_unlock(&ctx->lock);
	memcpy(out, i, size);
	return 0;
}

KVD_SYMVER_DEFAULT(kvdmabuf_region_info, "KVDMABUF_0.5")
int kvd_region_info_0_5(struct kvdmabuf_region *r,
			struct kvdmabuf_region_info *info)
{
	return region_info(r, info, sizeof(*info));
}

KVD_SYMVER_OLD(kvdmabuf_region_info, "KVDMABUF_0.2")
int kvd_region_info_0_2(struct kvdmabuf_region *r,
			struct kvdmabuf_region_info *info)
{
	return region_info(r, info, KVD_REGION_INFO_SIZE_0_2);
}

void kvd_fire_key_callbacks(struct kvdmabuf_ctx *ctx,
			    struct kvdmabuf_region *const *t, unsigned int n)
{
	struct kvdmabuf_region **changed;
	char saved[KVD_ERRMAX];
	unsigned int i, nc = 0;

	if (!ctx->key_change) {
		for (i = 0; i < n; i++)
			t[i]->keys_changed = false;
		return;
	}
	changed = calloc(n + 1, sizeof(*changed));
	for (i = 0; i < n; i++) {
		if (!t[i]->keys_changed)
			continue;
		if (changed) {
			t[i]->keys_changed = false;
			changed[nc] = t[i];
		}
		nc++;
	}
	if (!nc) {
		free(changed);
		return;
	}
	/* What a callback's own calls report must not replace the message
	 * of the sleep or wake that called it. */
	memcpy(saved, kvd_msg(ctx), sizeof(saved));
	/* Without the lock (a Python callback takes the GIL, which a thread
	 * waiting for this lock may hold); ctx->busy keeps changes out. */
	pthread_mutex_unlock(&ctx->lock);
	if (changed) {
		ctx->key_change(changed, nc, ctx->key_change_arg);
	} else {
		/* out of memory: the same news, one region at a time */
		for (i = 0; i < n; i++) {
			if (!t[i]->keys_changed)
				continue;
			t[i]->keys_changed = false;
			ctx->key_change(&t[i], 1, ctx->key_change_arg);
		}
	}
	pthread_mutex_lock(&ctx->lock);
	memcpy(kvd_msg(ctx), saved, sizeof(saved));
	free(changed);
}
