// SPDX-License-Identifier: GPL-2.0
/*
 * engine.c - a serving engine's process (instance A or B) on rxe1.
 *
 * Its KV cache (and, for A, its weights) is anonymous host memory standing
 * in for GPU memory: at sleep the engine releases the physical memory
 * (the range is replaced by an inaccessible reservation, as cuMemUnmap +
 * cuMemRelease keep the virtual address range) and at wake it maps fresh
 * memory at the same address (cuMemCreate + cuMemMap).
 *
 * With the move-capable NIC (umem.c) the regions are vgem buffers instead:
 * sleep frees the buffer (handle, dma-buf fd and CPU mapping dropped), wake
 * creates a new one; kvdmabuf mode adds them as DRM regions through the
 * library with the kvd_umem NIC as its backend (tests/lib_imp_nic.h: the
 * library's dma-buf registration is a dynamic import of the proxy), so they
 * take FOLLOW; the baseline imports each buffer once, directly.
 *
 * With soft-RoCE with dma-buf MRs (rxedb) the regions are vgem buffers as
 * well, but the NIC, store, QPs and transfers are rxe's: kvdmabuf mode
 * adds them as DRM regions through the library's public path
 * (kvdmabuf_open() with rxe1, ibv_reg_dmabuf_mr() of the proxy: FOLLOW);
 * the baseline registers each buffer itself once (ibv_reg_dmabuf_mr()).
 * Their NIC address (iova) is dev_addr, the same across wakes.
 *
 * Two modes:
 *  - kvdmabuf: regions registered through libkvdmabuf with
 *    KVDMABUF_REGION_RELEASED_AT_SLEEP (soft-RoCE has no dma-buf MRs, so
 *    they take the REREGISTER path); every transfer between
 *    kvdmabuf_io_begin() and kvdmabuf_io_end(); kvdmabuf_sleep() before the
 *    release, kvdmabuf_wake() after the new mapping; new keys are
 *    republished through the key-change callback.
 *  - baseline: ibv_reg_mr() once at start, never refreshed, as transfer
 *    engines do today.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "demo.h"
#include "../../lib/kvdmabuf.h"
#include "lib_imp_nic.h"
#include "proxy_common.h"
#include "verbs_pair.h"

#define DEMO_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		     IBV_ACCESS_REMOTE_READ)

struct region {
	const char *tag;
	size_t len;
	char *addr;
	bool mapped;            /* fresh memory mapped (else released) */
	struct kvdmabuf_region *kr;     /* kvdmabuf mode */
	/* kvdmabuf mode: lkey of the current registration, set at add and
	 * by the key-change callback. Transfers read it, never the getter:
	 * kvdmabuf_region_keys() takes the context lock, which
	 * kvdmabuf_sleep() holds while it drains, so calling it between
	 * io_begin and io_end would block the drain it waits for. */
	_Atomic uint32_t lkey;
	struct ibv_mr *mr;              /* baseline mode */
	/* umem, rxedb: the current vgem buffer (addr is its CPU mapping),
	 * the device address the library knows the region by (rxedb: the
	 * MR's iova), and umem's baseline import handle (-1: none) */
	struct demo_vbuf vb;
	uint64_t dev_addr;
	int key;
};

struct stress_thread {
	struct demo_engine *e;
	pthread_t th;
	unsigned int idx;
	bool started;
	_Atomic uint64_t begun, completed, failed, wrong, refused;
	char err[160];
};

struct demo_engine {
	const char *name;
	int mode;
	int nic_kind;                   /* DEMO_NIC_* */
	int umem_fd;                    /* umem: the shared NIC */
	int drm;                        /* umem, rxedb: vgem, -1 */
	struct imp_nic inic;            /* umem: the library's backend */
	/* the peer path (rxe, rxedb): A's QP on rxe1 answers B's reads; B reads
	 * on rxe0 into its own buffer */
	struct demo_nic peer_nic;
	struct demo_qp peer;
	char *peer_buf;
	struct ibv_mr *peer_mr;
	const char *config;
	struct demo_nic nic;
	struct demo_qp qp[DEMO_MAX_QPS];
	unsigned int nqp;
	struct demo_seg seg[DEMO_SEGMENTS];
	struct kvdmabuf_ctx *ctx;
	struct region reg[DEMO_NR_REGIONS];
	unsigned int nreg;
	uint64_t key_gen[DEMO_NR_REGIONS];
	uint32_t rkey[DEMO_NR_REGIONS];
	uint64_t key_changes;
	struct stress_thread st[DEMO_STRESS_THREADS];
	unsigned int nst;
	_Atomic int stop;
};

