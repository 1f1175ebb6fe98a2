// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_signal: a signal during a REVOKE that waits.
 *
 * A REVOKE waits for the importers of the proxy's old backing: for their
 * fences (here the test importer's KVD_IMP_IOCTL_FENCE, a fence that
 * signals later) and until no lazy import maps the stale backing any more
 * (KVD_IMP_IMPORT_LAZY keeps its mapping until its next access). A signal
 * whose handler does nothing, installed without SA_RESTART, interrupts the
 * wait:
 *
 * - the module's ioctl returns -EINTR at once, with the revoke itself done
 *   and nothing half-done: the proxy is revoked (one generation, one
 *   notification, the user's reason), the stale backing is counted and
 *   still mapped, the argument says the generation of that revoke, and
 *   REVOKE again waits for what is left and returns 0 once the
 *   importer lets go, without a second revoke;
 * - the library's wrapper (lib/proxy.c kvd_proxy_dev_revoke()) asks again
 *   after each -EINTR for what is left of its timeout: it returns 0 once
 *   the importer lets go, and -ETIMEDOUT within its bound when it never
 *   does, however many signals come.
 *
 * Signals come from a thread of the test (pthread_kill to the thread in
 * the ioctl), which also makes the importer let go at a set time.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include "harness.h"
#include "proxy_common.h"
#include "vgem.h"
#include "../lib/internal.h"

#define SIZE		(4 * KVD_PAGE)
#define SEED_A		0x51
#define SEED_B		0x52

static atomic_uint sig_seen;

static void on_signal(int sig)
{
	(void)sig;
	atomic_fetch_add(&sig_seen, 1);
}

/* SIGUSR1 with a handler that does nothing, without SA_RESTART. */
static int signal_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0;
	atomic_store(&sig_seen, 0);
	return sigaction(SIGUSR1, &sa, NULL) ? -errno : 0;
}

/*
 * The thread that interrupts: SIGUSR1 to @target @first_ms from its start,
 * then every @every_ms (0: once) until @stop_ms; at @drop_ms (< 0: never)
 * it accesses lazy import @h, which drops its stale mapping.
 */
struct signaler {
	pthread_t target, tid;
	int first_ms, every_ms, stop_ms, drop_ms;
	int imp, h;
	int drop_ret;
	atomic_int stop;
};

static void *signaler_fn(void *p)
{
	struct signaler *s = p;
	double t0 = __th_now(), next = s->first_ms / 1e3;
	bool dropped = s->drop_ms < 0;
	char buf[64];

	while (!atomic_load(&s->stop)) {
		double now = __th_now() - t0;

		if (!dropped && now >= s->drop_ms / 1e3) {
			s->drop_ret = imp_read(s->imp, s->h, 0, buf, sizeof(buf));
			dropped = true;
		}
		if (next >= 0 && now >= next) {
			pthread_kill(s->target, SIGUSR1);
			next = s->every_ms ? next + s->every_ms / 1e3 : -1;
		}
		if (now >= s->stop_ms / 1e3 && dropped)
			break;
		usleep(2000);
	}
	return NULL;
}

static int signaler_start(struct signaler *s)
{
	s->target = pthread_self();
	atomic_store(&s->stop, 0);
	return -pthread_create(&s->tid, NULL, signaler_fn, s);
}

static void signaler_stop(struct signaler *s)
{
	atomic_store(&s->stop, 1);
	pthread_join(s->tid, NULL);
}

static double ms_since(double t0)
{
	return (__th_now() - t0) * 1e3;
}

FIXTURE(sig) {
	int dev, imp, drm;
	int proxy, a, b;
	int h;			/* the import that keeps the revoke waiting */
	struct kvdmabuf_query q0;
};

FIXTURE_VARIANT(sig) {
	uint32_t import_flags;
	uint32_t fence_ms;	/* an importer fence that signals this late */
};

/* A lazy import that mapped the backing and keeps it mapped. */
FIXTURE_VARIANT_ADD(sig, lazy_map) {
	.import_flags = KVD_IMP_IMPORT_LAZY,
};

/* A dynamic import (it unmaps at once) with a fence not yet signaled. */
FIXTURE_VARIANT_ADD(sig, fence) {
	.import_flags = 0, .fence_ms = 1500,
};

FIXTURE_SETUP(sig)
{
	char buf[64];

	self->imp = -1;
	self->h = -1;
	KVD_PROXY_SETUP(self, SIZE, SEED_A, SEED_B);
	KVD_OPEN_IMP(self->imp);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	self->h = imp_import(self->imp, self->proxy, variant->import_flags);
	ASSERT_GE(self->h, 0);
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, buf, sizeof(buf)));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &self->q0));
	ASSERT_EQ(KVDMABUF_STATE_BACKED, self->q0.state);
	ASSERT_EQ(0, signal_install());
}

FIXTURE_TEARDOWN(sig)
{
	if (self->h >= 0)
		imp_release(self->imp, self->h);
	kvd_close(&self->imp);
	KVD_PROXY_TEARDOWN(self);
}

