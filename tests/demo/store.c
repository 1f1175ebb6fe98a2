// SPDX-License-Identifier: GPL-2.0
/*
 * store.c - the KV store's memory server: DEMO_SEGMENTS host-memory
 * segments registered once on rxe0 (a store's memory never sleeps), one RC
 * QP per engine QP. Engines put (RDMA write) and get (RDMA read) blocks in
 * its slots; the store itself only publishes its segments and records the
 * keys engines republish after a wake. Slot s lives in segment
 * s % DEMO_SEGMENTS at offset (s / DEMO_SEGMENTS) * DEMO_BLOCK.
 *
 * With the move-capable NIC (umem) the segments are vgem buffers imported
 * on the shared /dev/kvd_umem: a segment's key is its import handle and
 * its address is 0 (transfers address it by offset).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>

#include "demo.h"
#include "proxy_common.h"
#include "verbs_pair.h"

#define STORE_CLIENTS 2
#define SEG_LEN ((size_t)DEMO_SLOTS / DEMO_SEGMENTS * DEMO_BLOCK)

struct store {
	const struct demo_store_cfg *cfg;
	int drm;
	struct demo_vbuf vb[DEMO_SEGMENTS];
	int key[DEMO_SEGMENTS];		/* umem: import handles, -1 none */
	struct demo_nic nic;
	void *seg[DEMO_SEGMENTS];
	struct ibv_mr *mr[DEMO_SEGMENTS];
	struct demo_qp qp[STORE_CLIENTS][DEMO_MAX_QPS];
	unsigned int nqp[STORE_CLIENTS];
	/* keys engines published (region 0/1), as a store caches them */
	uint64_t peer_gen[STORE_CLIENTS][DEMO_NR_REGIONS];
	uint32_t peer_rkey[STORE_CLIENTS][DEMO_NR_REGIONS];
	uint64_t republished;
};

static struct store st;

static void *slot_addr(unsigned int s)
{
	return (char *)st.seg[s % DEMO_SEGMENTS] +
	       (size_t)(s / DEMO_SEGMENTS) * DEMO_BLOCK;
}

static void store_cleanup(void)
{
	unsigned int c, i;

	for (c = 0; c < STORE_CLIENTS; c++)
		for (i = 0; i < st.nqp[c]; i++)
			demo_qp_destroy(&st.qp[c][i]);
	for (i = 0; i < DEMO_SEGMENTS; i++) {
		if (st.mr[i])
			ibv_dereg_mr(st.mr[i]);
		if (st.cfg && st.cfg->nic == DEMO_NIC_UMEM) {
			if (st.key[i] >= 0)
				imp_release(st.cfg->umem_fd, st.key[i]);
			demo_vbuf_free(st.drm, &st.vb[i]);
		} else if (st.seg[i]) {
			munmap(st.seg[i], SEG_LEN);
		}
	}
	if (st.cfg && st.cfg->nic == DEMO_NIC_UMEM && st.drm >= 0)
		close(st.drm);
	demo_nic_close(&st.nic);
	memset(&st, 0, sizeof(st));
}

static int store_init_umem(struct demo_msg *m)
{
	unsigned int i;
	int rc;

	st.drm = vgem_open();
	if (st.drm < 0)
		return demo_fail(m, st.drm, "store: no vgem device");
	for (i = 0; i < DEMO_SEGMENTS; i++) {
		rc = demo_vbuf_new(st.drm, SEG_LEN, &st.vb[i]);
		if (rc)
			return demo_fail(m, rc, "store: vgem segment: %s",
					 strerror(-rc));
		st.seg[i] = st.vb[i].cpu;
		st.key[i] = imp_import(st.cfg->umem_fd, st.vb[i].fd, 0);
		if (st.key[i] < 0)
			return demo_fail(m, st.key[i], "store: kvd_umem import "
					 "of segment %u: %s", i,
					 strerror(-st.key[i]));
	}
	for (i = 0; i < DEMO_PROMPTS; i++)
		pattern_fill(slot_addr(DEMO_SLOT_W + i), DEMO_BLOCK,
			     DEMO_W_SEED + i);
	return 0;
}