struct demo_engine *demo_engine_new(const char *name, int mode, int nic,
				    int umem_fd, const char *config_path)
{
	struct demo_engine *e = calloc(1, sizeof(*e));
	unsigned int i;

	if (!e)
		return NULL;
	e->name = name;
	e->mode = mode;
	e->nic_kind = nic;
	e->umem_fd = umem_fd;
	e->drm = -1;
	e->config = config_path;
	for (i = 0; i < DEMO_NR_REGIONS; i++) {
		e->reg[i].key = -1;
		e->reg[i].vb.fd = -1;
		e->reg[i].dev_addr = 0x100000000ull * (i + 1);
	}
	e->reg[DEMO_R_KV].tag = "kv_cache";
	e->reg[DEMO_R_KV].len = DEMO_KV_LEN;
	e->reg[DEMO_R_W].tag = "weights";
	e->reg[DEMO_R_W].len = DEMO_W_LEN;
	return e;
}

static const char *tag_name(uint64_t sel)
{
	return sel == DEMO_TAG_WEIGHTS ? "weights" :
	       sel == DEMO_TAG_KV ? "kv_cache" : NULL;
}

static bool tag_has(uint64_t sel, unsigned int r)
{
	return sel == DEMO_TAG_ALL || (sel == DEMO_TAG_KV && r == DEMO_R_KV) ||
	       (sel == DEMO_TAG_WEIGHTS && r == DEMO_R_W);
}

/* umem and rxedb: regions are vgem buffers */
static bool vgem_regions(const struct demo_engine *e)
{
	return e->nic_kind != DEMO_NIC_RXE;
}

/* The address of @block of @r on the NIC: the host address for rxe, the
 * dma-buf MR's iova for rxedb. */
static uint64_t nic_addr(const struct demo_engine *e, const struct region *r,
			 unsigned int block)
{
	return (e->nic_kind == DEMO_NIC_RXEDB ? r->dev_addr :
		(uintptr_t)r->addr) + (uint64_t)block * DEMO_BLOCK;
}

/* ---- memory: map fresh, release ---- */

static int region_map(struct demo_engine *e, struct region *r,
		      struct demo_msg *m)
{
	if (vgem_regions(e)) {
		int rc = demo_vbuf_new(e->drm, r->len, &r->vb);

		if (rc)
			return demo_fail(m, rc, "%s: vgem buffer for %s: %s",
					 e->name, r->tag, strerror(-rc));
		r->addr = r->vb.cpu;
		r->mapped = true;
		if (r == &e->reg[DEMO_R_W])
			pattern_fill(r->addr, r->len, DEMO_W_SEED ^ 0xffu);
		return 0;
	}

	/* populated: new physical memory, as cuMemCreate allocates it */
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE |
		    (r->addr ? MAP_FIXED : 0);
	void *p = mmap(r->addr, r->len, PROT_READ | PROT_WRITE, flags, -1, 0);

	if (p == MAP_FAILED)
		return demo_fail(m, -ENOMEM, "%s: mmap %s (%zu bytes) at %p: %s",
				 e->name, r->tag, r->len, (void *)r->addr,
				 strerror(errno));
	if (r->addr && p != r->addr) {
		munmap(p, r->len);
		return demo_fail(m, -EFAULT, "%s: %s mapped at %p, not %p",
				 e->name, r->tag, p, (void *)r->addr);
	}
	r->addr = p;
	r->mapped = true;
	/* the engine loads its weights into the new memory */
	if (r == &e->reg[DEMO_R_W])
		pattern_fill(r->addr, r->len, DEMO_W_SEED ^ 0xffu);
	return 0;
}

/* Frees the pages (unless something pins them) and keeps the range. */
static int region_release(struct demo_engine *e, struct region *r,
			  struct demo_msg *m)
{
	if (vgem_regions(e)) {
		/* handle, dma-buf fd, mapping: what is left holding the
		 * buffer is what the NIC holds */
		demo_vbuf_free(e->drm, &r->vb);
		r->addr = NULL;
		r->mapped = false;
		return 0;
	}

	void *p = mmap(r->addr, r->len, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
		       -1, 0);

	if (p == MAP_FAILED)
		return demo_fail(m, -ENOMEM, "%s: release %s: %s", e->name,
				 r->tag, strerror(errno));
	r->mapped = false;
	return 0;
}

/* ---- keys ---- */

/* New keys of this engine's regions: the engine republishes them. */
static void on_keys(struct kvdmabuf_region *const *krs, unsigned int n,
		    void *arg)
{
	struct demo_engine *e = arg;
	unsigned int i, k;
	uint32_t lkey, rkey;
	uint64_t gen;

	for (k = 0; k < n; k++) {
		for (i = 0; i < e->nreg && e->reg[i].kr != krs[k]; i++)
			;
		if (i == e->nreg ||
		    kvdmabuf_region_keys(krs[k], 0, &lkey, &rkey, &gen))
			continue;
		e->key_gen[i] = gen;
		atomic_store(&e->reg[i].lkey, lkey);
		e->rkey[i] = rkey;
		e->key_changes++;
	}
}

static void keys_reply(struct demo_engine *e, struct demo_msg *m)
{
	unsigned int i;

	for (i = 0; i < e->nreg; i++) {
		m->a[2 * i] = e->key_gen[i];
		m->a[2 * i + 1] = e->rkey[i];
	}
	m->a[4] = e->key_changes;
}

