// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_ranges: a proxy covered by ranges (KVDMABUF_IOCTL_RANGES), the way
 * an elastic KV pool maps and unmaps its chunks while an importer (a NIC)
 * keeps one registration of the whole pool: a batch is one notification,
 * kept ranges keep their bytes and their mappings, an unbacked range maps
 * to memory that holds nobody's data and never to the pages it had, a
 * backing no range uses is freed when the call returns, and every argument
 * is checked with nothing changed on error.
 *
 * The importer is kvd_importer (a dynamic NIC stand-in that reads through
 * the DMA addresses it is given); chunks are vgem buffers, or kvd_exporter
 * buffers where the test counts the exporter's maps.
 */
#include <pthread.h>
#include <time.h>

#include "harness.h"
#include "proxy_common.h"

#define CH		(16 * KVD_PAGE)		/* one chunk of the pool */
#define NCH		8
#define SIZE		(NCH * CH)

FIXTURE(ranges) {
	int dev, imp, drm, exp;
	int proxy, h;
	int c[6];		/* chunk buffers, seeds 1..6 */
	char *buf, *want;
};

FIXTURE_SETUP(ranges)
{
	int i;

	self->dev = self->imp = self->drm = self->exp = -1;
	self->proxy = self->h = -1;
	for (i = 0; i < 6; i++)
		self->c[i] = -1;
	self->buf = malloc(SIZE);
	self->want = malloc(SIZE);
	ASSERT_NOT_NULL(self->buf);
	ASSERT_NOT_NULL(self->want);
	KVD_OPEN_DEV(self->dev);
	KVD_OPEN_IMP(self->imp);
	KVD_OPEN_VGEM(self->drm);
	{
		struct kvdmabuf_version v = { .size = sizeof(v) };

		ASSERT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_VERSION, &v));
		if (!(v.features & KVDMABUF_FEATURE_RANGES))
			SKIP(return, "module without KVDMABUF_FEATURE_RANGES");
	}
	/* Chunk i: two chunks of pattern i + 1 (the tests use offsets). */
	for (i = 0; i < 6; i++) {
		self->c[i] = vgem_pattern_buf(self->drm, 2 * CH, i + 1);
		ASSERT_GE(self->c[i], 0);
	}
	self->proxy = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(self->proxy, 0);
}

FIXTURE_TEARDOWN(ranges)
{
	int i;

	if (self->h >= 0)
		imp_release(self->imp, self->h);
	kvd_close(&self->proxy);
	for (i = 0; i < 6; i++)
		kvd_close(&self->c[i]);
	kvd_close(&self->exp);
	kvd_close(&self->drm);
	kvd_close(&self->imp);
	kvd_close(&self->dev);
	free(self->buf);
	free(self->want);
}

static struct kvdmabuf_range chunk(unsigned int i, int fd, uint64_t off)
{
	return (struct kvdmabuf_range){
		.start = i * CH, .length = CH, .backing_fd = fd,
		.backing_offset = off,
	};
}

/* Chunk-sized bytes of pattern @seed at byte @off of its buffer. */
static void expect_pattern(char *dst, uint32_t seed, uint64_t off)
{
	char *tmp = malloc(2 * CH);

	pattern_fill(tmp, 2 * CH, seed);
	memcpy(dst, tmp + off, CH);
	free(tmp);
}

/* Reads the whole proxy through the importer; -1 if every byte is right. */
static long first_wrong(struct __test_metadata *_metadata,
			FIXTURE_DATA(ranges) *self)
{
	long i;

	EXPECT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	for (i = 0; i < (long)SIZE; i++)
		if (self->buf[i] != self->want[i])
			return i;
	return -1;
}

static void import(struct __test_metadata *_metadata,
		   FIXTURE_DATA(ranges) *self, uint32_t flags)
{
	self->h = imp_import(self->imp, self->proxy, flags);
	ASSERT_GE(self->h, 0);
}

/*
 * One backing at two ranges side by side, at the same offset (each reads
 * the backing's first chunk, not a run on into its second), and at
 * offsets that do continue (one run).
 */
TEST_F(ranges, one_backing_at_neighbouring_ranges)
{
	struct kvdmabuf_range r[] = {
		chunk(1, self->c[0], 0), chunk(2, self->c[0], 0),
		chunk(4, self->c[1], 0), chunk(5, self->c[1], CH),
	};

	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 4));
	import(_metadata, self, 0);
	memset(self->want, 0, SIZE);
	expect_pattern(self->want + CH, 1, 0);
	expect_pattern(self->want + 2 * CH, 1, 0);
	expect_pattern(self->want + 4 * CH, 2, 0);
	expect_pattern(self->want + 5 * CH, 2, CH);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
}

