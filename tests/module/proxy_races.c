// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_races: for a few seconds, one thread revokes, attaches and
 * replaces the backing of a proxy, one queries it, two importer threads
 * read and one writes through their own imports of the proxy. Every read
 * either fails with -ENODEV or returns bytes of exactly one backing (never a
 * wrong or mixed byte), and that backing was the proxy's at some moment of
 * the read: the controller logs what each of its operations made current,
 * and a read that began after op a had returned and ended before op b + 2
 * began may show only what ops a..b + 1 made current (a backing an
 * importer kept after a REPLACE or REVOKE is caught); writes land only in
 * the region they target.
 *
 * The same with three controllers at once on the one proxy (revoke,
 * attach, replace, query, close of a dup), the module ordering them: each
 * logs when its operations began and returned, and a read of backing B is
 * right only if some operation that made B current began before the read
 * ended and no operation that made something else current began after it
 * returned and returned before the read began (tests/race_window.h); and
 * the generations the calls answered give the module's order of them, in
 * which a plain attach must come right after a revoke.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "harness.h"
#include "proxy_common.h"
#include "race_window.h"

#define PAGES		32
#define SIZE		(PAGES * KVD_PAGE)
#define WPAGE		(PAGES - 1)	/* the page the writer targets */
#define CHUNK		(4 * KVD_PAGE)
/*
 * Every importer maps each generation of a backing it is offered, and DMA
 * API debugging takes more than 7 live mappings of one page for a leak:
 * with 3 importers, at most 2 live generations of one buffer. The
 * operations take the backings in turn (next_backing()), so a buffer comes
 * back only after NBACK - 1 others.
 */
#define NBACK		8
#define SEED(i)		(0x100u + (i))
#define SEED_W		0x99u
#define SECONDS		3
#define MAXOPS		(1 << 16)	/* the controller stops there */
#define NONE		(-1)		/* revoked: no backing */

struct race {
	int dev, drm, proxy;
	int backing[NBACK];
	atomic_int stop;
	atomic_long reads_ok, reads_revoked, writes_ok, bad_bytes, bad_errors;
	atomic_long ops, queries, stale_reads;
	/*
	 * The controller's log: current[k] is the backing index (NONE:
	 * revoked) after its k-th operation returned (current[0]: the first
	 * attach); done is k once current[k] is set, next the target of the
	 * operation in flight, set before it starts.
	 */
	int current[MAXOPS + 1];
	atomic_long done;
	atomic_int next;
	atomic_uint turn;	/* next_backing()'s count */
	char last_error[256];
};

static void note_error(struct race *r, const char *what, int ret)
{
	atomic_fetch_add(&r->bad_errors, 1);
	snprintf(r->last_error, sizeof(r->last_error), "%s: %d (%s)", what,
		 ret, strerror(-ret));
}

static long check_at(const char *buf, size_t len, uint32_t seed, uint64_t off)
{
	const uint32_t *p = (const void *)buf;
	size_t i;

	for (i = 0; i < len / 4; i++)
		if (p[i] != seed * 2654435761u + (uint32_t)(off / 4 + i))
			return (long)i;
	return -1;
}

