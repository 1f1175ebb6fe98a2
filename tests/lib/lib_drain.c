// SPDX-License-Identifier: MIT
/*
 * lib_drain - in-flight accounting and the drain of sleep: sleep stops new
 * I/O at once, waits for a transfer that a real thread finishes when an
 * event is set (deregistering only afterwards), honours the engine drain
 * callback, and on timeout returns -ETIMEDOUT with everything registered
 * and awake and a message saying how many transfers were in flight and for
 * how long; concurrent io_begin/io_end never succeed while asleep; remove
 * right after a sleep never frees a region that the last io_end (which
 * woke the drain) still touches.
 * Host-only: fake NICs (tests/lib_fake.h) stand for the RDMA devices.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>

#include "../uapi/kvdmabuf.h"

#include "harness.h"
#include "lib_fake.h"

#define LEN (16 * 4096)

FIXTURE(dr) {
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	void *mem;
};

static int drain_calls, drain_busy_until, drain_rc;

static int engine_drain(void *arg)
{
	(void)arg;
	drain_calls++;
	if (drain_rc < 0)
		return drain_rc;
	return drain_calls > drain_busy_until;
}

FIXTURE_SETUP(dr)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region_desc d = { 0 };
	char err[512];

	fake_reset(2);
	drain_calls = 0;
	drain_busy_until = 0;
	drain_rc = 0;
	o.drain = engine_drain;
	ASSERT_EQ(0, fake_open("protocol: rdma\ndrain_timeout_s: 0.3\n", &o,
			       &self->ctx, err, sizeof(err)));
	self->mem = region_mem(LEN);
	d.addr = self->mem;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
	ASSERT_EQ(0, kvdmabuf_region_add(self->ctx, &d, &self->r));
}

FIXTURE_TEARDOWN(dr)
{
	kvdmabuf_close(self->ctx);
	munmap(self->mem, LEN);
}

struct worker {
	struct kvdmabuf_region *r;
	void *mem;
	int begun_efd, event_efd;
	int rc_begin;
	int mrs_at_end;       /* MRs still there when the transfer ended */
};

static void *transfer(void *arg)
{
	struct worker *w = arg;
	uint64_t one = 1, v;

	w->rc_begin = kvdmabuf_io_begin(w->r);
	if (write(w->begun_efd, &one, sizeof(one)) != sizeof(one))
		return NULL;
	if (w->rc_begin)
		return NULL;
	/* the "NIC" works on the region until the event is set */
	if (read(w->event_efd, &v, sizeof(v)) != sizeof(v))
		return NULL;
	w->mrs_at_end = fake_mrs_at(0, w->mem, LEN) +
			fake_mrs_at(1, w->mem, LEN);
	kvdmabuf_io_end(w->r);
	return NULL;
}

struct setter {
	struct kvdmabuf_region *r;
	int event_efd;
	int rc_begin_during_drain;
};

static void *set_event_later(void *arg)
{
	struct setter *s = arg;
	uint64_t one = 1;

	usleep(150 * 1000);
	/* sleep has begun: new I/O is refused before the drain ends */
	s->rc_begin_during_drain = kvdmabuf_io_begin(s->r);
	if (!s->rc_begin_during_drain)
		kvdmabuf_io_end(s->r);
	if (write(s->event_efd, &one, sizeof(one)) != sizeof(one))
		s->rc_begin_during_drain = -999;
	return NULL;
}

