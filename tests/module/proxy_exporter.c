// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_exporter: the proxy backed by a dynamic exporter that moves or
 * revokes its buffer on its own (tests/kmod/kvd_exporter.c: stands in for
 * amdgpu/xe VRAM eviction and device reset; variant nopages: a table of
 * DMA addresses without struct pages, like CUDA BAR1 memory).
 *
 * An exporter move or revoke makes the proxy REVOKED with revoke_reason
 * KVDMABUF_REVOKE_EXPORTER and an event on the device fd; importers get
 * -ENODEV until a backing is attached again, then read the new pages.
 * The exporter poisons the pages it left, so an importer that kept old
 * addresses would read 0xde bytes: they never do.
 */
#include <pthread.h>
#include <sched.h>

#include "harness.h"
#include "proxy_common.h"

#define SIZE		(16 * KVD_PAGE)
#define SEED_A		0x3a
#define SEED_B		0x3b
#define SEED_C		0x3c

FIXTURE(exp) {
	int dev, imp, exp, drm;
	int proxy, e, h;
	char buf[SIZE];
};

FIXTURE_VARIANT(exp) {
	uint32_t flags;
};

FIXTURE_VARIANT_ADD(exp, pages) { .flags = 0 };
FIXTURE_VARIANT_ADD(exp, nopages) { .flags = KVD_EXP_CREATE_NOPAGES };

FIXTURE_SETUP(exp)
{
	self->dev = self->imp = self->exp = self->drm = -1;
	self->proxy = self->e = self->h = -1;
	KVD_OPEN_DEV(self->dev);
	KVD_OPEN_IMP(self->imp);
	KVD_OPEN_EXP(self->exp);
	self->e = exp_buf(self->exp, SIZE, variant->flags, SEED_A);
	ASSERT_GE(self->e, 0);
	self->proxy = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(self->proxy, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->e, 0));
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	ASSERT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
}

FIXTURE_TEARDOWN(exp)
{
	if (self->h >= 0)
		imp_release(self->imp, self->h);
	if (self->proxy >= 0)
		close(self->proxy);
	if (self->e >= 0)
		close(self->e);
	if (self->drm >= 0)
		close(self->drm);
	if (self->exp >= 0)
		close(self->exp);
	if (self->imp >= 0)
		close(self->imp);
	if (self->dev >= 0)
		close(self->dev);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Reads the device fd's queued events; returns the last REVOKED one's gen. */
static uint64_t last_revoked_event(int dev)
{
	struct kvdmabuf_event ev[64];
	uint64_t gen = 0;
	int n, i, fl = fcntl(dev, F_GETFL);

	fcntl(dev, F_SETFL, fl | O_NONBLOCK);
	n = read(dev, ev, sizeof(ev));
	fcntl(dev, F_SETFL, fl);
	for (i = 0; i < n / (int)sizeof(ev[0]); i++)
		if (ev[i].state == KVDMABUF_STATE_REVOKED)
			gen = ev[i].generation;
	return gen;
}

/* Waits (10 s at most) for a BACKED event of a generation after @gen. */
static int wait_backed_event(int dev, uint64_t gen)
{
	struct pollfd pfd = { .fd = dev, .events = POLLIN };
	struct kvdmabuf_event ev[64];
	int n, i;

	while (poll(&pfd, 1, 10000) == 1) {
		n = read(dev, ev, sizeof(ev));
		if (n < 0)
			return -errno;
		for (i = 0; i < n / (int)sizeof(ev[0]); i++)
			if (ev[i].state == KVDMABUF_STATE_BACKED &&
			    ev[i].generation > gen)
				return 0;
	}
	return -ETIMEDOUT;
}

/*
 * A proxy backed by a new exporter buffer (@flags, pattern @seed) and a
 * dynamic import of it: the import's handle, *@e and *@p the buffer's and
 * the proxy's fds; or -errno.
 */
static int backed_import(FIXTURE_DATA(exp) *self, uint32_t flags,
			 uint32_t seed, int *e, int *p)
{
	int ret;

	*p = -1;
	*e = exp_buf(self->exp, SIZE, flags, seed);
	if (*e < 0)
		return *e;
	*p = kvd_create(self->dev, SIZE, NULL);
	if (*p < 0)
		return *p;
	ret = kvd_attach(self->dev, *p, *e, 0);
	return ret ? ret : imp_import(self->imp, *p, 0);
}

/* Undoes backed_import(): 0, or the first error. */
static int backed_import_done(FIXTURE_DATA(exp) *self, int h, int p, int e)
{
	int ret = imp_release(self->imp, h), r2;

	r2 = kvd_revoke(self->dev, p, 1000);
	close(p);
	close(e);
	return ret ? ret : r2;
}

/* An importer read must fail, or (if it wrongly succeeds) show which bytes. */
static int read_while_revoked(struct __test_metadata *_metadata, int imp,
			      int h, char *buf)
{
	int ret = imp_read(imp, h, 0, buf, SIZE);

	if (!ret)
		TH_LOG("read succeeded while revoked: first word 0x%08x (0xdededede = old, poisoned pages)",
		       *(uint32_t *)buf);
	return ret;
}

TEST_F(exp, exporter_move_revokes_then_new_pages_are_read)
{
	struct pollfd pfd = { .fd = self->dev, .events = POLLIN };
	struct kvd_imp_counters c;
	struct kvdmabuf_query q;
	struct kvd_exp_info i;

	last_revoked_event(self->dev);	/* drop the attach event */
	ASSERT_EQ(0, exp_move(self->exp, self->e));
	ASSERT_EQ(0, exp_fill(self->exp, self->e, SEED_B));

	ASSERT_EQ(0, kvd_wait_state(self->dev, self->proxy,
				    KVDMABUF_STATE_REVOKED, &q));
	EXPECT_EQ(KVDMABUF_REVOKE_EXPORTER, q.revoke_reason);
	EXPECT_EQ(2, q.generation);
	EXPECT_EQ(1, q.notifications);
	EXPECT_EQ(1, poll(&pfd, 1, 1000));
	EXPECT_EQ(2, last_revoked_event(self->dev));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(1, c.invalidations);
	EXPECT_EQ(0, c.mapped);
	EXPECT_EQ(-ENODEV, read_while_revoked(_metadata, self->imp, self->h,
					       self->buf));

	/* The module let go of the old pages' mapping. */
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.backing_attachments);
	EXPECT_EQ(0, q.stale_backings);
	ASSERT_EQ(0, exp_info(self->exp, self->e, &i));
	EXPECT_EQ(1, i.moves);
	EXPECT_EQ(0, i.live_maps);
	EXPECT_EQ(0, i.attachments);
	EXPECT_EQ(0, i.pins);

	/* Attached again: the same import reads the new pages. */
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->e, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_REVOKE_NONE, q.revoke_reason);
	EXPECT_EQ(1, q.p2p_backing_attachments);
}

