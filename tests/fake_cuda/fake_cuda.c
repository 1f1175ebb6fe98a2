// SPDX-License-Identifier: MIT
/*
 * fake_cuda.c - a stand-in for the CUDA driver library (libcuda.so.1) for
 * tests, implementing the entry points libkvdmabuf calls: cuInit,
 * cuDeviceGet, cuDeviceGetAttribute, cuPointerGetAttribute,
 * cuMemGetAddressRange_v2, cuMemGetHandleForAddressRange,
 * cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease_v2,
 * cuCtxPushCurrent_v2, cuCtxPopCurrent_v2, cuCtxGetCurrent,
 * cuGetErrorName. Built against the CUDA toolkit's cuda.h where make
 * finds one, so that each definition here must match NVIDIA's prototype,
 * else against the project's declarations (tests/cuda_compat.h).
 *
 * What it models, as the driver does:
 *  - devices 0 and 1 (FAKE_CUDA_DEVICES=N for N, at most 4), each with a
 *    primary context (retained/released, reference-counted) and a
 *    per-thread stack of current contexts; a new thread has none;
 *  - device memory as cuMemAddressReserve + cuMemCreate + cuMemMap build
 *    it: VA reservations, and mappings (one per cuMemCreate allocation,
 *    with its device and its gpuDirectRDMACapable flag) inside them;
 *  - cuPointerGetAttribute: DEVICE_ORDINAL and IS_GPU_DIRECT_RDMA_CAPABLE
 *    of the mapping (INVALID_VALUE where nothing is mapped), MAPPED (a
 *    bool; 0 for a reserved but unmapped VA), RANGE_START_ADDR/RANGE_SIZE
 *    (the reservation); cuMemGetAddressRange_v2: the one mapping holding
 *    the pointer (what the driver answers for VMM memory);
 *  - cuMemGetHandleForAddressRange: needs a current context
 *    (CUDA_ERROR_INVALID_CONTEXT), host-page-aligned pointer and size,
 *    flags 0 or CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE (1), and every
 *    byte mapped, on one device, inside one reservation
 *    (CUDA_ERROR_INVALID_VALUE otherwise); sub-ranges and ranges over
 *    several allocations mapped back to back are accepted.
 *
 * Memory behind the mappings:
 *  - fakecu_map() (host tests): anonymous shared memory; an export is a
 *    new memfd named "fake-backing" of the requested size (no aliasing of
 *    the memory: enough for the library's control path);
 *  - fakecu_alloc()/fakecu_remap() (VM), and cuMemMap with FAKE_CUDA_VGEM=1:
 *    a vgem dumb buffer mapped at the address; an export is the PRIME dma-buf of the buffer. vgem cannot
 *    make a dma-buf of part of a buffer or of several buffers, so in this
 *    mode only a range that is exactly one buffer is exported (anything
 *    else: CUDA_ERROR_NOT_SUPPORTED and a line on stderr) - a limit of
 *    the fake, not of the driver.
 *
 * The VMM calls around an engine's sleep, for the preload's tests
 * (tests/preload/preload_cuda): cuMemAddressReserve/Free, cuMemCreate/Release,
 * cuMemMap (a whole allocation at offset 0), cuMemUnmap (whole mappings
 * only), cuMemSetAccess (every byte mapped; the flags kept per mapping,
 * fakecu_access()), and cuGetProcAddress_v2 / the CUDA 11.3
 * cuGetProcAddress for those names (driver version 13.0). map, unmap,
 * access and export are logged in order with the test's own notes
 * (fakecu_note(), fakecu_log()).
 *
 * Built a second time with -DFAKE_CUDA_OLD (tests/fake_cuda/old/), as a
 * driver before CUDA 11.7: no cuMemGetHandleForAddressRange.
 *
 * FAKE_CUDA_MODE (read at every call) selects a behaviour:
 *   ok (default) | noinit (cuInit: CUDA_ERROR_NO_DEVICE) | nodmabuf
 *   (DMA_BUF_SUPPORTED = 0) | export_fail (CUDA_ERROR_NOT_SUPPORTED) |
 *   notdevice (cuPointerGetAttribute: CUDA_ERROR_INVALID_VALUE) |
 *   nopcie (the PCIe mapping flag: CUDA_ERROR_NOT_SUPPORTED, as a GPU
 *   without it) | oldflags (any flag: CUDA_ERROR_INVALID_VALUE, as a
 *   driver before CUDA 12.8) | nogdrattr (IS_GPU_DIRECT_RDMA_CAPABLE not
 *   reported: CUDA_ERROR_INVALID_VALUE) | stub (as the toolkit's link-time
 *   stub libcuda.so: cuInit and cuGetErrorName CUDA_ERROR_STUB_LIBRARY) |
 *   unmap_fail (cuMemUnmap: CUDA_ERROR_INVALID_VALUE, nothing unmapped).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xf86drm.h>

#include "cuda_compat.h"

#define EXPORT __attribute__((visibility("default")))
#define PAGE 4096ull

typedef unsigned long long dptr_t;

static int mode_is(const char *m)
{
	const char *v = getenv("FAKE_CUDA_MODE");

	return v && !strcmp(v, m);
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- devices and contexts ---- */

