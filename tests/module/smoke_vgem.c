// SPDX-License-Identifier: GPL-2.0
/*
 * smoke_vgem: vgem gives a dma-buf whose mmap shows the buffer's real
 * bytes (checked against the GEM object's own mapping), on which the rest of
 * the suite builds its backings.
 */
#include <linux/dma-buf.h>

#include "harness.h"
#include "vgem.h"

#define BUF_SIZE (1u << 20)

FIXTURE(vgem) {
	int drm;
};

FIXTURE_SETUP(vgem)
{
	self->drm = vgem_open();
	if (self->drm < 0)
		SKIP(return, "no vgem DRM node (modprobe vgem)");
}

FIXTURE_TEARDOWN(vgem)
{
	if (self->drm >= 0)
		close(self->drm);
}

/* Bytes written through the dma-buf mmap are those of the GEM object. */
TEST_F(vgem, dmabuf_mmap_is_the_buffer)
{
	struct drm_mode_map_dumb map = { 0 };
	struct dma_buf_sync sync = { 0 };
	uint32_t handle = 0;
	void *a, *b;
	int fd;

	ASSERT_EQ(0, vgem_create(self->drm, BUF_SIZE, &handle));
	ASSERT_EQ(0, drmPrimeHandleToFD(self->drm, handle,
					DRM_CLOEXEC | DRM_RDWR, &fd));
	a = mmap(NULL, BUF_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, a);

	sync.flags = DMA_BUF_SYNC_START | DMA_BUF_SYNC_RW;
	ASSERT_EQ(0, ioctl(fd, DMA_BUF_IOCTL_SYNC, &sync));
	pattern_fill(a, BUF_SIZE, 7);
	sync.flags = DMA_BUF_SYNC_END | DMA_BUF_SYNC_RW;
	ASSERT_EQ(0, ioctl(fd, DMA_BUF_IOCTL_SYNC, &sync));

	map.handle = handle;
	ASSERT_EQ(0, drmIoctl(self->drm, DRM_IOCTL_MODE_MAP_DUMB, &map));
	b = mmap(NULL, BUF_SIZE, PROT_READ, MAP_SHARED, self->drm, map.offset);
	ASSERT_NE(MAP_FAILED, b);
	EXPECT_EQ(-1, pattern_check(b, BUF_SIZE, 7));
	EXPECT_NE(-1, pattern_check(b, BUF_SIZE, 8));

	munmap(a, BUF_SIZE);
	munmap(b, BUF_SIZE);
	close(fd);
	vgem_close_handle(self->drm, handle);
}

/* Two buffers are two distinct memories. */
TEST_F(vgem, buffers_are_distinct)
{
	int fa = vgem_dmabuf(self->drm, BUF_SIZE);
	int fb = vgem_dmabuf(self->drm, BUF_SIZE);
	uint32_t *a, *b;

	ASSERT_GE(fa, 0);
	ASSERT_GE(fb, 0);
	a = mmap(NULL, BUF_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fa, 0);
	b = mmap(NULL, BUF_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fb, 0);
	ASSERT_NE(MAP_FAILED, a);
	ASSERT_NE(MAP_FAILED, b);
	pattern_fill(a, BUF_SIZE, 1);
	pattern_fill(b, BUF_SIZE, 2);
	EXPECT_EQ(-1, pattern_check(a, BUF_SIZE, 1));
	EXPECT_EQ(-1, pattern_check(b, BUF_SIZE, 2));
	munmap(a, BUF_SIZE);
	munmap(b, BUF_SIZE);
	close(fa);
	close(fb);
}

TEST_HARNESS_MAIN