TEST_F(exp, exporter_revoke_revokes_the_proxy)
{
	struct kvdmabuf_query q;
	struct kvd_exp_info i;
	int b;

	last_revoked_event(self->dev);
	ASSERT_EQ(0, exp_revoke(self->exp, self->e));
	ASSERT_EQ(0, kvd_wait_state(self->dev, self->proxy,
				    KVDMABUF_STATE_REVOKED, &q));
	EXPECT_EQ(KVDMABUF_REVOKE_EXPORTER, q.revoke_reason);
	EXPECT_EQ(2, last_revoked_event(self->dev));
	EXPECT_EQ(-ENODEV, read_while_revoked(_metadata, self->imp, self->h,
					       self->buf));
	/* A revoked backing cannot be attached again. */
	EXPECT_EQ(-ENODEV, kvd_attach(self->dev, self->proxy, self->e, 0));
	/* The stale backing goes; the exporter sees nothing held. */
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, exp_info(self->exp, self->e, &i));
	EXPECT_EQ(1, i.revoked);
	EXPECT_EQ(0, i.live_maps);
	EXPECT_EQ(0, i.attachments);

	/* Another backing brings the importer back. */
	b = exp_buf(self->exp, SIZE, variant->flags, SEED_C);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, b, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_C));
	close(b);
}

/* Reads the device fd's queued events: how many REVOKED ones, the last's gen. */
static int revoked_events(int dev, uint64_t *gen)
{
	struct kvdmabuf_event ev[64];
	int n, i, count = 0, fl = fcntl(dev, F_GETFL);

	fcntl(dev, F_SETFL, fl | O_NONBLOCK);
	n = read(dev, ev, sizeof(ev));
	fcntl(dev, F_SETFL, fl);
	for (i = 0; i < n / (int)sizeof(ev[0]); i++) {
		if (ev[i].state == KVDMABUF_STATE_REVOKED) {
			*gen = ev[i].generation;
			count++;
		}
	}
	return count;
}

/*
 * @on: this thread runs SCHED_FIFO on the CPU it is on, which normal
 * threads (kworkers included) cannot take from it; else as before.
 */
static int run_alone(int on)
{
	static cpu_set_t saved;
	struct sched_param sp = { .sched_priority = on ? 1 : 0 };
	cpu_set_t one;

	if (on) {
		if (sched_getaffinity(0, sizeof(saved), &saved))
			return -errno;
		CPU_ZERO(&one);
		CPU_SET(sched_getcpu(), &one);
		if (sched_setaffinity(0, sizeof(one), &one))
			return -errno;
	}
	if (sched_setscheduler(0, on ? SCHED_FIFO : SCHED_OTHER, &sp))
		return -errno;
	if (!on && sched_setaffinity(0, sizeof(saved), &saved))
		return -errno;
	return 0;
}

/*
 * An importer that attaches after the exporter revoked the backing but
 * before the module's work revoked the proxy (its pin of the backing
 * fails) attaches to the revoked proxy, as it would a moment later: the
 * attach succeeds, the proxy is revoked once (reason EXPORTER, one
 * generation, one notification, one event) and both imports read nothing.
 * The exporter revokes inside the second importer's pin, so every round
 * is in that window (the fuzzer's forked children hit it by chance); the
 * importing thread runs SCHED_FIFO on one CPU, where the module's work is
 * queued (system_wq is per CPU), so the work cannot run before the attach
 * has come back for the proxy's lock.
 */
TEST_F(exp, attach_between_exporter_revoke_and_the_work_succeeds)
{
	struct kvdmabuf_query q;
	int round, e, p, h1, h2, n;
	uint64_t gen = 0;

	for (round = 0; round < 20; round++) {
		h1 = backed_import(self, variant->flags |
				   KVD_EXP_CREATE_REVOKE_ON_PIN, SEED_B, &e, &p);
		ASSERT_GE(h1, 0);
		ASSERT_EQ(0, imp_read(self->imp, h1, 0, self->buf, SIZE));
		ASSERT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
		revoked_events(self->dev, &gen);	/* drop older ones */

		ASSERT_EQ(0, run_alone(1));
		h2 = imp_import(self->imp, p, 0);
		ASSERT_EQ(0, run_alone(0));
		if (h2 < 0)
			TH_LOG("round %d: the second import: %d", round, h2);
		ASSERT_GE(h2, 0);
		ASSERT_EQ(0, kvd_wait_state(self->dev, p,
					    KVDMABUF_STATE_REVOKED, &q));
		EXPECT_EQ(KVDMABUF_REVOKE_EXPORTER, q.revoke_reason);
		EXPECT_EQ(2, q.generation);
		EXPECT_EQ(1, q.notifications);
		EXPECT_EQ(2, q.dynamic_importers);
		/* the work item, queued too, finds nothing left to revoke */
		usleep(20000);
		ASSERT_EQ(0, kvd_query(self->dev, p, &q));
		EXPECT_EQ(2, q.generation);
		n = revoked_events(self->dev, &gen);
		EXPECT_EQ(1, n);
		EXPECT_EQ(2, gen);
		EXPECT_EQ(-ENODEV, read_while_revoked(_metadata, self->imp, h1,
						       self->buf));
		EXPECT_EQ(-ENODEV, read_while_revoked(_metadata, self->imp, h2,
						       self->buf));
		EXPECT_EQ(0, imp_release(self->imp, h2));
		EXPECT_EQ(0, backed_import_done(self, h1, p, e));
	}
}

/*
 * An exporter that reuses its memory once the fences on its resv have
 * signaled after telling its importers (the Linux 7.1 contract of
 * dma_buf_invalidate_mappings(); vfio-pci waits so, resv held) does not
 * get it back while an importer of the proxy can still write to it: the
 * module's fence on the backing holds the exporter until the work has
 * told the proxy's importers and the fences they had then (round odd: one
 * that signals 300 ms later) have signaled. The revoking thread runs
 * SCHED_FIFO on its CPU, where the work is queued, so that without the
 * fence the importer's write would come before the work, every round.
 * The write after the exporter's revoke returned must find no mapping.
 */
TEST_F(exp, exporter_fence_wait_outlasts_the_proxys_writers)
{
	uint64_t t0, dt;
	int round, e, p, h, w, r;

	memset(self->buf, 0x5a, SIZE);
	for (round = 0; round < 10; round++) {
		h = backed_import(self, variant->flags |
				  KVD_EXP_CREATE_REVOKE_FENCED, SEED_B, &e, &p);
		ASSERT_GE(h, 0);
		ASSERT_EQ(0, imp_write(self->imp, h, 0, self->buf, KVD_PAGE));
		/* before the fence starts its 300 ms: dt covers all of it */
		t0 = now_ms();
		if (round % 2)
			ASSERT_EQ(0, imp_fence(self->imp, h, 300));
		ASSERT_EQ(0, run_alone(1));
		r = exp_revoke(self->exp, e);
		dt = now_ms() - t0;
		w = imp_write(self->imp, h, 0, self->buf, KVD_PAGE);
		ASSERT_EQ(0, run_alone(0));
		if (w != -ENODEV)
			TH_LOG("round %d: a write after the exporter's revoke (%llu ms): %s",
			       round, (unsigned long long)dt, strerror(-w));
		EXPECT_EQ(0, r);
		EXPECT_EQ(-ENODEV, w);
		/* 9/10: the fence is a jiffies timer, which may run a few
		 * ms ahead of CLOCK_MONOTONIC in a TCG guest; a revoke that
		 * does not wait for it takes a few ms */
		if (round % 2) {
			TH_LOG("round %d: revoke with a 300 ms fence: %llu ms",
			       round, (unsigned long long)dt);
			EXPECT_GE(dt, 270u);
		}
		EXPECT_EQ(0, backed_import_done(self, h, p, e));
	}
}

