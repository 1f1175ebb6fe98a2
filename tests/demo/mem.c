// SPDX-License-Identifier: GPL-2.0
/*
 * mem.c - memory figures: resident pages of an address range (mincore),
 * memory held system-wide (procfs.h reads VmPin and /proc/meminfo).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "demo.h"
#include "procfs.h"

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

long demo_free_kb(void)
{
	long free_kb = meminfo_kb("MemFree"), pcp = 0, v;
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
