// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_vmap: CPU access to a proxy (KVDMABUF_FEATURE_VMAP), the way a
 * software NIC (rxe) reads and writes a dma-buf. kvd_importer's CPU import
 * attaches without peer2peer, with a device that has no DMA, and copies
 * through dma_buf_vmap() under the proxy's reservation lock; its
 * invalidation callback gives the mapping up (the lazy variant keeps it
 * until its next access). Each test says which breakage it catches.
 */
#include "harness.h"
#include "proxy_common.h"

#define SIZE		(16 * KVD_PAGE)
#define SEED_A		0xa
#define SEED_B		0xb
#define SEED_W		0x77

FIXTURE(vmap) {
	KVD_IMPORT_FIELDS;
};

FIXTURE_SETUP(vmap)
{
	struct kvdmabuf_version v = { .size = sizeof(v) };

	KVD_IMPORT_SETUP(self, SIZE, SEED_A, SEED_B);
	ASSERT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_VERSION, &v));
	if (!(v.features & KVDMABUF_FEATURE_VMAP))
		SKIP(return, "no CPU access to proxies: dma_buf_vmap() is not called under the buffer's resv before Linux 6.2");
}

FIXTURE_TEARDOWN(vmap)
{
	KVD_IMPORT_TEARDOWN(self);
}

/* ATTACH or REPLACE (@flags), also returning the pins behind an -EBUSY. */
static int attach_pins(int dev, int proxy, int backing, uint32_t flags,
		       uint32_t *pins)
{
	struct kvdmabuf_attach a = {
		.size = sizeof(a), .flags = flags, .proxy_fd = (uint32_t)proxy,
		.backing_fd = (uint32_t)backing, .timeout_ms = 2000,
	};
	int ret = kvd_ioctl(dev, KVDMABUF_IOCTL_ATTACH, &a);

	*pins = a.pins;
	return ret;
}

static int revoke_pins(int dev, int proxy, uint32_t *pins)
{
	struct kvdmabuf_revoke r = {
		.size = sizeof(r), .proxy_fd = (uint32_t)proxy,
		.timeout_ms = 1000,
	};
	int ret = kvd_ioctl(dev, KVDMABUF_IOCTL_REVOKE, &r);

	*pins = r.pins;
	return ret;
}

/*
 * Reads and writes reach the backing at the proxy's offset (caught: the
 * offset not applied to the backing's mapping); the proxy counts the CPU
 * mapping as a live mapping and makes no backing attachment for it (a
 * slot would ask the exporter to map for a device without DMA).
 */
TEST_F(vmap, reads_and_writes_the_backing_at_the_proxy_offset)
{
	struct kvd_imp_counters c;
	struct kvdmabuf_query q;
	int big;

	big = vgem_pattern_buf(self->drm, 2 * SIZE, SEED_A);
	ASSERT_GE(big, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, big, SIZE));
	self->h = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_CPU);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	/* the second half's bytes (the pattern runs on over the first) */
	ASSERT_EQ(1, dmabuf_equals(big, SIZE, self->buf, SIZE));
	EXPECT_EQ(0, dmabuf_equals(big, 0, self->buf, SIZE));
	pattern_fill(self->expect, KVD_PAGE, SEED_W);
	ASSERT_EQ(0, imp_write(self->imp, self->h, 2 * KVD_PAGE, self->expect,
			       KVD_PAGE));
	EXPECT_EQ(1, dmabuf_equals(big, SIZE + 2 * KVD_PAGE, self->expect,
				   KVD_PAGE));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(1, c.mapped);
	EXPECT_EQ(1, c.maps);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(1, q.live_mappings);
	EXPECT_EQ(0, q.backing_attachments);
	EXPECT_EQ(1, q.dynamic_importers);
	close(big);
}

/*
 * REPLACE: the importer is told, gives the mapping up, and its next
 * access reads and writes the new backing only (caught: the old backing's
 * mapping handed out again, or the swap not telling CPU importers). One
 * notification per swap.
 */
TEST_F(vmap, follows_a_replace)
{
	struct kvd_imp_counters c;
	struct kvdmabuf_query q;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_CPU);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(1, c.invalidations);
	EXPECT_EQ(0, c.mapped);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(1, q.notifications);
	EXPECT_EQ(0, q.stale_backings);
	EXPECT_EQ(0, q.live_mappings);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	pattern_fill(self->expect, KVD_PAGE, SEED_W);
	ASSERT_EQ(0, imp_write(self->imp, self->h, 0, self->expect, KVD_PAGE));
	EXPECT_EQ(1, dmabuf_equals(self->b, 0, self->expect, KVD_PAGE));
	pattern_fill(self->buf, KVD_PAGE, SEED_A);
	EXPECT_EQ(1, dmabuf_equals(self->a, 0, self->buf, KVD_PAGE));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(2, c.maps);
}

/*
 * REVOKE: accesses fail with -ENODEV and the module holds nothing of the
 * backing (caught: a vmap of a revoked proxy, or the CPU mapping keeping
 * the old backing).
 */
TEST_F(vmap, refused_while_revoked_and_nothing_held)
{
	struct kvdmabuf_query q;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_CPU);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_EQ(-ENODEV, imp_read(self->imp, self->h, 0, self->buf, 64));
	EXPECT_EQ(-ENODEV, imp_write(self->imp, self->h, 0, self->expect, 64));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(0, q.stale_backings);
	EXPECT_EQ(0, q.live_mappings);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
}

/*
 * An importer that keeps its CPU mapping through the notification: the
 * dma-buf core would go on handing that mapping out, so REPLACE and REVOKE
 * fail with -EBUSY, one pin, nothing changed; the importer still reads
 * the backing it mapped (caught: the check dropped, which lets the core
 * hand out the old backing's pages after the swap).
 */
TEST_F(vmap, a_mapping_kept_through_the_notification_refuses_changes)
{
	struct kvdmabuf_query q;
	uint32_t pins = 0;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy,
			     KVD_IMP_IMPORT_CPU | KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-EBUSY, attach_pins(self->dev, self->proxy, self->b,
				      KVDMABUF_ATTACH_REPLACE, &pins));
	EXPECT_EQ(1, pins);
	pins = 0;
	EXPECT_EQ(-EBUSY, revoke_pins(self->dev, self->proxy, &pins));
	EXPECT_EQ(1, pins);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.generation);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	/* once it lets go, the change goes through */
	ASSERT_EQ(0, imp_release(self->imp, self->h));
	self->h = -1;
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, self->b, 0));
}

/*
 * A DMA importer and a CPU importer of one proxy both follow one swap
 * (caught: the CPU importer given a slot, or left out of the swap).
 */
TEST_F(vmap, dma_and_cpu_importers_follow_together)
{
	struct kvdmabuf_query q;
	int h2;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_CPU);
	ASSERT_GE(self->h, 0);
	h2 = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(h2, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	ASSERT_EQ(0, imp_read(self->imp, h2, 0, self->buf, SIZE));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(2, q.live_mappings);
	EXPECT_EQ(1, q.backing_attachments);
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, imp_read(self->imp, h2, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(1, q.notifications);
	EXPECT_EQ(1, q.backing_attachments);
	imp_release(self->imp, h2);
}

TEST_HARNESS_MAIN
