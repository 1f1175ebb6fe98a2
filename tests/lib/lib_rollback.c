// SPDX-License-Identifier: MIT
/*
 * lib_rollback - a failure injected at the n-th export / register /
 * deregister / attach / revoke of a sleep, a wake or a region add is rolled
 * back completely (sleep: everything awake and registered on the old
 * memory; wake: everything asleep, nothing of the new memory kept; add:
 * nothing left), and a retry then succeeds. Every n is tried until the
 * operation is no longer reached. Also: a revoke that fails after it
 * revoked (the module's -ETIMEDOUT) is undone by its own region; a failed
 * wake leaves the keys the engine knows and calls no callback; new keys of
 * a failed sleep reach the engine before I/O resumes; a region whose
 * rollback failed too is reported broken, never awake with a bad MR.
 * Host-only: fake NICs / exporter / module
 * behind the library's ops table, wrapped by the fault injector
 * (tests/lib_fake.h).
 */
#include "harness.h"
#include "lib_fake.h"

#define NR 4
#define LEN (16 * 4096)
#define NICS 2

FIXTURE(rb) {
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r[NR];
	void *mem[NR];
	uint32_t lkey[NR][NICS];
	int fds_before;
};

FIXTURE_VARIANT(rb) {
	int module;
	int pins;
};

/* mlx5-like NICs behind the module: device regions FOLLOW */
FIXTURE_VARIANT_ADD(rb, follow) { .module = 1, .pins = 0 };
/* pinning NICs behind the module: REREGISTER through the proxy */
FIXTURE_VARIANT_ADD(rb, pinning_nic) { .module = 1, .pins = 1 };
/* pinning NICs that a revoke ends for good (irdma, Linux 7.1+): REREGISTER */
FIXTURE_VARIANT_ADD(rb, revocable_pinning_nic) { .module = 1, .pins = 2 };
/* no module: REREGISTER on the backing dma-buf */
FIXTURE_VARIANT_ADD(rb, no_module) { .module = 0, .pins = 0 };

static const int mems[NR] = { KVDMABUF_MEM_DRM, KVDMABUF_MEM_DRM,
			      KVDMABUF_MEM_HOST, KVDMABUF_MEM_HOST };

FIXTURE_SETUP(rb)
{
	struct kvdmabuf_options o = { 0 };
	char err[512];
	int i, n, rc;

	fake_reset(NICS);
	fw.module = variant->module;
	for (n = 0; n < NICS; n++)
		fw.nic_pins[n] = variant->pins;
	self->fds_before = fds_open();
	ASSERT_EQ(0, fake_open("protocol: rdma\n", &o, &self->ctx, err,
			       sizeof(err)));
	for (i = 0; i < NR; i++) {
		struct kvdmabuf_region_desc d = { 0 };

		self->mem[i] = region_mem(LEN);
		ASSERT_NE(NULL, self->mem[i]);
		d.addr = self->mem[i];
		d.len = LEN;
		d.mem = mems[i];
		d.tag = i == 3 ? "host" : "kv_cache";
		d.flags = i == 2 ? KVDMABUF_REGION_RELEASED_AT_SLEEP : 0;
		rc = kvdmabuf_region_add(self->ctx, &d, &self->r[i]);
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		ASSERT_EQ(0, rc);
		for (n = 0; n < NICS; n++)
			ASSERT_EQ(0, kvdmabuf_region_keys(self->r[i], n,
							  &self->lkey[i][n],
							  NULL, NULL));
	}
}

FIXTURE_TEARDOWN(rb)
{
	int i;

	inj_disarm();
	kvdmabuf_close(self->ctx);
	fake_proxy_gc();
	EXPECT_EQ(0, fake_mrs_live());
	EXPECT_EQ(self->fds_before, fds_open());
	for (i = 0; i < NR; i++)
		munmap(self->mem[i], LEN);
}

