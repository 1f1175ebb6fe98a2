// SPDX-License-Identifier: MIT
/*
 * cuda_abi - the project's CUDA driver API declarations (lib/cuda_api.h:
 * what the library, the fake libcuda and tests/hw use) against NVIDIA's:
 * compiled beside the CUDA toolkit's cuda.h, every constant, type, struct
 * layout and prototype is a static assertion (a wrong one fails the build,
 * naming it); then, at run time, the symbol each entry point is looked up
 * by is the one cuda.h's macros resolve its name to (cuCtxPushCurrent ->
 * cuCtxPushCurrent_v2), and the toolkit's stub libcuda.so exports it;
 * tests/hw/cuda_vmm, built against the same cuda.h, skips on the stub.
 * Skips, with the reason, where make found no toolkit (KVD_HAVE_CUDA_H
 * unset): the library builds without one.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>

#include "harness.h"
#include "cuda_api.h"

#define STR(x) #x
#define XSTR(x) STR(x)

#ifdef KVD_HAVE_CUDA_H
#include <cuda.h>

/* ---- values: KVD_<name> == cuda.h's <name> ---- */
#define SAME_VALUE(name) \
	_Static_assert(KVD_##name == name, "cuda_api.h: KVD_" #name \
		       " is not cuda.h's " #name)

SAME_VALUE(CUDA_SUCCESS);
SAME_VALUE(CUDA_ERROR_INVALID_VALUE);
SAME_VALUE(CUDA_ERROR_STUB_LIBRARY);
SAME_VALUE(CUDA_ERROR_NO_DEVICE);
SAME_VALUE(CUDA_ERROR_INVALID_DEVICE);
SAME_VALUE(CUDA_ERROR_INVALID_CONTEXT);
SAME_VALUE(CUDA_ERROR_NOT_PERMITTED);
SAME_VALUE(CUDA_ERROR_NOT_SUPPORTED);
SAME_VALUE(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
SAME_VALUE(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
SAME_VALUE(CU_POINTER_ATTRIBUTE_RANGE_SIZE);
SAME_VALUE(CU_POINTER_ATTRIBUTE_MAPPED);
SAME_VALUE(CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
SAME_VALUE(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD);
SAME_VALUE(CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
SAME_VALUE(CU_MEM_ALLOCATION_TYPE_PINNED);
SAME_VALUE(CU_MEM_LOCATION_TYPE_DEVICE);
SAME_VALUE(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
SAME_VALUE(CU_MEM_ALLOC_GRANULARITY_MINIMUM);
SAME_VALUE(CU_GET_PROC_ADDRESS_DEFAULT);
SAME_VALUE(CU_GET_PROC_ADDRESS_LEGACY_STREAM);
SAME_VALUE(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
SAME_VALUE(CU_GET_PROC_ADDRESS_SUCCESS);
SAME_VALUE(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
SAME_VALUE(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);

/* ---- types: compatible in the C sense (enums: with unsigned int) ---- */
#define SAME_TYPE(name) \
	_Static_assert(__builtin_types_compatible_p(kvd_##name, name), \
		       "cuda_api.h: kvd_" #name " is not cuda.h's " #name)

SAME_TYPE(CUresult);
SAME_TYPE(CUdevice);
SAME_TYPE(CUdeviceptr);
SAME_TYPE(CUcontext);
SAME_TYPE(CUdevice_attribute);
SAME_TYPE(CUpointer_attribute);
SAME_TYPE(CUmemRangeHandleType);
SAME_TYPE(CUmemGenericAllocationHandle);
SAME_TYPE(CUmemAllocationGranularity_flags);
SAME_TYPE(cuuint64_t);
SAME_TYPE(CUdriverProcAddressQueryResult);

/* ---- structs: size, alignment, every field's offset and size ---- */
#define SAME_SIZE(name) \
	_Static_assert(sizeof(kvd_##name) == sizeof(name) && \
		       _Alignof(kvd_##name) == _Alignof(name), \
		       "cuda_api.h: size or alignment of kvd_" #name)
#define SAME_FIELD(name, field) \
	_Static_assert(offsetof(kvd_##name, field) == \
		       offsetof(name, field) && \
		       sizeof(((kvd_##name *)0)->field) == \
		       sizeof(((name *)0)->field), \
		       "cuda_api.h: kvd_" #name "." #field " is not where " \
		       "or as wide as cuda.h's")

/* An enum field of ours is unsigned int: cuda.h's enum must be too. */
#define ENUM_FIELD(name, field, type) \
	_Static_assert(__builtin_types_compatible_p( \
		__typeof__(((kvd_##name *)0)->field), type), \
		"cuda_api.h: kvd_" #name "." #field " is not a " #type)

SAME_SIZE(CUmemLocation);
SAME_FIELD(CUmemLocation, type);
SAME_FIELD(CUmemLocation, id);
ENUM_FIELD(CUmemLocation, type, CUmemLocationType);
SAME_SIZE(CUmemAllocationProp);
SAME_FIELD(CUmemAllocationProp, type);
SAME_FIELD(CUmemAllocationProp, requestedHandleTypes);
SAME_FIELD(CUmemAllocationProp, location);
SAME_FIELD(CUmemAllocationProp, win32HandleMetaData);
SAME_FIELD(CUmemAllocationProp, allocFlags);
SAME_FIELD(CUmemAllocationProp, allocFlags.compressionType);
SAME_FIELD(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable);
SAME_FIELD(CUmemAllocationProp, allocFlags.usage);
SAME_FIELD(CUmemAllocationProp, allocFlags.reserved);
ENUM_FIELD(CUmemAllocationProp, type, CUmemAllocationType);
ENUM_FIELD(CUmemAllocationProp, requestedHandleTypes,
	   CUmemAllocationHandleType);
SAME_SIZE(CUmemAccessDesc);
SAME_FIELD(CUmemAccessDesc, location);
SAME_FIELD(CUmemAccessDesc, flags);
ENUM_FIELD(CUmemAccessDesc, flags, CUmemAccess_flags);

/*
 * ---- prototypes ----
 * kvd_<name>_fn against the type of what cuda.h declares for <name> (the
 * versioned function where <name> is a macro): return type, number and
 * type of every parameter. The three that take a struct by pointer
 * cannot be compatible with cuda.h's (our struct is another type, of the
 * same layout, checked above): they are compared with cuda.h's prototype
 * written out twice, once with cuda.h's struct (which must be cuda.h's
 * type) and once with ours (which must be kvd_<name>_fn).
 */
#define THEIRS_cuInit __typeof__(cuInit)
#define THEIRS_cuDeviceGet __typeof__(cuDeviceGet)
#define THEIRS_cuDeviceGetAttribute __typeof__(cuDeviceGetAttribute)
#define THEIRS_cuPointerGetAttribute __typeof__(cuPointerGetAttribute)
#define THEIRS_cuMemGetAddressRange __typeof__(cuMemGetAddressRange)
#define THEIRS_cuMemGetHandleForAddressRange \
	__typeof__(cuMemGetHandleForAddressRange)
#define THEIRS_cuDevicePrimaryCtxRetain __typeof__(cuDevicePrimaryCtxRetain)
#define THEIRS_cuDevicePrimaryCtxRelease __typeof__(cuDevicePrimaryCtxRelease)
#define THEIRS_cuCtxPushCurrent __typeof__(cuCtxPushCurrent)
#define THEIRS_cuCtxPopCurrent __typeof__(cuCtxPopCurrent)
#define THEIRS_cuGetErrorName __typeof__(cuGetErrorName)
#define THEIRS_cuCtxGetCurrent __typeof__(cuCtxGetCurrent)
#define THEIRS_cuCtxSynchronize __typeof__(cuCtxSynchronize)
#define THEIRS_cuMemGetInfo __typeof__(cuMemGetInfo)
#define THEIRS_cuMemAddressReserve __typeof__(cuMemAddressReserve)
#define THEIRS_cuMemAddressFree __typeof__(cuMemAddressFree)
#define THEIRS_cuMemRelease __typeof__(cuMemRelease)
#define THEIRS_cuMemMap __typeof__(cuMemMap)
#define THEIRS_cuMemUnmap __typeof__(cuMemUnmap)
#define THEIRS_cuMemcpyHtoD __typeof__(cuMemcpyHtoD)
#define THEIRS_cuMemcpyDtoH __typeof__(cuMemcpyDtoH)
#define THEIRS_cuGetProcAddress __typeof__(cuGetProcAddress)

#define PROTO_cuMemGetAllocationGranularity(prop) \
	CUresult(size_t *, const prop *, CUmemAllocationGranularity_flags)
#define PROTO_cuMemCreate(prop) \
	CUresult(CUmemGenericAllocationHandle *, size_t, const prop *, \
		 unsigned long long)
#define PROTO_cuMemSetAccess(desc) \
	CUresult(CUdeviceptr, size_t, const desc *, size_t)
#define THEIRS_cuMemGetAllocationGranularity \
	PROTO_cuMemGetAllocationGranularity(kvd_CUmemAllocationProp)
#define THEIRS_cuMemCreate PROTO_cuMemCreate(kvd_CUmemAllocationProp)
#define THEIRS_cuMemSetAccess PROTO_cuMemSetAccess(kvd_CUmemAccessDesc)
#define WRITTEN_OUT(name, type) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(name), \
		PROTO_##name(type)), "cuda.h's " #name ", as written out here")
WRITTEN_OUT(cuMemGetAllocationGranularity, CUmemAllocationProp);
WRITTEN_OUT(cuMemCreate, CUmemAllocationProp);
WRITTEN_OUT(cuMemSetAccess, CUmemAccessDesc);

/* Every entry point of both lists: one without THEIRS_ fails to build. */
#define SAME_PROTO(name, symbol) \
	_Static_assert(__builtin_types_compatible_p(kvd_##name##_fn, \
						   THEIRS_##name), \
		       "cuda_api.h: kvd_" #name "_fn is not cuda.h's " \
		       "prototype of " #name);
KVD_CUDA_LIB_CALLS(SAME_PROTO)
KVD_CUDA_TEST_CALLS(SAME_PROTO)
KVD_CUDA_PRELOAD_CALLS(SAME_PROTO)

/* ---- symbols: the name cuda.h's macros give, as the driver exports ---- */
struct entry {
	const char *name;       /* in cuda.h */
	const char *symbol;     /* what cuda_api.h has dlsym() look up */
	const char *cuda_h;     /* what cuda.h resolves name to */
	int lib;                /* called by the library (else by tests) */
};

#define ENTRY_LIB(name, symbol) { #name, #symbol, XSTR(name), 1 },
#define ENTRY_TEST(name, symbol) { #name, #symbol, XSTR(name), 0 },
static const struct entry entries[] = {
	KVD_CUDA_LIB_CALLS(ENTRY_LIB)
	KVD_CUDA_TEST_CALLS(ENTRY_TEST)
	KVD_CUDA_PRELOAD_CALLS(ENTRY_TEST)
};
#define NR_ENTRIES (sizeof(entries) / sizeof(entries[0]))

TEST(versioned_symbols_are_cuda_h_s)
{
	unsigned int i, lib = 0;

	for (i = 0; i < NR_ENTRIES; i++) {
		if (strcmp(entries[i].symbol, entries[i].cuda_h))
			TH_LOG("%s: cuda_api.h looks up %s, cuda.h calls %s",
			       entries[i].name, entries[i].symbol,
			       entries[i].cuda_h);
		EXPECT_EQ(0, strcmp(entries[i].symbol, entries[i].cuda_h));
		lib += entries[i].lib;
	}
	TH_LOG("%u entry points (%u called by the library), checked against "
	       "cuda.h of CUDA %d.%d", (unsigned int)NR_ENTRIES, lib,
	       CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
}

static const char *stub_path(void)
{
	const char *p = getenv("KVDMABUF_CUDA_STUB");

#ifdef KVD_CUDA_STUB
	if (!p)
		p = KVD_CUDA_STUB;
#endif
	return p;
}

TEST(stub_exports_every_symbol)
{
	const char *path = stub_path();
	unsigned int i;
	void *dl;

	ASSERT_NOT_NULL(path);  /* make found cuda.h but no stub libcuda */
	dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!dl)
		TH_LOG("%s", dlerror());
	ASSERT_NOT_NULL(dl);
	for (i = 0; i < NR_ENTRIES; i++) {
		void *f = dlsym(dl, entries[i].symbol);

		if (!f)
			TH_LOG("%s does not export %s", path,
			       entries[i].symbol);
		EXPECT_NOT_NULL(f);
	}
	/* the CUDA 11.3 cuGetProcAddress the preload interposes too */
	EXPECT_NOT_NULL(dlsym(dl, "cuGetProcAddress"));
	dlclose(dl);
}

/*
 * tests/hw/cuda_vmm, built against this cuda.h, on the stub: every test
 * skips and says why (the machine has no GPU driver), none fails.
 */
TEST(hw_test_skips_on_the_stub)
{
	const char *stub = stub_path();
	char hw[PATH_MAX], cmd[2 * PATH_MAX + 64], line[512];
	int tests = 0, skips = 0, status;
	FILE *f;

	ASSERT_NOT_NULL(stub);
	ASSERT_EQ(0, kvd_build_path(hw, sizeof(hw), "tests/hw/cuda_vmm"));
	snprintf(cmd, sizeof(cmd), "KVDMABUF_CUDA_LIBRARY='%s' '%s'", stub, hw);
	f = popen(cmd, "r");
	ASSERT_NOT_NULL(f);
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "not ok", 6))
			TH_LOG("%s", line);
		if (strncmp(line, "ok ", 3) && strncmp(line, "not ok", 6))
			continue;
		tests++;
		/* the preload's tests run only under it (gpu-node.sh) */
		skips += strstr(line, "# SKIP CUDA driver stub: no GPU driver "
				"on this machine") != NULL ||
			 (strstr(line, " preload_") &&
			  strstr(line, "# SKIP libkvdmabuf-preload.so is not "
				 "loaded"));
	}
	status = pclose(f);
	EXPECT_LT(0, tests);
	EXPECT_EQ(tests, skips);
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_EQ(KSFT_SKIP, WEXITSTATUS(status));
}

#else /* no toolkit */

TEST(cuda_h)
{
	SKIP(return, "no CUDA toolkit found by make (nvcc on PATH or "
	     "CUDA_HOME with include/cuda.h): the declarations in "
	     "lib/cuda_api.h are not checked here");
}

#endif

TEST_HARNESS_MAIN
