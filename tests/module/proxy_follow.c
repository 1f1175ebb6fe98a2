// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_follow: a dynamic importer of a kvdmabuf proxy follows revoke and
 * re-attach / replace of the backing without being re-imported: it reads
 * and writes the backing of the current generation, and fails with -ENODEV
 * while the proxy is revoked. Also: version ioctl, generations, events.
 */
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include "harness.h"
#include "proxy_common.h"

#define SIZE		(64 * KVD_PAGE)
#define SEED_A		0xa
#define SEED_B		0xb
#define SEED_W		0x77

FIXTURE(follow) {
	KVD_IMPORT_FIELDS;
};

FIXTURE_SETUP(follow)
{
	KVD_IMPORT_SETUP(self, SIZE, SEED_A, SEED_B);
}

FIXTURE_TEARDOWN(follow)
{
	KVD_IMPORT_TEARDOWN(self);
}

TEST_F(follow, revoke_then_attach_new_backing)
{
	struct kvd_imp_counters c;
	struct kvdmabuf_query q;
	uint64_t gen;

	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_UNBACKED, q.state);
	EXPECT_EQ(0, q.generation);
	EXPECT_EQ(SIZE, q.length);

	ASSERT_EQ(0, kvd_attach_full(self->dev, self->proxy, self->a, 0, 0, 0,
				     &gen));
	EXPECT_EQ(1, gen);
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);

	/* The importer reads pattern A and its write lands in A. */
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	pattern_fill(self->expect, KVD_PAGE, SEED_W);
	ASSERT_EQ(0, imp_write(self->imp, self->h, 3 * KVD_PAGE, self->expect,
			       KVD_PAGE));
	EXPECT_EQ(1, dmabuf_equals(self->a, 3 * KVD_PAGE, self->expect,
				   KVD_PAGE));

	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.dynamic_importers);
	EXPECT_EQ(0, q.pinned_importers);
	EXPECT_EQ(0, q.blocking_pins);
	EXPECT_EQ(1, q.live_mappings);
	EXPECT_EQ(1, q.backing_attachments);

	/* Revoke: the importer is notified, its access now fails. */
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(1, c.invalidations);
	EXPECT_EQ(0, c.mapped);
	EXPECT_EQ(-ENODEV, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-ENODEV, imp_write(self->imp, self->h, 0, self->expect,
				     KVD_PAGE));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(2, c.failed);

	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(2, q.generation);
	EXPECT_EQ(0, q.live_mappings);
	EXPECT_EQ(0, q.backing_attachments);
	EXPECT_EQ(0, q.stale_backings);
	EXPECT_EQ(1, q.notifications);

	/* Attach B: the same importer attachment now sees B. */
	ASSERT_EQ(0, kvd_attach_full(self->dev, self->proxy, self->b, 0, 0, 0,
				     &gen));
	EXPECT_EQ(3, gen);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, imp_write(self->imp, self->h, 5 * KVD_PAGE, self->expect,
			       KVD_PAGE));
	EXPECT_EQ(1, dmabuf_equals(self->b, 5 * KVD_PAGE, self->expect,
				   KVD_PAGE));
	/* ... and not in A. */
	pattern_fill(self->buf, SIZE, SEED_A);
	EXPECT_EQ(1, dmabuf_equals(self->a, 5 * KVD_PAGE,
				   self->buf + 5 * KVD_PAGE, KVD_PAGE));

	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(2, c.invalidations);
	EXPECT_EQ(2, c.maps);
}

/*
 * The module attaches to backings as a dynamic, peer-to-peer importer (a
 * static attachment would make GPU exporters migrate and pin the buffer
 * in system memory); QUERY says why the proxy is revoked.
 */
