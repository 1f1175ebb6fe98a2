// SPDX-License-Identifier: GPL-2.0
/*
 * rxe_dmabuf: soft-RoCE with dma-buf memory regions (tests/rxe: our rxe
 * patch series and rdma-core provider patch, loaded in the VM in place of
 * the in-tree rdma_rxe). Real verbs, real keys, a real wire (rxe0 and rxe1
 * on a veth pair): ibv_reg_dmabuf_mr() of vgem buffers and of kvdmabuf
 * proxies, RDMA WRITE and READ through RC queue pairs, the responder (the
 * remote MR) and the requester and completer (a local MR) both on dma-buf
 * pages. A proxy's backing is swapped and the same rkey reads the new
 * bytes; a revoked proxy gives a completion error, never old bytes; the
 * pinned mode (rdma_rxe's dmabuf_pinned parameter) makes a swap fail
 * cleanly with EBUSY. ATOMIC WRITE and compare-and-swap follow the swap
 * and fail while revoked as well; ibv_advise_mr() prefetch maps the new
 * backing before the first access. Under traffic (a thread reading and writing through
 * the rkey without pause), no byte moves to or from a backing once the
 * swap or revoke that let it go has returned: the test poisons it then.
 */
#include <linux/udmabuf.h>
#include <pthread.h>
#include <stdbool.h>
#include <rdma/ib_user_verbs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/utsname.h>

#include "harness.h"
#include "proxy_common.h"
#include "rxe_env.h"
#include "verbs_pair.h"

#define LEN	(64u << 10)
#define ACC	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		 IBV_ACCESS_REMOTE_READ)
/* An I/O virtual address with nothing to do with the buffer's offset. */
#define IOVA	0x5a5a000000ull

FIXTURE(rxe) {
	struct vp_end a, b;
	int drm, dev;
	void *abuf;		/* A's host memory, the other end of each op */
	struct ibv_mr *amr;
};

FIXTURE_SETUP(rxe)
{
	self->drm = self->dev = -1;
	if (rxe_dmabuf_missing())
		SKIP(return, "%s", rxe_dmabuf_missing());
	ASSERT_EQ(0, rxe_set_pinned(0));
	ASSERT_EQ(0, vp_open(&self->a, vp_dev_name(0)));
	ASSERT_EQ(0, vp_open(&self->b, vp_dev_name(1)));
	ASSERT_EQ(0, vp_connect(&self->a, &self->b));
	KVD_OPEN_VGEM(self->drm);
	self->abuf = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, self->abuf);
	self->amr = ibv_reg_mr(self->a.pd, self->abuf, LEN, ACC);
	ASSERT_NOT_NULL(self->amr);
}

FIXTURE_TEARDOWN(rxe)
{
	if (self->amr)
		ibv_dereg_mr(self->amr);
	vp_close(&self->a);
	vp_close(&self->b);
	kvd_close(&self->drm);
	kvd_close(&self->dev);
	rxe_set_pinned(0);
}

/*
 * A proxy of LEN backed by @backing at @offset, and B's dma-buf MR on it
 * (IOVA, ACC): 0 with *@proxy and *@mr set, or -errno, said in the log.
 */
static int proxy_mr(struct __test_metadata *_metadata,
		    FIXTURE_DATA(rxe) *self, int backing, uint64_t offset,
		    int *proxy, struct ibv_mr **mr)
{
	int ret;

	*mr = NULL;
	*proxy = kvd_create(self->dev, LEN, NULL);
	if (*proxy < 0)
		return *proxy;
	ret = kvd_attach(self->dev, *proxy, backing, offset);
	if (ret)
		return ret;
	*mr = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, *proxy, ACC);
	if (!*mr) {
		ret = -errno;
		TH_LOG("ibv_reg_dmabuf_mr: %s", strerror(errno));
		return ret;
	}
	return 0;
}

/*
 * vgem buffers *@a and *@b of LEN (patterns @sa and @sb) and a proxy of
 * LEN backed by *@a: 0, or -errno with what was made closed.
 */
static int two_backings(FIXTURE_DATA(rxe) *self, uint32_t sa, uint32_t sb,
			int *a, int *b, int *proxy)
{
	int ret;

	*a = vgem_pattern_buf(self->drm, LEN, sa);
	*b = vgem_pattern_buf(self->drm, LEN, sb);
	*proxy = kvd_create(self->dev, LEN, NULL);
	ret = *a < 0 ? *a : *b < 0 ? *b : *proxy < 0 ? *proxy :
	      kvd_attach(self->dev, *proxy, *a, 0);
	if (ret) {
		kvd_close(proxy);
		kvd_close(a);
		kvd_close(b);
	}
	return ret;
}

/* A's RDMA op of @len bytes between abuf + @aoff and B's @iova (@rkey). */
#define OP(opc, aoff, len, iova, rkey, st)				\
	vp_rdma(&self->a, opc, (char *)self->abuf + (aoff), len,	\
		self->amr->lkey, iova, rkey, st)

/* The responder writes and reads a vgem buffer through its rkey. */
TEST_F(rxe, vgem_write_then_read)
{
	struct ibv_mr *mr;
	int fd = vgem_pattern_buf(self->drm, LEN, 7);

	ASSERT_GE(fd, 0);
	mr = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, fd, ACC);
	if (!mr)
		TH_LOG("ibv_reg_dmabuf_mr: %s", strerror(errno));
	ASSERT_NOT_NULL(mr);
	EXPECT_EQ(LEN, mr->length);

	memset(self->abuf, 0, LEN);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA,
			mr->rkey, NULL));
	EXPECT_EQ(-1, pattern_check(self->abuf, LEN, 7));

	pattern_fill(self->abuf, LEN, 8);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_WRITE, 0, LEN, IOVA,
			mr->rkey, NULL));
	EXPECT_EQ(1, dmabuf_equals(fd, 0, self->abuf, LEN));

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(fd);
}

/*
 * offset and iova are applied, not swapped: byte X of the MR (iova + X) is
 * byte offset + X of the buffer, and only those bytes change.
 */