#define MAXDEV 4

struct fake_ctx {
	int dev;
	int refs;       /* primary context retains */
};

static struct fake_ctx primary[MAXDEV] = {
	{ 0, 0 }, { 1, 0 }, { 2, 0 }, { 3, 0 },
};

#define STACK 16
static _Thread_local struct fake_ctx *stack[STACK];
static _Thread_local int depth;

static int ndev(void)
{
	const char *v = getenv("FAKE_CUDA_DEVICES");
	int n = v ? atoi(v) : 2;

	return n < 1 ? 1 : n > MAXDEV ? MAXDEV : n;
}

EXPORT CUresult cuInit(unsigned int flags)
{
	if (mode_is("stub"))
		return CUDA_ERROR_STUB_LIBRARY;
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	return mode_is("noinit") ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
	if (ordinal < 0 || ordinal >= ndev())
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
				     CUdevice dev)
{
	if (dev < 0 || dev >= ndev())
		return CUDA_ERROR_INVALID_DEVICE;
	if (attrib != CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
		return CUDA_ERROR_INVALID_VALUE;
	*pi = mode_is("nodmabuf") ? 0 : 1;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	if (dev < 0 || dev >= ndev())
		return CUDA_ERROR_INVALID_DEVICE;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	primary[dev].refs++;
	pthread_mutex_unlock(&lock);
	*pctx = (CUcontext)(void *)&primary[dev];
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	CUresult rc = CUDA_SUCCESS;

	if (dev < 0 || dev >= ndev())
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&lock);
	if (primary[dev].refs > 0)
		primary[dev].refs--;
	else
		rc = CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_unlock(&lock);
	return rc;
}

static int ctx_valid(struct fake_ctx *c)
{
	return c >= primary && c < primary + MAXDEV && c->refs > 0;
}

EXPORT CUresult cuCtxPushCurrent(CUcontext ctx)
{
	struct fake_ctx *c = (struct fake_ctx *)(void *)ctx;

	if (!ctx_valid(c) || depth == STACK)
		return CUDA_ERROR_INVALID_CONTEXT;
	stack[depth++] = c;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx)
{
	if (!depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	depth--;
	if (pctx)
		*pctx = (CUcontext)(void *)stack[depth];
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	*pctx = depth ? (CUcontext)(void *)stack[depth - 1] : NULL;
	return CUDA_SUCCESS;
}

/* ---- reservations and mappings ---- */

#define MAXRES 32
#define MAXMAP 64

struct fake_res {
	dptr_t base;
	size_t size;
};

struct fake_map {
	dptr_t addr;
	size_t size;
	int dev;
	int gdr;
	uint32_t vgem_handle;   /* 0: anonymous memory */
	unsigned int access;    /* cuMemSetAccess's flags; 0 after a map */
};

static struct fake_res res[MAXRES];
static struct fake_map maps[MAXMAP];
static int vgem_fd = -1;

static struct fake_res *res_of(dptr_t p)
{
	int i;

	for (i = 0; i < MAXRES; i++)
		if (res[i].size && p >= res[i].base &&
		    p < res[i].base + res[i].size)
			return &res[i];
	return NULL;
}

static struct fake_map *map_of(dptr_t p)
{
	int i;

	for (i = 0; i < MAXMAP; i++)
		if (maps[i].size && p >= maps[i].addr &&
		    p < maps[i].addr + maps[i].size)
			return &maps[i];
	return NULL;
}

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

/* Map a new vgem buffer of @size at @at (MAP_FIXED). */
static int vgem_map(size_t size, void *at, uint32_t *handle)
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
	p = mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
		 (off_t)m.offset);
	if (p == MAP_FAILED)
		goto fail;
	*handle = c.handle;
	return 0;
