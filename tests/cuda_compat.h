/* SPDX-License-Identifier: MIT */
/*
 * cuda_compat.h - cuda.h for the tests that implement or call the CUDA
 * driver API under its own names (tests/fake_cuda, tests/hw/cuda_vmm): the
 * CUDA toolkit's cuda.h where the build found one (make defines
 * KVD_HAVE_CUDA_H), so that their prototypes are NVIDIA's; else the
 * project's declarations (lib/cuda_api.h, checked against cuda.h by
 * tests/lib/cuda_abi wherever a toolkit is installed) under cuda.h's names.
 */
#ifndef KVDMABUF_TESTS_CUDA_COMPAT_H
#define KVDMABUF_TESTS_CUDA_COMPAT_H

#include "cuda_api.h"

#ifdef KVD_HAVE_CUDA_H
#include <cuda.h>
#else
typedef kvd_CUresult CUresult;
typedef kvd_CUdevice CUdevice;
typedef kvd_CUdeviceptr CUdeviceptr;
typedef kvd_CUcontext CUcontext;
typedef kvd_CUdevice_attribute CUdevice_attribute;
typedef kvd_CUpointer_attribute CUpointer_attribute;
typedef kvd_CUmemRangeHandleType CUmemRangeHandleType;
typedef kvd_CUmemGenericAllocationHandle CUmemGenericAllocationHandle;
typedef kvd_CUmemAllocationGranularity_flags CUmemAllocationGranularity_flags;
typedef kvd_CUmemLocation CUmemLocation;
typedef kvd_CUmemAllocationProp CUmemAllocationProp;
typedef kvd_CUmemAccessDesc CUmemAccessDesc;
typedef kvd_cuuint64_t cuuint64_t;
typedef kvd_CUdriverProcAddressQueryResult CUdriverProcAddressQueryResult;

#define CUDA_SUCCESS KVD_CUDA_SUCCESS
#define CUDA_ERROR_INVALID_VALUE KVD_CUDA_ERROR_INVALID_VALUE
#define CUDA_ERROR_STUB_LIBRARY KVD_CUDA_ERROR_STUB_LIBRARY
#define CUDA_ERROR_NO_DEVICE KVD_CUDA_ERROR_NO_DEVICE
#define CUDA_ERROR_INVALID_DEVICE KVD_CUDA_ERROR_INVALID_DEVICE
#define CUDA_ERROR_INVALID_CONTEXT KVD_CUDA_ERROR_INVALID_CONTEXT
#define CUDA_ERROR_NOT_PERMITTED KVD_CUDA_ERROR_NOT_PERMITTED
#define CUDA_ERROR_NOT_SUPPORTED KVD_CUDA_ERROR_NOT_SUPPORTED
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL \
	KVD_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR \
	KVD_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE KVD_CU_POINTER_ATTRIBUTE_RANGE_SIZE
#define CU_POINTER_ATTRIBUTE_MAPPED KVD_CU_POINTER_ATTRIBUTE_MAPPED
#define CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE \
	KVD_CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE
#define CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED \
	KVD_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
#define CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED \
	KVD_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD \
	KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
#define CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE \
	KVD_CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE
#define CU_MEM_ALLOCATION_TYPE_PINNED KVD_CU_MEM_ALLOCATION_TYPE_PINNED
#define CU_MEM_LOCATION_TYPE_DEVICE KVD_CU_MEM_LOCATION_TYPE_DEVICE
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE \
	KVD_CU_MEM_ACCESS_FLAGS_PROT_READWRITE
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM KVD_CU_MEM_ALLOC_GRANULARITY_MINIMUM
#define CU_GET_PROC_ADDRESS_SUCCESS KVD_CU_GET_PROC_ADDRESS_SUCCESS
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND \
	KVD_CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT \
	KVD_CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT

/* cuda.h's names of versioned entry points (KVD_CUDA_*_CALLS) */
#define cuMemGetAddressRange cuMemGetAddressRange_v2
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuCtxPushCurrent cuCtxPushCurrent_v2
#define cuCtxPopCurrent cuCtxPopCurrent_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuMemcpyHtoD cuMemcpyHtoD_v2
#define cuMemcpyDtoH cuMemcpyDtoH_v2
#define cuGetProcAddress cuGetProcAddress_v2

/* the prototypes, as cuda.h declares them */
#define KVD_CU_PROTO(name, symbol) kvd_##name##_fn name;
KVD_CUDA_LIB_CALLS(KVD_CU_PROTO)
KVD_CUDA_TEST_CALLS(KVD_CU_PROTO)
KVD_CUDA_PRELOAD_CALLS(KVD_CU_PROTO)
#undef KVD_CU_PROTO
#endif /* KVD_HAVE_CUDA_H */

/* What an engine's KV allocation asks for: pinned memory of device 0 that
 * GPUDirect RDMA can reach, mapped read-write. */
static inline void kvd_kv_alloc_props(CUmemAllocationProp *prop,
				      CUmemAccessDesc *rw)
{
	*prop = (CUmemAllocationProp){ 0 };
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->allocFlags.gpuDirectRDMACapable = 1;
	*rw = (CUmemAccessDesc){ 0 };
	rw->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	rw->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

#endif /* KVDMABUF_TESTS_CUDA_COMPAT_H */
