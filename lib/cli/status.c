// SPDX-License-Identifier: MIT
/*
 * status.c - `kvdmabuf status`: the proxies this user may see, from the
 * module's LIST ioctl (no debugfs, no root needed), with the CUDA mapping
 * of each, from the name libkvdmabuf gives the proxy dma-buf
 * ("kvd:<id>:pcie" or "kvd:<id>:default"), which the owner's
 * /proc/PID/fdinfo shows to its user and to root. Then the processes
 * under libkvdmabuf-preload.so (preload.c); `status --preload` lists only
 * those, and needs no module.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "../../uapi/kvdmabuf.h"
#include "report.h"

static const char *state_name(uint32_t s)
{
	static const char *const n[] = { "unbacked", "backed", "revoked",
					 "released" };

	return s < 4 ? n[s] : "?";
}

/* All entries: asks again with more room while proxies keep appearing. */
static int list_all(int fd, struct kvdmabuf_proxy_stat **out, uint32_t *n)
{
	struct kvdmabuf_proxy_stat *st = NULL;
	struct kvdmabuf_list l;
	uint32_t room = 16;

	for (;;) {
		void *p = realloc(st, room * sizeof(*st));

		if (!p) {
			free(st);
			return -ENOMEM;
		}
		st = p;
		memset(&l, 0, sizeof(l));
		l.size = sizeof(l);
		l.stat_size = sizeof(*st);
		l.count = room;
		l.stats = (uint64_t)(uintptr_t)st;
		if (ioctl(fd, KVDMABUF_IOCTL_LIST, &l)) {
			int rc = -errno;

			free(st);
			return rc;
		}
		if (l.count <= room)
			break;
		room = l.count + 16;
	}
	*out = st;
	*n = l.count;
	return 0;
}

/*
 * The mappings named on the dma-bufs that process @pid holds: for each
 * fdinfo with "name:\tkvd:<id>:<mapping>", the proxy of @st with that id
 * and owner gets <mapping>. What cannot be read (another user's process,
 * one that ended) leaves "-".
 */
static void find_mappings(pid_t pid, const struct kvdmabuf_proxy_stat *st,
			  uint32_t n, const char **mapping)
{
	char path[64], line[128];
	struct dirent *de;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fdinfo", (int)pid);
	d = opendir(path);
	if (!d)
		return;
	while ((de = readdir(d))) {
		unsigned long long id;
		char map[16];
		uint32_t i;
		FILE *f;
		int fd;

		if (de->d_name[0] == '.')
			continue;
		fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		f = fdopen(fd, "r");
		if (!f) {
			close(fd);
			continue;
		}
		while (fgets(line, sizeof(line), f)) {
			if (sscanf(line, "name: kvd:%llu:%15[a-z]", &id,
				   map) != 2)
				continue;
			for (i = 0; i < n; i++)
				if (st[i].id == id && st[i].owner_pid == pid)
					mapping[i] = !strcmp(map, "pcie") ?
						     "pcie" : "default";
		}
		fclose(f);
	}
	closedir(d);
}

/* --json: an error is a document too, so that a script always parses. */
static int status_error(bool json, const char *fmt, const char *what,
			const char *hint)
{
	char msg[256];

	snprintf(msg, sizeof(msg), fmt, what, hint);
	fprintf(stderr, "kvdmabuf status: %s\n", msg);
	if (json) {
		printf("{\"proxies\": [], \"error\": ");
		json_str(msg);
		printf("}\n");
	}
	return 2;
}

int cmd_status(bool json, bool only_preload)
{
	struct kvdmabuf_proxy_stat *st = NULL;
	const char **mapping;
	uint32_t n = 0, i, j;
	int fd, rc;

	if (only_preload) {
		if (json)
			printf("{\"preload\": [");
		rc = preload_status(json);
		if (json)
			printf("\n]}\n");
		else if (!rc)
			printf("(no process under libkvdmabuf-preload.so)\n");
		return 0;
	}
	fd = open(KVDMABUF_DEVICE_PATH, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = errno;
		return status_error(json, "%s: %s", KVDMABUF_DEVICE_PATH,
				    rc == ENOENT ? "No such file or directory "
				    "(is the kvdmabuf module loaded?)" :
				    strerror(rc));
	}
	rc = list_all(fd, &st, &n);
	close(fd);
	if (rc)
		return status_error(json, "LIST: %s%s", strerror(-rc),
				    rc == -ENOTTY ?
				    " (module older than API 2.1)" : "");
	mapping = calloc(n + 1, sizeof(*mapping));
	if (!mapping) {
		free(st);
		return status_error(json, "%s%s", strerror(ENOMEM), "");
	}
	for (i = 0; i < n; i++) {
		/* each owner's fdinfo once */
		for (j = 0; j < i && st[j].owner_pid != st[i].owner_pid; j++)
			;
		if (j == i)
			find_mappings(st[i].owner_pid, st, n, mapping);
	}
	if (json)
		printf("{\"proxies\": [");
	else
		printf("%8s %12s %-9s %6s %7s %6s %9s %8s %6s %8s %6s %-7s\n",
		       "id", "bytes", "state", "gen", "dynamic", "pinned",
		       "revocable", "mappings", "stale", "pid", "uid",
		       "cuda-map");
	for (i = 0; i < n; i++) {
		const struct kvdmabuf_proxy_stat *s = &st[i];
		const char *state = s->flags & KVDMABUF_STAT_BUSY ? "busy" :
				    state_name(s->state);
		const char *m = mapping[i] ? mapping[i] : "-";

		if (json)
			printf("%s\n  {\"id\": %llu, \"length\": %llu, "
			       "\"state\": \"%s\", \"generation\": %llu, "
			       "\"dynamic_importers\": %u, "
			       "\"pinned_importers\": %u, "
			       "\"revocable_importers\": %u, "
			       "\"revocable_pins\": %u, \"live_mappings\": %u, "
			       "\"stale_backings\": %u, \"owner_pid\": %d, "
			       "\"owner_uid\": %u, \"cuda_mapping\": %s%s%s}",
			       i ? "," : "",
			       (unsigned long long)s->id,
			       (unsigned long long)s->length, state,
			       (unsigned long long)s->generation,
			       s->dynamic_importers, s->pinned_importers,
			       s->revocable_importers, s->revocable_pins,
			       s->live_mappings, s->stale_backings,
			       s->owner_pid, s->owner_uid,
			       *m == '-' ? "" : "\"", *m == '-' ? "null" : m,
			       *m == '-' ? "" : "\"");
		else
			printf("%8llu %12llu %-9s %6llu %7u %6u %9u %8u %6u "
			       "%8d %6u %-7s\n", (unsigned long long)s->id,
			       (unsigned long long)s->length, state,
			       (unsigned long long)s->generation,
			       s->dynamic_importers, s->pinned_importers,
			       s->revocable_importers, s->live_mappings,
			       s->stale_backings, s->owner_pid, s->owner_uid,
			       m);
	}
	if (json)
		printf("\n], \"preload\": [");
	else if (!n)
		printf("(no proxy)\n");
	preload_status(json);
	if (json)
		printf("\n]}\n");
	free(mapping);
	free(st);
	return 0;
}
