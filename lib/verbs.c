// SPDX-License-Identifier: MIT
/*
 * verbs.c - NICs (protection domains) and memory registration with
 * libibverbs.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "internal.h"

/* SGEs of one ibv_advise_mr() call (a GiB each). */
#define KVD_PREFETCH_SGES	16u

/* soft-RoCE (rxe_param.h's RXE_VENDOR_ID) */
#define KVD_RXE_VENDOR_ID	0xffffffu

/*
 * ODP for what a peer does to a KV region: RC RDMA READ and WRITE; under
 * host_on_demand: auto not soft-RoCE's (see enum kvd_host_odp).
 */
static bool nic_odp(struct kvdmabuf_ctx *ctx, struct ibv_context *vctx)
{
	const uint32_t rc_needs = IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_WRITE;
	struct ibv_device_attr_ex ax;

	memset(&ax, 0, sizeof(ax));
	if (ibv_query_device_ex(vctx, NULL, &ax))
		return false;
	if (ctx->cfg.host_odp == KVD_HOST_ODP_AUTO &&
	    ax.orig_attr.vendor_id == KVD_RXE_VENDOR_ID)
		return false;
	return (ax.odp_caps.general_caps & IBV_ODP_SUPPORT) &&
	       (ax.odp_caps.per_transport_caps.rc_odp_caps & rc_needs) ==
	       rc_needs;
}

static int nic_add(struct kvdmabuf_ctx *ctx, struct ibv_pd *pd,
		   struct ibv_context *owned_ctx)
{
	struct ibv_device_attr attr;
	struct kvd_nic *n;

	if (ctx->nr_nics == KVDMABUF_MAX_NICS)
		return kvd_err(ctx, -E2BIG, "more than %d NICs",
			       KVDMABUF_MAX_NICS);
	n = &ctx->nics[ctx->nr_nics++];
	snprintf(n->name, sizeof(n->name), "%s",
		 ibv_get_device_name(pd->context->device));
	n->pd = pd;
	/* one MR per region and NIC: the region must fit in one */
	if (!ibv_query_device(pd->context, &attr))
		n->max_mr_size = attr.max_mr_size;
	n->odp = nic_odp(ctx, pd->context);
	if (owned_ctx) {
		n->owned_pd = pd;
		n->owned_ctx = owned_ctx;
	}
	return 0;
}

static int open_device(struct kvdmabuf_ctx *ctx, struct ibv_device *dev)
{
	struct ibv_context *vctx;
	struct ibv_pd *pd;
	int rc;

	vctx = ibv_open_device(dev);
	if (!vctx) {
		rc = errno ? -errno : -ENODEV;
		return kvd_err(ctx, rc, "ibv_open_device(%s) failed: %s",
			       ibv_get_device_name(dev), strerror(-rc));
	}
	pd = ibv_alloc_pd(vctx);
	if (!pd) {
		rc = errno ? -errno : -ENOMEM;
		ibv_close_device(vctx);
		return kvd_err(ctx, rc, "ibv_alloc_pd(%s) failed: %s",
			       ibv_get_device_name(dev), strerror(-rc));
	}
	rc = nic_add(ctx, pd, vctx);
	if (rc) {
		ibv_dealloc_pd(pd);
		ibv_close_device(vctx);
	}
	return rc;
}

static void nic_release(struct kvd_nic *n)
{
	if (n->owned_pd)
		ibv_dealloc_pd(n->owned_pd);
	if (n->owned_ctx)
		ibv_close_device(n->owned_ctx);
	memset(n, 0, sizeof(*n));
}

void kvd_verbs_nics_close(struct kvdmabuf_ctx *ctx)
{
	while (ctx->nr_nics)
		nic_release(&ctx->nics[--ctx->nr_nics]);
}

int kvd_verbs_nic_add(struct kvdmabuf_ctx *ctx, struct ibv_pd *pd)
{
	return nic_add(ctx, pd, NULL);
}

void kvd_verbs_nic_remove(struct kvdmabuf_ctx *ctx, unsigned int i)
{
	nic_release(&ctx->nics[i]);
	memmove(&ctx->nics[i], &ctx->nics[i + 1],
		(ctx->nr_nics - i - 1) * sizeof(ctx->nics[0]));
	memset(&ctx->nics[--ctx->nr_nics], 0, sizeof(ctx->nics[0]));
}

