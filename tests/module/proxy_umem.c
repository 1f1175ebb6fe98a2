// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_umem: what only the importer on ib_core's dma-buf MR code
 * (/dev/kvd_umem) can tell: the dynamic umem's mapping is empty while the
 * proxy is revoked and is made again, with PAGE_SIZE blocks, for the new
 * backing (same umem, new bytes); and two importer devices with different
 * DMA masks (64 and 32 bits) on one proxy each get a mapping made for
 * their own device (the exporter records the device of every map); and
 * bus-address marks of the backing's segments reach the importers; and
 * an MR inside the proxy, whose ib_umem edits the table it maps in place,
 * leaves the table of another MR of the same device alone, map after map.
 */
#define KVD_IMP_UMEM 1

#include "harness.h"
#include "proxy_common.h"

#define SIZE		(32 * KVD_PAGE)
#define SEED_A		0x5a
#define SEED_B		0x5b
#define INNER_SIZE	(1024 * KVD_PAGE)	/* room for multi-page entries */

static int umem_info(int imp, int h, struct kvd_umem_info *i)
{
	memset(i, 0, sizeof(*i));
	i->handle = (uint32_t)h;
	return kvd_ioctl(imp, KVD_UMEM_IOCTL_INFO, i);
}

FIXTURE(umem) {
	int dev, imp, drm, exp;
	int proxy, a, b;
	char buf[SIZE];
};

FIXTURE_SETUP(umem)
{
	self->imp = self->exp = -1;
	KVD_PROXY_SETUP(self, SIZE, SEED_A, SEED_B);
	KVD_OPEN_IMP(self->imp);
}

FIXTURE_TEARDOWN(umem)
{
	kvd_close(&self->exp);
	kvd_close(&self->imp);
	KVD_PROXY_TEARDOWN(self);
}

TEST_F(umem, dynamic_umem_empty_while_revoked_remapped_after)
{
	struct kvd_umem_info i;
	struct kvd_imp_counters c;
	int h;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, umem_info(self->imp, h, &i));
	EXPECT_EQ(0, i.nmap);		/* registered, not yet faulted in */
	EXPECT_EQ(0, strcmp(i.dev_name, "kvd_umem.0"));
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	ASSERT_EQ(0, umem_info(self->imp, h, &i));
	EXPECT_GE(i.nmap, 1);
	EXPECT_EQ(KVD_PAGE, i.pgsz);

	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, umem_info(self->imp, h, &i));
	EXPECT_EQ(0, i.nmap);		/* unmapped by the invalidation */
	EXPECT_EQ(-ENODEV, imp_read(self->imp, h, 0, self->buf, SIZE));
	ASSERT_EQ(0, umem_info(self->imp, h, &i));
	EXPECT_EQ(0, i.nmap);		/* the fault found nothing to map */

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, umem_info(self->imp, h, &i));
	EXPECT_GE(i.nmap, 1);
	ASSERT_EQ(0, imp_counters(self->imp, h, &c));
	EXPECT_EQ(2, c.maps);
	EXPECT_EQ(1, c.invalidations);
	EXPECT_EQ(1, c.failed);
	EXPECT_EQ(0, imp_release(self->imp, h));
}