fail:
	gc.handle = c.handle;
	drmIoctl(fd, DRM_IOCTL_GEM_CLOSE, &gc);
	return -EIO;
}

/* Test API: reserve @size bytes of VA (cuMemAddressReserve), at @hint when
 * that range is free; returns the base or NULL. */
EXPORT void *fakecu_reserve(size_t size, void *hint)
{
	void *p;
	int i;

	if (!size || size % PAGE)
		return NULL;
	pthread_mutex_lock(&lock);
	for (i = 0; i < MAXRES && res[i].size; i++)
		;
	p = i == MAXRES ? MAP_FAILED :
	    mmap(hint, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS |
		 MAP_NORESERVE | (hint ? MAP_FIXED_NOREPLACE : 0), -1, 0);
	if (p != MAP_FAILED && hint && p != hint) {
		munmap(p, size);
		p = MAP_FAILED;
	}
	if (p != MAP_FAILED) {
		res[i].base = (dptr_t)(uintptr_t)p;
		res[i].size = size;
	}
	pthread_mutex_unlock(&lock);
	return p == MAP_FAILED ? NULL : p;
}

/* Map at @at (inside a reservation, not mapped yet) a new allocation of
 * @size on @dev: vgem buffer or anonymous memory. */
static int map_new(void *at, size_t size, int dev, int gdr, int vgem)
{
	dptr_t a = (dptr_t)(uintptr_t)at;
	struct fake_res *r;
	uint32_t h = 0;
	dptr_t p;
	int i, rc;

	if (!size || (a | size) % PAGE || dev < 0 || dev >= ndev())
		return -EINVAL;
	pthread_mutex_lock(&lock);
	r = res_of(a);
	rc = -EINVAL;
	if (!r || a + size > r->base + r->size)
		goto out;
	for (p = a; p < a + size; p += PAGE)
		if (map_of(p))
			goto out;
	for (i = 0; i < MAXMAP && maps[i].size; i++)
		;
	rc = -ENOSPC;
	if (i == MAXMAP)
		goto out;
	if (vgem) {
		rc = vgem_map(size, at, &h);
		if (rc)
			goto out;
	} else if (mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED |
			MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
		rc = -errno;
		goto out;
	}
	maps[i] = (struct fake_map){ a, size, dev, gdr, h, 0 };
	rc = 0;
out:
	pthread_mutex_unlock(&lock);
	return rc;
}

/* Test API: cuMemCreate (@dev, gpuDirectRDMACapable = @gdr) + cuMemMap of
 * @size bytes at @at, anonymous memory. 0 or -errno. */
EXPORT int fakecu_map(void *at, size_t size, int dev, int gdr)
{
	return map_new(at, size, dev, gdr, 0);
}