/* What keeps a revoke waiting: for the fence variant, a fence that
 * signals @ms from now (scaled); the lazy mapping is there already. */
static int hold_revoke(FIXTURE_DATA(sig) *self,
		       const FIXTURE_VARIANT(sig) *variant)
{
	if (!variant->fence_ms)
		return 0;
	return imp_fence(self->imp, self->h,
			 (uint32_t)kvd_scaled_ms((int)variant->fence_ms));
}

/*
 * The module: -EINTR at the signal, the proxy revoked once and nothing
 * else (generation, notification, reason, one stale backing; the argument
 * has that generation, so the caller knows the revoke was made); REVOKE again then waits for what is left, without revoking
 * again, and returns 0 once the importer let go; the proxy takes a new
 * backing afterwards.
 */
TEST_F(sig, revoke_interrupted_is_done_and_waits_again)
{
	struct signaler s = { .first_ms = 200, .every_ms = 0, .drop_ms = -1,
			      .imp = self->imp, .h = self->h };
	struct kvdmabuf_revoke r = {
		.size = sizeof(r), .proxy_fd = (uint32_t)self->proxy,
		.timeout_ms = (uint32_t)kvd_scaled_ms(5000),
	};
	struct kvdmabuf_query q;
	uint8_t got[64];
	double t0, ms;
	int ret;

	ASSERT_EQ(0, hold_revoke(self, variant));
	s.stop_ms = 300;
	ASSERT_EQ(0, signaler_start(&s));
	t0 = __th_now();
	ret = kvd_ioctl(self->dev, KVDMABUF_IOCTL_REVOKE, &r);
	ms = ms_since(t0);
	signaler_stop(&s);
	TH_LOG("revoke: %s after %.0f ms, %u signal(s)", strerror(-ret), ms,
	       atomic_load(&sig_seen));
	EXPECT_EQ(-EINTR, ret);
	EXPECT_GE(atomic_load(&sig_seen), 1u);
	/* At the signal, not at the timeout. */
	EXPECT_GE(ms, 150);
	EXPECT_LT(ms, kvd_scaled_ms(2000));
	/* -EINTR comes after the revoke: its generation is copied out. */
	EXPECT_EQ(self->q0.generation + 1, r.generation);

	/* Revoked once: the state, reason, generation and notification of
	 * one revoke; the old backing stale, not dropped. */
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(KVDMABUF_REVOKE_USER, q.revoke_reason);
	EXPECT_EQ(self->q0.generation + 1, q.generation);
	EXPECT_EQ(self->q0.notifications + 1, q.notifications);
	EXPECT_EQ(1u, q.stale_backings);

	/* Still waited for: nothing changes on a revoke that does not wait. */
	r.timeout_ms = 0;
	r.generation = 0;
	EXPECT_EQ(-ETIMEDOUT, kvd_ioctl(self->dev, KVDMABUF_IOCTL_REVOKE, &r));
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(self->q0.generation + 1, q.generation);
	EXPECT_EQ(self->q0.notifications + 1, q.notifications);
	EXPECT_EQ(1u, q.stale_backings);

	/* The importer lets go (its next access, or the fence): the wait
	 * again returns 0, with the generation of the one revoke. */
	if (!variant->fence_ms)
		EXPECT_EQ(-ENODEV, imp_read(self->imp, self->h, 0, got, 8));
	r.timeout_ms = (uint32_t)kvd_scaled_ms(5000);
	t0 = __th_now();
	EXPECT_EQ(0, kvd_ioctl(self->dev, KVDMABUF_IOCTL_REVOKE, &r));
	TH_LOG("revoke again: 0 after %.0f ms", ms_since(t0));
	EXPECT_EQ(self->q0.generation + 1, r.generation);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(self->q0.generation + 1, q.generation);
	EXPECT_EQ(self->q0.notifications + 1, q.notifications);
	EXPECT_EQ(0u, q.stale_backings);

	/* And the proxy takes a new backing, read through the import. */
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->b, 0));
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, got, sizeof(got)));
	EXPECT_EQ(-1, pattern_check(got, sizeof(got), SEED_B));
}

/*
 * A REPLACE interrupted while it waits for the old backing: -EINTR after
 * the swap, which is done (the new backing read through the import), and
 * the argument has the new generation, so that the caller can tell it
 * from an -EINTR before the swap (nothing changed, nothing copied out).
 */
