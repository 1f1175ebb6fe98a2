// SPDX-License-Identifier: MIT
/*
 * lib_vm_rxe_follow - the library's public path on a real NIC that follows
 * moves, with no test callback: kvdmabuf_open() on soft-RoCE with dma-buf
 * MRs (tests/rxe, rxe0), a vgem region (KVDMABUF_MEM_DRM) behind a proxy,
 * registered with ibv_reg_dmabuf_mr(); the mode measured is FOLLOW. The
 * peer (rxe1) reads and writes the region through RC queue pairs with the
 * rkey published once; across sleep (the peer's read completes in error,
 * no old byte) and wake (new vgem memory at the same address) the keys do
 * not change and the same rkey reaches the new pages. Addresses are the
 * engine's own (iova = the region's address), so an offset/iova mix-up in
 * the library's registration reads the wrong bytes here.
 * The same NIC in its pinned mode (rdma_rxe's dmabuf_pinned, as efa and
 * bnxt_re pin): the mode measured is REREGISTER; sleep deregisters the MR
 * and revokes the proxy (nothing holds the old buffer, nothing pinned), the
 * old rkey is refused; wake registers the new buffer with a new rkey, which
 * the key-change callback republishes and which reads the new bytes.
 * With prefetch_at_wake the NIC maps the new memory during the wake.
 */
#include <sys/mman.h>
#include <sys/utsname.h>

#include "harness.h"
#include "proxy_common.h"
#include "lib_fake.h"
#include "rxe_env.h"
#include "verbs_pair.h"
#include "vgem.h"
#include "../uapi/kvdmabuf.h"

#define LEN (256u << 10)
#define BLK 4096u

FIXTURE(rf) {
	struct vp_end a, b;	/* a: the engine's NIC (rxe0), b: the peer */
	struct kvdmabuf_ctx *ctx;
	int drm;
	int pinned;		/* dmabuf_pinned set: back to 0 at teardown */
	char *peerbuf;
	struct ibv_mr *peer_mr;
	char cfg[64];
	/* key-change callbacks, and the rkey the last one could publish */
	unsigned int key_calls;
	int key_rc;
	uint32_t key_rkey;
};

