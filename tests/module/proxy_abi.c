// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_abi: every kvdmabuf ioctl rejects bad input with its documented
 * errno, as a table: bad fds, foreign dma-bufs, a proxy as backing,
 * offset/size overflow, bad sizes, unknown flags, non-zero reserved and
 * padding fields, short and long struct sizes, NULL argument, unknown
 * command, the per-fd and module-wide proxy limits, old QUERY sizes. Also: control (attach, replace,
 * revoke) only from the creating device fd, the bound on stale backings,
 * CREATE and read() hitting -EFAULT lose nothing, the move-notify feature
 * bit.
 */
#include <sched.h>
#include <stddef.h>
#include <sys/wait.h>
#include <sys/utsname.h>

#include "harness.h"
#include "proxy_common.h"

#define SIZE		(4 * KVD_PAGE)

/* Large enough for any struct plus a tail for the "long struct" cases. */
union kvd_arg {
	struct kvdmabuf_version version;
	struct kvdmabuf_create create;
	struct kvdmabuf_attach attach;
	struct kvdmabuf_revoke revoke;
	struct kvdmabuf_query query;
	unsigned char raw[256];
};

FIXTURE(abi) {
	int dev, drm;
	int proxy;	/* backed by vgem */
	int proxy2;	/* unbacked */
	int vgem;	/* SIZE bytes */
	int small;	/* SIZE / 2 bytes */
	int devnull;
	int closed;	/* a number that is not an open fd */
};

FIXTURE_VARIANT(abi) {
	const char *what;
	unsigned long cmd;
	/* Fills a valid argument, then breaks it. */
	void (*fill)(FIXTURE_DATA(abi) *self, union kvd_arg *a);
	int err;	/* expected errno, 0 for success */
};

static void fill_version(FIXTURE_DATA(abi) *self, union kvd_arg *a)
{
	(void)self;
	a->version.size = sizeof(a->version);
}

static void fill_create(FIXTURE_DATA(abi) *self, union kvd_arg *a)
{
	(void)self;
	a->create.size = sizeof(a->create);
	a->create.length = SIZE;
}

static void fill_attach(FIXTURE_DATA(abi) *self, union kvd_arg *a)
{
	a->attach.size = sizeof(a->attach);
	a->attach.proxy_fd = self->proxy2;
	a->attach.backing_fd = self->vgem;
}

static void fill_revoke(FIXTURE_DATA(abi) *self, union kvd_arg *a)
{
	a->revoke.size = sizeof(a->revoke);
	a->revoke.proxy_fd = self->proxy;
}

static void fill_query(FIXTURE_DATA(abi) *self, union kvd_arg *a)
{
	a->query.size = sizeof(a->query);
	a->query.proxy_fd = self->proxy;
}

#define CASE(name, ioctl_cmd, errno_val, base, ...)			\
	static void fill_##name(FIXTURE_DATA(abi) *self,		\
				union kvd_arg *a)			\
	{								\
		fill_##base(self, a);					\
		__VA_ARGS__;						\
	}								\
	FIXTURE_VARIANT_ADD(abi, name) {				\
		.what = #name, .cmd = ioctl_cmd,			\
		.fill = fill_##name, .err = errno_val,			\
	}

/* Valid calls, as controls. */
CASE(version_ok, KVDMABUF_IOCTL_VERSION, 0, version, (void)0);
CASE(create_ok, KVDMABUF_IOCTL_CREATE, 0, create, (void)0);
CASE(attach_ok, KVDMABUF_IOCTL_ATTACH, 0, attach, (void)0);
CASE(revoke_ok, KVDMABUF_IOCTL_REVOKE, 0, revoke, (void)0);
CASE(query_ok, KVDMABUF_IOCTL_QUERY, 0, query, (void)0);

/* Struct sizes. */
CASE(version_short, KVDMABUF_IOCTL_VERSION, EINVAL, version,
     a->version.size = KVDMABUF_VERSION_SIZE_VER0 - 8);
CASE(create_short, KVDMABUF_IOCTL_CREATE, EINVAL, create,
     a->create.size = 8);
CASE(attach_size_zero, KVDMABUF_IOCTL_ATTACH, EINVAL, attach,
     a->attach.size = 0);
CASE(query_short, KVDMABUF_IOCTL_QUERY, EINVAL, query,
     a->query.size = KVDMABUF_QUERY_SIZE_VER0 - 4);
CASE(create_long_zero_tail, KVDMABUF_IOCTL_CREATE, 0, create,
     a->create.size = sizeof(a->create) + 16);
CASE(create_long_nonzero_tail, KVDMABUF_IOCTL_CREATE, E2BIG, create,
     a->create.size = sizeof(a->create) + 16;
     a->raw[sizeof(a->create) + 3] = 1);
CASE(query_long_zero_tail, KVDMABUF_IOCTL_QUERY, 0, query,
     a->query.size = sizeof(a->query) + 64);
