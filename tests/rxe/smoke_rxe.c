// SPDX-License-Identifier: GPL-2.0
/*
 * smoke_rxe: two verbs devices come up (rxe0/rxe1 in the VM, any pair named
 * by KVDMABUF_IBDEV_A/B elsewhere) and RC RDMA write and read between them
 * move exactly the right bytes, to the right place, with the right keys.
 */
#include <sys/mman.h>

#include "harness.h"
#include "verbs_pair.h"
#include "vgem.h"

#define LEN (256u << 10)

FIXTURE(pair) {
	struct vp_end a, b;
	void *abuf, *bbuf;
	struct ibv_mr *amr, *bmr;
};

FIXTURE_SETUP(pair)
{
	const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			IBV_ACCESS_REMOTE_READ;

	if (vp_open(&self->a, vp_dev_name(0)))
		SKIP(return, "no verbs device %s", vp_dev_name(0));
	if (vp_open(&self->b, vp_dev_name(1)))
		SKIP(return, "no verbs device %s", vp_dev_name(1));
	ASSERT_EQ(0, vp_connect(&self->a, &self->b));
	self->abuf = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	self->bbuf = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, self->abuf);
	ASSERT_NE(MAP_FAILED, self->bbuf);
	self->amr = ibv_reg_mr(self->a.pd, self->abuf, LEN, acc);
	self->bmr = ibv_reg_mr(self->b.pd, self->bbuf, LEN, acc);
	ASSERT_NOT_NULL(self->amr);
	ASSERT_NOT_NULL(self->bmr);
}

FIXTURE_TEARDOWN(pair)
{
	if (self->amr)
		ibv_dereg_mr(self->amr);
	if (self->bmr)
		ibv_dereg_mr(self->bmr);
	vp_close(&self->a);
	vp_close(&self->b);
}

/* A write lands at the remote offset and nowhere else. */
TEST_F(pair, rdma_write_moves_the_bytes)
{
	char *b = self->bbuf;

	pattern_fill(self->abuf, LEN, 42);
	memset(b, 0xee, LEN);
	ASSERT_EQ(0, vp_rdma(&self->a, IBV_WR_RDMA_WRITE, self->abuf, LEN / 2,
			     self->amr->lkey, (uintptr_t)b + 4096,
			     self->bmr->rkey, NULL));
	EXPECT_EQ(-1, pattern_check(b + 4096, LEN / 2, 42));
	EXPECT_EQ(0xee, (unsigned char)b[4095]);
	EXPECT_EQ(0xee, (unsigned char)b[4096 + LEN / 2]);
}

/* A read brings the remote bytes back. */
TEST_F(pair, rdma_read_moves_the_bytes)
{
	pattern_fill(self->bbuf, LEN, 43);
	memset(self->abuf, 0, LEN);
	ASSERT_EQ(0, vp_rdma(&self->a, IBV_WR_RDMA_READ, self->abuf, LEN,
			     self->amr->lkey, (uintptr_t)self->bbuf,
			     self->bmr->rkey, NULL));
	EXPECT_EQ(-1, pattern_check(self->abuf, LEN, 43));
}

/* A wrong rkey is refused by the responder: keys are really checked. */
TEST_F(pair, wrong_rkey_fails)
{
	enum ibv_wc_status st = IBV_WC_SUCCESS;

	EXPECT_EQ(-EIO, vp_rdma(&self->a, IBV_WR_RDMA_WRITE, self->abuf, 4096,
				self->amr->lkey, (uintptr_t)self->bbuf,
				self->bmr->rkey ^ 0x100, &st));
	EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, st);
}

TEST_HARNESS_MAIN
