// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_revocable: importers of the Linux 7.1+ dma-buf core that older
 * kernels do not have.
 *
 * - A pinned revocable importer (ib_core's
 *   ib_umem_dmabuf_get_pinned_revocable_and_lock(), irdma's dma-buf MR
 *   path, through /dev/kvd_umem) does not make REVOKE fail: the revoke's
 *   invalidation revokes it for good (its callback runs once, its mapping
 *   goes, it never maps again) and the backing is dropped. REPLACE still
 *   fails with -EBUSY while it holds its pin, changing nothing. QUERY
 *   reports its pins as revocable.
 * - An importer without an invalidation callback (/dev/kvd_importer's
 *   KVD_IMP_IMPORT_NO_NOTIFY) may attach, but cannot map the proxy unless
 *   it holds a pin (-EOPNOTSUPP); pinned, it blocks REVOKE and REPLACE.
 *
 * - An exporter that admits only revocable attachments (vfio-pci) never
 *   gets a slot of an importer without an invalidation callback: the
 *   importer is refused with the exporter's -EOPNOTSUPP.
 * - REVOKE of a proxy its backing's exporter revoked is not refused by
 *   such an importer's pin (-EBUSY is for a backing to take away).
 *
 * On kernels without these APIs each test skips and says which is missing
 * (KVDMABUF_FEATURE_REVOCABLE_PINS tells whether the module can know a
 * revocable pin).
 */
#include "harness.h"
#include "proxy_common.h"

#define SIZE		(16 * KVD_PAGE)
#define SEED_A		0x3a
#define SEED_B		0x3b

FIXTURE(rev) {
	int dev, umem, imp, drm;
	int proxy, a, b;
	char buf[SIZE];
};

FIXTURE_SETUP(rev)
{
	self->umem = self->imp = -1;
	KVD_PROXY_SETUP(self, SIZE, SEED_A, SEED_B);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
}

FIXTURE_TEARDOWN(rev)
{
	kvd_close(&self->umem);
	kvd_close(&self->imp);
	KVD_PROXY_TEARDOWN(self);
}

#define OPEN_UMEM(fd)							\
	do {								\
		int _r = kvd_test_module_load("kvd_umem", "ib_uverbs",	\
					      KVD_UMEM_PATH);		\
		if (_r)							\
			SKIP(return, "%s: %s (kvd_umem test module not loaded)", \
			     KVD_UMEM_PATH, strerror(-_r));		\
		fd = open(KVD_UMEM_PATH, O_RDWR | O_CLOEXEC);		\
		ASSERT_GE(fd, 0);					\
	} while (0)

#define OPEN_IMPORTER(fd)						\
	do {								\
		fd = open(KVD_IMPORTER_PATH, O_RDWR | O_CLOEXEC);	\
		if (fd < 0)						\
			SKIP(return, "%s: %s (kvd_importer test module not loaded)", \
			     KVD_IMPORTER_PATH, strerror(errno));	\
	} while (0)

static uint64_t kvd_features(int dev)
{
	struct kvdmabuf_version v = { .size = sizeof(v) };

	return kvd_ioctl(dev, KVDMABUF_IOCTL_VERSION, &v) ? 0 : v.features;
}

/*
 * Has the kernel's dma-buf core the revoke series (dma_buf_attach_revocable(),
 * optional invalidation callback)? Asked of kvd_importer, built from the
 * same headers, not of the module under test: 1, 0 or -errno.
 */
static int core_has_revoke_series(int buf)
{
	int imp = open(KVD_IMPORTER_PATH, O_RDWR | O_CLOEXEC), h;

	if (imp < 0)
		return -errno;
	h = imp_import(imp, buf, KVD_IMP_IMPORT_NO_NOTIFY);
	close(imp);		/* releases the import */
	return h == -EOPNOTSUPP ? 0 : h < 0 ? h : 1;
}

/*
 * Imports pinned and revocable, or skips where the dma-buf core cannot tell
 * such an importer (its pin then blocks like any other: Debian's 6.12 has
 * ib_core's revocable umems but not dma_buf_attach_revocable()) or where
 * ib_core has no such umem. Where the core can, the module must say so.
 */