FIXTURE_SETUP(rf)
{
	char yaml[256];
	const char *path;

	self->drm = -1;
	if (rxe_dmabuf_missing())
		SKIP(return, "%s", rxe_dmabuf_missing());
	if (access(KVDMABUF_DEVICE_PATH, F_OK))
		SKIP(return, "%s absent (module not loaded)",
		     KVDMABUF_DEVICE_PATH);
	self->drm = vgem_open();
	if (self->drm < 0)
		SKIP(return, "no vgem device");
	ASSERT_EQ(0, vp_open(&self->a, vp_dev_name(0)));
	ASSERT_EQ(0, vp_open(&self->b, vp_dev_name(1)));
	ASSERT_EQ(0, vp_connect(&self->a, &self->b));
	self->peerbuf = region_mem(LEN);
	ASSERT_NE(NULL, self->peerbuf);
	self->peer_mr = ibv_reg_mr(self->b.pd, self->peerbuf, LEN,
				   IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(NULL, self->peer_mr);

	snprintf(yaml, sizeof(yaml), "protocol: rdma\nnics: [%s]\n"
		 "module: require\ndrain_timeout_s: 5\n", vp_dev_name(0));
	path = write_config(yaml);
	ASSERT_NE(NULL, path);
	snprintf(self->cfg, sizeof(self->cfg), "%s", path);
}

FIXTURE_TEARDOWN(rf)
{
	if (self->ctx)
		kvdmabuf_close(self->ctx);
	if (self->peer_mr)
		ibv_dereg_mr(self->peer_mr);
	vp_close(&self->b);
	vp_close(&self->a);
	if (self->drm >= 0)
		close(self->drm);
	if (self->cfg[0])
		unlink(self->cfg);
	if (self->pinned)
		rxe_set_pinned(0);
}

/* The engine's key-change callback: the rkey it would republish. */
static void on_keys(struct kvdmabuf_region *const *regions, unsigned int n,
		    void *arg)
{
	struct _test_data_rf *self = arg;
	uint32_t lkey;

	self->key_calls++;
	self->key_rkey = 0;
	self->key_rc = n != 1 ? -E2BIG :
		kvdmabuf_region_keys(regions[0], 0, &lkey, &self->key_rkey,
				     NULL);
}

/*
 * kvdmabuf_open() on rxe0 with the engine's PD. @pinned: rxe pins the
 * dma-buf MRs registered from now on (dmabuf_pinned=1, the teardown sets
 * it back).
 */
static void rf_open(struct __test_metadata *_metadata,
		    struct _test_data_rf *self, int pinned)
{
	struct kvdmabuf_options o = { 0 };
	struct ibv_pd *pds[1] = { self->a.pd };	/* the engine's own PD */
	char err[512];
	int rc;

	if (pinned) {
		self->pinned = 1;
		ASSERT_EQ(0, rxe_set_pinned(1));
	}
	o.config_path = self->cfg;
	o.pds = pds;
	o.nr_pds = 1;
	o.key_change = on_keys;
	o.key_change_arg = self;
	rc = kvdmabuf_open(&o, &self->ctx, err, sizeof(err));
	if (rc)
		TH_LOG("%s", err);
	ASSERT_EQ(0, rc);
}

/* The peer's RDMA op of BLK bytes at the region's @addr through @rkey. */
static int peer_op(struct _test_data_rf *self, enum ibv_wr_opcode op,
		   const char *addr, uint32_t rkey, enum ibv_wc_status *st)
{
	return vp_rdma(&self->b, op, self->peerbuf, BLK, self->peer_mr->lkey,
		       (uint64_t)(uintptr_t)addr, rkey, st);
}

/*
 * The peer's RDMA READ at @addr through @rkey is refused by the engine's
 * NIC: a remote access error, no byte delivered. The error ended both QPs:
 * a new pair, as a peer would.
 */
static void peer_refused(struct __test_metadata *_metadata,
			 struct _test_data_rf *self, const char *addr,
			 uint32_t rkey)
{
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	long i;

	memset(self->peerbuf, 0, BLK);
	EXPECT_EQ(-EIO, peer_op(self, IBV_WR_RDMA_READ, addr, rkey, &st));
	EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, st);
	for (i = 0; i < (long)BLK && !self->peerbuf[i]; i++)
		;
	EXPECT_EQ((long)BLK, i);
	ibv_dereg_mr(self->peer_mr);
	self->peer_mr = NULL;
	vp_close(&self->b);
	ASSERT_EQ(0, vp_open(&self->b, vp_dev_name(1)));
	self->peer_mr = ibv_reg_mr(self->b.pd, self->peerbuf, LEN,
				   IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(NULL, self->peer_mr);
	ASSERT_EQ(0, vp_new_qp(&self->a));
	ASSERT_EQ(0, vp_connect(&self->a, &self->b));
}

/*
 * Through @rkey the peer reads the region's block 3 (the engine's bytes,
 * pattern @seed everywhere) and writes block 5, which the engine sees.
 */
static void peer_reads_writes(struct __test_metadata *_metadata,
			      struct _test_data_rf *self, char *addr,
			      uint32_t rkey, uint32_t seed)
{
	ASSERT_EQ(0, peer_op(self, IBV_WR_RDMA_READ, addr + 3 * BLK, rkey,
			     NULL));
	EXPECT_EQ(0, memcmp(self->peerbuf, addr + 3 * BLK, BLK));
	EXPECT_EQ(-1, pattern_check(addr, LEN, seed));
	pattern_fill(self->peerbuf, BLK, seed + 50);
	ASSERT_EQ(0, peer_op(self, IBV_WR_RDMA_WRITE, addr + 5 * BLK, rkey,
			     NULL));
	EXPECT_EQ(-1, pattern_check(addr + 5 * BLK, BLK, seed + 50));
}

/* A vgem buffer of LEN bytes, @seed's pattern, mapped at @addr (NULL:
 * anywhere); its handle in *@h. */
static char *rf_vgem(struct __test_metadata *_metadata,
		     struct _test_data_rf *self, char *addr, uint32_t seed,
		     uint32_t *h)
{
	char *p;

	ASSERT_EQ(0, vgem_create(self->drm, LEN, h));
	p = vgem_map(self->drm, *h, LEN, addr);
	ASSERT_NE(NULL, p);
	if (addr)
		ASSERT_EQ(addr, p);
	pattern_fill(p, LEN, seed);
	return p;
}

/* A vgem buffer added as a DRM region through the library's public path,
 * measured in @mode; its address in *@addr, its handle in *@h. */
static struct kvdmabuf_region *rf_add(struct __test_metadata *_metadata,
				      struct _test_data_rf *self, int mode,
				      char **addr, uint32_t *h)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region_info in;
	struct kvdmabuf_region *r;
	int rc;

	*addr = rf_vgem(_metadata, self, NULL, 500, h);
	d.addr = *addr;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_DRM;
	d.drm_fd = self->drm;
	d.drm_handle = *h;
	d.tag = "kv_cache";
	rc = kvdmabuf_region_add(self->ctx, &d, &r);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	ASSERT_EQ(0, rc);
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(mode, in.mode);
	EXPECT_EQ(1, in.proxied);
	return r;
}

