/* SPDX-License-Identifier: MIT */
/*
 * cuda_api.h - the part of the CUDA driver API that kvdmabuf uses, declared
 * here so that the library builds without the CUDA toolkit (libcuda is
 * opened with dlopen() at run time). Not installed.
 *
 * Every name is cuda.h's with a kvd_ (types, entry points) or KVD_
 * (constants) prefix, so that tests/lib/cuda_abi can include this header beside
 * the toolkit's cuda.h and check, one by one, that each value, struct
 * layout and prototype is NVIDIA's. Users: lib/cuda.c (the library's
 * calls), tests/fake_cuda (the fake driver, where no toolkit is installed)
 * and tests/hw/cuda_vmm (the hardware test's VMM calls), the last two
 * through tests/cuda_compat.h, which gives them cuda.h's own names.
 *
 * C types: cuda.h's enums (CUresult, CUdevice_attribute, ...) have no
 * negative value, so GCC and Clang give them unsigned int as compatible
 * type; they are declared unsigned int here, which makes the prototypes
 * below compatible, in the C sense, with cuda.h's.
 *
 * Values as of cuda.h 11.7 (cuMemGetHandleForAddressRange and
 * CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED appeared then), the PCIe mapping
 * flag 12.8; checked against the toolkit's cuda.h by tests/lib/cuda_abi.
 */
#ifndef KVDMABUF_CUDA_API_H
#define KVDMABUF_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

/* ---- types ---- */
typedef unsigned int kvd_CUresult;              /* enum cudaError_enum */
typedef int kvd_CUdevice;
typedef unsigned long long kvd_CUdeviceptr;     /* 64-bit builds */
typedef struct CUctx_st *kvd_CUcontext;         /* cuda.h's struct tag */
typedef unsigned int kvd_CUdevice_attribute;    /* enum */
typedef unsigned int kvd_CUpointer_attribute;   /* enum */
typedef unsigned int kvd_CUmemRangeHandleType;  /* enum */
typedef unsigned long long kvd_CUmemGenericAllocationHandle;
typedef unsigned int kvd_CUmemAllocationGranularity_flags; /* enum */
typedef uint64_t kvd_cuuint64_t;
typedef unsigned int kvd_CUdriverProcAddressQueryResult; /* enum */

/* cuMemCreate's description of an allocation (tests/hw only). */
typedef struct {
	unsigned int type;              /* CUmemLocationType */
	int id;
} kvd_CUmemLocation;

typedef struct {
	unsigned int type;              /* CUmemAllocationType */
	unsigned int requestedHandleTypes; /* CUmemAllocationHandleType */
	kvd_CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} kvd_CUmemAllocationProp;

typedef struct {
	kvd_CUmemLocation location;
	unsigned int flags;             /* CUmemAccess_flags */
} kvd_CUmemAccessDesc;

/* ---- CUresult values ---- */
#define KVD_CUDA_SUCCESS 0
#define KVD_CUDA_ERROR_INVALID_VALUE 1
/* Every call of NVIDIA's link-time stub libcuda.so (the toolkit's
 * lib64/stubs, found first in containers without a driver) returns this. */
#define KVD_CUDA_ERROR_STUB_LIBRARY 34
#define KVD_CUDA_ERROR_NO_DEVICE 100
#define KVD_CUDA_ERROR_INVALID_DEVICE 101
#define KVD_CUDA_ERROR_INVALID_CONTEXT 201
#define KVD_CUDA_ERROR_NOT_PERMITTED 800
#define KVD_CUDA_ERROR_NOT_SUPPORTED 801