/* An unbacked proxy, two ranges backed: they read their bytes, the rest zeros. */
TEST_F(ranges, a_batch_backs_ranges_and_the_rest_reads_zeros)
{
	struct kvdmabuf_range r[] = {
		chunk(0, self->c[0], 0), chunk(3, self->c[1], CH),
	};
	struct kvdmabuf_query q;
	uint64_t gen = 0;

	ASSERT_EQ(0, kvd_ranges_full(self->dev, self->proxy, r, 2, &gen, NULL));
	EXPECT_EQ(1, gen);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.generation);

	import(_metadata, self, 0);
	memset(self->want, 0, SIZE);
	expect_pattern(self->want, 1, 0);
	expect_pattern(self->want + 3 * CH, 2, CH);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
}

/*
 * A batch of three changes is one move notification; a kept range keeps
 * its backing (a write through the importer lands in it), changed ones
 * read their new bytes, the unbacked one zeros.
 */
TEST_F(ranges, a_batch_is_one_notification_and_kept_ranges_keep_their_bytes)
{
	struct kvdmabuf_range set[] = {
		chunk(0, self->c[0], 0), chunk(3, self->c[1], 0),
		chunk(5, self->c[2], 0),
	};
	struct kvdmabuf_range batch[] = {
		chunk(6, self->c[4], CH), chunk(0, KVDMABUF_RANGE_UNBACKED, 0),
		chunk(3, self->c[3], 0),
	};
	struct kvd_imp_counters c0, c1;
	char w[KVD_PAGE];
	uint64_t gen = 0;

	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, set, 3));
	import(_metadata, self, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	pattern_fill(w, sizeof(w), 0x77);
	ASSERT_EQ(0, imp_write(self->imp, self->h, 5 * CH + KVD_PAGE, w,
			       sizeof(w)));
	EXPECT_EQ(1, dmabuf_equals(self->c[2], KVD_PAGE, w, sizeof(w)));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c0));

	ASSERT_EQ(0, kvd_ranges_full(self->dev, self->proxy, batch, 3, &gen,
				     NULL));
	EXPECT_EQ(2, gen);
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c1));
	EXPECT_EQ(c0.invalidations + 1, c1.invalidations);

	memset(self->want, 0, SIZE);
	expect_pattern(self->want + 3 * CH, 4, 0);
	expect_pattern(self->want + 5 * CH, 3, 0);
	memcpy(self->want + 5 * CH + KVD_PAGE, w, sizeof(w));
	expect_pattern(self->want + 6 * CH, 5, CH);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
	/* The kept range is still the same backing: writes land in it. */
	pattern_fill(w, sizeof(w), 0x78);
	ASSERT_EQ(0, imp_write(self->imp, self->h, 5 * CH, w, sizeof(w)));
	EXPECT_EQ(1, dmabuf_equals(self->c[2], 0, w, sizeof(w)));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c0));
	EXPECT_EQ(0, c0.failed);
}

/*
 * A layout's map takes the pieces it keeps whole from the one before
 * (their source's mapping, where their window lies): a piece a batch cuts
 * must find its own window, a piece kept whole after a cut the one it got
 * then, and every batch's pieces reach their bytes whatever their place.
 */
TEST_F(ranges, ranges_cut_and_kept_read_their_own_bytes)
{
	struct kvdmabuf_range r = { .start = 0, .length = 4 * CH };
	int big = vgem_pattern_buf(self->drm, 4 * CH, 0x61);
	char *bytes = malloc(4 * CH);

	ASSERT_GE(big, 0);
	ASSERT_NOT_NULL(bytes);
	pattern_fill(bytes, 4 * CH, 0x61);
	r.backing_fd = big;
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r, 1));
	import(_metadata, self, 0);
	memset(self->want, 0, SIZE);
	memcpy(self->want, bytes, 4 * CH);
	EXPECT_EQ(-1, first_wrong(_metadata, self));

	/* cut in the middle: [big 0][c0][big 2-3] */
	r = chunk(1, self->c[0], 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r, 1));
	expect_pattern(self->want + CH, 1, 0);
	EXPECT_EQ(-1, first_wrong(_metadata, self));

	/* all kept whole, one more after them */
	r = chunk(6, self->c[1], CH);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r, 1));
	expect_pattern(self->want + 6 * CH, 2, CH);
	EXPECT_EQ(-1, first_wrong(_metadata, self));

	/* [big 2-3] cut at its start: what is left is big's fourth chunk */
	r = chunk(2, KVDMABUF_RANGE_UNBACKED, 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r, 1));
	memset(self->want + 2 * CH, 0, CH);
	EXPECT_EQ(-1, first_wrong(_metadata, self));

	/* kept whole, a place earlier: the hole left by c0 joins the next */
	r = chunk(1, KVDMABUF_RANGE_UNBACKED, 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r, 1));
	memset(self->want + CH, 0, CH);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
	free(bytes);
	close(big);
}

