/* SPDX-License-Identifier: GPL-2.0 */
/*
 * procfs.h - "Key: N kB" fields of /proc files, as the tests, the demo and
 * the benchmarks read memory figures (Shmem, MemFree, VmPin, ...).
 */
#ifndef KVDMABUF_TESTS_PROCFS_H
#define KVDMABUF_TESTS_PROCFS_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Field @key of @path in KiB, -ENOENT when absent, or -errno. */
static inline long proc_kb(const char *path, const char *key)
{
	char line[256], name[64];
	long kb = -ENOENT, v;
	FILE *f = fopen(path, "re");

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%63[^:]: %ld", name, &v) == 2 &&
		    !strcmp(name, key)) {
			kb = v;
			break;
		}
	fclose(f);
	return kb;
}

static inline long meminfo_kb(const char *key)
{
	return proc_kb("/proc/meminfo", key);
}

/* Pinned memory of this process (VmPin), KiB. */
static inline long vmpin_kb(void)
{
	return proc_kb("/proc/self/status", "VmPin");
}

#endif /* KVDMABUF_TESTS_PROCFS_H */
