// SPDX-License-Identifier: MIT
/*
 * cuda.c - CUDA driver API, loaded with dlopen() at first use so that the
 * library loads and works on machines without CUDA. cuda.h is not needed:
 * the few types and constants are declared here with the values of the
 * CUDA driver API headers (cuda.h, CUDA 11.7+; the PCIe mapping flag is
 * CUDA 12.8+):
 *   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL             = 9
 *   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR           = 11 (VA reservation)
 *   CU_POINTER_ATTRIBUTE_RANGE_SIZE                 = 12
 *   CU_POINTER_ATTRIBUTE_MAPPED                     = 13 (boolean)
 *   CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 15 (boolean)
 *   CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED           = 124
 *   CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD             = 1
 *   CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE     = 0x1
 * Entry points whose cuda.h name is a macro for a versioned symbol are
 * looked up by that symbol (cuCtxPushCurrent -> cuCtxPushCurrent_v2, ...).
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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_POINTER_ATTRIBUTE_MAPPED 13
#define CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE 15
#define CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1
#define CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE 0x1ull

/* Devices whose primary context is kept retained (ordinals below this). */
#define KVD_CUDA_MAX_DEV 64

struct kvd_cuda {
	void *dl;
	CUresult (*cuInit)(unsigned int flags);
	CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
	CUresult (*cuDeviceGetAttribute)(int *pi, int attrib, CUdevice dev);
	CUresult (*cuPointerGetAttribute)(void *data, int attribute,
					  CUdeviceptr ptr);
	CUresult (*cuMemGetAddressRange_v2)(CUdeviceptr *base, size_t *size,
					    CUdeviceptr ptr);
	CUresult (*cuMemGetHandleForAddressRange)(void *handle,
						  CUdeviceptr dptr,
						  size_t size, int type,
						  unsigned long long flags);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *pctx, CUdevice dev);
	CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice dev);
	CUresult (*cuCtxPushCurrent_v2)(CUcontext ctx);
	CUresult (*cuCtxPopCurrent_v2)(CUcontext *pctx);
	CUresult (*cuGetErrorName)(CUresult error, const char **str);
	/* primary contexts retained, by ordinal (dev[] is the CUdevice) */
	CUcontext primary[KVD_CUDA_MAX_DEV];
	CUdevice dev[KVD_CUDA_MAX_DEV];
	/* auto mapping: the driver refused the PCIe flag once, and flags 0
	 * then worked (an older driver): do not ask again */
	bool pcie_refused;
};

static const char *cu_name(struct kvd_cuda *cu, CUresult r)
{
	const char *s = NULL;

	if (cu->cuGetErrorName && cu->cuGetErrorName(r, &s) == CUDA_SUCCESS &&
	    s)
		return s;
	return "CUDA_ERROR_UNKNOWN";
}