TEST_F(follow, backing_attachments_are_dynamic_p2p)
{
	struct kvdmabuf_query q;
	int h2;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_REVOKE_NONE, q.revoke_reason);
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	h2 = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(h2, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(2, q.backing_attachments);
	EXPECT_EQ(2, q.p2p_backing_attachments);

	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_REVOKE_USER, q.revoke_reason);
	EXPECT_EQ(0, q.backing_attachments);

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_REVOKE_NONE, q.revoke_reason);
	EXPECT_EQ(2, q.p2p_backing_attachments);
	ASSERT_EQ(0, imp_read(self->imp, h2, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	EXPECT_EQ(0, imp_release(self->imp, h2));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(1, q.p2p_backing_attachments);
}

TEST_F(follow, replace_swaps_under_a_mapped_importer)
{
	struct kvd_imp_counters c;
	struct kvdmabuf_query q;
	uint64_t gen;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));

	/* Without REPLACE a backed proxy refuses a second backing. */
	EXPECT_EQ(-EEXIST, kvd_attach(self->dev, self->proxy, self->b, 0));

	ASSERT_EQ(0, kvd_attach_full(self->dev, self->proxy, self->b, 0,
				     KVDMABUF_ATTACH_REPLACE, 1000, &gen));
	EXPECT_EQ(2, gen);
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(1, c.invalidations);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));

	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(0, q.stale_backings);
	EXPECT_EQ(1, q.backing_attachments);
	EXPECT_EQ(1, q.notifications);

	/* REPLACE on a revoked proxy is a plain attach. */
	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, self->a, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
}

TEST_F(follow, offset_into_a_larger_backing)
{
	struct kvd_imp_counters c;
	uint32_t *w;
	int big;

	big = vgem_pattern_buf(self->drm, 2 * SIZE, SEED_A);
	ASSERT_GE(big, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, big, SIZE));
	close(big);	/* the proxy holds its own reference */
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	/* The proxy shows the second half of the big buffer. */
	w = (uint32_t *)self->buf;
	EXPECT_EQ(SEED_A * 2654435761u + SIZE / 4, w[0]);
	EXPECT_EQ(SEED_A * 2654435761u + SIZE / 4 + 1, w[1]);
	EXPECT_EQ(SEED_A * 2654435761u + SIZE / 2 - 1, w[SIZE / 4 - 1]);
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(SIZE, c.table_len);
}

/* At offset 0 of a larger backing the importer's table is the proxy's
 * length too: the backing's own table (all of it) is lent only when the
 * two are the same size. */
TEST_F(follow, start_of_a_larger_backing_maps_the_proxy_length)
{
	struct kvd_imp_counters c;
	int big;

	big = vgem_pattern_buf(self->drm, 2 * SIZE, SEED_A);
	ASSERT_GE(big, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, big, 0));
	close(big);
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(1, c.mapped);
	EXPECT_EQ(SIZE, c.table_len);
	/* a backing of the proxy's size: its table, whole */
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(SIZE, c.table_len);
}

TEST_F(follow, importer_attached_before_backing)
{
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	EXPECT_EQ(-ENODEV, imp_read(self->imp, self->h, 0, self->buf, 64));
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_A));
}

