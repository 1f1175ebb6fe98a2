/* SPDX-License-Identifier: GPL-2.0 */
/*
 * verbs_pair.h - two RC queue pairs on two verbs devices in one process
 * (rxe0 and rxe1 in the VM: soft-RoCE on both ends of a veth pair), connected
 * by their GIDs, for tests that move bytes with RDMA write and read.
 * Functions return 0 or -errno.
 */
#ifndef KVDMABUF_TESTS_VERBS_PAIR_H
#define KVDMABUF_TESTS_VERBS_PAIR_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "timeout_scale.h"

struct vp_end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
};

/* Device names: KVDMABUF_IBDEV_A/B, by default the VM's rxe0 and rxe1. */
static inline const char *vp_dev_name(int which)
{
	const char *e = getenv(which ? "KVDMABUF_IBDEV_B" : "KVDMABUF_IBDEV_A");

	return e ? e : which ? "rxe1" : "rxe0";
}

static inline struct ibv_context *vp_open_device(const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	int i;

	for (i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!ctx)
		errno = ENODEV;
	return ctx;
}

static inline void vp_close(struct vp_end *e)
{
	if (e->qp)
		ibv_destroy_qp(e->qp);
	if (e->cq)
		ibv_destroy_cq(e->cq);
	if (e->pd)
		ibv_dealloc_pd(e->pd);
	if (e->ctx)
		ibv_close_device(e->ctx);
	memset(e, 0, sizeof(*e));
}

/*
 * A new RC QP for @e in place of the one it has (an error moved that one to
 * the error state for good: rxe moves it there after the failed
 * completion is polled, so a reset could race with it), the CQ's flushed
 * completions polled away. It has a new number: connect it again.
 */
static inline int vp_new_qp(struct vp_end *e)
{
	struct ibv_qp_init_attr qpa = {
		.qp_type = IBV_QPT_RC, .send_cq = e->cq, .recv_cq = e->cq,
		.cap = { .max_send_wr = 64, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_wc wc;

	if (e->qp && ibv_destroy_qp(e->qp))
		return -errno;
	while (ibv_poll_cq(e->cq, 1, &wc) > 0)
		;
	e->qp = ibv_create_qp(e->pd, &qpa);
	return e->qp ? 0 : -EIO;
}

static inline int vp_open(struct vp_end *e, const char *name)
{
	memset(e, 0, sizeof(*e));
	e->ctx = vp_open_device(name);
	if (!e->ctx)
		return -ENODEV;
	e->pd = ibv_alloc_pd(e->ctx);
	e->cq = e->pd ? ibv_create_cq(e->ctx, 128, NULL, NULL, 0) : NULL;
	if (!e->cq || vp_new_qp(e) || ibv_query_gid(e->ctx, 1, 0, &e->gid))
		goto err;
	return 0;
err:
	vp_close(e);
	return -EIO;
}

/*
 * @e's QP to RTS towards the remote QP @dest_qpn at @dgid (in one process,
 * the other vp_end; across nodes, what the peer published).
 */
static inline int vp_to_rts_remote(struct vp_end *e, uint32_t dest_qpn,
				   const union ibv_gid *dgid)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
				   IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC,
	};

	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -errno;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV |
			  IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -errno;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = kvd_ack_timeout();
	a.retry_cnt = KVD_RETRY_CNT;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return -errno;
	return 0;
}

static inline int vp_to_rts(struct vp_end *e, const struct vp_end *peer)
{
	return vp_to_rts_remote(e, peer->qp->qp_num, &peer->gid);
}

static inline int vp_connect(struct vp_end *a, struct vp_end *b)
{
	int ret = vp_to_rts(a, b);

	return ret ? ret : vp_to_rts(b, a);
}

/*
 * Waits (at most 10 s, times KVDMABUF_TIMEOUT_SCALE: the debug lane's
 * soft-RoCE is 4x slower) for the completion of one signalled work request
 * of @e. Returns 0, -EIO with *status set to the failed completion's
 * status, or -ETIMEDOUT.
 */
static inline int vp_wait(struct vp_end *e, enum ibv_wc_status *status)
{
	struct timespec t0, t;
	struct ibv_wc wc;
	int n;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		n = ibv_poll_cq(e->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 1) {
			if (status)
				*status = wc.status;
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while (t.tv_sec - t0.tv_sec < kvd_scaled_ms(10000) / 1000);
	return -ETIMEDOUT;
}

/*
 * One signalled RDMA WRITE or READ from @e's QP, waited for (at most 10 s).
 * Returns 0, -EIO with *status set to the failed completion's status, or
 * -ETIMEDOUT.
 */
static inline int vp_rdma(struct vp_end *e, enum ibv_wr_opcode op,
			  void *local, uint32_t len, uint32_t lkey,
			  uint64_t remote, uint32_t rkey,
			  enum ibv_wc_status *status)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len,
			       .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = remote, .rkey = rkey },
	}, *bad;

	if (ibv_post_send(e->qp, &wr, &bad))
		return -errno;
	return vp_wait(e, status);
}

#endif /* KVDMABUF_TESTS_VERBS_PAIR_H */