static void *reader(void *arg)
{
	struct race *r = arg;
	unsigned int seed = (unsigned int)(uintptr_t)&seed;
	char *buf = malloc(CHUNK);
	int imp = imp_open(), h, ret, i, match;

	h = imp < 0 ? imp : imp_import(imp, r->proxy, 0);
	if (!buf || h < 0) {
		note_error(r, "reader setup", h < 0 ? h : -ENOMEM);
		return NULL;
	}
	while (!atomic_load(&r->stop)) {
		uint64_t off = (rand_r(&seed) % (WPAGE - CHUNK / KVD_PAGE + 1)) *
			       KVD_PAGE;
		long a, b, k;
		int in_flight, ok;

		a = atomic_load(&r->done);
		ret = imp_read(imp, h, off, buf, CHUNK);
		/* the target first: an op it is not for began after the read */
		in_flight = atomic_load(&r->next);
		b = atomic_load(&r->done);
		if (ret == -ENODEV) {
			atomic_fetch_add(&r->reads_revoked, 1);
			continue;
		}
		if (ret) {
			note_error(r, "read", ret);
			continue;
		}
		match = -1;
		for (i = 0; i < NBACK; i++)
			if (check_at(buf, CHUNK, SEED(i), off) < 0)
				match = i;
		if (match < 0)
			atomic_fetch_add(&r->bad_bytes, 1);
		/* one of the backings current during the read */
		ok = match >= 0 && match == in_flight;
		for (k = a; match >= 0 && !ok && k <= b; k++)
			ok = r->current[k] == match;
		if (match >= 0 && !ok)
			atomic_fetch_add(&r->stale_reads, 1);
		atomic_fetch_add(&r->reads_ok, 1);
	}
	imp_release(imp, h);
	close(imp);
	free(buf);
	return NULL;
}

static void *writer(void *arg)
{
	struct race *r = arg;
	char buf[KVD_PAGE];
	int imp = imp_open(), h, ret;

	pattern_fill(buf, sizeof(buf), SEED_W);
	h = imp < 0 ? imp : imp_import(imp, r->proxy, 0);
	if (h < 0) {
		note_error(r, "writer setup", h);
		return NULL;
	}
	while (!atomic_load(&r->stop)) {
		ret = imp_write(imp, h, WPAGE * KVD_PAGE, buf, sizeof(buf));
		if (!ret)
			atomic_fetch_add(&r->writes_ok, 1);
		else if (ret != -ENODEV)
			note_error(r, "write", ret);
	}
	imp_release(imp, h);
	close(imp);
	return NULL;
}

/* The backing the next attach or replace names: each in turn. */
static int next_backing(struct race *r)
{
	return (int)(atomic_fetch_add(&r->turn, 1) % NBACK);
}

static void *controller(void *arg)
{
	struct race *r = arg;
	unsigned int seed = 42;
	long k = 0;
	int ret, i, cur = r->current[0];

	while (!atomic_load(&r->stop) && k < MAXOPS) {
		i = next_backing(r);
		switch (rand_r(&seed) % 3) {
		case 0:
			atomic_store(&r->next, NONE);
			ret = kvd_revoke(r->dev, r->proxy, 2000);
			if (ret)
				note_error(r, "revoke", ret);
			else
				cur = NONE;
			break;
		case 1:
			/* only a revoked proxy takes a plain attach */
			atomic_store(&r->next, cur == NONE ? i : cur);
			ret = kvd_attach(r->dev, r->proxy, r->backing[i], 0);
			if (ret && ret != -EEXIST)
				note_error(r, "attach", ret);
			else if (!ret)
				cur = i;
			break;
		default:
			atomic_store(&r->next, i);
			ret = kvd_replace(r->dev, r->proxy, r->backing[i], 0);
			if (ret)
				note_error(r, "replace", ret);
			else
				cur = i;
			break;
		}
		r->current[k + 1] = cur;
		atomic_store(&r->done, ++k);
		atomic_fetch_add(&r->ops, 1);
	}
	return NULL;
}

/* ---- several controllers at once ---- */

#define NCTL		3
#define MAXLOG		(1 << 15)	/* operations and reads logged */

struct multi {
	struct race *r;
	struct race_op op[MAXLOG];	/* op[0]: the first attach */
	atomic_int nops;
	struct race_read rd[MAXLOG];
	atomic_int nreads;
	atomic_long allowed;		/* -EEXIST, -EAGAIN: nothing changed */
};

static void log_op(struct multi *m, int target, int64_t t0, uint64_t gen,
		   bool plain)
{
	int k = atomic_fetch_add(&m->nops, 1);

	if (k < MAXLOG)
		m->op[k] = (struct race_op){ target, t0, race_now_ns(), gen,
					     plain };
}