TEST_F(rxe, offset_and_iova_are_honoured)
{
	const uint64_t off = 3 * KVD_PAGE + 256, len = 5 * KVD_PAGE;
	uint64_t iova = IOVA + 256;
	unsigned char *p;
	struct ibv_mr *mr;
	int fd = vgem_dmabuf(self->drm, LEN);

	ASSERT_GE(fd, 0);
	p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	memset(p, 0xee, LEN);
	mr = ibv_reg_dmabuf_mr(self->b.pd, off, len, iova, fd, ACC);
	if (!mr)
		TH_LOG("ibv_reg_dmabuf_mr: %s", strerror(errno));
	ASSERT_NOT_NULL(mr);

	pattern_fill(self->abuf, 2 * KVD_PAGE, 9);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_WRITE, 0, 2 * KVD_PAGE,
			iova + KVD_PAGE, mr->rkey, NULL));
	EXPECT_EQ(-1, pattern_check(p + off + KVD_PAGE, 2 * KVD_PAGE, 9));
	EXPECT_EQ(0xee, p[off + KVD_PAGE - 1]);
	EXPECT_EQ(0xee, p[off + 3 * KVD_PAGE]);

	/* Outside the MR (before iova, past its end): remote access error. */
	enum ibv_wc_status st = IBV_WC_SUCCESS;

	EXPECT_EQ(-EIO, OP(IBV_WR_RDMA_READ, 0, 64,
			   iova - 64, mr->rkey, &st));
	EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, st);

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(p, LEN);
	close(fd);
}

/* The requester and completer: A's local SGE is a dma-buf MR. */
TEST_F(rxe, local_dmabuf_mr)
{
	struct ibv_mr *lmr, *rmr;
	void *bbuf;
	int fd = vgem_pattern_buf(self->drm, LEN, 10);

	ASSERT_GE(fd, 0);
	lmr = ibv_reg_dmabuf_mr(self->a.pd, 0, LEN, IOVA, fd, ACC);
	if (!lmr)
		TH_LOG("ibv_reg_dmabuf_mr: %s", strerror(errno));
	ASSERT_NOT_NULL(lmr);
	bbuf = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, bbuf);
	rmr = ibv_reg_mr(self->b.pd, bbuf, LEN, ACC);
	ASSERT_NOT_NULL(rmr);

	/* WRITE: the requester copies from the dma-buf pages. */
	ASSERT_EQ(0, vp_rdma(&self->a, IBV_WR_RDMA_WRITE, (void *)IOVA, LEN,
			     lmr->lkey, (uintptr_t)bbuf, rmr->rkey, NULL));
	EXPECT_EQ(-1, pattern_check(bbuf, LEN, 10));

	/* READ: the completer copies the response into the dma-buf pages. */
	pattern_fill(bbuf, LEN, 11);
	ASSERT_EQ(0, vp_rdma(&self->a, IBV_WR_RDMA_READ, (void *)IOVA, LEN,
			     lmr->lkey, (uintptr_t)bbuf, rmr->rkey, NULL));
	EXPECT_EQ(1, dmabuf_equals(fd, 0, bbuf, LEN));

	EXPECT_EQ(0, ibv_dereg_mr(rmr));
	EXPECT_EQ(0, ibv_dereg_mr(lmr));
	munmap(bbuf, LEN);
	close(fd);
}

/*
 * FOLLOW: a proxy's backing is replaced, and the same rkey reads the new
 * backing's bytes and writes into the new backing.
 */
TEST_F(rxe, proxy_swap_same_rkey_new_bytes)
{
	struct ibv_mr *mr;
	int a, b, proxy;
	uint32_t rkey;

	KVD_OPEN_DEV(self->dev);
	a = vgem_pattern_buf(self->drm, LEN, 21);
	b = vgem_pattern_buf(self->drm, LEN, 22);
	ASSERT_GE(a, 0);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, proxy_mr(_metadata, self, a, 0, &proxy, &mr));
	rkey = mr->rkey;

	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA, rkey,
			NULL));
	EXPECT_EQ(-1, pattern_check(self->abuf, LEN, 21));

	ASSERT_EQ(0, kvd_replace(self->dev, proxy, b, 0));
	memset(self->abuf, 0, LEN);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA, rkey,
			NULL));
	EXPECT_EQ(-1, pattern_check(self->abuf, LEN, 22));

	/* A write lands in the new backing, not the old one. */
	pattern_fill(self->abuf, LEN, 23);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_WRITE, 0, LEN, IOVA, rkey,
			NULL));
	EXPECT_EQ(1, dmabuf_equals(b, 0, self->abuf, LEN));
	pattern_fill(self->abuf, LEN, 21);
	EXPECT_EQ(1, dmabuf_equals(a, 0, self->abuf, LEN));

	/* And back again, several times: the mapping is taken each time. */
	for (int i = 0; i < 4; i++) {
		int next = i % 2 ? b : a;
		uint32_t seed = 30 + i;
		void *p = mmap(NULL, LEN, PROT_WRITE, MAP_SHARED, next, 0);

		ASSERT_NE(MAP_FAILED, p);
		pattern_fill(p, LEN, seed);
		munmap(p, LEN);
		ASSERT_EQ(0, kvd_replace(self->dev, proxy, next, 0));
		ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN,
				IOVA, rkey, NULL));
		EXPECT_EQ(-1, pattern_check(self->abuf, LEN, seed));
	}

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(proxy);
	close(a);
	close(b);
}

/*
 * A revoked proxy: a read through the rkey completes with an error and
 * brings no byte of the old backing; a write changes nothing in it; a new
 * registration of the revoked proxy is refused.
 */