CASE(revoke_long_nonzero_tail, KVDMABUF_IOCTL_REVOKE, E2BIG, revoke,
     a->revoke.size = sizeof(a->revoke) + 8;
     a->raw[sizeof(a->revoke)] = 0xff);
CASE(version_huge, KVDMABUF_IOCTL_VERSION, E2BIG, version,
     a->version.size = 1 << 20);

/* Flags, padding and reserved fields. */
CASE(version_flags, KVDMABUF_IOCTL_VERSION, EINVAL, version,
     a->version.flags = 1);
CASE(version_reserved, KVDMABUF_IOCTL_VERSION, EINVAL, version,
     a->version.reserved = 1);
CASE(create_flags, KVDMABUF_IOCTL_CREATE, EINVAL, create,
     a->create.flags = 1U << 31);
CASE(create_pad, KVDMABUF_IOCTL_CREATE, EINVAL, create, a->create.pad = 1);
CASE(create_reserved, KVDMABUF_IOCTL_CREATE, EINVAL, create,
     a->create.reserved = 1ULL << 63);
CASE(attach_flags, KVDMABUF_IOCTL_ATTACH, EINVAL, attach,
     a->attach.flags = 2);
CASE(attach_pad, KVDMABUF_IOCTL_ATTACH, EINVAL, attach, a->attach.pad = 1);
CASE(attach_reserved, KVDMABUF_IOCTL_ATTACH, EINVAL, attach,
     a->attach.reserved = 1);
CASE(revoke_flags, KVDMABUF_IOCTL_REVOKE, EINVAL, revoke,
     a->revoke.flags = 1);
CASE(revoke_reserved, KVDMABUF_IOCTL_REVOKE, EINVAL, revoke,
     a->revoke.reserved = 1);
CASE(query_flags, KVDMABUF_IOCTL_QUERY, EINVAL, query, a->query.flags = 4);
CASE(query_reserved, KVDMABUF_IOCTL_QUERY, EINVAL, query,
     a->query.reserved = 1);

/* Sizes. */
CASE(create_zero_length, KVDMABUF_IOCTL_CREATE, EINVAL, create,
     a->create.length = 0);
CASE(create_unaligned_length, KVDMABUF_IOCTL_CREATE, EINVAL, create,
     a->create.length = SIZE + 1);
CASE(create_huge_length, KVDMABUF_IOCTL_CREATE, EFBIG, create,
     a->create.length = ~0ULL & ~(KVD_PAGE - 1));

/* File descriptors. */
CASE(attach_proxy_not_dmabuf, KVDMABUF_IOCTL_ATTACH, EINVAL, attach,
     a->attach.proxy_fd = self->devnull);
CASE(attach_proxy_closed_fd, KVDMABUF_IOCTL_ATTACH, EBADF, attach,
     a->attach.proxy_fd = self->closed);
CASE(attach_proxy_negative_fd, KVDMABUF_IOCTL_ATTACH, EBADF, attach,
     a->attach.proxy_fd = (uint32_t)-1);
CASE(attach_proxy_foreign_dmabuf, KVDMABUF_IOCTL_ATTACH, EINVAL, attach,
     a->attach.proxy_fd = self->vgem);
CASE(attach_backing_not_dmabuf, KVDMABUF_IOCTL_ATTACH, EINVAL, attach,
     a->attach.backing_fd = self->devnull);
CASE(attach_backing_closed_fd, KVDMABUF_IOCTL_ATTACH, EBADF, attach,
     a->attach.backing_fd = self->closed);
CASE(attach_backing_is_proxy, KVDMABUF_IOCTL_ATTACH, ELOOP, attach,
     a->attach.backing_fd = self->proxy);
CASE(attach_backing_is_itself, KVDMABUF_IOCTL_ATTACH, ELOOP, attach,
     a->attach.backing_fd = self->proxy2);
CASE(revoke_foreign_dmabuf, KVDMABUF_IOCTL_REVOKE, EINVAL, revoke,
     a->revoke.proxy_fd = self->vgem);
CASE(revoke_closed_fd, KVDMABUF_IOCTL_REVOKE, EBADF, revoke,
     a->revoke.proxy_fd = self->closed);
CASE(query_foreign_dmabuf, KVDMABUF_IOCTL_QUERY, EINVAL, query,
     a->query.proxy_fd = self->vgem);
CASE(query_not_dmabuf, KVDMABUF_IOCTL_QUERY, EINVAL, query,
     a->query.proxy_fd = self->devnull);

/* Offsets and backing sizes. */
CASE(attach_offset_unaligned, KVDMABUF_IOCTL_ATTACH, EINVAL, attach,
     a->attach.offset = 512);
CASE(attach_offset_overflow, KVDMABUF_IOCTL_ATTACH, EOVERFLOW, attach,
     a->attach.offset = ~0ULL & ~(KVD_PAGE - 1));
