// SPDX-License-Identifier: MIT
/*
 * fake_cuda.c - a stand-in for the CUDA driver library (libcuda.so.1) for
 * tests, implementing only the entry points libkvdmabuf calls: cuInit,
 * cuDeviceGet, cuDeviceGetAttribute, cuPointerGetAttribute,
 * cuMemGetHandleForAddressRange, cuGetErrorName.
 *
 * It stands for one GPU ("device 0") whose memory is the memory the test
 * hands it:
 *  - on the host, an export is a memfd of the requested size (no real
 *    aliasing of the memory; enough for the library's control path);
 *  - with FAKE_CUDA_VGEM=1 (VM), "device memory" comes from fakecu_alloc():
 *    a vgem dumb buffer mapped at an address; an export is the PRIME
 *    dma-buf of the buffer currently mapped there, and fakecu_remap() frees
 *    it and maps a new buffer at the same address, as an engine's wake does
 *    with cuMemCreate + cuMemMap.
 *
 * FAKE_CUDA_MODE (read at every call) selects a behaviour:
 *   ok (default) | noinit (cuInit: CUDA_ERROR_NO_DEVICE) | nodmabuf
 *   (DMA_BUF_SUPPORTED = 0) | export_fail (CUDA_ERROR_NOT_SUPPORTED) |
 *   notdevice (cuPointerGetAttribute: CUDA_ERROR_INVALID_VALUE).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xf86drm.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_NOT_SUPPORTED 801

#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1

#define EXPORT __attribute__((visibility("default")))

static int mode_is(const char *m)
{
	const char *v = getenv("FAKE_CUDA_MODE");

	return v && !strcmp(v, m);
}

/* What the last export asked for (tests check "exactly the range"). */
static unsigned long long last_ptr;
static size_t last_size;
static unsigned long exports;