/*
 * A pool of many pieces, as an elastic KV cache's: the module keeps a
 * layout's pieces in blocks (64 a block) that a batch copies where it
 * changes them and shares where it does not. Pages of three buffers in
 * turn (no two neighbours merge), then batches that change one page, a
 * run across blocks, a page inside that run, pages all over the pool, and
 * the whole pool: after each, every page reads its own bytes through an
 * importer mapped from the start, and through one attached after them.
 */
#define NP	300			/* pages of the pool, one a piece */

struct pool {
	int buf[3];			/* NP pages each, patterns 0x31.. */
	char *bytes[3];
	int src[NP];			/* -1: unbacked */
	int off[NP];			/* in pages */
};

static int pool_batch(int dev, int proxy, struct pool *pl,
		      const int *first, const int *len, const int *src,
		      const int *off, int n)
{
	struct kvdmabuf_range r[NP];
	int i, k;

	for (i = 0; i < n; i++) {
		r[i] = (struct kvdmabuf_range){
			.start = (uint64_t)first[i] * KVD_PAGE,
			.length = (uint64_t)len[i] * KVD_PAGE,
			.backing_fd = src[i] < 0 ? KVDMABUF_RANGE_UNBACKED :
						   pl->buf[src[i]],
			.backing_offset = (uint64_t)off[i] * KVD_PAGE,
		};
		for (k = 0; k < len[i]; k++) {
			pl->src[first[i] + k] = src[i];
			pl->off[first[i] + k] = off[i] + k;
		}
	}
	return kvd_ranges(dev, proxy, r, n);
}

/* The first page that reads wrong through import @h, or -1. */
static int pool_first_wrong(int imp, int h, const struct pool *pl, char *buf)
{
	static const char zero[KVD_PAGE];
	const char *want;
	int i;

	/* in two reads: the importer takes at most 1 MiB at a time */
	if (imp_read(imp, h, 0, buf, NP / 2 * KVD_PAGE) ||
	    imp_read(imp, h, NP / 2 * KVD_PAGE, buf + NP / 2 * KVD_PAGE,
		     (NP - NP / 2) * KVD_PAGE))
		return NP;
	for (i = 0; i < NP; i++) {
		want = pl->src[i] < 0 ? zero :
		       pl->bytes[pl->src[i]] + (size_t)pl->off[i] * KVD_PAGE;
		if (memcmp(buf + (size_t)i * KVD_PAGE, want, KVD_PAGE))
			return i;
	}
	return -1;
}

