// SPDX-License-Identifier: GPL-2.0
/*
 * rdma.c - verbs for the demo: a NIC (device + PD), RC QPs connected across
 * processes by QPN and GID (gid index 0: the IPv6 link-local GID of
 * soft-RoCE on a veth pair), one-sided RDMA write and read.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "demo.h"
#include "timeout_scale.h"

int demo_nic_open(struct demo_nic *n, const char *name, char *err,
		  size_t errlen)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	union ibv_gid gid;
	int i, rc;

	memset(n, 0, sizeof(*n));
	for (i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			n->ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!n->ctx) {
		snprintf(err, errlen, "verbs device %s not found or not "
			 "openable (is soft-RoCE set up? rdma link add)", name);
		return -ENODEV;
	}
	n->pd = ibv_alloc_pd(n->ctx);
	if (!n->pd) {
		rc = errno ? -errno : -ENOMEM;
		snprintf(err, errlen, "ibv_alloc_pd(%s): %s", name,
			 strerror(-rc));
		goto fail;
	}
	rc = ibv_query_gid(n->ctx, 1, 0, &gid);
	if (rc) {
		rc = rc > 0 ? -rc : -EIO;
		snprintf(err, errlen, "ibv_query_gid(%s, port 1, index 0): %s",
			 name, strerror(-rc));
		goto fail;
	}
	memcpy(n->gid, gid.raw, sizeof(n->gid));
	return 0;
fail:
	demo_nic_close(n);
	return rc;
}

void demo_nic_close(struct demo_nic *n)
{
	if (n->pd)
		ibv_dealloc_pd(n->pd);
	if (n->ctx)
		ibv_close_device(n->ctx);
	memset(n, 0, sizeof(*n));
}

int demo_qp_create(struct demo_nic *n, struct demo_qp *q)
{
	struct ibv_qp_init_attr qpa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
				   IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ,
	};
	int rc;

	memset(q, 0, sizeof(*q));
	q->cq = ibv_create_cq(n->ctx, 32, NULL, NULL, 0);
	if (!q->cq)
		return errno ? -errno : -ENOMEM;
	qpa.send_cq = qpa.recv_cq = q->cq;
	q->qp = ibv_create_qp(n->pd, &qpa);
	if (!q->qp) {
		rc = errno ? -errno : -ENOMEM;
		goto fail;
	}
	rc = ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			   IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc) {
		rc = rc > 0 ? -rc : -EIO;
		goto fail;
	}
	return 0;
fail:
	demo_qp_destroy(q);
	return rc;
}

void demo_qp_destroy(struct demo_qp *q)
{
	if (q->qp)
		ibv_destroy_qp(q->qp);
	if (q->cq)
		ibv_destroy_cq(q->cq);
	memset(q, 0, sizeof(*q));
}

int demo_qp_connect(struct demo_qp *q, const struct demo_qp_info *peer)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qpn;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	memcpy(a.ah_attr.grh.dgid.raw, peer->gid, sizeof(peer->gid));
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	rc = ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_AV |
			   IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc)
		return rc > 0 ? -rc : -EIO;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	/* ~1 s local ACK timeout, scaled; a bounded number of retries */
	a.timeout = kvd_ack_timeout();
	a.retry_cnt = KVD_RETRY_CNT;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	rc = ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			   IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	return rc ? (rc > 0 ? -rc : -EIO) : 0;
}

const char *demo_wc_status(int status)
{
	return ibv_wc_status_str((enum ibv_wc_status)status);
}

/*
 * Waits for the one completion of @q's CQ, at most @limit_s seconds.
 * Returns 1 with *wc filled, 0 on timeout, -EIO if polling fails.
 */
static int wait_cqe(struct demo_qp *q, struct ibv_wc *wc, long limit_s)
{
	struct timespec t0, t, nap = { 0, 0 };
	unsigned int idle = 0;
	int n;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		n = ibv_poll_cq(q->cq, 1, wc);
		if (n)
			return n < 0 ? -EIO : 1;
		/* soft-RoCE works in kernel threads: leave them the CPU,
		 * more and more (up to 1 ms naps) on a slow kernel */
		if (++idle <= 64) {
			sched_yield();
		} else {
			if (nap.tv_nsec < 1000000)
				nap.tv_nsec += 10000;
			nanosleep(&nap, NULL);
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec >= limit_s)
			return 0;
	}
}

int demo_rdma(struct demo_qp *q, int write, void *local, uint32_t len,
	      uint32_t lkey, uint64_t raddr, uint32_t rkey, int *status)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len,
			       .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad = NULL;
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	struct ibv_wc wc;
	int rc;

	*status = IBV_WC_SUCCESS;
	rc = ibv_post_send(q->qp, &wr, &bad);
	if (rc)
		return rc > 0 ? -rc : -EIO;
	rc = wait_cqe(q, &wc, 30);
	if (rc == 1) {
		*status = wc.status;
		return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
	/*
	 * No completion: the transfer has not ended and the NIC may still
	 * touch the buffer. Only a flush ends it: move the QP to the error
	 * state and wait for the flushed completion (the QP stays broken and
	 * every later transfer on it fails, which the demo counts).
	 */
	if (rc == 0 && !ibv_modify_qp(q->qp, &err, IBV_QP_STATE) &&
	    wait_cqe(q, &wc, 30) == 1)
		return -ETIMEDOUT;
	return -ENOTRECOVERABLE;        /* still in flight: never ended */
}

int demo_qp_in_error(struct demo_qp *q)
{
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr a;
	int rc;

	rc = ibv_query_qp(q->qp, &a, IBV_QP_STATE, &init);
	if (rc)
		return rc > 0 ? -rc : -EIO;
	return a.qp_state == IBV_QPS_ERR;
}

/*
 * RESET, the CQ polled empty, INIT. rxe's completer moves a QP to the error
 * state after it has posted the failed completion that the caller polled,
 * so that move can land after our RESET (seen once on the debug lane: INIT
 * then refused with -EINVAL): then the whole reset once more, a few times.
 */
int demo_qp_reset(struct demo_qp *q)
{
	struct timespec nap = { 0, 100 * 1000 * 1000 };
	struct ibv_qp_attr a;
	struct ibv_wc wc;
	int rc, tries;

	for (tries = 0; tries < 5; tries++) {
		if (tries)
			nanosleep(&nap, NULL);
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RESET;
		rc = ibv_modify_qp(q->qp, &a, IBV_QP_STATE);
		if (rc)
			return rc > 0 ? -rc : -EIO;
		while (ibv_poll_cq(q->cq, 1, &wc) > 0)
			;
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
				    IBV_ACCESS_REMOTE_WRITE |
				    IBV_ACCESS_REMOTE_READ;
		rc = ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				   IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		if (rc != EINVAL || demo_qp_in_error(q) != 1)
			break;
	}
	return rc ? (rc > 0 ? -rc : -EIO) : 0;
}