#define LOAD(cu, sym) \
	((*(void **)&(cu)->sym = dlsym((cu)->dl, #sym)) != NULL)

static int cuda_load(struct kvdmabuf_ctx *ctx)
{
	const char *path = ctx->cuda_library[0] ? ctx->cuda_library
						: "libcuda.so.1";
	const char *missing = NULL;
	struct kvd_cuda *cu;
	CUresult r;

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
#define NEED(sym) do { if (!missing && !LOAD(cu, sym)) missing = #sym; } while (0)
	NEED(cuInit);
	NEED(cuDeviceGet);
	NEED(cuDeviceGetAttribute);
	NEED(cuPointerGetAttribute);
	NEED(cuMemGetAddressRange_v2);
	NEED(cuMemGetHandleForAddressRange);
	NEED(cuDevicePrimaryCtxRetain);
	NEED(cuDevicePrimaryCtxRelease_v2);
	NEED(cuCtxPushCurrent_v2);
	NEED(cuCtxPopCurrent_v2);
	NEED(cuGetErrorName);
#undef NEED
	if (missing) {
		kvd_err(ctx, -ELIBACC, "CUDA driver library %s lacks %s "
			"(driver too old for dma-buf export?)", path, missing);
		dlclose(cu->dl);
		free(cu);
		return -ELIBACC;
	}
	r = cu->cuInit(0);
	if (r != CUDA_SUCCESS) {
		kvd_err(ctx, -ENODEV, "cuInit failed: %s (%d)", cu_name(cu, r),
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
			cu->cuDevicePrimaryCtxRelease_v2(cu->dev[i]);
	dlclose(cu->dl);
	free(cu);
	ctx->cuda = NULL;
}

/* Make the primary context of device @ordinal current (pushed). */
static int push_primary(struct kvdmabuf_ctx *ctx, int ordinal, bool *retained)
{
	struct kvd_cuda *cu = ctx->cuda;
	CUcontext pctx = NULL;
	CUdevice dev;
	CUresult r;
	int supported = 0;

	*retained = false;
	if (ordinal >= 0 && ordinal < KVD_CUDA_MAX_DEV &&
	    cu->primary[ordinal]) {
		pctx = cu->primary[ordinal];
		dev = cu->dev[ordinal];
	} else {
		r = cu->cuDeviceGet(&dev, ordinal);
		if (r != CUDA_SUCCESS)
			return kvd_err(ctx, -ENODEV, "cuDeviceGet(%d) failed: "
				       "%s (%d)", ordinal, cu_name(cu, r), r);
		r = cu->cuDeviceGetAttribute(&supported,
					     CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
					     dev);
		if (r != CUDA_SUCCESS)
			return kvd_err(ctx, -ENODEV, "cuDeviceGetAttribute(DMA_"
				       "BUF_SUPPORTED) failed on device %d: %s "
				       "(%d)", ordinal, cu_name(cu, r), r);
		if (!supported)
			return kvd_err(ctx, -ENODEV, "CUDA device %d has no "
				       "dma-buf support (CU_DEVICE_ATTRIBUTE_"
				       "DMA_BUF_SUPPORTED is 0; open kernel "
				       "modules needed)", ordinal);
		r = cu->cuDevicePrimaryCtxRetain(&pctx, dev);
		if (r != CUDA_SUCCESS)
			return kvd_err(ctx, -ENODEV, "cuDevicePrimaryCtxRetain"
				       "(device %d) failed: %s (%d)", ordinal,
				       cu_name(cu, r), r);
		if (ordinal < KVD_CUDA_MAX_DEV) {
			cu->primary[ordinal] = pctx;
			cu->dev[ordinal] = dev;
		} else {
			*retained = true;       /* released after this call */
		}
	}
	r = cu->cuCtxPushCurrent_v2(pctx);
	if (r != CUDA_SUCCESS) {
		if (*retained)
			cu->cuDevicePrimaryCtxRelease_v2(dev);
		*retained = false;
		return kvd_err(ctx, -ENODEV, "cuCtxPushCurrent(primary context "
			       "of device %d) failed: %s (%d)", ordinal,
			       cu_name(cu, r), r);
	}
	return 0;
}

static void pop_primary(struct kvdmabuf_ctx *ctx, int ordinal, bool retained)
{
	struct kvd_cuda *cu = ctx->cuda;
	CUcontext popped;
	CUdevice dev;

	cu->cuCtxPopCurrent_v2(&popped);
	if (retained && cu->cuDeviceGet(&dev, ordinal) == CUDA_SUCCESS)
		cu->cuDevicePrimaryCtxRelease_v2(dev);
}

/* A boolean pointer attribute: 1 or 0, or -1 when the query failed. */
static int ptr_flag(struct kvd_cuda *cu, int attr, CUdeviceptr p, CUresult *rp)
{
	int v = 0;       /* the driver writes a C bool: only the low byte */
	CUresult r = cu->cuPointerGetAttribute(&v, attr, p);

	if (rp)
		*rp = r;
	if (r != CUDA_SUCCESS)
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
static int check_range(struct kvdmabuf_ctx *ctx, CUdeviceptr addr,
		       size_t len, int ordinal)
{
	struct kvd_cuda *cu = ctx->cuda;
	CUdeviceptr p = addr, end = addr + len, base;
	size_t size;
	CUresult r;
	int mapped, dev, gdr;

	while (p < end) {
		mapped = ptr_flag(cu, CU_POINTER_ATTRIBUTE_MAPPED, p, NULL);
		if (mapped == 0 || (mapped < 0 && p != addr))
			return kvd_err(ctx, -EFAULT, "CUDA range 0x%llx+%zu is "
				       "not fully mapped: the mapping ends at "
				       "0x%llx (offset %llu; %s)", addr, len,
				       p, p - addr, order_hint);
		dev = -1;
		r = cu->cuPointerGetAttribute(&dev,
					      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
					      p);
		if (r != CUDA_SUCCESS)
			return kvd_err(ctx, -EFAULT, "cuPointerGetAttribute"
				       "(0x%llx, DEVICE_ORDINAL) failed: %s "
				       "(%d): the mapping of 0x%llx+%zu ends "
				       "there (%s)", p, cu_name(cu, r), r,
				       addr, len, order_hint);
		if (dev != ordinal)
			return kvd_err(ctx, -EINVAL, "CUDA range 0x%llx+%zu "
				       "spans devices %d and %d (at 0x%llx): a "
				       "dma-buf export covers one device; add "
				       "one region per device", addr, len,
				       ordinal, dev, p);
		gdr = ptr_flag(cu, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
			       p, NULL);
		if (gdr == 0)   /* -1: not reported by this driver, go on */
			return kvd_err(ctx, -EOPNOTSUPP, "CUDA memory at 0x%llx "
				       "(region 0x%llx+%zu) is not GPUDirect "
				       "RDMA capable (CU_POINTER_ATTRIBUTE_IS_"
				       "GPU_DIRECT_RDMA_CAPABLE is 0): create "
				       "it with cuMemCreate and CUmemAllocation"
				       "Prop.allocFlags.gpuDirectRDMACapable = "
				       "1", p, addr, len);
		r = cu->cuMemGetAddressRange_v2(&base, &size, p);
		if (r != CUDA_SUCCESS || base > p || base + size <= p)
			break;  /* cannot walk on: the export decides */
		p = base + size;
	}
	return 0;
}

/* After a failed export: name a range that leaves its VA reservation. */
static void diagnose_reservation(struct kvdmabuf_ctx *ctx, CUdeviceptr addr,
				 size_t len, int *rc)
{
	struct kvd_cuda *cu = ctx->cuda;
	CUdeviceptr start = 0;
	size_t size = 0;
	char *m = kvd_msg(ctx);
	size_t n;

	if (cu->cuPointerGetAttribute(&start,
				      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
				      addr) != CUDA_SUCCESS ||
	    cu->cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
				      addr) != CUDA_SUCCESS ||
	    !size || start > addr || addr + len <= start + size)
		return;
	n = strlen(m);
	snprintf(m + n, KVD_ERRMAX - n, "; the range crosses the end of its "
		 "VA reservation (0x%llx+%zu) at 0x%llx: one region per "
		 "cuMemAddressReserve range", start, size, start + size);
	*rc = -EINVAL;
}

static CUresult export_range(struct kvd_cuda *cu, int mapping,
			     CUdeviceptr dptr, size_t len, int *handle,
			     unsigned long long *flags)
{
	CUresult r;

	*flags = 0;
	if (mapping == KVD_CUDA_MAPPING_PCIE ||
	    (mapping == KVD_CUDA_MAPPING_AUTO && !cu->pcie_refused))
		*flags = CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE;
	r = cu->cuMemGetHandleForAddressRange(handle, dptr, len,
					      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
					      *flags);
	if (r == CUDA_SUCCESS || mapping != KVD_CUDA_MAPPING_AUTO || !*flags ||
	    (r != CUDA_ERROR_NOT_SUPPORTED && r != CUDA_ERROR_INVALID_VALUE))
		return r;
	/* a driver before CUDA 12.8 or a GPU without the PCIe mapping */
	*flags = 0;
	r = cu->cuMemGetHandleForAddressRange(handle, dptr, len,
					      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
					      0);
	if (r == CUDA_SUCCESS)
		cu->pcie_refused = true;
	return r;
}

int kvd_cuda_export(struct kvdmabuf_ctx *ctx, void *addr, size_t len,
		    int *fd)
{
	CUdeviceptr dptr = (CUdeviceptr)(uintptr_t)addr;
	unsigned long long flags;
	struct kvd_cuda *cu;
	int ordinal = -1, handle = -1, mapped;
	bool retained;
	CUresult r, rm;
	int rc;

	rc = cuda_load(ctx);
	if (rc)
		return rc;
	cu = ctx->cuda;
	r = cu->cuPointerGetAttribute(&ordinal,
				      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr);
	if (r != CUDA_SUCCESS) {
		/* reserved but not mapped (a wake before cuMemMap), or no
		 * CUDA memory at all */
		mapped = ptr_flag(cu, CU_POINTER_ATTRIBUTE_MAPPED, dptr, &rm);
		if (mapped == 0)
			return kvd_err(ctx, -EFAULT, "no CUDA memory is mapped "
				       "at %p (its VA is reserved): %s",
				       addr, order_hint);
		return kvd_err(ctx, -EINVAL, "cuPointerGetAttribute(%p, "
			       "DEVICE_ORDINAL) failed: %s (%d): not CUDA "
			       "device memory?", addr, cu_name(cu, r), r);
	}
	rc = push_primary(ctx, ordinal, &retained);
	if (rc)
		return rc;
	rc = check_range(ctx, dptr, len, ordinal);
	if (rc)
		goto out;
	r = export_range(cu, ctx->cfg.cuda_mapping, dptr, len, &handle,
			 &flags);
	if (r != CUDA_SUCCESS) {
		rc = kvd_err(ctx, -EIO, "cuMemGetHandleForAddressRange(%p, "
			     "%zu, DMA_BUF_FD, flags 0x%llx%s) failed on "
			     "device %d: %s (%d)", addr, len, flags,
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
		CUdevice d;
		int sup = 0;

		if (c.cuda->cuDeviceGet(&d, (int)i) != CUDA_SUCCESS)
			break;
		if (c.cuda->cuDeviceGetAttribute(&sup,
				CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d) ==
		    CUDA_SUCCESS && sup)
			*dmabuf |= 1ull << i;
	}
	*ndev = i;
	kvd_cuda_unload(&c);
	kvd_msg(NULL);
	return 0;
}