/* ---- transfers ---- */

static int xfer_begin(struct demo_engine *e, struct region *r)
{
	return e->mode == DEMO_KVDMABUF ? kvdmabuf_io_begin(r->kr) : 0;
}

static void xfer_end(struct demo_engine *e, struct region *r)
{
	if (e->mode == DEMO_KVDMABUF)
		kvdmabuf_io_end(r->kr);
}

/* One block between @block of @r and store slot @slot, on QP @q. */
static int xfer(struct demo_engine *e, unsigned int q, struct region *r,
		unsigned int block, int write, unsigned int slot,
		char *err, size_t errlen)
{
	const struct demo_seg *s = &e->seg[slot % DEMO_SEGMENTS];
	uint64_t raddr = s->addr + (uint64_t)(slot / DEMO_SEGMENTS) *
			 DEMO_BLOCK;
	uint32_t lkey;
	int rc, status;

	if (e->mode == DEMO_KVDMABUF)
		lkey = atomic_load(&r->lkey);
	else if (e->nic_kind == DEMO_NIC_UMEM)
		lkey = (uint32_t)r->key;
	else
		lkey = r->mr->lkey;
	if (e->nic_kind == DEMO_NIC_UMEM) {
		uint64_t loff = (uint64_t)block * DEMO_BLOCK;

		rc = write ? demo_umem_move(e->umem_fd, lkey, loff, s->rkey,
					    raddr, DEMO_BLOCK) :
			     demo_umem_move(e->umem_fd, s->rkey, raddr, lkey,
					    loff, DEMO_BLOCK);
		if (rc)
			snprintf(err, errlen, "%s: NIC %s of slot %u (key %u "
				 "-> %u): %s", e->name, write ? "put" : "get",
				 slot, write ? lkey : s->rkey,
				 write ? s->rkey : lkey, strerror(-rc));
		return rc;
	}
	rc = demo_rdma(&e->qp[q], write,
		       (void *)(uintptr_t)nic_addr(e, r, block), DEMO_BLOCK, lkey, raddr, s->rkey, &status);
	if (rc)
		snprintf(err, errlen, "%s: RDMA %s of slot %u: %s%s%s",
			 e->name, write ? "write" : "read", slot,
			 strerror(-rc), rc == -EIO ? ", completion: " : "",
			 rc == -EIO ? demo_wc_status(status) : "");
	return rc;
}

/* PUT / GET of m->a[1] blocks; see enum demo_op. */
static int put_get(struct demo_engine *e, struct demo_msg *m, int write)
{
	unsigned int slot0 = (unsigned int)m->a[0], n = (unsigned int)m->a[1];
	uint32_t seed0 = (uint32_t)m->a[2];
	unsigned int block0 = (unsigned int)m->a[3];
	unsigned int ri = (unsigned int)m->a[4];
	bool no_cpu = m->a[5];
	unsigned int i, ok = 0, correct = 0, refused = 0, errors = 0;
	struct region *r;
	char err[200] = "", scratch[200];
	int rc;

	if (ri >= e->nreg || n > 64 ||
	    (block0 + n) * (size_t)DEMO_BLOCK > e->reg[ri].len)
		return demo_fail(m, -EINVAL, "%s: bad transfer request",
				 e->name);
	r = &e->reg[ri];
	for (i = 0; i < n; i++) {
		char *local = r->addr + (size_t)(block0 + i) * DEMO_BLOCK;

		rc = xfer_begin(e, r);
		if (rc == -ESHUTDOWN) {
			refused++;
			continue;
		}
		if (rc) {
			errors++;
			continue;
		}
		if (!no_cpu) {
			if (write)
				pattern_fill(local, DEMO_BLOCK, seed0 + i);
			else
				memset(local, 0xa5, DEMO_BLOCK);
		}
		/* keep the first error's message */
		rc = xfer(e, 0, r, block0 + i, write, slot0 + i,
			  err[0] ? scratch : err, sizeof(err));
		if (rc) {
			errors++;
		} else {
			ok++;
			if (!write && !no_cpu &&
			    pattern_check(local, DEMO_BLOCK, seed0 + i) < 0)
				correct++;
		}
		/* a transfer that never ended keeps the region busy, so
		 * that a sleep fails (drain timeout) instead of freeing
		 * memory the NIC may still write */
		if (rc != -ENOTRECOVERABLE)
			xfer_end(e, r);
	}
	m->a[0] = ok;
	m->a[1] = write ? ok : correct;
	m->a[2] = refused;
	m->a[3] = errors;
	snprintf(m->text, sizeof(m->text), "%s", err);
	return 0;
}

/* ---- stress: transfers in flight up to the sleep ---- */

