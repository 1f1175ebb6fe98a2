// SPDX-License-Identifier: GPL-2.0
/*
 * two_node.c - the demo's engines A and B on two nodes (make demo NODES=2):
 * two qemu guests on a socket network of the host's loopback
 * (tests/vm/two-node.sh), each with soft-RoCE with dma-buf MRs (tests/rxe)
 * as rxe0 on its NIC. KVDMABUF_NODE (set by tests/vm/guest-run.sh) says
 * which one this is: 1 = engine A, 2 = engine B, which reaches A at
 * KVDMABUF_NODE_PEER.
 *
 * A: its KV region is a vgem buffer (DRM memory, standing in for GPU
 * memory) behind a kvdmabuf proxy, registered through the library's public
 * API on A's own protection domain of rxe0 (kvdmabuf_open() with the NIC,
 * the mode measured must be FOLLOW; the library registers with
 * ibv_reg_dmabuf_mr()). A publishes address, length and rkey once over a
 * TCP connection on the same network, then sleeps (the proxy revoked, the
 * buffer freed: checked) and wakes (a new vgem buffer at the same address,
 * a new pattern) for --cycles cycles.
 *
 * B: after each wake, RDMA-READs all of A's region with the rkey it got at
 * the start and compares every block with the pattern A announced, then
 * RDMA-WRITEs one block that A checks; while A sleeps, its read must
 * complete with a remote access error and leave its buffer untouched (no
 * old byte). A prints the table and the verdict; both exit 1 on any wrong
 * byte or check that failed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../lib/kvdmabuf.h"
#include "../proxy_common.h"
#include "../rxe_env.h"
#include "../verbs_pair.h"

#define SEED0		0x2a000000u
#define WRITE_SEED	0x3b000000u

/* One message on the control connection (A <-> B), both directions. */
enum msg_type {
	MSG_HELLO = 1,	/* A: qpn, gid, addr, len, blk, rkey */
	MSG_READY,	/* B: qpn, gid; its QP is at RTS */
	MSG_AWAKE,	/* A: cycle, seed, rkey now, its QP: read, write */
	MSG_CHECKED,	/* B: right, total blocks; block written, seed */
	MSG_ASLEEP,	/* A: asleep, read */
	MSG_REFUSED,	/* B: status of the read, clean; its new QP */
	MSG_DONE,	/* A: end */
};

struct msg {
	uint32_t type;
	uint32_t cycle;
	uint32_t seed;
	uint32_t rkey;
	uint32_t qpn;
	uint32_t a, b, c;
	uint64_t addr;
	uint64_t len;
	uint64_t blk;
	uint8_t gid[16];
};

struct opts {
	unsigned int cycles;
	size_t len, blk;
	int port;
	const char *dev;
};

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int msg_send(int fd, struct msg *m, uint32_t type)
{
	size_t done = 0;
	ssize_t n;

	m->type = type;
	while (done < sizeof(*m)) {
		n = send(fd, (char *)m + done, sizeof(*m) - done, MSG_NOSIGNAL);
		if (n <= 0)
			return n ? -errno : -EPIPE;
		done += (size_t)n;
	}
	return 0;
}

/*
 * Receives the next message, which must be of @type, or of @alt (not 0):
 * returns its type, or -errno.
 */
static int msg_recv2(int fd, struct msg *m, uint32_t type, uint32_t alt)
{
	size_t done = 0;
	ssize_t n;

	while (done < sizeof(*m)) {
		n = recv(fd, (char *)m + done, sizeof(*m) - done, 0);
		if (n <= 0)
			return n ? -errno : -EPIPE;
		done += (size_t)n;
	}
	if (m->type != type && (!alt || m->type != alt)) {
		fprintf(stderr, "two-node: message %u, expected %u\n",
			m->type, type);
		return -EPROTO;
	}
	return (int)m->type;
}

static int msg_recv(int fd, struct msg *m, uint32_t type)
{
	int rc = msg_recv2(fd, m, type, 0);

	return rc < 0 ? rc : 0;
}

/* A: waits for B's connection on @port (any address of this guest). */
static int listen_accept(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)port) };
	int one = 1, s, fd;

	s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) || listen(s, 1)) {
		fd = -errno;
		close(s);
		return fd;
	}
	fd = accept4(s, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		fd = -errno;
	close(s);
	return fd;
}

