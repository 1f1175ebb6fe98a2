// SPDX-License-Identifier: MIT
/*
 * status.c - `kvdmabuf status`: the proxies this user may see, from the
 * module's LIST ioctl (no debugfs, no root needed).
 */
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

int cmd_status(int argc, char **argv)
{
	bool json = argc > 1 && !strcmp(argv[1], "--json");
	struct kvdmabuf_proxy_stat *st = NULL;
	uint32_t n = 0, i;
	int fd, rc;

	fd = open(KVDMABUF_DEVICE_PATH, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "kvdmabuf status: %s: %s\n",
			KVDMABUF_DEVICE_PATH, strerror(errno));
		return 2;
	}
	rc = list_all(fd, &st, &n);
	close(fd);
	if (rc) {
		fprintf(stderr, "kvdmabuf status: LIST: %s%s\n", strerror(-rc),
			rc == -ENOTTY ? " (module older than API 2.1)" : "");
		return 2;
	}
	if (json)
		printf("{\"proxies\": [");
	else
		printf("%8s %12s %-9s %6s %7s %6s %9s %8s %6s %8s %6s\n",
		       "id", "bytes", "state", "gen", "dynamic", "pinned",
		       "revocable", "mappings", "stale", "pid", "uid");
	for (i = 0; i < n; i++) {
		const struct kvdmabuf_proxy_stat *s = &st[i];
		const char *state = s->flags & KVDMABUF_STAT_BUSY ? "busy" :
				    state_name(s->state);

		if (json)
			printf("%s\n  {\"id\": %llu, \"length\": %llu, "
			       "\"state\": \"%s\", \"generation\": %llu, "
			       "\"dynamic_importers\": %u, "
			       "\"pinned_importers\": %u, "
			       "\"revocable_importers\": %u, "
			       "\"revocable_pins\": %u, \"live_mappings\": %u, "
			       "\"stale_backings\": %u, \"owner_pid\": %d, "
			       "\"owner_uid\": %u}", i ? "," : "",
			       (unsigned long long)s->id,
			       (unsigned long long)s->length, state,
			       (unsigned long long)s->generation,
			       s->dynamic_importers, s->pinned_importers,
			       s->revocable_importers, s->revocable_pins,
			       s->live_mappings, s->stale_backings,
			       s->owner_pid, s->owner_uid);
		else
			printf("%8llu %12llu %-9s %6llu %7u %6u %9u %8u %6u "
			       "%8d %6u\n", (unsigned long long)s->id,
			       (unsigned long long)s->length, state,
			       (unsigned long long)s->generation,
			       s->dynamic_importers, s->pinned_importers,
			       s->revocable_importers, s->live_mappings,
			       s->stale_backings, s->owner_pid, s->owner_uid);
	}
	if (json)
		printf("\n]}\n");
	else if (!n)
		printf("(no proxy)\n");
	free(st);
	return 0;
}
