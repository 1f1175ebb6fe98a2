// SPDX-License-Identifier: GPL-2.0
/*
 * mem.c - memory figures: pinned pages of a process (VmPin), resident pages
 * of an address range (mincore), /proc/meminfo fields.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "demo.h"

long demo_vmpin_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -ENOENT;
	FILE *f;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/status");
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmPin: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

long demo_resident(const void *addr, size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	size_t n = (len + (size_t)page - 1) / (size_t)page, i;
	unsigned char *vec;
	long res = 0;

	if (!addr || !len)
		return 0;
	vec = malloc(n);
	if (!vec)
		return -ENOMEM;
	if (mincore((void *)addr, len, vec)) {
		res = -errno;
		free(vec);
		return res;
	}
	for (i = 0; i < n; i++)
		if (vec[i] & 1)
			res += page;
	free(vec);
	return res;
}

long demo_meminfo_kb(const char *key)
{
	char line[256], name[64];
	long kb = -ENOENT, v;
	FILE *f = fopen("/proc/meminfo", "re");

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

long demo_free_kb(void)
{
	long free_kb = demo_meminfo_kb("MemFree"), pcp = 0, v;
	char line[256];
	FILE *f;

	if (free_kb < 0)
		return free_kb;
	/* pages just freed wait on per-CPU lists, outside MemFree */
	f = fopen("/proc/zoneinfo", "re");
	if (!f)
		return free_kb;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, " count: %ld", &v) == 1)
			pcp += v;
	fclose(f);
	return free_kb + pcp * (sysconf(_SC_PAGESIZE) / 1024);
}