static void *multi_controller(void *arg)
{
	struct multi *m = arg;
	struct race *r = m->r;
	unsigned int seed = (unsigned int)(uintptr_t)&seed;
	struct kvdmabuf_query q;
	uint64_t gen;
	int ret, i, fd;
	int64_t t0;

	while (!atomic_load(&r->stop)) {
		i = next_backing(r);
		t0 = race_now_ns();
		switch (rand_r(&seed) % 5) {
		case 0:
			ret = kvd_revoke_full(r->dev, r->proxy, 2000, &gen);
			if (!ret)
				log_op(m, RACE_REVOKED, t0, gen, false);
			else
				note_error(r, "revoke", ret);
			break;
		case 1:
			ret = kvd_attach_full(r->dev, r->proxy, r->backing[i],
					      0, 0, 0, &gen);
			if (!ret)
				log_op(m, i, t0, gen, true);
			else if (ret == -EEXIST || ret == -EAGAIN)
				atomic_fetch_add(&m->allowed, 1);
			else
				note_error(r, "attach", ret);
			break;
		case 2:
			ret = kvd_attach_full(r->dev, r->proxy, r->backing[i],
					      0, KVDMABUF_ATTACH_REPLACE, 2000,
					      &gen);
			if (!ret)
				log_op(m, i, t0, gen, false);
			else if (ret == -EAGAIN)
				atomic_fetch_add(&m->allowed, 1);
			else
				note_error(r, "replace", ret);
			break;
		case 3:
			ret = kvd_query(r->dev, r->proxy, &q);
			if (ret)
				note_error(r, "query", ret);
			break;
		default:
			/* a second fd of the proxy comes and goes */
			fd = dup(r->proxy);
			ret = fd < 0 ? -errno : kvd_query(r->dev, fd, &q);
			if (ret)
				note_error(r, "query of a dup", ret);
			if (fd >= 0)
				close(fd);
			break;
		}
		atomic_fetch_add(&r->ops, 1);
	}
	return NULL;
}

static void *multi_reader(void *arg)
{
	struct multi *m = arg;
	struct race *r = m->r;
	unsigned int seed = (unsigned int)(uintptr_t)&seed;
	char *buf = malloc(CHUNK);
	int imp = imp_open(), h, ret, i, match, k;
	int64_t t0, t1;

	h = imp < 0 ? imp : imp_import(imp, r->proxy, 0);
	if (!buf || h < 0) {
		note_error(r, "reader setup", h < 0 ? h : -ENOMEM);
		free(buf);
		return NULL;
	}
	while (!atomic_load(&r->stop)) {
		uint64_t off = (rand_r(&seed) % (WPAGE - CHUNK / KVD_PAGE + 1)) *
			       KVD_PAGE;

		t0 = race_now_ns();
		ret = imp_read(imp, h, off, buf, CHUNK);
		t1 = race_now_ns();
		if (ret == -ENODEV) {
			atomic_fetch_add(&r->reads_revoked, 1);
			continue;
		}
		if (ret) {
			note_error(r, "read", ret);
			continue;
		}
		match = -1;
		for (i = 0; i < NBACK; i++)
			if (check_at(buf, CHUNK, SEED(i), off) < 0)
				match = i;
		if (match < 0) {
			atomic_fetch_add(&r->bad_bytes, 1);
			continue;
		}
		k = atomic_fetch_add(&m->nreads, 1);
		if (k < MAXLOG)
			m->rd[k] = (struct race_read){ match, t0, t1 };
		atomic_fetch_add(&r->reads_ok, 1);
	}
	imp_release(imp, h);
	close(imp);
	free(buf);
	return NULL;
}

