// SPDX-License-Identifier: MIT
/*
 * cdi.c - kvdmabuf cdi: a Container Device Interface spec for
 * /dev/kvdmabuf, which CDI-aware runtimes (podman, containerd and CRI-O
 * with CDI on, Kubernetes device plugins and DRA drivers that return CDI
 * names) read from /etc/cdi or /var/run/cdi:
 *
 *   kvdmabuf cdi > /etc/cdi/kvdmabuf.json
 *   podman run --device kvdmabuf/proxy=kvdmabuf ...
 *
 * The container gets the device node as the udev rule makes it on the
 * node (0660, the group kvdmabuf) and that group as an additional group of
 * its processes, so that a non-root user in the container may open it;
 * without the group on the node, a node only the container's root may
 * open (0600). Modes and owners are spelled out: a runtime's default for a
 * node the spec leaves open is 0666 (crun). Written per node: the group's
 * id is the node's.
 */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "../../uapi/kvdmabuf.h"
#include "report.h"

/*
 * The kind's vendor and class (CDI: vendor/class=device). The spec says the
 * lowest CDI version that has what it uses, so that older runtimes take
 * it: 0.7.0 added additionalGids.
 */
#define CDI_KIND "kvdmabuf/proxy"
#define CDI_VERSION "0.6.0"
#define CDI_VERSION_GIDS "0.7.0"

int cmd_cdi(const char *group)
{
	struct group *gr = NULL;
	struct stat st;

	if (stat(KVDMABUF_DEVICE_PATH, &st) || !S_ISCHR(st.st_mode))
		fprintf(stderr, "kvdmabuf cdi: %s is not here (the module is "
			"not loaded?): a runtime reads it when it makes a "
			"container\n", KVDMABUF_DEVICE_PATH);
	errno = 0;
	if (group[0])
		gr = getgrnam(group);
	if (group[0] && !gr)
		fprintf(stderr, "kvdmabuf cdi: no group '%s' on this node: "
			"only root in the container may open the device\n",
			group);
	printf("{\n  \"cdiVersion\": \"%s\",\n  \"kind\": \"%s\",\n"
	       "  \"devices\": [\n    {\n      \"name\": \"kvdmabuf\",\n"
	       "      \"containerEdits\": {\n"
	       "        \"deviceNodes\": [\n          {\"path\": ",
	       gr ? CDI_VERSION_GIDS : CDI_VERSION, CDI_KIND);
	json_str(KVDMABUF_DEVICE_PATH);
	/* 0660 and 0600 in decimal: JSON has no octal */
	printf(", \"permissions\": \"rw\", \"fileMode\": %u, \"uid\": 0, "
	       "\"gid\": %u}\n        ]", gr ? 0660u : 0600u,
	       gr ? (unsigned)gr->gr_gid : 0u);
	if (gr)
		printf(",\n        \"additionalGids\": [%u]", (unsigned)gr->gr_gid);
	printf("\n      }\n    }\n  ]\n}\n");
	return 0;
}