/* Unmap @m (lock held): its VA stays reserved. */
static void unmap_locked(struct fake_map *m)
{
	struct drm_gem_close gc = { 0 };

	mmap((void *)(uintptr_t)m->addr, m->size, PROT_NONE, MAP_PRIVATE |
	     MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	if (m->vgem_handle) {
		gc.handle = m->vgem_handle;
		drmIoctl(vgem_fd, DRM_IOCTL_GEM_CLOSE, &gc);
	}
	memset(m, 0, sizeof(*m));
}

/* Test API: cuMemUnmap + cuMemRelease of the mapping that starts at @at;
 * its VA stays reserved. */
EXPORT int fakecu_unmap(void *at)
{
	dptr_t a = (dptr_t)(uintptr_t)at;
	struct fake_map *m;
	int rc = -EINVAL;

	pthread_mutex_lock(&lock);
	m = map_of(a);
	if (m && m->addr == a) {
		unmap_locked(m);
		rc = 0;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* Test API (VM): reserve and map a vgem buffer of @size on device 0;
 * returns its address or NULL. */
EXPORT void *fakecu_alloc(size_t size)
{
	void *p = fakecu_reserve(size, NULL);

	if (p && map_new(p, size, 0, 1, 1)) {
		pthread_mutex_lock(&lock);
		memset(res_of((dptr_t)(uintptr_t)p), 0, sizeof(struct fake_res));
		pthread_mutex_unlock(&lock);
		munmap(p, size);
		return NULL;
	}
	return p;
}

/* Test API: release the allocation mapped at @addr and map a new one of
 * the same kind there (what a sleeping engine's cuMemUnmap/cuMemRelease +
 * cuMemCreate/cuMemMap do). */
EXPORT int fakecu_remap(void *addr)
{
	struct fake_map *m, old;

	pthread_mutex_lock(&lock);
	m = map_of((dptr_t)(uintptr_t)addr);
	if (!m || m->addr != (dptr_t)(uintptr_t)addr) {
		pthread_mutex_unlock(&lock);
		return -EINVAL;
	}
	old = *m;
	pthread_mutex_unlock(&lock);
	if (fakecu_unmap(addr))
		return -EIO;
	return map_new(addr, old.size, old.dev, old.gdr, old.vgem_handle != 0);
}

/* ---- the order of calls (tests of the preload check it) ---- */

static char call_log[4096];

/* Append @what to the log (lock held, or the caller's own note). */
static void log_call(const char *what)
{
	size_t n = strlen(call_log);

	snprintf(call_log + n, sizeof(call_log) - n, "%s%s", n ? " " : "",
		 what);
}

/* Test API: a note of the test's in the same log (what its stand-in
 * for the proxy did, between the driver calls). */
EXPORT void fakecu_note(const char *what)
{
	pthread_mutex_lock(&lock);
	log_call(what);
	pthread_mutex_unlock(&lock);
}

/* Test API: the log since the last call ("map access unmap export ..."),
 * then cleared. */
EXPORT void fakecu_log(char *buf, size_t len)
{
	pthread_mutex_lock(&lock);
	snprintf(buf, len, "%s", call_log);
	call_log[0] = '\0';
	pthread_mutex_unlock(&lock);
}

/* Test API: cuMemSetAccess's flags of the mapping holding @p, -1 where
 * nothing is mapped. */
EXPORT int fakecu_access(void *p)
{
	struct fake_map *m;
	int rc;

	pthread_mutex_lock(&lock);
	m = map_of((dptr_t)(uintptr_t)p);
	rc = m ? (int)m->access : -1;
	pthread_mutex_unlock(&lock);
	return rc;
}

/* ---- what the last export asked for (tests check it) ---- */

static dptr_t last_ptr;
static size_t last_size;
static unsigned long long last_flags;
static int last_ctx_dev = -1;
static unsigned long exports;
static _Atomic unsigned long export_calls;	/* refused ones too */

EXPORT void fakecu_last_export(unsigned long long *ptr, size_t *size,
			       unsigned long *count)
{
	*ptr = last_ptr;
	*size = last_size;
	*count = exports;
}

/* Calls of cuMemGetHandleForAddressRange, whatever they returned. */
EXPORT unsigned long fakecu_export_calls(void)
{
	return export_calls;
}

/* Flags of the last export, and the device of the context current then. */
EXPORT unsigned long long fakecu_last_export_flags(void)
{
	return last_flags;
}

EXPORT int fakecu_last_export_ctx_dev(void)
{
	return last_ctx_dev;
}

/* Retains of @dev's primary context; the calling thread's current device
 * (-1: no current context). */
EXPORT int fakecu_primary_refs(int dev)
{
	return dev >= 0 && dev < MAXDEV ? primary[dev].refs : -1;
}

EXPORT int fakecu_current_dev(void)
{
	return depth ? stack[depth - 1]->dev : -1;
}

/* ---- pointer queries and the export ---- */

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
				      CUdeviceptr ptr)
{
	struct fake_map *m;
	struct fake_res *r;
	CUresult rc = CUDA_SUCCESS;

	if (!data || mode_is("notdevice"))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	m = map_of(ptr);
	r = res_of(ptr);
	switch (attribute) {
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		if (m)
			*(int *)data = m->dev;
		else
			rc = CUDA_ERROR_INVALID_VALUE;
		break;
	case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
		if (m && !mode_is("nogdrattr"))
			*(bool *)data = m->gdr != 0;
		else
			rc = CUDA_ERROR_INVALID_VALUE;
		break;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		if (r)
			*(bool *)data = m != NULL;
		else
			rc = CUDA_ERROR_INVALID_VALUE;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		if (r)
			*(dptr_t *)data = r->base;
		else
			rc = CUDA_ERROR_INVALID_VALUE;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		if (r)
			*(size_t *)data = r->size;
		else
			rc = CUDA_ERROR_INVALID_VALUE;
		break;
	default:
		rc = CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

EXPORT CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size,
				     CUdeviceptr ptr)
{
	struct fake_map *m;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&lock);
	m = map_of(ptr);
	if (m) {
		if (base)
			*base = m->addr;
		if (size)
			*size = m->size;
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* Built with -DFAKE_CUDA_OLD (tests/fake_cuda/old/): a driver before CUDA
 * 11.7, without the dma-buf export. */
#ifndef FAKE_CUDA_OLD
EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr,
					      size_t size,
					      CUmemRangeHandleType type,
					      unsigned long long flags)
{
	struct fake_map *m, *first;
	struct fake_res *r;
	int fd, vgem = 0;
	CUresult rc;
	dptr_t p;

	export_calls++;
	if (!depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!handle || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD ||
	    (dptr | size) % PAGE || !size ||
	    (flags & ~CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE))
		return CUDA_ERROR_INVALID_VALUE;
	if (flags && mode_is("oldflags"))
		return CUDA_ERROR_INVALID_VALUE;
	if (flags && mode_is("nopcie"))
		return CUDA_ERROR_NOT_SUPPORTED;
	if (mode_is("export_fail"))
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&lock);
	rc = CUDA_ERROR_INVALID_VALUE;
	first = map_of(dptr);
	r = res_of(dptr);
	if (!first || !r || dptr + size > r->base + r->size)
		goto out;
	for (p = dptr; p < dptr + size; p = m->addr + m->size) {
		m = map_of(p);
		if (!m || m->dev != first->dev)
			goto out;
		vgem |= m->vgem_handle != 0;
	}
	last_ptr = dptr;
	last_size = size;
	last_flags = flags;
	last_ctx_dev = stack[depth - 1]->dev;
	exports++;
	if (vgem) {
		if (dptr != first->addr || size != first->size) {
			fprintf(stderr, "fake_cuda: vgem memory is exported "
				"as whole buffers only (0x%llx+%zu is not one "
				"buffer)\n", dptr, size);
			rc = CUDA_ERROR_NOT_SUPPORTED;
			goto out;
		}
		if (drmPrimeHandleToFD(vgem_fd, first->vgem_handle,
				       DRM_CLOEXEC | DRM_RDWR, &fd))
			goto out;
	} else {
		fd = memfd_create("fake-backing", MFD_CLOEXEC);
		if (fd < 0)
			goto out;
		if (ftruncate(fd, (off_t)size)) {
			close(fd);
			goto out;
		}
	}
	*(int *)handle = fd;
	rc = CUDA_SUCCESS;
	log_call("export");
out:
	pthread_mutex_unlock(&lock);
	return rc;
}

#endif /* FAKE_CUDA_OLD */

EXPORT CUresult cuGetErrorName(CUresult error, const char **str)
{
	if (mode_is("stub"))	/* the toolkit's stub: *str untouched */
		return CUDA_ERROR_STUB_LIBRARY;
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
	case CUDA_ERROR_INVALID_CONTEXT:
		*str = "CUDA_ERROR_INVALID_CONTEXT";
		return CUDA_SUCCESS;
	case CUDA_ERROR_NOT_SUPPORTED:
		*str = "CUDA_ERROR_NOT_SUPPORTED";
		return CUDA_SUCCESS;
	default:
		*str = NULL;
		return CUDA_ERROR_INVALID_VALUE;
	}
}

/* ---- the VMM calls: what an engine calls around a sleep ---- */

/* cuMemCreate's allocations: handle = index + 1. */
#define MAXALLOC 64
static struct {
	size_t size;
	int dev, gdr;
} allocs[MAXALLOC];

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size,
				    size_t alignment, CUdeviceptr addr,
				    unsigned long long flags)
{
	void *p;

	if (!ptr || flags || (alignment && alignment % PAGE))
		return CUDA_ERROR_INVALID_VALUE;
	p = fakecu_reserve(size, (void *)(uintptr_t)addr);
	if (!p && addr)         /* the hint is a hint */
		p = fakecu_reserve(size, NULL);
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	*ptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	struct fake_res *r;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	dptr_t p;

	pthread_mutex_lock(&lock);
	r = res_of(ptr);
	if (r && r->base == ptr && r->size == size) {
		for (p = ptr; p < ptr + size && !map_of(p); p += PAGE)
			;
		if (p >= ptr + size) {  /* nothing mapped in it */
			munmap((void *)(uintptr_t)ptr, size);
			memset(r, 0, sizeof(*r));
			rc = CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
			    const CUmemAllocationProp *prop,
			    unsigned long long flags)
{
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	int i;

	if (!handle || !prop || flags || !size || size % PAGE ||
	    prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	if (prop->location.id < 0 || prop->location.id >= ndev())
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&lock);
	for (i = 0; i < MAXALLOC && allocs[i].size; i++)
		;
	if (i < MAXALLOC) {
		allocs[i].size = size;
		allocs[i].dev = prop->location.id;
		allocs[i].gdr = prop->allocFlags.gpuDirectRDMACapable;
		*handle = (CUmemGenericAllocationHandle)i + 1;
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* The memory stays mapped where it is (the driver frees it at the last
 * unmap); the handle is gone. */
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	if (!handle || handle > MAXALLOC || !allocs[handle - 1].size)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	allocs[handle - 1].size = 0;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

/* The whole allocation, at offset 0 (all the fake models); new anonymous
 * memory (FAKE_CUDA_VGEM=1, in the VM: a vgem buffer, whose export is a
 * real dma-buf), no access until cuMemSetAccess. */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			 CUmemGenericAllocationHandle handle,
			 unsigned long long flags)
{
	int dev, gdr, rc;

	if (!handle || handle > MAXALLOC || offset || flags)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	dev = allocs[handle - 1].dev;
	gdr = allocs[handle - 1].gdr;
	rc = allocs[handle - 1].size == size ? 0 : -EINVAL;
	pthread_mutex_unlock(&lock);
	if (!rc)
		rc = map_new((void *)(uintptr_t)ptr, size, dev, gdr,
			     getenv("FAKE_CUDA_VGEM") &&
			     !strcmp(getenv("FAKE_CUDA_VGEM"), "1"));
	if (rc)
		return CUDA_ERROR_INVALID_VALUE;
	fakecu_note("map");
	return CUDA_SUCCESS;
}

/* Every mapping in [ptr, ptr+size) must lie in it whole, and there must
 * be one. FAKE_CUDA_MODE=unmap_fail: CUDA_ERROR_INVALID_VALUE, nothing
 * unmapped (a driver refusing the unmap). */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	struct fake_map *m;
	int i, n = 0;

	if (!size || (ptr | size) % PAGE || mode_is("unmap_fail"))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	for (i = 0; i < MAXMAP; i++) {
		m = &maps[i];
		if (!m->size || m->addr >= ptr + size ||
		    m->addr + m->size <= ptr)
			continue;
		if (m->addr < ptr || m->addr + m->size > ptr + size)
			goto out;
		n++;
	}
	for (i = 0; n && i < MAXMAP; i++)
		if (maps[i].size && maps[i].addr >= ptr &&
		    maps[i].addr < ptr + size)
			unmap_locked(&maps[i]);
	if (n) {
		log_call("unmap");
		rc = CUDA_SUCCESS;
	}
out:
	pthread_mutex_unlock(&lock);
	return rc;
}

/* Every byte mapped; one descriptor per device (the fake keeps the
 * flags of the last). */
EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
			       const CUmemAccessDesc *desc, size_t count)
{
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	struct fake_map *m;
	size_t i;
	dptr_t p;

	if (!desc || !count || !size || (ptr | size) % PAGE)
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < count; i++)
		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
		    desc[i].location.id < 0 || desc[i].location.id >= ndev() ||
		    desc[i].flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	for (p = ptr; p < ptr + size; p = m->addr + m->size)
		if (!(m = map_of(p)))
			goto out;
	for (p = ptr; p < ptr + size; p = m->addr + m->size) {
		m = map_of(p);
		m->access = desc[count - 1].flags;
	}
	log_call("access");
	rc = CUDA_SUCCESS;
out:
	pthread_mutex_unlock(&lock);
	return rc;
}