static void *stress_main(void *arg)
{
	struct stress_thread *t = arg;
	struct demo_engine *e = t->e;
	struct region *r = &e->reg[DEMO_R_KV];
	unsigned int j, blk, slot, q = 1 + t->idx;
	uint32_t seed;
	char *local;
	int rc;

	for (j = 0; !atomic_load(&e->stop); j++) {
		blk = DEMO_STRESS_BLOCK0 + t->idx * 16 + j % 8;
		slot = DEMO_SLOT_STRESS + t->idx * 8 + j % 8;
		seed = 0x50000000u + (t->idx << 20) + j;
		/* put */
		rc = xfer_begin(e, r);
		if (rc) {
			t->refused += rc == -ESHUTDOWN;
			t->failed += rc != -ESHUTDOWN;
			break;
		}
		t->begun++;
		local = r->addr + (size_t)blk * DEMO_BLOCK;
		pattern_fill(local, DEMO_BLOCK, seed);
		rc = xfer(e, q, r, blk, 1, slot, t->err, sizeof(t->err));
		if (rc)
			t->failed++;
		else
			t->completed++;
		if (rc != -ENOTRECOVERABLE)
			xfer_end(e, r);
		if (rc)
			break;
		/* get it back into another block and check it */
		rc = xfer_begin(e, r);
		if (rc) {
			t->refused += rc == -ESHUTDOWN;
			t->failed += rc != -ESHUTDOWN;
			break;
		}
		t->begun++;
		local = r->addr + (size_t)(blk + 8) * DEMO_BLOCK;
		memset(local, 0xa5, DEMO_BLOCK);
		rc = xfer(e, q, r, blk + 8, 0, slot, t->err, sizeof(t->err));
		if (rc)
			t->failed++;
		else if (pattern_check(local, DEMO_BLOCK, seed) >= 0)
			t->wrong++;
		else
			t->completed++;
		if (rc != -ENOTRECOVERABLE)
			xfer_end(e, r);
		if (rc)
			break;
	}
	return NULL;
}

static int stress_start(struct demo_engine *e, struct demo_msg *m)
{
	unsigned int n = (unsigned int)m->a[0], i;
	int rc;

	if (n > DEMO_STRESS_THREADS || e->nst ||
	    (e->nic_kind != DEMO_NIC_UMEM && n + 1 > e->nqp))
		return demo_fail(m, -EINVAL, "%s: bad stress request",
				 e->name);
	atomic_store(&e->stop, 0);
	for (i = 0; i < n; i++) {
		struct stress_thread *t = &e->st[i];

		memset(t, 0, sizeof(*t));
		t->e = e;
		t->idx = i;
		rc = pthread_create(&t->th, NULL, stress_main, t);
		if (rc) {
			atomic_store(&e->stop, 1);
			return demo_fail(m, -rc, "%s: pthread_create: %s",
					 e->name, strerror(rc));
		}
		t->started = true;
		e->nst++;
	}
	return 0;
}

/* Joins the stress threads; adds their counts to m->a[5..10]. */
static void stress_join(struct demo_engine *e, struct demo_msg *m)
{
	unsigned int i;

	atomic_store(&e->stop, 1);
	for (i = 0; i < e->nst; i++) {
		struct stress_thread *t = &e->st[i];

		if (!t->started)
			continue;
		pthread_join(t->th, NULL);
		t->started = false;
		m->a[5] += t->begun;
		m->a[6] += t->completed;
		m->a[7] += t->failed;
		m->a[8] += t->wrong;
		m->a[9] += t->refused;
		if (t->err[0] && !m->text[0])
			snprintf(m->text, sizeof(m->text), "%s", t->err);
	}
	e->nst = 0;
}

static uint64_t stress_begun(struct demo_engine *e)
{
	uint64_t n = 0;
	unsigned int i;

	for (i = 0; i < e->nst; i++)
		n += e->st[i].begun;
	return n;
}

/* ---- requests ---- */

static int engine_init(struct demo_engine *e, struct demo_msg *m)
{
	struct kvdmabuf_options o;
	unsigned int i;
	int rc;

	e->nqp = (unsigned int)m->a[0];
	e->nreg = (unsigned int)m->a[1];
	if (!e->nqp || e->nqp > DEMO_MAX_QPS || !e->nreg ||
	    e->nreg > DEMO_NR_REGIONS)
		return demo_fail(m, -EINVAL, "%s: bad init request", e->name);
	if (e->nic_kind == DEMO_NIC_UMEM) {
		e->nqp = 0;
		m->n = 0;
		e->drm = vgem_open();
		if (e->drm < 0)
			return demo_fail(m, e->drm, "%s: no vgem device",
					 e->name);
		if (e->mode != DEMO_KVDMABUF)
			return 0;
		/* the library's NIC is the kvd_umem fabric: its dma-buf
		 * registration is a dynamic import of the proxy */
		e->inic.fd = e->umem_fd;
		e->inic.pinned = 0;
		memset(&o, 0, sizeof(o));
		o.config_path = e->config;
		o.key_change = on_keys;
		o.key_change_arg = e;
		rc = kvd_open_ops(&o, &imp_nic_ops, &e->inic, &e->ctx, m->text,
				  sizeof(m->text));
		if (rc)
			e->ctx = NULL;
		return rc;
	}
	rc = demo_nic_open(&e->nic, vp_dev_name(1), m->text, sizeof(m->text));
	if (rc)
		return rc;
	for (i = 0; i < e->nqp; i++) {
		rc = demo_qp_create(&e->nic, &e->qp[i]);
		if (rc) {
			e->nqp = i;
			return demo_fail(m, rc, "%s: create QP: %s", e->name,
					 strerror(-rc));
		}
		m->qp[i].qpn = e->qp[i].qp->qp_num;
		memcpy(m->qp[i].gid, e->nic.gid, sizeof(e->nic.gid));
	}
	m->n = e->nqp;
	if (e->nic_kind == DEMO_NIC_RXEDB) {
		e->drm = vgem_open();
		if (e->drm < 0)
			return demo_fail(m, e->drm, "%s: no vgem device",
					 e->name);
	}
	if (e->mode != DEMO_KVDMABUF)
		return 0;
	/* the transfer engine's own PD, so its QPs can use the lkeys */
	memset(&o, 0, sizeof(o));
	o.config_path = e->config;
	o.pds = &e->nic.pd;
	o.nr_pds = 1;
	o.key_change = on_keys;
	o.key_change_arg = e;
	rc = kvdmabuf_open(&o, &e->ctx, m->text, sizeof(m->text));
	if (rc)
		e->ctx = NULL;
	return rc;
}