CASE(attach_offset_past_end, KVDMABUF_IOCTL_ATTACH, ERANGE, attach,
     a->attach.offset = KVD_PAGE);
CASE(attach_backing_too_small, KVDMABUF_IOCTL_ATTACH, ERANGE, attach,
     a->attach.backing_fd = self->small);
CASE(attach_already_backed, KVDMABUF_IOCTL_ATTACH, EEXIST, attach,
     a->attach.proxy_fd = self->proxy);
CASE(attach_timeout_too_long, KVDMABUF_IOCTL_ATTACH, EINVAL, attach,
     a->attach.flags = KVDMABUF_ATTACH_REPLACE;
     a->attach.timeout_ms = KVDMABUF_MAX_TIMEOUT_MS + 1);
CASE(attach_timeout_max, KVDMABUF_IOCTL_ATTACH, 0, attach,
     a->attach.timeout_ms = KVDMABUF_MAX_TIMEOUT_MS);
CASE(revoke_timeout_too_long, KVDMABUF_IOCTL_REVOKE, EINVAL, revoke,
     a->revoke.timeout_ms = ~0U);
CASE(revoke_timeout_max, KVDMABUF_IOCTL_REVOKE, 0, revoke,
     a->revoke.timeout_ms = KVDMABUF_MAX_TIMEOUT_MS);
CASE(attach_replace_backed, KVDMABUF_IOCTL_ATTACH, 0, attach,
     a->attach.proxy_fd = self->proxy;
     a->attach.flags = KVDMABUF_ATTACH_REPLACE);

FIXTURE_SETUP(abi)
{
	self->dev = self->drm = self->proxy = self->proxy2 = -1;
	self->vgem = self->small = self->devnull = -1;
	KVD_OPEN_DEV(self->dev);
	KVD_OPEN_VGEM(self->drm);
	self->vgem = vgem_dmabuf(self->drm, SIZE);
	ASSERT_GE(self->vgem, 0);
	self->small = vgem_dmabuf(self->drm, SIZE / 2);
	ASSERT_GE(self->small, 0);
	self->proxy = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(self->proxy, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->vgem, 0));
	self->proxy2 = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(self->proxy2, 0);
	self->devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->devnull, 0);
	self->closed = dup(self->devnull);
	ASSERT_GE(self->closed, 0);
	close(self->closed);
}

FIXTURE_TEARDOWN(abi)
{
	int fds[] = { self->proxy, self->proxy2, self->vgem, self->small,
		      self->devnull, self->drm, self->dev };
	unsigned int i;

	for (i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

TEST_F(abi, errno_table)
{
	struct kvdmabuf_query q;
	union kvd_arg a;
	int ret;

	memset(&a, 0, sizeof(a));
	variant->fill(self, &a);
	ret = kvd_ioctl(self->dev, variant->cmd, &a);
	TH_LOG("%s: %d (%s)", variant->what, ret, strerror(-ret));
	EXPECT_EQ(-variant->err, ret);
	if (ret == 0 && variant->cmd == KVDMABUF_IOCTL_CREATE) {
		EXPECT_NE(0, a.create.id);
		EXPECT_EQ(FD_CLOEXEC, fcntl(a.create.fd, F_GETFD));
		close(a.create.fd);
	}
	if (!ret) {
		if (variant->cmd == KVDMABUF_IOCTL_QUERY) {
			EXPECT_EQ(SIZE, a.query.length);
			EXPECT_EQ(KVDMABUF_STATE_BACKED, a.query.state);
		}
		return;
	}
	/* A failed call changed nothing. */
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.generation);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy2, &q));
	EXPECT_EQ(KVDMABUF_STATE_UNBACKED, q.state);
	EXPECT_EQ(0, q.generation);
}

FIXTURE(misc) {
	int dev;
};

FIXTURE_SETUP(misc)
{
	KVD_OPEN_DEV(self->dev);
}

FIXTURE_TEARDOWN(misc)
{
	if (self->dev >= 0)
		close(self->dev);
}

TEST_F(misc, null_argument_and_unknown_command)
{
	EXPECT_EQ(-EFAULT, kvd_ioctl(self->dev, KVDMABUF_IOCTL_VERSION, NULL));
	EXPECT_EQ(-EFAULT, kvd_ioctl(self->dev, KVDMABUF_IOCTL_CREATE, NULL));
	EXPECT_EQ(-EFAULT, kvd_ioctl(self->dev, KVDMABUF_IOCTL_QUERY,
				     (void *)16));
	EXPECT_EQ(-ENOTTY, kvd_ioctl(self->dev,
				     _IOWR(KVDMABUF_IOCTL_MAGIC, 0x3f, __u64),
				     NULL));
	EXPECT_EQ(-ENOTTY, kvd_ioctl(self->dev, _IO('x', 1), NULL));
}