TEST_F(rxe, revoked_proxy_errors_not_old_bytes)
{
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	struct ibv_mr *mr;
	int a, proxy;
	long i;

	KVD_OPEN_DEV(self->dev);
	a = vgem_pattern_buf(self->drm, LEN, 41);
	ASSERT_GE(a, 0);
	ASSERT_EQ(0, proxy_mr(_metadata, self, a, 0, &proxy, &mr));
	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA,
			mr->rkey, NULL));
	EXPECT_EQ(-1, pattern_check(self->abuf, LEN, 41));

	ASSERT_EQ(0, kvd_revoke(self->dev, proxy, 2000));
	memset(self->abuf, 0, LEN);
	EXPECT_EQ(-EIO, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA,
			   mr->rkey, &st));
	EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, st);
	for (i = 0; i < (long)(LEN / 4); i++)
		if (((uint32_t *)self->abuf)[i])
			break;
	if (i != (long)(LEN / 4))
		TH_LOG("old bytes delivered at word %ld", i);
	EXPECT_EQ((long)(LEN / 4), i);

	/* Nothing to map: a new registration is refused. */
	EXPECT_NULL(ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, proxy, ACC));

	ASSERT_EQ(0, ibv_dereg_mr(mr));
	close(proxy);
	close(a);
}

/*
 * A's QP replaced by one of the extended post API that can send RDMA
 * ATOMIC WRITE, connected to a new QP of B.
 */
static int atomic_write_qps(struct vp_end *a, struct vp_end *b,
			    struct ibv_qp_ex **qpx)
{
	struct ibv_qp_init_attr_ex qpa = {
		.qp_type = IBV_QPT_RC, .send_cq = a->cq, .recv_cq = a->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD |
			     IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = a->pd,
		.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE,
	};
	int ret;

	if (ibv_destroy_qp(a->qp))
		return -errno;
	a->qp = ibv_create_qp_ex(a->ctx, &qpa);
	if (!a->qp)
		return -errno;
	*qpx = ibv_qp_to_qp_ex(a->qp);
	ret = vp_new_qp(b);
	return ret ? ret : vp_connect(a, b);
}

/* One signalled RDMA ATOMIC WRITE of @value to @remote (@rkey), waited for. */
static int atomic_write(struct vp_end *a, struct ibv_qp_ex *qpx,
			uint64_t remote, uint32_t rkey, uint64_t value,
			enum ibv_wc_status *status)
{
	int ret;

	ibv_wr_start(qpx);
	qpx->wr_id = 2;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(qpx, rkey, remote, &value);
	ret = ibv_wr_complete(qpx);
	return ret ? -ret : vp_wait(a, status);
}

/* The 8 bytes at @off of dma-buf @fd. */
static uint64_t dmabuf_u64(int fd, uint64_t off)
{
	uint64_t v = 0;
	char *p = mmap(NULL, off + sizeof(v), PROT_READ, MAP_SHARED, fd, 0);

	if (p != MAP_FAILED) {
		memcpy(&v, p + off, sizeof(v));
		munmap(p, off + sizeof(v));
	}
	return v;
}

/*
 * RDMA ATOMIC WRITE needs only remote write access and does not go
 * through rxe's copy path: through a dma-buf MR on a proxy it lands in the
 * current backing after a swap, never in the old one, and fails while the
 * proxy is revoked, both backings untouched.
 */
TEST_F(rxe, atomic_write_follows_the_swap_and_fails_while_revoked)
{
	const uint64_t v1 = 0x1111222233334444ull, v2 = 0x5555666677778888ull,
		       v3 = 0x99990000aaaabbbbull;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	uint64_t a16, a24, b24;
	struct ibv_qp_ex *qpx;
	struct ibv_mr *mr;
	int a, b, proxy;

	KVD_OPEN_DEV(self->dev);
	ASSERT_EQ(0, atomic_write_qps(&self->a, &self->b, &qpx));
	a = vgem_pattern_buf(self->drm, LEN, 51);
	b = vgem_pattern_buf(self->drm, LEN, 52);
	ASSERT_GE(a, 0);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, proxy_mr(_metadata, self, a, 0, &proxy, &mr));

	ASSERT_EQ(0, atomic_write(&self->a, qpx, IOVA + 8, mr->rkey, v1, &st));
	EXPECT_EQ(v1, dmabuf_u64(a, 8));

	a16 = dmabuf_u64(a, 16);
	ASSERT_EQ(0, kvd_replace(self->dev, proxy, b, 0));
	ASSERT_EQ(0, atomic_write(&self->a, qpx, IOVA + 16, mr->rkey, v2,
				  &st));
	EXPECT_EQ(v2, dmabuf_u64(b, 16));
	EXPECT_EQ(a16, dmabuf_u64(a, 16));

	a24 = dmabuf_u64(a, 24);
	b24 = dmabuf_u64(b, 24);
	ASSERT_EQ(0, kvd_revoke(self->dev, proxy, 2000));
	EXPECT_EQ(-EIO, atomic_write(&self->a, qpx, IOVA + 24, mr->rkey, v3,
				     &st));
	EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, st);
	EXPECT_EQ(a24, dmabuf_u64(a, 24));
	EXPECT_EQ(b24, dmabuf_u64(b, 24));

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(proxy);
	close(a);
	close(b);
}

/* The proxy's live mappings: rxe's kernel mapping of it counts as one. */
static uint32_t live_maps(struct __test_metadata *_metadata, int dev,
			  int proxy)
{
	struct kvdmabuf_query q;

	EXPECT_EQ(0, kvd_query(dev, proxy, &q));
	return q.live_mappings;
}

/* ibv_advise_mr() of one SGE over all of @mr: 0 or its errno. */
static int advise(struct ibv_mr *mr, enum ibv_advise_mr_advice advice,
		  uint64_t addr, uint32_t len)
{
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = mr->lkey };

	return ibv_advise_mr(mr->pd, advice, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
}

/*
 * ibv_advise_mr() PREFETCH_WRITE after a swap maps the new backing before
 * any access (the proxy counts rxe's mapping), so the first READ does not
 * pay for it (the library's prefetch at wake); a READ then brings the new
 * bytes. PREFETCH_NO_FAULT maps nothing; a range beyond the MR, write
 * prefetch of a read-only MR, and a revoked proxy are refused.
 */