TEST_F(ranges, a_pool_of_many_pieces_reads_its_own_bytes_through_batches)
{
	int first[NP], len[NP], src[NP], off[NP];
	struct pool pl = { 0 };
	int proxy, h1, h2, i, n;
	char *buf = malloc(NP * KVD_PAGE), per[16] = "?";
	const char *want;
	FILE *f = fopen("/sys/module/kvdmabuf/parameters/layout_block_pieces",
			"r");

	if (f) {
		if (!fgets(per, sizeof(per), f))
			strcpy(per, "?");
		fclose(f);
	}
	TH_LOG("the module's blocks: %.*s pieces", (int)strcspn(per, "\n"), per);
	/* the lane's parameters reach every load of the module (check.sh) */
	want = getenv("KVDMABUF_KO_PARAMS");
	want = want ? strstr(want, "layout_block_pieces=") : NULL;
	if (want)
		EXPECT_EQ(atoi(want + strlen("layout_block_pieces=")),
			  atoi(per));
	ASSERT_NOT_NULL(buf);
	for (i = 0; i < 3; i++) {
		pl.buf[i] = vgem_pattern_buf(self->drm, NP * KVD_PAGE, 0x31 + i);
		ASSERT_GE(pl.buf[i], 0);
		pl.bytes[i] = malloc(NP * KVD_PAGE);
		ASSERT_NOT_NULL(pl.bytes[i]);
		pattern_fill(pl.bytes[i], NP * KVD_PAGE, 0x31 + i);
	}
	proxy = kvd_create(self->dev, NP * KVD_PAGE, NULL);
	ASSERT_GE(proxy, 0);

	/* page i: buffer i % 3 at page i */
	for (i = 0; i < NP; i++) {
		first[i] = off[i] = i;
		len[i] = 1;
		src[i] = i % 3;
	}
	ASSERT_EQ(0, pool_batch(self->dev, proxy, &pl, first, len, src, off,
				NP));
	h1 = imp_import(self->imp, proxy, 0);
	ASSERT_GE(h1, 0);
	EXPECT_EQ(-1, pool_first_wrong(self->imp, h1, &pl, buf));

	/* one page in the third block given back */
	first[0] = 140, len[0] = 1, src[0] = -1, off[0] = 0;
	ASSERT_EQ(0, pool_batch(self->dev, proxy, &pl, first, len, src, off, 1));
	EXPECT_EQ(-1, pool_first_wrong(self->imp, h1, &pl, buf));

	/* a run across three blocks: one piece of buffer 0, cut per block */
	first[0] = 60, len[0] = 140, src[0] = 0, off[0] = 100;
	ASSERT_EQ(0, pool_batch(self->dev, proxy, &pl, first, len, src, off, 1));
	EXPECT_EQ(-1, pool_first_wrong(self->imp, h1, &pl, buf));

	/* a page inside it: its two sides keep their own windows */
	first[0] = 150, len[0] = 1, src[0] = 1, off[0] = 7;
	ASSERT_EQ(0, pool_batch(self->dev, proxy, &pl, first, len, src, off, 1));
	EXPECT_EQ(-1, pool_first_wrong(self->imp, h1, &pl, buf));

	/* pages all over the pool in one batch: blocks fill up and split */
	for (i = 0, n = 0; i < NP; i += 7, n++) {
		first[n] = i;
		len[n] = i % 2 ? 2 : 1;
		src[n] = i % 3 == 2 ? -1 : (i / 7) % 3;
		off[n] = src[n] < 0 ? 0 : NP - 2 - i;
	}
	ASSERT_EQ(0, pool_batch(self->dev, proxy, &pl, first, len, src, off, n));
	EXPECT_EQ(-1, pool_first_wrong(self->imp, h1, &pl, buf));

	/* an importer attached now maps blocks made before it */
	h2 = imp_import(self->imp, proxy, 0);
	ASSERT_GE(h2, 0);
	EXPECT_EQ(-1, pool_first_wrong(self->imp, h2, &pl, buf));

	/* all of the pool: one run of buffer 2, then every other page cut */
	first[0] = 0, len[0] = NP, src[0] = 2, off[0] = 0;
	ASSERT_EQ(0, pool_batch(self->dev, proxy, &pl, first, len, src, off, 1));
	EXPECT_EQ(-1, pool_first_wrong(self->imp, h1, &pl, buf));
	for (i = 0, n = 0; i < NP; i += 2, n++) {
		first[n] = i, len[n] = 1, src[n] = -1, off[n] = 0;
	}
	ASSERT_EQ(0, pool_batch(self->dev, proxy, &pl, first, len, src, off, n));
	EXPECT_EQ(-1, pool_first_wrong(self->imp, h1, &pl, buf));
	EXPECT_EQ(-1, pool_first_wrong(self->imp, h2, &pl, buf));

	imp_release(self->imp, h2);
	imp_release(self->imp, h1);
	close(proxy);
	for (i = 0; i < 3; i++) {
		close(pl.buf[i]);
		free(pl.bytes[i]);
	}
	free(buf);
}

/*
 * Writes to an unbacked range reach neither the pages it had nor anybody
 * else's, and after the next call it reads zeros again.
 */
TEST_F(ranges, an_unbacked_range_never_reaches_its_old_pages)
{
	struct kvdmabuf_range r = chunk(2, self->c[0], 0);
	char w[KVD_PAGE], orig[CH];

	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r, 1));
	import(_metadata, self, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));

	r.backing_fd = KVDMABUF_RANGE_UNBACKED;
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r, 1));
	pattern_fill(w, sizeof(w), 0x99);
	ASSERT_EQ(0, imp_write(self->imp, self->h, 2 * CH, w, sizeof(w)));
	expect_pattern(orig, 1, 0);
	EXPECT_EQ(1, dmabuf_equals(self->c[0], 0, orig, CH));

	/* The next call leaves it unbacked: zeros, not what was written. */
	r = chunk(7, self->c[1], 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r, 1));
	memset(self->want, 0, SIZE);
	expect_pattern(self->want + 7 * CH, 2, 0);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
}