#define IMPORT_REVOCABLE(h)						\
	do {								\
		int _c = core_has_revoke_series(self->b);		\
		ASSERT_GE(_c, 0);					\
		if (!_c)						\
			SKIP(return, "the dma-buf core cannot tell revocable pins " \
			     "(no dma_buf_attach_revocable(), Linux 7.1+): every pin blocks"); \
		ASSERT_TRUE(kvd_features(self->dev) &			\
			    KVDMABUF_FEATURE_REVOCABLE_PINS);		\
		h = imp_import(self->umem, self->proxy,			\
			       KVD_UMEM_IMPORT_PINNED_REVOCABLE);	\
		if (h == -EOPNOTSUPP)					\
			SKIP(return, "ib_core has no pinned revocable dma-buf umem " \
			     "(ib_umem_dmabuf_get_pinned_revocable_and_lock, Linux 7.1+)"); \
		ASSERT_GE(h, 0);					\
	} while (0)

/* Imports without invalidation callback, or skips where the core needs one. */
#define IMPORT_NO_NOTIFY(h, flags)					\
	do {								\
		h = imp_import(self->imp, self->proxy,			\
			       KVD_IMP_IMPORT_NO_NOTIFY | (flags));	\
		if (h == -EOPNOTSUPP)					\
			SKIP(return, "the dma-buf core requires an invalidation " \
			     "callback of dynamic importers (optional since Linux 7.1)"); \
		ASSERT_GE(h, 0);					\
	} while (0)

static int umem_info(int umem, int h, struct kvd_umem_info *i)
{
	memset(i, 0, sizeof(*i));
	i->handle = (uint32_t)h;
	return kvd_ioctl(umem, KVD_UMEM_IOCTL_INFO, i);
}

TEST_F(rev, pinned_revocable_umem_is_revoked_not_blocking)
{
	struct kvdmabuf_query q;
	struct kvd_umem_info i;
	int h;

	OPEN_UMEM(self->umem);
	IMPORT_REVOCABLE(h);
	ASSERT_EQ(0, imp_read(self->umem, h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));

	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(1, q.revocable_pins);
	EXPECT_EQ(1, q.revocable_importers);
	EXPECT_EQ(1, q.pinned_importers);	/* the library: REREGISTER */
	EXPECT_EQ(0, q.dynamic_importers);
	EXPECT_EQ(0, q.blocking_pins);
	EXPECT_EQ(1, q.live_mappings);

	/* Not -EBUSY: the revoke revokes the umem for good. */
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, umem_info(self->umem, h, &i));
	EXPECT_EQ(1, i.revokes);
	EXPECT_EQ(1, i.revoked);
	EXPECT_EQ(0, i.nmap);		/* unmapped in the callback */

	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(KVDMABUF_REVOKE_USER, q.revoke_reason);
	EXPECT_EQ(0, q.revocable_pins);	/* unpinned in the callback */
	/*
	 * Still attached, dead: still the revocable pinned importer it was
	 * (never a dynamic one: it will not map again, so the library must
	 * not take FOLLOW for it).
	 */
	EXPECT_EQ(1, q.revocable_importers);
	EXPECT_EQ(1, q.pinned_importers);
	EXPECT_EQ(0, q.dynamic_importers);
	EXPECT_EQ(0, q.live_mappings);
	EXPECT_EQ(1, q.notifications);
	/* The backing is dropped: its memory can go. */
	EXPECT_EQ(0, q.backing_attachments);
	EXPECT_EQ(0, q.stale_backings);
	EXPECT_EQ(0, kvd_stat("backings"));

	/* A revoked umem never maps again, not even a new backing. */
	EXPECT_NE(0, imp_read(self->umem, h, 0, self->buf, SIZE));
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->b, 0));
	EXPECT_NE(0, imp_read(self->umem, h, 0, self->buf, SIZE));
	ASSERT_EQ(0, umem_info(self->umem, h, &i));
	EXPECT_EQ(1, i.revokes);
	EXPECT_EQ(0, i.nmap);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(1, q.pinned_importers);
	EXPECT_EQ(0, q.dynamic_importers);
	/* Nor does the new backing get a slot (a pin) for it. */
	EXPECT_EQ(0, q.backing_attachments);
	EXPECT_EQ(0, imp_release(self->umem, h));
}

/*
 * A revocable pin blocks a replace (the importer keeps its pages until a
 * revoke). Where the dma-buf core cannot tell revocable pins (before
 * Linux 7.1), irdma's driver takes the plain pinned path instead
 * (ib_umem_dmabuf_get_pinned()): that pin blocks the replace as well,
 * counted as blocking.
 */