TEST_F(sig, replace_interrupted_is_done_and_says_its_generation)
{
	struct signaler s = { .first_ms = 200, .every_ms = 0, .drop_ms = -1,
			      .imp = self->imp, .h = self->h };
	struct kvdmabuf_attach a = {
		.size = sizeof(a), .flags = KVDMABUF_ATTACH_REPLACE,
		.proxy_fd = (uint32_t)self->proxy,
		.backing_fd = (uint32_t)self->b,
		.timeout_ms = (uint32_t)kvd_scaled_ms(5000),
	};
	struct kvdmabuf_query q;
	uint8_t got[64];
	int ret;

	ASSERT_EQ(0, hold_revoke(self, variant));
	s.stop_ms = 300;
	ASSERT_EQ(0, signaler_start(&s));
	ret = kvd_ioctl(self->dev, KVDMABUF_IOCTL_ATTACH, &a);
	signaler_stop(&s);
	EXPECT_EQ(-EINTR, ret);
	EXPECT_EQ(self->q0.generation + 1, a.generation);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(a.generation, q.generation);
	EXPECT_EQ(1u, q.stale_backings);
	/* The lazy import's next access drops its stale map first. */
	ASSERT_EQ(0, imp_read(self->imp, self->h, 0, got, sizeof(got)));
	EXPECT_EQ(-1, pattern_check(got, sizeof(got), SEED_B));
}

/* The library's context around the module's device file. */
static void lib_ctx(struct kvdmabuf_ctx *c, int dev)
{
	memset(c, 0, sizeof(*c));
	c->module_fd = dev;
}

/*
 * The library: signals every 50 ms throughout; the importer lets go at
 * 600 ms (the lazy import's access; the fence variant's fence signals at
 * 1500 ms). kvd_proxy_dev_revoke() asks again after each -EINTR and
 * returns 0 then, well within its bound.
 */
TEST_F(sig, library_revoke_completes_through_signals)
{
	int drop = variant->fence_ms ? -1 : 600;
	int done_ms = variant->fence_ms ? kvd_scaled_ms((int)variant->fence_ms)
					: drop;
	int bound = kvd_scaled_ms(5000);
	struct signaler s = { .first_ms = 50, .every_ms = 50,
			      .stop_ms = done_ms + 200, .drop_ms = drop,
			      .imp = self->imp, .h = self->h };
	struct kvdmabuf_query q;
	struct kvdmabuf_ctx c;
	double t0, ms;
	unsigned int sigs;
	int ret;

	ASSERT_EQ(0, hold_revoke(self, variant));
	lib_ctx(&c, self->dev);
	ASSERT_EQ(0, signaler_start(&s));
	t0 = __th_now();
	ret = kvd_proxy_dev_revoke(&c, self->proxy, (unsigned int)bound);
	ms = ms_since(t0);
	sigs = atomic_load(&sig_seen);
	signaler_stop(&s);
	TH_LOG("library revoke: %d after %.0f ms, %u signal(s) meanwhile: %s",
	       ret, ms, sigs, ret ? kvd_msg(&c) : "ok");
	EXPECT_EQ(0, ret);
	/* Interrupted several times, done when the importer let go. */
	EXPECT_GE(sigs, 3u);
	EXPECT_GE(ms, done_ms - 100);
	EXPECT_LT(ms, bound);
	if (drop >= 0)
		EXPECT_EQ(-ENODEV, s.drop_ret);
	ASSERT_EQ(0, kvd_query(self->dev, self->proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
	EXPECT_EQ(self->q0.generation + 1, q.generation);
	EXPECT_EQ(0u, q.stale_backings);
	kvd_msg(NULL);
}

/*
 * The library: signals every 50 ms for longer than the timeout, and the
 * importer never lets go in time: -ETIMEDOUT within the bound (the time
 * asked, plus a little), not -EINTR, and not the full time again after
 * every signal.
 */
TEST_F(sig, library_revoke_interrupted_keeps_its_bound)
{
	int bound = kvd_scaled_ms(600);
	struct signaler s = { .first_ms = 50, .every_ms = 50,
			      .stop_ms = bound * 4, .drop_ms = -1,
			      .imp = self->imp, .h = self->h };
	struct kvdmabuf_ctx c;
	double t0, ms;
	int ret;

	if (variant->fence_ms)
		ASSERT_EQ(0, imp_fence(self->imp, self->h,
				       (uint32_t)bound * 4));
	lib_ctx(&c, self->dev);
	ASSERT_EQ(0, signaler_start(&s));
	t0 = __th_now();
	ret = kvd_proxy_dev_revoke(&c, self->proxy, (unsigned int)bound);
	ms = ms_since(t0);
	TH_LOG("library revoke: %d after %.0f ms (bound %d ms), %u signal(s): %s",
	       ret, ms, bound, atomic_load(&sig_seen), kvd_msg(&c));
	signaler_stop(&s);
	EXPECT_EQ(-ETIMEDOUT, ret);
	EXPECT_GE(atomic_load(&sig_seen), 3u);
	/* 9/10: the kernel's wait is in jiffies, which may run ahead of
	 * CLOCK_MONOTONIC in a TCG guest; a wait that a signal ends early
	 * returns after 50 ms */
	EXPECT_GE(ms, bound * 9 / 10);
	EXPECT_LT(ms, bound + kvd_scaled_ms(300));
	kvd_msg(NULL);
}

TEST_HARNESS_MAIN