TEST_F(rxe, prefetch_maps_the_new_backing_before_the_first_access)
{
	struct ibv_mr *mr, *ro;
	int a, b, proxy;

	KVD_OPEN_DEV(self->dev);
	a = vgem_pattern_buf(self->drm, LEN, 61);
	b = vgem_pattern_buf(self->drm, LEN, 62);
	ASSERT_GE(a, 0);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, proxy_mr(_metadata, self, a, 0, &proxy, &mr));

	ASSERT_EQ(0, kvd_replace(self->dev, proxy, b, 0));
	EXPECT_EQ(0, live_maps(_metadata, self->dev, proxy));
	EXPECT_EQ(0, advise(mr, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, IOVA,
			    LEN));
	EXPECT_EQ(0, live_maps(_metadata, self->dev, proxy));
	EXPECT_EQ(EINVAL, advise(mr, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
				 IOVA + 1, LEN));
	EXPECT_EQ(0, live_maps(_metadata, self->dev, proxy));
	ASSERT_EQ(0, advise(mr, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IOVA,
			    LEN));
	EXPECT_EQ(1, live_maps(_metadata, self->dev, proxy));
	memset(self->abuf, 0, LEN);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA, mr->rkey, NULL));
	EXPECT_EQ(-1, pattern_check(self->abuf, LEN, 62));

	/* Write prefetch needs local write access; read prefetch does not. */
	ro = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, proxy,
			       IBV_ACCESS_REMOTE_READ);
	ASSERT_NOT_NULL(ro);
	EXPECT_EQ(EPERM, advise(ro, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IOVA,
				LEN));
	EXPECT_EQ(0, advise(ro, IBV_ADVISE_MR_ADVICE_PREFETCH, IOVA, LEN));
	EXPECT_EQ(0, ibv_dereg_mr(ro));

	/* Revoked: nothing to map, nothing mapped. */
	ASSERT_EQ(0, kvd_revoke(self->dev, proxy, 2000));
	EXPECT_NE(0, advise(mr, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IOVA,
			    LEN));
	EXPECT_EQ(0, live_maps(_metadata, self->dev, proxy));

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(proxy);
	close(a);
	close(b);
}

/* Registering a revoked (or never backed) proxy fails: nothing to map. */
TEST_F(rxe, unbacked_proxy_refused)
{
	struct ibv_mr *mr;
	int proxy;

	KVD_OPEN_DEV(self->dev);
	proxy = kvd_create(self->dev, LEN, NULL);
	ASSERT_GE(proxy, 0);
	mr = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, proxy, ACC);
	EXPECT_NULL(mr);
	if (mr)
		ibv_dereg_mr(mr);
	close(proxy);
}

/*
 * A proxy over the second half of a larger backing: the MR reads and
 * writes those bytes through the exporter's mapping at the proxy's offset
 * (the page-list series refused this window, whose table the proxy hands
 * out as a copy without struct pages), and nothing of the first half.
 */
TEST_F(rxe, proxy_window_of_a_larger_backing)
{
	char *whole = malloc(2 * LEN);
	struct ibv_mr *mr;
	int a, proxy;

	ASSERT_NOT_NULL(whole);
	KVD_OPEN_DEV(self->dev);
	a = vgem_pattern_buf(self->drm, 2 * LEN, 51);
	ASSERT_GE(a, 0);
	ASSERT_EQ(0, proxy_mr(_metadata, self, a, LEN, &proxy, &mr));
	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA, mr->rkey, NULL));
	EXPECT_EQ(1, dmabuf_equals(a, LEN, self->abuf, LEN));
	EXPECT_EQ(0, dmabuf_equals(a, 0, self->abuf, LEN));
	pattern_fill(self->abuf, 4096, 53);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_WRITE, 0, 4096, IOVA + 4096, mr->rkey,
			NULL));
	EXPECT_EQ(1, dmabuf_equals(a, LEN + 4096, self->abuf, 4096));
	pattern_fill(whole, 2 * LEN, 51);
	EXPECT_EQ(1, dmabuf_equals(a, 0, whole, LEN));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(proxy);
	close(a);
	free(whole);
}

/* At least @n huge pages in the pool (best effort: the test skips without). */
static void huge_pages_at_least(long n)
{
	long have = 0;
	FILE *f = fopen("/proc/sys/vm/nr_hugepages", "r+e");

	if (!f)
		return;
	if (fscanf(f, "%ld", &have) == 1 && have < n) {
		rewind(f);
		fprintf(f, "%ld\n", n);
	}
	fclose(f);
}

/* Whether every 4 KiB page of @buf holds the 4 KiB at @first. */
static bool every_page_is(const char *buf, size_t len, const char *first)
{
	size_t i;

	for (i = 0; i < len; i += 4096)
		if (memcmp(buf + i, first, 4096))
			return false;
	return true;
}

/*
 * A udmabuf over hugetlb memory, from an offset inside the huge page: its
 * table has entries whose offset in their (huge) page is a page or more,
 * which the page-list series misread (issue 33, B2). Through the
 * exporter's mapping the MR reads and writes exactly those bytes.
 */