TEST_F(dr, drain_waits_for_inflight_transfer)
{
	struct worker w = { .r = self->r, .mem = self->mem };
	struct setter s = { .r = self->r };
	pthread_t tw, ts;
	uint64_t v;
	int64_t t0, t1;
	int rc;

	w.begun_efd = eventfd(0, EFD_CLOEXEC);
	w.event_efd = eventfd(0, EFD_CLOEXEC);
	s.event_efd = w.event_efd;
	ASSERT_EQ(0, pthread_create(&tw, NULL, transfer, &w));
	ASSERT_EQ((ssize_t)sizeof(v), read(w.begun_efd, &v, sizeof(v)));
	ASSERT_EQ(0, w.rc_begin);
	t0 = kvd_now_ns();      /* before the setter starts its 150 ms */
	ASSERT_EQ(0, pthread_create(&ts, NULL, set_event_later, &s));
	rc = kvdmabuf_sleep(self->ctx, NULL);
	t1 = kvd_now_ns();
	pthread_join(ts, NULL);
	pthread_join(tw, NULL);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	ASSERT_EQ(0, rc);
	EXPECT_GE(t1 - t0, 140 * 1000000LL);     /* it waited for the event */
	EXPECT_EQ(-ESHUTDOWN, s.rc_begin_during_drain);
	EXPECT_EQ(2, w.mrs_at_end);          /* still registered meanwhile */
	EXPECT_EQ(0, fake_mrs_at(0, self->mem, LEN));
	EXPECT_GE(drain_calls, 1);
	close(w.begun_efd);
	close(w.event_efd);
}

TEST_F(dr, drain_timeout_keeps_everything_registered)
{
	struct kvdmabuf_region_info in;
	uint32_t l0, l1;
	int rc;

	ASSERT_EQ(0, kvdmabuf_region_keys(self->r, 0, &l0, NULL, NULL));
	/* a transfer path that forgets its io_end */
	ASSERT_EQ(0, kvdmabuf_io_begin(self->r));
	usleep(100 * 1000);
	rc = kvdmabuf_sleep(self->ctx, NULL);
	TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	ASSERT_EQ(-ETIMEDOUT, rc);
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx),
			       "1 transfer(s) still in flight"));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx),
			       "kvdmabuf_io_end"));
	/* above zero for longer than the drain itself (since io_begin) */
	{
		const char *p = strstr(kvdmabuf_last_error(self->ctx),
				       "without a break for ");
		double secs = 0;

		ASSERT_NE(NULL, p);
		ASSERT_EQ(1, sscanf(p, "without a break for %lf", &secs));
		EXPECT_GE(secs, 0.39);
	}
	ASSERT_EQ(0, kvdmabuf_region_info(self->r, &in));
	EXPECT_EQ(0, in.asleep);
	EXPECT_EQ(1u, in.inflight);
	EXPECT_EQ(1, fake_mrs_at(0, self->mem, LEN));
	EXPECT_EQ(1, fake_mrs_at(1, self->mem, LEN));
	ASSERT_EQ(0, kvdmabuf_region_keys(self->r, 0, &l1, NULL, NULL));
	EXPECT_EQ(l0, l1);
	/* I/O is allowed again */
	ASSERT_EQ(0, kvdmabuf_io_begin(self->r));
	kvdmabuf_io_end(self->r);
	kvdmabuf_io_end(self->r);
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
}

TEST_F(dr, engine_callback_is_waited_for)
{
	/* not a timing test: a loaded machine may take long between polls */
	self->ctx->drain_timeout_ms = 30000;
	drain_busy_until = 5;
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	EXPECT_EQ(6, drain_calls);
}

TEST_F(dr, engine_callback_busy_times_out)
{
	drain_busy_until = 1 << 30;
	ASSERT_EQ(-ETIMEDOUT, kvdmabuf_sleep(self->ctx, NULL));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx),
			       "drain callback"));
	EXPECT_EQ(1, fake_mrs_at(0, self->mem, LEN));
	ASSERT_EQ(0, kvdmabuf_io_begin(self->r));
	kvdmabuf_io_end(self->r);
}

TEST_F(dr, engine_callback_error_aborts)
{
	drain_rc = -EINTR;
	ASSERT_EQ(-EINTR, kvdmabuf_sleep(self->ctx, NULL));
	EXPECT_EQ(1, fake_mrs_at(0, self->mem, LEN));
	ASSERT_EQ(0, kvdmabuf_io_begin(self->r));
	kvdmabuf_io_end(self->r);
}

TEST_F(dr, unbalanced_io_end_is_counted_not_wrapped)
{
	struct kvdmabuf_state st;

	kvdmabuf_io_end(self->r);
	ASSERT_EQ(0, kvdmabuf_query(self->ctx, &st));
	EXPECT_EQ(1u, st.unbalanced_io_end);
	EXPECT_EQ(0u, st.inflight);
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
}

