// SPDX-License-Identifier: MIT
/*
 * state_file.c - the preload's state file (state_file.h). The folder may
 * be shared by every user (1777): nothing another user left there is
 * opened, followed or trusted.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"            /* kvd_proc_start_time() */
#include "kvdmabuf_preload.h"
#include "state_file.h"

void kp_state_unlink_stale(void)
{
	const char *env = getenv(KVDMABUF_PRELOAD_DIR_ENV);
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char path[320];

	if (env && strcmp(env, "off")) {
		snprintf(path, sizeof(path), "%s/%d", env, (int)getpid());
		unlink(path);
	} else if (!env) {
		snprintf(path, sizeof(path), "%s/%d", KVDMABUF_PRELOAD_RUN_DIR,
			 (int)getpid());
		unlink(path);
		if (xdg && *xdg) {
			snprintf(path, sizeof(path), "%s/kvdmabuf-preload/%d",
				 xdg, (int)getpid());
			unlink(path);
		}
	}
}

/* The folder of the state files: KVDMABUF_PRELOAD_DIR ("off": none), else
 * the first of /run/kvdmabuf/preload and $XDG_RUNTIME_DIR/kvdmabuf-preload
 * that exists or can be made. */
static void dir_find(struct kp_state_file *sf)
{
	const char *env = getenv(KVDMABUF_PRELOAD_DIR_ENV);
	const char *xdg = getenv("XDG_RUNTIME_DIR");

	sf->dir_known = true;
	sf->dir[0] = '\0';
	if (env) {
		if (strcmp(env, "off"))
			snprintf(sf->dir, sizeof(sf->dir), "%s", env);
		return;
	}
	/* sticky and open to all, as /tmp: each user writes its own pids */
	mkdir("/run/kvdmabuf", 0755);
	if ((!mkdir(KVDMABUF_PRELOAD_RUN_DIR, 01777) || errno == EEXIST) &&
	    !access(KVDMABUF_PRELOAD_RUN_DIR, W_OK | X_OK)) {
		chmod(KVDMABUF_PRELOAD_RUN_DIR, 01777);
		snprintf(sf->dir, sizeof(sf->dir), "%s",
			 KVDMABUF_PRELOAD_RUN_DIR);
		return;
	}
	if (xdg && *xdg) {
		snprintf(sf->dir, sizeof(sf->dir), "%s/kvdmabuf-preload", xdg);
		if (mkdir(sf->dir, 0700) && errno != EEXIST)
			sf->dir[0] = '\0';
	}
}

/* Whether @name in the folder is a state file (PID) or a temporary one
 * (.PID.XXXXXX) that a process of our user left and no longer writes:
 * its pid gone, or (a state file) reused by a later process. */
static bool left_behind(int dir, const char *name)
{
	char buf[128], *end;
	unsigned long long t;
	bool tmp = name[0] == '.';
	struct stat st;
	long pid;
	ssize_t n;
	int fd;

	pid = strtol(name + tmp, &end, 10);
	if (pid <= 0 || end == name + tmp || (tmp ? *end != '.' : *end) ||
	    fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) ||
	    !S_ISREG(st.st_mode) || st.st_uid != geteuid())
		return false;
	t = kvd_proc_start_time((int)pid);
	if (!t || tmp)
		return !t;
	/* a live pid: the file's, or an earlier process's of that pid */
	fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	end = strstr(buf, "\npid ");            /* "pid PID STARTTIME" */
	if (!end || !(end = strchr(end + 5, ' ')))
		return false;   /* not a state file: not ours to judge */
	return strtoull(end, NULL, 10) != t;
}

/*
 * Once per process, before its first file: the files of our user that
 * processes which ended without their destructor (killed, _exit) left in
 * the folder are removed; `kvdmabuf status` skips them anyway, but a
 * shared folder would fill up.
 */
static void sweep(struct kp_state_file *sf)
{
	DIR *d;
	struct dirent *e;

	sf->swept = true;
	d = opendir(sf->dir);
	if (!d)
		return;
	while ((e = readdir(d)))
		if (left_behind(dirfd(d), e->d_name))
			unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
}

FILE *kp_state_begin(struct kp_state_file *sf)
{
	pid_t pid = getpid();
	FILE *f;
	int fd;

	if (!sf->dir_known)
		dir_find(sf);
	if (!sf->dir[0])
		return NULL;
	if (!sf->swept)
		sweep(sf);
	/*
	 * A new file of a fresh name (O_EXCL): whatever another user left
	 * under a name we could predict (a FIFO would block the open, a link
	 * redirect it) is never opened. The rename cannot replace another
	 * user's file there (sticky folder).
	 */
	snprintf(sf->tmp, sizeof(sf->tmp), "%s/.%d.XXXXXX", sf->dir, (int)pid);
	fd = mkostemp(sf->tmp, O_CLOEXEC);
	if (fd < 0)
		return NULL;
	f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		unlink(sf->tmp);
		return NULL;
	}
	fprintf(f, "kvdmabuf-preload 2\npid %d %llu\n", (int)pid,
		kvd_proc_start_time(0));
	return f;
}

void kp_state_commit(struct kp_state_file *sf, FILE *f)
{
	char path[320];
	pid_t pid = getpid();

	snprintf(path, sizeof(path), "%s/%d", sf->dir, (int)pid);
	if (fclose(f) || rename(sf->tmp, path)) {
		unlink(sf->tmp);
		return;
	}
	sf->published = pid;
}

void kp_state_remove(struct kp_state_file *sf)
{
	char path[320];

	if (sf->published && sf->published == getpid() && sf->dir[0]) {
		snprintf(path, sizeof(path), "%s/%d", sf->dir, (int)getpid());
		unlink(path);
		sf->published = 0;
	}
}

void kp_state_forget(struct kp_state_file *sf)
{
	sf->published = 0;
	sf->swept = false;
}