static int engine_connect(struct demo_engine *e, struct demo_msg *m)
{
	unsigned int i;
	int rc;

	if (e->nic_kind == DEMO_NIC_UMEM) {
		memcpy(e->seg, m->seg, sizeof(e->seg));
		return 0;
	}
	if (m->n != e->nqp)
		return demo_fail(m, -EINVAL, "%s: %u peer QPs for %u QPs",
				 e->name, m->n, e->nqp);
	for (i = 0; i < e->nqp; i++) {
		rc = demo_qp_connect(&e->qp[i], &m->qp[i]);
		if (rc)
			return demo_fail(m, rc, "%s: connect QP: %s", e->name,
					 strerror(-rc));
	}
	memcpy(e->seg, m->seg, sizeof(e->seg));
	return 0;
}

static int engine_regions(struct demo_engine *e, struct demo_msg *m)
{
	struct kvdmabuf_region_desc d;
	unsigned int i;
	uint32_t lkey, rkey;
	int rc;

	for (i = 0; i < e->nreg; i++) {
		struct region *r = &e->reg[i];

		rc = region_map(e, r, m);
		if (rc)
			return rc;
		if (e->mode == DEMO_BASELINE &&
		    e->nic_kind == DEMO_NIC_UMEM) {
			/* registered once on this buffer, never refreshed */
			r->key = imp_import(e->umem_fd, r->vb.fd, 0);
			if (r->key < 0)
				return demo_fail(m, r->key, "%s: kvd_umem "
						 "import of %s: %s", e->name,
						 r->tag, strerror(-r->key));
			e->key_gen[i] = 1;
			e->rkey[i] = (uint32_t)r->key;
			continue;
		}
		if (e->mode == DEMO_BASELINE) {
			/* rxedb: the vgem buffer's own dma-buf, no proxy */
			r->mr = e->nic_kind == DEMO_NIC_RXEDB ?
				ibv_reg_dmabuf_mr(e->nic.pd, 0, r->len,
						  r->dev_addr, r->vb.fd,
						  DEMO_ACCESS) :
				ibv_reg_mr(e->nic.pd, r->addr, r->len,
					   DEMO_ACCESS);
			if (!r->mr)
				return demo_fail(m, errno ? -errno : -EIO,
						 "%s: %s %s: %s", e->name,
						 e->nic_kind == DEMO_NIC_RXEDB ?
						 "ibv_reg_dmabuf_mr" :
						 "ibv_reg_mr", r->tag,
						 strerror(errno));
			e->key_gen[i] = 1;
			e->rkey[i] = r->mr->rkey;
			continue;
		}
		memset(&d, 0, sizeof(d));
		d.addr = r->addr;
		d.len = r->len;
		d.mem = KVDMABUF_MEM_HOST;
		d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
		d.tag = r->tag;
		if (vgem_regions(e)) {
			d.addr = (void *)(uintptr_t)r->dev_addr;
			d.mem = KVDMABUF_MEM_DRM;
			d.flags = 0;
			d.drm_fd = e->drm;
			d.drm_handle = r->vb.handle;
		}
		rc = kvdmabuf_region_add(e->ctx, &d, &r->kr);
		if (rc) {
			r->kr = NULL;
			return demo_fail(m, rc, "%s: kvdmabuf_region_add %s: "
					 "%s", e->name, r->tag,
					 kvdmabuf_last_error(e->ctx));
		}
		rc = kvdmabuf_region_keys(r->kr, 0, &lkey, &rkey,
					  &e->key_gen[i]);
		if (rc)
			return demo_fail(m, rc, "%s: region keys: %s", e->name,
					 strerror(-rc));
		atomic_store(&r->lkey, lkey);
		e->rkey[i] = rkey;
	}
	keys_reply(e, m);
	m->a[6] = e->nic_kind == DEMO_NIC_UMEM ? 0 :
		  nic_addr(e, &e->reg[DEMO_R_KV], 0);
	/* the mode the library chose for the KV region (measured) */
	if (e->mode == DEMO_KVDMABUF) {
		struct kvdmabuf_region_info info;

		rc = kvdmabuf_region_info(e->reg[DEMO_R_KV].kr, &info);
		if (rc)
			return demo_fail(m, rc, "%s: region info: %s", e->name,
					 strerror(-rc));
		snprintf(m->text, sizeof(m->text), "%s",
			 kvdmabuf_mode_name(info.mode));
	}
	return 0;
}