static void rf_remove(struct __test_metadata *_metadata,
		      struct _test_data_rf *self, struct kvdmabuf_region *r,
		      char *addr, uint32_t h)
{
	EXPECT_EQ(0, kvdmabuf_region_remove(r));
	munmap(addr, LEN);
	vgem_close_handle(self->drm, h);
}

static void rf_sleep(struct __test_metadata *_metadata,
		     struct _test_data_rf *self)
{
	int rc = kvdmabuf_sleep(self->ctx, NULL);

	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	ASSERT_EQ(0, rc);
}

/* The engine frees its buffer, maps a new one (@seed) at @addr, wakes. */
static void rf_remap_wake(struct __test_metadata *_metadata,
			  struct _test_data_rf *self,
			  struct kvdmabuf_region *r, char *addr, uint32_t seed,
			  uint32_t *h)
{
	int rc;

	munmap(addr, LEN);
	vgem_close_handle(self->drm, *h);
	rf_vgem(_metadata, self, addr, seed, h);
	ASSERT_EQ(0, kvdmabuf_region_set_drm_handle(r, self->drm, *h));
	rc = kvdmabuf_wake(self->ctx, NULL);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	ASSERT_EQ(0, rc);
}

/* The module's view of the region's proxy. */
static void rf_query(struct __test_metadata *_metadata,
		     struct _test_data_rf *self, struct kvdmabuf_region *r,
		     struct kvdmabuf_query *q)
{
	ASSERT_EQ(0, kvd_query(self->ctx->module_fd, r->proxy_fd, q));
}

TEST_F_TIMEOUT(rf, drm_region_follows_on_real_verbs, 120)
{
	struct kvdmabuf_region *r;
	uint32_t lkey0, rkey0, lkey, rkey, h = 0;
	uint64_t gen;
	char *addr;
	int cycle;

	rf_open(_metadata, self, 0);
	r = rf_add(_metadata, self, KVDMABUF_MODE_FOLLOW, &addr, &h);
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &lkey0, &rkey0, &gen));
	/* By the engine's addresses and the rkey. */
	peer_reads_writes(_metadata, self, addr, rkey0, 500);

	for (cycle = 1; cycle <= 3; cycle++) {
		uint32_t seed = 600 + (uint32_t)cycle;

		rf_sleep(_metadata, self);
		/* Asleep: the peer's read fails, no old byte arrives. */
		peer_refused(_metadata, self, addr, rkey0);
		rf_remap_wake(_metadata, self, r, addr, seed, &h);
		/* Same keys; the peer's old rkey reaches the new pages. */
		ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &lkey, &rkey, &gen));
		EXPECT_EQ(lkey0, lkey);
		EXPECT_EQ(rkey0, rkey);
		peer_reads_writes(_metadata, self, addr, rkey0, seed);
	}
	/* The keys never changed: no key-change callback. */
	EXPECT_EQ(0u, self->key_calls);

	/* A foreign key (the peer's own MR) is refused by the NIC. */
	peer_refused(_metadata, self, addr, self->peer_mr->rkey);

	rf_remove(_metadata, self, r, addr, h);
}

/*
 * prefetch_at_wake: on, the library asks rxe0 to map the region's new
 * memory before the wake returns (ibv_advise_mr; tests/rxe's advise_mr):
 * the proxy counts rxe's mapping before any transfer, the peer reads the
 * new bytes through the same rkey, and the state counts the prefetches,
 * none refused. Off (the default), the mapping waits for the first access.
 */
