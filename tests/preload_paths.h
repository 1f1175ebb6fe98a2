/* SPDX-License-Identifier: MIT */
/*
 * preload_paths.h - where the host preload tests find what they dlopen():
 * paths relative to tests/ of the build tree, from the program's own path
 * (tests/asan/ twins included).
 */
#ifndef KVDMABUF_TESTS_PRELOAD_PATHS_H
#define KVDMABUF_TESTS_PRELOAD_PATHS_H

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static inline void path_of(char *buf, size_t len, const char *rel)
{
	char exe[PATH_MAX], *d;
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	size_t l;

	exe[n > 0 ? n : 0] = '\0';
	d = dirname(exe);
	l = strlen(d);
	if (l >= 5 && !strcmp(d + l - 5, "/asan"))
		d[l - 5] = '\0';
	snprintf(buf, len, "%s/%s", d, rel);
}

#endif /* KVDMABUF_TESTS_PRELOAD_PATHS_H */