/*
 * The invalidation work revokes the proxy only if the backing it finds is
 * the one that was invalidated: a REPLACE that took the moved backing
 * away before the work ran leaves the proxy BACKED with the new one (one
 * generation, the new pages read). The replacing thread runs SCHED_FIFO
 * on the CPU the work is queued on, so the work runs only once the
 * REPLACE sleeps in its drain (which flushes the work), after the swap:
 * every round is in that window.
 */
TEST_F(exp, exporter_move_replaced_before_the_work_stays_backed)
{
	struct kvdmabuf_query q;
	uint64_t gen;
	int round, e, b, p, h, r;

	for (round = 0; round < 10; round++) {
		e = exp_buf(self->exp, SIZE, variant->flags, SEED_B);
		ASSERT_GE(e, 0);
		b = exp_buf(self->exp, SIZE, variant->flags, SEED_C);
		ASSERT_GE(b, 0);
		p = kvd_create(self->dev, SIZE, NULL);
		ASSERT_GE(p, 0);
		ASSERT_EQ(0, kvd_attach(self->dev, p, e, 0));
		h = imp_import(self->imp, p, 0);
		ASSERT_GE(h, 0);
		ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));

		ASSERT_EQ(0, run_alone(1));
		r = exp_move(self->exp, e);
		if (!r)
			r = kvd_attach_full(self->dev, p, b, 0,
					    KVDMABUF_ATTACH_REPLACE, 1000, &gen);
		ASSERT_EQ(0, run_alone(0));
		ASSERT_EQ(0, r);
		ASSERT_EQ(0, kvd_query(self->dev, p, &q));
		if (q.state != KVDMABUF_STATE_BACKED)
			TH_LOG("round %d: state %u, reason %u", round, q.state,
			       q.revoke_reason);
		EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
		EXPECT_EQ(gen, q.generation);
		EXPECT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
		EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_C));
		EXPECT_EQ(0, backed_import_done(self, h, p, b));
		close(e);
	}
}

/*
 * A backing revoked by its exporter while nothing of the module was
 * attached to it (no importer, so nobody heard it): the next importer's
 * attach finds it refused (-ENODEV), revokes the proxy as the work would
 * have (reason EXPORTER, an event) and attaches to the revoked proxy,
 * instead of failing with the proxy still saying BACKED.
 */
TEST_F(exp, exporter_revoke_unheard_revokes_at_the_next_import)
{
	struct kvdmabuf_query q;
	int e, p, h;

	e = exp_buf(self->exp, SIZE, variant->flags, SEED_B);
	ASSERT_GE(e, 0);
	p = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(p, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, p, e, 0));
	last_revoked_event(self->dev);		/* drop older ones */
	ASSERT_EQ(0, exp_revoke(self->exp, e));

	h = imp_import(self->imp, p, 0);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, kvd_query(self->dev, p, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(KVDMABUF_REVOKE_EXPORTER, q.revoke_reason);
	EXPECT_EQ(2u, q.generation);
	EXPECT_EQ(2u, last_revoked_event(self->dev));
	EXPECT_EQ(-ENODEV, read_while_revoked(_metadata, self->imp, h,
					       self->buf));
	EXPECT_EQ(0, backed_import_done(self, h, p, e));
}

/*
 * REVOKE after an exporter's revoke returns once the module let go of the
 * old backing, also when the work that revoked the proxy is still tearing
 * the slot down (the exporter's unmap sleeps, as a GPU driver's may): the
 * caller then frees the backing and must find nothing of it held.
 */
TEST_F(exp, revoke_waits_for_the_exporter_revokes_teardown)
{
	struct kvdmabuf_query q;
	struct kvd_exp_info i;
	uint64_t t0;
	int e, p, h;

	h = backed_import(self, variant->flags | KVD_EXP_CREATE_SLOW_UNMAP,
			  SEED_B, &e, &p);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	t0 = now_ms();
	ASSERT_EQ(0, exp_revoke(self->exp, e));
	ASSERT_EQ(0, kvd_wait_state(self->dev, p, KVDMABUF_STATE_REVOKED, &q));
	ASSERT_EQ(0, kvd_revoke(self->dev, p, 5000));
	/*
	 * The slot's unmap began after t0 and sleeps that long, by msleep(),
	 * which counts jiffies: in a TCG guest those run up to a few ms ahead
	 * of CLOCK_MONOTONIC (1498 ms measured once). A REVOKE that did not
	 * wait returns in a few ms.
	 */
	EXPECT_GE(now_ms() - t0, (uint64_t)exp_slow_ms() * 9 / 10);
	ASSERT_EQ(0, exp_info(self->exp, e, &i));
	EXPECT_EQ(0, i.live_maps);
	EXPECT_EQ(0, i.attachments);
	EXPECT_EQ(0, imp_release(self->imp, h));
	close(p);
	close(e);
}

/* The module maps the backing for the importer's own device. */
TEST_F(exp, backing_mapped_for_the_importer_device)
{
	struct kvd_exp_info i;
	int d, others = 0;

	ASSERT_EQ(0, exp_info(self->exp, self->e, &i));
	EXPECT_EQ(1, i.attachments);
	EXPECT_GE(exp_dev_maps(&i, KVD_IMP_MODULE KVD_IMP_DEV_SUFFIX), 1);
	for (d = 0; d < KVD_EXP_MAX_DEVS; d++)
		if (i.dev_names[d][0] &&
		    strcmp(i.dev_names[d], KVD_IMP_MODULE KVD_IMP_DEV_SUFFIX)) {
			TH_LOG("mapped for %s", i.dev_names[d]);
			others++;
		}
	EXPECT_EQ(0, others);
}

/* Tables without struct pages go to peer-to-peer importers only. */
TEST_F(exp, static_importer_refused)
{
	uint32_t handle = 0;
	int ret;

	self->drm = vgem_open();
	if (self->drm < 0)
		SKIP(return, "no vgem device (modprobe vgem)");
	errno = 0;
	ret = drmPrimeFDToHandle(self->drm, self->e, &handle);
	if (variant->flags & KVD_EXP_CREATE_NOPAGES) {
		EXPECT_NE(0, ret);
		EXPECT_EQ(EOPNOTSUPP, errno);
	} else if (!ret) {
		drmCloseBufferHandle(self->drm, handle);
	}
	/* Either way the proxy is refused to it (p2p tables). */
	errno = 0;
	EXPECT_NE(0, drmPrimeFDToHandle(self->drm, self->proxy, &handle));
	EXPECT_EQ(EOPNOTSUPP, errno);
}

/*
 * Polls QUERY for @ms: 0 while the proxy stays BACKED at generation @gen,
 * else its state (and the test logs what it saw).
 */
static int stays_backed(struct __test_metadata *_metadata, int dev,
			int proxy, uint64_t gen, int ms)
{
	struct kvdmabuf_query q;
	int t;

	for (t = 0; t < ms; t += 10) {
		if (kvd_query(dev, proxy, &q))
			return -1;
		if (q.state != KVDMABUF_STATE_BACKED || q.generation != gen) {
			TH_LOG("state %u generation %llu (want BACKED at %llu), revoke reason %u",
			       q.state, (unsigned long long)q.generation,
			       (unsigned long long)gen, q.revoke_reason);
			return q.state ? (int)q.state : -1;
		}
		usleep(10000);
	}
	return 0;
}

