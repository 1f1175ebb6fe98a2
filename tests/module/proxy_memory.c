// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_memory: after a revoke, and once user space closed its own fds,
 * the old backing's memory is really freed (vgem buffers are shmem: Shmem
 * in /proc/meminfo falls by the buffer size) by the time REVOKE or REPLACE
 * returns. Without the revoke the proxy keeps it alive, which is the bug
 * kvdmabuf fixes.
 */
#include "harness.h"
#include "proxy_common.h"

#define BIG		(32UL << 20)
#define BIG_KB		(long)(BIG >> 10)

FIXTURE(mem) {
	int dev, imp, drm, proxy, h;
	long base_kb;
	char buf[KVD_PAGE];
};

FIXTURE_SETUP(mem)
{
	self->dev = self->imp = self->drm = self->proxy = self->h = -1;
	KVD_OPEN_DEV(self->dev);
	KVD_OPEN_IMP(self->imp);
	KVD_OPEN_VGEM(self->drm);
	self->base_kb = meminfo_kb("Shmem");
	ASSERT_GE(self->base_kb, 0);
	self->proxy = kvd_create(self->dev, BIG, NULL);
	ASSERT_GE(self->proxy, 0);
}

FIXTURE_TEARDOWN(mem)
{
	if (self->h >= 0)
		imp_release(self->imp, self->h);
	if (self->proxy >= 0)
		close(self->proxy);
	if (self->drm >= 0)
		close(self->drm);
	if (self->imp >= 0)
		close(self->imp);
	if (self->dev >= 0)
		close(self->dev);
}

/* Polls Shmem until it is at most @limit_kb; returns the last value. */
static long shmem_wait_below(long limit_kb, int ms)
{
	long kb = meminfo_kb("Shmem");

	ms = kvd_scaled_ms(ms);
	while (kb > limit_kb && ms > 0) {
		usleep(10000);
		ms -= 10;
		kb = meminfo_kb("Shmem");
	}
	return kb;
}

/* Backs the proxy with a fresh, fully populated vgem buffer that the
 * importer has mapped, then closes the user's fd of the buffer. */
static void back_and_map(struct __test_metadata *_metadata,
			 FIXTURE_DATA(mem) *self)
{
	int a = vgem_pattern_buf(self->drm, BIG, 0x5);

	ASSERT_GE(a, 0);
	EXPECT_GE(meminfo_kb("Shmem"), self->base_kb + BIG_KB * 9 / 10);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, a, 0));
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, BIG - KVD_PAGE, self->buf,
			      KVD_PAGE));
	close(a);
}

TEST_F(mem, revoke_gives_the_memory_back)
{
	struct kvdmabuf_query q;
	long kb;

	back_and_map(_metadata, self);
	/* The user's fd is closed, the proxy still holds the backing. */
	usleep(100000);
	EXPECT_GE(meminfo_kb("Shmem"), self->base_kb + BIG_KB * 9 / 10);

	/* Freed when REVOKE returns: looked at once, not polled for. */
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	kb = meminfo_kb("Shmem");
	TH_LOG("Shmem: base %ld kB, after revoke %ld kB", self->base_kb, kb);
	EXPECT_LE(kb, self->base_kb + BIG_KB / 10);

	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.backing_attachments);
	EXPECT_EQ(0, q.stale_backings);
	/* The importer is still attached, only its mapping went. */
	EXPECT_EQ(1, q.dynamic_importers);
	EXPECT_EQ(0, q.live_mappings);
}

TEST_F(mem, without_revoke_the_memory_stays)
{
	long kb;

	back_and_map(_metadata, self);
	usleep(300000);
	kb = meminfo_kb("Shmem");
	TH_LOG("Shmem: base %ld kB, fd closed, no revoke: %ld kB",
	       self->base_kb, kb);
	EXPECT_GE(kb, self->base_kb + BIG_KB * 9 / 10);

	/* Dropping the proxy and its importer frees it. */
	ASSERT_EQ(0, imp_release(self->imp, self->h));
	self->h = -1;
	close(self->proxy);
	self->proxy = -1;
	kb = shmem_wait_below(self->base_kb + BIG_KB / 10, 3000);
	EXPECT_LE(kb, self->base_kb + BIG_KB / 10);
}

TEST_F(mem, replace_gives_the_old_memory_back)
{
	long kb;
	int b;

	back_and_map(_metadata, self);
	b = vgem_pattern_buf(self->drm, BIG, 0x6);
	ASSERT_GE(b, 0);
	EXPECT_GE(meminfo_kb("Shmem"), self->base_kb + 2 * BIG_KB * 9 / 10);
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, b, 0));
	kb = meminfo_kb("Shmem");	/* at once, as for a revoke */
	close(b);
	EXPECT_LE(kb, self->base_kb + BIG_KB * 11 / 10);
	EXPECT_GE(kb, self->base_kb + BIG_KB * 9 / 10);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, KVD_PAGE));
	EXPECT_EQ(-1, pattern_check(self->buf, KVD_PAGE, 0x6));
}

TEST_HARNESS_MAIN