/* A proxy attached whole is one range: a batch keeps the rest of it. */
TEST_F(ranges, a_proxy_attached_whole_keeps_the_rest_of_its_backing)
{
	struct kvdmabuf_range r = chunk(2, self->c[1], CH);
	int whole = vgem_pattern_buf(self->drm, SIZE, 0x41);

	ASSERT_GE(whole, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, whole, 0));
	import(_metadata, self, 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r, 1));
	pattern_fill(self->want, SIZE, 0x41);
	expect_pattern(self->want + 2 * CH, 2, CH);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
	close(whole);
}

/*
 * The module maps a backing once per importer device, whatever the number
 * of layouts that keep it: a batch maps only what it brings in, and a
 * backing no range uses any more is unmapped when the call returns.
 */
TEST_F(ranges, kept_backings_are_not_mapped_again)
{
	struct kvd_exp_info i0, i1, i2;
	struct kvdmabuf_range r[3];
	int e[3], k;

	KVD_OPEN_EXP(self->exp);
	for (k = 0; k < 3; k++) {
		e[k] = exp_buf(self->exp, CH, 0, 0x50 + k);
		ASSERT_GE(e[k], 0);
	}
	/* e0 twice in one batch: one mapping of it */
	r[0] = chunk(0, e[0], 0);
	r[1] = chunk(1, e[1], 0);
	r[2] = chunk(6, e[0], 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 3));
	import(_metadata, self, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	ASSERT_EQ(0, exp_info(self->exp, e[0], &i0));
	EXPECT_EQ(1, i0.maps);
	EXPECT_EQ(1, i0.attachments);

	r[2] = chunk(4, e[2], 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r[2], 1));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	r[1].backing_fd = KVDMABUF_RANGE_UNBACKED;
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r[1], 1));
	ASSERT_EQ(0, exp_info(self->exp, e[0], &i0));
	ASSERT_EQ(0, exp_info(self->exp, e[1], &i1));
	ASSERT_EQ(0, exp_info(self->exp, e[2], &i2));
	EXPECT_EQ(1, i0.maps);
	EXPECT_EQ(1, i0.live_maps);
	EXPECT_EQ(1, i2.maps);
	EXPECT_EQ(0, i1.live_maps);
	EXPECT_EQ(0, i1.attachments);

	/* e0 named again by a later batch: the layout's mapping of it serves */
	r[0] = chunk(2, e[0], 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r[0], 1));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	ASSERT_EQ(0, exp_info(self->exp, e[0], &i0));
	EXPECT_EQ(1, i0.maps);
	EXPECT_EQ(1, i0.attachments);

	memset(self->want, 0, SIZE);
	pattern_fill(self->want, CH, 0x50);
	pattern_fill(self->want + 2 * CH, CH, 0x50);
	pattern_fill(self->want + 4 * CH, CH, 0x52);
	pattern_fill(self->want + 6 * CH, CH, 0x50);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
	for (k = 0; k < 3; k++)
		close(e[k]);
}

/* A chunk given back is freed when the call returns (vgem: Shmem). */
TEST_F(ranges, an_unbacked_chunk_is_freed_when_the_call_returns)
{
	const uint64_t big = 64ULL << 20;
	struct kvdmabuf_range r = { .start = 0, .length = big };
	long before, held, after;
	int proxy, buf, h;

	proxy = kvd_create(self->dev, 2 * big, NULL);
	ASSERT_GE(proxy, 0);
	before = meminfo_kb("Shmem");
	buf = vgem_pattern_buf(self->drm, big, 0x61);
	ASSERT_GE(buf, 0);
	r.backing_fd = buf;
	ASSERT_EQ(0, kvd_ranges(self->dev, proxy, &r, 1));
	close(buf);
	h = imp_import(self->imp, proxy, 0);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, KVD_PAGE));
	held = meminfo_kb("Shmem");
	EXPECT_GE(held, before + (long)(big >> 10) * 9 / 10);

	r.backing_fd = KVDMABUF_RANGE_UNBACKED;
	ASSERT_EQ(0, kvd_ranges(self->dev, proxy, &r, 1));
	after = meminfo_kb("Shmem");
	TH_LOG("Shmem: %ld kB before, %ld held, %ld after", before, held, after);
	EXPECT_LE(after, held - (long)(big >> 10) * 9 / 10);
	/* Still mapped for the importer: zeros, the pool goes on. */
	memset(self->want, 0, KVD_PAGE);
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, KVD_PAGE));
	EXPECT_EQ(0, memcmp(self->buf, self->want, KVD_PAGE));
	imp_release(self->imp, h);
	close(proxy);
}

