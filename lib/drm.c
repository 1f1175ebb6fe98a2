// SPDX-License-Identifier: MIT
/*
 * drm.c - export a DRM buffer (GEM handle) as a dma-buf with PRIME (libdrm,
 * loaded at the first DRM export), and the export dispatch by memory kind.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <xf86drm.h>

#include "internal.h"

int kvd_drm_export(struct kvdmabuf_ctx *ctx, int drm_fd, uint32_t handle,
		   int *fd)
{
	int (*prime)(int fd, uint32_t handle, uint32_t flags, int *prime_fd);
	char why[KVD_ERRMAX - 64];
	int out = -1;

	*(void **)&prime = kvd_syslib_sym(KVD_SYSLIB_DRM, "drmPrimeHandleToFD",
					  "a DRM region's export", why,
					  sizeof(why));
	if (!prime)
		return kvd_err(ctx, -ELIBACC, "%s", why);
	if (prime(drm_fd, handle, DRM_CLOEXEC | DRM_RDWR, &out)) {
		int rc = errno ? -errno : -EIO;

		return kvd_err(ctx, rc, "drmPrimeHandleToFD(fd %d, handle %u) "
			       "failed: %s", drm_fd, handle, strerror(-rc));
	}
	*fd = out;
	return 0;
}

int kvd_export_dmabuf(struct kvdmabuf_ctx *ctx, struct kvdmabuf_region *r,
		      int *fd, uint64_t *offset)
{
	int rc;

	*offset = 0;
	switch (r->mem) {
	case KVDMABUF_MEM_CUDA:
		rc = kvd_cuda_export(ctx, r->addr, r->len, fd);
		if (!rc)
			r->mapping = ctx->cuda_export_flags ?
				     KVDMABUF_MAPPING_PCIE :
				     KVDMABUF_MAPPING_DEFAULT;
		return rc;
	case KVDMABUF_MEM_DRM:
		return kvd_drm_export(ctx, r->drm_fd, r->drm_handle, fd);
	default:
		return kvd_err(ctx, -EOPNOTSUPP,
			       "host memory has no dma-buf export");
	}
}