static int engine_sleep(struct demo_engine *e, struct demo_msg *m)
{
	uint64_t sel = m->a[0];
	struct kvdmabuf_region_info info;
	struct timespec ts = { 0, 2000000 };
	unsigned int i, waited, nst;
	int rc;

	memset(m->a, 0, sizeof(m->a));
	if (e->nst) {
		/* let the stress threads get going, then sleep under them */
		for (waited = 0; waited < 1500 &&
		     stress_begun(e) < 16 * (uint64_t)e->nst; waited++)
			nanosleep(&ts, NULL);
		if (e->mode == DEMO_KVDMABUF &&
		    !kvdmabuf_region_info(e->reg[DEMO_R_KV].kr, &info))
			m->a[10] = info.inflight;
	}
	if (e->mode == DEMO_KVDMABUF) {
		rc = kvdmabuf_sleep(e->ctx, tag_name(sel));
		if (rc) {
			stress_join(e, m);
			return demo_fail(m, rc, "%s: kvdmabuf_sleep(%s): %s",
					 e->name, tag_name(sel) ?
					 tag_name(sel) : "all",
					 kvdmabuf_last_error(e->ctx));
		}
	}
	/* the drain let every running transfer finish: threads see refusal */
	nst = e->nst;
	stress_join(e, m);
	/* a QP that broke after its last completion would fail the next
	 * round at once: say so here, where it happened */
	for (i = 1; i <= nst && i < e->nqp; i++)
		if (demo_qp_in_error(&e->qp[i]) == 1)
			m->a[11]++;
	for (i = 0; i < e->nreg; i++)
		if (tag_has(sel, i) && e->reg[i].mapped) {
			rc = region_release(e, &e->reg[i], m);
			if (rc)
				return rc;
		}
	return 0;
}

static int engine_wake(struct demo_engine *e, struct demo_msg *m)
{
	uint64_t sel = m->a[0];
	unsigned int i;
	int rc;

	for (i = 0; i < e->nreg; i++)
		if (tag_has(sel, i) && !e->reg[i].mapped) {
			rc = region_map(e, &e->reg[i], m);
			if (rc)
				return rc;
			/* the new buffer, for the library's next wake */
			if (vgem_regions(e) && e->reg[i].kr) {
				rc = kvdmabuf_region_set_drm_handle(
					e->reg[i].kr, e->drm,
					e->reg[i].vb.handle);
				if (rc)
					return demo_fail(m, rc, "%s: set DRM "
							 "handle: %s", e->name,
							 kvdmabuf_last_error(
								 e->ctx));
			}
		}
	if (e->mode == DEMO_KVDMABUF) {
		rc = kvdmabuf_wake(e->ctx, tag_name(sel));
		if (rc)
			return demo_fail(m, rc, "%s: kvdmabuf_wake(%s): %s",
					 e->name, tag_name(sel) ?
					 tag_name(sel) : "all",
					 kvdmabuf_last_error(e->ctx));
	}
	memset(m->a, 0, sizeof(m->a));
	keys_reply(e, m);
	return 0;
}

static int engine_mem(struct demo_engine *e, struct demo_msg *m)
{
	long pin = vmpin_kb();
	unsigned int i;

	if (pin < 0)
		return demo_fail(m, (int)pin, "%s: VmPin: %s", e->name,
				 strerror((int)-pin));
	memset(m->a, 0, sizeof(m->a));
	m->a[0] = (uint64_t)pin;
	for (i = 0; i < e->nreg; i++) {
		long res = demo_resident(e->reg[i].addr, e->reg[i].len);

		if (res < 0)
			return demo_fail(m, (int)res, "%s: mincore %s: %s",
					 e->name, e->reg[i].tag,
					 strerror((int)-res));
		m->a[1 + i] = (uint64_t)res;
	}
	return 0;
}