TEST_F(follow, two_importers_both_follow)
{
	int imp2, h2;

	imp2 = imp_open();
	ASSERT_GE(imp2, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, 0);
	h2 = imp_import(imp2, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	ASSERT_GE(h2, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	ASSERT_EQ(0, imp_read(imp2, h2, 0, self->buf, SIZE));
	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, imp_read(imp2, h2, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	close(imp2);
}

TEST_F(follow, events_on_the_device_fd)
{
	struct kvdmabuf_event ev[8];
	struct pollfd pfd = { .fd = self->dev, .events = POLLIN };
	uint64_t id = 0;
	int proxy, n, fl;

	proxy = kvd_create(self->dev, SIZE, &id);
	ASSERT_GE(proxy, 0);
	EXPECT_NE(0, id);
	EXPECT_EQ(0, poll(&pfd, 1, 0));
	ASSERT_EQ(0, kvd_attach(self->dev, proxy, self->a, 0));
	ASSERT_EQ(0, kvd_revoke(self->dev, proxy, 1000));
	ASSERT_EQ(0, kvd_replace(self->dev, proxy, self->b, 0));
	ASSERT_EQ(1, poll(&pfd, 1, 1000));
	close(proxy);

	n = read(self->dev, ev, sizeof(ev));
	ASSERT_EQ(4 * (int)sizeof(ev[0]), n);
	EXPECT_EQ(sizeof(ev[0]), ev[0].size);
	EXPECT_EQ(KVDMABUF_EVENT_STATE, ev[0].type);
	EXPECT_EQ(id, ev[0].id);
	EXPECT_EQ(KVDMABUF_STATE_BACKED, ev[0].state);
	EXPECT_EQ(1, ev[0].generation);
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, ev[1].state);
	EXPECT_EQ(2, ev[1].generation);
	EXPECT_EQ(KVDMABUF_STATE_BACKED, ev[2].state);
	EXPECT_EQ(3, ev[2].generation);
	EXPECT_EQ(KVDMABUF_STATE_RELEASED, ev[3].state);
	EXPECT_EQ(id, ev[3].id);

	/* Empty queue: non-blocking read says so. */
	fl = fcntl(self->dev, F_GETFL);
	ASSERT_EQ(0, fcntl(self->dev, F_SETFL, fl | O_NONBLOCK));
	EXPECT_EQ(-1, read(self->dev, ev, sizeof(ev)));
	EXPECT_EQ(EAGAIN, errno);
	/* A buffer smaller than one record. */
	EXPECT_EQ(-1, read(self->dev, ev, sizeof(ev[0]) - 1));
	EXPECT_EQ(EINVAL, errno);
}

/* Polls the query until no stale backing is left; returns the last query. */
static int wait_no_stale(int dev, int proxy, struct kvdmabuf_query *q)
{
	int i, ret = 0;

	for (i = 0; i < 200; i++) {
		ret = kvd_query(dev, proxy, q);
		if (ret || !q->stale_backings)
			break;
		usleep(5000);
	}
	return ret;
}

TEST_F(follow, revoke_times_out_on_a_slow_importer)
{
	struct kvd_imp_counters c;
	struct kvdmabuf_query q;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));

	/* The importer is notified but keeps its mapping for now. */
	EXPECT_EQ(-ETIMEDOUT, kvd_revoke(self->dev, self->proxy, 50));
	ASSERT_EQ(0, imp_counters(self->imp, self->h, &c));
	EXPECT_EQ(1, c.invalidations);
	EXPECT_EQ(1, c.mapped);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(2, q.generation);
	EXPECT_EQ(1, q.stale_backings);
	EXPECT_EQ(1, q.live_mappings);
	EXPECT_EQ(1, q.backing_attachments);
	/* Revoking again waits again, and changes nothing else. */
	EXPECT_EQ(-ETIMEDOUT, kvd_revoke(self->dev, self->proxy, 0));

	/* Its next access drops the old mapping and fails to map. */
	EXPECT_EQ(-ENODEV, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	ASSERT_EQ(0, wait_no_stale(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.stale_backings);
	EXPECT_EQ(0, q.live_mappings);
	EXPECT_EQ(0, q.backing_attachments);
	EXPECT_EQ(2, q.generation);
	EXPECT_EQ(0, kvd_revoke(self->dev, self->proxy, 0));

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
}

/*
 * REVOKE's timeout bounds its whole wait, not each stale backing's: two
 * stale backings whose importers' fences signal 0.6 s and 2 s from now,
 * one after the other; a REVOKE of 1 s returns -ETIMEDOUT at about 1 s
 * (not 0 at 2 s, nor -ETIMEDOUT at 1.6 s), and once both signaled a REVOKE
 * returns 0.
 */
TEST_F(follow, revoke_timeout_bounds_all_stale_backings_together)
{
	double t0, ms;
	int ret;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	ASSERT_EQ(0, imp_fence(self->imp, self->h,
			       (uint32_t)kvd_scaled_ms(600)));
	/* a stale, its fences: the 0.6 s one */
	EXPECT_EQ(-ETIMEDOUT, kvd_attach_full(self->dev, self->proxy, self->b,
					      0, KVDMABUF_ATTACH_REPLACE, 0,
					      NULL));
	ASSERT_EQ(0, imp_fence(self->imp, self->h,
			       (uint32_t)kvd_scaled_ms(2000)));
	/* b stale too, its fences: both */
	EXPECT_EQ(-ETIMEDOUT, kvd_revoke(self->dev, self->proxy, 0));

	t0 = __th_now();
	ret = kvd_revoke(self->dev, self->proxy, (uint32_t)kvd_scaled_ms(1000));
	ms = (__th_now() - t0) * 1e3;
	TH_LOG("REVOKE of %d ms: %s after %.0f ms", kvd_scaled_ms(1000),
	       strerror(-ret), ms);
	EXPECT_EQ(-ETIMEDOUT, ret);
	/* one bound for both: waiting for a's fence (~0.6 s) and then a
	 * bound of its own for b's would take ~1.6 s */
	EXPECT_LT(ms, kvd_scaled_ms(1400));
	EXPECT_EQ(0, kvd_revoke(self->dev, self->proxy,
				(uint32_t)kvd_scaled_ms(5000)));
}

TEST_F(follow, replace_times_out_then_completes)
{
	struct kvdmabuf_query q;
	uint64_t gen = 0;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));

	/* The swap is made; the old backing waits for the importer. */
	EXPECT_EQ(-ETIMEDOUT, kvd_attach_full(self->dev, self->proxy, self->b,
					      0, KVDMABUF_ATTACH_REPLACE, 50,
					      &gen));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(2, q.generation);
	EXPECT_EQ(1, q.stale_backings);
	EXPECT_EQ(2, q.backing_attachments);

	/* The next access unmaps A, maps B; A is then dropped. */
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, wait_no_stale(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.stale_backings);
	EXPECT_EQ(1, q.backing_attachments);
	EXPECT_EQ(1, q.live_mappings);
}

