// SPDX-License-Identifier: MIT
/*
 * preload.c - the part of `kvdmabuf status` that lists the processes
 * running under libkvdmabuf-preload.so: their declared KV regions and the
 * engine registrations in them, on a proxy or not (cannot follow, with
 * the cause), from the state file each keeps (kvdmabuf_preload.h, "State
 * file"). Files of processes that are gone (pid absent or with another
 * start time), and files that cannot be the process's own (not a regular
 * file, or owned by another user), are skipped. Needs no module.
 */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../internal.h"          /* kvd_proc_start_time() */
#include "../kvdmabuf_preload.h"
#include "report.h"

/*
 * The state file @path of process @name, opened only if it can be the
 * preload's own: a regular file (never a FIFO, which would block, nor a
 * link: the folder may be shared, 1777) owned by the user the process
 * runs as. NULL otherwise.
 */
static FILE *state_open(const char *path, const char *name)
{
	struct stat st, proc;
	char pdir[64];
	FILE *f;
	int fd;

	snprintf(pdir, sizeof(pdir), "/proc/%s", name);
	if (stat(pdir, &proc))
		return NULL;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) ||
	    st.st_uid != proc.st_uid) {
		close(fd);
		return NULL;
	}
	f = fdopen(fd, "r");
	if (!f)
		close(fd);
	return f;
}

/* The first line of a state file: 1 (with a count of every MR, older
 * preloads) or 2 (the MRs in KV regions only). */
static bool state_header(const char *line)
{
	return !strcmp(line, "kvdmabuf-preload 1\n") ||
	       !strcmp(line, "kvdmabuf-preload 2\n");
}

/*
 * A state file whose process is gone (killed, or _exit: no destructor ran)
 * or whose pid is now another process's: removed when it is a regular
 * preload file the caller owns (root: any), so that the folder does not
 * fill up. A live process's file never matches: its pid and start time
 * are its own, and it replaces the file by rename, never by a rewrite.
 */
static void prune(const char *path, const char *name)
{
	unsigned long long start;
	char line[128];
	struct stat st;
	int pid, fd;
	FILE *f;

	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) ||
	    (getuid() && st.st_uid != getuid())) {
		close(fd);
		return;
	}
	f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return;
	}
	if (fgets(line, sizeof(line), f) &&
	    state_header(line) &&
	    fgets(line, sizeof(line), f) &&
	    sscanf(line, "pid %d %llu", &pid, &start) == 2 &&
	    pid == atoi(name) && start != kvd_proc_start_time(pid))
		unlink(path);
	fclose(f);
}