static int engine_quit(struct demo_engine *e, struct demo_msg *m)
{
	unsigned int i;
	int rc, ret = 0;

	stress_join(e, m);
	for (i = 0; i < e->nreg; i++) {
		struct region *r = &e->reg[i];

		if (r->kr) {
			rc = kvdmabuf_region_remove(r->kr);
			if (rc && !ret)
				ret = demo_fail(m, rc, "%s: region_remove %s: "
						"%s", e->name, r->tag,
						kvdmabuf_last_error(e->ctx));
			r->kr = NULL;
		}
		if (r->mr) {
			rc = ibv_dereg_mr(r->mr);
			if (rc && !ret)
				ret = demo_fail(m, -rc, "%s: ibv_dereg_mr %s: "
						"%s", e->name, r->tag,
						strerror(rc));
			r->mr = NULL;
		}
		if (r->key >= 0) {
			rc = imp_release(e->umem_fd, r->key);
			if (rc && !ret)
				ret = demo_fail(m, rc, "%s: kvd_umem release "
						"%s: %s", e->name, r->tag,
						strerror(-rc));
			r->key = -1;
		}
		if (vgem_regions(e))
			demo_vbuf_free(e->drm, &r->vb);
		else if (r->addr)
			munmap(r->addr, r->len);
		r->addr = NULL;
	}
	kvdmabuf_close(e->ctx);
	e->ctx = NULL;
	for (i = 0; i < e->nqp; i++)
		demo_qp_destroy(&e->qp[i]);
	if (e->peer.qp)
		demo_qp_destroy(&e->peer);
	if (e->peer_mr)
		ibv_dereg_mr(e->peer_mr);
	e->peer_mr = NULL;
	free(e->peer_buf);
	e->peer_buf = NULL;
	if (e->peer_nic.ctx)
		demo_nic_close(&e->peer_nic);
	if (e->nic.ctx)
		demo_nic_close(&e->nic);
	if (e->drm >= 0)
		close(e->drm);
	e->drm = -1;
	return ret;
}

/* ---- the peer path: B reads A's KV by A's key ---- */

#define PEER_BLOCKS 8

static int peer_qp(struct demo_engine *e, struct demo_msg *m)
{
	bool reader = m->a[0];
	struct demo_nic *n = reader ? &e->peer_nic : &e->nic;
	int rc;

	if (e->nic_kind == DEMO_NIC_UMEM)
		return demo_fail(m, -EINVAL, "%s: peer QPs are for rxe",
				 e->name);
	if (e->peer.qp) {
		/* after a stale key broke it */
		rc = demo_qp_reset(&e->peer);
		if (rc)
			return demo_fail(m, rc, "%s: reset peer QP: %s",
					 e->name, strerror(-rc));
		goto reply;
	}
	if (reader) {
		rc = demo_nic_open(&e->peer_nic, vp_dev_name(0), m->text,
				   sizeof(m->text));
		if (rc)
			return rc;
		e->peer_buf = malloc(PEER_BLOCKS * (size_t)DEMO_BLOCK);
		if (!e->peer_buf)
			return demo_fail(m, -ENOMEM, "%s: peer buffer", e->name);
		e->peer_mr = ibv_reg_mr(e->peer_nic.pd, e->peer_buf,
					PEER_BLOCKS * (size_t)DEMO_BLOCK,
					IBV_ACCESS_LOCAL_WRITE);
		if (!e->peer_mr)
			return demo_fail(m, errno ? -errno : -EIO, "%s: "
					 "ibv_reg_mr peer buffer: %s", e->name,
					 strerror(errno));
	}
	rc = demo_qp_create(n, &e->peer);
	if (rc)
		return demo_fail(m, rc, "%s: create peer QP: %s", e->name,
				 strerror(-rc));
reply:
	m->n = 1;
	m->qp[0].qpn = e->peer.qp->qp_num;
	memcpy(m->qp[0].gid, n->gid, sizeof(n->gid));
	return 0;
}

static int peer_connect(struct demo_engine *e, struct demo_msg *m)
{
	int rc;

	if (!e->peer.qp || m->n != 1)
		return demo_fail(m, -EINVAL, "%s: bad peer connect", e->name);
	rc = demo_qp_connect(&e->peer, &m->qp[0]);
	return rc ? demo_fail(m, rc, "%s: connect peer QP: %s", e->name,
			      strerror(-rc)) : 0;
}

