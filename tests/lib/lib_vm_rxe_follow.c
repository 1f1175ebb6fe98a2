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
 */
#include <sys/mman.h>
#include <sys/utsname.h>

#include "harness.h"
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
	char *peerbuf;
	struct ibv_mr *peer_mr;
	char cfg[64];
};

FIXTURE_SETUP(rf)
{
	struct kvdmabuf_options o = { 0 };
	struct ibv_pd *pds[1];
	char yaml[256], err[512];
	int rc;

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
	o.config_path = write_config(yaml);
	ASSERT_NE(NULL, o.config_path);
	snprintf(self->cfg, sizeof(self->cfg), "%s", o.config_path);
	pds[0] = self->a.pd;	/* the transfer engine's own PD */
	o.pds = pds;
	o.nr_pds = 1;
	rc = kvdmabuf_open(&o, &self->ctx, err, sizeof(err));
	if (rc)
		TH_LOG("%s", err);
	ASSERT_EQ(0, rc);
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
}

/* The peer's RDMA op of BLK bytes at the region's @addr through @rkey. */
static int peer_op(struct _test_data_rf *self, enum ibv_wr_opcode op,
		   const char *addr, uint32_t rkey, enum ibv_wc_status *st)
{
	return vp_rdma(&self->b, op, self->peerbuf, BLK, self->peer_mr->lkey,
		       (uint64_t)(uintptr_t)addr, rkey, st);
}

TEST_F_TIMEOUT(rf, drm_region_follows_on_real_verbs, 120)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region_info in;
	struct kvdmabuf_region *r;
	uint32_t lkey0, rkey0, lkey, rkey, h = 0;
	enum ibv_wc_status st;
	uint64_t gen;
	char *addr;
	int cycle, rc;
	long i;

	ASSERT_EQ(0, vgem_create(self->drm, LEN, &h));
	addr = vgem_map(self->drm, h, LEN, NULL);
	ASSERT_NE(NULL, addr);
	pattern_fill(addr, LEN, 500);
	d.addr = addr;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_DRM;
	d.drm_fd = self->drm;
	d.drm_handle = h;
	d.tag = "kv_cache";
	rc = kvdmabuf_region_add(self->ctx, &d, &r);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	ASSERT_EQ(0, rc);
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(KVDMABUF_MODE_FOLLOW, in.mode);
	EXPECT_EQ(1, in.proxied);
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &lkey0, &rkey0, &gen));

	/* Block 3 of the region, by the engine's address and the rkey. */
	ASSERT_EQ(0, peer_op(self, IBV_WR_RDMA_READ, addr + 3 * BLK, rkey0,
			     NULL));
	EXPECT_EQ(0, memcmp(self->peerbuf, addr + 3 * BLK, BLK));
	pattern_fill(self->peerbuf, BLK, 501);
	ASSERT_EQ(0, peer_op(self, IBV_WR_RDMA_WRITE, addr + 5 * BLK, rkey0,
			     NULL));
	EXPECT_EQ(-1, pattern_check(addr + 5 * BLK, BLK, 501));

	for (cycle = 1; cycle <= 3; cycle++) {
		uint32_t seed = 600 + (uint32_t)cycle;

		rc = kvdmabuf_sleep(self->ctx, NULL);
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		ASSERT_EQ(0, rc);
		/* Asleep: the peer's read fails, no old byte arrives. */
		memset(self->peerbuf, 0, BLK);
		st = IBV_WC_SUCCESS;
		EXPECT_EQ(-EIO, peer_op(self, IBV_WR_RDMA_READ, addr, rkey0,
					&st));
		EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, st);
		for (i = 0; i < (long)BLK && !self->peerbuf[i]; i++)
			;
		EXPECT_EQ((long)BLK, i);
		/* The error ended both QPs: a new pair, as a peer would. */
		ibv_dereg_mr(self->peer_mr);
		self->peer_mr = NULL;
		vp_close(&self->b);
		ASSERT_EQ(0, vp_open(&self->b, vp_dev_name(1)));
		self->peer_mr = ibv_reg_mr(self->b.pd, self->peerbuf, LEN,
					   IBV_ACCESS_LOCAL_WRITE);
		ASSERT_NE(NULL, self->peer_mr);
		ASSERT_EQ(0, vp_new_qp(&self->a));
		ASSERT_EQ(0, vp_connect(&self->a, &self->b));

		/* The engine frees its memory and maps new memory there. */
		munmap(addr, LEN);
		vgem_close_handle(self->drm, h);
		ASSERT_EQ(0, vgem_create(self->drm, LEN, &h));
		ASSERT_EQ(addr, vgem_map(self->drm, h, LEN, addr));
		pattern_fill(addr, LEN, seed);
		ASSERT_EQ(0, kvdmabuf_region_set_drm_handle(r, self->drm, h));
		rc = kvdmabuf_wake(self->ctx, NULL);
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		ASSERT_EQ(0, rc);

		/* Same keys; the peer's old rkey reaches the new pages. */
		ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &lkey, &rkey, &gen));
		EXPECT_EQ(lkey0, lkey);
		EXPECT_EQ(rkey0, rkey);
		ASSERT_EQ(0, peer_op(self, IBV_WR_RDMA_READ, addr + 7 * BLK,
				     rkey0, NULL));
		EXPECT_EQ(0, memcmp(self->peerbuf, addr + 7 * BLK, BLK));
		EXPECT_EQ(-1, pattern_check(addr, LEN, seed));
		pattern_fill(self->peerbuf, BLK, seed + 50);
		ASSERT_EQ(0, peer_op(self, IBV_WR_RDMA_WRITE, addr + 2 * BLK,
				     rkey0, NULL));
		EXPECT_EQ(-1, pattern_check(addr + 2 * BLK, BLK, seed + 50));
	}

	/* A foreign key (the peer's own MR) is refused by the NIC. */
	st = IBV_WC_SUCCESS;
	EXPECT_EQ(-EIO, peer_op(self, IBV_WR_RDMA_READ, addr,
				self->peer_mr->rkey, &st));
	EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, st);

	EXPECT_EQ(0, kvdmabuf_region_remove(r));
	munmap(addr, LEN);
	vgem_close_handle(self->drm, h);
}

TEST_HARNESS_MAIN