TEST_F(misc, short_struct_writes_nothing_past_its_size)
{
	unsigned char raw[64];
	struct kvdmabuf_version *v = (void *)raw;

	memset(raw, 0xee, sizeof(raw));
	memset(v, 0, KVDMABUF_VERSION_SIZE_VER0);
	v->size = KVDMABUF_VERSION_SIZE_VER0;
	ASSERT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_VERSION, v));
	EXPECT_EQ(KVDMABUF_API_VERSION, v->version);
	EXPECT_EQ(0xee, raw[KVDMABUF_VERSION_SIZE_VER0]);
}

TEST_F(misc, no_cloexec_flag)
{
	struct kvdmabuf_create c = {
		.size = sizeof(c), .length = KVD_PAGE,
		.flags = KVDMABUF_CREATE_NO_CLOEXEC,
	};

	ASSERT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_CREATE, &c));
	EXPECT_EQ(0, fcntl(c.fd, F_GETFD));
	close(c.fd);
}

TEST_F(misc, proxy_limit_per_fd)
{
	const char *param = "/sys/module/kvdmabuf/parameters/max_proxies";
	char old[32] = "";
	int fds[3], i, ret;
	FILE *f;

	f = fopen(param, "re");
	if (!f)
		SKIP(return, "%s: %s", param, strerror(errno));
	ASSERT_NOT_NULL(fgets(old, sizeof(old), f));
	fclose(f);
	f = fopen(param, "we");
	if (!f)
		SKIP(return, "cannot write %s (needs root)", param);
	fputs("2\n", f);
	fclose(f);

	for (i = 0; i < 2; i++) {
		fds[i] = kvd_create(self->dev, KVD_PAGE, NULL);
		EXPECT_GE(fds[i], 0);
	}
	ret = kvd_create(self->dev, KVD_PAGE, NULL);
	EXPECT_EQ(-ENOSPC, ret);
	if (ret >= 0)
		close(ret);
	/* Freed proxies give their slot back. */
	close(fds[0]);
	fds[0] = kvd_create(self->dev, KVD_PAGE, NULL);
	EXPECT_GE(fds[0], 0);
	/* The limit is per device fd. */
	{
		int dev2 = kvd_dev_open();

		ASSERT_GE(dev2, 0);
		fds[2] = kvd_create(dev2, KVD_PAGE, NULL);
		EXPECT_GE(fds[2], 0);
		close(dev2);
	}
	for (i = 0; i < 3; i++)
		if (fds[i] >= 0)
			close(fds[i]);

	f = fopen(param, "we");
	ASSERT_NOT_NULL(f);
	fputs(old, f);
	fclose(f);
}

/* Writes @val to module parameter @param; 0 or -errno. */
static int param_write(const char *param, const char *val)
{
	FILE *f = fopen(param, "we");
	int ret = 0;

	if (!f)
		return -errno;
	if (fputs(val, f) < 0)
		ret = -EIO;
	if (fclose(f) && !ret)
		ret = -errno;
	return ret;
}

/* Reopening the device does not get around the bound: one for all fds. */
TEST_F(misc, proxy_limit_total)
{
	const char *param = "/sys/module/kvdmabuf/parameters/max_proxies_total";
	char old[32] = "", val[32];
	int devs[3], fds[3], i, ret;
	long live;
	FILE *f;

	f = fopen(param, "re");
	if (!f)
		TH_LOG("%s: %s (module without max_proxies_total)", param,
		       strerror(errno));
	ASSERT_NOT_NULL(f);
	ASSERT_NOT_NULL(fgets(old, sizeof(old), f));
	fclose(f);
	if (access(param, W_OK))
		SKIP(return, "cannot write %s (needs root)", param);
	live = kvd_stat("proxies");
	if (live < 0)
		SKIP(return, "no %s/stats: %s", KVD_DEBUGFS, strerror(-live));

	/* Room for two more proxies, whatever this process already holds. */
	snprintf(val, sizeof(val), "%ld\n", live + 2);
	ASSERT_EQ(0, param_write(param, val));
	for (i = 0; i < 3; i++) {
		devs[i] = kvd_dev_open();
		fds[i] = -1;
	}
	for (i = 0; i < 2; i++) {
		ASSERT_GE(devs[i], 0);
		fds[i] = kvd_create(devs[i], KVD_PAGE, NULL);
		EXPECT_GE(fds[i], 0);
	}
	ASSERT_GE(devs[2], 0);
	ret = kvd_create(devs[2], KVD_PAGE, NULL);
	EXPECT_EQ(-ENOSPC, ret);
	if (ret >= 0)
		close(ret);
	/* A freed proxy gives its slot back, to any fd. */
	close(fds[0]);
	fds[0] = -1;
	fds[2] = kvd_create(devs[2], KVD_PAGE, NULL);
	EXPECT_GE(fds[2], 0);
	EXPECT_EQ(live + 2, kvd_stat("proxies"));

	for (i = 0; i < 3; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
		if (devs[i] >= 0)
			close(devs[i]);
	}
	ASSERT_EQ(0, param_write(param, old));
}