/* A pinned importer cannot follow: -EBUSY with its pin, nothing changed. */
TEST_F(ranges, a_pinned_importer_refuses_it)
{
	struct kvdmabuf_range r = chunk(0, self->c[0], 0);
	struct kvdmabuf_query q;
	uint32_t pins = 0;

	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r, 1));
	import(_metadata, self, KVD_IMP_IMPORT_PINNED);
	r.backing_fd = self->c[1];
	EXPECT_EQ(-EBUSY, kvd_ranges_full(self->dev, self->proxy, &r, 1, NULL,
					  &pins));
	EXPECT_EQ(1, pins);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(1, q.generation);
	memset(self->want, 0, SIZE);
	expect_pattern(self->want, 1, 0);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
}

/*
 * Chunk 0 backed by c0, chunk 1 by a kvd_exporter buffer, read through the
 * importer; then that buffer's exporter revokes it: the proxy revokes
 * itself (REVOKE_EXPORTER), and the next call starts from an unbacked
 * proxy. @before_map: a second call first leaves a layout that keeps the
 * buffer and that the importer has not mapped yet.
 */
static void exporter_revokes(struct __test_metadata *_metadata,
			     FIXTURE_DATA(ranges) *self, int before_map)
{
	struct kvdmabuf_range r[2];
	struct kvdmabuf_query q;
	int e;

	KVD_OPEN_EXP(self->exp);
	e = exp_buf(self->exp, CH, 0, 0x70);
	ASSERT_GE(e, 0);
	r[0] = chunk(0, self->c[0], 0);
	r[1] = chunk(1, e, 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 2));
	import(_metadata, self, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	if (before_map) {
		r[0] = chunk(3, self->c[1], 0);
		ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 1));
	}
	ASSERT_EQ(0, exp_revoke(self->exp, e));
	ASSERT_EQ(0, kvd_wait_state(self->dev, self->proxy,
				    KVDMABUF_STATE_REVOKED, &q));
	EXPECT_EQ(KVDMABUF_REVOKE_EXPORTER, q.revoke_reason);
	EXPECT_EQ(-ENODEV, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	/* chunk 0 is gone too */
	r[0] = chunk(5, self->c[2], 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 1));
	memset(self->want, 0, SIZE);
	expect_pattern(self->want + 5 * CH, 3, 0);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
	close(e);
}

/* A range's exporter revoking its buffer revokes the proxy, as a backing's. */
TEST_F(ranges, a_ranges_exporter_revoking_revokes_the_proxy)
{
	exporter_revokes(_metadata, self, 0);
}

/*
 * A layout's table is built at the importer's first map after the call:
 * a piece's backing revoked before that map revokes the proxy all the
 * same, and the layout never mapped is torn down cleanly.
 */
TEST_F(ranges, a_backing_revoked_before_the_first_map_revokes_the_proxy)
{
	exporter_revokes(_metadata, self, 1);
}

/* Every argument is checked; an error changes nothing. */
TEST_F(ranges, arguments_are_checked_and_nothing_changes)
{
	struct kvdmabuf_range ok = chunk(1, self->c[0], 0), r[2];
	struct {
		struct kvdmabuf_range r;
		uint64_t extra;
	} big = { .r = ok, .extra = 1 };
	struct kvdmabuf_ranges a;
	struct kvdmabuf_query q;
	int other, small;

	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &ok, 1));
#define BAD(err, ...)							\
	do {								\
		struct kvdmabuf_range x = ok;				\
		__VA_ARGS__;						\
		EXPECT_EQ(err, kvd_ranges(self->dev, self->proxy, &x, 1)); \
	} while (0)
	BAD(-EINVAL, x.flags = 1);
	BAD(-EINVAL, x.reserved = 1);
	BAD(-EINVAL, x.length = 0);
	BAD(-EINVAL, x.start = 1);
	BAD(-EINVAL, x.length = CH + 1);
	BAD(-EINVAL, x.backing_offset = 1);
	BAD(-EINVAL, x.backing_fd = KVDMABUF_RANGE_UNBACKED;
	    x.backing_offset = KVD_PAGE);
	BAD(-EBADF, x.backing_fd = -2);
	BAD(-EBADF, x.backing_fd = 999);
	BAD(-EINVAL, x.backing_fd = self->imp);		/* not a dma-buf */
	BAD(-ELOOP, x.backing_fd = self->proxy);
	BAD(-ERANGE, x.start = SIZE);
	BAD(-ERANGE, x.start = SIZE - CH; x.length = 2 * CH);
	BAD(-EOVERFLOW, x.start = -KVD_PAGE);
	BAD(-EOVERFLOW, x.backing_offset = -KVD_PAGE);
	BAD(-ERANGE, x.backing_offset = 2 * CH);	/* past its end */