static int info_of(struct kvdmabuf_region *r, struct kvdmabuf_region_info *i)
{
	return kvdmabuf_region_info(r, i);
}

static int proxy_state(uint64_t id)
{
	return id ? fw.px[id - 1].state : -1;
}

/* Everything awake and registered, exactly as after add. */
#define CHECK_AWAKE(self, variant)                                           \
	do {                                                                 \
		struct kvdmabuf_region_info _in;                             \
		uint32_t _l;                                                 \
		int _i, _n;                                                  \
		for (_i = 0; _i < NR; _i++) {                                \
			ASSERT_EQ(0, info_of(self->r[_i], &_in));            \
			EXPECT_EQ(0, _in.asleep);                            \
			for (_n = 0; _n < NICS; _n++) {                      \
				EXPECT_EQ(1, fake_mrs_at(_n, self->mem[_i],  \
							 LEN));              \
				ASSERT_EQ(0, kvdmabuf_region_keys(           \
					self->r[_i], _n, &_l, NULL, NULL));  \
				if (_in.mode != KVDMABUF_MODE_REREGISTER)    \
					EXPECT_EQ(self->lkey[_i][_n], _l);   \
			}                                                    \
			if (_in.proxied)                                     \
				EXPECT_EQ(KVD_PROXY_BACKED,                  \
					  proxy_state(_in.proxy_id));        \
			EXPECT_EQ(0, kvdmabuf_io_begin(self->r[_i]));        \
			kvdmabuf_io_end(self->r[_i]);                        \
		}                                                            \
		fake_proxy_gc();                                             \
		EXPECT_EQ(2 * (1 + (variant->module ? 1 : NICS)),            \
			  fds_named("fake-backing"));                        \
	} while (0)

/* A whole cycle that succeeds: asleep, then awake with the same keys. */
#define CYCLE_OK(self, variant)                                              \
	do {                                                                 \
		ASSERT_EQ(0, kvdmabuf_sleep((self)->ctx, NULL));             \
		CHECK_ASLEEP(self);                                          \
		ASSERT_EQ(0, kvdmabuf_wake((self)->ctx, NULL));              \
		CHECK_AWAKE(self, variant);                                  \
	} while (0)

/* Regions 0-2 asleep with nothing holding memory; region 3 untouched. */
#define CHECK_ASLEEP(self)                                                   \
	do {                                                                 \
		struct kvdmabuf_region_info _in;                             \
		int _i, _n;                                                  \
		for (_i = 0; _i < 3; _i++) {                                 \
			ASSERT_EQ(0, info_of(self->r[_i], &_in));            \
			EXPECT_EQ(1, _in.asleep);                            \
			for (_n = 0; _n < NICS; _n++)                        \
				EXPECT_EQ(_in.mode == KVDMABUF_MODE_FOLLOW,  \
					  fake_mrs_at(_n, self->mem[_i],     \
						      LEN));                 \
			if (_in.proxied)                                     \
				EXPECT_NE(KVD_PROXY_BACKED,                  \
					  proxy_state(_in.proxy_id));        \
			EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(self->r[_i]));\
		}                                                            \
		for (_n = 0; _n < NICS; _n++)                                \
			EXPECT_EQ(1, fake_mrs_at(_n, self->mem[3], LEN));    \
		fake_proxy_gc();                                             \
		EXPECT_EQ(0, fds_named("fake-backing"));                     \
	} while (0)

/* What fails in a sleep: every step once with -EIO (nothing done), and the
 * module's REVOKE failing *after* it revoked (-ETIMEDOUT: an importer kept
 * its mapping of the old backing past the bound), which the failing region
 * must undo itself. */
static const struct sleep_case {
	enum fake_op op;
	int rc;
	int late;
} sleep_cases[] = {
	{ OP_DEREG, -EIO, 0 }, { OP_REVOKE, -EIO, 0 }, { OP_REG, -EIO, 0 },
	{ OP_ATTACH, -EIO, 0 }, { OP_EXPORT, -EIO, 0 },
	{ OP_REVOKE, -ETIMEDOUT, 1 },
};
static const enum fake_op wake_ops[] = { OP_EXPORT, OP_ATTACH, OP_REG,
					 OP_DEREG, OP_REVOKE };