/*
 * An exporter that moves its buffer inside its first pin (amdgpu and xe on
 * Debian's 6.1 and 6.12: VRAM migrated to GTT, every attachment notified,
 * the pinning one too). The module's own pin caused that move and maps
 * only after it, so nothing it handed out went stale: ATTACH, REPLACE and
 * a first importer attach leave the proxy BACKED with the right bytes.
 */
TEST_F(exp, move_on_first_pin_replace_stays_backed)
{
	struct kvd_exp_info i;
	uint64_t gen = 0;
	int b;

	b = exp_buf(self->exp, SIZE,
		    variant->flags | KVD_EXP_CREATE_MOVE_ON_PIN, SEED_B);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, kvd_attach_full(self->dev, self->proxy, b, 0,
				     KVDMABUF_ATTACH_REPLACE, 2000, &gen));
	ASSERT_EQ(0, exp_info(self->exp, b, &i));
	EXPECT_EQ(1, i.moves);		/* the module's pin moved it */
	EXPECT_EQ(0, stays_backed(_metadata, self->dev, self->proxy, gen, 300));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	close(b);
}

TEST_F(exp, move_on_first_pin_attach_with_importer_stays_backed)
{
	struct kvd_exp_info i;
	uint64_t gen = 0;
	int p, h, b;

	p = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(p, 0);
	h = imp_import(self->imp, p, 0);	/* attached while unbacked */
	ASSERT_GE(h, 0);
	b = exp_buf(self->exp, SIZE,
		    variant->flags | KVD_EXP_CREATE_MOVE_ON_PIN, SEED_C);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, kvd_attach_full(self->dev, p, b, 0, 0, 0, &gen));
	ASSERT_EQ(0, exp_info(self->exp, b, &i));
	EXPECT_EQ(1, i.moves);
	EXPECT_EQ(0, stays_backed(_metadata, self->dev, p, gen, 300));
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_C));
	EXPECT_EQ(0, imp_release(self->imp, h));
	close(b);
	close(p);
}

TEST_F(exp, move_on_first_pin_first_importer_stays_backed)
{
	struct kvd_exp_info i;
	uint64_t gen = 0;
	int p, h, b;

	p = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(p, 0);
	b = exp_buf(self->exp, SIZE,
		    variant->flags | KVD_EXP_CREATE_MOVE_ON_PIN, SEED_C);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, kvd_attach_full(self->dev, p, b, 0, 0, 0, &gen));
	ASSERT_EQ(0, exp_info(self->exp, b, &i));
	EXPECT_EQ(0, i.moves);		/* no importer yet: nothing pinned */
	h = imp_import(self->imp, p, 0);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, exp_info(self->exp, b, &i));
	EXPECT_EQ(1, i.moves);
	EXPECT_EQ(0, stays_backed(_metadata, self->dev, p, gen, 300));
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_C));
	EXPECT_EQ(0, imp_release(self->imp, h));
	close(b);
	close(p);
}

/*
 * An exporter that moves the buffer at its last unpin (eviction of what
 * nobody pins): the module's own slot teardown causes that move, which
 * concerns nothing the proxy hands out. The proxy stays BACKED and the
 * next importer reads the right bytes.
 */
TEST_F(exp, move_on_last_unpin_is_not_an_invalidation)
{
	struct kvd_exp_info i;
	uint64_t gen = 0;
	int p, b, h;

	p = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(p, 0);
	b = exp_buf(self->exp, SIZE,
		    variant->flags | KVD_EXP_CREATE_MOVE_ON_UNPIN, SEED_B);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, kvd_attach_full(self->dev, p, b, 0, 0, 0, &gen));
	h = imp_import(self->imp, p, 0);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	EXPECT_EQ(0, imp_release(self->imp, h));	/* the last unpin */
	ASSERT_EQ(0, exp_info(self->exp, b, &i));
	EXPECT_EQ(1, i.moves);
	EXPECT_EQ(0, stays_backed(_metadata, self->dev, p, gen, 300));
	h = imp_import(self->imp, p, 0);
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	EXPECT_EQ(0, imp_release(self->imp, h));
	close(b);
	close(p);
}

/*
 * The exporter's move on pin is asynchronous and fenced (a GPU copy
 * engine: new pages at once, a DMA_RESV_USAGE_KERNEL fence until they
 * hold the contents). The proxy's importers never see that fence, so the
 * module waits for it before it hands out the table: reads right after a
 * REPLACE or a first importer attach get the new bytes, not zeros.
 */
TEST_F(exp, async_move_on_pin_fenced_contents_are_read)
{
	const uint32_t mode = KVD_EXP_CREATE_MOVE_ON_PIN |
			      KVD_EXP_CREATE_ASYNC_MOVE;
	struct kvd_exp_info i;
	int p, h, b, c;

	b = exp_buf(self->exp, SIZE, variant->flags | mode, SEED_B);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, b, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, exp_info(self->exp, b, &i));
	EXPECT_EQ(1, i.moves);

	p = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(p, 0);
	c = exp_buf(self->exp, SIZE, variant->flags | mode, SEED_C);
	ASSERT_GE(c, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, p, c, 0));
	h = imp_import(self->imp, p, 0);	/* the first pin moves c */
	ASSERT_GE(h, 0);
	ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_C));
	EXPECT_EQ(0, imp_release(self->imp, h));
	close(c);
	close(p);
	close(b);
}

/* A replace in another thread, to watch what can happen meanwhile. */
struct slow_replace {
	int dev, proxy, backing;
	int ret;
	int tid;		/* atomic */
	int done;		/* atomic */
};

/* Is thread @tid asleep in the kernel, uninterruptibly (state D)? */
static int thread_in_d_state(int tid)
{
	char path[64], buf[512], *p;
	FILE *f;
	int d = 0;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	if (fgets(buf, sizeof(buf), f)) {
		p = strrchr(buf, ')');
		d = p && p[1] == ' ' && p[2] == 'D';
	}
	fclose(f);
	return d;
}