/*
 * One user's proxies are bounded over all device fds (members of the
 * kvdmabuf group share a node): with the bound at 2, uid 4242 gets two
 * proxies on two fds and no third; uid 4243 has its own two; a freed
 * proxy gives its user the room back. The device fds are opened as root,
 * the effective uid of the CREATE is what counts.
 */
TEST_F(misc, proxy_limit_per_uid)
{
	const char *param = "/sys/module/kvdmabuf/parameters/max_proxies_per_uid";
	int devs[2], a[3], b, i, ret;
	char old[32] = "";
	FILE *f;

	f = fopen(param, "re");
	if (!f)
		TH_LOG("%s: %s (module without max_proxies_per_uid)", param,
		       strerror(errno));
	ASSERT_NOT_NULL(f);
	ASSERT_NOT_NULL(fgets(old, sizeof(old), f));
	fclose(f);
	if (access(param, W_OK) || geteuid())
		SKIP(return, "cannot write %s (needs root)", param);
	for (i = 0; i < 2; i++) {
		devs[i] = kvd_dev_open();
		ASSERT_GE(devs[i], 0);
	}
	ASSERT_EQ(0, param_write(param, "2\n"));

	ASSERT_EQ(0, seteuid(4242));
	a[0] = kvd_create(devs[0], KVD_PAGE, NULL);
	a[1] = kvd_create(devs[1], KVD_PAGE, NULL);
	ret = kvd_create(devs[0], KVD_PAGE, NULL);
	ASSERT_EQ(0, seteuid(0));
	EXPECT_GE(a[0], 0);
	EXPECT_GE(a[1], 0);
	EXPECT_EQ(-ENOSPC, ret);
	if (ret >= 0)
		close(ret);

	ASSERT_EQ(0, seteuid(4243));
	b = kvd_create(devs[1], KVD_PAGE, NULL);
	ASSERT_EQ(0, seteuid(0));
	EXPECT_GE(b, 0);

	close(a[0]);
	ASSERT_EQ(0, seteuid(4242));
	a[2] = kvd_create(devs[1], KVD_PAGE, NULL);
	ASSERT_EQ(0, seteuid(0));
	EXPECT_GE(a[2], 0);

	for (i = 1; i < 3; i++)
		if (a[i] >= 0)
			close(a[i]);
	if (b >= 0)
		close(b);
	for (i = 0; i < 2; i++)
		close(devs[i]);
	ASSERT_EQ(0, param_write(param, old));
}

/* QUERY grew twice (API 2.1, 2.2): every published size still works. */
TEST_F(misc, query_old_sizes)
{
	static const uint32_t sizes[] = {
		KVDMABUF_QUERY_SIZE_VER0, KVDMABUF_QUERY_SIZE_VER1,
		KVDMABUF_QUERY_SIZE_VER2,
	};
	union kvd_arg a;
	unsigned int i;
	int proxy;

	ASSERT_EQ(KVDMABUF_QUERY_SIZE_VER2, sizeof(struct kvdmabuf_query));
	proxy = kvd_create(self->dev, KVD_PAGE, NULL);
	ASSERT_GE(proxy, 0);
	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		memset(&a, 0xee, sizeof(a));
		memset(&a, 0, sizes[i]);
		a.query.size = sizes[i];
		a.query.proxy_fd = (uint32_t)proxy;
		ASSERT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_QUERY, &a));
		EXPECT_EQ(KVD_PAGE, a.query.length);
		/* Not one byte beyond the caller's size. */
		EXPECT_EQ(0xee, a.raw[sizes[i]]);
	}
	close(proxy);
}

TEST_F(misc, proxy_cannot_be_mmapped)
{
	int fd = kvd_create(self->dev, KVD_PAGE, NULL);
	void *p;

	ASSERT_GE(fd, 0);
	p = mmap(NULL, KVD_PAGE, PROT_READ, MAP_SHARED, fd, 0);
	EXPECT_EQ(MAP_FAILED, p);
	if (p != MAP_FAILED)
		munmap(p, KVD_PAGE);
	close(fd);
}

/* ---- control rights, bounds, fd and event hand-over ---- */

FIXTURE(ctl) {
	int dev, imp, drm;
	int a, b;	/* vgem, SIZE bytes each */
};

FIXTURE_SETUP(ctl)
{
	self->dev = self->imp = self->drm = self->a = self->b = -1;
	KVD_OPEN_DEV(self->dev);
	KVD_OPEN_IMP(self->imp);
	KVD_OPEN_VGEM(self->drm);
	self->a = vgem_pattern_buf(self->drm, SIZE, 1);
	ASSERT_GE(self->a, 0);
	self->b = vgem_pattern_buf(self->drm, SIZE, 2);
	ASSERT_GE(self->b, 0);
}

