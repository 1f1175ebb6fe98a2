// SPDX-License-Identifier: MIT
/*
 * lib_roundtrip - regions round-trip exactly through two sleep/wake cycles:
 * same addresses and lengths registered again, keys unchanged for FOLLOW
 * and new (generation + 1, callback) for REREGISTER, host regions
 * untouched, nothing holding old memory while asleep, nothing leaked;
 * prefetch_at_wake asks the NICs to map FOLLOW MRs' new memory at a wake.
 * Host-only: fake NICs / exporter / module (tests/lib_fake.h).
 */
#include "harness.h"
#include "lib_fake.h"

#define NR 4
#define LEN (64 * 4096)

FIXTURE(rt) {
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r[NR];
	void *mem[NR];
	int fds_before;
	int callbacks;
};

FIXTURE_VARIANT(rt) {
	int module;
	int pins;
	int dev_mode;      /* expected mode of the device regions */
};

/* a NIC that follows moves (mlx5-like) behind the module: FOLLOW */
FIXTURE_VARIANT_ADD(rt, follow) {
	.module = 1, .pins = 0, .dev_mode = KVDMABUF_MODE_FOLLOW,
};
/* a pinning NIC (efa-like) behind the module: measured -> REREGISTER */
FIXTURE_VARIANT_ADD(rt, pinning_nic) {
	.module = 1, .pins = 1, .dev_mode = KVDMABUF_MODE_REREGISTER,
};
/* no module: registered on the backing dma-buf -> REREGISTER */
FIXTURE_VARIANT_ADD(rt, no_module) {
	.module = 0, .pins = 0, .dev_mode = KVDMABUF_MODE_REREGISTER,
};

static int *cb_counter;

static void on_keys(struct kvdmabuf_region *const *rs, unsigned int n,
		    void *arg)
{
	uint64_t g = 0;
	unsigned int i;

	(void)arg;
	/* a getter works from the callback: each region has new keys */
	for (i = 0; i < n; i++)
		if (kvdmabuf_region_keys(rs[i], 0, NULL, NULL, &g) == 0 &&
		    g > 1)
			(*cb_counter)++;
}

static const char *tags[NR] = { "kv_cache", "kv_cache", "kv_cache", "host" };

FIXTURE_SETUP(rt)
{
	struct kvdmabuf_options o = { 0 };
	char err[512];
	int i, rc;

	fake_reset(2);
	fw.module = variant->module;
	fw.nic_pins[0] = fw.nic_pins[1] = variant->pins;
	self->fds_before = fds_open();
	self->callbacks = 0;
	cb_counter = &self->callbacks;
	o.key_change = on_keys;
	rc = fake_open("protocol: rdma\n", &o, &self->ctx, err, sizeof(err));
	ASSERT_EQ(0, rc);
	for (i = 0; i < NR; i++) {
		struct kvdmabuf_region_desc d = { 0 };

		self->mem[i] = region_mem(LEN);
		ASSERT_NE(NULL, self->mem[i]);
		d.addr = self->mem[i];
		d.len = LEN;
		d.tag = tags[i];
		/* 0,1: device memory (fake export); 2: host memory the engine
		 * releases at sleep; 3: host memory it keeps */
		d.mem = i < 2 ? KVDMABUF_MEM_DRM : KVDMABUF_MEM_HOST;
		d.drm_fd = 0;
		d.flags = i == 2 ? KVDMABUF_REGION_RELEASED_AT_SLEEP : 0;
		rc = kvdmabuf_region_add(self->ctx, &d, &self->r[i]);
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		ASSERT_EQ(0, rc);
	}
}

FIXTURE_TEARDOWN(rt)
{
	int i;

	kvdmabuf_close(self->ctx);
	fake_proxy_gc();
	EXPECT_EQ(0, fake_mrs_live());
	EXPECT_EQ(self->fds_before, fds_open());
	for (i = 0; i < NR; i++)
		if (self->mem[i])
			munmap(self->mem[i], LEN);
}

static int mode_of(struct kvdmabuf_region *r)
{
	struct kvdmabuf_region_info info;

	return kvdmabuf_region_info(r, &info) ? -1 : info.mode;
}

TEST_F(rt, modes_are_measured)
{
	EXPECT_EQ(variant->dev_mode, mode_of(self->r[0]));
	EXPECT_EQ(variant->dev_mode, mode_of(self->r[1]));
	EXPECT_EQ(KVDMABUF_MODE_REREGISTER, mode_of(self->r[2]));
	EXPECT_EQ(KVDMABUF_MODE_HOST, mode_of(self->r[3]));
}