/* One live process's file, printed; 0, or -1 when not listed. */
static int one(const char *path, const char *name, bool json, bool first)
{
	char line[1024], tag[128], a[4][128], *why;
	unsigned long long start, addr, len;
	unsigned int key, nr_r = 0, nr_m = 0;
	int pid, n;
	FILE *f = state_open(path, name);

	if (!f)
		return -1;
	if (!fgets(line, sizeof(line), f) ||
	    !state_header(line) ||
	    !fgets(line, sizeof(line), f) ||
	    sscanf(line, "pid %d %llu", &pid, &start) != 2 ||
	    pid != atoi(name) ||
	    start != kvd_proc_start_time(pid) || !fgets(line, sizeof(line), f)) {
		fclose(f);
		return -1;
	}
	line[strcspn(line, "\n")] = '\0';
	if (json) {
		unsigned int c[6] = { 0 };
		int env_error = 0;

		/* version 1's "mrs N" (every MR) skipped */
		if (sscanf(line, "regions %u asleep %u in %u proxy %u "
			   "cannot %u env_error %d", &c[0], &c[1], &c[2],
			   &c[3], &c[4], &env_error) != 6)
			sscanf(line, "regions %u asleep %u mrs %u in %u "
			       "proxy %u cannot %u env_error %d", &c[0], &c[1],
			       &c[5], &c[2], &c[3], &c[4], &env_error);
		printf("%s\n  {\"pid\": %d, \"nr_regions\": %u, "
		       "\"nr_asleep\": %u, \"nr_in_regions\": %u, "
		       "\"nr_on_proxy\": %u, \"nr_cannot_follow\": %u, "
		       "\"env_error\": %d, \"regions\": [",
		       first ? "" : ",", pid, c[0], c[1], c[2], c[3], c[4],
		       env_error);
	} else {
		printf("preload pid %d: %s\n", pid, line);
	}
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		if (sscanf(line, "region %llx+%llx %127s %127s %127s", &addr,
			   &len, tag, a[0], a[1]) == 5) {
			if (!json) {
				printf("  region %s\n", line + 7);
				continue;
			}
			printf("%s{\"addr\": %llu, \"length\": %llu, \"tag\": ",
			       nr_r++ ? ", " : "", addr, len);
			json_str(tag);
			printf(", \"proxy\": %s, \"asleep\": %s}",
			       strcmp(a[0], "proxy") ? "false" : "true",
			       strcmp(a[1], "asleep") ? "false" : "true");
			continue;
		}
		n = 0;
		if (sscanf(line, "lkey %x %llx+%llx %127s %127s%n", &key, &addr,
			   &len, a[2], a[3], &n) != 5 || !n)
			continue;
		if (!json) {
			printf("  mr %s\n", line + 5);
			continue;
		}
		if (!nr_m++)
			printf("], \"mrs\": [");
		else
			printf(", ");
		why = line + n;
		while (isspace((unsigned char)*why))
			why++;
		printf("{\"lkey\": %u, \"addr\": %llu, \"length\": %llu, "
		       "\"nic\": ", key, addr, len);
		json_str(a[2]);
		printf(", \"mode\": ");
		json_str(a[3]);
		printf(", \"reason\": ");
		json_str(why);
		printf("}");
	}
	if (json)
		printf("%s]}", nr_m ? "" : "], \"mrs\": [");
	fclose(f);
	return 0;
}

/*
 * Lists every live process's state file: in $KVDMABUF_PRELOAD_DIR when
 * set, else in KVDMABUF_PRELOAD_RUN_DIR and $XDG_RUNTIME_DIR's, and removes
 * the caller's files of processes that are gone. JSON: the elements of an
 * array (the caller writes the brackets). Returns how many were listed.
 */
int preload_status(bool json)
{
	const char *env = getenv(KVDMABUF_PRELOAD_DIR_ENV);
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char dirs[2][300], path[600];
	size_t dl;
	int nr_dirs = 0, listed = 0, i;

	if (env) {
		if (strcmp(env, "off"))
			snprintf(dirs[nr_dirs++], sizeof(dirs[0]), "%s", env);
	} else {
		snprintf(dirs[nr_dirs++], sizeof(dirs[0]), "%s",
			 KVDMABUF_PRELOAD_RUN_DIR);
		if (xdg && *xdg)
			snprintf(dirs[nr_dirs++], sizeof(dirs[0]),
				 "%s/kvdmabuf-preload", xdg);
	}
	for (i = 0; i < nr_dirs; i++) {
		struct dirent *de;
		DIR *d = opendir(dirs[i]);

		if (!d)
			continue;
		while ((de = readdir(d))) {
			if (!de->d_name[0] ||
			    strspn(de->d_name, "0123456789") !=
			    strlen(de->d_name))
				continue;
			dl = strlen(dirs[i]);
			if (dl + 2 + strlen(de->d_name) > sizeof(path))
				continue;
			memcpy(path, dirs[i], dl);
			path[dl] = '/';
			strcpy(path + dl + 1, de->d_name);
			if (!one(path, de->d_name, json, !listed))
				listed++;
			else
				prune(path, de->d_name);
		}
		closedir(d);
	}
	return listed;
}