TEST_F(umem, pinned_umem_blocks_revoke)
{
	struct kvdmabuf_query q;
	int h;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	h = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_PINNED);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	EXPECT_EQ(-EBUSY, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_EQ(-EBUSY, kvd_replace(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.blocking_pins);
	EXPECT_EQ(0, q.notifications);
	EXPECT_EQ(0, imp_release(self->imp, h));
	EXPECT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
}

/* Two devices, 64-bit and 32-bit DMA masks, on one proxy. */
TEST_F(umem, two_devices_each_mapped_for_itself)
{
	struct kvd_umem_info i64, i32;
	struct kvd_exp_info ei;
	int e, e2, h64, h32, round;

	KVD_OPEN_EXP(self->exp);
	e = exp_buf(self->exp, SIZE, 0, SEED_A);
	ASSERT_GE(e, 0);
	e2 = exp_buf(self->exp, SIZE, KVD_EXP_CREATE_NOPAGES, SEED_B);
	ASSERT_GE(e2, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, e, 0));
	h64 = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(h64, 0);
	h32 = imp_import(self->imp, self->proxy, KVD_UMEM_IMPORT_DEV32);
	ASSERT_GE(h32, 0);

	for (round = 0; round < 2; round++) {
		int cur = round ? e2 : e;
		uint32_t seed = round ? SEED_B : SEED_A;

		ASSERT_EQ(0, imp_read(self->imp, h64, 0, self->buf, SIZE));
		EXPECT_EQ(-1, pattern_check(self->buf, SIZE, seed));
		ASSERT_EQ(0, imp_read(self->imp, h32, 0, self->buf, SIZE));
		EXPECT_EQ(-1, pattern_check(self->buf, SIZE, seed));

		ASSERT_EQ(0, umem_info(self->imp, h64, &i64));
		ASSERT_EQ(0, umem_info(self->imp, h32, &i32));
		EXPECT_EQ(0, strcmp(i64.dev_name, "kvd_umem.0"));
		EXPECT_EQ(0, strcmp(i32.dev_name, "kvd_umem.1"));
		EXPECT_EQ(~0ULL, i64.dma_mask);
		EXPECT_EQ(0xffffffffULL, i32.dma_mask);
		EXPECT_GE(i32.nmap, 1);
		EXPECT_LE(i32.max_dma_end - 1, i32.dma_mask);
		TH_LOG("round %d: highest DMA end 0x%llx (64-bit dev), 0x%llx (32-bit dev)",
		       round, (unsigned long long)i64.max_dma_end,
		       (unsigned long long)i32.max_dma_end);

		/* The backing was mapped once for each importer's device. */
		ASSERT_EQ(0, exp_info(self->exp, cur, &ei));
		EXPECT_EQ(2, ei.attachments);
		EXPECT_EQ(1, exp_dev_maps(&ei, "kvd_umem.0"));
		EXPECT_EQ(1, exp_dev_maps(&ei, "kvd_umem.1"));
		EXPECT_EQ(2, ei.maps);

		if (!round)
			ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, e2, 0));
	}
	EXPECT_EQ(0, imp_release(self->imp, h64));
	EXPECT_EQ(0, imp_release(self->imp, h32));
	close(e);
	close(e2);
}

/*
 * A backing whose segments are bus addresses (PCI peer-to-peer through a
 * switch: no IOMMU mapping behind them) gives importers of the proxy
 * segments marked the same way, as a direct import of it would.
 */
TEST_F(umem, bus_address_marks_are_carried)
{
	struct kvd_umem_info i;
	int e, direct, h;

	KVD_OPEN_EXP(self->exp);
	e = exp_buf(self->exp, SIZE, KVD_EXP_CREATE_NOPAGES |
		    KVD_EXP_CREATE_BUS_ADDR, SEED_A);
	if (e == -EOPNOTSUPP)
		SKIP(return, "no bus-address marks in this kernel's scatterlists "
		     "(CONFIG_NEED_SG_DMA_FLAGS, 6.2+)");
	ASSERT_GE(e, 0);

	/* The control: the marks reach a direct importer of the backing. */
	direct = imp_import(self->imp, e, 0);
	ASSERT_GE(direct, 0);
	ASSERT_EQ(0, imp_read(self->imp, direct, 0, self->buf, SIZE));
	ASSERT_EQ(0, umem_info(self->imp, direct, &i));
	ASSERT_GE(i.nmap, 1);
	if (!i.bus_addr_nents) {
		imp_release(self->imp, direct);
		close(e);
		SKIP(return, "the dma-buf core hands importers copies without "
		     "bus-address marks (CONFIG_DMABUF_DEBUG)");
	}
	EXPECT_EQ(i.nmap, i.bus_addr_nents);
	EXPECT_EQ(0, imp_release(self->imp, direct));

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, e, 0));
	h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	ASSERT_EQ(0, umem_info(self->imp, h, &i));
	ASSERT_GE(i.nmap, 1);
	EXPECT_EQ(i.nmap, i.bus_addr_nents);

	/* A backing with struct pages: no mark. */
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	ASSERT_EQ(0, umem_info(self->imp, h, &i));
	ASSERT_GE(i.nmap, 1);
	EXPECT_EQ(0, i.bus_addr_nents);
	EXPECT_EQ(0, imp_release(self->imp, h));
	close(e);
}

