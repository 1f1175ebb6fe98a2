// SPDX-License-Identifier: MIT
/*
 * other_dlsym.c - another dlsym interposer in LD_PRELOAD, as GPU-sharing
 * layers (HAMi-core) have: it counts its calls and hands each lookup on
 * to the next dlsym (dlvsym(RTLD_NEXT)), or, built with -DTO_GLIBC
 * (other_dlsym_glibc.so), straight to glibc's own, bypassing whatever
 * comes after it. For tests/preload/preload_cuda's other_dlsym tests.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

int other_dlsym_calls;

void *dlsym(void *handle, const char *name)
{
	static void *(*next)(void *, const char *);

	other_dlsym_calls++;
	if (!next) {
#ifdef TO_GLIBC
		void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);

		*(void **)&next = libc ? dlvsym(libc, "dlsym", "GLIBC_2.34") :
				  NULL;
#else
		*(void **)&next = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
#endif
	}
	return next ? next(handle, name) : NULL;
}