TEST_F(rev, pinned_revocable_umem_blocks_replace)
{
	struct kvdmabuf_query q;
	struct kvd_umem_info i;
	int h, revocable;

	OPEN_UMEM(self->umem);
	revocable = core_has_revoke_series(self->b);
	ASSERT_GE(revocable, 0);
	if (revocable) {
		IMPORT_REVOCABLE(h);
	} else {
		h = imp_import(self->umem, self->proxy, KVD_IMP_IMPORT_PINNED);
		ASSERT_GE(h, 0);
	}
	EXPECT_EQ(-EBUSY, kvd_replace(self->dev, self->proxy, self->b, 0));

	/* Nothing changed. */
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.generation);
	EXPECT_EQ(0, q.notifications);
	EXPECT_EQ(revocable ? 1 : 0, q.revocable_pins);
	EXPECT_EQ(revocable ? 0 : 1, q.blocking_pins);
	EXPECT_EQ(1, q.backing_attachments);
	EXPECT_EQ(0, q.stale_backings);
	ASSERT_EQ(0, umem_info(self->umem, h, &i));
	EXPECT_EQ(0, i.revokes);
	EXPECT_EQ(0, i.revoked);
	ASSERT_EQ(0, imp_read(self->umem, h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));

	/* Once it is gone, replace works. */
	ASSERT_EQ(0, imp_release(self->umem, h));
	EXPECT_EQ(0, kvd_replace(self->dev, self->proxy, self->b, 0));
}