TEST_F(rxe, hugetlb_udmabuf_read_and_written_exactly)
{
	const size_t huge = 2u << 20, off = 3 * 4096;
	struct udmabuf_create c = {
		.flags = UDMABUF_FLAGS_CLOEXEC, .offset = off, .size = LEN,
	};
	struct ibv_mr *mr;
	int udev, memfd, ub;
	char *p;

	udev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (udev < 0)
		SKIP(return, "/dev/udmabuf: %s", strerror(errno));
	huge_pages_at_least(2);
	memfd = memfd_create("kvd-huge", MFD_CLOEXEC | MFD_ALLOW_SEALING |
				MFD_HUGETLB);
	if (memfd < 0) {
		close(udev);
		SKIP(return, "no hugetlb memfd: %s", strerror(errno));
	}
	ASSERT_EQ(0, ftruncate(memfd, huge));
	p = mmap(NULL, huge, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	ASSERT_NE(MAP_FAILED, p);
	pattern_fill(p, huge, 81);
	ASSERT_EQ(0, fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK));
	c.memfd = (uint32_t)memfd;
	ub = ioctl(udev, UDMABUF_CREATE, &c);
	if (ub < 0)
		TH_LOG("UDMABUF_CREATE: %s", strerror(errno));
	ASSERT_GE(ub, 0);
	mr = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, ub, ACC);
	if (!mr)
		TH_LOG("ibv_reg_dmabuf_mr: %s", strerror(errno));
	ASSERT_NOT_NULL(mr);

	memset(self->abuf, 0, LEN);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA, mr->rkey, NULL));
	if (memcmp(self->abuf, p + off, LEN) &&
	    every_page_is(self->abuf, LEN, p)) {
		ibv_dereg_mr(mr);
		SKIP(return, "this kernel's udmabuf vmap maps every page of a huge folio as its first one (vmap_udmabuf takes the folio, not the page; fixed in later kernels)");
	}
	EXPECT_EQ(0, memcmp(self->abuf, p + off, LEN));
	pattern_fill(self->abuf, 4096, 82);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_WRITE, 0, 4096, IOVA + 8192, mr->rkey,
			NULL));
	EXPECT_EQ(0, memcmp(p + off + 8192, self->abuf, 4096));

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(ub);
	munmap(p, huge);
	close(memfd);
	close(udev);
}

/* One signalled compare-and-swap of 8 bytes at @remote, waited for. */
static int cas(struct vp_end *a, struct ibv_mr *lmr, void *local,
	       uint64_t remote, uint32_t rkey, uint64_t compare, uint64_t swap,
	       enum ibv_wc_status *status)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)local, .length = 8, .lkey = lmr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = 3, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_ATOMIC_CMP_AND_SWP,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	wr.wr.atomic.remote_addr = remote;
	wr.wr.atomic.compare_add = compare;
	wr.wr.atomic.swap = swap;
	wr.wr.atomic.rkey = rkey;
	if (ibv_post_send(a->qp, &wr, &bad))
		return -errno;
	return vp_wait(a, status);
}

/*
 * Compare-and-swap on a dma-buf MR of a proxy: it works on the backing of
 * the moment (the old one untouched after a swap) and fails while the
 * proxy is revoked, touching neither (caught: an atomic through pages or
 * a mapping the swap took away).
 */
TEST_F(rxe, compare_and_swap_follows_the_swap_and_fails_while_revoked)
{
	const uint64_t v1 = 0x0123456789abcdefull, v2 = 0xfedcba9876543210ull;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	uint64_t *got = self->abuf, a8, a16, b16, a24, b24;
	struct ibv_mr *mr;
	int a, b, proxy;

	KVD_OPEN_DEV(self->dev);
	ASSERT_EQ(0, two_backings(self, 71, 72, &a, &b, &proxy));
	mr = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, proxy,
			       ACC | IBV_ACCESS_REMOTE_ATOMIC);
	if (!mr)
		TH_LOG("ibv_reg_dmabuf_mr: %s", strerror(errno));
	ASSERT_NOT_NULL(mr);

	a8 = dmabuf_u64(a, 8);
	ASSERT_EQ(0, cas(&self->a, self->amr, got, IOVA + 8, mr->rkey, a8, v1,
			 &st));
	EXPECT_EQ(a8, *got);
	EXPECT_EQ(v1, dmabuf_u64(a, 8));

	a16 = dmabuf_u64(a, 16);
	b16 = dmabuf_u64(b, 16);
	ASSERT_EQ(0, kvd_replace(self->dev, proxy, b, 0));
	ASSERT_EQ(0, cas(&self->a, self->amr, got, IOVA + 16, mr->rkey, b16,
			 v2, &st));
	EXPECT_EQ(b16, *got);
	EXPECT_EQ(v2, dmabuf_u64(b, 16));
	EXPECT_EQ(a16, dmabuf_u64(a, 16));

	a24 = dmabuf_u64(a, 24);
	b24 = dmabuf_u64(b, 24);
	ASSERT_EQ(0, kvd_revoke(self->dev, proxy, 2000));
	EXPECT_EQ(-EIO, cas(&self->a, self->amr, got, IOVA + 24, mr->rkey,
			    b24, v1, &st));
	EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, st);
	EXPECT_EQ(a24, dmabuf_u64(a, 24));
	EXPECT_EQ(b24, dmabuf_u64(b, 24));

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(proxy);
	close(a);
	close(b);
}

/*
 * A rereg of @mr's access to @access through uverbs' own command (the
 * library refuses ibv_rereg_mr() of a dma-buf MR before the kernel sees
 * it): 0 or -errno.
 */
static int raw_rereg_access(struct ibv_mr *mr, int access)
{
	struct ib_uverbs_rereg_mr_resp resp;
	struct {
		struct ib_uverbs_cmd_hdr hdr;
		struct ib_uverbs_rereg_mr cmd;
	} req = {
		.hdr = {
			.command = IB_USER_VERBS_CMD_REREG_MR,
			.in_words = sizeof(req) / 4,
			.out_words = sizeof(resp) / 4,
		},
		.cmd = {
			.response = (uintptr_t)&resp, .mr_handle = mr->handle,
			.flags = IBV_REREG_MR_CHANGE_ACCESS,
			.access_flags = (uint32_t)access,
		},
	};

	return write(mr->context->cmd_fd, &req, sizeof(req)) == sizeof(req) ?
	       0 : -errno;
}

/*
 * The access of a dma-buf MR is checked for its kind at registration (no
 * flush: it reaches memory by pages, which a dma-buf hides), so rereg may
 * not change it (caught: the refusal dropped, after which a FLUSH would
 * walk a page list the MR does not have). The MR still works after.
 */