FIXTURE_TEARDOWN(ctl)
{
	int fds[] = { self->a, self->b, self->drm, self->imp, self->dev };
	unsigned int i;

	for (i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

TEST_F(ctl, control_only_from_the_creating_device_fd)
{
	struct kvdmabuf_query q;
	int dev2, dup_dev, proxy, proxy2;

	proxy = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(proxy, 0);
	proxy2 = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(proxy2, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, proxy, self->a, 0));
	dev2 = kvd_dev_open();
	ASSERT_GE(dev2, 0);

	EXPECT_EQ(-EPERM, kvd_replace(dev2, proxy, self->b, 0));
	EXPECT_EQ(-EPERM, kvd_revoke(dev2, proxy, 100));
	EXPECT_EQ(-EPERM, kvd_attach(dev2, proxy2, self->b, 0));
	EXPECT_EQ(-EPERM, kvd_revoke(dev2, proxy2, 0));
	/* Query stays open to every opener. */
	ASSERT_EQ(0, kvd_query(dev2, proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.generation);
	ASSERT_EQ(0, kvd_query(dev2, proxy2, &q));
	EXPECT_EQ(KVDMABUF_STATE_UNBACKED, q.state);
	EXPECT_EQ(0, q.generation);

	/* A dup() of the creating fd is the same open file. */
	dup_dev = dup(self->dev);
	ASSERT_GE(dup_dev, 0);
	EXPECT_EQ(0, kvd_revoke(dup_dev, proxy, 100));
	EXPECT_EQ(0, kvd_attach(dup_dev, proxy2, self->b, 0));
	close(dup_dev);
	close(dev2);
	close(proxy2);
	close(proxy);
}

TEST_F(ctl, stale_backings_are_bounded)
{
	int h[KVDMABUF_MAX_STALE_BACKINGS + 1];
	/*
	 * A buffer per generation: every importer maps every backing it
	 * sees, and more than 7 live mappings of one page for one device
	 * are a leak to DMA API debugging.
	 */
	int gen[KVDMABUF_MAX_STALE_BACKINGS + 2];
	struct kvdmabuf_query q;
	char page[KVD_PAGE];
	int i, proxy;

	for (i = 0; i < (int)(sizeof(gen) / sizeof(gen[0])); i++) {
		gen[i] = vgem_pattern_buf(self->drm, SIZE, 3 + i);
		ASSERT_GE(gen[i], 0);
	}
	proxy = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(proxy, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, proxy, self->a, 0));
	/*
	 * Each lazy importer keeps mapping the backing it last saw; each
	 * replace makes that one stale, still mapped.
	 */
	for (i = 0; i < KVDMABUF_MAX_STALE_BACKINGS; i++) {
		h[i] = imp_import(self->imp, proxy, KVD_IMP_IMPORT_LAZY);
		ASSERT_GE(h[i], 0);
		ASSERT_EQ(0, imp_read(self->imp, h[i], 0, page, sizeof(page)));
		EXPECT_EQ(-ETIMEDOUT, kvd_attach_full(self->dev, proxy, gen[i],
						      0, KVDMABUF_ATTACH_REPLACE,
						      0, NULL));
		ASSERT_EQ(0, kvd_query(self->dev, proxy, &q));
		EXPECT_EQ(i + 1, q.stale_backings);
	}
	h[i] = imp_import(self->imp, proxy, KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(h[i], 0);
	ASSERT_EQ(0, imp_read(self->imp, h[i], 0, page, sizeof(page)));

	/* One more would exceed the bound: refused, nothing changed. */
	EXPECT_EQ(-EAGAIN, kvd_replace(self->dev, proxy, gen[i], 0));
	EXPECT_EQ(-EAGAIN, kvd_revoke(self->dev, proxy, 0));
	ASSERT_EQ(0, kvd_query(self->dev, proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1 + KVDMABUF_MAX_STALE_BACKINGS, q.generation);
	EXPECT_EQ(KVDMABUF_MAX_STALE_BACKINGS, q.stale_backings);

	/* The oldest one's importer moves on: there is room again. */
	ASSERT_EQ(0, imp_read(self->imp, h[0], 0, page, sizeof(page)));
	EXPECT_EQ(-ETIMEDOUT, kvd_attach_full(self->dev, proxy, gen[i + 1], 0,
					      KVDMABUF_ATTACH_REPLACE, 0,
					      NULL));
	ASSERT_EQ(0, kvd_query(self->dev, proxy, &q));
	EXPECT_EQ(2 + KVDMABUF_MAX_STALE_BACKINGS, q.generation);
	EXPECT_EQ(KVDMABUF_MAX_STALE_BACKINGS, q.stale_backings);

	for (i = 0; i <= KVDMABUF_MAX_STALE_BACKINGS; i++)
		EXPECT_EQ(0, imp_release(self->imp, h[i]));
	EXPECT_EQ(0, kvd_revoke(self->dev, proxy, 1000));
	ASSERT_EQ(0, kvd_query(self->dev, proxy, &q));
	EXPECT_EQ(0, q.stale_backings);
	close(proxy);
	for (i = 0; i < (int)(sizeof(gen) / sizeof(gen[0])); i++)
		close(gen[i]);
}

/* The lowest free fd number (what the next open would get). */
static int lowest_free_fd(void)
{
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	if (fd >= 0)
		close(fd);
	return fd;
}

TEST_F(ctl, create_efault_leaves_no_fd_and_no_proxy)
{
	struct kvdmabuf_create *c;
	long proxies;
	int free_fd;

	c = mmap(NULL, KVD_PAGE, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, c);
	c->size = sizeof(*c);
	c->length = SIZE;
	/* Readable, so the call gets as far as writing the result back. */
	ASSERT_EQ(0, mprotect(c, KVD_PAGE, PROT_READ));
	proxies = kvd_stat("proxies");
	free_fd = lowest_free_fd();
	ASSERT_GE(free_fd, 0);

	EXPECT_EQ(-EFAULT, kvd_ioctl(self->dev, KVDMABUF_IOCTL_CREATE, c));
	EXPECT_EQ(free_fd, lowest_free_fd());
	if (proxies >= 0)
		EXPECT_EQ(proxies, kvd_stat("proxies"));
	munmap(c, KVD_PAGE);
}

TEST_F(ctl, read_efault_keeps_the_events)
{
	struct kvdmabuf_event ev[4];
	int dev2, proxy, fl, n;
	void *ro;

	/* A fresh device fd: its queue holds only this proxy's events. */
	dev2 = kvd_dev_open();
	ASSERT_GE(dev2, 0);
	proxy = kvd_create(dev2, SIZE, NULL);
	ASSERT_GE(proxy, 0);
	ASSERT_EQ(0, kvd_attach(dev2, proxy, self->a, 0));
	ASSERT_EQ(0, kvd_revoke(dev2, proxy, 100));
	fl = fcntl(dev2, F_GETFL);
	ASSERT_EQ(0, fcntl(dev2, F_SETFL, fl | O_NONBLOCK));

	ro = mmap(NULL, KVD_PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS,
		  -1, 0);
	ASSERT_NE(MAP_FAILED, ro);
	EXPECT_EQ(-1, read(dev2, ro, sizeof(ev)));
	EXPECT_EQ(EFAULT, errno);
	munmap(ro, KVD_PAGE);

	/* Both records are still there, in order, nothing flagged lost. */
	n = read(dev2, ev, sizeof(ev));
	ASSERT_EQ(2 * (int)sizeof(ev[0]), n);
	EXPECT_EQ(KVDMABUF_STATE_BACKED, ev[0].state);
	EXPECT_EQ(1, ev[0].generation);
	EXPECT_EQ(0, ev[0].flags);
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, ev[1].state);
	EXPECT_EQ(2, ev[1].generation);
	EXPECT_EQ(0, ev[1].flags);
	close(proxy);
	close(dev2);
}

/*
 * The module answers only its own magic: gdrcopy's gdrdrv uses 0xDA (the
 * magic of API 2) on the same GPU nodes, so a command of its sent here by
 * mistake must be refused, not taken for one of ours.
 */
TEST_F(ctl, gdrdrv_magic_is_not_ours)
{
	struct kvdmabuf_version v = { .size = sizeof(v) };

	EXPECT_NE(0xDA, KVDMABUF_IOCTL_MAGIC);
	EXPECT_EQ(-ENOTTY, kvd_ioctl(self->dev,
				     _IOWR(0xDA, 0x00, struct kvdmabuf_version),
				     &v));
	ASSERT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_VERSION, &v));
	EXPECT_EQ(3, v.version >> 16);
}