/* B: connects to A, retrying while A's node boots (at most 5 minutes). */
static int connect_retry(const char *ip, int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)port) };
	double t0 = now_s();
	int fd, err;

	if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1)
		return -EINVAL;
	for (;;) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (!connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
			return fd;
		err = -errno;
		close(fd);
		if (now_s() - t0 > 300)
			return err;
		usleep(200000);
	}
}

static void set_nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ---- engine A ------------------------------------------------------- */

struct node_a {
	struct vp_end e;
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	int drm, dev, sock;
	uint32_t handle;
	char *addr;
	bool mapped;		/* addr maps the current vgem buffer */
	/* results */
	unsigned int right, total, writes_ok, writes, refused, clean, freed,
		revoked, same_key;
	uint32_t rkey_first, rkey_last;
	long min_drop_kb;
	int mode;
	double t_run;
};

/* New vgem memory with @seed's pattern, at a->addr when it is set. */
static int a_new_memory(struct node_a *a, const struct opts *o, uint32_t seed)
{
	char *p;
	int rc;

	rc = vgem_create(a->drm, o->len, &a->handle);
	if (rc)
		return rc;
	p = vgem_map(a->drm, a->handle, o->len, a->addr);
	if (!p || (a->addr && p != a->addr))
		return -ENOMEM;
	a->addr = p;
	a->mapped = true;
	pattern_fill(p, o->len, seed);
	return 0;
}

static int lib_err(struct node_a *a, const char *what, int rc)
{
	fprintf(stderr, "two-node A: %s: %s: %s\n", what, strerror(-rc),
		kvdmabuf_last_error(a->ctx));
	return rc;
}

/*
 * Sleep as an engine does it: kvdmabuf_sleep(), then the memory goes away.
 * Checks that the proxy is revoked and the buffer freed (the module holds
 * no backing, Shmem dropped by nine tenths of the region).
 */
static int a_sleep(struct node_a *a, const struct opts *o)
{
	struct kvdmabuf_region_info in;
	struct kvdmabuf_query q;
	long before, drop = 0;
	uint64_t off;
	int rc, fd, w;

	before = meminfo_kb("Shmem");
	rc = kvdmabuf_sleep(a->ctx, NULL);
	if (rc)
		return lib_err(a, "kvdmabuf_sleep", rc);
	rc = kvdmabuf_region_dmabuf(a->r, &fd, &off);
	if (!rc)
		rc = kvd_query(a->dev, fd, &q);
	if (rc)
		return lib_err(a, "proxy query", rc);
	if (!kvdmabuf_region_info(a->r, &in) && in.asleep &&
	    q.state == KVDMABUF_STATE_REVOKED)
		a->revoked++;
	munmap(a->addr, o->len);
	a->mapped = false;
	vgem_close_handle(a->drm, a->handle);
	/* the module may drop the backing from a worker: up to 2 s */
	for (w = 0; w < 200; w++) {
		drop = before - meminfo_kb("Shmem");
		if (kvd_stat("backings") == 0 &&
		    drop >= (long)(o->len / 1024) * 9 / 10)
			break;
		usleep(10000);
	}
	if (w < 200)
		a->freed++;
	if (a->min_drop_kb < 0 || drop < a->min_drop_kb)
		a->min_drop_kb = drop;
	return 0;
}

/* Wake: new memory at the same address, pattern @seed, same keys. */
static int a_wake(struct node_a *a, const struct opts *o, uint32_t seed)
{
	uint32_t lkey, rkey;
	uint64_t gen;
	int rc;

	rc = a_new_memory(a, o, seed);
	if (rc) {
		fprintf(stderr, "two-node A: new vgem memory: %s\n",
			strerror(-rc));
		return rc;
	}
	rc = kvdmabuf_region_set_drm_handle(a->r, a->drm, a->handle);
	if (rc)
		return lib_err(a, "kvdmabuf_region_set_drm_handle", rc);
	rc = kvdmabuf_wake(a->ctx, NULL);
	if (rc)
		return lib_err(a, "kvdmabuf_wake", rc);
	rc = kvdmabuf_region_keys(a->r, 0, &lkey, &rkey, &gen);
	if (rc)
		return lib_err(a, "kvdmabuf_region_keys", rc);
	a->rkey_last = rkey;
	a->same_key += rkey == a->rkey_first;
	return 0;
}

