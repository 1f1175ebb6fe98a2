// SPDX-License-Identifier: MIT
/*
 * nic.c - NICs that join or leave a context after open: every region is
 * registered on a new NIC (all or nothing) or deregistered from a leaving
 * one, with the bits of the regions' NIC sets kept in step.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* NIC changes need every region awake: an asleep FOLLOW proxy is
 * revoked (a NIC maps at registration) and REREGISTER has no MR. */
static int nic_change_allowed(struct kvdmabuf_ctx *ctx, const char *what)
{
	unsigned int i;
	int rc;

	rc = kvd_may_change(ctx, what);
	if (rc)
		return rc;
	if (ctx->cfg.proto != KVD_PROTO_RDMA)
		return kvd_err(ctx, -EPROTONOSUPPORT, "%s: protocol is not "
			       "rdma", what);
	if (ctx->cfg.registrations == KVD_REGISTRATIONS_ENGINE)
		return kvd_err(ctx, -EINVAL, "%s: registrations: engine: the "
			       "library makes no MR (the engine registers on "
			       "the proxies)", what);
	for (i = 0; i < ctx->nr_regions; i++)
		if (ctx->regions[i]->asleep)
			return kvd_err(ctx, -EBUSY, "%s: region %p+%zu is "
				       "asleep (wake it first)", what,
				       ctx->regions[i]->addr,
				       ctx->regions[i]->len);
	return 0;
}

/* Regions that follow every NIC and have MRs: the ones a new NIC gets. */
static bool joins_new_nics(const struct kvdmabuf_region *r)
{
	return !r->nic_set && r->registered && !r->broken &&
	       r->mode != KVDMABUF_MODE_NOREG;
}

int kvdmabuf_nic_add(struct kvdmabuf_ctx *ctx, struct ibv_pd *pd,
		     unsigned int *index)
{
	struct kvdmabuf_region **t = NULL;
	unsigned int i, k, nic, n = 0;
	int rc;

	if (!ctx || !pd)
		return -EINVAL;
	rc = kvd_not_forked(ctx, "nic_add");
	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->lock);
	rc = nic_change_allowed(ctx, "nic_add");
	for (i = 0; !rc && i < ctx->nr_nics; i++)
		if (ctx->nics[i].pd == pd)
			rc = kvd_err(ctx, -EINVAL, "nic_add: the PD is NIC %u "
				     "(%s) already", i, ctx->nics[i].name);
	if (rc)
		goto unlock;
	t = calloc(ctx->nr_regions + 1, sizeof(*t));
	if (!t) {
		rc = kvd_err(ctx, -ENOMEM, "out of memory");
		goto unlock;
	}
	rc = ctx->ops->nic_add(ctx, pd);
	if (rc)
		goto unlock;
	nic = ctx->nr_nics - 1;
	for (i = 0; i < ctx->nr_regions; i++) {
		struct kvdmabuf_region *r = ctx->regions[i];

		if (!joins_new_nics(r))
			continue;
		rc = kvd_region_reg_one(r, nic);
		if (rc) {
			kvd_err_prefix(ctx, rc, "nic_add: region %p+%zu on %s",
				       r->addr, r->len, ctx->nics[nic].name);
			goto undo;
		}
		t[n++] = r;
	}
	for (k = 0; k < n; k++) {
		/* the new NIC may pin what the others followed */
		if (t[k]->mode == KVDMABUF_MODE_FOLLOW)
			kvd_region_measure_mode(t[k]);
		t[k]->last[nic] = t[k]->mr[nic];
		t[k]->key_gen++;
		t[k]->keys_changed = true;
	}
	*index = nic;
	kvd_busy_begin(ctx);
	kvd_fire_key_callbacks(ctx, t, n);
	kvd_busy_end(ctx);
	goto unlock;

undo:
	for (k = n; k-- > 0;)
		if (kvd_region_dereg_one(t[k], nic))
			kvd_region_break(t[k], rc);
	ctx->ops->nic_remove(ctx, nic);
unlock:
	pthread_mutex_unlock(&ctx->lock);
	free(t);
	return rc;
}

/* Bits above @nic move down by one; bit @nic goes. */
static uint64_t set_without(uint64_t set, unsigned int nic)
{
	uint64_t low = nic ? set & (~0ull >> (64 - nic)) : 0;

	return low | (nic < 63 ? (set >> (nic + 1)) << nic : 0);
}

int kvdmabuf_nic_remove(struct kvdmabuf_ctx *ctx, unsigned int nic)
{
	struct kvdmabuf_region **t = NULL;
	unsigned int i, j, rest, n = 0;
	int rc, first = 0;

	if (!ctx)
		return -EINVAL;
	rc = kvd_not_forked(ctx, "nic_remove");
	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->lock);
	rc = nic_change_allowed(ctx, "nic_remove");
	if (!rc && nic >= ctx->nr_nics)
		rc = kvd_err(ctx, -EINVAL, "nic_remove: no NIC %u", nic);
	for (i = 0; !rc && i < ctx->nr_regions; i++)
		if (ctx->regions[i]->nic_set == 1ull << nic)
			rc = kvd_err(ctx, -EBUSY, "nic_remove: region %p+%zu "
				     "is on NIC %u only (remove it first)",
				     ctx->regions[i]->addr,
				     ctx->regions[i]->len, nic);
	if (rc)
		goto unlock;
	t = calloc(ctx->nr_regions + 1, sizeof(*t));
	if (!t) {
		rc = kvd_err(ctx, -ENOMEM, "out of memory");
		goto unlock;
	}
	rest = ctx->nr_nics - nic - 1;
	for (i = 0; i < ctx->nr_regions; i++) {
		struct kvdmabuf_region *r = ctx->regions[i];
		bool moved = false;

		/* keys at index @nic and above change: that NIC's go, the
		 * ones above move down */
		for (j = nic; j < ctx->nr_nics; j++)
			moved |= r->mr[j].handle != NULL;
		rc = kvd_region_dereg_one(r, nic);
		if (rc) {
			kvd_err_prefix(ctx, rc, "nic_remove: region %p+%zu "
				       "(now broken)", r->addr, r->len);
			kvd_region_break(r, rc);
			first = first ?: rc;
			memset(&r->mr[nic], 0, sizeof(r->mr[nic]));
		}
		memmove(&r->mr[nic], &r->mr[nic + 1], rest * sizeof(r->mr[0]));
		memmove(&r->last[nic], &r->last[nic + 1],
			rest * sizeof(r->last[0]));
		memset(&r->mr[nic + rest], 0, sizeof(r->mr[0]));
		memset(&r->last[nic + rest], 0, sizeof(r->last[0]));
		if (r->nic_set)
			r->nic_set = set_without(r->nic_set, nic);
		if (moved && !r->broken) {
			r->key_gen++;
			r->keys_changed = true;
			t[n++] = r;
		}
	}
	ctx->ops->nic_remove(ctx, nic);
	rc = first;
	kvd_busy_begin(ctx);
	kvd_fire_key_callbacks(ctx, t, n);
	kvd_busy_end(ctx);
unlock:
	pthread_mutex_unlock(&ctx->lock);
	free(t);
	return rc;
}