/* ---- cuGetProcAddress ---- */

/* The CUDA version of this fake driver. */
#define FAKE_DRIVER_VERSION 13000

#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
			  cuuint64_t flags);

/*
 * As the driver: @symbol is a base name; NULL in *pfn and SUCCESS for a
 * name it does not have or a @cudaVersion before the entry point's;
 * CUDA_ERROR_INVALID_VALUE for a version past the driver's or an unknown
 * flag. "cuGetProcAddress" is the 11.3 function before 12000, _v2 from
 * then on.
 */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn,
				    int cudaVersion, cuuint64_t flags,
				    CUdriverProcAddressQueryResult *status)
{
	static const struct {
		const char *name;
		int since;
		void *fn;
	} procs[] = {
		{ "cuGetProcAddress", 12000, (void *)cuGetProcAddress_v2 },
		{ "cuGetProcAddress", 11030, (void *)cuGetProcAddress },
		{ "cuMemMap", 10020, (void *)cuMemMap },
		{ "cuMemUnmap", 10020, (void *)cuMemUnmap },
		{ "cuMemSetAccess", 10020, (void *)cuMemSetAccess },
		{ "cuMemCreate", 10020, (void *)cuMemCreate },
		{ "cuMemRelease", 10020, (void *)cuMemRelease },
		{ "cuMemAddressReserve", 10020, (void *)cuMemAddressReserve },
		{ "cuMemAddressFree", 10020, (void *)cuMemAddressFree },
		{ "cuPointerGetAttribute", 4000, (void *)cuPointerGetAttribute },
	};
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	unsigned int i;

	if (!symbol || !pfn || cudaVersion > FAKE_DRIVER_VERSION ||
	    (flags & ~(cuuint64_t)3))
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	for (i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		if (strcmp(symbol, procs[i].name))
			continue;
		if (cudaVersion < procs[i].since) {
			st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
			continue;
		}
		*pfn = procs[i].fn;
		st = CU_GET_PROC_ADDRESS_SUCCESS;
		break;
	}
	if (status)
		*status = st;
	return CUDA_SUCCESS;
}

/* The CUDA 11.3 symbol (cuda.h declares it for the driver's build only). */
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
				 cuuint64_t flags)
{
	return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