/* @len bytes of pattern @seed as they lie at byte @off of its buffer. */
static int pattern_at(const char *got, size_t len, uint32_t seed, size_t off,
		      char *ref)
{
	pattern_fill(ref, off + len, seed);
	return memcmp(got, ref + off, len);
}

/*
 * The same through a window: a proxy narrower than its backing gets a
 * copy of the backing's table (the whole-buffer case above is lent the
 * exporter's own table, so it carries the marks whatever the copy does).
 * The copy must carry them too, and the bytes of the window.
 */
TEST_F(umem, bus_address_marks_are_carried_by_a_window)
{
	char *ref = malloc(SIZE + 2 * KVD_PAGE);
	struct kvd_umem_info i;
	int e, p, h;

	ASSERT_NOT_NULL(ref);
	KVD_OPEN_EXP(self->exp);
	e = exp_buf(self->exp, SIZE + 2 * KVD_PAGE, KVD_EXP_CREATE_NOPAGES |
		    KVD_EXP_CREATE_BUS_ADDR, SEED_A);
	if (e == -EOPNOTSUPP) {
		free(ref);
		SKIP(return, "no bus-address marks in this kernel's scatterlists "
		     "(CONFIG_NEED_SG_DMA_FLAGS, 6.2+)");
	}
	ASSERT_GE(e, 0);
	/* The control, as above: the marks reach a direct importer. */
	h = imp_import(self->imp, e, 0);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	ASSERT_EQ(0, umem_info(self->imp, h, &i));
	EXPECT_EQ(0, imp_release(self->imp, h));
	if (!i.bus_addr_nents) {
		close(e);
		free(ref);
		SKIP(return, "the dma-buf core hands importers copies without "
		     "bus-address marks (CONFIG_DMABUF_DEBUG)");
	}

	p = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(p, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, p, e, KVD_PAGE));
	h = imp_import(self->imp, p, 0);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	EXPECT_EQ(0, pattern_at(self->buf, SIZE, SEED_A, KVD_PAGE, ref));
	ASSERT_EQ(0, umem_info(self->imp, h, &i));
	ASSERT_GE(i.nmap, 1);
	EXPECT_EQ(i.nmap, i.bus_addr_nents);
	EXPECT_EQ(0, imp_release(self->imp, h));
	close(p);
	close(e);
	free(ref);
}

static int umem_remap(int imp, int h, uint32_t reps)
{
	uint64_t ns[8];
	struct kvd_umem_remap a = {
		.handle = (uint32_t)h, .reps = reps,
		.unmap_ns = (uintptr_t)ns, .map_ns = (uintptr_t)ns,
	};

	if (reps > 8)
		return -EINVAL;
	return kvd_ioctl(imp, KVD_UMEM_IOCTL_REMAP, &a);
}

/*
 * The module lends each importer attachment its own mapping of the backing
 * when the proxy spans all of it. ib_umem edits what it maps in place (an
 * MR that starts KVD_UMEM_INNER_GAP into the dma-buf moves the first
 * entry's start, and cuts the last one short) until it unmaps: a table
 * shared between attachments, or one not handed back as it was lent,
 * would make the whole-buffer MR of the same device read bytes from the
 * wrong place. Re-mapped (unmap + map) and moved to a new backing and back.
 *
 * One pair of new buffers through four rounds; returns in how many the
 * inner MR's map edited its table in place, which depends on where vgem's
 * pages happen to lie. An ASSERT ends the test (the harness longjmps out
 * of the forked child), as it did when this was the test's body.
 */
