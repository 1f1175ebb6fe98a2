// SPDX-License-Identifier: MIT
/*
 * local_cuda.c - run by tests/preload/preload_cuda under LD_PRELOAD: libcuda
 * (the fake, on LD_LIBRARY_PATH) loaded RTLD_LOCAL, as a Python extension
 * or the CUDA runtime loads it, then the preload's cuMemUnmap found in the
 * global scope and called once with a bad size. Prints "unmap: N", the
 * CUDA result: the driver's (CUDA_ERROR_INVALID_VALUE, 1), or 801
 * (CUDA_ERROR_NOT_SUPPORTED) when the preload did not find the driver.
 */
#include <dlfcn.h>
#include <stdio.h>

int main(void)
{
	int (*unmap)(unsigned long long, size_t);

	if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
		printf("error: %s\n", dlerror());
		return 1;
	}
	*(void **)&unmap = dlsym(RTLD_DEFAULT, "cuMemUnmap");
	if (!unmap) {
		printf("error: no cuMemUnmap in the global scope\n");
		return 1;
	}
	printf("unmap: %d\n", unmap(4096, 1));
	return 0;
}
