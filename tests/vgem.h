/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vgem.h - test helpers for vgem, the virtual GEM driver: a real DRM
 * exporter of dma-bufs that exists in every Debian kernel (modprobe vgem).
 * All helpers return >= 0 or -errno.
 */
#ifndef KVDMABUF_TESTS_VGEM_H
#define KVDMABUF_TESTS_VGEM_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xf86drm.h>

/* Opens the DRM node whose driver is vgem, or returns -ENODEV. */
static inline int vgem_open(void)
{
	char path[64];
	int i, fd;

	for (i = 0; i < 64; i++) {
		drmVersionPtr v;
		int is_vgem;

		snprintf(path, sizeof(path), "/dev/dri/card%d", i);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			continue;
		v = drmGetVersion(fd);
		is_vgem = v && v->name && !strcmp(v->name, "vgem");
		drmFreeVersion(v);
		if (is_vgem)
			return fd;
		close(fd);
	}
	return -ENODEV;
}

/* Creates a dumb buffer of @size bytes; returns its GEM handle. */
static inline int vgem_create(int drm_fd, uint64_t size, uint32_t *handle)
{
	struct drm_mode_create_dumb c = {
		.width = 1024, .bpp = 8, .height = (uint32_t)(size / 1024),
	};

	if (size % 1024 || !size)
		return -EINVAL;
	if (drmIoctl(drm_fd, DRM_IOCTL_MODE_CREATE_DUMB, &c))
		return -errno;
	*handle = c.handle;
	return 0;
}

static inline int vgem_close_handle(int drm_fd, uint32_t handle)
{
	struct drm_gem_close c = { .handle = handle };

	return drmIoctl(drm_fd, DRM_IOCTL_GEM_CLOSE, &c) ? -errno : 0;
}

/* A vgem buffer exported as a dma-buf fd (the GEM handle is dropped). */
static inline int vgem_dmabuf(int drm_fd, uint64_t size)
{
	uint32_t handle = 0;
	int ret, fd;

	ret = vgem_create(drm_fd, size, &handle);
	if (ret)
		return ret;
	ret = drmPrimeHandleToFD(drm_fd, handle, DRM_CLOEXEC | DRM_RDWR, &fd);
	if (ret)
		ret = -errno;
	vgem_close_handle(drm_fd, handle);
	return ret ? ret : fd;
}

/*
 * Maps dumb buffer @handle (@len bytes) for the CPU, at @at (MAP_FIXED,
 * replacing what is mapped there) or anywhere; the address or NULL.
 */
static inline void *vgem_map(int drm_fd, uint32_t handle, size_t len, void *at)
{
	struct drm_mode_map_dumb m = { .handle = handle };
	void *p;

	if (drmIoctl(drm_fd, DRM_IOCTL_MODE_MAP_DUMB, &m))
		return NULL;
	p = mmap(at, len, PROT_READ | PROT_WRITE,
		 MAP_SHARED | (at ? MAP_FIXED : 0), drm_fd, (off_t)m.offset);
	return p == MAP_FAILED ? NULL : p;
}

/* Fills @len bytes with a pattern derived from @seed and the offset. */
static inline void pattern_fill(void *buf, size_t len, uint32_t seed)
{
	uint32_t *p = buf;
	size_t i;

	for (i = 0; i < len / 4; i++)
		p[i] = seed * 2654435761u + (uint32_t)i;
}

/* Returns the index of the first word that breaks the pattern, or -1. */
static inline long pattern_check(const void *buf, size_t len, uint32_t seed)
{
	const uint32_t *p = buf;
	size_t i;

	for (i = 0; i < len / 4; i++)
		if (p[i] != seed * 2654435761u + (uint32_t)i)
			return (long)i;
	return -1;
}

/* A vgem dma-buf of @size bytes filled with pattern @seed; fd or -errno. */
static inline int vgem_pattern_buf(int drm, uint64_t size, uint32_t seed)
{
	void *p;
	int fd = vgem_dmabuf(drm, size);

	if (fd < 0)
		return fd;
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		int ret = -errno;

		close(fd);
		return ret;
	}
	pattern_fill(p, size, seed);
	munmap(p, size);
	return fd;
}

#endif /* KVDMABUF_TESTS_VGEM_H */
