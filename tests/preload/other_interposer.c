// SPDX-License-Identifier: MIT
/*
 * other_interposer.c - another interposer of cuMemUnmap, ahead of
 * libkvdmabuf-preload.so in LD_PRELOAD (as a GPU-sharing layer such as
 * HAMi-core is): it counts its calls, then calls the next cuMemUnmap
 * (dlsym(RTLD_NEXT)). For tests/preload/preload_cuda's two_interposers.
 */
#include <dlfcn.h>
#include <stddef.h>

int other_unmap_calls;

int cuMemUnmap(unsigned long long ptr, size_t size);
int cuMemUnmap(unsigned long long ptr, size_t size)
{
	static int (*next)(unsigned long long, size_t);

	other_unmap_calls++;
	if (!next)
		*(void **)&next = dlsym(RTLD_NEXT, "cuMemUnmap");
	return next ? next(ptr, size) : 999;
}