struct hammer {
	struct kvdmabuf_region *r;
	atomic_int *asleep, *stop;
	unsigned long ok, refused, violations;
};

static void *hammer(void *arg)
{
	struct hammer *h = arg;

	while (!atomic_load(h->stop)) {
		if (kvdmabuf_io_begin(h->r) == 0) {
			int i;

			/* the "transfer" lasts a while: a sleep that
			 * returned meanwhile released memory under it */
			for (i = 0; i < 200; i++)
				if (atomic_load(h->asleep)) {
					h->violations++;
					break;
				}
			h->ok++;
			kvdmabuf_io_end(h->r);
		} else {
			h->refused++;
		}
	}
	return NULL;
}

#define CYCLES 60000

TEST_F_TIMEOUT(dr, concurrent_io_never_touches_asleep_region, 120)
{
	atomic_int asleep = 0, stop = 0;
	struct hammer h[3];
	pthread_t t[3];
	struct kvdmabuf_state st;
	int i, cycle;

	/* a hammer thread preempted inside its "transfer" on a loaded
	 * machine must not turn a correct drain into a time-out */
	self->ctx->drain_timeout_ms = 30000;
	for (i = 0; i < 3; i++) {
		h[i] = (struct hammer){ .r = self->r, .asleep = &asleep,
					.stop = &stop };
		ASSERT_EQ(0, pthread_create(&t[i], NULL, hammer, &h[i]));
	}
	for (cycle = 0; cycle < CYCLES; cycle++) {
		ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
		atomic_store(&asleep, 1);
		if (cycle % 16 == 0)
			usleep(100);
		atomic_store(&asleep, 0);
		ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
		if (cycle % 16 == 0)
			usleep(100);
	}
	atomic_store(&stop, 1);
	for (i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		EXPECT_EQ(0ul, h[i].violations);
		TH_LOG("thread %d: %lu transfers, %lu refused", i, h[i].ok,
		       h[i].refused);
	}
	ASSERT_EQ(0, kvdmabuf_query(self->ctx, &st));
	EXPECT_EQ(0u, st.inflight);
	EXPECT_EQ(0u, st.unbalanced_io_end);
	EXPECT_EQ((uint64_t)CYCLES, st.sleeps);
}

/*
 * A transfer path that reads its keys between io_begin and io_end (as
 * engines do) must not block the drain: sleep drains without holding the
 * context lock. Found by the demo: the getter waited for the drain, the
 * drain for the transfer, until the drain bound.
 */
struct getter {
	struct kvdmabuf_region *r;
	atomic_int go;
	int rc_keys;
};

static struct getter *drain_getter;

static int drain_signals_getter(void *arg)
{
	(void)arg;
	atomic_store(&drain_getter->go, 1);
	return 1;
}

static void *getter_transfer(void *arg)
{
	struct getter *g = arg;
	uint32_t lkey, rkey;
	uint64_t gen;

	if (kvdmabuf_io_begin(g->r))
		return NULL;
	while (!atomic_load(&g->go))
		usleep(1000);
	g->rc_keys = kvdmabuf_region_keys(g->r, 0, &lkey, &rkey, &gen);
	kvdmabuf_io_end(g->r);
	return NULL;
}

/* A context of a fake world of one NIC and one host region that sleeps
 * (LEN bytes at *@mem): 0, or the failing call's error. */
static int host_region_ctx(const char *yaml, struct kvdmabuf_options *o,
			   struct kvdmabuf_ctx **ctx, struct kvdmabuf_region **r,
			   void **mem)
{
	struct kvdmabuf_region_desc d = { 0 };
	char err[512];
	int rc;

	fake_reset(1);
	rc = fake_open(yaml, o, ctx, err, sizeof(err));
	if (rc)
		return rc;
	*mem = region_mem(LEN);
	d.addr = *mem;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
	return kvdmabuf_region_add(*ctx, &d, r);
}