TEST_F(rb, sleep_failure_rolls_back_then_retry)
{
	const struct sleep_case *c;
	unsigned long n;
	int rc, tried = 0, tried_late = 0;

	for (c = sleep_cases; c < sleep_cases + sizeof(sleep_cases) /
					     sizeof(sleep_cases[0]); c++) {
		for (n = 1;; n++) {
			inj_arm(c->op, n, c->rc);
			fw.revoke_late = c->late;
			rc = kvdmabuf_sleep(self->ctx, NULL);
			inj_disarm();
			if (!fw.injected) {
				/* the op is not reached n times in a sleep */
				ASSERT_EQ(0, rc);
				CHECK_ASLEEP(self);
				ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
				CHECK_AWAKE(self, variant);
				break;
			}
			tried++;
			tried_late += c->late;
			TH_LOG("%s%s #%lu: %s", fake_op_name[c->op],
			       c->late ? " (after revoking)" : "", n,
			       kvdmabuf_last_error(self->ctx));
			ASSERT_EQ(c->rc, rc);
			ASSERT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx),
					       "injected"));
			CHECK_AWAKE(self, variant);
			/* retry */
			rc = kvdmabuf_sleep(self->ctx, NULL);
			ASSERT_EQ(0, rc);
			CHECK_ASLEEP(self);
			ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
			CHECK_AWAKE(self, variant);
		}
	}
	/* some forward step of sleep was failed at least once per region */
	EXPECT_GE(tried, 3);
	/* both device regions are behind a proxy when the module is there */
	EXPECT_EQ(variant->module ? 2 : 0, tried_late);
}

TEST_F(rb, wake_failure_rolls_back_then_retry)
{
	unsigned int k;
	unsigned long n;
	int rc, i, tried = 0;

	for (k = 0; k < sizeof(wake_ops) / sizeof(wake_ops[0]); k++) {
		for (n = 1;; n++) {
			ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
			for (i = 0; i < 3; i++)
				ASSERT_EQ(0, remap_fresh(self->mem[i], LEN));
			inj_arm(wake_ops[k], n, -EIO);
			rc = kvdmabuf_wake(self->ctx, NULL);
			inj_disarm();
			if (!fw.injected) {
				ASSERT_EQ(0, rc);
				CHECK_AWAKE(self, variant);
				break;
			}
			tried++;
			TH_LOG("%s #%lu: %s", fake_op_name[wake_ops[k]], n,
			       kvdmabuf_last_error(self->ctx));
			ASSERT_EQ(-EIO, rc);
			CHECK_ASLEEP(self);
			/* idempotent while asleep */
			ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
			CHECK_ASLEEP(self);
			/* retry */
			ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
			CHECK_AWAKE(self, variant);
		}
	}
	EXPECT_GE(tried, 3);
}

TEST_F(rb, add_failure_leaves_nothing)
{
	static const enum fake_op ops[] = { OP_EXPORT, OP_CREATE, OP_ATTACH,
					    OP_REG, OP_QUERY };
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r;
	unsigned int k;
	unsigned long n;
	int fds = fds_open(), mrs = fake_mrs_live(), rc;
	void *m = region_mem(LEN);

	ASSERT_NE(NULL, m);
	d.addr = m;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_DRM;
	for (k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
		for (n = 1;; n++) {
			inj_arm(ops[k], n, -EIO);
			rc = kvdmabuf_region_add(self->ctx, &d, &r);
			inj_disarm();
			if (!fw.injected) {
				ASSERT_EQ(0, rc);
				ASSERT_EQ(0, kvdmabuf_region_remove(r));
				break;
			}
			ASSERT_EQ(-EIO, rc);
			fake_proxy_gc();
			EXPECT_EQ(mrs, fake_mrs_live());
			EXPECT_EQ(fds, fds_open());
		}
	}
	fake_proxy_gc();
	EXPECT_EQ(fds, fds_open());
	munmap(m, LEN);
}