/* ---- attributes, handle types, flags ---- */
#define KVD_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9       /* int */
/* RANGE_START_ADDR: the VA reservation holding the pointer */
#define KVD_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11    /* CUdeviceptr */
#define KVD_CU_POINTER_ATTRIBUTE_RANGE_SIZE 12          /* size_t */
#define KVD_CU_POINTER_ATTRIBUTE_MAPPED 13              /* a C bool */
#define KVD_CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE 15 /* a C bool */
#define KVD_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED 110
#define KVD_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124
#define KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1
#define KVD_CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE 0x1ull
/* cuMemCreate, cuMemSetAccess, cuMemGetAllocationGranularity (tests/hw) */
#define KVD_CU_MEM_ALLOCATION_TYPE_PINNED 1
#define KVD_CU_MEM_LOCATION_TYPE_DEVICE 1
#define KVD_CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
#define KVD_CU_MEM_ALLOC_GRANULARITY_MINIMUM 0
/* cuGetProcAddress: flags (CUdriverProcAddress_flags; the preload passes
 * them through) and the result (CUdriverProcAddressQueryResult) */
#define KVD_CU_GET_PROC_ADDRESS_DEFAULT 0
#define KVD_CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define KVD_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define KVD_CU_GET_PROC_ADDRESS_SUCCESS 0
#define KVD_CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define KVD_CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

/* ---- entry points: the type of each, kvd_<cuda.h name>_fn ---- */
typedef kvd_CUresult kvd_cuInit_fn(unsigned int flags);
typedef kvd_CUresult kvd_cuDeviceGet_fn(kvd_CUdevice *device, int ordinal);
typedef kvd_CUresult kvd_cuDeviceGetAttribute_fn(int *pi,
		kvd_CUdevice_attribute attrib, kvd_CUdevice dev);
typedef kvd_CUresult kvd_cuPointerGetAttribute_fn(void *data,
		kvd_CUpointer_attribute attribute, kvd_CUdeviceptr ptr);
typedef kvd_CUresult kvd_cuMemGetAddressRange_fn(kvd_CUdeviceptr *pbase,
		size_t *psize, kvd_CUdeviceptr dptr);
typedef kvd_CUresult kvd_cuMemGetHandleForAddressRange_fn(void *handle,
		kvd_CUdeviceptr dptr, size_t size,
		kvd_CUmemRangeHandleType handleType, unsigned long long flags);
typedef kvd_CUresult kvd_cuDevicePrimaryCtxRetain_fn(kvd_CUcontext *pctx,
		kvd_CUdevice dev);
typedef kvd_CUresult kvd_cuDevicePrimaryCtxRelease_fn(kvd_CUdevice dev);
typedef kvd_CUresult kvd_cuCtxPushCurrent_fn(kvd_CUcontext ctx);
typedef kvd_CUresult kvd_cuCtxPopCurrent_fn(kvd_CUcontext *pctx);
typedef kvd_CUresult kvd_cuGetErrorName_fn(kvd_CUresult error,
		const char **pStr);
/* the fake driver's and tests/hw's */
typedef kvd_CUresult kvd_cuCtxGetCurrent_fn(kvd_CUcontext *pctx);
typedef kvd_CUresult kvd_cuCtxSynchronize_fn(void);
typedef kvd_CUresult kvd_cuMemGetInfo_fn(size_t *free, size_t *total);
typedef kvd_CUresult kvd_cuMemGetAllocationGranularity_fn(size_t *granularity,
		const kvd_CUmemAllocationProp *prop,
		kvd_CUmemAllocationGranularity_flags option);
typedef kvd_CUresult kvd_cuMemAddressReserve_fn(kvd_CUdeviceptr *ptr,
		size_t size, size_t alignment, kvd_CUdeviceptr addr,
		unsigned long long flags);
typedef kvd_CUresult kvd_cuMemAddressFree_fn(kvd_CUdeviceptr ptr, size_t size);
typedef kvd_CUresult kvd_cuMemCreate_fn(
		kvd_CUmemGenericAllocationHandle *handle, size_t size,
		const kvd_CUmemAllocationProp *prop, unsigned long long flags);
typedef kvd_CUresult kvd_cuMemRelease_fn(
		kvd_CUmemGenericAllocationHandle handle);
typedef kvd_CUresult kvd_cuMemMap_fn(kvd_CUdeviceptr ptr, size_t size,
		size_t offset, kvd_CUmemGenericAllocationHandle handle,
		unsigned long long flags);