/* Region, control connection, QP; then the cycles. */
static int a_run(struct node_a *a, const struct opts *o)
{
	struct kvdmabuf_options ko = { 0 };
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region_info in;
	struct ibv_pd *pds[1];
	struct msg m = { 0 };
	union ibv_gid bgid;
	char err[512];
	uint32_t lkey, seed, bqpn;
	uint64_t gen;
	unsigned int c;
	double t0;
	int rc;

	a->drm = vgem_open();
	if (a->drm < 0)
		return a->drm;
	a->dev = kvd_dev_open();
	if (a->dev < 0)
		return a->dev;
	rc = vp_open(&a->e, o->dev);
	if (rc) {
		fprintf(stderr, "two-node A: %s: %s\n", o->dev, strerror(-rc));
		return rc;
	}
	pds[0] = a->e.pd;	/* the transfer engine's own PD on rxe0 */
	ko.pds = pds;
	ko.nr_pds = 1;
	ko.module = KVDMABUF_MODULE_REQUIRE;
	rc = kvdmabuf_open(&ko, &a->ctx, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "two-node A: kvdmabuf_open: %s\n", err);
		return rc;
	}
	rc = a_new_memory(a, o, SEED0);
	if (rc)
		return rc;
	d.addr = a->addr;
	d.len = o->len;
	d.mem = KVDMABUF_MEM_DRM;
	d.drm_fd = a->drm;
	d.drm_handle = a->handle;
	d.tag = "kv_cache";
	rc = kvdmabuf_region_add(a->ctx, &d, &a->r);
	if (rc)
		return lib_err(a, "kvdmabuf_region_add", rc);
	rc = kvdmabuf_region_info(a->r, &in);
	if (!rc)
		rc = kvdmabuf_region_keys(a->r, 0, &lkey, &a->rkey_first,
					  &gen);
	if (rc)
		return lib_err(a, "region info/keys", rc);
	a->mode = in.mode;
	a->rkey_last = a->rkey_first;
	printf("# node A: %s, vgem region of %zu KiB at %p behind proxy %llu, "
	       "mode %s, rkey 0x%x; waiting for B on port %d\n", o->dev,
	       o->len >> 10, (void *)a->addr,
	       (unsigned long long)in.proxy_id, kvdmabuf_mode_name(in.mode),
	       a->rkey_first, o->port);
	fflush(stdout);

	a->sock = listen_accept(o->port);
	if (a->sock < 0)
		return a->sock;
	set_nodelay(a->sock);
	t0 = now_s();
	m.qpn = a->e.qp->qp_num;
	memcpy(m.gid, a->e.gid.raw, sizeof(m.gid));
	m.addr = (uintptr_t)a->addr;
	m.len = o->len;
	m.blk = o->blk;
	m.rkey = a->rkey_first;
	rc = msg_send(a->sock, &m, MSG_HELLO);
	if (!rc)
		rc = msg_recv(a->sock, &m, MSG_READY);
	if (rc)
		return rc;
	bqpn = m.qpn;
	memcpy(bgid.raw, m.gid, sizeof(bgid.raw));
	rc = vp_to_rts_remote(&a->e, bqpn, &bgid);
	if (rc)
		return rc;

	for (c = 0; c <= o->cycles; c++) {
		seed = SEED0 + c;
		if (c) {
			rc = a_wake(a, o, seed);
			if (rc)
				return rc;
		}
		memset(&m, 0, sizeof(m));
		m.cycle = c;
		m.seed = seed;
		m.rkey = a->rkey_last;
		m.qpn = a->e.qp->qp_num;
		rc = msg_send(a->sock, &m, MSG_AWAKE);
		if (!rc)
			rc = msg_recv(a->sock, &m, MSG_CHECKED);
		if (rc)
			return rc;
		a->right += m.a;
		a->total += m.b;
		a->writes++;
		a->writes_ok += pattern_check(a->addr + (size_t)m.c * o->blk,
					      o->blk, m.seed) < 0;
		if (c == o->cycles)
			break;
		rc = a_sleep(a, o);
		if (rc)
			return rc;
		memset(&m, 0, sizeof(m));
		m.cycle = c;
		rc = msg_send(a->sock, &m, MSG_ASLEEP);
		if (!rc)
			rc = msg_recv(a->sock, &m, MSG_REFUSED);
		if (rc)
			return rc;
		a->refused += m.a == IBV_WC_REM_ACCESS_ERR;
		a->clean += m.b;
		/* the error ended both QPs: new ones, connected again (B's
		 * number came with its answer, A's goes with the next wake) */
		bqpn = m.qpn;
		rc = vp_new_qp(&a->e);
		if (!rc)
			rc = vp_to_rts_remote(&a->e, bqpn, &bgid);
		if (rc)
			return rc;
	}
	memset(&m, 0, sizeof(m));
	rc = msg_send(a->sock, &m, MSG_DONE);
	a->t_run = now_s() - t0;
	return rc;
}