/* The mode is measured: any pin, revocable or not, means REREGISTER. */
TEST_F(rb, mode_of_device_regions)
{
	struct kvdmabuf_region_info in;
	int i;

	for (i = 0; i < 2; i++) {
		ASSERT_EQ(0, info_of(self->r[i], &in));
		if (!variant->module)
			EXPECT_EQ(KVDMABUF_MODE_REREGISTER, in.mode);
		else
			EXPECT_EQ(variant->pins ? KVDMABUF_MODE_REREGISTER :
				  KVDMABUF_MODE_FOLLOW, in.mode);
	}
}

/* The fake module's index of @r's proxy (fw.px[]), or -1: none. */
static int fake_proxy_of(struct kvdmabuf_region *r)
{
	struct kvdmabuf_region_info in;

	if (info_of(r, &in) || !in.proxied)
		return -1;
	return (int)in.proxy_id - 1;
}

/* A pin on a proxy that appears after the mode was chosen (another
 * importer) makes revoke fail with -EBUSY: the sleep fails whole (FOLLOW
 * and REREGISTER-through-proxy alike), and succeeds once the pin is gone. */
TEST_F(rb, late_pin_fails_sleep_whole)
{
	int p = fake_proxy_of(self->r[1]);

	if (p < 0) {
		/* no proxy (no module): nothing to revoke, nothing to pin */
		CYCLE_OK(self, variant);
		return;
	}
	fw.px[p].pinned++;       /* someone pins the proxy of region 1 */
	ASSERT_EQ(-EBUSY, kvdmabuf_sleep(self->ctx, NULL));
	TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	CHECK_AWAKE(self, variant);
	fw.px[p].pinned--;
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	CHECK_ASLEEP(self);
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	CHECK_AWAKE(self, variant);
}

/* An importer that lets go of the old pages late (its fences, a mapping
 * it still holds) is waited for within the revoke bound the library gives
 * the module (the fake waits as the module does, tests/lib_fake.h); one
 * that outlasts the bound fails the sleep whole. */
TEST_F(rb, slow_importer_is_waited_for_within_the_revoke_bound)
{
	int p = fake_proxy_of(self->r[1]);
	int64_t t0, ms;

	if (p < 0) {
		/* no proxy (no module): nothing to revoke, nothing waits */
		CYCLE_OK(self, variant);
		return;
	}
	self->ctx->revoke_timeout_ms = 2000;
	fw.px[p].unmap_ms = 200;
	t0 = kvd_now_ns();
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	ms = (kvd_now_ns() - t0) / 1000000;
	EXPECT_GE(ms, 190);
	CHECK_ASLEEP(self);
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	CHECK_AWAKE(self, variant);
	/* longer than the bound: -ETIMEDOUT, everything as it was */
	self->ctx->revoke_timeout_ms = 100;
	ASSERT_EQ(-ETIMEDOUT, kvdmabuf_sleep(self->ctx, NULL));
	TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	CHECK_AWAKE(self, variant);
	fw.px[p].unmap_ms = 0;
	CYCLE_OK(self, variant);
}

/* Key-change callbacks: how many, whether I/O was still stopped, and (with
 * the context as @arg) how many of their own calls were refused. */
static int cb_calls, cb_io_open, cb_refused;

static void count_keys(struct kvdmabuf_region *const *rs, unsigned int n,
		       void *arg)
{
	unsigned int i;

	cb_calls++;
	/* a callback's own call fails (and sets a message of its own) */
	if (arg && kvdmabuf_sleep(arg, NULL) == -EDEADLK)
		cb_refused++;
	for (i = 0; i < n; i++)
		if (!kvdmabuf_io_begin(rs[i])) {
			cb_io_open++;
			kvdmabuf_io_end(rs[i]);
		}
}