TEST_F_TIMEOUT(rf, prefetch_at_wake_maps_before_the_first_transfer, 120)
{
	struct kvdmabuf_region *r;
	struct kvdmabuf_state st;
	struct kvdmabuf_query q;
	uint32_t rkey0, rkey, h = 0;
	char *addr;
	FILE *f;
	int on;

	for (on = 0; on < 2; on++) {
		if (on) {
			f = fopen(self->cfg, "a");
			ASSERT_NE(NULL, f);
			fputs("prefetch_at_wake: on\n", f);
			ASSERT_EQ(0, fclose(f));
		}
		rf_open(_metadata, self, 0);
		r = rf_add(_metadata, self, KVDMABUF_MODE_FOLLOW, &addr, &h);
		ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, NULL, &rkey0, NULL));
		rf_sleep(_metadata, self);
		rf_remap_wake(_metadata, self, r, addr, 700 + on, &h);
		rf_query(_metadata, self, r, &q);
		EXPECT_EQ((uint32_t)on, q.live_mappings);
		ASSERT_EQ(0, kvdmabuf_query(self->ctx, &st));
		EXPECT_EQ((uint64_t)on, st.prefetches);
		EXPECT_EQ(0u, st.prefetch_failures);
		ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, NULL, &rkey, NULL));
		EXPECT_EQ(rkey0, rkey);
		peer_reads_writes(_metadata, self, addr, rkey0, 700 + on);
		rf_query(_metadata, self, r, &q);
		EXPECT_EQ(1u, q.live_mappings);
		rf_remove(_metadata, self, r, addr, h);
		kvdmabuf_close(self->ctx);
		self->ctx = NULL;
	}
}

/*
 * The pinned variant of the same NIC (dmabuf_pinned=1, as efa and bnxt_re
 * pin): the module sees rxe's pin, so the region is REREGISTER; sleep
 * deregisters and revokes (nothing of the old buffer held or pinned, the
 * old rkey refused), wake registers the new buffer under a new rkey that
 * the key-change callback hands the engine and that reads the new bytes.
 */
TEST_F_TIMEOUT(rf, pinned_drm_region_reregisters, 120)
{
	struct kvdmabuf_region_info in;
	struct kvdmabuf_query q;
	struct kvdmabuf_region *r;
	uint32_t lkey, rkey, old, h = 0;
	uint64_t gen, old_gen;
	unsigned int calls;
	char *addr;
	int cycle;

	rf_open(_metadata, self, 1);
	r = rf_add(_metadata, self, KVDMABUF_MODE_REREGISTER, &addr, &h);
	rf_query(_metadata, self, r, &q);
	EXPECT_EQ(1u, q.pinned_importers);	/* rxe's MR */
	EXPECT_EQ(0u, q.dynamic_importers);
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &lkey, &rkey, &gen));
	peer_reads_writes(_metadata, self, addr, rkey, 500);

	for (cycle = 1; cycle <= 2; cycle++) {
		uint32_t seed = 700 + (uint32_t)cycle;

		old = rkey;
		old_gen = gen;
		calls = self->key_calls;
		rf_sleep(_metadata, self);
		/* The MR is gone (no keys until the wake publishes new
		 * ones), the proxy revoked: nothing holds or pins the old
		 * buffer. */
		EXPECT_EQ(calls, self->key_calls);
		EXPECT_EQ(-ENOENT, kvdmabuf_region_keys(r, 0, &lkey, &rkey,
							NULL));
		rf_query(_metadata, self, r, &q);
		EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
		EXPECT_EQ(0u, q.pinned_importers);
		EXPECT_EQ(0u, q.dynamic_importers);
		EXPECT_EQ(0u, q.backing_attachments);
		EXPECT_EQ(0u, q.stale_backings);
		EXPECT_EQ(0u, q.live_mappings);
		/* The peer's old rkey is refused. */
		peer_refused(_metadata, self, addr, old);

		rf_remap_wake(_metadata, self, r, addr, seed, &h);
		/* A new rkey, published by the callback, reads the new
		 * bytes; the old one stays refused. */
		ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &lkey, &rkey, &gen));
		EXPECT_NE(old, rkey);
		EXPECT_LT(old_gen, gen);
		EXPECT_EQ(calls + 1, self->key_calls);
		EXPECT_EQ(0, self->key_rc);
		EXPECT_EQ(rkey, self->key_rkey);
		ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
		EXPECT_EQ(KVDMABUF_MODE_REREGISTER, in.mode);
		rf_query(_metadata, self, r, &q);
		EXPECT_EQ(1u, q.pinned_importers);
		peer_reads_writes(_metadata, self, addr, rkey, seed);
		peer_refused(_metadata, self, addr, old);
	}

	rf_remove(_metadata, self, r, addr, h);
}

TEST_HARNESS_MAIN