/*
 * A plain attach (no old backing to drop) never reports a failure after it
 * succeeded, even while a stale backing of an earlier timed-out revoke is
 * still mapped: it does not wait for that one, with the REPLACE flag and a
 * timeout either (it would return -ETIMEDOUT after 1 s: nothing drops the
 * lazy mapping meanwhile).
 */
TEST_F(follow, plain_attach_ignores_a_stale_backing)
{
	struct kvdmabuf_query q;
	uint64_t gen = 0;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-ETIMEDOUT, kvd_revoke(self->dev, self->proxy, 20));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	ASSERT_EQ(1, q.stale_backings);
	ASSERT_EQ(1, q.live_mappings);

	EXPECT_EQ(0, kvd_attach_full(self->dev, self->proxy, self->b, 0,
				     KVDMABUF_ATTACH_REPLACE, 1000, &gen));
	EXPECT_EQ(3, gen);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(3, q.generation);
	EXPECT_EQ(1, q.stale_backings);
	/* A retry sees it backed. */
	EXPECT_EQ(-EEXIST, kvd_attach(self->dev, self->proxy, self->b, 0));

	/* The importer's next access drops A and reads B. */
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, SIZE));
	EXPECT_EQ(-1, pattern_check(self->buf, SIZE, SEED_B));
	ASSERT_EQ(0, wait_no_stale(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.stale_backings);
}

static void on_signal(int sig)
{
	(void)sig;
}

static void *poke_later(void *arg)
{
	usleep(200000);
	pthread_kill(*(pthread_t *)arg, SIGUSR1);
	return NULL;
}

TEST_F(follow, revoke_wait_is_interruptible)
{
	struct sigaction sa = { .sa_handler = on_signal };	/* no SA_RESTART */
	struct kvdmabuf_query q;
	pthread_t self_th = pthread_self(), th;

	ASSERT_EQ(0, sigaction(SIGUSR1, &sa, NULL));
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, KVD_PAGE));

	ASSERT_EQ(0, pthread_create(&th, NULL, poke_later, &self_th));
	EXPECT_EQ(-EINTR, kvd_revoke(self->dev, self->proxy, 20000));
	pthread_join(th, NULL);
	/* Revoked all the same; the old backing waits for the importer. */
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(1, q.stale_backings);
	EXPECT_EQ(-ENODEV, imp_read(self->imp, self->h, 0, self->buf, KVD_PAGE));
	EXPECT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.stale_backings);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct bg_revoke {
	int dev, proxy, ret;
	uint32_t timeout_ms;
	double took;
};

static void *revoke_in_background(void *arg)
{
	struct bg_revoke *r = arg;
	double t0 = now_s();

	r->ret = kvd_revoke(r->dev, r->proxy, r->timeout_ms);
	r->took = now_s() - t0;
	return NULL;
}

