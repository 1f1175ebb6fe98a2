// SPDX-License-Identifier: MIT
/*
 * preload_engine - a stand-in transfer engine under libkvdmabuf-preload.so
 * on soft-RoCE (rxe0/rxe1 in the VM; KVDMABUF_IBDEV_A/B elsewhere). The
 * engine part has no kvdmabuf call: its own context, PD and QP, KV memory
 * mapped at a fixed address and registered by address, a peer writing
 * into it by the engine's rkey. The program runs itself again under the
 * preload (LD_PRELOAD from the build tree) with that address declared as
 * a KV region in KVDMABUF_KV_REGIONS, as an operator would. The sleep
 * hook's part finds the preload's API with dlsym(), as a plugin would.
 *
 * rxe has no dma-buf MRs: every registration of KV memory is made as
 * asked, so a sleep is refused naming the MR and the NIC, and nothing is
 * released (the pages stay pinned, the peer's writes still land by the
 * same rkey). Every form of ibv_reg_mr lands in the interposer; memory
 * outside the regions passes through; a region declared after the
 * registration refuses too; libkvdmabuf's own kvdmabuf_sleep() of memory
 * the engine registered by address is refused, its own MRs not counted.
 */
#include <dlfcn.h>
#include <sys/mman.h>

#include "harness.h"
#include "rxe_env.h"
#include "lib_fake.h"
#include "verbs_pair.h"
#include "procfs.h"
#include "vgem.h"
#include "kvdmabuf_preload.h"
#include "preload_rerun.h"

#define KV_ADDR 0x7e0000000000ull
#define LEN (1u << 20)
#define BLK 4096u

/* Runs itself again under the preload, KV_ADDR declared. */
__attribute__((constructor)) static void under_preload(int argc, char **argv)
{
	char regions[64];

	(void)argc;
	snprintf(regions, sizeof(regions), "%#llx+%#x:kv_cache", KV_ADDR, LEN);
	preload_rerun(argv, regions);
}

/* The sleep hook's view of the preload (what a plugin finds). */
struct hook {
	int (*sleep)(const char *, char *, size_t);
	int (*wake)(const char *, char *, size_t);
	int (*declare)(void *, size_t, const char *, int, uint64_t);
	int (*query)(struct kvdmabuf_preload_state *);
	long long (*calls)(const char *);
};

struct _test_data_eng;
static struct kvdmabuf_preload_state state(struct _test_data_eng *self);

FIXTURE(eng) {
	struct vp_end a, b;         /* a: the engine (rxe0), b: its peer */
	char *kv, *peerbuf, *other;  /* other: engine memory, not KV */
	struct ibv_mr *peer_mr;
	unsigned int base;          /* registrations before the test's */
	struct hook h;
};