static bool a_report(const struct node_a *a, const struct opts *o, int rc)
{
	bool pass = !rc && a->mode == KVDMABUF_MODE_FOLLOW &&
		    a->total == (o->cycles + 1) * (o->len / o->blk) &&
		    a->right == a->total && a->writes == o->cycles + 1 &&
		    a->writes_ok == a->writes && a->same_key == o->cycles &&
		    a->refused == o->cycles && a->clean == o->cycles &&
		    a->revoked == o->cycles && a->freed == o->cycles;

	printf("\n# two nodes: engine A (node 1) <- engine B (node 2), RDMA "
	       "over soft-RoCE on a qemu socket network\n");
	printf("%-7s %-13s %-14s %-13s %-21s %-15s %-15s %s\n", "cycles",
	       "mode", "B's reads", "B's writes", "rkey first->last",
	       "B asleep: err", "A asleep: freed", "time");
	printf("%-7u %-13s %5u/%-8u %4u/%-8u 0x%-8x->0x%-8x %4u/%-10u %4u/%-10u "
	       "%.2fs\n", o->cycles, kvdmabuf_mode_name(a->mode), a->right,
	       a->total, a->writes_ok, a->writes, a->rkey_first, a->rkey_last,
	       a->refused, o->cycles, a->freed, o->cycles, a->t_run);
	printf("# B's reads: %zu-KiB blocks of A's %zu-KiB region with the "
	       "right pattern, after each wake (and before the first sleep)\n",
	       o->blk >> 10, o->len >> 10);
	printf("# B asleep: reads that completed with a remote access error, "
	       "%u of them with B's buffer untouched (no old byte)\n",
	       a->clean);
	printf("# A asleep: proxy revoked %u/%u, vgem memory freed (no "
	       "backing held, Shmem down by at least %ld KiB) %u/%u\n",
	       a->revoked, o->cycles, a->min_drop_kb < 0 ? 0 : a->min_drop_kb,
	       a->freed, o->cycles);
	printf("verdict: %s\n", pass ? "PASS: B read every wake's new bytes "
	       "with the rkey it got once; asleep, its reads were refused" :
	       "FAIL");
	/* one TAP line, which make check counts (tests/vm/check.sh) */
	printf("%s 1 - two nodes: B reads A's KV after %u wakes by one rkey\n",
	       pass ? "ok" : "not ok", o->cycles);
	return pass;
}

static int node_a(const struct opts *o)
{
	struct node_a a = { .drm = -1, .dev = -1, .sock = -1,
			    .min_drop_kb = -1 };
	int rc = a_run(&a, o);
	/* the table even after an error: how far it got */
	bool pass = a_report(&a, o, rc);

	if (rc)
		fprintf(stderr, "two-node A: %s\n", strerror(-rc));
	if (a.r)
		kvdmabuf_region_remove(a.r);
	if (a.ctx)
		kvdmabuf_close(a.ctx);
	vp_close(&a.e);
	if (a.mapped)
		munmap(a.addr, o->len);
	if (a.sock >= 0)
		close(a.sock);
	if (a.dev >= 0)
		close(a.dev);
	if (a.drm >= 0)
		close(a.drm);
	return pass ? 0 : 1;
}

