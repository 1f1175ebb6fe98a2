/* SPDX-License-Identifier: MIT */
/*
 * preload_rerun.h - a VM test program that runs itself again under
 * libkvdmabuf-preload.so of the build tree (kvd_build_path()), as an
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

#include "harness.h"

/* @regions: KVDMABUF_KV_REGIONS for the new image, or NULL. */
static inline void preload_rerun(char **argv, const char *regions)
{
	char so[4096];

	if (dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare") ||
	    getenv("KVDMABUF_PRELOAD_TRIED"))
		return;
	if (kvd_build_path(so, sizeof(so), "lib/libkvdmabuf-preload.so"))
		return;
	setenv("KVDMABUF_PRELOAD_TRIED", "1", 1);
	setenv("LD_PRELOAD", so, 1);
	if (regions)
		setenv("KVDMABUF_KV_REGIONS", regions, 1);
	execv("/proc/self/exe", argv);
}

#endif /* KVDMABUF_TESTS_PRELOAD_RERUN_H */