static void *slow_replace_fn(void *p)
{
	struct slow_replace *r = p;

	__atomic_store_n(&r->tid, (int)syscall(SYS_gettid), __ATOMIC_RELEASE);
	r->ret = kvd_replace(r->dev, r->proxy, r->backing, 0);
	__atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * Waits (up to 5 s) until @r's replace sleeps in the exporter's slow map
 * (msleep: state D, seen twice 50 ms apart): 1, or 0 if it never does.
 */
static int in_slow_map(struct slow_replace *r)
{
	int n;

	for (n = 0; n < 100; n++) {
		int tid = __atomic_load_n(&r->tid, __ATOMIC_ACQUIRE);

		usleep(50000);
		if (tid && thread_in_d_state(tid)) {
			usleep(50000);
			if (thread_in_d_state(tid))
				return 1;
		}
	}
	return 0;
}

/*
 * The exporter's attach, pin and map of a new backing run without the
 * proxy's lock: while a replace waits for a slow map (exp_slow_ms() per
 * importer), importers attach (MR registration) and detach (deregistration, exit)
 * and QUERY answers, all before the replace ends. The importer that
 * attached meanwhile follows the new backing too; the one that detached
 * leaves nothing behind.
 */
TEST_F_TIMEOUT(exp, slow_backing_map_blocks_no_importer, 60)
{
	struct slow_replace r = { .dev = self->dev, .proxy = self->proxy };
	struct kvdmabuf_query q;
	struct kvd_exp_info i;
	pthread_t tid;
	int h2, h3;

	r.backing = exp_buf(self->exp, SIZE,
			    variant->flags | KVD_EXP_CREATE_SLOW_MAP, SEED_B);
	ASSERT_GE(r.backing, 0);
	ASSERT_EQ(0, pthread_create(&tid, NULL, slow_replace_fn, &r));
	/* Not exp_info(): it takes the backing's resv, which the map holds */
	ASSERT_TRUE(in_slow_map(&r));
	ASSERT_EQ(0, __atomic_load_n(&r.done, __ATOMIC_ACQUIRE));

	h2 = imp_import(self->imp, self->proxy, 0);	/* attach callback */
	h3 = imp_import(self->imp, self->proxy, 0);
	EXPECT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(0, imp_release(self->imp, h3));	/* detach callback */
	/* Still inside the map: nothing above waited for it. */
	EXPECT_EQ(0, __atomic_load_n(&r.done, __ATOMIC_ACQUIRE));
	ASSERT_GE(h2, 0);
	ASSERT_GE(h3, 0);
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);

	ASSERT_EQ(0, pthread_join(tid, NULL));
	EXPECT_EQ(0, r.ret);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, imp_read(self->imp, h2, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(2, q.dynamic_importers);
	EXPECT_EQ(2, q.backing_attachments);
	EXPECT_EQ(0, q.stale_backings);
	EXPECT_EQ(0, imp_release(self->imp, h2));
	ASSERT_EQ(0, exp_info(self->exp, r.backing, &i));
	EXPECT_EQ(1, i.attachments);	/* the fixture's importer's only */
	close(r.backing);
}

/*
 * A pin that comes while a replace builds its new backing (the build runs
 * without the proxy's lock: an MR registered on a NIC that pins) refuses
 * the swap as one before it would: -EBUSY, not an allocation failure, and
 * nothing changed; the built backing is let go.
 */
TEST_F_TIMEOUT(exp, pin_during_a_slow_build_refuses_the_replace, 60)
{
	struct slow_replace r = { .dev = self->dev, .proxy = self->proxy };
	struct kvdmabuf_query q;
	struct kvd_exp_info i;
	pthread_t tid;
	int hp;

	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	ASSERT_EQ(1, q.generation);
	r.backing = exp_buf(self->exp, SIZE,
			    variant->flags | KVD_EXP_CREATE_SLOW_MAP, SEED_B);
	ASSERT_GE(r.backing, 0);
	ASSERT_EQ(0, pthread_create(&tid, NULL, slow_replace_fn, &r));
	ASSERT_TRUE(in_slow_map(&r));
	hp = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_PINNED);
	ASSERT_GE(hp, 0);
	/* the pin came in while the build was still inside the map */
	EXPECT_EQ(0, __atomic_load_n(&r.done, __ATOMIC_ACQUIRE));
	ASSERT_EQ(0, pthread_join(tid, NULL));
	EXPECT_EQ(-EBUSY, r.ret);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.generation);
	EXPECT_EQ(1, q.blocking_pins);
	ASSERT_EQ(0, imp_read(self->imp, hp, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	EXPECT_EQ(0, imp_release(self->imp, hp));
	ASSERT_EQ(0, exp_info(self->exp, r.backing, &i));
	EXPECT_EQ(0, i.attachments);
	close(r.backing);
}

/*
 * Polls kvd_exporter's counts of @e for @ms (scaled): 0 once nothing of it is
 * attached, pinned or mapped any more, else -ETIMEDOUT (and the last
 * counts are logged). No ioctl of /dev/kvdmabuf meanwhile: the module
 * must let the backing go on its own.
 */
static int exp_let_go(struct __test_metadata *_metadata, int exp, int e,
		      int ms)
{
	struct kvd_exp_info i;
	int t;

	ms = kvd_scaled_ms(ms);
	for (t = 0; t <= ms; t += 10) {
		if (exp_info(exp, e, &i))
			return -EIO;
		if (!i.attachments && !i.pins && !i.live_maps)
			return 0;
		usleep(10000);
	}
	TH_LOG("after %d ms the exporter still sees %u attachments, %u pins, %u maps",
	       ms, i.attachments, i.pins, i.live_maps);
	return -ETIMEDOUT;
}

/*
 * The backing's exporter revokes it (a device reset, vfio-pci's revoke,
 * which then waits for every map and pin to go): the module lets go of
 * it within a second with no ioctl to prompt it, also when the importer
 * attached but never mapped (no unmap to queue a reap), and also when the
 * importer's fence from before the revoke is still pending (its signal
 * queues the reap).
 */
TEST_F(exp, exporter_revoke_let_go_without_ioctl)
{
	int p, e, h, i;

	for (i = 0; i < 2; i++) {
		p = kvd_create(self->dev, SIZE, NULL);
		ASSERT_GE(p, 0);
		e = exp_buf(self->exp, SIZE, variant->flags, SEED_B);
		ASSERT_GE(e, 0);
		ASSERT_EQ(0, kvd_attach(self->dev, p, e, 0));
		h = imp_import(self->imp, p, 0);	/* never maps */
		ASSERT_GE(h, 0);
		if (i)
			ASSERT_EQ(0, imp_fence(self->imp, h, 300));
		ASSERT_EQ(0, exp_revoke(self->exp, e));
		EXPECT_EQ(0, exp_let_go(_metadata, self->exp, e,
					i ? 1300 : 1000));
		EXPECT_EQ(0, imp_release(self->imp, h));
		close(e);
		close(p);
	}
}

/*
 * An exporter whose revoke waits for every importer to unmap (vfio-pci):
 * the module's slot is such an importer. With a dynamic importer mapping
 * the proxy, and with one attached but not mapping, the module unmaps its
 * slot within the exporter's bound (2 s), with no ioctl to prompt it.
 * (An importer of the proxy that holds a pin it cannot give up keeps the
 * slot mapped: that revoke times out, see module/README.md.)
 */
TEST_F(exp, revoke_waiting_exporter_is_not_kept_waiting)
{
	int p, e, h, i;

	for (i = 0; i < 2; i++) {
		p = kvd_create(self->dev, SIZE, NULL);
		ASSERT_GE(p, 0);
		e = exp_buf(self->exp, SIZE,
			    variant->flags | KVD_EXP_CREATE_REVOKE_WAITS, SEED_B);
		ASSERT_GE(e, 0);
		ASSERT_EQ(0, kvd_attach(self->dev, p, e, 0));
		h = imp_import(self->imp, p, 0);
		ASSERT_GE(h, 0);
		if (i)
			ASSERT_EQ(0, imp_read(self->imp, h, 0, self->buf, SIZE));
		EXPECT_EQ(0, exp_revoke(self->exp, e));
		EXPECT_EQ(0, exp_let_go(_metadata, self->exp, e, 500));
		EXPECT_EQ(0, imp_release(self->imp, h));
		close(e);
		close(p);
	}
}

/*
 * Fences are the stale backing's only if they were on the proxy's resv
 * when it went stale: an importer's fence added after a replace (work on
 * the new backing) keeps the old one neither from being reaped nor from
 * the stale bound. A lazy importer holds its old map until its next
 * access, so the old backing is stale while the fence comes.
 */
TEST_F(exp, later_fence_keeps_no_stale_backing)
{
	struct kvdmabuf_query q;
	int lazy, b, c, n;

	lazy = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(lazy, 0);
	ASSERT_EQ(0, imp_read(self->imp, lazy, 0, self->buf, SIZE));
	b = exp_buf(self->exp, SIZE, variant->flags, SEED_B);
	ASSERT_GE(b, 0);
	/* The lazy importer still maps e: stale, -ETIMEDOUT at once. */
	EXPECT_EQ(-ETIMEDOUT, kvd_attach_full(self->dev, self->proxy, b, 0,
					      KVDMABUF_ATTACH_REPLACE, 0,
					      NULL));
	ASSERT_EQ(0, imp_fence(self->imp, self->h, 20000));
	/* Its next access unmaps e and maps b. */
	ASSERT_EQ(0, imp_read(self->imp, lazy, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	EXPECT_EQ(0, exp_let_go(_metadata, self->exp, self->e, 1000));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.stale_backings);

	/*
	 * More replaces than the stale bound while that fence is pending:
	 * each old backing's own fences are those from before its swap,
	 * which include the 20 s one: they stay stale (-ETIMEDOUT) until
	 * the bound refuses (-EAGAIN). So the bound is reached only by
	 * backings that fence really covers.
	 */
	for (n = 0; n < KVDMABUF_MAX_STALE_BACKINGS + 1; n++) {
		c = exp_buf(self->exp, SIZE, variant->flags, SEED_C);
		ASSERT_GE(c, 0);
		q.state = (uint32_t)kvd_attach_full(self->dev, self->proxy, c,
						    0, KVDMABUF_ATTACH_REPLACE,
						    0, NULL);
		close(c);
		if ((int)q.state == -EAGAIN)
			break;
		EXPECT_EQ(-ETIMEDOUT, (int)q.state);
	}
	EXPECT_EQ(KVDMABUF_MAX_STALE_BACKINGS, n);
	EXPECT_EQ(0, imp_release(self->imp, lazy));
	close(b);
}

/*
 * Exporter invalidations are not refused, so stale backings they leave
 * (a lazy importer keeps its old maps until its next access) are bounded
 * at the next ATTACH: after KVDMABUF_MAX_STALE_BACKINGS of them a plain
 * ATTACH fails with -EAGAIN, and succeeds again once the importer lets go.
 */
TEST_F(exp, exporter_invalidations_stale_bound)
{
	int lazy[KVDMABUF_MAX_STALE_BACKINGS], e[KVDMABUF_MAX_STALE_BACKINGS];
	struct kvdmabuf_query q;
	int n, ret = 0;

	for (n = 0; n < KVDMABUF_MAX_STALE_BACKINGS; n++) {
		e[n] = exp_buf(self->exp, SIZE, variant->flags, SEED_B);
		ASSERT_GE(e[n], 0);
	}
	/*
	 * Each round: a lazy importer maps the current backing and never
	 * comes back; the backing's exporter revokes it. The fixture's
	 * backing goes first.
	 */
	for (n = 0; n < KVDMABUF_MAX_STALE_BACKINGS; n++) {
		if (n) {
			ret = kvd_attach(self->dev, self->proxy, e[n - 1], 0);
			ASSERT_EQ(0, ret);
		}
		lazy[n] = imp_import(self->imp, self->proxy,
				     KVD_IMP_IMPORT_LAZY);
		ASSERT_GE(lazy[n], 0);
		ASSERT_EQ(0, imp_read(self->imp, lazy[n], 0, self->buf, SIZE));
		ASSERT_EQ(0, exp_revoke(self->exp, n ? e[n - 1] : self->e));
		ASSERT_EQ(0, kvd_wait_state(self->dev, self->proxy,
					    KVDMABUF_STATE_REVOKED, &q));
	}
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_MAX_STALE_BACKINGS, q.stale_backings);
	EXPECT_EQ(-EAGAIN, kvd_attach(self->dev, self->proxy,
				      e[KVDMABUF_MAX_STALE_BACKINGS - 1], 0));
	/* Once the importers let go, there is room again. */
	for (n = 0; n < KVDMABUF_MAX_STALE_BACKINGS; n++)
		EXPECT_EQ(0, imp_release(self->imp, lazy[n]));
	EXPECT_EQ(0, kvd_attach(self->dev, self->proxy,
				e[KVDMABUF_MAX_STALE_BACKINGS - 1], 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	for (n = 0; n < KVDMABUF_MAX_STALE_BACKINGS; n++)
		close(e[n]);
}

/*
 * -EBUSY has two sources: an importer's pin (it could not follow) and
 * the backing's exporter (memory it cannot place). ATTACH says which in
 * @pins, also on the error: 0 for the exporter's.
 */
TEST_F(exp, ebusy_names_its_source)
{
	struct kvdmabuf_attach a = {
		.size = sizeof(a), .flags = KVDMABUF_ATTACH_REPLACE,
		.proxy_fd = (uint32_t)self->proxy, .pins = 77,
	};
	struct kvdmabuf_query q;
	struct kvd_exp_info i;
	int b, c, hp;
	uint64_t t0;

	b = exp_buf(self->exp, SIZE, variant->flags | KVD_EXP_CREATE_PIN_BUSY,
		    SEED_B);
	ASSERT_GE(b, 0);
	a.backing_fd = (uint32_t)b;
	EXPECT_EQ(-EBUSY, kvd_ioctl(self->dev, KVDMABUF_IOCTL_ATTACH, &a));
	EXPECT_EQ(0, a.pins);		/* the exporter's */
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);

	/*
	 * An importer's pin is seen before any allocation or exporter work
	 * (so memory pressure cannot turn it into -ENOMEM): c's exporter,
	 * whose maps are slow, is never attached.
	 */
	hp = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_PINNED);
	ASSERT_GE(hp, 0);
	c = exp_buf(self->exp, SIZE, variant->flags | KVD_EXP_CREATE_SLOW_MAP,
		    SEED_C);
	ASSERT_GE(c, 0);
	a.backing_fd = (uint32_t)c;
	a.pins = 0;
	t0 = now_ms();
	EXPECT_EQ(-EBUSY, kvd_ioctl(self->dev, KVDMABUF_IOCTL_ATTACH, &a));
	EXPECT_LT(now_ms() - t0, (uint64_t)exp_slow_ms() / 2);
	EXPECT_LE(1, a.pins);		/* the pinned importer's */
	ASSERT_EQ(0, exp_info(self->exp, c, &i));
	EXPECT_EQ(0, i.attachments);
	EXPECT_EQ(0, imp_release(self->imp, hp));
	/* A success reports no pins, whatever came in. */
	a.pins = 5;
	EXPECT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_ATTACH, &a));
	EXPECT_EQ(0, a.pins);
	close(c);
	close(b);
}