static int store_init(struct demo_msg *m)
{
	unsigned int i;
	int rc;

	for (i = 0; i < DEMO_SEGMENTS; i++)
		st.key[i] = -1;
	st.drm = -1;
	if (st.cfg->nic == DEMO_NIC_UMEM)
		return store_init_umem(m);
	rc = demo_nic_open(&st.nic, vp_dev_name(0), m->text, sizeof(m->text));
	if (rc)
		return rc;
	for (i = 0; i < DEMO_SEGMENTS; i++) {
		st.seg[i] = mmap(NULL, SEG_LEN, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (st.seg[i] == MAP_FAILED) {
			st.seg[i] = NULL;
			return demo_fail(m, -ENOMEM, "store: mmap segment: %s",
					 strerror(errno));
		}
		st.mr[i] = ibv_reg_mr(st.nic.pd, st.seg[i], SEG_LEN,
				      IBV_ACCESS_LOCAL_WRITE |
				      IBV_ACCESS_REMOTE_WRITE |
				      IBV_ACCESS_REMOTE_READ);
		if (!st.mr[i])
			return demo_fail(m, errno ? -errno : -EIO,
					 "store: ibv_reg_mr segment %u: %s", i,
					 strerror(errno));
	}
	/* the trainer published new weights in the store */
	for (i = 0; i < DEMO_PROMPTS; i++)
		pattern_fill(slot_addr(DEMO_SLOT_W + i), DEMO_BLOCK,
			     DEMO_W_SEED + i);
	return 0;
}

static int store_connect(struct demo_msg *m)
{
	unsigned int c = m->client, n = m->n, i;
	struct demo_qp_info peer[DEMO_MAX_QPS];
	int rc;

	if (c >= STORE_CLIENTS || st.nqp[c] || n > DEMO_MAX_QPS)
		return demo_fail(m, -EINVAL, "store: bad connect request");
	if (st.cfg->nic == DEMO_NIC_UMEM) {
		for (i = 0; i < DEMO_SEGMENTS; i++) {
			m->seg[i].addr = 0;
			m->seg[i].rkey = (uint32_t)st.key[i];
		}
		m->n = 0;
		return 0;
	}
	if (!n)
		return demo_fail(m, -EINVAL, "store: bad connect request");
	memcpy(peer, m->qp, sizeof(peer));
	for (i = 0; i < n; i++) {
		rc = demo_qp_create(&st.nic, &st.qp[c][i]);
		if (rc)
			return demo_fail(m, rc, "store: create QP: %s",
					 strerror(-rc));
		st.nqp[c]++;
		rc = demo_qp_connect(&st.qp[c][i], &peer[i]);
		if (rc)
			return demo_fail(m, rc, "store: connect QP to 0x%x: %s",
					 peer[i].qpn, strerror(-rc));
		m->qp[i].qpn = st.qp[c][i].qp->qp_num;
		memcpy(m->qp[i].gid, st.nic.gid, sizeof(st.nic.gid));
	}
	for (i = 0; i < DEMO_SEGMENTS; i++) {
		m->seg[i].addr = (uintptr_t)st.seg[i];
		m->seg[i].rkey = st.mr[i]->rkey;
	}
	return 0;
}

int demo_store_serve(struct demo_msg *m, void *arg)
{
	unsigned int c, r;

	st.cfg = arg;
	switch (m->op) {
	case OP_INIT:
		return store_init(m);
	case OP_CONNECT:
		return store_connect(m);
	case OP_KEYS:
		c = (unsigned int)m->a[0];
		r = (unsigned int)m->a[1];
		if (c >= STORE_CLIENTS || r >= DEMO_NR_REGIONS)
			return demo_fail(m, -EINVAL, "store: bad keys");
		if (m->a[2] != st.peer_gen[c][r]) {
			st.peer_gen[c][r] = m->a[2];
			st.peer_rkey[c][r] = (uint32_t)m->a[3];
			st.republished++;
		}
		m->a[0] = st.republished;
		return 0;
	case OP_QUIT:
		store_cleanup();
		return 0;
	default:
		return demo_fail(m, -EINVAL, "store: unknown request %u",
				 m->op);
	}
}