TEST_F(rxe, rereg_of_a_dmabuf_mrs_access_refused)
{
	const int flush_global = 1 << 8;	/* IB_ACCESS_FLUSH_GLOBAL */
	struct ibv_mr *mr;
	int fd = vgem_pattern_buf(self->drm, LEN, 91);

	ASSERT_GE(fd, 0);
	mr = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, fd,
			       ACC | flush_global);
	EXPECT_NULL(mr);
	if (mr)
		ibv_dereg_mr(mr);
	mr = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, fd, ACC);
	ASSERT_NOT_NULL(mr);
	/* the driver's refusal, whatever the access asked for */
	EXPECT_EQ(-EOPNOTSUPP, raw_rereg_access(mr, ACC));
	EXPECT_EQ(-EOPNOTSUPP, raw_rereg_access(mr, ACC |
						IBV_ACCESS_REMOTE_ATOMIC));
	EXPECT_NE(0, raw_rereg_access(mr, ACC | flush_global));
	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA, mr->rkey, NULL));
	EXPECT_EQ(-1, pattern_check(self->abuf, LEN, 91));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(fd);
}

/*
 * The pinned mode: the MR pins the proxy, so a swap and a revoke fail
 * with EBUSY and the rkey keeps reading the bytes it was registered on;
 * once the MR is gone, the swap goes through.
 */
TEST_F(rxe, pinned_blocks_swap)
{
	struct ibv_mr *mr;
	int a, b, proxy;

	KVD_OPEN_DEV(self->dev);
	ASSERT_EQ(0, two_backings(self, 61, 62, &a, &b, &proxy));
	ASSERT_EQ(0, rxe_set_pinned(1));
	mr = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, proxy, ACC);
	ASSERT_EQ(0, rxe_set_pinned(0));
	if (!mr)
		TH_LOG("ibv_reg_dmabuf_mr: %s", strerror(errno));
	ASSERT_NOT_NULL(mr);

	EXPECT_EQ(-EBUSY, kvd_replace(self->dev, proxy, b, 0));
	EXPECT_EQ(-EBUSY, kvd_revoke(self->dev, proxy, 200));
	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA,
			mr->rkey, NULL));
	EXPECT_EQ(-1, pattern_check(self->abuf, LEN, 61));

	ASSERT_EQ(0, ibv_dereg_mr(mr));
	EXPECT_EQ(0, kvd_replace(self->dev, proxy, b, 0));
	close(proxy);
	close(a);
	close(b);
}

/* Deregistering an MR whose proxy moves under it, and moving after. */
TEST_F(rxe, dereg_after_move)
{
	struct ibv_mr *mr;
	int a, b, proxy;

	KVD_OPEN_DEV(self->dev);
	a = vgem_pattern_buf(self->drm, LEN, 71);
	b = vgem_pattern_buf(self->drm, LEN, 72);
	ASSERT_GE(a, 0);
	ASSERT_GE(b, 0);
	ASSERT_EQ(0, proxy_mr(_metadata, self, a, 0, &proxy, &mr));
	/* Moved and never accessed again: the MR holds no mapping. */
	ASSERT_EQ(0, kvd_replace(self->dev, proxy, b, 0));
	ASSERT_EQ(0, ibv_dereg_mr(mr));
	EXPECT_EQ(0, kvd_replace(self->dev, proxy, a, 0));
	EXPECT_EQ(0, kvd_revoke(self->dev, proxy, 2000));
	close(proxy);
	close(a);
	close(b);
}

#define POISON	0xdeu

/* Fills @len bytes of dma-buf @fd with @seed's pattern, or @POISON bytes. */
static int dmabuf_fill(int fd, size_t len, int poison, uint32_t seed)
{
	void *p = mmap(NULL, len, PROT_WRITE, MAP_SHARED, fd, 0);

	if (p == MAP_FAILED)
		return -errno;
	if (poison)
		memset(p, POISON, len);
	else
		pattern_fill(p, len, seed);
	munmap(p, len);
	return 0;
}

/* Is every byte of dma-buf @fd @POISON? */
static int dmabuf_all_poison(int fd, size_t len)
{
	unsigned char *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	size_t i;

	if (p == MAP_FAILED)
		return -errno;
	for (i = 0; i < len && p[i] == POISON; i++)
		;
	munmap(p, len);
	return i == len;
}

/*
 * A's traffic through @rkey: a READ of the first half of the MR into the
 * first half of abuf, a WRITE of abuf's second half into the MR's second
 * half, until told to stop or an op fails. A read that brings a poisoned
 * word read a backing already let go.
 */
struct traffic {
	struct vp_end *e;
	char *abuf;
	uint32_t lkey, rkey;
	int stop;			/* atomic */
	long ops;			/* atomic */
	long poisoned;
	int err;
	enum ibv_wc_status st;
};