#ifndef KVD_IMP_UMEM
/*
 * An importer that maps one attachment twice (a DRM driver mapping for
 * two directions) gets two tables: the first map of a whole-buffer proxy
 * is lent the module's own table, the second must be a copy, never the
 * same table again (its unmap would then free or unlink the lent one).
 */
TEST_F(exp, second_map_of_an_attachment_gets_its_own_table)
{
	struct kvd_imp_access a = {
		.handle = (uint32_t)self->h, .length = SIZE,
		.buf = (uintptr_t)self->buf, .flags = KVD_IMP_ACCESS_SECOND_MAP,
	};
	int n;

	for (n = 0; n < 3; n++) {
		memset(self->buf, 0, SIZE);
		ASSERT_EQ(0, kvd_ioctl(self->imp, KVD_IMP_IOCTL_ACCESS, &a));
		EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	}
	/* The first map, still held, still reads right. */
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
}
#endif

/* The backing's exporter moves it from another thread. */
struct exp_mover {
	int exp, buf, ret;
};

static void *exp_move_fn(void *p)
{
	struct exp_mover *m = p;

	m->ret = exp_move(m->exp, m->buf);
	return NULL;
}

/*
 * The new backing's exporter moves it while the module is still building
 * it (after an importer's slot is mapped, before the last one's):
 * the notification finds the backing not yet published, so the replace
 * must pass it on when it publishes. The proxy ends REVOKED (reason
 * EXPORTER), never BACKED with the first slot's table of the old pages.
 */