EXPORT int cuInit(unsigned int flags)
{
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	return mode_is("noinit") ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

EXPORT int cuDeviceGet(int *dev, int ordinal)
{
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = 0;
	return CUDA_SUCCESS;
}

EXPORT int cuDeviceGetAttribute(int *pi, int attrib, int dev)
{
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (attrib != CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
		return CUDA_ERROR_INVALID_VALUE;
	*pi = mode_is("nodmabuf") ? 0 : 1;
	return CUDA_SUCCESS;
}

EXPORT int cuPointerGetAttribute(void *data, int attribute,
				 unsigned long long ptr)
{
	if (attribute != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL || !ptr ||
	    mode_is("notdevice"))
		return CUDA_ERROR_INVALID_VALUE;
	*(int *)data = 0;
	return CUDA_SUCCESS;
}

/* ---- vgem-backed device memory (VM) ---- */

#define FAKECU_MAX 32

struct fakecu_alloc {
	unsigned long long addr;
	size_t size;
	uint32_t handle;
};

static struct fakecu_alloc allocs[FAKECU_MAX];
static int vgem_fd = -1;

static int vgem_open(void)
{
	char path[32];
	int i, fd;

	if (vgem_fd >= 0)
		return vgem_fd;
	for (i = 0; i < 16; i++) {
		drmVersionPtr v;

		snprintf(path, sizeof(path), "/dev/dri/card%d", i);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			continue;
		v = drmGetVersion(fd);
		if (v && !strcmp(v->name, "vgem")) {
			drmFreeVersion(v);
			vgem_fd = fd;
			return fd;
		}
		if (v)
			drmFreeVersion(v);
		close(fd);
	}
	return -ENODEV;
}

/* Map a new vgem buffer of @size at @at (or anywhere when @at is NULL). */
static int vgem_map(size_t size, void *at, uint32_t *handle, void **out)
{
	struct drm_mode_create_dumb c = { 0 };
	struct drm_mode_map_dumb m = { 0 };
	struct drm_gem_close gc = { 0 };
	int fd = vgem_open();
	void *p;

	if (fd < 0)
		return fd;
	c.width = 4096;             /* one byte per pixel: pitch 4096 */
	c.height = (uint32_t)(size / 4096);
	c.bpp = 8;
	if (drmIoctl(fd, DRM_IOCTL_MODE_CREATE_DUMB, &c))
		return -errno;
	m.handle = c.handle;
	if (drmIoctl(fd, DRM_IOCTL_MODE_MAP_DUMB, &m))
		goto fail;
	p = mmap(at, size, PROT_READ | PROT_WRITE,
		 MAP_SHARED | (at ? MAP_FIXED : 0), fd, (off_t)m.offset);
	if (p == MAP_FAILED)
		goto fail;
	*handle = c.handle;
	*out = p;
	return 0;
fail:
	gc.handle = c.handle;
	drmIoctl(fd, DRM_IOCTL_GEM_CLOSE, &gc);
	return -EIO;
}

/* Test API: allocate "device memory"; returns its address or NULL. */
EXPORT void *fakecu_alloc(size_t size)
{
	void *p;
	int i;

	for (i = 0; i < FAKECU_MAX; i++)
		if (!allocs[i].addr)
			break;
	if (i == FAKECU_MAX || vgem_map(size, NULL, &allocs[i].handle, &p))
		return NULL;
	allocs[i].addr = (unsigned long long)(uintptr_t)p;
	allocs[i].size = size;
	return p;
}

/* Test API: release the buffer at @addr and map a new one there (what a
 * sleeping engine's cuMemUnmap/cuMemRelease + cuMemCreate/cuMemMap do). */
EXPORT int fakecu_remap(void *addr)
{
	struct drm_gem_close gc = { 0 };
	uint32_t h;
	void *p;
	int i;

	for (i = 0; i < FAKECU_MAX; i++)
		if (allocs[i].addr == (unsigned long long)(uintptr_t)addr)
			break;
	if (i == FAKECU_MAX)
		return -EINVAL;
	munmap(addr, allocs[i].size);
	gc.handle = allocs[i].handle;
	drmIoctl(vgem_fd, DRM_IOCTL_GEM_CLOSE, &gc);
	if (vgem_map(allocs[i].size, addr, &h, &p) || p != addr)
		return -EIO;
	allocs[i].handle = h;
	return 0;
}

EXPORT void fakecu_last_export(unsigned long long *ptr, size_t *size,
			       unsigned long *count)
{
	*ptr = last_ptr;
	*size = last_size;
	*count = exports;
}

EXPORT int cuMemGetHandleForAddressRange(void *handle, unsigned long long dptr,
					 size_t size, int type,
					 unsigned long long flags)
{
	int fd, i;

	if (type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags ||
	    (dptr | size) % 4096 || !size)
		return CUDA_ERROR_INVALID_VALUE;
	if (mode_is("export_fail"))
		return CUDA_ERROR_NOT_SUPPORTED;
	last_ptr = dptr;
	last_size = size;
	exports++;
	for (i = 0; i < FAKECU_MAX; i++)
		if (allocs[i].addr && dptr >= allocs[i].addr &&
		    dptr + size <= allocs[i].addr + allocs[i].size)
			break;
	if (i < FAKECU_MAX) {
		if (dptr != allocs[i].addr || size != allocs[i].size)
			return CUDA_ERROR_NOT_SUPPORTED; /* whole buffers only */
		if (drmPrimeHandleToFD(vgem_fd, allocs[i].handle,
				       DRM_CLOEXEC | DRM_RDWR, &fd))
			return CUDA_ERROR_INVALID_VALUE;
	} else {
		fd = memfd_create("fake-backing", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, (off_t)size)) {
			if (fd >= 0)
				close(fd);
			return CUDA_ERROR_INVALID_VALUE;
		}
	}
	*(int *)handle = fd;
	return CUDA_SUCCESS;
}

EXPORT int cuGetErrorName(int error, const char **str)
{
	switch (error) {
	case CUDA_SUCCESS:
		*str = "CUDA_SUCCESS";
		return CUDA_SUCCESS;
	case CUDA_ERROR_INVALID_VALUE:
		*str = "CUDA_ERROR_INVALID_VALUE";
		return CUDA_SUCCESS;
	case CUDA_ERROR_NO_DEVICE:
		*str = "CUDA_ERROR_NO_DEVICE";
		return CUDA_SUCCESS;
	case CUDA_ERROR_INVALID_DEVICE:
		*str = "CUDA_ERROR_INVALID_DEVICE";
		return CUDA_SUCCESS;
	case CUDA_ERROR_NOT_SUPPORTED:
		*str = "CUDA_ERROR_NOT_SUPPORTED";
		return CUDA_SUCCESS;
	default:
		*str = NULL;
		return CUDA_ERROR_INVALID_VALUE;
	}
}