static void *querier(void *arg)
{
	struct race *r = arg;
	struct kvdmabuf_query q;
	int ret;

	while (!atomic_load(&r->stop)) {
		ret = kvd_query(r->dev, r->proxy, &q);
		if (ret)
			note_error(r, "query", ret);
		else if (q.state != KVDMABUF_STATE_BACKED &&
			 q.state != KVDMABUF_STATE_REVOKED)
			note_error(r, "query state", -(int)q.state);
		else if (q.blocking_pins || q.live_mappings > 3)
			note_error(r, "query counts", -(int)q.live_mappings);
		atomic_fetch_add(&r->queries, 1);
		usleep(1000);
	}
	return NULL;
}

/*
 * The device, the test importer, NBACK vgem backings of their own
 * patterns and an unbacked proxy of SIZE: NULL, or why the test skips.
 */
static const char *race_open(struct __test_metadata *_metadata,
			     struct race *r)
{
	static char why[160];
	int i;

	r->dev = kvd_dev_open();
	if (r->dev < 0) {
		snprintf(why, sizeof(why), "%s: %s (kvdmabuf module not loaded)",
			 KVDMABUF_DEVICE_PATH, strerror(-r->dev));
		return why;
	}
	i = imp_open();
	if (i < 0) {
		snprintf(why, sizeof(why), "%s: %s (%s test module not loaded)",
			 KVD_IMP_PATH, strerror(-i), KVD_IMP_MODULE);
		return why;
	}
	close(i);
	r->drm = vgem_open();
	if (r->drm < 0)
		return "no vgem device (modprobe vgem)";
	for (i = 0; i < NBACK; i++) {
		r->backing[i] = vgem_pattern_buf(r->drm, SIZE, SEED(i));
		ASSERT_GE(r->backing[i], 0);
	}
	r->proxy = kvd_create(r->dev, SIZE, NULL);
	ASSERT_GE(r->proxy, 0);
	return NULL;
}

/* Every importer went away with its mapping; a revoke leaves nothing. */
static void race_close(struct __test_metadata *_metadata, struct race *r)
{
	struct kvdmabuf_query q;
	int i;

	ASSERT_EQ(0, kvd_revoke(r->dev, r->proxy, 1000));
	ASSERT_EQ(0, kvd_query(r->dev, r->proxy, &q));
	EXPECT_EQ(0, q.live_mappings);
	EXPECT_EQ(0, q.backing_attachments);
	EXPECT_EQ(0, q.stale_backings);
	EXPECT_EQ(0, q.dynamic_importers + q.pinned_importers);
	close(r->proxy);
	for (i = 0; i < NBACK; i++)
		close(r->backing[i]);
	close(r->drm);
	close(r->dev);
}

TEST_TIMEOUT(churn_while_importers_access, 120)
{
	static struct race r;
	pthread_t th[5];
	const char *why;
	char *expect;
	int i, n = 0;

	why = race_open(_metadata, &r);
	if (why)
		SKIP(return, "%s", why);
	ASSERT_EQ(0, kvd_attach(r.dev, r.proxy, r.backing[0], 0));
	atomic_store(&r.turn, 1);
	r.current[0] = 0;
	atomic_store(&r.next, 0);

	ASSERT_EQ(0, pthread_create(&th[n++], NULL, reader, &r));
	ASSERT_EQ(0, pthread_create(&th[n++], NULL, reader, &r));
	ASSERT_EQ(0, pthread_create(&th[n++], NULL, writer, &r));
	ASSERT_EQ(0, pthread_create(&th[n++], NULL, controller, &r));
	ASSERT_EQ(0, pthread_create(&th[n++], NULL, querier, &r));
	sleep(SECONDS);
	atomic_store(&r.stop, 1);
	for (i = 0; i < n; i++)
		pthread_join(th[i], NULL);

	TH_LOG("reads ok %ld (of a backing not current then: %ld) revoked %ld, "
	       "writes %ld, control ops %ld, queries %ld",
	       atomic_load(&r.reads_ok), atomic_load(&r.stale_reads),
	       atomic_load(&r.reads_revoked), atomic_load(&r.writes_ok),
	       atomic_load(&r.ops), atomic_load(&r.queries));
	if (atomic_load(&r.bad_errors))
		TH_LOG("last unexpected error: %s", r.last_error);
	EXPECT_EQ(0, atomic_load(&r.bad_bytes));
	EXPECT_EQ(0, atomic_load(&r.stale_reads));
	EXPECT_EQ(0, atomic_load(&r.bad_errors));
	EXPECT_GT(atomic_load(&r.reads_ok), 0);
	EXPECT_GT(atomic_load(&r.ops), 10);

	/* Writes never strayed outside their page, in any backing. */
	expect = malloc(SIZE);
	ASSERT_NOT_NULL(expect);
	for (i = 0; i < NBACK; i++) {
		pattern_fill(expect, SIZE, SEED(i));
		EXPECT_EQ(1, dmabuf_equals(r.backing[i], 0, expect,
					   WPAGE * KVD_PAGE));
	}
	free(expect);

	race_close(_metadata, &r);
}