/*
 * A wake that fails is rolled back to asleep: the keys the engine knows
 * (and their generation) stay, and no key-change callback announces keys
 * that region_keys() would not give.
 */
TEST_F(rb, failed_wake_publishes_nothing)
{
	uint64_t gen[NR], g;
	unsigned long n;
	int rc, i, tried = 0;

	self->ctx->key_change = count_keys;
	for (n = 1;; n++) {
		ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
		/* -ENOENT while asleep in REREGISTER; the generation
		 * is given all the same */
		for (i = 0; i < NR; i++)
			kvdmabuf_region_keys(self->r[i], 0, NULL, NULL,
					     &gen[i]);
		for (i = 0; i < 3; i++)
			ASSERT_EQ(0, remap_fresh(self->mem[i], LEN));
		cb_calls = 0;
		inj_arm(OP_REG, n, -EIO);
		rc = kvdmabuf_wake(self->ctx, NULL);
		inj_disarm();
		if (!fw.injected) {
			ASSERT_EQ(0, rc);
			CHECK_AWAKE(self, variant);
			break;
		}
		tried++;
		ASSERT_EQ(-EIO, rc);
		EXPECT_EQ(0, cb_calls);
		for (i = 0; i < NR; i++) {
			kvdmabuf_region_keys(self->r[i], 0, NULL, NULL, &g);
			EXPECT_EQ(gen[i], g);
		}
		CHECK_ASLEEP(self);
		ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
		CHECK_AWAKE(self, variant);
	}
	EXPECT_GE(tried, 2);
}

/*
 * A sleep rolled back after a REREGISTER region was deregistered registers
 * it again with new keys: the engine hears of them before any transfer may
 * start (the callback sees I/O still stopped).
 */
TEST_F(rb, failed_sleep_publishes_new_keys_before_io_resumes)
{
	static const enum fake_op ops[] = { OP_DEREG, OP_REVOKE };
	unsigned int k;
	unsigned long n;
	int rc, calls = 0, refused = 0;

	self->ctx->key_change = count_keys;
	self->ctx->key_change_arg = self->ctx;
	cb_io_open = cb_refused = 0;
	for (k = 0; k < 2; k++) {
		for (n = 1;; n++) {
			cb_calls = cb_refused = 0;
			inj_arm(ops[k], n, -EIO);
			rc = kvdmabuf_sleep(self->ctx, NULL);
			inj_disarm();
			if (!fw.injected) {
				ASSERT_EQ(0, rc);
				ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
				break;
			}
			ASSERT_EQ(-EIO, rc);
			CHECK_AWAKE(self, variant);
			/* the sleep's message, not the callback's */
			EXPECT_NULL(strstr(kvdmabuf_last_error(self->ctx),
					   "from a callback"));
			calls += cb_calls;
			refused += cb_refused;
		}
	}
	/* region 2 (host, released at sleep) is REREGISTER in every variant */
	EXPECT_GE(calls, 1);
	EXPECT_EQ(calls, refused);
	EXPECT_EQ(0, cb_io_open);
}

/*
 * Deregistration fails on the second NIC and registering the first again
 * fails too: the region is broken, and says so. It never reports a key of
 * an MR it does not have; sleep and wake skip it; remove releases what it
 * still holds.
 */
