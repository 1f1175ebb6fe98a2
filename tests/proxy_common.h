/* SPDX-License-Identifier: GPL-2.0 */
/*
 * proxy_common.h - helpers for the kvdmabuf module's kselftests
 * (tests/module/proxy_*.c): raw ioctl wrappers returning 0 or -errno for
 * /dev/kvdmabuf and the test importer, vgem buffers, and the module's
 * debugfs counters.
 *
 * The importer is /dev/kvd_importer (tests/kmod/kvd_importer.c, calls the
 * dma-buf API itself) unless the program defines KVD_IMP_UMEM before
 * including this file: then it is /dev/kvd_umem (tests/kmod/kvd_umem.c,
 * the same ABI on ib_core's dma-buf MR code), loaded on first use from
 * $KVDMABUF_BUILD/tests/kmod if it is not loaded yet. The *_umem programs
 * are the follow, pinning, races and lifetime programs built that way.
 */
#ifndef KVDMABUF_TESTS_PROXY_COMMON_H
#define KVDMABUF_TESTS_PROXY_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../uapi/kvdmabuf.h"

#include "kmod/kvd_exporter.h"
#include "kmod/kvd_importer.h"
#include "kmod/kvd_umem.h"
#include "procfs.h"
#include "timeout_scale.h"
#include "vgem.h"

#define KVD_PAGE	4096UL
#define KVD_DEBUGFS	"/sys/kernel/debug/kvdmabuf"

/* ---- /dev/kvdmabuf ---- */