TEST_F(rt, two_cycles_exact)
{
	uint32_t lk[NR][2], rk[NR][2], l, rr;
	uint64_t gen[NR], g;
	int cycle, i, n, rc, expect_cb = 0;
	struct kvdmabuf_state st;

	for (i = 0; i < NR; i++)
		for (n = 0; n < 2; n++)
			ASSERT_EQ(0, kvdmabuf_region_keys(self->r[i], n,
							  &lk[i][n], &rk[i][n],
							  &gen[i]));
	for (i = 0; i < NR; i++)
		EXPECT_EQ(1, gen[i]);

	for (cycle = 1; cycle <= 2; cycle++) {
		rc = kvdmabuf_sleep(self->ctx, NULL);
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		ASSERT_EQ(0, rc);

		/* nothing of ours holds the old device memory */
		fake_proxy_gc();
		EXPECT_EQ(0, fds_named("fake-backing"));
		for (i = 0; i < 3; i++) {
			int mode = mode_of(self->r[i]);

			for (n = 0; n < 2; n++)
				EXPECT_EQ(mode == KVDMABUF_MODE_FOLLOW ? 1 : 0,
					  fake_mrs_at(n, self->mem[i], LEN));
			EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(self->r[i]));
		}
		/* host region untouched: registered, same keys, I/O goes on */
		for (n = 0; n < 2; n++) {
			EXPECT_EQ(1, fake_mrs_at(n, self->mem[3], LEN));
			ASSERT_EQ(0, kvdmabuf_region_keys(self->r[3], n, &l, &rr,
							  &g));
			EXPECT_EQ(lk[3][n], l);
			EXPECT_EQ(rk[3][n], rr);
		}
		ASSERT_EQ(0, kvdmabuf_io_begin(self->r[3]));
		kvdmabuf_io_end(self->r[3]);
		ASSERT_EQ(0, kvdmabuf_query(self->ctx, &st));
		EXPECT_EQ(3, st.nr_asleep);

		/* the engine frees the memory and maps new memory there */
		for (i = 0; i < 3; i++)
			ASSERT_EQ(0, remap_fresh(self->mem[i], LEN));

		rc = kvdmabuf_wake(self->ctx, NULL);
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		ASSERT_EQ(0, rc);

		for (i = 0; i < NR; i++) {
			int mode = mode_of(self->r[i]);

			ASSERT_EQ(0, kvdmabuf_io_begin(self->r[i]));
			kvdmabuf_io_end(self->r[i]);
			for (n = 0; n < 2; n++) {
				/* exactly one MR, same address and length */
				EXPECT_EQ(1, fake_mrs_at(n, self->mem[i], LEN));
				ASSERT_EQ(0, kvdmabuf_region_keys(self->r[i], n,
								  &l, &rr, &g));
				if (mode == KVDMABUF_MODE_REREGISTER) {
					EXPECT_NE(lk[i][n], l);
					EXPECT_NE(rk[i][n], rr);
					EXPECT_EQ(gen[i] + 1, g);
				} else {
					EXPECT_EQ(lk[i][n], l);
					EXPECT_EQ(rk[i][n], rr);
					EXPECT_EQ(gen[i], g);
				}
				lk[i][n] = l;
				rk[i][n] = rr;
			}
			if (mode == KVDMABUF_MODE_REREGISTER)
				expect_cb++;
			gen[i] = g;
		}
		EXPECT_EQ(expect_cb, self->callbacks);
		/* the new memory is referenced once per device region, plus
		 * the module's reference, or one per MR without module */
		fake_proxy_gc();
		EXPECT_EQ(2 * (1 + (variant->module ? 1 : 2)),
			  fds_named("fake-backing"));
		ASSERT_EQ(0, kvdmabuf_query(self->ctx, &st));
		EXPECT_EQ(0, st.nr_asleep);
		EXPECT_EQ((uint64_t)cycle, st.sleeps);
		EXPECT_EQ((uint64_t)cycle, st.wakes);
	}
	/* one export per device region at add and per wake */
	EXPECT_EQ(2u * 3u, fw.exports);
}

TEST_F(rt, remove_releases_everything)
{
	int i;

	for (i = 0; i < NR; i++) {
		ASSERT_EQ(0, kvdmabuf_region_remove(self->r[i]));
		self->r[i] = NULL;
	}
	fake_proxy_gc();
	EXPECT_EQ(0, fake_mrs_live());
	EXPECT_EQ(0, fds_named("fake-backing"));
	EXPECT_EQ(0, fds_named("fake-proxy"));
}