/* Reads the debugfs proxies file through; 0 or -errno. */
static int read_debugfs_proxies(void)
{
	char line[256];
	FILE *f;

	kvd_debugfs_mount();
	f = fopen(KVD_DEBUGFS "/proxies", "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		;
	fclose(f);
	return 0;
}

/*
 * While a revoke waits for a slow importer, importers can still attach to
 * and detach from the proxy, and debugfs can be read: the wait holds no
 * lock they need.
 */
TEST_F(follow, revoke_wait_blocks_no_importer_callback)
{
	struct bg_revoke r = { .dev = self->dev, .proxy = self->proxy,
			       .timeout_ms = 4000 };
	struct kvdmabuf_query q;
	pthread_t th;
	double t0, took;
	int h2;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, KVD_IMP_IMPORT_LAZY);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, KVD_PAGE));
	ASSERT_EQ(0, pthread_create(&th, NULL, revoke_in_background, &r));
	usleep(kvd_scaled_ms(300) * 1000);	/* the revoke is waiting now */

	t0 = now_s();
	h2 = imp_import(self->imp, self->proxy, 0);
	EXPECT_GE(h2, 0);
	if (h2 >= 0)
		EXPECT_EQ(0, imp_release(self->imp, h2));
	took = now_s() - t0;
	TH_LOG("import + release during the wait: %.3f s", took);
	EXPECT_LT(took, kvd_scaled_ms(1000) / 1e3);
	t0 = now_s();
	if (!read_debugfs_proxies())
		EXPECT_LT(now_s() - t0, kvd_scaled_ms(1000) / 1e3);
	/* QUERY too. */
	t0 = now_s();
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_LT(now_s() - t0, kvd_scaled_ms(1000) / 1e3);
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);

	/* The importer lets go: the revoke completes. */
	EXPECT_EQ(-ENODEV, imp_read(self->imp, self->h, 0, self->buf,
				    KVD_PAGE));
	pthread_join(th, NULL);
	EXPECT_EQ(0, r.ret);
	EXPECT_LT(r.took, kvd_scaled_ms(3000) / 1e3);
	ASSERT_EQ(0, wait_no_stale(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.stale_backings);
}

/*
 * Revoke waits for the fences importers put on the proxy's reservation
 * object (DRM importers track their DMA that way) before it drops the
 * backing; on a timeout the backing stays until they have signaled.
 */
TEST_F(follow, revoke_waits_for_fences)
{
	struct kvdmabuf_query q;
	double t0, took;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, 0);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, KVD_PAGE));

	ASSERT_EQ(0, imp_fence(self->imp, self->h, 500));
	t0 = now_s();
	EXPECT_EQ(0, kvd_revoke(self->dev, self->proxy, 5000));
	took = now_s() - t0;
	TH_LOG("revoke with a 500 ms fence took %.3f s", took);
	EXPECT_GE(took, 0.4);
	EXPECT_LT(took, kvd_scaled_ms(4000) / 1e3);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.stale_backings);

	/* Short timeout: revoked, but the backing is held for the fence. */
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, self->buf, KVD_PAGE));
	ASSERT_EQ(0, imp_fence(self->imp, self->h, 800));
	EXPECT_EQ(-ETIMEDOUT, kvd_revoke(self->dev, self->proxy, 50));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(0, q.live_mappings);
	EXPECT_EQ(1, q.stale_backings);
	EXPECT_EQ(-ETIMEDOUT, kvd_revoke(self->dev, self->proxy, 0));
	/* Once it signals, the next call drops the backing. */
	EXPECT_EQ(0, kvd_revoke(self->dev, self->proxy, 5000));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(0, q.stale_backings);
}

TEST_F(follow, event_queue_overflow_is_flagged)
{
	struct kvdmabuf_event ev[128];
	int i, n, dev2, proxy;

	/* A fresh device fd, so that its queue holds only these events. */
	dev2 = kvd_dev_open();
	ASSERT_GE(dev2, 0);
	proxy = kvd_create(dev2, SIZE, NULL);
	ASSERT_GE(proxy, 0);
	for (i = 0; i < 50; i++) {
		ASSERT_EQ(0, kvd_attach(dev2, proxy, self->a, 0));
		ASSERT_EQ(0, kvd_revoke(dev2, proxy, 100));
	}
	n = read(dev2, ev, sizeof(ev));
	ASSERT_GT(n, 0);
	n /= sizeof(ev[0]);
	TH_LOG("%d records after 100 transitions", n);
	EXPECT_LT(n, 100);
	EXPECT_TRUE(ev[0].flags & KVDMABUF_EVENT_FLAG_LOST);
	for (i = 1; i < n; i++)
		EXPECT_EQ(0, ev[i].flags);
	/* The newest one is the last revoke. */
	EXPECT_EQ(100, ev[n - 1].generation);
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, ev[n - 1].state);
	close(proxy);
	close(dev2);
}

/*
 * A reader that sleeps on an empty queue, in poll() and in a blocking
 * read(), is woken by the next transition: the module skips the wake-up
 * when nobody waits, which must not lose a waiter that is just going to
 * sleep. The transition comes from a child sharing the device fd, 200 ms
 * after the parent started waiting.
 */