#undef BAD
	r[0] = chunk(1, self->c[0], 0);
	r[1] = (struct kvdmabuf_range){ .start = CH + KVD_PAGE, .length = CH,
					.backing_fd = self->c[1] };
	EXPECT_EQ(-EINVAL, kvd_ranges(self->dev, self->proxy, r, 2));

	/* The call's own fields. */
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.proxy_fd = self->proxy;
	a.count = 1;
	a.ranges = (uintptr_t)&ok;
	a.range_size = sizeof(ok);
	a.flags = 1;
	EXPECT_EQ(-EINVAL, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	a.flags = 0;
	a.reserved = 1;
	EXPECT_EQ(-EINVAL, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	a.reserved = 0;
	a.count = 0;
	EXPECT_EQ(-EINVAL, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	a.count = KVDMABUF_MAX_RANGES + 1;
	EXPECT_EQ(-E2BIG, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	a.count = 1;
	a.range_size = KVDMABUF_RANGE_SIZE_VER0 - 8;
	EXPECT_EQ(-EINVAL, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	a.range_size = sizeof(big);
	a.ranges = (uintptr_t)&big;
	EXPECT_EQ(-E2BIG, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	big.extra = 0;		/* a newer caller's zero tail is fine */
	EXPECT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	a.range_size = sizeof(ok);
	a.ranges = 8;
	EXPECT_EQ(-EFAULT, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	a.ranges = (uintptr_t)&ok;
	a.timeout_ms = KVDMABUF_MAX_TIMEOUT_MS + 1;
	EXPECT_EQ(-EINVAL, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	a.timeout_ms = 0;
	a.proxy_fd = self->c[0];
	EXPECT_EQ(-EINVAL, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	a.proxy_fd = self->proxy;
	small = KVDMABUF_RANGES_SIZE_VER0 - 8;
	a.size = small;
	EXPECT_EQ(-EINVAL, kvd_ioctl(self->dev, KVDMABUF_IOCTL_RANGES, &a));
	a.size = sizeof(a);

	/* Only the device fd that created the proxy controls it. */
	other = kvd_dev_open();
	ASSERT_GE(other, 0);
	EXPECT_EQ(-EPERM, kvd_ranges(other, self->proxy, &ok, 1));
	close(other);

	/* Two good calls (the first and the zero tail): generation 2. */
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(2, q.generation);
	import(_metadata, self, 0);
	memset(self->want, 0, SIZE);
	expect_pattern(self->want + CH, 1, 0);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
}

/*
 * A CPU importer (a software NIC: soft-RoCE reads through dma_buf_vmap())
 * gets one kernel mapping of the whole layout: backed ranges at their
 * offsets, zeros in the holes, its writes in the backing, and it follows
 * a batch. A layout with a range whose exporter has no kernel mapping
 * (kvd_exporter) is refused at the importer's pin, before any vmap.
 */
TEST_F(ranges, a_cpu_importer_maps_the_whole_layout)
{
	struct kvdmabuf_range r[] = {
		chunk(0, self->c[0], 0), chunk(3, self->c[1], CH),
	};
	struct kvdmabuf_version v = { .size = sizeof(v) };
	char w[KVD_PAGE];
	int e;

	ASSERT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_VERSION, &v));
	if (!(v.features & KVDMABUF_FEATURE_VMAP))
		SKIP(return, "no CPU access to proxies before Linux 6.2");
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 2));
	import(_metadata, self, KVD_IMP_IMPORT_CPU);
	memset(self->want, 0, SIZE);
	expect_pattern(self->want, 1, 0);
	expect_pattern(self->want + 3 * CH, 2, CH);
	EXPECT_EQ(-1, first_wrong(_metadata, self));
	pattern_fill(w, sizeof(w), 0x33);
	ASSERT_EQ(0, imp_write(self->imp, self->h, 3 * CH + KVD_PAGE, w,
			       sizeof(w)));
	EXPECT_EQ(1, dmabuf_equals(self->c[1], CH + KVD_PAGE, w, sizeof(w)));

	r[0].backing_fd = KVDMABUF_RANGE_UNBACKED;
	r[1] = chunk(7, self->c[2], 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 2));
	memset(self->want, 0, CH);
	memcpy(self->want + 3 * CH + KVD_PAGE, w, sizeof(w));
	expect_pattern(self->want + 7 * CH, 3, 0);
	EXPECT_EQ(-1, first_wrong(_metadata, self));

	KVD_OPEN_EXP(self->exp);
	e = exp_buf(self->exp, CH, 0, 0x71);
	ASSERT_GE(e, 0);
	r[0] = chunk(5, e, 0);
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 1));
	EXPECT_EQ(-EOPNOTSUPP, imp_read(self->imp, self->h, 0, self->buf,
					KVD_PAGE));
	/* given back, it no longer keeps the layout from the CPU */
	r[0].backing_fd = KVDMABUF_RANGE_UNBACKED;
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 1));
	EXPECT_EQ(-1, first_wrong(_metadata, self));
	close(e);
}

