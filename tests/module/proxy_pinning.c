// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_pinning: an importer holding a blocking pin makes revoke and
 * replace fail with -EBUSY and change nothing; once it goes, revoke works.
 * A pin taken by the core around a dynamic importer's map is not blocking.
 * Importers that cannot take a table without struct pages (a vgem PRIME
 * import) are refused at attach with -EOPNOTSUPP.
 */
#include "harness.h"
#include "proxy_common.h"

#define SIZE		(16 * KVD_PAGE)
#define SEED_A		0x1a
#define SEED_B		0x1b

FIXTURE(pin) {
	int dev, imp, drm;
	int proxy, a, b;
	char buf[SIZE];
};

FIXTURE_SETUP(pin)
{
	self->imp = -1;
	KVD_PROXY_SETUP(self, SIZE, SEED_A, SEED_B);
	KVD_OPEN_IMP(self->imp);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
}

FIXTURE_TEARDOWN(pin)
{
	kvd_close(&self->imp);
	KVD_PROXY_TEARDOWN(self);
}

TEST_F(pin, pinned_importer_blocks_revoke_and_replace)
{
	struct kvdmabuf_query q;
	int pinned, dyn;

	dyn = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(dyn, 0);
	pinned = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_PINNED);
	ASSERT_GE(pinned, 0);
	/* The dynamic importer is mapped too: its core pin is not blocking. */
	ASSERT_EQ(0, imp_read(self->imp, dyn, 0, self->buf, SIZE));

	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(1, q.pinned_importers);
	EXPECT_EQ(1, q.dynamic_importers);
	EXPECT_EQ(1, q.blocking_pins);
	EXPECT_EQ(2, q.live_mappings);
	EXPECT_EQ(1, q.generation);

	EXPECT_EQ(-EBUSY, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_EQ(-EBUSY, kvd_replace(self->dev, self->proxy, self->b, 0));

	/* Nothing changed: still backed by A, both importers read A. */
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.generation);
	EXPECT_EQ(0, q.notifications);
	EXPECT_EQ(2, q.backing_attachments);
	ASSERT_EQ(0, imp_read(self->imp, pinned, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	ASSERT_EQ(0, imp_read(self->imp, dyn, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));

	/* Once the pinning importer goes, revoke works. */
	ASSERT_EQ(0, imp_release(self->imp, pinned));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.blocking_pins);
	EXPECT_EQ(0, q.pinned_importers);
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_EQ(-ENODEV, imp_read(self->imp, dyn, 0, self->buf, SIZE));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(0, q.backing_attachments);
}

TEST_F(pin, pinned_import_of_revoked_proxy_fails)
{
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_EQ(-ENODEV, imp_import(self->imp, self->proxy,
				      KVD_IMP_IMPORT_PINNED));
	/* And the proxy was left without importers. */
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->b, 0));
}

TEST_F(pin, vgem_prime_import_is_refused)
{
	struct kvdmabuf_query q;
	uint32_t handle = 0;

	errno = 0;
	EXPECT_NE(0, drmPrimeFDToHandle(self->drm, self->proxy, &handle));
	EXPECT_EQ(EOPNOTSUPP, errno);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.dynamic_importers + q.pinned_importers);
	EXPECT_EQ(0, q.backing_attachments);
	/* The proxy still works for a capable importer. */
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
}

TEST_HARNESS_MAIN