typedef kvd_CUresult kvd_cuMemUnmap_fn(kvd_CUdeviceptr ptr, size_t size);
typedef kvd_CUresult kvd_cuMemSetAccess_fn(kvd_CUdeviceptr ptr, size_t size,
		const kvd_CUmemAccessDesc *desc, size_t count);
typedef kvd_CUresult kvd_cuMemcpyHtoD_fn(kvd_CUdeviceptr dstDevice,
		const void *srcHost, size_t ByteCount);
typedef kvd_CUresult kvd_cuMemcpyDtoH_fn(void *dstHost,
		kvd_CUdeviceptr srcDevice, size_t ByteCount);
/* cuda.h's cuGetProcAddress is a macro for cuGetProcAddress_v2 (CUDA
 * 12.0, with @symbolStatus); the symbol cuGetProcAddress that libcuda
 * also exports is the CUDA 11.3 one without it, declared in cuda.h only
 * for the driver's own build (__CUDA_API_VERSION_INTERNAL). */
typedef kvd_CUresult kvd_cuGetProcAddress_fn(const char *symbol, void **pfn,
		int cudaVersion, kvd_cuuint64_t flags,
		kvd_CUdriverProcAddressQueryResult *symbolStatus);
typedef kvd_CUresult kvd_cuGetProcAddress_v1_fn(const char *symbol,
		void **pfn, int cudaVersion, kvd_cuuint64_t flags);

/*
 * The symbols, X(name, symbol): @symbol is what dlsym() looks up for the
 * cuda.h entry point @name. Where cuda.h makes a name a macro for a
 * versioned symbol (#define cuCtxPushCurrent cuCtxPushCurrent_v2), the
 * symbol is that version: the unversioned one libcuda also exports keeps
 * the old ABI (cuMemGetAddressRange: 32-bit sizes) or old semantics.
 *
 * KVD_CUDA_LIB_CALLS: what the library calls, in lib/cuda.c.
 */
#define KVD_CUDA_LIB_CALLS(X)                                            \
	X(cuInit, cuInit)                                                \
	X(cuDeviceGet, cuDeviceGet)                                      \
	X(cuDeviceGetAttribute, cuDeviceGetAttribute)                    \
	X(cuPointerGetAttribute, cuPointerGetAttribute)                  \
	X(cuMemGetAddressRange, cuMemGetAddressRange_v2)                 \
	X(cuMemGetHandleForAddressRange, cuMemGetHandleForAddressRange)  \
	X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)            \
	X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2)       \
	X(cuCtxPushCurrent, cuCtxPushCurrent_v2)                         \
	X(cuCtxPopCurrent, cuCtxPopCurrent_v2)                           \
	X(cuGetErrorName, cuGetErrorName)

/* What the fake driver adds (cuCtxGetCurrent) and tests/hw/cuda_vmm calls. */
#define KVD_CUDA_TEST_CALLS(X)                                           \
	X(cuCtxGetCurrent, cuCtxGetCurrent)                              \
	X(cuCtxSynchronize, cuCtxSynchronize)                            \
	X(cuMemGetInfo, cuMemGetInfo_v2)                                 \
	X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity)  \
	X(cuMemAddressReserve, cuMemAddressReserve)                      \
	X(cuMemAddressFree, cuMemAddressFree)                            \
	X(cuMemCreate, cuMemCreate)                                      \
	X(cuMemRelease, cuMemRelease)                                    \
	X(cuMemMap, cuMemMap)                                            \
	X(cuMemUnmap, cuMemUnmap)                                        \
	X(cuMemSetAccess, cuMemSetAccess)                                \
	X(cuMemcpyHtoD, cuMemcpyHtoD_v2)                                 \
	X(cuMemcpyDtoH, cuMemcpyDtoH_v2)

/* What libkvdmabuf-preload.so interposes besides cuMemMap, cuMemUnmap and
 * cuMemSetAccess (lib/preload/preload_cuda.c; the 11.3 cuGetProcAddress
 * too, kvd_cuGetProcAddress_v1_fn). */
#define KVD_CUDA_PRELOAD_CALLS(X)                                        \
	X(cuGetProcAddress, cuGetProcAddress_v2)

#endif /* KVDMABUF_CUDA_API_H */
