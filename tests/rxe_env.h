/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rxe_env.h - is soft-RoCE with dma-buf MRs (tests/rxe) usable in this
 * guest? Both halves must be there: the patched rdma_rxe (its
 * dmabuf_pinned parameter) and rdma-core's patched rxe provider, which
 * tests/vm/guest-run.sh names in RDMAV_DRIVERS. Where the lane could not
 * build one, its SKIP file under $KVDMABUF_BUILD/tests/rxe/build says why.
 */
#ifndef KVDMABUF_TESTS_RXE_ENV_H
#define KVDMABUF_TESTS_RXE_ENV_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#define PINNED_PARAM "/sys/module/rdma_rxe/parameters/dmabuf_pinned"

/*
 * rdma_rxe's dmabuf_pinned: dma-buf MRs registered while it is set pin
 * their dma-buf (as efa and bnxt_re do); the others follow moves.
 * 0 or -errno.
 */
static inline int rxe_set_pinned(int on)
{
	int fd = open(PINNED_PARAM, O_WRONLY | O_CLOEXEC);
	int ret = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, on ? "Y" : "N", 1) != 1)
		ret = -errno;
	close(fd);
	return ret;
}

/* The first line of $KVDMABUF_BUILD/tests/rxe/build/@file into @why. */
static inline void rxe_skip_file(const char *file, char *why, size_t len)
{
	const char *build = getenv("KVDMABUF_BUILD");
	char path[512];
	FILE *f;

	if (!build)
		return;
	snprintf(path, sizeof(path), "%s/tests/rxe/build/%s", build, file);
	f = fopen(path, "re");
	if (!f)
		return;
	if (fgets(why, (int)len, f))
		why[strcspn(why, "\n")] = 0;
	fclose(f);
}

/* NULL when both halves (module and provider) are loaded, else why not. */
static inline const char *rxe_dmabuf_missing(void)
{
	static char why[300];

	if (access(PINNED_PARAM, F_OK)) {
		snprintf(why, sizeof(why), "rdma_rxe without dma-buf MRs loaded");
		rxe_skip_file("SKIP", why, sizeof(why));
		return why;
	}
	if (!getenv("RDMAV_DRIVERS")) {
		char file[256] = "no provider library";

		rxe_skip_file("provider/SKIP", file, sizeof(file));
		snprintf(why, sizeof(why), "rxe provider not built: %.250s",
			 file);
		return why;
	}
	return NULL;
}

#endif /* KVDMABUF_TESTS_RXE_ENV_H */