static void *traffic_fn(void *arg)
{
	struct traffic *t = arg;
	const uint32_t half = LEN / 2;
	uint32_t i;

	while (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
		memset(t->abuf, 0, half);
		t->err = vp_rdma(t->e, IBV_WR_RDMA_READ, t->abuf, half, t->lkey,
				 IOVA, t->rkey, &t->st);
		if (t->err)
			break;
		for (i = 0; i < half / 4; i++)
			if (((uint32_t *)t->abuf)[i] == 0xdededede)
				t->poisoned++;
		t->err = vp_rdma(t->e, IBV_WR_RDMA_WRITE, t->abuf + half, half,
				 t->lkey, IOVA + half, t->rkey, &t->st);
		if (t->err)
			break;
		__atomic_add_fetch(&t->ops, 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

/* Waits (10 s at most) until @t has done @n more ops or has stopped. */
static int traffic_wait(struct traffic *t, long n)
{
	long start = __atomic_load_n(&t->ops, __ATOMIC_ACQUIRE);
	int ms;

	for (ms = 0; ms < 10000; ms++) {
		if (__atomic_load_n(&t->ops, __ATOMIC_ACQUIRE) - start >= n)
			return 0;
		usleep(1000);
	}
	return -ETIMEDOUT;
}

/*
 * FOLLOW under traffic: the proxy is swapped between two backings 20
 * times while A reads and writes through the same rkey; after each swap
 * returned, the backing it left is poisoned. No read ever brings a
 * poisoned word and the last backing left stays all poison (no write
 * landed in it after its swap), and no op fails.
 */
TEST_F(rxe, swaps_under_traffic_leave_nothing_behind)
{
	struct traffic t = { .e = &self->a, .abuf = self->abuf };
	struct ibv_mr *mr;
	int buf[2], proxy, i;
	pthread_t tid;

	KVD_OPEN_DEV(self->dev);
	buf[0] = vgem_pattern_buf(self->drm, LEN, 80);
	buf[1] = vgem_dmabuf(self->drm, LEN);
	ASSERT_GE(buf[0], 0);
	ASSERT_GE(buf[1], 0);
	ASSERT_EQ(0, proxy_mr(_metadata, self, buf[0], 0, &proxy, &mr));
	pattern_fill((char *)self->abuf + LEN / 2, LEN / 2, 99);
	t.lkey = self->amr->lkey;
	t.rkey = mr->rkey;
	ASSERT_EQ(0, pthread_create(&tid, NULL, traffic_fn, &t));
	for (i = 1; i <= 20; i++) {
		int next = buf[i % 2], old = buf[(i + 1) % 2];

		/* Traffic on the current backing first: the swap meets it. */
		if (traffic_wait(&t, 2))
			break;
		/* No ASSERT while the thread runs: it would be left going. */
		if (dmabuf_fill(next, LEN, 0, 80 + i) ||
		    kvd_replace(self->dev, proxy, next, 0) ||
		    dmabuf_fill(old, LEN, 1, 0))
			break;
	}
	EXPECT_EQ(0, traffic_wait(&t, 2));
	__atomic_store_n(&t.stop, 1, __ATOMIC_RELEASE);
	ASSERT_EQ(0, pthread_join(tid, NULL));
	TH_LOG("%ld read+write pairs over 20 swaps", t.ops);
	EXPECT_EQ(21, i);
	EXPECT_EQ(0, t.err);
	EXPECT_EQ(0, t.poisoned);
	/* The one let go last (i = 20 moved onto buf[0]). */
	EXPECT_EQ(1, dmabuf_all_poison(buf[1], LEN));
	/* And the traffic's writes went to the backing that stayed. */
	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN / 2, IOVA + LEN / 2, mr->rkey,
			NULL));
	EXPECT_EQ(-1, pattern_check(self->abuf, LEN / 2, 99));

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(proxy);
	close(buf[0]);
	close(buf[1]);
}

/*
 * A revoke under traffic: the first op after it completes with a remote
 * access error, no read brought a word of the poisoned backing, and no
 * write changed it after the revoke returned.
 */
TEST_F(rxe, revoke_under_traffic_errors_and_leaves_nothing_behind)
{
	struct traffic t = { .e = &self->a, .abuf = self->abuf };
	struct ibv_mr *mr;
	int a, proxy;
	pthread_t tid;

	KVD_OPEN_DEV(self->dev);
	a = vgem_pattern_buf(self->drm, LEN, 90);
	ASSERT_GE(a, 0);
	ASSERT_EQ(0, proxy_mr(_metadata, self, a, 0, &proxy, &mr));
	t.lkey = self->amr->lkey;
	t.rkey = mr->rkey;
	ASSERT_EQ(0, pthread_create(&tid, NULL, traffic_fn, &t));
	EXPECT_EQ(0, traffic_wait(&t, 4));
	EXPECT_EQ(0, kvd_revoke(self->dev, proxy, 2000));
	EXPECT_EQ(0, dmabuf_fill(a, LEN, 1, 0));
	/* It ends by itself at its first failed op; a failure above: stop. */
	if (!_metadata->passed)
		__atomic_store_n(&t.stop, 1, __ATOMIC_RELEASE);
	ASSERT_EQ(0, pthread_join(tid, NULL));
	TH_LOG("%ld read+write pairs before the error", t.ops);
	EXPECT_EQ(-EIO, t.err);
	EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, t.st);
	EXPECT_EQ(0, t.poisoned);
	EXPECT_EQ(1, dmabuf_all_poison(a, LEN));

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(proxy);
	close(a);
}

/*
 * REPLACE in a loop from a thread of its own, until told to stop; a pause
 * of 0.2 ms after each, so that the guest's two CPUs are not both spent on
 * this thread and on the test's CQ polling while rxe's tasks wait for one;
 * still thousands of swaps per test. The READs that once got no completion
 * (6.12, and the debug lane twice) were answered more slowly than the
 * QP's ack timeout: see kvd_ack_timeout().
 */
struct swapper {
	int dev, proxy, buf[2], stop, swaps, err;
};

/*
 * Swaps back to back, 200 us apart; on a slow kernel (the debug lane's
 * KASAN and lockdep under TCG, KVDMABUF_TIMEOUT_SCALE 4) scale^2 times
 * that: there a swap takes the buffer's lock for milliseconds, and with
 * 200 us between them rxe's responder once waited for it longer than a
 * READ's 10 s (21054 swaps in 120 s against 1812 to 2029 in 28 s).
 */
static void *swapper_fn(void *arg)
{
	struct swapper *w = arg;
	int scale = kvd_scaled_ms(1);

	while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
		w->err = kvd_replace(w->dev, w->proxy, w->buf[w->swaps % 2], 0);
		if (w->err)
			break;
		w->swaps++;
		usleep(200 * scale * scale);
	}
	return NULL;
}

/*
 * Each MTU-sized piece of @buf (rxe copies a packet at a time, under the
 * buffer's lock) wholly of pattern @a or wholly of pattern @b: -1, or the
 * first word of a piece that is neither (torn, or of neither backing).
 */