TEST_F_TIMEOUT(exp, exporter_move_during_build_revokes_after_publish, 60)
{
	struct slow_replace r = { .dev = self->dev, .proxy = self->proxy };
	struct exp_mover m = { .exp = self->exp };
	struct kvdmabuf_query q;
	pthread_t tid, mtid;
	int h2, h3, n;

	/*
	 * Three slots, a slow map each: a mutex hands itself to a waiter
	 * that lost once, so the move comes before the last slot is built.
	 */
	h2 = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(h2, 0);
	h3 = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(h3, 0);
	r.backing = exp_buf(self->exp, SIZE,
			    variant->flags | KVD_EXP_CREATE_SLOW_MAP, SEED_B);
	ASSERT_GE(r.backing, 0);
	m.buf = r.backing;
	ASSERT_EQ(0, pthread_create(&tid, NULL, slow_replace_fn, &r));
	for (n = 0; n < 100; n++) {
		int t = __atomic_load_n(&r.tid, __ATOMIC_ACQUIRE);

		usleep(50000);
		if (t && thread_in_d_state(t))
			break;
	}
	ASSERT_LT(n, 100);
	/* Waits for the first slow map to end (the resv), then moves. */
	ASSERT_EQ(0, pthread_create(&mtid, NULL, exp_move_fn, &m));
	ASSERT_EQ(0, pthread_join(mtid, NULL));
	EXPECT_EQ(0, m.ret);
	ASSERT_EQ(0, pthread_join(tid, NULL));
	EXPECT_EQ(0, r.ret);
	ASSERT_EQ(0, kvd_wait_state(self->dev, self->proxy,
				    KVDMABUF_STATE_REVOKED, &q));
	EXPECT_EQ(KVDMABUF_REVOKE_EXPORTER, q.revoke_reason);
	EXPECT_NE(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(0, imp_release(self->imp, h2));
	EXPECT_EQ(0, imp_release(self->imp, h3));
	close(r.backing);
}

/* QUERY in a loop for @ms, the longest one kept (a thread of its own). */
struct query_loop {
	int dev, proxy, ms, err;
	uint64_t worst;
};

static void *query_loop_fn(void *p)
{
	struct query_loop *l = p;
	struct kvdmabuf_query q;
	uint64_t t0 = now_ms(), t, dt;

	while ((t = now_ms()) - t0 < (uint64_t)l->ms) {
		if (kvd_query(l->dev, l->proxy, &q))
			l->err++;
		dt = now_ms() - t;
		l->worst = dt > l->worst ? dt : l->worst;
		usleep(10000);
	}
	return NULL;
}

/*
 * Tearing a backing down calls its exporter's unmap, unpin and detach,
 * which may be slow (exp_slow_ms() per unmap here: an exporter
 * evicting). The module does it with no lock of its own held, so QUERY and importer
 * attaches and detaches (MR registration, deregistration) answer
 * meanwhile, each in a thread of its own. The slow unmap is the old
 * backing's, after a replace; who tears it down depends on @by:
 * BY_REAP_WORK: the importer mapped the old backing, its unmap in the move
 * notification queues the reap work; BY_DRAIN: nothing maps it and no QUERY
 * runs until the swap's event, so the replace's own drain does (a drain
 * burying under proxy->lock stalls QUERY and importer attaches).
 */
enum teardown_by { BY_REAP_WORK, BY_DRAIN };

static void slow_unmap_blocks_nothing(struct __test_metadata *_metadata,
				      FIXTURE_DATA(exp) *self,
				      const FIXTURE_VARIANT(exp) *variant,
				      enum teardown_by by)
{
	struct slow_replace r = { .dev = self->dev, .proxy = self->proxy };
	struct query_loop l = {
		.dev = self->dev, .proxy = self->proxy,
		.ms = 2 * exp_slow_ms(),
	};
	uint64_t t0, t, dt, gen, worst = 0;
	struct kvdmabuf_query q;
	pthread_t tid, qtid;
	int b, h2;

	b = exp_buf(self->exp, SIZE,
		    variant->flags | KVD_EXP_CREATE_SLOW_UNMAP, SEED_B);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, b, 0));
	if (by == BY_REAP_WORK) {
		ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
		EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	}

	/* Back onto a quick backing: b's slot goes, slowly. */
	r.backing = exp_buf(self->exp, SIZE, variant->flags, SEED_C);
	ASSERT_GE(r.backing, 0);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	gen = q.generation;
	if (by == BY_DRAIN)
		last_revoked_event(self->dev);	/* drop the queued events */
	ASSERT_EQ(0, pthread_create(&tid, NULL, slow_replace_fn, &r));
	/* Once swapped, new importers get no slot in b: none of theirs is slow. */
	if (by == BY_DRAIN) {
		ASSERT_EQ(0, wait_backed_event(self->dev, gen));
	} else {
		do {
			t = now_ms();
			ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
			dt = now_ms() - t;
			l.worst = dt > l.worst ? dt : l.worst;
		} while (q.generation == gen);
	}
	ASSERT_EQ(0, pthread_create(&qtid, NULL, query_loop_fn, &l));
	t0 = now_ms();
	while ((t = now_ms()) - t0 < (uint64_t)l.ms) {
		h2 = imp_import(self->imp, self->proxy, 0);
		ASSERT_GE(h2, 0);
		dt = now_ms() - t;
		EXPECT_EQ(0, imp_release(self->imp, h2));
		if (now_ms() - t > 100)
			TH_LOG("at %llu ms: attach %llu ms, detach %llu ms",
			       (unsigned long long)(t - t0),
			       (unsigned long long)dt,
			       (unsigned long long)(now_ms() - t - dt));
		dt = now_ms() - t;
		worst = dt > worst ? dt : worst;
		usleep(10000);
	}
	ASSERT_EQ(0, pthread_join(qtid, NULL));
	ASSERT_EQ(0, pthread_join(tid, NULL));
	EXPECT_EQ(0, r.ret);
	EXPECT_EQ(0, l.err);
	TH_LOG("longest QUERY %llu ms, importer attach + detach %llu ms (unmap sleeps %u ms)",
	       (unsigned long long)l.worst, (unsigned long long)worst,
	       exp_slow_ms());
	EXPECT_LT(l.worst, exp_slow_ms() / 2);
	EXPECT_LT(worst, exp_slow_ms() / 2);
	/* The slow teardown did happen. */
	EXPECT_EQ(0, exp_let_go(_metadata, self->exp, b, 2 * exp_slow_ms()));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_C));
	close(r.backing);
	close(b);
}