/* With no engine callback the drain has nothing to poll: it sleeps until
 * the last io_end wakes it (a lost wake-up would make it wait out the
 * whole 10 s bound, far beyond the 5 s allowed here on a loaded host). */
static void *end_after_100ms(void *arg)
{
	usleep(100 * 1000);
	kvdmabuf_io_end(arg);
	return NULL;
}

TEST_TIMEOUT(drain_without_callback_ends_at_the_last_io_end, 60)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	pthread_t th;
	int64_t t0, ms;
	void *mem;
	int rc;

	ASSERT_EQ(0, host_region_ctx("protocol: rdma\ndrain_timeout_s: 10\n",
				     &o, &ctx, &r, &mem));
	ASSERT_EQ(0, kvdmabuf_io_begin(r));
	ASSERT_EQ(0, pthread_create(&th, NULL, end_after_100ms, r));
	t0 = kvd_now_ns();
	rc = kvdmabuf_sleep(ctx, NULL);
	ms = (kvd_now_ns() - t0) / 1000000;
	pthread_join(th, NULL);
	TH_LOG("sleep %d after %lld ms", rc, (long long)ms);
	EXPECT_EQ(0, rc);
	EXPECT_GE(ms, 90);
	EXPECT_LT(ms, 5000);
	kvdmabuf_close(ctx);
	munmap(mem, LEN);
}

TEST(keys_read_inside_a_transfer_do_not_block_the_drain)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	struct getter g = { 0 };
	pthread_t th;
	void *mem;

	o.drain = drain_signals_getter;
	ASSERT_EQ(0, host_region_ctx("protocol: rdma\ndrain_timeout_s: 5\n",
				     &o, &ctx, &r, &mem));
	g.r = r;
	drain_getter = &g;
	ASSERT_EQ(0, pthread_create(&th, NULL, getter_transfer, &g));
	while (!kvd_io_count(&r->io))
		usleep(1000);
	/* With the lock held through the drain this was -ETIMEDOUT. */
	EXPECT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	pthread_join(th, NULL);
	EXPECT_EQ(0, g.rc_keys);
	/* Changes during a drain are refused, not raced: none here now. */
	EXPECT_EQ(0, kvdmabuf_wake(ctx, NULL));
	kvdmabuf_close(ctx);
	munmap(mem, LEN);
}

/* At wake, the key-change callback runs while I/O is still stopped, so no
 * transfer can begin with the keys of the released memory. */
static int io_begin_in_callback = 1;

static void keys_changed(struct kvdmabuf_region *const *rs, unsigned int n,
			 void *arg)
{
	(void)arg;
	if (n != 1)
		return;
	io_begin_in_callback = kvdmabuf_io_begin(rs[0]);
	if (!io_begin_in_callback)
		kvdmabuf_io_end(rs[0]);
}

TEST(new_keys_reach_the_engine_before_io_resumes)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	char err[512];
	void *mem;

	fake_reset(1);
	o.key_change = keys_changed;
	ASSERT_EQ(0, fake_open("protocol: rdma\n", &o, &ctx, err, sizeof(err)));
	mem = region_mem(LEN);
	d.addr = mem;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
	ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &r));
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	io_begin_in_callback = 1;
	ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
	EXPECT_EQ(-ESHUTDOWN, io_begin_in_callback);
	EXPECT_EQ(0, kvdmabuf_io_begin(r));
	kvdmabuf_io_end(r);
	kvdmabuf_close(ctx);
	munmap(mem, LEN);
}

static void *remove_thread(void *arg)
{
	static int rc;

	rc = kvdmabuf_region_remove(arg);
	return &rc;
}

/*
 * White-box: an io_end that released the drain may still be waking it
 * (io.wakers); remove waits for it before freeing.
 */
