// SPDX-License-Identifier: MIT
/*
 * cuda.c - CUDA driver API, loaded with dlopen() at first use so that the
 * library loads and works on machines without CUDA. cuda.h is not needed:
 * the few types and constants are declared here with the values of the
 * CUDA driver API headers (cuda.h, CUDA 11.7+):
 *   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL     = 9
 *   CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED   = 124
 *   CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD     = 1
 *
 * The library handle is per context (path from the options or the config's
 * cuda_library, default libcuda.so.1); dlopen() reference-counts it.
 *
 * The calling thread must have the CUDA context of the memory current, as
 * for any driver API call of the engine.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

#define CUDA_SUCCESS 0
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1

struct kvd_cuda {
	void *dl;
	CUresult (*cuInit)(unsigned int flags);
	CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
	CUresult (*cuDeviceGetAttribute)(int *pi, int attrib, CUdevice dev);
	CUresult (*cuPointerGetAttribute)(void *data, int attribute,
					  CUdeviceptr ptr);
	CUresult (*cuMemGetHandleForAddressRange)(void *handle,
						  CUdeviceptr dptr,
						  size_t size, int type,
						  unsigned long long flags);
	CUresult (*cuGetErrorName)(CUresult error, const char **str);
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
	if (!LOAD(cu, cuInit) || !LOAD(cu, cuDeviceGet) ||
	    !LOAD(cu, cuDeviceGetAttribute) || !LOAD(cu, cuPointerGetAttribute) ||
	    !LOAD(cu, cuMemGetHandleForAddressRange) ||
	    !LOAD(cu, cuGetErrorName)) {
		kvd_err(ctx, -ELIBACC, "CUDA driver library %s lacks %s "
			"(driver too old for dma-buf export?)", path,
			!cu->cuInit ? "cuInit" :
			!cu->cuDeviceGet ? "cuDeviceGet" :
			!cu->cuDeviceGetAttribute ? "cuDeviceGetAttribute" :
			!cu->cuPointerGetAttribute ? "cuPointerGetAttribute" :
			!cu->cuMemGetHandleForAddressRange ?
			"cuMemGetHandleForAddressRange" : "cuGetErrorName");
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
	if (!ctx->cuda)
		return;
	dlclose(ctx->cuda->dl);
	free(ctx->cuda);
	ctx->cuda = NULL;
}

int kvd_cuda_export(struct kvdmabuf_ctx *ctx, void *addr, size_t len,
		    int *fd)
{
	CUdeviceptr dptr = (CUdeviceptr)(uintptr_t)addr;
	struct kvd_cuda *cu;
	int ordinal = -1, supported = 0, handle = -1;
	CUdevice dev;
	CUresult r;
	int rc;

	rc = cuda_load(ctx);
	if (rc)
		return rc;
	cu = ctx->cuda;
	r = cu->cuPointerGetAttribute(&ordinal,
				      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr);
	if (r != CUDA_SUCCESS)
		return kvd_err(ctx, -EINVAL, "cuPointerGetAttribute(%p, "
			       "DEVICE_ORDINAL) failed: %s (%d): not CUDA "
			       "device memory?", addr, cu_name(cu, r), r);
	r = cu->cuDeviceGet(&dev, ordinal);
	if (r != CUDA_SUCCESS)
		return kvd_err(ctx, -ENODEV, "cuDeviceGet(%d) failed: %s (%d)",
			       ordinal, cu_name(cu, r), r);
	r = cu->cuDeviceGetAttribute(&supported,
				     CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
				     dev);
	if (r != CUDA_SUCCESS)
		return kvd_err(ctx, -ENODEV, "cuDeviceGetAttribute(DMA_BUF_"
			       "SUPPORTED) failed on device %d: %s (%d)",
			       ordinal, cu_name(cu, r), r);
	if (!supported)
		return kvd_err(ctx, -ENODEV, "CUDA device %d has no dma-buf "
			       "support (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED "
			       "is 0; open kernel modules needed)", ordinal);
	/* exactly the requested range, flags 0 (the safe default) */
	r = cu->cuMemGetHandleForAddressRange(&handle, dptr, len,
					      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
					      0);
	if (r != CUDA_SUCCESS)
		return kvd_err(ctx, -EIO, "cuMemGetHandleForAddressRange(%p, "
			       "%zu, DMA_BUF_FD) failed: %s (%d)", addr, len,
			       cu_name(cu, r), r);
	if (handle < 0)
		return kvd_err(ctx, -EIO, "cuMemGetHandleForAddressRange "
			       "returned no fd");
	*fd = handle;
	return 0;
}