TEST_F(rev, no_callback_import_without_pin_cannot_map)
{
	struct kvd_imp_counters c;
	struct kvdmabuf_query q;
	int h, dyn;

	OPEN_IMPORTER(self->imp);
	IMPORT_NO_NOTIFY(h, 0);
	/* It would be moved without being told: no mapping. */
	EXPECT_EQ(-EOPNOTSUPP, imp_read(self->imp, h, 0, self->buf, SIZE));
	ASSERT_EQ(0, imp_counters(self->imp, h, &c));
	EXPECT_EQ(0, c.maps);
	EXPECT_EQ(1, c.failed);
	EXPECT_EQ(0, c.mapped);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.live_mappings);
	EXPECT_EQ(1, q.dynamic_importers);

	/* A dynamic importer with a callback on the same proxy still maps. */
	dyn = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(dyn, 0);
	ASSERT_EQ(0, imp_read(self->imp, dyn, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	/* Nothing pins: revoke and a new backing work. */
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->b, 0));
	EXPECT_EQ(-EOPNOTSUPP, imp_read(self->imp, h, 0, self->buf, SIZE));
	ASSERT_EQ(0, imp_read(self->imp, dyn, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	EXPECT_EQ(0, imp_release(self->imp, h));
	EXPECT_EQ(0, imp_release(self->imp, dyn));
}

TEST_F(rev, no_callback_pinned_import_blocks_revoke)
{
	struct kvdmabuf_query q;
	int pinned, bare;

	OPEN_IMPORTER(self->imp);
	IMPORT_NO_NOTIFY(pinned, KVD_IMP_IMPORT_PINNED);
	/* Its pin keeps the backing in place: it maps. */
	ASSERT_EQ(0, imp_read(self->imp, pinned, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	/* The pin is its own: the same kind of import without one cannot. */
	IMPORT_NO_NOTIFY(bare, 0);
	EXPECT_EQ(-EOPNOTSUPP, imp_read(self->imp, bare, 0, self->buf, SIZE));

	EXPECT_EQ(-EBUSY, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_EQ(-EBUSY, kvd_replace(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.generation);
	EXPECT_EQ(0, q.notifications);
	EXPECT_EQ(1, q.blocking_pins);
	EXPECT_EQ(0, q.revocable_pins);
	EXPECT_EQ(1, q.pinned_importers);
	EXPECT_EQ(1, q.dynamic_importers);
	ASSERT_EQ(0, imp_read(self->imp, pinned, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));

	ASSERT_EQ(0, imp_release(self->imp, pinned));
	EXPECT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_EQ(0, imp_release(self->imp, bare));
}

/*
 * vfio-pci's revoke (Linux 7.1+) waits for its importers' maps to go,
 * with no bound, and so admits only attachments that give their mapping
 * up (-EOPNOTSUPP for the others). The module's slot stands for a proxy
 * importer: an importer that pins without an invalidation callback keeps
 * it mapped as long as it likes, so the exporter must refuse it, which
 * it can only do if the slot says so. The refusal reaches the importer
 * and leaves nothing attached; a dynamic importer is admitted, and the
 * exporter's revoke (which also waits for the fences on its resv, with
 * the resv held, as vfio-pci's does) returns: its own watchdog is the
 * test's timeout.
 */
TEST_F(rev, revocable_only_exporter_refuses_an_unrevocable_pin)
{
	struct kvdmabuf_query q;
	struct kvd_exp_info i;
	int exp, e, p, h, d;

	OPEN_IMPORTER(self->imp);
	KVD_OPEN_EXP(exp);
	e = exp_buf(exp, SIZE, KVD_EXP_CREATE_REVOCABLE_ONLY |
		    KVD_EXP_CREATE_REVOKE_FENCED, SEED_B);
	if (e == -EOPNOTSUPP) {
		close(exp);
		SKIP(return, "the dma-buf core cannot tell revocable pins "
		     "(no dma_buf_attach_revocable(), Linux 7.1+): no exporter can ask");
	}
	ASSERT_GE(e, 0);
	p = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(p, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, p, e, 0));

	h = imp_import(self->imp, p, KVD_IMP_IMPORT_NO_NOTIFY |
				     KVD_IMP_IMPORT_PINNED);
	EXPECT_EQ(-EOPNOTSUPP, h);
	if (h >= 0)
		imp_release(self->imp, h);
	ASSERT_EQ(0, exp_info(exp, e, &i));
	EXPECT_EQ(0u, i.attachments);
	ASSERT_EQ(0, kvd_query(self->dev, p, &q));
	EXPECT_EQ(0u, q.dynamic_importers + q.pinned_importers);

	d = imp_import(self->imp, p, 0);
	ASSERT_GE(d, 0);
	ASSERT_EQ(0, imp_read(self->imp, d, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, exp_revoke(exp, e));
	ASSERT_EQ(0, kvd_wait_state(self->dev, p, KVDMABUF_STATE_REVOKED, &q));
	EXPECT_EQ(KVDMABUF_REVOKE_EXPORTER, q.revoke_reason);
	EXPECT_EQ(-ENODEV, imp_read(self->imp, d, 0, self->buf, SIZE));
	EXPECT_EQ(0, imp_release(self->imp, d));
	EXPECT_EQ(0, kvd_revoke(self->dev, p, 1000));
	close(p);
	close(e);
	close(exp);
}

/*
 * REVOKE of a proxy that its backing's exporter already revoked: a pin
 * that cannot be revoked does not refuse it (-EBUSY means "a backing to
 * take away that a pin holds"; there is none). The pin holds only the
 * stale backing, which the call waits for: -ETIMEDOUT at once while it
 * is held (pins 0), 0 once the importer let go. A dynamic importer's
 * slot hears the exporter (the pinned importer's does not).
 */
TEST_F(rev, revoke_after_the_exporters_is_not_refused_by_a_pin)
{
	struct kvdmabuf_revoke r = { .size = sizeof(r) };
	struct kvdmabuf_query q;
	int exp, e, p, h, d;

	OPEN_IMPORTER(self->imp);
	KVD_OPEN_EXP(exp);
	e = exp_buf(exp, SIZE, 0, SEED_B);
	ASSERT_GE(e, 0);
	p = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(p, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, p, e, 0));
	d = imp_import(self->imp, p, 0);
	ASSERT_GE(d, 0);
	ASSERT_EQ(0, imp_read(self->imp, d, 0, self->buf, SIZE));
	h = imp_import(self->imp, p, KVD_IMP_IMPORT_NO_NOTIFY |
				     KVD_IMP_IMPORT_PINNED);
	if (h == -EOPNOTSUPP) {
		close(p);
		close(e);
		close(exp);
		SKIP(return, "the dma-buf core requires an invalidation "
		     "callback of dynamic importers (optional since Linux 7.1)");
	}
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, kvd_query(self->dev, p, &q));
	EXPECT_EQ(1u, q.blocking_pins);

	ASSERT_EQ(0, exp_revoke(exp, e));
	ASSERT_EQ(0, kvd_wait_state(self->dev, p, KVDMABUF_STATE_REVOKED, &q));
	r.proxy_fd = (uint32_t)p;
	r.timeout_ms = 0;
	EXPECT_EQ(-ETIMEDOUT, kvd_ioctl(self->dev, KVDMABUF_IOCTL_REVOKE, &r));
	EXPECT_EQ(0u, r.pins);
	ASSERT_EQ(0, kvd_query(self->dev, p, &q));
	EXPECT_EQ(KVDMABUF_REVOKE_EXPORTER, q.revoke_reason);
	EXPECT_EQ(1u, q.stale_backings);
	EXPECT_EQ(0, imp_release(self->imp, h));
	EXPECT_EQ(0, imp_release(self->imp, d));
	EXPECT_EQ(0, kvd_revoke(self->dev, p, 1000));
	ASSERT_EQ(0, kvd_query(self->dev, p, &q));
	EXPECT_EQ(0u, q.stale_backings);
	close(p);
	close(e);
	close(exp);
}

TEST_HARNESS_MAIN