/* ---- engine B ------------------------------------------------------- */

/* Reads all of A's region block by block; counts blocks with @seed's. */
static int b_read_all(struct vp_end *e, struct ibv_mr *mr, char *buf,
		      char *expect, const struct msg *h, uint32_t rkey,
		      uint32_t seed, unsigned int *right)
{
	size_t off;
	int rc;

	memset(buf, 0, h->len);
	pattern_fill(expect, h->len, seed);
	*right = 0;
	for (off = 0; off < h->len; off += h->blk) {
		rc = vp_rdma(e, IBV_WR_RDMA_READ, buf + off, (uint32_t)h->blk,
			     mr->lkey, h->addr + off, rkey, NULL);
		if (rc)
			return rc;
		*right += !memcmp(buf + off, expect + off, h->blk);
	}
	return 0;
}

static int b_run(struct vp_end *e, int s, unsigned int *wrong)
{
	struct ibv_mr *mr = NULL;
	char *buf = NULL, *expect = NULL;
	struct msg h, m;
	union ibv_gid agid;
	enum ibv_wc_status st;
	unsigned int right, nblk;
	uint32_t wblk, wseed, aqpn;
	size_t i, changed;
	int rc;

	rc = msg_recv(s, &h, MSG_HELLO);
	if (rc)
		return rc;
	if (!h.blk || h.len % h.blk || h.len > (1ull << 30))
		return -EPROTO;
	nblk = (unsigned int)(h.len / h.blk);
	buf = malloc(h.len);
	expect = malloc(h.len);
	if (!buf || !expect) {
		rc = -ENOMEM;
		goto out;
	}
	mr = ibv_reg_mr(e->pd, buf, h.len, IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {
		rc = -errno;
		goto out;
	}
	memcpy(agid.raw, h.gid, sizeof(agid.raw));
	aqpn = h.qpn;
	rc = vp_to_rts_remote(e, aqpn, &agid);
	if (rc)
		goto out;
	printf("# node B: A's region 0x%llx, %llu KiB, rkey 0x%x\n",
	       (unsigned long long)h.addr, (unsigned long long)h.len >> 10,
	       h.rkey);
	memset(&m, 0, sizeof(m));
	m.qpn = e->qp->qp_num;
	memcpy(m.gid, e->gid.raw, sizeof(m.gid));
	rc = msg_send(s, &m, MSG_READY);
	for (;;) {
		if (rc)
			goto out;
		rc = msg_recv2(s, &m, MSG_AWAKE, MSG_DONE);
		if (rc < 0)
			goto out;
		if (rc == MSG_DONE) {
			rc = 0;
			break;
		}
		/* after an error, A's new QP: connect B's new one to it */
		if (m.qpn != aqpn) {
			aqpn = m.qpn;
			rc = vp_to_rts_remote(e, aqpn, &agid);
			if (rc)
				goto out;
		}
		/* A's rkey now is the one B got at the start: B uses that */
		if (m.rkey != h.rkey)
			printf("# node B: cycle %u: A's rkey is 0x%x, not "
			       "0x%x\n", m.cycle, m.rkey, h.rkey);
		rc = b_read_all(e, mr, buf, expect, &h, h.rkey, m.seed, &right);
		if (rc) {
			fprintf(stderr, "two-node B: cycle %u: read: %s\n",
				m.cycle, strerror(-rc));
			goto out;
		}
		*wrong += nblk - right;
		printf("# node B: cycle %u: %u/%u blocks right\n", m.cycle,
		       right, nblk);
		wblk = m.cycle % nblk;
		wseed = WRITE_SEED + m.cycle;
		pattern_fill(buf, h.blk, wseed);
		rc = vp_rdma(e, IBV_WR_RDMA_WRITE, buf, (uint32_t)h.blk,
			     mr->lkey, h.addr + wblk * h.blk, h.rkey, NULL);
		if (rc)
			goto out;
		memset(&m, 0, sizeof(m));
		m.a = right;
		m.b = nblk;
		m.c = wblk;
		m.seed = wseed;
		rc = msg_send(s, &m, MSG_CHECKED);
		if (rc)
			goto out;
		rc = msg_recv2(s, &m, MSG_ASLEEP, MSG_DONE);
		if (rc < 0)
			goto out;
		if (rc == MSG_DONE) {
			rc = 0;
			break;
		}
		/* A sleeps: the read must fail, and bring no byte */
		memset(buf, 0, h.blk);
		st = IBV_WC_SUCCESS;
		rc = vp_rdma(e, IBV_WR_RDMA_READ, buf, (uint32_t)h.blk,
			     mr->lkey, h.addr, h.rkey, &st);
		for (i = 0, changed = 0; i < h.blk; i++)
			changed += buf[i] != 0;
		printf("# node B: A asleep: read %s (%s), %zu bytes of its "
		       "buffer changed\n", rc ? "failed" : "SUCCEEDED",
		       ibv_wc_status_str(st), changed);
		if (!rc || changed)
			(*wrong)++;
		memset(&m, 0, sizeof(m));
		m.a = rc == -EIO ? st : IBV_WC_SUCCESS;
		m.b = !changed;
		rc = vp_new_qp(e);
		if (!rc) {
			m.qpn = e->qp->qp_num;
			rc = msg_send(s, &m, MSG_REFUSED);
		}
	}
out:
	if (mr)
		ibv_dereg_mr(mr);
	free(buf);
	free(expect);
	return rc;
}

static int node_b(const struct opts *o, const char *peer)
{
	struct vp_end e;
	unsigned int wrong = 0;
	int s, rc;

	rc = vp_open(&e, o->dev);
	if (rc) {
		fprintf(stderr, "two-node B: %s: %s\n", o->dev, strerror(-rc));
		return 1;
	}
	s = connect_retry(peer, o->port);
	if (s < 0) {
		fprintf(stderr, "two-node B: connect to %s:%d: %s\n", peer,
			o->port, strerror(-s));
		vp_close(&e);
		return 1;
	}
	set_nodelay(s);
	rc = b_run(&e, s, &wrong);
	if (rc)
		fprintf(stderr, "two-node B: %s\n", strerror(-rc));
	close(s);
	vp_close(&e);
	printf("# node B: %u wrong (blocks with wrong bytes, asleep reads "
	       "not refused)\n", wrong);
	return rc || wrong ? 1 : 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: kvdmabuf-twonode [--cycles N] [--len BYTES] "
		"[--blk BYTES] [--port N] [--dev IBDEV]\n"
		"  run in both guests of tests/vm/two-node.sh: KVDMABUF_NODE "
		"1 is engine A,\n  2 is engine B, which reaches A at "
		"KVDMABUF_NODE_PEER\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "cycles", required_argument, NULL, 'c' },
		{ "len", required_argument, NULL, 'l' },
		{ "blk", required_argument, NULL, 'b' },
		{ "port", required_argument, NULL, 'p' },
		{ "dev", required_argument, NULL, 'd' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .cycles = 3, .len = 4u << 20, .blk = 64u << 10,
			  .port = 18515, .dev = "rxe0" };
	const char *node = getenv("KVDMABUF_NODE");
	const char *peer = getenv("KVDMABUF_NODE_PEER");
	const char *why;
	int opt;

	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (opt) {
		case 'c': o.cycles = (unsigned int)strtoul(optarg, NULL, 0);
			break;
		case 'l': o.len = strtoul(optarg, NULL, 0);
			break;
		case 'b': o.blk = strtoul(optarg, NULL, 0);
			break;
		case 'p': o.port = atoi(optarg);
			break;
		case 'd': o.dev = optarg;
			break;
		default:
			usage();
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!node || (strcmp(node, "1") && strcmp(node, "2")) ||
	    (!strcmp(node, "2") && !peer) || !o.cycles || !o.blk ||
	    o.len % o.blk || o.len % 4096 || o.blk > (1u << 20)) {
		usage();
		return 2;
	}
	why = rxe_dmabuf_missing();
	if (why) {
		/* the demo needs it: a lane without it is a failed run */
		fprintf(stderr, "two-node: soft-RoCE with dma-buf MRs: %s\n",
			why);
		return 1;
	}
	return !strcmp(node, "1") ? node_a(&o) : node_b(&o, peer);
}
