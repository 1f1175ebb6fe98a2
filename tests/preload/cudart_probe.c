// SPDX-License-Identifier: MIT
/*
 * cudart_probe.c - for tests/preload/preload_cuda, built where make finds the CUDA
 * toolkit's libcudart: NVIDIA's runtime initialising against the fake
 * libcuda under LD_PRELOAD=libkvdmabuf-preload.so. The runtime opens
 * libcuda itself and fetches every driver entry point through the
 * cuGetProcAddress_v2 it looks up with dlsym() on that handle; the fake
 * lacks most of them, so the runtime then gives up (no usable driver):
 * what counts is how many of its lookups went through the interposer.
 * Prints "runtime: <cudaError>" and "calls: <cuGetProcAddress_v2 calls>".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <cuda_runtime_api.h>

int main(void)
{
	long long (*calls)(const char *);
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	*(void **)&calls = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_calls");
	printf("runtime: %d\n", (int)e);
	printf("calls: %lld\n", calls ? calls("cuGetProcAddress_v2") : -1);
	return 0;
}
