// SPDX-License-Identifier: MIT
/*
 * two_interposers.c - an engine linked with -lcuda (the fake libcuda) run
 * under LD_PRELOAD="other_interposer.so libkvdmabuf-preload.so": it looks
 * cuMemUnmap up on the handle of the whole program (dlopen(NULL)), whose
 * answer is the other interposer's, and calls it on memory it never
 * mapped. Prints "rc: N" (the driver's answer) and "other: N" (the other
 * interposer's calls); a lookup that takes the other interposer for the
 * driver recurses until the stack runs out.
 */
#include <dlfcn.h>
#include <stdio.h>

int main(void)
{
	int (*unmap)(unsigned long long, size_t);
	int *other;
	void *h = dlopen(NULL, RTLD_LAZY);

	if (!h)
		return 2;
	*(void **)&unmap = dlsym(h, "cuMemUnmap");
	other = dlsym(RTLD_DEFAULT, "other_unmap_calls");
	if (!unmap || !other)
		return 2;
	printf("rc: %d\n", unmap(0x10000, 4096));
	printf("other: %d\n", *other);
	return 0;
}