FIXTURE_SETUP(eng)
{
	struct hook *h = &self->h;

	*(void **)&h->sleep = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_sleep");
	*(void **)&h->wake = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_wake");
	*(void **)&h->declare = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare");
	*(void **)&h->query = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_query");
	*(void **)&h->calls = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_calls");
	ASSERT_NE(NULL, (void *)h->sleep);
	ASSERT_NE(NULL, (void *)h->calls);
	if (vp_open(&self->a, vp_dev_name(0)) || vp_open(&self->b,
							 vp_dev_name(1)))
		SKIP(return, "verbs devices %s and %s not both present",
		     vp_dev_name(0), vp_dev_name(1));
	ASSERT_EQ(0, vp_connect(&self->a, &self->b));
	self->kv = mmap((void *)(uintptr_t)KV_ADDR, LEN, PROT_READ |
			PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
			MAP_FIXED_NOREPLACE, -1, 0);
	if (self->kv == MAP_FAILED)
		SKIP(return, "cannot map the KV memory at %#llx", KV_ADDR);
	memset(self->kv, 0x11, LEN);
	self->peerbuf = region_mem(LEN);
	ASSERT_NE(NULL, self->peerbuf);
	self->peer_mr = ibv_reg_mr(self->b.pd, self->peerbuf, LEN,
				   IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(NULL, self->peer_mr);
	self->other = region_mem(LEN);
	ASSERT_NE(NULL, self->other);
	self->base = state(self).nr_mrs;
	EXPECT_EQ(0u, state(self).nr_in_regions);
}

FIXTURE_TEARDOWN(eng)
{
	if (self->peer_mr)
		ibv_dereg_mr(self->peer_mr);
	vp_close(&self->b);
	vp_close(&self->a);
}

static struct ibv_mr *engine_reg(struct _test_data_eng *self, void *addr,
				 size_t len)
{
	return ibv_reg_mr(self->a.pd, addr, len, IBV_ACCESS_LOCAL_WRITE |
			  IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
}

/* The peer writes @seed's pattern at @dst through @rkey; 0 if it landed. */
static int peer_write(struct _test_data_eng *self, char *dst, uint32_t seed,
		      uint32_t rkey)
{
	pattern_fill(self->peerbuf, BLK, seed);
	if (vp_rdma(&self->b, IBV_WR_RDMA_WRITE, self->peerbuf, BLK,
		    self->peer_mr->lkey, (uint64_t)(uintptr_t)dst, rkey, NULL))
		return -EIO;
	return pattern_check(dst, BLK, seed) == -1 ? 0 : -EIO;
}

static struct kvdmabuf_preload_state state(struct _test_data_eng *self)
{
	struct kvdmabuf_preload_state st;

	memset(&st, 0, sizeof(st));
	self->h.query(&st);
	return st;
}

TEST_F(eng, memory_outside_regions_passes_through)
{
	struct ibv_mr *mr = engine_reg(self, self->other, BLK);
	char err[512];

	ASSERT_NE(NULL, mr);
	EXPECT_EQ(0, peer_write(self, self->other, 3, mr->rkey));
	EXPECT_EQ(self->base + 1, state(self).nr_mrs);
	EXPECT_EQ(0u, state(self).nr_in_regions);
	EXPECT_EQ(0, self->h.sleep("kv_cache", err, sizeof(err)));
	EXPECT_EQ(0, self->h.wake("kv_cache", err, sizeof(err)));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	EXPECT_EQ(self->base, state(self).nr_mrs);
}

TEST_F(eng, kv_registered_by_address_refuses_sleep_by_name)
{
	struct ibv_mr *mr = engine_reg(self, self->kv, LEN);
	char err[512], want[64];
	long pin;
	int rc;

	ASSERT_NE(NULL, mr);
	EXPECT_EQ(0, peer_write(self, self->kv, 1, mr->rkey));
	EXPECT_EQ(1u, state(self).nr_cannot_follow);
	pin = vmpin_kb();
	rc = self->h.sleep("kv_cache", err, sizeof(err));
	TH_LOG("%s", err);
	EXPECT_EQ(-EBUSY, rc);
	snprintf(want, sizeof(want), "engine MR 0x%x", mr->lkey);
	EXPECT_NE(NULL, strstr(err, want));
	snprintf(want, sizeof(want), "on NIC %s pins: cannot sleep "
		 "transparently", vp_dev_name(0));
	EXPECT_NE(NULL, strstr(err, want));
	/* nothing released: still pinned, still awake, same key works */
	EXPECT_EQ(pin, vmpin_kb());
	EXPECT_EQ(0u, state(self).nr_asleep);
	EXPECT_EQ(0, peer_write(self, self->kv + BLK, 2, mr->rkey));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	/* the engine dropped it: the region may sleep now */
	EXPECT_EQ(0, self->h.sleep("kv_cache", err, sizeof(err)));
	EXPECT_EQ(1u, state(self).nr_asleep);
	EXPECT_EQ(0, self->h.wake("kv_cache", err, sizeof(err)));
}

TEST_F(eng, every_registration_form_lands_in_the_interposer)
{
	static const char *const names[] = {
		"ibv_reg_mr@IBVERBS_1.1", "ibv_reg_mr_iova2@IBVERBS_1.8",
		"ibv_reg_mr_iova@IBVERBS_1.7", "ibv_reg_mr_iova2@IBVERBS_1.8",
	};
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *mr[4];
	long long before;
	unsigned int i;
	char *p;
	int drm, fd;

	for (i = 0; i < 4; i++) {
		p = self->kv + i * BLK;
		before = self->h.calls(names[i]);
		if (i == 0)
			mr[i] = ibv_reg_mr(self->a.pd, p, BLK, acc);
		else if (i == 1)
			mr[i] = ibv_reg_mr(self->a.pd, p, BLK, acc |
					   IBV_ACCESS_RELAXED_ORDERING);
		else if (i == 2)
			mr[i] = ibv_reg_mr_iova(self->a.pd, p, BLK,
						(uintptr_t)p, acc);
		else
			mr[i] = ibv_reg_mr_iova2(self->a.pd, p, BLK,
						 (uintptr_t)p, (unsigned)acc);
		ASSERT_NE(NULL, mr[i]);
		EXPECT_EQ(before + 1, self->h.calls(names[i]));
		EXPECT_EQ(0, peer_write(self, p, 10 + i, mr[i]->rkey));
	}
	EXPECT_EQ(4u, state(self).nr_cannot_follow);
	/*
	 * The engine's own dma-buf: in-tree rxe refuses it (nothing
	 * recorded); the dma-buf soft-RoCE of tests/rxe takes it (recorded),
	 * except under CONFIG_DMABUF_DEBUG, whose tables have no pages.
	 */
	drm = vgem_open();
	if (drm >= 0) {
		int refused = rxe_dmabuf_missing() != NULL;
		struct ibv_mr *dm;

		fd = vgem_dmabuf(drm, BLK);
		ASSERT_LE(0, fd);
		before = self->h.calls("ibv_reg_dmabuf_mr@IBVERBS_1.12");
		errno = 0;
		dm = ibv_reg_dmabuf_mr(self->a.pd, 0, BLK, KV_ADDR, fd, acc);
		EXPECT_EQ(before + 1,
			  self->h.calls("ibv_reg_dmabuf_mr@IBVERBS_1.12"));
		if (refused) {
			EXPECT_EQ(NULL, dm);
			EXPECT_EQ(EOPNOTSUPP, errno);
			EXPECT_EQ(self->base + 4, state(self).nr_mrs);
		} else {
			ASSERT_NE(NULL, dm);
			EXPECT_EQ(self->base + 5, state(self).nr_mrs);
			EXPECT_EQ(0, ibv_dereg_mr(dm));
		}
		close(fd);
		close(drm);
	}
	before = self->h.calls("ibv_dereg_mr@IBVERBS_1.1");
	for (i = 0; i < 4; i++)
		EXPECT_EQ(0, ibv_dereg_mr(mr[i]));
	EXPECT_EQ(before + 4, self->h.calls("ibv_dereg_mr@IBVERBS_1.1"));
	EXPECT_EQ(self->base, state(self).nr_mrs);
}

TEST_F(eng, region_declared_after_the_registration_refuses_too)
{
	char *buf = self->other, err[512];
	struct ibv_mr *mr = engine_reg(self, buf, BLK);

	ASSERT_NE(NULL, mr);
	EXPECT_EQ(0u, state(self).nr_in_regions);
	ASSERT_EQ(0, self->h.declare(buf, BLK, "late", -1, 0));
	EXPECT_EQ(1u, state(self).nr_cannot_follow);
	EXPECT_EQ(-EBUSY, self->h.sleep("late", err, sizeof(err)));
	TH_LOG("%s", err);
	EXPECT_NE(NULL, strstr(err, "registered before KV region 'late'"));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
}

/* The sleep hooks use libkvdmabuf on the same memory: its own sleep asks
 * the preload, and its own MRs are not the engine's. */
TEST_F(eng, library_sleep_refused_while_the_engine_holds_an_mr)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region_info in;
	struct kvdmabuf_region *r;
	struct kvdmabuf_ctx *ctx;
	struct ibv_mr *mr;
	char yaml[128], err[512];
	const char *cfg;
	int rc;

	snprintf(yaml, sizeof(yaml), "protocol: rdma\nnics: [%s]\n"
		 "drain_timeout_s: 5\n", vp_dev_name(0));
	cfg = write_config(yaml);
	ASSERT_NE(NULL, cfg);
	o.config_path = cfg;
	rc = kvdmabuf_open(&o, &ctx, err, sizeof(err));
	unlink(cfg);
	if (rc)
		TH_LOG("%s", err);
	ASSERT_EQ(0, rc);
	d.addr = self->kv;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
	d.tag = "kv_cache";
	ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &r));
	/* the library's own MR is not the engine's */
	EXPECT_EQ(self->base, state(self).nr_mrs);
	mr = engine_reg(self, self->kv, LEN);
	ASSERT_NE(NULL, mr);
	rc = kvdmabuf_sleep(ctx, "kv_cache");
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	EXPECT_EQ(-EBUSY, rc);
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(ctx),
			       "pins: cannot sleep transparently"));
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(0, in.asleep);
	EXPECT_EQ(0, kvdmabuf_region_keys(r, 0, NULL, NULL, NULL));
	EXPECT_EQ(0, kvdmabuf_io_begin(r));
	kvdmabuf_io_end(r);
	EXPECT_EQ(0, peer_write(self, self->kv, 5, mr->rkey));
	/* the engine's MR gone: the library sleeps and wakes as ever */
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	EXPECT_EQ(0, kvdmabuf_sleep(ctx, "kv_cache"));
	ASSERT_EQ(0, remap_fresh(self->kv, LEN));
	EXPECT_EQ(0, kvdmabuf_wake(ctx, "kv_cache"));
	EXPECT_EQ(self->base, state(self).nr_mrs);
	EXPECT_EQ(0, kvdmabuf_close(ctx));
}

TEST_HARNESS_MAIN