TEST(tcp_regions_are_noreg)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r, *h;
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region_info info;
	char err[256];
	void *m = region_mem(2 * LEN);

	fake_reset(1);
	fw.module = 1;
	ASSERT_EQ(0, fake_open("protocol: tcp\n", NULL, &ctx, err,
			       sizeof(err)));
	d.addr = m;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_DRM;
	ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &r));
	ASSERT_EQ(0, kvdmabuf_region_info(r, &info));
	EXPECT_EQ(KVDMABUF_MODE_NOREG, info.mode);
	EXPECT_EQ(0, fake_mrs_live());
	EXPECT_EQ(0u, fw.exports);
	EXPECT_EQ(-ENOENT, kvdmabuf_region_keys(r, 0, NULL, NULL, NULL));
	/* host memory the engine keeps: untouched by sleep under tcp too */
	d.addr = (char *)m + LEN;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &h));
	ASSERT_EQ(0, kvdmabuf_region_info(h, &info));
	EXPECT_EQ(KVDMABUF_MODE_HOST, info.mode);
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(r));
	EXPECT_EQ(0, kvdmabuf_io_begin(h));
	kvdmabuf_io_end(h);
	ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
	EXPECT_EQ(0, kvdmabuf_io_begin(r));
	kvdmabuf_io_end(r);
	kvdmabuf_close(ctx);
	munmap(m, 2 * LEN);
}

/*
 * prefetch_at_wake: each wake asks every NIC to map a FOLLOW region's MR
 * (the proxy backed again, its new generation, I/O not yet open), never
 * a REREGISTER one (registered anew: mapped) and never at sleep; a NIC
 * without prefetch is counted and the wake goes on. Off: never asked.
 */
TEST(prefetch_at_wake_maps_follow_mrs_before_io_opens)
{
	static const char *const yaml[2] = {
		"protocol: rdma\n", "protocol: rdma\nprefetch_at_wake: on\n",
	};
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r, *h;
	struct kvdmabuf_state st;
	struct fake_mr *m0, *m1, *hm;
	void *m = region_mem(2 * LEN);
	char err[256];
	int on, cycle;

	ASSERT_NE(NULL, m);
	for (on = 0; on < 2; on++) {
		struct kvdmabuf_region_desc d = { .addr = m, .len = LEN,
						  .mem = KVDMABUF_MEM_DRM };

		fake_reset(2);
		fw.module = 1;
		fw.nic_prefetch[0] = 1;         /* NIC 1 cannot */
		ASSERT_EQ(0, fake_open(yaml[on], NULL, &ctx, err,
				       sizeof(err)));
		ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &r));
		EXPECT_EQ(KVDMABUF_MODE_FOLLOW, mode_of(r));
		d.addr = (char *)m + LEN;
		d.mem = KVDMABUF_MEM_HOST;
		d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
		ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &h));
		EXPECT_EQ(KVDMABUF_MODE_REREGISTER, mode_of(h));
		m0 = r->mr[0].handle;
		m1 = r->mr[1].handle;
		fw.io_probe = r;
		for (cycle = 1; cycle <= 2; cycle++) {
			ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
			EXPECT_EQ((unsigned int)on * (cycle - 1), m0->prefetched);
			ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
			hm = h->mr[0].handle;
			EXPECT_EQ(0u, hm->prefetched);
			EXPECT_EQ(0u, m1->prefetched);
			EXPECT_EQ((unsigned int)on * cycle, m0->prefetched);
			if (!on)
				continue;
			EXPECT_EQ(fw.px[m0->proxy].gen, m0->prefetch_gen);
			EXPECT_EQ(KVD_PROXY_BACKED, m0->prefetch_state);
			EXPECT_EQ(-ESHUTDOWN, m0->prefetch_io_rc);
		}
		fw.io_probe = NULL;
		ASSERT_EQ(0, kvdmabuf_query(ctx, &st));
		/* two wakes, two NICs; NIC 1's counted as failed */
		EXPECT_EQ(4u * on, st.prefetches);
		EXPECT_EQ(2u * on, st.prefetch_failures);
		kvdmabuf_close(ctx);
		fake_proxy_gc();
		EXPECT_EQ(0, fake_mrs_live());
	}
	munmap(m, 2 * LEN);
}

TEST_HARNESS_MAIN
