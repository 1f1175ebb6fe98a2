// SPDX-License-Identifier: MIT
/*
 * cuda.c - CUDA driver API, loaded with dlopen() at first use so that the
 * library loads and works on machines without CUDA. cuda.h is not needed:
 * the types, constants and prototypes are cuda_api.h's (cuda.h's names
 * behind a kvd_/KVD_ prefix), checked against the toolkit's cuda.h by
 * tests/lib/cuda_abi. Entry points whose cuda.h name is a macro for a
 * versioned symbol are looked up by that symbol (cuCtxPushCurrent ->
 * cuCtxPushCurrent_v2, ...: KVD_CUDA_LIB_CALLS).
 *
 * The library handle is per context (path from the options or the config's
 * cuda_library, default libcuda.so.1); dlopen() reference-counts it.
 *
 * Context: cuMemGetHandleForAddressRange needs a current CUDA context. An
 * export takes the device from the pointer, retains that device's primary
 * context once per kvdmabuf context (released at kvdmabuf_close()), and
 * pushes it around the driver calls, then pops it: any thread can add or
 * wake a region, whatever its own current context (restored afterwards).
 *
 * Checks before the export (each a named error instead of a failure deep in
 * the driver or the NIC): every byte of the range is mapped (walked one
 * mapping at a time with cuMemGetAddressRange, which returns the single
 * cuMemCreate mapping that holds a VMM pointer), on one device, and each
 * mapping is GPUDirect RDMA capable where the driver reports it.
 */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "cuda_export.h"
#include "internal.h"

/* Devices whose primary context is kept retained (ordinals below this). */
#define KVD_CUDA_MAX_DEV 64

struct kvd_cuda {
	void *dl;
#define KVD_CU_FIELD(name, symbol) kvd_##name##_fn *name;
	KVD_CUDA_LIB_CALLS(KVD_CU_FIELD)
#undef KVD_CU_FIELD
	/* primary contexts retained, by ordinal (dev[] is the CUdevice) */
	kvd_CUcontext primary[KVD_CUDA_MAX_DEV];
	kvd_CUdevice dev[KVD_CUDA_MAX_DEV];
	/* auto mapping: the driver refused the PCIe flag once, and flags 0
	 * then worked (an older driver): do not ask again */
	bool pcie_refused;
};

static const char *cu_name(struct kvd_cuda *cu, kvd_CUresult r)
{
	const char *s = NULL;

	if (cu->cuGetErrorName &&
	    cu->cuGetErrorName(r, &s) == KVD_CUDA_SUCCESS && s)
		return s;
	return "CUDA_ERROR_UNKNOWN";
}