/*
 * Three controllers on one proxy at once, two readers and a writer: every
 * read one backing's bytes, and one the proxy had during the read; no
 * plain attach succeeded on a backed proxy.
 */
TEST_TIMEOUT(concurrent_controllers_while_importers_access, 120)
{
	static struct race r;
	static struct multi m;
	pthread_t th[NCTL + 3];
	const char *why;
	int i, k, n = 0, nops, nreads;
	long stale = 0;
	const char *order;
	char why_order[160];

	why = race_open(_metadata, &r);
	if (why)
		SKIP(return, "%s", why);
	m.r = &r;
	m.op[0] = (struct race_op){ .target = 0, .t0 = race_now_ns(),
				    .plain = true };
	ASSERT_EQ(0, kvd_attach_full(r.dev, r.proxy, r.backing[0], 0, 0, 0,
				     &m.op[0].gen));
	atomic_store(&r.turn, 1);
	m.op[0].t1 = race_now_ns();
	atomic_store(&m.nops, 1);

	for (i = 0; i < NCTL; i++)
		ASSERT_EQ(0, pthread_create(&th[n++], NULL, multi_controller,
					    &m));
	ASSERT_EQ(0, pthread_create(&th[n++], NULL, multi_reader, &m));
	ASSERT_EQ(0, pthread_create(&th[n++], NULL, multi_reader, &m));
	ASSERT_EQ(0, pthread_create(&th[n++], NULL, writer, &r));
	sleep(SECONDS);
	atomic_store(&r.stop, 1);
	for (i = 0; i < n; i++)
		pthread_join(th[i], NULL);

	nops = atomic_load(&m.nops);
	nreads = atomic_load(&m.nreads);
	ASSERT_LE(nops, MAXLOG);
	if (nreads > MAXLOG)
		nreads = MAXLOG;
	for (k = 0; k < nreads; k++)
		if (!race_read_in_window(m.op, nops, &m.rd[k]))
			stale++;
	/* every change logged (nops below MAXLOG): their order is judged */
	order = race_gens_check(m.op, nops, why_order, sizeof(why_order));
	if (order)
		TH_LOG("the swaps' order: %s", order);
	TH_LOG("reads ok %ld (judged %d, of a backing not current then: %ld) "
	       "revoked %ld, writes %ld; control ops %ld (%d changed the "
	       "backing, %ld refused as the uapi allows)",
	       atomic_load(&r.reads_ok), nreads, stale,
	       atomic_load(&r.reads_revoked), atomic_load(&r.writes_ok),
	       atomic_load(&r.ops), nops - 1, atomic_load(&m.allowed));
	if (atomic_load(&r.bad_errors))
		TH_LOG("last unexpected error: %s", r.last_error);
	EXPECT_EQ(0, atomic_load(&r.bad_bytes));
	EXPECT_EQ(0, stale);
	EXPECT_EQ(0, order != NULL);
	EXPECT_EQ(0, atomic_load(&r.bad_errors));
	EXPECT_GT(nreads, 0);
	EXPECT_GT(nops, 10);

	race_close(_metadata, &r);
}

TEST_HARNESS_MAIN
