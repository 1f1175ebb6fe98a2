/* SPDX-License-Identifier: MIT */
/*
 * preload_rerun.h - a VM test program that runs itself again under
 * libkvdmabuf-preload.so of the build tree (../lib beside tests/), as an
 * operator starts an engine: LD_PRELOAD set before exec, so that every
 * libibverbs reference of the program binds to the interposer. Call it
 * from a constructor; it returns when the preload is already in (or was
 * tried: KVDMABUF_PRELOAD_TRIED), else does not return.
 */
#ifndef KVDMABUF_TESTS_PRELOAD_RERUN_H
#define KVDMABUF_TESTS_PRELOAD_RERUN_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* @regions: KVDMABUF_KV_REGIONS for the new image, or NULL. */
static inline void preload_rerun(char **argv, const char *regions)
{
	char exe[4096], so[4096 + 64], *slash;
	ssize_t n;

	if (dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare") ||
	    getenv("KVDMABUF_PRELOAD_TRIED"))
		return;
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return;
	exe[n] = '\0';
	slash = strrchr(exe, '/');
	if (!slash)
		return;
	*slash = '\0';
	snprintf(so, sizeof(so), "%s/../lib/libkvdmabuf-preload.so", exe);
	setenv("KVDMABUF_PRELOAD_TRIED", "1", 1);
	setenv("LD_PRELOAD", so, 1);
	if (regions)
		setenv("KVDMABUF_KV_REGIONS", regions, 1);
	execv("/proc/self/exe", argv);
}

#endif /* KVDMABUF_TESTS_PRELOAD_RERUN_H */
