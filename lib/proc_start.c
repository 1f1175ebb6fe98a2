// SPDX-License-Identifier: MIT
/*
 * proc_start.c - the start time of a process, which with its pid tells a
 * live process from a later one that reuses the pid. For the preload's
 * state files: written by lib/preload/state_file.c, read by the CLI
 * (lib/cli/preload.c). Not exported.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

unsigned long long kvd_proc_start_time(int pid)
{
	unsigned long long t = 0;
	char buf[1024], *p;
	ssize_t n;
	int fd, field;

	if (pid)
		snprintf(buf, sizeof(buf), "/proc/%d/stat", pid);
	else
		snprintf(buf, sizeof(buf), "/proc/self/stat");
	fd = open(buf, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	p = strrchr(buf, ')');  /* the name may hold spaces */
	for (field = 2; p && field < 22; field++)
		p = strchr(p + 1, ' ');
	if (p)
		t = strtoull(p + 1, NULL, 10);
	return t;
}