int kvd_verbs_nics_open(struct kvdmabuf_ctx *ctx,
			const struct kvdmabuf_options *opts)
{
	struct ibv_device **list;
	unsigned int i, j;
	int n = 0, rc = 0;

	list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		if (list)
			ibv_free_device_list(list);
		return kvd_err(ctx, -ENODEV, "protocol rdma but no RDMA device "
			       "is usable here (ibv_get_device_list found "
			       "none): a transfer engine would silently use "
			       "another transport");
	}
	/* every NIC named in the config must exist */
	for (i = 0; i < ctx->cfg.nr_nics; i++) {
		for (j = 0; j < (unsigned int)n; j++)
			if (!strcmp(ibv_get_device_name(list[j]),
				    ctx->cfg.nics[i]))
				break;
		if (j == (unsigned int)n) {
			rc = kvd_err(ctx, -ENODEV, "NIC %s named in %s is not "
				     "a verbs device here", ctx->cfg.nics[i],
				     ctx->cfg.path);
			goto out;
		}
	}
	if (opts->nr_pds) {
		for (i = 0; i < opts->nr_pds && !rc; i++) {
			if (!opts->pds || !opts->pds[i]) {
				rc = kvd_err(ctx, -EINVAL, "options: pds[%u] "
					     "is NULL", i);
				break;
			}
			rc = nic_add(ctx, opts->pds[i], NULL);
		}
	} else if (ctx->cfg.nr_nics) {
		for (i = 0; i < ctx->cfg.nr_nics && !rc; i++)
			for (j = 0; j < (unsigned int)n; j++)
				if (!strcmp(ibv_get_device_name(list[j]),
					    ctx->cfg.nics[i])) {
					rc = open_device(ctx, list[j]);
					break;
				}
	} else {
		for (j = 0; j < (unsigned int)n && !rc; j++)
			rc = open_device(ctx, list[j]);
	}
	if (rc)
		kvd_verbs_nics_close(ctx);
out:
	ibv_free_device_list(list);
	return rc;
}

int kvd_verbs_reg_dmabuf(struct kvdmabuf_ctx *ctx, unsigned int nic, int fd,
			 uint64_t offset, size_t len, uint64_t iova,
			 struct kvd_mr *mr)
{
	struct ibv_mr *m;
	int rc;

	errno = 0;
	kvd_preload_own(1);
	m = ibv_reg_dmabuf_mr(ctx->nics[nic].pd, offset, len, iova, fd,
			      (int)ctx->access);
	kvd_preload_own(0);
	if (!m) {
		rc = errno ? -errno : -EIO;
		return kvd_err(ctx, rc, "ibv_reg_dmabuf_mr(%s, fd %d, offset "
			       "%llu, len %zu) failed: %s", ctx->nics[nic].name,
			       fd, (unsigned long long)offset, len,
			       strerror(-rc));
	}
	mr->handle = m;
	mr->lkey = m->lkey;
	mr->rkey = m->rkey;
	mr->iova = iova;
	return 0;
}

int kvd_verbs_reg_addr(struct kvdmabuf_ctx *ctx, unsigned int nic,
		       void *addr, size_t len, unsigned int flags,
		       struct kvd_mr *mr)
{
	int access = (int)ctx->access;
	struct ibv_mr *m;
	int rc;

	if (flags & KVD_REG_ON_DEMAND)
		access |= IBV_ACCESS_ON_DEMAND;
	errno = 0;
	kvd_preload_own(1);
	m = ibv_reg_mr(ctx->nics[nic].pd, addr, len, access);
	kvd_preload_own(0);
	if (!m) {
		rc = errno ? -errno : -EIO;
		return kvd_err(ctx, rc, "ibv_reg_mr(%s, %p, %zu%s) failed: %s",
			       ctx->nics[nic].name, addr, len,
			       flags & KVD_REG_ON_DEMAND ? ", on demand" : "",
			       strerror(-rc));
	}
	mr->handle = m;
	mr->lkey = m->lkey;
	mr->rkey = m->rkey;
	mr->iova = (uintptr_t)addr;
	return 0;
}

/*
 * The NIC maps all of @mr now rather than at the first transfer after a
 * move (mlx5: dma-buf and ODP MRs; tests/rxe's soft-RoCE: dma-buf MRs).
 * Synchronous (FLUSH): done when the wake returns. One SGE per GiB, as
 * an SGE's length is 32 bits.
 */
int kvd_verbs_prefetch(struct kvdmabuf_ctx *ctx, unsigned int nic,
		       struct kvd_mr *mr)
{
	struct ibv_sge sge[KVD_PREFETCH_SGES];
	const uint64_t step = 1ull << 30;
	struct ibv_mr *m = mr->handle;
	uint64_t addr = mr->iova, end = addr + m->length;
	unsigned int n;
	int rc;

	(void)ctx;
	(void)nic;
	while (addr < end) {
		for (n = 0; n < KVD_PREFETCH_SGES && addr < end; n++) {
			sge[n].addr = addr;
			sge[n].length = (uint32_t)(end - addr < step ?
						   end - addr : step);
			sge[n].lkey = m->lkey;
			addr += sge[n].length;
		}
		rc = ibv_advise_mr(m->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
				   IBV_ADVISE_MR_FLAG_FLUSH, sge, n);
		if (rc)
			return rc > 0 ? -rc : rc;
	}
	return 0;
}

int kvd_verbs_dereg(struct kvdmabuf_ctx *ctx, unsigned int nic,
		    struct kvd_mr *mr)
{
	int rc;

	kvd_preload_own(1);
	rc = ibv_dereg_mr(mr->handle);
	kvd_preload_own(0);
	if (rc) {
		rc = rc > 0 ? -rc : rc;
		return kvd_err(ctx, rc, "ibv_dereg_mr(%s, lkey 0x%x) failed: %s",
			       ctx->nics[nic].name, mr->lkey, strerror(-rc));
	}
	memset(mr, 0, sizeof(*mr));
	return 0;
}