static inline int kvd_dev_open(void)
{
	int fd = open(KVDMABUF_DEVICE_PATH, O_RDWR | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

static inline int kvd_ioctl(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) ? -errno : 0;
}

/* Creates a proxy of @length bytes; returns its fd or -errno. */
static inline int kvd_create(int dev, uint64_t length, uint64_t *id)
{
	struct kvdmabuf_create c = { .size = sizeof(c), .length = length };
	int ret = kvd_ioctl(dev, KVDMABUF_IOCTL_CREATE, &c);

	if (ret)
		return ret;
	if (id)
		*id = c.id;
	return (int)c.fd;
}

static inline int kvd_attach_full(int dev, int proxy, int backing,
				  uint64_t offset, uint32_t flags,
				  uint32_t timeout_ms, uint64_t *generation)
{
	struct kvdmabuf_attach a = {
		.size = sizeof(a), .flags = flags, .proxy_fd = (uint32_t)proxy,
		.backing_fd = (uint32_t)backing, .offset = offset,
		.timeout_ms = timeout_ms,
	};
	int ret = kvd_ioctl(dev, KVDMABUF_IOCTL_ATTACH, &a);

	if (!ret && generation)
		*generation = a.generation;
	return ret;
}

static inline int kvd_attach(int dev, int proxy, int backing, uint64_t offset)
{
	return kvd_attach_full(dev, proxy, backing, offset, 0, 0, NULL);
}

static inline int kvd_replace(int dev, int proxy, int backing, uint64_t offset)
{
	return kvd_attach_full(dev, proxy, backing, offset,
			       KVDMABUF_ATTACH_REPLACE, 2000, NULL);
}

/* *@generation, where not NULL, is written when the call returns 0. */
static inline int kvd_revoke_full(int dev, int proxy, uint32_t timeout_ms,
				  uint64_t *generation)
{
	struct kvdmabuf_revoke r = {
		.size = sizeof(r), .proxy_fd = (uint32_t)proxy,
		.timeout_ms = timeout_ms,
	};
	int ret = kvd_ioctl(dev, KVDMABUF_IOCTL_REVOKE, &r);

	if (!ret && generation)
		*generation = r.generation;
	return ret;
}

static inline int kvd_revoke(int dev, int proxy, uint32_t timeout_ms)
{
	return kvd_revoke_full(dev, proxy, timeout_ms, NULL);
}

/*
 * Changes @n ranges of @proxy in one KVDMABUF_IOCTL_RANGES (timeout 2 s,
 * scaled); *@generation and *@pins are written when the module answers.
 */
static inline int kvd_ranges_full(int dev, int proxy,
				  const struct kvdmabuf_range *r, uint32_t n,
				  uint64_t *generation, uint32_t *pins)
{
	struct kvdmabuf_ranges a = {
		.size = sizeof(a), .proxy_fd = (uint32_t)proxy, .count = n,
		.ranges = (uintptr_t)r, .range_size = sizeof(*r),
		.timeout_ms = (uint32_t)kvd_scaled_ms(2000),
	};
	int ret = kvd_ioctl(dev, KVDMABUF_IOCTL_RANGES, &a);

	if (generation)
		*generation = a.generation;
	if (pins)
		*pins = a.pins;
	return ret;
}

static inline int kvd_ranges(int dev, int proxy,
			     const struct kvdmabuf_range *r, uint32_t n)
{
	return kvd_ranges_full(dev, proxy, r, n, NULL, NULL);
}

static inline int kvd_query(int dev, int proxy, struct kvdmabuf_query *q)
{
	memset(q, 0, sizeof(*q));
	q->size = sizeof(*q);
	q->proxy_fd = (uint32_t)proxy;
	return kvd_ioctl(dev, KVDMABUF_IOCTL_QUERY, q);
}

/* ---- the test importer: /dev/kvd_importer or /dev/kvd_umem ---- */

#ifdef KVD_IMP_UMEM
#define KVD_IMP_PATH		KVD_UMEM_PATH
#define KVD_IMP_MODULE		"kvd_umem"
#define KVD_IMP_DEV_SUFFIX	".0"	/* platform device kvd_umem.0 */
#else
#define KVD_IMP_PATH		KVD_IMPORTER_PATH
#define KVD_IMP_MODULE		"kvd_importer"
#define KVD_IMP_DEV_SUFFIX	""	/* platform device kvd_importer */
#endif

/*
 * Loads test module tests/kmod/@name.ko of $KVDMABUF_BUILD unless it is
 * loaded (@deps: modprobe'd first, e.g. ib_uverbs for kvd_umem); waits for
 * its device node @path. 0 or -errno.
 */
static inline int kvd_test_module_load(const char *name, const char *deps,
				       const char *path)
{
	const char *build = getenv("KVDMABUF_BUILD");
	char buf[4096];
	struct stat st;
	int fd, ret = 0, i;

	snprintf(buf, sizeof(buf), "/sys/module/%s", name);
	if (stat(buf, &st)) {
		if (!build || geteuid())
			return -ENOENT;
		if (deps) {
			snprintf(buf, sizeof(buf), "modprobe -q %s", deps);
			if (system(buf))
				return -ENOENT;
		}
		snprintf(buf, sizeof(buf), "%s/tests/kmod/%s.ko", build, name);
		fd = open(buf, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		if (syscall(SYS_finit_module, fd, "", 0) && errno != EEXIST)
			ret = -errno;
		close(fd);
		if (ret)
			return ret;
	}
	for (i = 0; i < kvd_scaled_ms(2000) / 10 && access(path, F_OK); i++)
		usleep(10000);
	return access(path, F_OK) ? -errno : 0;
}

static inline int imp_open(void)
{
	int fd = open(KVD_IMP_PATH, O_RDWR | O_CLOEXEC);

#ifdef KVD_IMP_UMEM
	if (fd < 0 && errno == ENOENT &&
	    !kvd_test_module_load("kvd_umem", "ib_uverbs", KVD_UMEM_PATH))
		fd = open(KVD_IMP_PATH, O_RDWR | O_CLOEXEC);
#endif
	return fd < 0 ? -errno : fd;
}

/* Imports @dmabuf; returns the handle or -errno. */
static inline int imp_import(int imp, int dmabuf, uint32_t flags)
{
	struct kvd_imp_import i = { .fd = (uint32_t)dmabuf, .flags = flags };
	int ret = kvd_ioctl(imp, KVD_IMP_IOCTL_IMPORT, &i);

	return ret ? ret : (int)i.handle;
}

static inline int imp_access(int imp, int h, uint64_t off, void *buf,
			     uint64_t len, int write)
{
	struct kvd_imp_access a = {
		.handle = (uint32_t)h, .offset = off, .length = len,
		.buf = (uintptr_t)buf,
		.flags = write ? KVD_IMP_ACCESS_WRITE : 0,
	};

	return kvd_ioctl(imp, KVD_IMP_IOCTL_ACCESS, &a);
}

static inline int imp_read(int imp, int h, uint64_t off, void *buf,
			   uint64_t len)
{
	return imp_access(imp, h, off, buf, len, 0);
}

static inline int imp_write(int imp, int h, uint64_t off, const void *buf,
			    uint64_t len)
{
	return imp_access(imp, h, off, (void *)buf, len, 1);
}

static inline int imp_counters(int imp, int h, struct kvd_imp_counters *c)
{
	memset(c, 0, sizeof(*c));
	c->handle = (uint32_t)h;
	return kvd_ioctl(imp, KVD_IMP_IOCTL_COUNTERS, c);
}

static inline int imp_release(int imp, int h)
{
	struct kvd_imp_release r = { .handle = (uint32_t)h };

	return kvd_ioctl(imp, KVD_IMP_IOCTL_RELEASE, &r);
}

/* Adds a fence to the import's resv that signals @delay_ms from now. */
static inline int imp_fence(int imp, int h, uint32_t delay_ms)
{
	struct kvd_imp_fence f = { .handle = (uint32_t)h, .delay_ms = delay_ms };

	return kvd_ioctl(imp, KVD_IMP_IOCTL_FENCE, &f);
}

/*
 * Fixture set-up steps: open the module's device, the test importer or
 * vgem into @fd, or skip the test with the reason (what the machine lacks).
 */
#define KVD_OPEN_DEV(fd)						\
	do {								\
		fd = kvd_dev_open();					\
		if (fd < 0)						\
			SKIP(return, "%s: %s (kvdmabuf module not loaded)", \
			     KVDMABUF_DEVICE_PATH, strerror(-fd));	\
	} while (0)

#define KVD_OPEN_IMP(fd)						\
	do {								\
		fd = imp_open();					\
		if (fd < 0)						\
			SKIP(return, "%s: %s (%s test module not loaded)", \
			     KVD_IMP_PATH, strerror(-fd), KVD_IMP_MODULE); \
	} while (0)

#define KVD_OPEN_VGEM(fd)						\
	do {								\
		fd = vgem_open();					\
		if (fd < 0)						\
			SKIP(return, "no vgem device (modprobe vgem)");	\
	} while (0)

/*
 * The proxy tests' common fixture: the module's device, vgem, pattern
 * buffers A and B of @size (seeds @sa and @sb) and an unbacked proxy of
 * @size, in the fixture's fields dev, drm, a, b and proxy. Every one is -1
 * until opened: KVD_PROXY_TEARDOWN may follow a set-up that stopped
 * anywhere (a fixture sets its own other fds to -1 before this).
 */
#define KVD_PROXY_SETUP(self, size, sa, sb)				\
	do {								\
		(self)->dev = (self)->drm = -1;				\
		(self)->proxy = (self)->a = (self)->b = -1;		\
		KVD_OPEN_DEV((self)->dev);				\
		KVD_OPEN_VGEM((self)->drm);				\
		(self)->a = vgem_pattern_buf((self)->drm, size, sa);	\
		ASSERT_GE((self)->a, 0);				\
		(self)->b = vgem_pattern_buf((self)->drm, size, sb);	\
		ASSERT_GE((self)->b, 0);				\
		(self)->proxy = kvd_create((self)->dev, size, NULL);	\
		ASSERT_GE((self)->proxy, 0);				\
	} while (0)

static inline void kvd_close(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* The proxy first: the device file goes last. */
#define KVD_PROXY_TEARDOWN(self)					\
	do {								\
		kvd_close(&(self)->proxy);				\
		kvd_close(&(self)->a);					\
		kvd_close(&(self)->b);					\
		kvd_close(&(self)->drm);				\
		kvd_close(&(self)->dev);				\
	} while (0)

/*
 * The importing tests' fixture (proxy_follow, proxy_vmap): the common one,
 * the test importer in imp, its import of the proxy in h (-1 until
 * imported, released by the teardown) and two buffers of @size, buf and
 * expect.
 */
#define KVD_IMPORT_FIELDS						\
	int dev, imp, drm;						\
	int proxy, a, b, h;						\
	char *buf, *expect

#define KVD_IMPORT_SETUP(self, size, sa, sb)				\
	do {								\
		(self)->imp = (self)->h = -1;				\
		(self)->buf = malloc(size);				\
		(self)->expect = malloc(size);				\
		ASSERT_NOT_NULL((self)->buf);				\
		ASSERT_NOT_NULL((self)->expect);			\
		KVD_PROXY_SETUP(self, size, sa, sb);			\
		KVD_OPEN_IMP((self)->imp);				\
	} while (0)

#define KVD_IMPORT_TEARDOWN(self)					\
	do {								\
		if ((self)->h >= 0)					\
			imp_release((self)->imp, (self)->h);		\
		kvd_close(&(self)->imp);				\
		KVD_PROXY_TEARDOWN(self);				\
		free((self)->buf);					\
		free((self)->expect);					\
	} while (0)

/* ---- /dev/kvd_exporter: a dynamic exporter that moves and revokes ---- */

static inline int exp_open(void)
{
	int fd = open(KVD_EXPORTER_PATH, O_RDWR | O_CLOEXEC);

	if (fd < 0 && errno == ENOENT &&
	    !kvd_test_module_load("kvd_exporter", NULL, KVD_EXPORTER_PATH))
		fd = open(KVD_EXPORTER_PATH, O_RDWR | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/*
 * How long a slow kvd_exporter map or unmap sleeps: 0.4 s, times the
 * lane's KVDMABUF_TIMEOUT_SCALE (1.6 s on debug). Tests tell a call that
 * waited for it from one that did not (a few ms under TCG) by half of it.
 */
static inline unsigned int exp_slow_ms(void)
{
	return (unsigned int)kvd_scaled_ms(400);
}

/*
 * A kvd_exporter buffer of @size bytes filled with pattern @seed; a slow
 * one's maps or unmaps sleep exp_slow_ms().
 */
static inline int exp_buf(int exp, uint64_t size, uint32_t flags,
			  uint32_t seed)
{
	struct kvd_exp_create c = { .size = size, .flags = flags };
	struct kvd_exp_fill f = { .seed = seed };
	int ret;

	if (flags & (KVD_EXP_CREATE_SLOW_MAP | KVD_EXP_CREATE_SLOW_UNMAP))
		c.slow_ms = exp_slow_ms();
	ret = kvd_ioctl(exp, KVD_EXP_IOCTL_CREATE, &c);
	if (ret)
		return ret;
	f.fd = c.fd;
	ret = kvd_ioctl(exp, KVD_EXP_IOCTL_FILL, &f);
	if (ret) {
		close((int)c.fd);
		return ret;
	}
	return (int)c.fd;
}

static inline int exp_fill(int exp, int buf, uint32_t seed)
{
	struct kvd_exp_fill f = { .fd = (uint32_t)buf, .seed = seed };

	return kvd_ioctl(exp, KVD_EXP_IOCTL_FILL, &f);
}

static inline int exp_move(int exp, int buf)
{
	uint32_t fd = (uint32_t)buf;

	return kvd_ioctl(exp, KVD_EXP_IOCTL_MOVE, &fd);
}

static inline int exp_revoke(int exp, int buf)
{
	uint32_t fd = (uint32_t)buf;

	return kvd_ioctl(exp, KVD_EXP_IOCTL_REVOKE, &fd);
}

static inline int exp_info(int exp, int buf, struct kvd_exp_info *i)
{
	memset(i, 0, sizeof(*i));
	i->fd = (uint32_t)buf;
	return kvd_ioctl(exp, KVD_EXP_IOCTL_INFO, i);
}

/* Mappings @i says were made for device @name (0 if none). */
static inline uint64_t exp_dev_maps(const struct kvd_exp_info *i,
				    const char *name)
{
	int d;

	for (d = 0; d < KVD_EXP_MAX_DEVS; d++)
		if (!strncmp(i->dev_names[d], name, KVD_EXP_DEVNAME_LEN))
			return i->dev_maps[d];
	return 0;
}

#define KVD_OPEN_EXP(fd)						\
	do {								\
		fd = exp_open();					\
		if (fd < 0)						\
			SKIP(return, "%s: %s (kvd_exporter test module not loaded)", \
			     KVD_EXPORTER_PATH, strerror(-fd));		\
	} while (0)

/* Polls QUERY until the proxy is in @state (about 2 s at most, scaled). */
static inline int kvd_wait_state(int dev, int proxy, uint32_t state,
				 struct kvdmabuf_query *q)
{
	int i, ret = 0;

	for (i = 0; i < kvd_scaled_ms(2000) / 5; i++) {
		ret = kvd_query(dev, proxy, q);
		if (ret || q->state == state)
			return ret;
		usleep(5000);
	}
	return -ETIMEDOUT;
}

/* ---- backings ---- */


/* Compares @len bytes of dma-buf @fd at @off with @expect (1 if equal). */
static inline int dmabuf_equals(int fd, uint64_t off, const void *expect,
				size_t len)
{
	size_t map_len = off + len;
	int eq;
	char *p;

	p = mmap(NULL, map_len, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	eq = !memcmp(p + off, expect, len);
	munmap(p, map_len);
	return eq;
}

/* ---- debugfs counters and /proc/meminfo ---- */

static inline void kvd_debugfs_mount(void)
{
	if (access("/sys/kernel/debug/kvdmabuf", F_OK))
		mount("debugfs", "/sys/kernel/debug", "debugfs", 0, NULL);
}

/* Reads one counter of KVD_DEBUGFS/stats, or -errno. */
static inline long kvd_stat(const char *name)
{
	char key[64];
	long val, ret = -ENOENT;
	FILE *f;

	kvd_debugfs_mount();
	f = fopen(KVD_DEBUGFS "/stats", "re");
	if (!f)
		return -errno;
	while (fscanf(f, "%63s %ld", key, &val) == 2)
		if (!strcmp(key, name))
			ret = val;
	fclose(f);
	return ret;
}

#endif /* KVDMABUF_TESTS_PROXY_COMMON_H */