TEST(double_failure_leaves_a_broken_region)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region_info in;
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	uint32_t lkey = 0;
	char err[512];
	void *mem = region_mem(LEN);

	fake_reset(2);
	ASSERT_NE(NULL, mem);
	ASSERT_EQ(0, fake_open("protocol: rdma\n", &o, &ctx, err,
			       sizeof(err)));
	d.addr = mem;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
	ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &r));
	inj_arm(OP_DEREG, 2, -EIO);
	fw.fail_at[OP_REG] = 1;
	ASSERT_EQ(-EIO, kvdmabuf_sleep(ctx, NULL));
	inj_disarm();
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(ctx), "broken"));
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(-EIO, in.broken);
	EXPECT_EQ(-ENOENT, kvdmabuf_region_keys(r, 0, &lkey, NULL, NULL));
	EXPECT_EQ(-ENOENT, kvdmabuf_region_keys(r, 1, &lkey, NULL, NULL));
	EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(r));
	EXPECT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	EXPECT_EQ(0, kvdmabuf_wake(ctx, NULL));
	EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(r));
	EXPECT_EQ(1, fake_mrs_live());          /* NIC 1's MR, never dropped */
	EXPECT_EQ(0, kvdmabuf_region_remove(r));
	EXPECT_EQ(0, fake_mrs_live());
	EXPECT_EQ(0, kvdmabuf_close(ctx));
	munmap(mem, LEN);
}

/*
 * The rollback of a wake cannot revoke a region's proxy (an importer pins
 * it): that region is broken, and the error says why (not a made-up EIO).
 * No fd of the new memory stays with the library, and later wakes of the
 * other regions work (they used to fail with -EEXIST on the still-backed
 * proxy).
 */
TEST_F(rb, wake_rollback_that_cannot_revoke)
{
	struct kvdmabuf_region_info in;
	int p, i;

	ASSERT_EQ(0, info_of(self->r[0], &in));
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	for (i = 0; i < 3; i++)
		ASSERT_EQ(0, remap_fresh(self->mem[i], LEN));
	if (!in.proxied) {
		/* Nothing to revoke without the module: region 0 is undone
		 * by deregistering, and its fd of the new memory goes too. */
		inj_arm(OP_REG, NICS + 1, -EIO);
		ASSERT_EQ(-EIO, kvdmabuf_wake(self->ctx, NULL));
		inj_disarm();
		ASSERT_EQ(0, info_of(self->r[0], &in));
		EXPECT_EQ(1, in.asleep);
		EXPECT_EQ(0, in.broken);
		EXPECT_EQ(-1, self->r[0]->backing_fd);
		ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
		CHECK_AWAKE(self, variant);
		return;
	}
	p = (int)in.proxy_id - 1;
	/* Region 0's wake fails at its registration (REREGISTER: its own
	 * rollback revokes) or region 1's attach fails (FOLLOW: region 0 is
	 * undone); either revoke finds a pin that appeared meanwhile. */
	if (in.mode == KVDMABUF_MODE_REREGISTER)
		inj_arm(OP_REG, 1, -EIO);
	else
		inj_arm(OP_ATTACH, 2, -EIO);
	fw.px[p].pinned++;
	ASSERT_EQ(-EIO, kvdmabuf_wake(self->ctx, NULL));
	inj_disarm();
	TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx),
			       strerror(EBUSY)));
	ASSERT_EQ(0, info_of(self->r[0], &in));
	EXPECT_EQ(-EBUSY, in.broken);
	EXPECT_EQ(-1, self->r[0]->backing_fd);
	fw.px[p].pinned--;
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	for (i = 1; i < NR; i++) {
		ASSERT_EQ(0, info_of(self->r[i], &in));
		EXPECT_EQ(0, in.asleep);
		EXPECT_EQ(0, in.broken);
	}
	EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(self->r[0]));
	ASSERT_EQ(0, kvdmabuf_region_remove(self->r[0]));
	ASSERT_EQ(0, kvdmabuf_region_add(self->ctx, &(struct kvdmabuf_region_desc){
		.addr = self->mem[0], .len = LEN, .mem = KVDMABUF_MEM_DRM,
		.tag = "kv_cache" }, &self->r[0]));
	ASSERT_EQ(0, kvdmabuf_region_keys(self->r[0], 0, &self->lkey[0][0],
					  NULL, NULL));
	ASSERT_EQ(0, kvdmabuf_region_keys(self->r[0], 1, &self->lkey[0][1],
					  NULL, NULL));
	CHECK_AWAKE(self, variant);
}