/* LIST from @dev: the entry of proxy @id, 0 if found. */
static int list_entry(int dev, uint64_t id, struct kvdmabuf_proxy_stat *out)
{
	struct kvdmabuf_proxy_stat st[64];
	struct kvdmabuf_list l = {
		.size = sizeof(l), .stat_size = sizeof(st[0]), .count = 64,
		.stats = (uintptr_t)st,
	};
	unsigned int i;

	memset(st, 0, sizeof(st));
	if (kvd_ioctl(dev, KVDMABUF_IOCTL_LIST, &l))
		return -1;
	for (i = 0; i < l.count && i < 64; i++) {
		if (st[i].id == id) {
			*out = st[i];
			return 0;
		}
	}
	return -1;
}

/*
 * In a child in a new pid namespace (pid 1 there) and, where permitted
 * (not in a chroot, as the VM lanes run), a new user namespace without a
 * uid map: LIST's view of proxy @id. Returns 0 if the owner shows as pid
 * 0 and as the overflow uid (the caller's own uid without a new user
 * namespace), 10 or 11 if not, 5 without pid namespaces in the
 * kernel, 1 on other failures; *@userns says
 * whether the user namespace was made.
 */
static int list_from_new_namespaces(int dev, uint64_t id, int *userns)
{
	struct kvdmabuf_proxy_stat st;
	pid_t child, grandchild;
	int status, pipefd[2];
	char made = 0;

	if (pipe(pipefd))
		return 1;
	child = fork();
	if (child < 0)
		return 1;
	if (!child) {
		uid_t want = geteuid();

		if (!unshare(CLONE_NEWUSER | CLONE_NEWPID)) {
			made = 1;
			want = 65534;
		} else if (unshare(CLONE_NEWPID)) {
			_exit(errno == EINVAL ? 5 : 1);	/* 5: no CONFIG_PID_NS */
		}
		if (write(pipefd[1], &made, 1) != 1)
			_exit(1);
		grandchild = fork();
		if (grandchild < 0)
			_exit(1);
		if (!grandchild) {
			if (list_entry(dev, id, &st))
				_exit(1);
			if (st.owner_pid != 0)
				_exit(10);
			if (st.owner_uid != want)
				_exit(11);
			_exit(0);
		}
		if (waitpid(grandchild, &status, 0) != grandchild ||
		    !WIFEXITED(status))
			_exit(1);
		_exit(WEXITSTATUS(status));
	}
	close(pipefd[1]);
	if (read(pipefd[0], &made, 1) != 1)
		made = 0;
	close(pipefd[0]);
	*userns = made;
	if (waitpid(child, &status, 0) != child || !WIFEXITED(status))
		return 1;
	return WEXITSTATUS(status);
}