/* ---- churn: batches while an importer reads ---- */

struct churn {
	int dev, imp, h, proxy;
	int a, b;			/* chunk 2's two buffers (seeds 1, 2) */
	volatile int stop;
	long swaps, reads, bad, failed;
};

/* Chunk 2 between buffers A and B, chunk 5 given back and back again. */
static void *churn_swapper(void *arg)
{
	struct churn *c = arg;
	struct kvdmabuf_range r[2];
	long i;

	for (i = 0; !c->stop; i++) {
		r[0] = chunk(2, i % 2 ? c->a : c->b, 0);
		r[1] = chunk(5, i % 2 ? c->a : KVDMABUF_RANGE_UNBACKED, 0);
		if (kvd_ranges(c->dev, c->proxy, r, 2))
			c->failed++;
		else
			c->swaps++;
	}
	return NULL;
}

/*
 * Each read of a chunk is one layout's: chunk 2 all A or all B, chunk 5
 * all A or all zeros, chunk 0 always its own. Never a mix, never old
 * pages' bytes of another chunk.
 */
static void *churn_reader(void *arg)
{
	struct churn *c = arg;
	static char buf[CH], wa[CH], wb[CH], w0[CH], zero[CH];

	expect_pattern(wa, 1, 0);
	expect_pattern(wb, 2, 0);
	expect_pattern(w0, 3, 0);
	while (!c->stop) {
		if (imp_read(c->imp, c->h, 2 * CH, buf, CH) ||
		    (memcmp(buf, wa, CH) && memcmp(buf, wb, CH)))
			c->bad++;
		if (imp_read(c->imp, c->h, 5 * CH, buf, CH) ||
		    (memcmp(buf, wa, CH) && memcmp(buf, zero, CH)))
			c->bad++;
		if (imp_read(c->imp, c->h, 0, buf, CH) || memcmp(buf, w0, CH))
			c->bad++;
		c->reads++;
	}
	return NULL;
}

TEST_F_TIMEOUT(ranges, reads_under_churn_see_one_layout_at_a_time, 60)
{
	struct kvdmabuf_range r[2] = { chunk(0, self->c[2], 0),
				       chunk(2, self->c[0], 0) };
	struct churn c = { .dev = self->dev, .imp = self->imp,
			   .proxy = self->proxy, .a = self->c[0],
			   .b = self->c[1] };
	struct kvdmabuf_query q;
	pthread_t sw, rd;

	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 2));
	import(_metadata, self, 0);
	c.h = self->h;
	ASSERT_EQ(0, pthread_create(&rd, NULL, churn_reader, &c));
	ASSERT_EQ(0, pthread_create(&sw, NULL, churn_swapper, &c));
	usleep((useconds_t)kvd_scaled_ms(1500) * 1000);
	c.stop = 1;
	pthread_join(sw, NULL);
	pthread_join(rd, NULL);
	TH_LOG("%ld batches, %ld failed; %ld reads of three chunks, %ld wrong",
	       c.swaps, c.failed, c.reads, c.bad);
	EXPECT_LT(10, c.swaps);
	EXPECT_LT(10, c.reads);
	EXPECT_EQ(0, c.failed);
	EXPECT_EQ(0, c.bad);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ((uint64_t)c.swaps + 1, q.generation);
	EXPECT_EQ(0, q.stale_backings);
}

TEST_HARNESS_MAIN