TEST_F_TIMEOUT(exp, slow_backing_unmap_blocks_no_query, 60)
{
	slow_unmap_blocks_nothing(_metadata, self, variant, BY_REAP_WORK);
}

TEST_F_TIMEOUT(exp, slow_unmap_by_the_drain_blocks_no_query, 60)
{
	slow_unmap_blocks_nothing(_metadata, self, variant, BY_DRAIN);
}

#ifndef KVD_IMP_UMEM
/*
 * The third teardown path: QUERY drops the stale backings that have become
 * idle (so that its counts are exact) but hands them to the reap work,
 * never calls their exporter itself. QUERY is the one that finds one here:
 * the reap work is busy tearing a first slow backing down when a lazy
 * importer's unmap leaves a second idle, and no drain runs. (A QUERY that
 * tore it down itself takes the exporter's slow unmap.)
 */
TEST_F_TIMEOUT(exp, slow_unmap_found_by_query_blocks_no_query, 60)
{
	int slow = variant->flags | KVD_EXP_CREATE_SLOW_UNMAP;
	int b1, b2, c, l1, l2;
	struct kvdmabuf_query q;
	uint64_t t;

	/* Lazy importers keep their map of a backing until their next access. */
	b1 = exp_buf(self->exp, SIZE, slow, SEED_B);
	ASSERT_GE(b1, 0);
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, b1, 0));
	l1 = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(l1, 0);
	ASSERT_EQ(0, imp_read(self->imp, l1, 0, self->buf, SIZE));
	b2 = exp_buf(self->exp, SIZE, slow, SEED_C);
	ASSERT_GE(b2, 0);
	EXPECT_EQ(-ETIMEDOUT, kvd_attach_full(self->dev, self->proxy, b2, 0,
					      KVDMABUF_ATTACH_REPLACE, 50,
					      NULL));
	l2 = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(l2, 0);
	ASSERT_EQ(0, imp_read(self->imp, l2, 0, self->buf, SIZE));
	c = exp_buf(self->exp, SIZE, variant->flags, SEED_A);
	ASSERT_GE(c, 0);
	EXPECT_EQ(-ETIMEDOUT, kvd_attach_full(self->dev, self->proxy, c, 0,
					      KVDMABUF_ATTACH_REPLACE, 50,
					      NULL));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(2, q.stale_backings);

	/* l1 lets b1 go: the reap work takes it and sits in its slow unmap. */
	ASSERT_EQ(0, imp_read(self->imp, l1, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	usleep(exp_slow_ms() / 3 * 1000);
	/* l2 lets b2 go while it does: QUERY finds b2 idle. */
	ASSERT_EQ(0, imp_read(self->imp, l2, 0, self->buf, SIZE));
	t = now_ms();
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	t = now_ms() - t;
	TH_LOG("QUERY that dropped b2: %llu ms (unmaps sleep %u ms)",
	       (unsigned long long)t, exp_slow_ms());
	EXPECT_EQ(0, q.stale_backings);
	EXPECT_LT(t, exp_slow_ms() / 2);
	/* Both slow teardowns did happen. */
	EXPECT_EQ(0, exp_let_go(_metadata, self->exp, b1, 3 * exp_slow_ms()));
	EXPECT_EQ(0, exp_let_go(_metadata, self->exp, b2, 3 * exp_slow_ms()));
	EXPECT_EQ(0, imp_release(self->imp, l1));
	EXPECT_EQ(0, imp_release(self->imp, l2));
	close(c);
	close(b2);
	close(b1);
}
#endif

#ifndef KVD_IMP_UMEM
/*
 * A backing build calls the exporter with the importer's device while the
 * importer may detach and its driver go away (rmmod kvd_importer during
 * a slow map for its device): the module holds a reference to the device
 * until its slot is gone. Without it the exporter's map and the slot's
 * teardown use a freed struct device: KASAN (debug lane) reports it and
 * the lane fails on the guest log; the other lanes check the outcome.
 */
TEST_F_TIMEOUT(exp, importer_driver_gone_during_slow_build, 60)
{
	struct slow_replace r = { 0 };
	struct kvdmabuf_query q;
	pthread_t tid;
	int dev, imp, proxy, a, h, n, fd;
	char path[4096];
	const char *build = getenv("KVDMABUF_BUILD");

	if (!build)
		SKIP(return, "KVDMABUF_BUILD unset: cannot load kvd_importer again");
	/* The fixture's importer must go too for the module to unload. */
	imp_release(self->imp, self->h);
	self->h = -1;
	close(self->imp);
	self->imp = -1;

	KVD_OPEN_DEV(dev);
	KVD_OPEN_IMP(imp);
	a = exp_buf(self->exp, SIZE, variant->flags, SEED_A);
	ASSERT_GE(a, 0);
	proxy = kvd_create(dev, SIZE, NULL);
	ASSERT_GE(proxy, 0);
	ASSERT_EQ(0, kvd_attach(dev, proxy, a, 0));
	h = imp_import(imp, proxy, 0);
	ASSERT_GE(h, 0);
	r.dev = dev;
	r.proxy = proxy;
	r.backing = exp_buf(self->exp, SIZE,
			    variant->flags | KVD_EXP_CREATE_SLOW_MAP, SEED_B);
	ASSERT_GE(r.backing, 0);
	ASSERT_EQ(0, pthread_create(&tid, NULL, slow_replace_fn, &r));
	for (n = 0; n < 100; n++) {
		int t = __atomic_load_n(&r.tid, __ATOMIC_ACQUIRE);

		usleep(50000);
		if (t && thread_in_d_state(t)) {
			usleep(50000);
			if (thread_in_d_state(t))
				break;
		}
	}
	ASSERT_LT(n, 100);
	/* Inside the map for the importer's device: it detaches and goes. */
	EXPECT_EQ(0, imp_release(imp, h));
	close(imp);
	n = (int)syscall(SYS_delete_module, "kvd_importer", O_NONBLOCK);
	if (n)
		TH_LOG("rmmod kvd_importer: %s", strerror(errno));
	EXPECT_EQ(0, n);
	EXPECT_EQ(0, __atomic_load_n(&r.done, __ATOMIC_ACQUIRE));

	ASSERT_EQ(0, pthread_join(tid, NULL));
	EXPECT_EQ(0, r.ret);
	ASSERT_EQ(0, kvd_query(dev, proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(0, q.backing_attachments);	/* none for a gone importer */
	EXPECT_EQ(0, q.stale_backings);
	close(r.backing);
	close(proxy);
	close(a);
	close(dev);

	/* Back for the tests that follow. */
	snprintf(path, sizeof(path), "%s/tests/kmod/kvd_importer.ko", build);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	EXPECT_EQ(0, syscall(SYS_finit_module, fd, "", 0));
	close(fd);
	for (n = 0; n < 200 && access(KVD_IMPORTER_PATH, F_OK); n++)
		usleep(10000);
}
#endif

TEST_HARNESS_MAIN