TEST(remove_waits_for_an_io_end_still_touching_the_region)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	struct timespec ts = { 0, 100 * 1000000 };
	pthread_t t;
	char err[512];
	void *mem = region_mem(LEN), *ret;

	fake_reset(1);
	ASSERT_EQ(0, fake_open("protocol: rdma\n", &o, &ctx, err, sizeof(err)));
	d.addr = mem;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
	ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &r));
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	atomic_store(&r->io.wakers, 1);
	ASSERT_EQ(0, pthread_create(&t, NULL, remove_thread, r));
	nanosleep(&ts, NULL);
	EXPECT_EQ(EBUSY, pthread_tryjoin_np(t, &ret));
	atomic_store(&r->io.wakers, 0);
	ASSERT_EQ(0, pthread_join(t, &ret));
	EXPECT_EQ(0, *(int *)ret);
	EXPECT_EQ(0, kvdmabuf_close(ctx));
	munmap(mem, LEN);
}

static void *end_soon(void *arg)
{
	struct timespec ts = { 0, 20000 };

	nanosleep(&ts, NULL);
	kvdmabuf_io_end(arg);
	return NULL;
}

/*
 * Behaviour: sleep, then remove at once, while the region's last transfer
 * ends in another thread. Run under AddressSanitizer (tests/asan/) this
 * catches an io_end that touches the region after it was freed.
 */
TEST_F_TIMEOUT(dr, remove_right_after_sleep_races_the_last_io_end, 120)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r;
	pthread_t t;
	int i;

	d.addr = (char *)self->mem;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
	ASSERT_EQ(0, kvdmabuf_region_remove(self->r));
	self->r = NULL;
	for (i = 0; i < 2000; i++) {
		ASSERT_EQ(0, kvdmabuf_region_add(self->ctx, &d, &r));
		ASSERT_EQ(0, kvdmabuf_io_begin(r));
		ASSERT_EQ(0, pthread_create(&t, NULL, end_soon, r));
		ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
		ASSERT_EQ(0, kvdmabuf_region_remove(r));
		ASSERT_EQ(0, pthread_join(t, NULL));
	}
}

/*
 * The module as this program plays it: ioctl() of this program (it comes
 * before the C library's for the library linked in) answers REVOKE on
 * eintr.fd after 20 ms, or the timeout asked if shorter, with EINTR (a
 * REVOKE wait a signal interrupts every time), and VERSION on version.fd
 * with version.answer (a module of another API); everything else goes
 * to the kernel.
 */
static struct {
	int fd;
	unsigned int calls;
	unsigned int first_ms, last_ms;
} eintr = { .fd = -1 };

static struct {
	int fd;
	uint32_t answer;
} version = { .fd = -1 };

int ioctl(int fd, unsigned long req, ...);
int ioctl(int fd, unsigned long req, ...)
{
	struct kvdmabuf_revoke *r;
	struct timespec ts;
	va_list ap;
	void *arg;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (fd == version.fd && version.fd >= 0 &&
	    req == KVDMABUF_IOCTL_VERSION) {
		struct kvdmabuf_version *v = arg;

		v->version = version.answer;
		v->features = 0;
		return 0;
	}
	if (fd != eintr.fd || eintr.fd < 0 || req != KVDMABUF_IOCTL_REVOKE)
		return (int)syscall(SYS_ioctl, fd, req, arg);
	r = arg;
	if (!eintr.calls++)
		eintr.first_ms = r->timeout_ms;
	eintr.last_ms = r->timeout_ms;
	ts.tv_sec = 0;
	ts.tv_nsec = (r->timeout_ms < 20 ? r->timeout_ms : 20) * 1000000L;
	nanosleep(&ts, NULL);
	errno = EINTR;
	return -1;
}

/* A revoke interrupted again and again ends within its bound, in all
 * (the context lock is held meanwhile), as a timeout. */