/* An engine's own registration of the proxy (kvdmabuf_region_dmabuf()) on
 * a NIC that pins: a revocable pin would be ended for good by the revoke
 * with sleep returning 0, a blocking one fails the revoke. Both are
 * refused before any revoke, naming the cause; nothing changes. */
TEST_F(rb, foreign_pins_refuse_the_sleep)
{
	struct kvdmabuf_region_info in;
	int p, revocable;

	ASSERT_EQ(0, info_of(self->r[0], &in));
	if (!in.proxied) {
		/* no proxy (no module): nothing an engine could register */
		ASSERT_EQ(-ENOENT, kvdmabuf_region_dmabuf(self->r[0], &p,
							  NULL));
		return;
	}
	p = (int)in.proxy_id - 1;
	for (revocable = 1; revocable >= 0; revocable--) {
		fw.px[p].pinned++;
		fw.px[p].revocable += revocable;
		inj_arm(OP_REVOKE, 0, 0);
		ASSERT_EQ(-EBUSY, kvdmabuf_sleep(self->ctx, NULL));
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx),
				       "not this library"));
		EXPECT_EQ(KVD_PROXY_BACKED, proxy_state(in.proxy_id));
		CHECK_AWAKE(self, variant);
		fw.px[p].pinned--;
		fw.px[p].revocable -= revocable;
	}
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	CHECK_ASLEEP(self);
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	CHECK_AWAKE(self, variant);
}

/* A deregistration the NIC refuses is reported by remove and close; the
 * region stays, broken, and a later remove or close tries again. */
TEST_F(rb, refused_deregistration_keeps_the_region_broken)
{
	struct kvdmabuf_region_info in;
	struct kvdmabuf_state st;
	int rc;

	inj_arm(OP_DEREG, 2, -EBUSY);     /* region 0's MR on fake1 */
	ASSERT_EQ(-EBUSY, kvdmabuf_region_remove(self->r[0]));
	TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx), "fake1"));
	ASSERT_EQ(0, info_of(self->r[0], &in));
	EXPECT_EQ(-EBUSY, in.broken);
	EXPECT_EQ(self->r[0], kvdmabuf_region_find(self->ctx, self->mem[0],
						   LEN));
	EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(self->r[0]));
	EXPECT_EQ(-ENOENT, kvdmabuf_region_keys(self->r[0], 1, NULL, NULL,
						NULL));
	EXPECT_EQ(0, fake_mrs_at(0, self->mem[0], LEN));
	EXPECT_EQ(1, fake_mrs_at(1, self->mem[0], LEN));
	ASSERT_EQ(0, kvdmabuf_query(self->ctx, &st));
	EXPECT_EQ(NR, st.nr_regions);
	EXPECT_EQ(1u, st.nr_broken);
	/* sleep and wake skip it; the others work */
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	/* the NIC lets go now: removed */
	ASSERT_EQ(0, kvdmabuf_region_remove(self->r[0]));
	EXPECT_EQ(0, fake_mrs_at(1, self->mem[0], LEN));
	EXPECT_NULL(kvdmabuf_region_find(self->ctx, self->mem[0], LEN));

	/* close: the other regions go, the refused one stays, context open */
	inj_arm(OP_DEREG, 1, -EBUSY);
	rc = kvdmabuf_close(self->ctx);
	if (!rc)
		self->ctx = NULL;
	ASSERT_EQ(-EBUSY, rc);
	TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx), "stays open"));
	ASSERT_EQ(0, kvdmabuf_query(self->ctx, &st));
	EXPECT_EQ(1u, st.nr_regions);
	EXPECT_EQ(1u, st.nr_broken);
	/* the teardown closes it again, and finds no MR left */
}

TEST_HARNESS_MAIN