/* B reads A's KV by the key it holds; see OP_PEEK. */
static int peek(struct demo_engine *e, struct demo_msg *m)
{
	uint32_t rkey = (uint32_t)m->a[0], seed0 = (uint32_t)m->a[4];
	uint64_t raddr = m->a[1];
	unsigned int block0 = (unsigned int)m->a[2], n = (unsigned int)m->a[3];
	unsigned int i, delivered = 0, correct = 0, errors = 0, access = 0;
	struct region *r = &e->reg[DEMO_R_KV];
	char err[200] = "";
	int rc, status = 0;

	if (n > PEER_BLOCKS || !e->nreg ||
	    (e->nic_kind != DEMO_NIC_UMEM && !e->peer.qp))
		return demo_fail(m, -EINVAL, "%s: bad peek request", e->name);
	for (i = 0; i < n; i++) {
		uint64_t roff = (uint64_t)(block0 + i) * DEMO_BLOCK;
		char *local;

		if (e->nic_kind != DEMO_NIC_UMEM) {
			local = e->peer_buf + (size_t)i * DEMO_BLOCK;
			memset(local, 0xa5, DEMO_BLOCK);
			rc = demo_rdma(&e->peer, 0, local, DEMO_BLOCK,
				       e->peer_mr->lkey, raddr + roff, rkey,
				       &status);
			if (rc == -EIO && status == IBV_WC_REM_ACCESS_ERR)
				access++;
			if (rc && !err[0])
				snprintf(err, sizeof(err), "%s",
					 rc == -EIO ? demo_wc_status(status) :
					 strerror(-rc));
		} else {
			unsigned int blk = DEMO_PEER_BLOCK0 + i;

			local = r->addr + (size_t)blk * DEMO_BLOCK;
			rc = xfer_begin(e, r);
			if (rc) {
				errors++;
				continue;
			}
			memset(local, 0xa5, DEMO_BLOCK);
			rc = demo_umem_move(e->umem_fd, rkey, raddr + roff,
					    e->mode == DEMO_KVDMABUF ?
					    atomic_load(&r->lkey) :
					    (uint32_t)r->key,
					    (uint64_t)blk * DEMO_BLOCK,
					    DEMO_BLOCK);
			xfer_end(e, r);
			if (rc == -ENODEV || rc == -ENOENT)
				access++;
			if (rc && !err[0])
				snprintf(err, sizeof(err), "%s",
					 strerror(-rc));
		}
		if (rc) {
			errors++;
			/* an RC QP is in the error state after that: the
			 * rest counts as not delivered */
			if (e->nic_kind != DEMO_NIC_UMEM) {
				errors += n - i - 1;
				break;
			}
			continue;
		}
		delivered++;
		if (pattern_check(local, DEMO_BLOCK, seed0 + i) < 0)
			correct++;
	}
	m->a[0] = delivered;
	m->a[1] = correct;
	m->a[2] = errors;
	m->a[3] = access;
	snprintf(m->text, sizeof(m->text), "%s", err);
	return 0;
}

/*
 * rxedb: a key that was A's and is no more. A registers a one-block vgem
 * buffer on its PD at the iova of its KV block m->a[0] (so that only the
 * key is wrong when a peer reads that block by it), deregisters it and
 * frees the buffer: a peer that cached the key must be refused by the
 * NIC's remote access check.
 */
static int dead_key(struct demo_engine *e, struct demo_msg *m)
{
	struct demo_vbuf vb = { .fd = -1 };
	uint64_t iova = nic_addr(e, &e->reg[DEMO_R_KV], (unsigned int)m->a[0]);
	struct ibv_mr *mr;
	int rc;

	if (e->nic_kind != DEMO_NIC_RXEDB || !e->nic.pd ||
	    (m->a[0] + 1) * DEMO_BLOCK > DEMO_KV_LEN)
		return demo_fail(m, -EINVAL, "%s: dead keys are for rxedb",
				 e->name);
	rc = demo_vbuf_new(e->drm, DEMO_BLOCK, &vb);
	if (rc)
		return demo_fail(m, rc, "%s: vgem buffer: %s", e->name,
				 strerror(-rc));
	mr = ibv_reg_dmabuf_mr(e->nic.pd, 0, DEMO_BLOCK, iova, vb.fd,
			       DEMO_ACCESS);
	if (!mr) {
		rc = errno ? -errno : -EIO;
		demo_vbuf_free(e->drm, &vb);
		return demo_fail(m, rc, "%s: ibv_reg_dmabuf_mr: %s", e->name,
				 strerror(-rc));
	}
	memset(m->a, 0, sizeof(m->a));
	m->a[0] = mr->rkey;
	m->a[1] = iova;
	rc = ibv_dereg_mr(mr);
	demo_vbuf_free(e->drm, &vb);
	return rc ? demo_fail(m, -rc, "%s: ibv_dereg_mr: %s", e->name,
			      strerror(rc)) : 0;
}

int demo_engine_serve(struct demo_msg *m, void *arg)
{
	struct demo_engine *e = arg;

	switch (m->op) {
	case OP_INIT:
		return engine_init(e, m);
	case OP_CONNECT:
		return engine_connect(e, m);
	case OP_REGIONS:
		return engine_regions(e, m);
	case OP_PUT:
		return put_get(e, m, 1);
	case OP_GET:
		return put_get(e, m, 0);
	case OP_SLEEP:
		return engine_sleep(e, m);
	case OP_WAKE:
		return engine_wake(e, m);
	case OP_MEM:
		return engine_mem(e, m);
	case OP_STRESS:
		return stress_start(e, m);
	case OP_PEER_QP:
		return peer_qp(e, m);
	case OP_PEER_CONNECT:
		return peer_connect(e, m);
	case OP_PEEK:
		return peek(e, m);
	case OP_DEAD_KEY:
		return dead_key(e, m);
	case OP_QUIT:
		return engine_quit(e, m);
	default:
		return demo_fail(m, -EINVAL, "%s: unknown request %u", e->name,
				 m->op);
	}
}