/*
 * LIST reports the owner as the caller's namespaces see it: in a new pid
 * namespace a creator outside it has no pid (0), and in a new user
 * namespace without a uid map the owner's uid is the overflow uid.
 * Before, the initial namespaces' ids leaked into containers.
 */
TEST_F(ctl, list_ids_in_the_callers_namespaces)
{
	struct kvdmabuf_proxy_stat st;
	struct kvdmabuf_query q;
	int p, ret, userns = 0;

	p = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(p, 0);
	ASSERT_EQ(0, kvd_query(self->dev, p, &q));
	ASSERT_EQ(0, list_entry(self->dev, q.id, &st));
	EXPECT_EQ(getpid(), st.owner_pid);
	EXPECT_EQ(geteuid(), st.owner_uid);
	ret = list_from_new_namespaces(self->dev, q.id, &userns);
	close(p);
	if (ret == 5)
		SKIP(return, "no pid namespaces in this kernel (CONFIG_PID_NS not set)");
	TH_LOG("new pid namespace%s", userns ? " and user namespace" :
	       " (no user namespace: not permitted in a chroot)");
	if (ret == 10)
		TH_LOG("owner_pid is the creator's pid outside the namespace");
	if (ret == 11)
		TH_LOG("owner_uid is not the uid the caller's user namespace maps");
	EXPECT_EQ(0, ret);
}

/* The feature bit agrees with the running kernel's configuration. */
TEST_F(ctl, move_notify_core_feature_matches_the_kernel)
{
	struct kvdmabuf_version v = { .size = sizeof(v) };
	char path[300], line[256];
	struct utsname u;
	int configured = 0, exists = 0;
	FILE *f;

	ASSERT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_VERSION, &v));
	EXPECT_EQ(KVDMABUF_API_VERSION_MAJOR, v.version >> 16);
	ASSERT_EQ(0, uname(&u));
	snprintf(path, sizeof(path), "/boot/config-%s", u.release);
	f = fopen(path, "re");
	if (!f)
		SKIP(return, "%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		if (strstr(line, "CONFIG_DMABUF_MOVE_NOTIFY"))
			exists = 1;
		if (!strcmp(line, "CONFIG_DMABUF_MOVE_NOTIFY=y\n"))
			configured = 1;
	}
	fclose(f);
	/* Linux 7.1 removed the option: the core never pins a dynamic
	 * exporter around a dynamic importer's map any more. */
	TH_LOG("%s: CONFIG_DMABUF_MOVE_NOTIFY %s, feature %s", path,
	       !exists ? "gone (7.1+)" : configured ? "set" : "unset",
	       v.features & KVDMABUF_FEATURE_MOVE_NOTIFY_CORE ? "on" : "off");
	EXPECT_EQ(configured || !exists,
		  !!(v.features & KVDMABUF_FEATURE_MOVE_NOTIFY_CORE));
}

TEST_HARNESS_MAIN