/* The file dlopen() loaded for @path (found by the library search path). */
static const char *loaded_file(void *dl, const char *path)
{
	struct link_map *lm = NULL;

	if (dlinfo(dl, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name &&
	    lm->l_name[0])
		return lm->l_name;
	return path;
}

static int cuda_load(struct kvdmabuf_ctx *ctx)
{
	const char *path = ctx->cuda_library[0] ? ctx->cuda_library
						: "libcuda.so.1";
	const char *missing = NULL;
	struct kvd_cuda *cu;
	kvd_CUresult r;

	if (ctx->cuda)
		return 0;
	cu = calloc(1, sizeof(*cu));
	if (!cu)
		return kvd_err(ctx, -ENOMEM, "out of memory");
	dlerror();
	cu->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!cu->dl) {
		const char *e = dlerror();

		free(cu);
		return kvd_err(ctx, -ELIBACC, "CUDA driver library %s cannot "
			       "be loaded (%s): CUDA regions need the CUDA "
			       "driver", path, e ? e : "unknown error");
	}
#define NEED(name, symbol)                                            \
	if (!missing && !(*(void **)&cu->name = dlsym(cu->dl, #symbol)))  \
		missing = #symbol;
	KVD_CUDA_LIB_CALLS(NEED)
#undef NEED
	if (missing) {
		/* cuMemGetHandleForAddressRange: the one entry point that
		 * came last (CUDA 11.7); the others are there since 11.0 */
		kvd_err(ctx, -ELIBACC, "CUDA driver library %s lacks %s: a "
			"driver before CUDA 11.7? dma-buf export needs 11.7 or "
			"later", loaded_file(cu->dl, path), missing);
		dlclose(cu->dl);
		free(cu);
		return -ELIBACC;
	}
	r = cu->cuInit(0);
	if (r == KVD_CUDA_ERROR_STUB_LIBRARY) {
		/* what a container without the driver finds first when the
		 * toolkit's lib64/stubs is on its library path */
		kvd_err(ctx, -ELIBACC, "CUDA driver stub: no GPU driver on this "
			"machine (%s is the toolkit's stub libcuda, cuInit: "
			"CUDA_ERROR_STUB_LIBRARY; install the NVIDIA driver or "
			"set cuda_library)", loaded_file(cu->dl, path));
		dlclose(cu->dl);
		free(cu);
		return -ELIBACC;
	}
	if (r != KVD_CUDA_SUCCESS) {
		kvd_err(ctx, -ENODEV, "cuInit failed: %s (%u)", cu_name(cu, r),
			r);
		dlclose(cu->dl);
		free(cu);
		return -ENODEV;
	}
	ctx->cuda = cu;
	return 0;
}

void kvd_cuda_unload(struct kvdmabuf_ctx *ctx)
{
	struct kvd_cuda *cu = ctx->cuda;
	int i;

	if (!cu)
		return;
	for (i = 0; i < KVD_CUDA_MAX_DEV; i++)
		if (cu->primary[i])
			cu->cuDevicePrimaryCtxRelease(cu->dev[i]);
	dlclose(cu->dl);
	free(cu);
	ctx->cuda = NULL;
}

/* Make the primary context of device @ordinal current (pushed). */
static int push_primary(struct kvdmabuf_ctx *ctx, int ordinal, bool *retained)
{
	struct kvd_cuda *cu = ctx->cuda;
	kvd_CUcontext pctx = NULL;
	kvd_CUdevice dev;
	kvd_CUresult r;
	int supported = 0;

	*retained = false;
	if (ordinal >= 0 && ordinal < KVD_CUDA_MAX_DEV &&
	    cu->primary[ordinal]) {
		pctx = cu->primary[ordinal];
		dev = cu->dev[ordinal];
	} else {
		r = cu->cuDeviceGet(&dev, ordinal);
		if (r != KVD_CUDA_SUCCESS)
			return kvd_err(ctx, -ENODEV, "cuDeviceGet(%d) failed: "
				       "%s (%u)", ordinal, cu_name(cu, r), r);
		r = cu->cuDeviceGetAttribute(&supported,
					     KVD_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
					     dev);
		if (r != KVD_CUDA_SUCCESS)
			return kvd_err(ctx, -ENODEV, "cuDeviceGetAttribute(DMA_"
				       "BUF_SUPPORTED) failed on device %d: %s "
				       "(%u)", ordinal, cu_name(cu, r), r);
		if (!supported)
			return kvd_err(ctx, -ENODEV, "CUDA device %d has no "
				       "dma-buf support (CU_DEVICE_ATTRIBUTE_"
				       "DMA_BUF_SUPPORTED is 0; open kernel "
				       "modules needed)", ordinal);
		r = cu->cuDevicePrimaryCtxRetain(&pctx, dev);
		if (r != KVD_CUDA_SUCCESS)
			return kvd_err(ctx, -ENODEV, "cuDevicePrimaryCtxRetain"
				       "(device %d) failed: %s (%u)", ordinal,
				       cu_name(cu, r), r);
		if (ordinal < KVD_CUDA_MAX_DEV) {
			cu->primary[ordinal] = pctx;
			cu->dev[ordinal] = dev;
		} else {
			*retained = true;       /* released after this call */
		}
	}
	r = cu->cuCtxPushCurrent(pctx);
	if (r != KVD_CUDA_SUCCESS) {
		if (*retained)
			cu->cuDevicePrimaryCtxRelease(dev);
		*retained = false;
		return kvd_err(ctx, -ENODEV, "cuCtxPushCurrent(primary context "
			       "of device %d) failed: %s (%u)", ordinal,
			       cu_name(cu, r), r);
	}
	return 0;
}

static void pop_primary(struct kvdmabuf_ctx *ctx, int ordinal, bool retained)
{
	struct kvd_cuda *cu = ctx->cuda;
	kvd_CUcontext popped;
	kvd_CUdevice dev;

	cu->cuCtxPopCurrent(&popped);
	if (retained && cu->cuDeviceGet(&dev, ordinal) == KVD_CUDA_SUCCESS)
		cu->cuDevicePrimaryCtxRelease(dev);
}

/* A boolean pointer attribute: 1 or 0, or -1 when the query failed. */
static int ptr_flag(struct kvd_cuda *cu, kvd_CUpointer_attribute attr,
		    kvd_CUdeviceptr p, kvd_CUresult *rp)
{
	int v = 0;       /* the driver writes a C bool: only the low byte */
	kvd_CUresult r = cu->cuPointerGetAttribute(&v, attr, p);

	if (rp)
		*rp = r;
	if (r != KVD_CUDA_SUCCESS)
		return -1;
	return (v & 0xff) != 0;
}

static const char *order_hint =
	"sleep must come before cuMemUnmap/cuMemRelease, and wake after "
	"cuMemMap of new memory at the same addresses";

/*
 * Walk [addr, addr+len) one mapping at a time: every byte mapped, one
 * device (@ordinal, from the first byte), each mapping GPUDirect RDMA
 * capable where the driver reports it.
 */
static int check_range(struct kvdmabuf_ctx *ctx, kvd_CUdeviceptr addr,
		       size_t len, int ordinal)
{
	struct kvd_cuda *cu = ctx->cuda;
	kvd_CUdeviceptr p = addr, end = addr + len, base;
	size_t size;
	kvd_CUresult r;
	int mapped, dev, gdr;

	while (p < end) {
		mapped = ptr_flag(cu, KVD_CU_POINTER_ATTRIBUTE_MAPPED, p, NULL);
		if (mapped == 0 || (mapped < 0 && p != addr))
			return kvd_err(ctx, -EFAULT, "CUDA range 0x%llx+%zu is "
				       "not fully mapped: the mapping ends at "
				       "0x%llx (offset %llu; %s)", addr, len,
				       p, p - addr, order_hint);
		dev = -1;
		r = cu->cuPointerGetAttribute(&dev,
					      KVD_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
					      p);
		if (r != KVD_CUDA_SUCCESS)
			return kvd_err(ctx, -EFAULT, "cuPointerGetAttribute"
				       "(0x%llx, DEVICE_ORDINAL) failed: %s "
				       "(%u): the mapping of 0x%llx+%zu ends "
				       "there (%s)", p, cu_name(cu, r), r,
				       addr, len, order_hint);
		if (dev != ordinal)
			return kvd_err(ctx, -EINVAL, "CUDA range 0x%llx+%zu "
				       "spans devices %d and %d (at 0x%llx): a "
				       "dma-buf export covers one device; add "
				       "one region per device", addr, len,
				       ordinal, dev, p);
		gdr = ptr_flag(cu, KVD_CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
			       p, NULL);
		if (gdr == 0)   /* -1: not reported by this driver, go on */
			return kvd_err(ctx, -EOPNOTSUPP, "CUDA memory at 0x%llx "
				       "(region 0x%llx+%zu) is not GPUDirect "
				       "RDMA capable (CU_POINTER_ATTRIBUTE_IS_"
				       "GPU_DIRECT_RDMA_CAPABLE is 0): create "
				       "it with cuMemCreate and CUmemAllocation"
				       "Prop.allocFlags.gpuDirectRDMACapable = "
				       "1", p, addr, len);
		r = cu->cuMemGetAddressRange(&base, &size, p);
		if (r != KVD_CUDA_SUCCESS || base > p || base + size <= p)
			break;  /* cannot walk on: the export decides */
		p = base + size;
	}
	return 0;
}

/* After a failed export: name a range that leaves its VA reservation. */
static void diagnose_reservation(struct kvdmabuf_ctx *ctx, kvd_CUdeviceptr addr,
				 size_t len, int *rc)
{
	struct kvd_cuda *cu = ctx->cuda;
	kvd_CUdeviceptr start = 0;
	size_t size = 0;
	char *m = kvd_msg(ctx);
	size_t n;

	if (cu->cuPointerGetAttribute(&start,
				      KVD_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
				      addr) != KVD_CUDA_SUCCESS ||
	    cu->cuPointerGetAttribute(&size, KVD_CU_POINTER_ATTRIBUTE_RANGE_SIZE,
				      addr) != KVD_CUDA_SUCCESS ||
	    !size || start > addr || addr + len <= start + size)
		return;
	n = strlen(m);
	snprintf(m + n, KVD_ERRMAX - n, "; the range crosses the end of its "
		 "VA reservation (0x%llx+%zu) at 0x%llx: one region per "
		 "cuMemAddressReserve range", start, size, start + size);
	*rc = -EINVAL;
}

int kvd_cuda_export(struct kvdmabuf_ctx *ctx, void *addr, size_t len,
		    int *fd)
{
	kvd_CUdeviceptr dptr = (kvd_CUdeviceptr)(uintptr_t)addr;
	unsigned long long flags;
	struct kvd_cuda *cu;
	int ordinal = -1, handle = -1, mapped;
	bool retained;
	kvd_CUresult r, rm;
	int rc;

	rc = cuda_load(ctx);
	if (rc)
		return rc;
	cu = ctx->cuda;
	r = cu->cuPointerGetAttribute(&ordinal,
				      KVD_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr);
	if (r != KVD_CUDA_SUCCESS) {
		/* reserved but not mapped (a wake before cuMemMap), or no
		 * CUDA memory at all */
		mapped = ptr_flag(cu, KVD_CU_POINTER_ATTRIBUTE_MAPPED, dptr, &rm);
		if (mapped == 0)
			return kvd_err(ctx, -EFAULT, "no CUDA memory is mapped "
				       "at %p (its VA is reserved): %s",
				       addr, order_hint);
		return kvd_err(ctx, -EINVAL, "cuPointerGetAttribute(%p, "
			       "DEVICE_ORDINAL) failed: %s (%u): not CUDA "
			       "device memory?", addr, cu_name(cu, r), r);
	}
	rc = push_primary(ctx, ordinal, &retained);
	if (rc)
		return rc;
	rc = check_range(ctx, dptr, len, ordinal);
	if (rc)
		goto out;
	r = kvd_cuda_export_range(cu->cuMemGetHandleForAddressRange,
				  ctx->cfg.cuda_mapping, &cu->pcie_refused,
				  dptr, len, &handle, &flags);
	if (r != KVD_CUDA_SUCCESS) {
		rc = kvd_err(ctx, -EIO, "cuMemGetHandleForAddressRange(%p, "
			     "%zu, DMA_BUF_FD, flags 0x%llx%s) failed on "
			     "device %d: %s (%u)", addr, len, flags,
			     flags ? " = DMA_BUF_MAPPING_TYPE_PCIE" : "",
			     ordinal, cu_name(cu, r), r);
		if (flags)
			snprintf(kvd_msg(ctx) + strlen(kvd_msg(ctx)),
				 KVD_ERRMAX - strlen(kvd_msg(ctx)),
				 " (cuda_dmabuf_mapping: pcie needs CUDA "
				 "12.8+; 'auto' falls back to flags 0)");
		diagnose_reservation(ctx, dptr, len, &rc);
		goto out;
	}
	if (handle < 0) {
		rc = kvd_err(ctx, -EIO, "cuMemGetHandleForAddressRange "
			     "returned no fd");
		goto out;
	}
	*fd = handle;
	ctx->cuda_export_flags = flags;
out:
	pop_primary(ctx, ordinal, retained);
	return rc;
}

/*
 * The length of the piece of [addr, addr+len) that one mapping (one
 * cuMemCreate allocation) holds from @addr on: a dma-buf of several
 * allocations holds them all until it goes, so a range of an elastic pool
 * is exported one allocation at a time. Where the driver cannot tell
 * (cuMemGetAddressRange fails), the rest of the range.
 */
int kvd_cuda_piece(struct kvdmabuf_ctx *ctx, void *addr, size_t len,
		   size_t *piece)
{
	kvd_CUdeviceptr p = (kvd_CUdeviceptr)(uintptr_t)addr, base;
	size_t size;
	int rc;

	rc = cuda_load(ctx);
	if (rc)
		return rc;
	*piece = len;
	if (ctx->cuda->cuMemGetAddressRange(&base, &size, p) ==
	    KVD_CUDA_SUCCESS && base <= p && base + size > p &&
	    base + size - p < len)
		*piece = base + size - p;
	return 0;
}

/*
 * For `kvdmabuf check`: the CUDA devices the driver at @path (NULL: the
 * default) reports, and which of them export dma-bufs (bit i of *dmabuf).
 * No context is created.
 */
int kvd_cuda_survey(const char *path, unsigned int *ndev, uint64_t *dmabuf,
		    char *err, size_t errlen)
{
	struct kvdmabuf_ctx c;
	unsigned int i;
	int rc;

	memset(&c, 0, sizeof(c));
	snprintf(c.cuda_library, sizeof(c.cuda_library), "%s",
		 path ? path : "");
	*ndev = 0;
	*dmabuf = 0;
	rc = cuda_load(&c);
	if (rc) {
		snprintf(err, errlen, "%s", kvd_msg(&c));
		kvd_msg(NULL);
		return rc;
	}
	for (i = 0; i < KVD_CUDA_MAX_DEV; i++) {
		kvd_CUdevice d;
		int sup = 0;

		if (c.cuda->cuDeviceGet(&d, (int)i) != KVD_CUDA_SUCCESS)
			break;
		if (c.cuda->cuDeviceGetAttribute(&sup,
				KVD_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d) ==
		    KVD_CUDA_SUCCESS && sup)
			*dmabuf |= 1ull << i;
	}
	*ndev = i;
	kvd_cuda_unload(&c);
	kvd_msg(NULL);
	return 0;
}
