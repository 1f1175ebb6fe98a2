// SPDX-License-Identifier: MIT
/*
 * lib_rollback - a failure injected at the n-th export / register /
 * deregister / attach / revoke of a sleep, a wake or a region add is rolled
 * back completely (sleep: everything awake and registered on the old
 * memory; wake: everything asleep, nothing of the new memory kept; add:
 * nothing left), and a retry then succeeds. Every n is tried until the
 * operation is no longer reached. Host-only: fake NICs / exporter / module
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
			TH_LOG("%s", kvdmabuf_strerror(self->ctx));
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

static const enum fake_op sleep_ops[] = { OP_DEREG, OP_REVOKE, OP_REG,
					  OP_ATTACH, OP_EXPORT };
static const enum fake_op wake_ops[] = { OP_EXPORT, OP_ATTACH, OP_REG,
					 OP_DEREG, OP_REVOKE };

TEST_F(rb, sleep_failure_rolls_back_then_retry)
{
	unsigned int k;
	unsigned long n;
	int rc, tried = 0;

	for (k = 0; k < sizeof(sleep_ops) / sizeof(sleep_ops[0]); k++) {
		for (n = 1;; n++) {
			inj_arm(sleep_ops[k], n, -EIO);
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
			TH_LOG("%s #%lu: %s", fake_op_name[sleep_ops[k]], n,
			       kvdmabuf_strerror(self->ctx));
			ASSERT_EQ(-EIO, rc);
			ASSERT_NE(NULL, strstr(kvdmabuf_strerror(self->ctx),
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
			       kvdmabuf_strerror(self->ctx));
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

/* A pin on a proxy that appears after the mode was chosen (another
 * importer) makes revoke fail with -EBUSY: the sleep fails whole (FOLLOW
 * and REREGISTER-through-proxy alike), and succeeds once the pin is gone. */
TEST_F(rb, late_pin_fails_sleep_whole)
{
	struct kvdmabuf_region_info in;
	int p;

	ASSERT_EQ(0, info_of(self->r[1], &in));
	if (!in.proxied) {
		/* no proxy (no module): nothing to revoke, nothing to pin */
		ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
		CHECK_ASLEEP(self);
		ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
		CHECK_AWAKE(self, variant);
		return;
	}
	p = (int)in.proxy_id - 1;
	fw.px[p].pinned++;       /* someone pins the proxy of region 1 */
	ASSERT_EQ(-EBUSY, kvdmabuf_sleep(self->ctx, NULL));
	TH_LOG("%s", kvdmabuf_strerror(self->ctx));
	CHECK_AWAKE(self, variant);
	fw.px[p].pinned--;
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	CHECK_ASLEEP(self);
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	CHECK_AWAKE(self, variant);
}

TEST_HARNESS_MAIN
