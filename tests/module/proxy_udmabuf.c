// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_udmabuf: udmabuf (memfd pages as a dma-buf) as a second backing
 * exporter: an importer of the proxy reads and writes the memfd's bytes,
 * follows a replace to a vgem buffer and back, and a revoke. Needs
 * /dev/udmabuf (CONFIG_UDMABUF: Debian 6.12, not Debian 6.1: skips there).
 */
#include <linux/udmabuf.h>
#include <sys/mman.h>

#include "harness.h"
#include "proxy_common.h"

#define SIZE		(16 * KVD_PAGE)

FIXTURE(udmabuf) {
	int dev, imp, drm, udev;
	int memfd, ubuf, proxy, h;
	char *map;
	char buf[SIZE];
};

/* A udmabuf over @memfd's first @size bytes; fd or -errno. */
static int udmabuf_create(int udev, int memfd, uint64_t size)
{
	struct udmabuf_create c = {
		.memfd = (uint32_t)memfd, .flags = UDMABUF_FLAGS_CLOEXEC,
		.offset = 0, .size = size,
	};
	int fd = ioctl(udev, UDMABUF_CREATE, &c);

	return fd < 0 ? -errno : fd;
}

FIXTURE_SETUP(udmabuf)
{
	self->dev = self->imp = self->drm = self->udev = -1;
	self->memfd = self->ubuf = self->proxy = self->h = -1;
	self->map = MAP_FAILED;
	self->udev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (self->udev < 0)
		SKIP(return, "/dev/udmabuf: %s (CONFIG_UDMABUF not set, as in Debian 6.1)",
		     strerror(errno));
	KVD_OPEN_DEV(self->dev);
	KVD_OPEN_IMP(self->imp);
	KVD_OPEN_VGEM(self->drm);

	self->memfd = memfd_create("kvd-udmabuf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ASSERT_GE(self->memfd, 0);
	ASSERT_EQ(0, ftruncate(self->memfd, SIZE));
	ASSERT_EQ(0, fcntl(self->memfd, F_ADD_SEALS, F_SEAL_SHRINK));
	self->map = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
			 self->memfd, 0);
	ASSERT_NE(MAP_FAILED, self->map);
	pattern_fill(self->map, SIZE, 0x31);
	self->ubuf = udmabuf_create(self->udev, self->memfd, SIZE);
	ASSERT_GE(self->ubuf, 0);
	self->proxy = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(self->proxy, 0);
}

FIXTURE_TEARDOWN(udmabuf)
{
	int fds[] = { self->proxy, self->ubuf, self->memfd, self->drm,
		      self->udev, self->dev };
	unsigned int i;

	if (self->h >= 0)
		imp_release(self->imp, self->h);
	if (self->imp >= 0)
		close(self->imp);
	if (self->map != MAP_FAILED)
		munmap(self->map, SIZE);
	for (i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

TEST_F(udmabuf, importer_follows_udmabuf_and_vgem)
{
	char page[KVD_PAGE];
	int v, u2;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->ubuf, 0));
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, 0x31));

	/* A write through the proxy shows in the memfd. */
	pattern_fill(page, sizeof(page), 0x77);
	ASSERT_EQ(0, imp_write(self->imp, self->h, 2 * KVD_PAGE, page,
			       sizeof(page)));
	EXPECT_EQ(0, memcmp(self->map + 2 * KVD_PAGE, page, sizeof(page)));

	/* Replace with vgem, then with a second udmabuf. */
	v = vgem_pattern_buf(self->drm, SIZE, 0x32);
	ASSERT_GE(v, 0);
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, v, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, 0x32));
	close(v);

	pattern_fill(self->map, SIZE, 0x33);
	u2 = udmabuf_create(self->udev, self->memfd, SIZE);
	ASSERT_GE(u2, 0);
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, u2, 0));
	close(u2);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, 0x33));

	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_EQ(-ENODEV, imp_read(self->imp, self->h, 0, self->buf, SIZE));
}

TEST_F(udmabuf, offset_into_a_udmabuf)
{
	int proxy2;

	proxy2 = kvd_create(self->dev, SIZE / 2, NULL);
	ASSERT_GE(proxy2, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, proxy2, self->ubuf, SIZE / 2));
	self->h = imp_import(self->imp, proxy2, 0);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE / 2));
	EXPECT_EQ(0, memcmp(self->buf, self->map + SIZE / 2, SIZE / 2));
	EXPECT_EQ(-EINVAL, imp_read(self->imp, self->h, SIZE / 2, self->buf, 1));
	ASSERT_EQ(0, imp_release(self->imp, self->h));
	self->h = -1;
	close(proxy2);
}

TEST_HARNESS_MAIN