TEST_F_TIMEOUT(follow, a_sleeping_reader_wakes_on_the_next_event, 60)
{
	struct pollfd pfd = { .events = POLLIN };
	struct kvdmabuf_event ev[4];
	int round, dev2, proxy, status;
	pid_t pid;

	dev2 = kvd_dev_open();
	ASSERT_GE(dev2, 0);
	proxy = kvd_create(dev2, SIZE, NULL);
	ASSERT_GE(proxy, 0);
	pfd.fd = dev2;
	for (round = 0; round < 4; round++) {
		/* attach, revoke, attach, revoke; poll, read, read, poll */
		int attach = round % 2 == 0, by_poll = attach == (round < 2);

		EXPECT_EQ(0, poll(&pfd, 1, 0));
		pid = fork();
		ASSERT_GE(pid, 0);
		if (!pid) {
			usleep(200 * 1000);
			_exit(attach ? kvd_attach(dev2, proxy, self->a, 0) != 0 :
				       kvd_revoke(dev2, proxy, 1000) != 0);
		}
		if (by_poll)
			EXPECT_EQ(1, poll(&pfd, 1, 20 * 1000));
		ASSERT_EQ((int)sizeof(ev[0]), read(dev2, ev, sizeof(ev)));
		EXPECT_EQ(attach ? KVDMABUF_STATE_BACKED :
			  KVDMABUF_STATE_REVOKED, ev[0].state);
		ASSERT_EQ(pid, waitpid(pid, &status, 0));
		EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	close(proxy);
	close(dev2);
}

/* Finds the debugfs line of proxy @id; returns 1 and fills @state. */
static int debugfs_proxy_state(uint64_t id, char *state, size_t len)
{
	char line[256], st[32];
	unsigned long long pid, plen, gen;
	int found = 0;
	FILE *f;

	kvd_debugfs_mount();
	f = fopen(KVD_DEBUGFS "/proxies", "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%llu %llu %31s %llu", &pid, &plen, st,
			   &gen) == 4 && pid == id) {
			snprintf(state, len, "%s/%llu", st, gen);
			found = 1;
		}
	fclose(f);
	return found;
}

TEST_F(follow, debugfs_shows_each_proxy)
{
	char state[64] = "";
	uint64_t id = 0;
	int proxy;

	proxy = kvd_create(self->dev, SIZE, &id);
	ASSERT_GE(proxy, 0);
	if (debugfs_proxy_state(id, state, sizeof(state)) < 0)
		SKIP(goto out, "no %s/proxies (debugfs not mounted, not root?)",
		     KVD_DEBUGFS);
	EXPECT_EQ(1, debugfs_proxy_state(id, state, sizeof(state)));
	EXPECT_EQ(0, strcmp(state, "unbacked/0"));
	ASSERT_EQ(0, kvd_attach(self->dev, proxy, self->a, 0));
	EXPECT_EQ(1, debugfs_proxy_state(id, state, sizeof(state)));
	EXPECT_EQ(0, strcmp(state, "backed/1"));
	ASSERT_EQ(0, kvd_revoke(self->dev, proxy, 100));
	EXPECT_EQ(1, debugfs_proxy_state(id, state, sizeof(state)));
	EXPECT_EQ(0, strcmp(state, "revoked/2"));
	close(proxy);
	EXPECT_EQ(0, debugfs_proxy_state(id, state, sizeof(state)));
	return;
out:
	close(proxy);
}

TEST(version)
{
	struct kvdmabuf_version v = { .size = sizeof(v) };
	int dev = kvd_dev_open();

	if (dev < 0)
		SKIP(return, "%s: %s", KVDMABUF_DEVICE_PATH, strerror(-dev));
	ASSERT_EQ(0, kvd_ioctl(dev, KVDMABUF_IOCTL_VERSION, &v));
	EXPECT_EQ(KVDMABUF_API_VERSION, v.version);
	EXPECT_TRUE(v.features & KVDMABUF_FEATURE_REPLACE);
	EXPECT_TRUE(v.features & KVDMABUF_FEATURE_EVENTS);
	TH_LOG("api %u.%u features 0x%llx", v.version >> 16,
	       v.version & 0xffff, (unsigned long long)v.features);
	close(dev);
}

TEST_HARNESS_MAIN
