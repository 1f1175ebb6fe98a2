// SPDX-License-Identifier: GPL-2.0
/*
 * umem.c - the move-capable NIC of the demo: /dev/kvd_umem, the test
 * importer on ib_core's dma-buf MR code (ib_umem_dmabuf_get() with an
 * invalidation callback that unmaps at once, as mlx5 does; the next access
 * maps again, as an mlx5 page fault does). One open file, inherited by the
 * pass's processes, is the fabric; an import handle is a key. A transfer
 * reads (src key, offset) and writes (dst key, offset) through the DMA
 * addresses of both imports, the way an mlx5 MR moves bytes by lkey/rkey.
 * Regions are vgem buffers (DRM, standing in for GPU memory).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xf86drm.h>

#include "demo.h"
#include "kmod/kvd_umem.h"
#include "proxy_common.h"

int demo_umem_open(char *why, size_t len)
{
	int rc, fd;

	rc = kvd_test_module_load("kvd_umem", "ib_uverbs", KVD_UMEM_PATH);
	if (rc) {
		snprintf(why, len, "kvd_umem not loaded and not loadable "
			 "($KVDMABUF_BUILD/tests/kmod/kvd_umem.ko): %s",
			 strerror(-rc));
		return rc;
	}
	fd = open(KVD_UMEM_PATH, O_RDWR);	/* inherited by the pass */
	if (fd < 0) {
		rc = -errno;
		snprintf(why, len, "%s: %s", KVD_UMEM_PATH, strerror(errno));
		return rc;
	}
	return fd;
}

static int access_key(int fd, uint32_t key, uint64_t off, void *buf,
		      uint32_t len, bool write)
{
	struct kvd_imp_access a = {
		.handle = key, .flags = write ? KVD_IMP_ACCESS_WRITE : 0,
		.offset = off, .length = len, .buf = (uintptr_t)buf,
	};

	return ioctl(fd, KVD_IMP_IOCTL_ACCESS, &a) ? -errno : 0;
}

int demo_umem_move(int fd, uint32_t src_key, uint64_t src_off,
		   uint32_t dst_key, uint64_t dst_off, uint32_t len)
{
	char *bounce;	/* the NIC's staging buffer */
	int rc;

	if (len > KVD_IMP_MAX_ACCESS)
		return -EINVAL;
	bounce = malloc(len);
	if (!bounce)
		return -ENOMEM;
	rc = access_key(fd, src_key, src_off, bounce, len, false);
	rc = rc ? rc : access_key(fd, dst_key, dst_off, bounce, len, true);
	free(bounce);
	return rc;
}

int demo_vbuf_new(int drm, size_t len, struct demo_vbuf *b)
{
	int rc;

	memset(b, 0, sizeof(*b));
	b->fd = -1;
	rc = vgem_create(drm, len, &b->handle);
	if (rc)
		return rc;
	if (drmPrimeHandleToFD(drm, b->handle, DRM_CLOEXEC | DRM_RDWR,
			       &b->fd)) {
		rc = -errno;
		goto fail;
	}
	/* populated: new physical memory, as cuMemCreate allocates it */
	b->cpu = mmap(NULL, len, PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_POPULATE, b->fd, 0);
	if (b->cpu == MAP_FAILED) {
		b->cpu = NULL;
		rc = -errno;
		goto fail;
	}
	memset(b->cpu, 0, len);
	b->len = len;
	return 0;
fail:
	b->len = len;
	demo_vbuf_free(drm, b);
	return rc;
}

void demo_vbuf_free(int drm, struct demo_vbuf *b)
{
	if (b->cpu)
		munmap(b->cpu, b->len);
	if (b->fd >= 0)
		close(b->fd);
	if (b->handle)
		vgem_close_handle(drm, b->handle);
	memset(b, 0, sizeof(*b));
	b->fd = -1;
}