TEST_TIMEOUT(revoke_interrupted_without_end_keeps_its_bound, 10)
{
	struct kvdmabuf_ctx c;
	int64_t t0, ms;
	int rc;

	memset(&c, 0, sizeof(c));
	c.module_fd = memfd_create("kvd-eintr-dev", MFD_CLOEXEC);
	ASSERT_GE(c.module_fd, 0);
	eintr.fd = c.module_fd;
	t0 = kvd_now_ns();
	rc = kvd_proxy_dev_revoke(&c, 5, 300);
	ms = (kvd_now_ns() - t0) / 1000000;
	TH_LOG("%d after %lld ms, %u calls (asked %u ms, last %u ms): %s", rc,
	       (long long)ms, eintr.calls, eintr.first_ms, eintr.last_ms,
	       kvd_msg(&c));
	EXPECT_EQ(-ETIMEDOUT, rc);
	EXPECT_GE(ms, 290);
	EXPECT_LT(ms, 1000);
	EXPECT_GT(eintr.calls, 1u);
	EXPECT_EQ(300u, eintr.first_ms);
	/* what was left, not the whole bound again (20 ms a call, plus
	 * however late a loaded host wakes the sleeper) */
	EXPECT_LT(eintr.last_ms, 150u);
	kvd_msg(NULL);
	eintr.fd = -1;
	close(c.module_fd);
}

/*
 * Elastic pools: kvdmabuf_region_ranges() waits for the transfers begun on
 * the pages it changes (kvdmabuf_io_begin_range()), refuses new ones there
 * meanwhile and lets those on the other pages through; one that does not
 * end in the drain bound makes it -EAGAIN with nothing changed. Transfers
 * on the whole region (kvdmabuf_io_begin()) are not waited for.
 */
#define POOL_PAGE (2u << 20)

struct page_transfer {
	struct kvdmabuf_region *r;
	int begun_efd, event_efd;
	atomic_int ended;
	int rc_same_page, rc_other_page;
};

static void *page_transfer(void *arg)
{
	struct page_transfer *w = arg;
	uint64_t one = 1, v;

	if (kvdmabuf_io_begin_range(w->r, POOL_PAGE + 4096, 8192))
		return NULL;
	if (write(w->begun_efd, &one, sizeof(one)) != sizeof(one) ||
	    read(w->event_efd, &v, sizeof(v)) != sizeof(v))
		return NULL;
	atomic_store(&w->ended, 1);
	kvdmabuf_io_end_range(w->r, POOL_PAGE + 4096, 8192);
	return NULL;
}

static void *page_setter(void *arg)
{
	struct page_transfer *w = arg;
	uint64_t one = 1;

	usleep(150 * 1000);
	/* the change waits: its page refuses, the others take transfers */
	w->rc_same_page = kvdmabuf_io_begin_range(w->r, POOL_PAGE, 4096);
	if (!w->rc_same_page)
		kvdmabuf_io_end_range(w->r, POOL_PAGE, 4096);
	w->rc_other_page = kvdmabuf_io_begin_range(w->r, 0, 4096);
	if (!w->rc_other_page)
		kvdmabuf_io_end_range(w->r, 0, 4096);
	if (write(w->event_efd, &one, sizeof(one)) != sizeof(one))
		w->rc_same_page = -999;
	return NULL;
}

/* A module of another API major is refused (-EPROTO, both versions
 * named); one of this major and a later minor is taken. */
TEST(module_of_another_api_major_is_refused)
{
	struct kvdmabuf_ctx c;
	int rc;

	memset(&c, 0, sizeof(c));
	version.fd = memfd_create("kvd-version-dev", MFD_CLOEXEC);
	ASSERT_GE(version.fd, 0);
	version.answer = (KVDMABUF_API_VERSION_MAJOR + 1) << 16;
	rc = kvd_proxy_dev_check(&c, version.fd);
	TH_LOG("%s", kvd_msg(&c));
	EXPECT_EQ(-EPROTO, rc);
	EXPECT_NE(NULL, strstr(kvd_msg(&c), "needs"));
	version.answer = (KVDMABUF_API_VERSION_MAJOR - 1) << 16 | 9;
	EXPECT_EQ(-EPROTO, kvd_proxy_dev_check(&c, version.fd));
	version.answer = KVDMABUF_API_VERSION_MAJOR << 16 | 0xfff;
	EXPECT_EQ(0, kvd_proxy_dev_check(&c, version.fd));
	close(version.fd);
	version.fd = -1;
	kvd_msg(NULL);
}

