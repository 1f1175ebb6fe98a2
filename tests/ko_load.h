/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Loading the kvdmabuf module from a test that unloaded it: with the
 * lane's parameters (KVDMABUF_KO_PARAMS, tests/vm/check.sh: the debug
 * lane's small layout blocks), as tests/vm/guest-run.sh loaded it.
 */
#ifndef KVD_KO_LOAD_H
#define KVD_KO_LOAD_H

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* finit_module() of @ko: 0 or -errno (-EEXIST: loaded already). */
static inline int kvd_ko_load_params(const char *ko, const char *params)
{
	int fd = open(ko, O_RDONLY | O_CLOEXEC);
	int ret;

	if (fd < 0)
		return -errno;
	ret = syscall(SYS_finit_module, fd, params, 0) ? -errno : 0;
	close(fd);
	return ret;
}

/* The same, with the lane's parameters. */
static inline int kvd_ko_load(const char *ko)
{
	const char *params = getenv("KVDMABUF_KO_PARAMS");

	return kvd_ko_load_params(ko, params ? params : "");
}

#endif
