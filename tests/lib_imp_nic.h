/* SPDX-License-Identifier: MIT */
/*
 * lib_imp_nic.h - the test importer (/dev/kvd_importer) as the library's
 * NIC: a backend of the library's ops table whose dma-buf registration is
 * an import by the test importer (dynamic, standing in for a NIC that
 * follows moves, or pinned, for one that pins), so that the library's
 * FOLLOW and REREGISTER paths run against a real dynamic importer in the
 * VM. Pass a struct imp_nic as the ops argument of kvd_open_ops().
 */
#ifndef KVDMABUF_TESTS_LIB_IMP_NIC_H
#define KVDMABUF_TESTS_LIB_IMP_NIC_H

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>

#include "../lib/internal.h"
#include "kmod/kvd_importer.h"

struct imp_nic {
	int fd;		/* open /dev/kvd_importer */
	int pinned;	/* import pinned: a NIC that pins */
};

static inline int imp_nic_open(struct kvdmabuf_ctx *ctx,
			       const struct kvdmabuf_options *o)
{
	(void)o;
	snprintf(ctx->nics[0].name, sizeof(ctx->nics[0].name), "kvd_importer");
	ctx->nr_nics = 1;
	return 0;
}

static inline void imp_nic_close(struct kvdmabuf_ctx *ctx)
{
	ctx->nr_nics = 0;
}

static inline int imp_nic_reg_dmabuf(struct kvdmabuf_ctx *ctx,
				     unsigned int nic, int fd, uint64_t off,
				     size_t len, uint64_t iova,
				     struct kvd_mr *mr)
{
	struct imp_nic *in = ctx->ops_arg;
	struct kvd_imp_import im = {
		.fd = (__u32)fd,
		.flags = in->pinned ? KVD_IMP_IMPORT_PINNED : 0,
	};

	(void)nic;
	(void)off;
	(void)len;
	(void)iova;
	if (ioctl(in->fd, KVD_IMP_IOCTL_IMPORT, &im))
		return kvd_err(ctx, -errno, "kvd_importer import: %s",
			       strerror(errno));
	mr->handle = (void *)(uintptr_t)(im.handle + 1);
	mr->lkey = mr->rkey = im.handle;
	return 0;
}

static inline int imp_nic_reg_addr(struct kvdmabuf_ctx *ctx, unsigned int nic,
				   void *a, size_t len, unsigned int flags,
				   struct kvd_mr *mr)
{
	(void)nic;
	(void)a;
	(void)len;
	(void)flags;
	(void)mr;
	return kvd_err(ctx, -EOPNOTSUPP, "kvd_importer: dma-bufs only");
}

static inline int imp_nic_dereg(struct kvdmabuf_ctx *ctx, unsigned int nic,
				struct kvd_mr *mr)
{
	struct imp_nic *in = ctx->ops_arg;
	struct kvd_imp_release r = { .handle = mr->lkey };

	(void)nic;
	if (ioctl(in->fd, KVD_IMP_IOCTL_RELEASE, &r))
		return kvd_err(ctx, -errno, "kvd_importer release: %s",
			       strerror(errno));
	memset(mr, 0, sizeof(*mr));
	return 0;
}

static const struct kvd_ops imp_nic_ops = {
	.nics_open = imp_nic_open,
	.nics_close = imp_nic_close,
	.export_dmabuf = kvd_export_dmabuf,
	.reg_dmabuf = imp_nic_reg_dmabuf,
	.reg_addr = imp_nic_reg_addr,
	.dereg = imp_nic_dereg,
	.proxy_open = kvd_proxy_dev_open,
	.proxy_create = kvd_proxy_dev_create,
	.proxy_attach = kvd_proxy_dev_attach,
	.proxy_revoke = kvd_proxy_dev_revoke,
	.proxy_query = kvd_proxy_dev_query,
	.proxy_label = kvd_proxy_dev_label,
	.proxy_ranges = kvd_proxy_dev_ranges,
};

#endif /* KVDMABUF_TESTS_LIB_IMP_NIC_H */