TEST(ranges_wait_for_transfers_on_their_pages)
{
	struct kvdmabuf_region_range rr = { .offset = POOL_PAGE,
					    .len = POOL_PAGE };
	struct page_transfer w = { 0 };
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_ctx *ctx;
	pthread_t tw, ts;
	int64_t t0, t1;
	char err[512];
	uint64_t v;
	int p, rc;

	fake_reset(1);
	fw.module = 1;
	ASSERT_EQ(0, fake_open("protocol: rdma\ndrain_timeout_s: 0.3\n", NULL,
			       &ctx, err, sizeof(err)));
	d.addr = region_mem(3 * POOL_PAGE);
	ASSERT_NE(NULL, d.addr);
	d.len = 3 * POOL_PAGE;
	d.mem = KVDMABUF_MEM_DRM;
	d.flags = KVDMABUF_REGION_EMPTY;
	ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &w.r));
	p = fake_find_proxy(w.r->proxy_fd);
	ASSERT_LE(0, p);
	EXPECT_EQ(-EINVAL, kvdmabuf_io_begin_range(w.r, 3 * POOL_PAGE, 1));
	EXPECT_EQ(-EINVAL, kvdmabuf_io_begin_range(w.r, 0, 0));

	/* a transfer on page 1 ends 150 ms in: the change of page 1 waits */
	rr.fd = memfd_create("fake-backing", MFD_CLOEXEC);
	ASSERT_EQ(0, ftruncate(rr.fd, POOL_PAGE));
	w.begun_efd = eventfd(0, EFD_CLOEXEC);
	w.event_efd = eventfd(0, EFD_CLOEXEC);
	ASSERT_EQ(0, pthread_create(&tw, NULL, page_transfer, &w));
	ASSERT_EQ((ssize_t)sizeof(v), read(w.begun_efd, &v, sizeof(v)));
	t0 = kvd_now_ns();
	ASSERT_EQ(0, pthread_create(&ts, NULL, page_setter, &w));
	rc = kvdmabuf_region_ranges(w.r, &rr, 1);
	t1 = kvd_now_ns();
	EXPECT_EQ(1, atomic_load(&w.ended));    /* ended before the change */
	pthread_join(ts, NULL);
	pthread_join(tw, NULL);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(ctx));
	ASSERT_EQ(0, rc);
	EXPECT_GE(t1 - t0, 140 * 1000000LL);
	EXPECT_EQ(-ESHUTDOWN, w.rc_same_page);
	EXPECT_EQ(0, w.rc_other_page);
	EXPECT_EQ(2u, fw.px[p].ranges_calls);   /* the add's, then this */
	EXPECT_LE(0, fake_piece_at(p, POOL_PAGE)->fd);
	close(rr.fd);

	/* one that never ends: -EAGAIN after the bound, nothing changed,
	 * the page open again afterwards */
	rr.offset = 2 * POOL_PAGE;
	rr.fd = KVDMABUF_RANGE_RELEASE;
	ASSERT_EQ(0, kvdmabuf_io_begin_range(w.r, 2 * POOL_PAGE, 4096));
	t0 = kvd_now_ns();
	EXPECT_EQ(-EAGAIN, kvdmabuf_region_ranges(w.r, &rr, 1));
	t1 = kvd_now_ns();
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(ctx), "still in flight"));
	EXPECT_GE(t1 - t0, 270 * 1000000LL);
	EXPECT_EQ(2u, fw.px[p].ranges_calls);
	EXPECT_EQ(0, kvdmabuf_io_begin_range(w.r, 2 * POOL_PAGE, 4096));
	kvdmabuf_io_end_range(w.r, 2 * POOL_PAGE, 4096);
	kvdmabuf_io_end_range(w.r, 2 * POOL_PAGE, 4096);

	/* a transfer on the whole region is not the change's to wait for */
	ASSERT_EQ(0, kvdmabuf_io_begin(w.r));
	EXPECT_EQ(0, kvdmabuf_region_ranges(w.r, &rr, 1));
	kvdmabuf_io_end(w.r);
	EXPECT_EQ(3u, fw.px[p].ranges_calls);
	close(w.begun_efd);
	close(w.event_efd);
	kvdmabuf_close(ctx);
	munmap(d.addr, 3 * POOL_PAGE);
}

TEST_HARNESS_MAIN