static int inner_rounds(struct __test_metadata *_metadata,
			FIXTURE_DATA(umem) *self, char *ref)
{
	size_t last = INNER_SIZE - 2 * KVD_UMEM_INNER_GAP - KVD_PAGE;
	int a, b, proxy, hi, hw, round, edited = 0;
	struct kvd_umem_info i;

	a = vgem_pattern_buf(self->drm, INNER_SIZE, SEED_A);
	ASSERT_GE(a, 0);
	b = vgem_pattern_buf(self->drm, INNER_SIZE, SEED_B);
	ASSERT_GE(b, 0);
	proxy = kvd_create(self->dev, INNER_SIZE, NULL);
	ASSERT_GE(proxy, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, proxy, a, 0));
	hi = imp_import(self->imp, proxy, KVD_UMEM_IMPORT_INNER);
	ASSERT_GE(hi, 0);
	hw = imp_import(self->imp, proxy, 0);
	ASSERT_GE(hw, 0);

	for (round = 0; round < 4; round++) {
		uint32_t seed = round & 1 ? SEED_B : SEED_A;

		/* The inner MR first: its edit is in place while the
		 * whole-buffer MR maps and reads. */
		ASSERT_EQ(0, imp_read(self->imp, hi, 0, self->buf, KVD_PAGE));
		EXPECT_EQ(0, pattern_at(self->buf, KVD_PAGE, seed,
					KVD_UMEM_INNER_GAP, ref));
		ASSERT_EQ(0, imp_read(self->imp, hi, last, self->buf, KVD_PAGE));
		EXPECT_EQ(0, pattern_at(self->buf, KVD_PAGE, seed,
					KVD_UMEM_INNER_GAP + last, ref));
		ASSERT_EQ(0, umem_info(self->imp, hi, &i));
		if (i.first_sg_offset || i.last_sg_trim)
			edited++;
		ASSERT_EQ(0, imp_read(self->imp, hw, 0, self->buf, KVD_PAGE));
		EXPECT_EQ(0, pattern_at(self->buf, KVD_PAGE, seed, 0, ref));
		ASSERT_EQ(0, imp_read(self->imp, hw, INNER_SIZE - KVD_PAGE,
				      self->buf, KVD_PAGE));
		EXPECT_EQ(0, pattern_at(self->buf, KVD_PAGE, seed,
					INNER_SIZE - KVD_PAGE, ref));

		/* Unmap and map again: the same table, lent again. */
		ASSERT_EQ(0, umem_remap(self->imp, hi, 4));
		ASSERT_EQ(0, umem_remap(self->imp, hw, 4));
		ASSERT_EQ(0, imp_read(self->imp, hw, 0, self->buf, KVD_PAGE));
		EXPECT_EQ(0, pattern_at(self->buf, KVD_PAGE, seed, 0, ref));
		ASSERT_EQ(0, imp_read(self->imp, hi, 0, self->buf, KVD_PAGE));
		EXPECT_EQ(0, pattern_at(self->buf, KVD_PAGE, seed,
					KVD_UMEM_INNER_GAP, ref));

		ASSERT_EQ(0, kvd_replace(self->dev, proxy, round & 1 ? a : b, 0));
	}
	EXPECT_EQ(0, imp_release(self->imp, hi));
	EXPECT_EQ(0, imp_release(self->imp, hw));
	close(proxy);
	close(a);
	close(b);
	return edited;
}

/*
 * New buffer pairs until one has an inner map to edit (a fragmented guest,
 * such as the debug lane's, may need a few).
 */
TEST_F(umem, inner_mr_edits_do_not_reach_other_maps)
{
	int pair, edited = 0;
	char *ref;

	ref = malloc(INNER_SIZE);
	ASSERT_NE(NULL, ref);
	for (pair = 0; pair < 8 && !edited; pair++)
		edited = inner_rounds(_metadata, self, ref);
	free(ref);
	TH_LOG("the inner MR's map edited its table in place in %d of 4 "
	       "rounds of buffer pair %d", edited, pair);
	if (!edited)
		SKIP(return, "every first and last entry was one page in 8 "
		     "buffer pairs: ib_umem had nothing to edit in place, so "
		     "this proved nothing");
}

TEST_HARNESS_MAIN