static long pieces_of_either(const void *buf, size_t len, size_t piece,
			     uint32_t a, uint32_t b)
{
	const uint32_t *p = buf;
	size_t i, j, n = piece / 4;
	uint32_t seed;

	for (i = 0; i < len / 4; i += n) {
		seed = p[i] == a * 2654435761u + (uint32_t)i ? a : b;
		for (j = i; j < i + n && j < len / 4; j++)
			if (p[j] != seed * 2654435761u + (uint32_t)j)
				return (long)j;
	}
	return -1;
}

/*
 * MRs registered, accessed and deregistered while the proxy moves under
 * them from another thread between two backings of different bytes:
 * every registration and access succeeds, each packet of a READ brings
 * the bytes of one backing (never a mix, never other bytes), a READ
 * after the last swap brings the last backing's, and once all MRs are
 * gone the proxy has no importer left.
 */
TEST_F(rxe, register_and_deregister_while_moving)
{
	struct swapper w = { 0 };
	struct kvdmabuf_query q;
	struct ibv_mr *mr;
	pthread_t tid;
	int i;

	KVD_OPEN_DEV(self->dev);
	w.dev = self->dev;
	w.buf[0] = vgem_pattern_buf(self->drm, LEN, 95);
	w.buf[1] = vgem_pattern_buf(self->drm, LEN, 96);
	ASSERT_GE(w.buf[0], 0);
	ASSERT_GE(w.buf[1], 0);
	w.proxy = kvd_create(self->dev, LEN, NULL);
	ASSERT_GE(w.proxy, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, w.proxy, w.buf[1], 0));
	ASSERT_EQ(0, pthread_create(&tid, NULL, swapper_fn, &w));
	for (i = 0; i < 30; i++) {
		mr = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, w.proxy, ACC);
		if (!mr) {
			TH_LOG("registration %d: %s", i, strerror(errno));
			break;
		}
		memset(self->abuf, 0, LEN);
		EXPECT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA, mr->rkey, NULL));
		EXPECT_EQ(-1, pieces_of_either(self->abuf, LEN, 1024, 95, 96));
		if (i == 29)
			break;		/* kept for the READ after the last swap */
		if (ibv_dereg_mr(mr))
			break;
	}
	__atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
	ASSERT_EQ(0, pthread_join(tid, NULL));
	TH_LOG("%d registrations over %d swaps", i + 1, w.swaps);
	ASSERT_EQ(29, i);
	EXPECT_EQ(0, w.err);
	/* The last swap attached buf[(swaps - 1) % 2] (buf[1] if none). */
	memset(self->abuf, 0, LEN);
	EXPECT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA, mr->rkey, NULL));
	EXPECT_EQ(-1, pattern_check(self->abuf, LEN,
				    w.swaps ? 95 + (w.swaps - 1) % 2 : 96));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	ASSERT_EQ(0, kvd_query(self->dev, w.proxy, &q));
	EXPECT_EQ(0, q.dynamic_importers + q.pinned_importers);
	close(w.proxy);
	close(w.buf[0]);
	close(w.buf[1]);
}

/*
 * An elastic KV pool on one MR (KVDMABUF_IOCTL_RANGES): four chunks, two
 * backed; a batch gives one back and backs the other two; the same rkey
 * reads every chunk's bytes (zeros where unbacked) and writes land in the
 * kept chunk's own buffer, never in a chunk given back.
 */
TEST_F(rxe, a_pool_of_ranges_follows_batches_with_one_rkey)
{
	const uint64_t ch = LEN / 4;
	struct kvdmabuf_range r[3];
	struct ibv_mr *mr;
	int c[4], proxy, i;
	char *want;

	KVD_OPEN_DEV(self->dev);
	for (i = 0; i < 4; i++) {
		c[i] = vgem_pattern_buf(self->drm, ch, 41 + i);
		ASSERT_GE(c[i], 0);
	}
	want = calloc(1, LEN);
	ASSERT_NOT_NULL(want);
	proxy = kvd_create(self->dev, LEN, NULL);
	ASSERT_GE(proxy, 0);
	r[0] = (struct kvdmabuf_range){ .start = 0, .length = ch,
					.backing_fd = c[0] };
	r[1] = (struct kvdmabuf_range){ .start = 2 * ch, .length = ch,
					.backing_fd = c[2] };
	ASSERT_EQ(0, kvd_ranges(self->dev, proxy, r, 2));
	mr = ibv_reg_dmabuf_mr(self->b.pd, 0, LEN, IOVA, proxy, ACC);
	ASSERT_NOT_NULL(mr);

	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA, mr->rkey, NULL));
	pattern_fill(want, ch, 41);
	pattern_fill(want + 2 * ch, ch, 43);
	EXPECT_EQ(0, memcmp(self->abuf, want, LEN));

	r[0].backing_fd = KVDMABUF_RANGE_UNBACKED;
	r[1] = (struct kvdmabuf_range){ .start = ch, .length = ch,
					.backing_fd = c[1] };
	r[2] = (struct kvdmabuf_range){ .start = 3 * ch, .length = ch,
					.backing_fd = c[3] };
	ASSERT_EQ(0, kvd_ranges(self->dev, proxy, r, 3));
	memset(self->abuf, 0xee, LEN);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_READ, 0, LEN, IOVA, mr->rkey, NULL));
	memset(want, 0, ch);
	pattern_fill(want + ch, ch, 42);
	pattern_fill(want + 3 * ch, ch, 44);
	EXPECT_EQ(0, memcmp(self->abuf, want, LEN));

	/* Writes: into the kept chunk's buffer; none into the one given back. */
	pattern_fill(self->abuf, LEN, 45);
	ASSERT_EQ(0, OP(IBV_WR_RDMA_WRITE, 0, LEN, IOVA, mr->rkey, NULL));
	EXPECT_EQ(1, dmabuf_equals(c[2], 0, (char *)self->abuf + 2 * ch, ch));
	pattern_fill(want, ch, 41);
	EXPECT_EQ(1, dmabuf_equals(c[0], 0, want, ch));

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	close(proxy);
	for (i = 0; i < 4; i++)
		close(c[i]);
	free(want);
}

TEST_HARNESS_MAIN
