// SPDX-License-Identifier: GPL-2.0
/*
 * preload_follow - FOLLOW through libkvdmabuf-preload.so on real verbs: a
 * stand-in transfer engine with no kvdmabuf call (its own context, PD and
 * QP on rxe0) registers its KV memory by address with ibv_reg_mr, or (the
 * dmabuf variant) exports it as a dma-buf and registers that with
 * ibv_reg_dmabuf_mr, iova = its address, as Mooncake does; a peer
 * (rxe1, its own context) reads and writes it through the engine's rkey.
 * The engine's KV memory is what a sleep-mode allocator hands it: memfd
 * pages mapped at a fixed address, exported as a udmabuf that backs a
 * kvdmabuf proxy; the allocator's hook (not the engine) declares the
 * region with the proxy to the preload, and at sleep revokes the proxy and
 * frees the memory, at wake maps new memory at the same address and
 * attaches it to the proxy. Needs the soft-RoCE with dma-buf MRs of
 * tests/rxe (6.12, 7.3), /dev/kvdmabuf and /dev/udmabuf.
 *
 * Under the preload (the program runs itself again with LD_PRELOAD, as
 * preload_engine does) the engine's address registration is made on the
 * proxy: after every wake its lkey and rkey are the same and the peer's
 * read through the old rkey returns the new bytes, while asleep the
 * peer's read completes in error with no byte, and the old memory is
 * freed (no importer mapping of it, nothing pinned). The preload's state
 * file (`kvdmabuf status`) lists the MR as on-proxy on rxe0.
 *
 * Without the preload (the same scenario in a child run without
 * LD_PRELOAD: the baseline) the engine's MR pins the first memory: the
 * peer reads the old bytes while asleep and after wake, through a key
 * that still "works" - the seed's silent failure, asserted as such.
 */
#include <dlfcn.h>
#include <linux/udmabuf.h>
#include <stdbool.h>
#include <sys/mman.h>

#include "harness.h"
#include "proxy_common.h"
#include "rxe_env.h"
#include "verbs_pair.h"
#include "kvdmabuf_preload.h"
#include "preload_rerun.h"

#define KV_ADDR 0x7e4000000000ull
#define LEN (1u << 20)
#define BLK 4096u
#define CYCLES 2
#define SEED0 0x100u

/* What a peer's access found (OLD: bytes of memory freed at a sleep). */
enum seen { SEEN_NONE, SEEN_NEW, SEEN_OLD, SEEN_OTHER, SEEN_ERROR };

/* What the scenario observed; checked by the tests. */
struct obs {
	int preload;                    /* the preload's API was found */
	int on_proxy;                   /* preload's count; -1 without */
	uint32_t lkey, rkey;            /* at registration */
	int keys_changed;               /* any wake changed the engine's MR */
	int listed;                     /* the state file shows it on-proxy */
	int awake_read, awake_write;    /* SEEN_* before the first sleep */
	int sleep_rc;                   /* the preload's sleep check */
	int revoke_rc;
	uint32_t attach_after, stale_after, maps_after; /* proxy, asleep */
	long pin_kb_engine;             /* VmPin with the engine's MR */
	int asleep[CYCLES];             /* SEEN_*: peer's read while asleep */
	int asleep_status[CYCLES];      /* its completion status */
	int woke[CYCLES];               /* SEEN_*: peer's read after wake */
	int wrote[CYCLES];              /* SEEN_NEW: peer's write in new memory */
	char err[256];                  /* why the scenario stopped, or "" */
};

/* Runs itself again under the preload (the baseline child is told not
 * to, by KVDMABUF_PRELOAD_TRIED). */
__attribute__((constructor)) static void under_preload(int argc, char **argv)
{
	(void)argc;
	preload_rerun(argv, NULL);
}

/* ---- the allocator's sleep hook: proxy, memory, preload API ---- */

struct hook {
	int dev, udev, proxy;
	int memfd, ubuf;                /* the current backing */
	int (*declare)(void *, size_t, const char *, int, uint64_t);
	int (*sleep)(const char *, char *, size_t);
	int (*wake)(const char *, char *, size_t);
	int (*query)(struct kvdmabuf_preload_state *);
};

/* New memory at KV_ADDR filled with @seed, exported as a udmabuf. */
static int hook_alloc(struct hook *h, uint32_t seed)
{
	struct udmabuf_create c = { .flags = UDMABUF_FLAGS_CLOEXEC,
				    .size = LEN };
	void *p;

	h->memfd = memfd_create("kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (h->memfd < 0 || ftruncate(h->memfd, LEN) ||
	    fcntl(h->memfd, F_ADD_SEALS, F_SEAL_SHRINK))
		return -errno;
	p = mmap((void *)(uintptr_t)KV_ADDR, LEN, PROT_READ | PROT_WRITE,
		 MAP_SHARED | MAP_FIXED, h->memfd, 0);
	if (p == MAP_FAILED)
		return -errno;
	pattern_fill(p, LEN, seed);
	c.memfd = (uint32_t)h->memfd;
	h->ubuf = ioctl(h->udev, UDMABUF_CREATE, &c);
	return h->ubuf < 0 ? -errno : 0;
}

static void hook_free(struct hook *h)
{
	if (h->memfd >= 0)
		munmap((void *)(uintptr_t)KV_ADDR, LEN);
	if (h->ubuf >= 0)
		close(h->ubuf);
	if (h->memfd >= 0)
		close(h->memfd);
	h->ubuf = h->memfd = -1;
}

static void hook_close(struct hook *h)
{
	hook_free(h);
	if (h->proxy >= 0)
		close(h->proxy);
	if (h->dev >= 0)
		close(h->dev);
	if (h->udev >= 0)
		close(h->udev);
}

static void hook_init(struct hook *h)
{
	memset(h, 0, sizeof(*h));
	h->dev = h->udev = h->proxy = h->memfd = h->ubuf = -1;
}

static int hook_open(struct hook *h, struct obs *o)
{
	int rc;

	*(void **)&h->declare = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare");
	*(void **)&h->sleep = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_sleep");
	*(void **)&h->wake = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_wake");
	*(void **)&h->query = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_query");
	o->preload = h->declare && h->sleep && h->wake && h->query;
	h->dev = kvd_dev_open();
	h->udev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (h->dev < 0 || h->udev < 0)
		return -ENODEV;
	h->proxy = kvd_create(h->dev, LEN, NULL);
	if (h->proxy < 0)
		return h->proxy;
	rc = hook_alloc(h, SEED0);
	if (!rc)
		rc = kvd_attach(h->dev, h->proxy, h->ubuf, 0);
	/* as a sleep-mode plugin would: the KV region and its proxy */
	if (!rc && o->preload)
		rc = h->declare((void *)(uintptr_t)KV_ADDR, LEN, "kv_cache",
				h->proxy, 0);
	return rc;
}

/* Does the preload's state file (what `kvdmabuf status` reads) list the
 * MR of @lkey on rxe0 as on-proxy? */
static int listed_on_proxy(uint32_t lkey)
{
	const char *dir = getenv(KVDMABUF_PRELOAD_DIR_ENV);
	char path[512], line[512], want[64];
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%d", dir ? dir :
		 KVDMABUF_PRELOAD_RUN_DIR, (int)getpid());
	snprintf(want, sizeof(want), "lkey 0x%x %#llx+%#x %s on-proxy", lkey,
		 KV_ADDR, LEN, vp_dev_name(0));
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		found |= !strncmp(line, want, strlen(want));
	fclose(f);
	return found;
}

/* ---- the engine: verbs only ---- */

struct engine {
	struct vp_end a;                /* its NIC, PD and QP */
	struct ibv_mr *mr;              /* its KV, by address or dma-buf */
	int export_fd;                  /* the dma-buf it exported, or -1 */
};

/*
 * The engine registers its KV: by address, or (@by_dmabuf) as Mooncake
 * does with GPU memory, by exporting its range as a dma-buf and
 * registering that with iova = its address. The export is a udmabuf of
 * the memory now mapped there (@memfd), standing in for
 * cuMemGetHandleForAddressRange() on the engine's address range.
 */
static int engine_register(struct engine *e, bool by_dmabuf, int udev,
			   int memfd)
{
	struct udmabuf_create c = { .memfd = (uint32_t)memfd,
				    .flags = UDMABUF_FLAGS_CLOEXEC,
				    .size = LEN };
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
		  IBV_ACCESS_REMOTE_READ;

	if (!by_dmabuf) {
		e->mr = ibv_reg_mr(e->a.pd, (void *)(uintptr_t)KV_ADDR, LEN,
				   acc);
		return e->mr ? 0 : -errno;
	}
	e->export_fd = ioctl(udev, UDMABUF_CREATE, &c);
	if (e->export_fd < 0)
		return -errno;
	e->mr = ibv_reg_dmabuf_mr(e->a.pd, 0, LEN, KV_ADDR, e->export_fd,
				  acc);
	return e->mr ? 0 : -errno;
}

/* ---- the peer ---- */

struct peer {
	struct vp_end b;
	char *buf;
	struct ibv_mr *mr;
};

static int peer_open(struct peer *p, struct engine *e)
{
	int rc = vp_open(&p->b, vp_dev_name(1));

	if (rc)
		return rc;
	p->mr = ibv_reg_mr(p->b.pd, p->buf, BLK, IBV_ACCESS_LOCAL_WRITE);
	if (!p->mr)
		return -errno;
	return vp_connect(&e->a, &p->b);
}

static void peer_close(struct peer *p)
{
	if (p->mr)
		ibv_dereg_mr(p->mr);
	p->mr = NULL;
	vp_close(&p->b);
}

/* A failed RDMA op ends both QPs: new ones, the engine's PD and MR kept. */
static int peer_renew(struct peer *p, struct engine *e)
{
	struct ibv_qp_init_attr qpa = {
		.qp_type = IBV_QPT_RC,
		.send_cq = e->a.cq, .recv_cq = e->a.cq,
		.cap = { .max_send_wr = 64, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};

	peer_close(p);
	ibv_destroy_qp(e->a.qp);
	e->a.qp = ibv_create_qp(e->a.pd, &qpa);
	if (!e->a.qp)
		return -errno;
	return peer_open(p, e);
}

/* Does @buf hold block @blk of the KV filled with @seed (pattern_fill)? */
static int block_is(const char *buf, unsigned int blk, uint32_t seed)
{
	const uint32_t *w = (const uint32_t *)buf;
	uint32_t first = blk * (BLK / 4), i;

	for (i = 0; i < BLK / 4; i++)
		if (w[i] != seed * 2654435761u + first + i)
			return 0;
	return 1;
}

/*
 * The peer reads block @blk of the KV through @rkey: what arrived. NEW:
 * the memory of @cur (0: none now); OLD: that of a memory freed before,
 * seeds SEED0 to @last_old.
 */
static int peer_read(struct peer *p, unsigned int blk, uint32_t rkey,
		     uint32_t cur, uint32_t last_old, int *status)
{
	uint32_t s;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	unsigned int i;
	int rc;

	memset(p->buf, 0, BLK);
	rc = vp_rdma(&p->b, IBV_WR_RDMA_READ, p->buf, BLK, p->mr->lkey,
		     KV_ADDR + (uint64_t)blk * BLK, rkey, &st);
	if (status)
		*status = (int)st;
	if (rc) {
		for (i = 0; i < BLK && !p->buf[i]; i++)
			;
		return i == BLK ? SEEN_ERROR : SEEN_OTHER;
	}
	if (cur && block_is(p->buf, blk, cur))
		return SEEN_NEW;
	for (s = SEED0; s <= last_old; s++)
		if (block_is(p->buf, blk, s))
			return SEEN_OLD;
	return SEEN_OTHER;
}

/* The peer writes @seed's block @blk; SEEN_NEW if it is in the memory now
 * at KV_ADDR, SEEN_OLD if not (it went elsewhere), SEEN_ERROR failed. */
static int peer_write(struct peer *p, unsigned int blk, uint32_t rkey,
		      uint32_t seed)
{
	char *kv = (char *)(uintptr_t)KV_ADDR + (size_t)blk * BLK;
	uint32_t *w = (uint32_t *)p->buf, i;

	for (i = 0; i < BLK / 4; i++)
		w[i] = seed * 2654435761u + blk * (BLK / 4) + i;
	if (vp_rdma(&p->b, IBV_WR_RDMA_WRITE, p->buf, BLK, p->mr->lkey,
		    KV_ADDR + (uint64_t)blk * BLK, rkey, NULL))
		return SEEN_ERROR;
	return block_is(kv, blk, seed) ? SEEN_NEW : SEEN_OLD;
}

#define FAIL(o, ...) do {						\
		snprintf((o)->err, sizeof((o)->err), __VA_ARGS__);	\
		goto out;						\
	} while (0)

/*
 * The whole story, with or without the preload: register, peer access,
 * then CYCLES times sleep (the hook's check, revoke, memory freed), a
 * peer's read while asleep, wake (new memory at the same address, the
 * proxy backed by it), the peer's read and write through the first rkey.
 */
static void scenario(struct obs *o, bool by_dmabuf)
{
	struct kvdmabuf_preload_state ps;
	struct kvdmabuf_query q;
	struct engine e = { .export_fd = -1 };
	struct peer p = { 0 };
	struct hook h;
	char why[512] = "";
	uint32_t seed = SEED0;
	int c, rc, st;

	memset(o, 0, sizeof(*o));
	o->on_proxy = -1;
	hook_init(&h);
	p.buf = mmap(NULL, BLK, PROT_READ | PROT_WRITE, MAP_PRIVATE |
		     MAP_ANONYMOUS, -1, 0);
	if (p.buf == MAP_FAILED)
		FAIL(o, "peer buffer: %s", strerror(errno));
	rc = hook_open(&h, o);
	if (rc)
		FAIL(o, "the allocator's proxy and memory: %s", strerror(-rc));

	/* The engine: its own device, PD and QP; its KV registered. */
	if (vp_open(&e.a, vp_dev_name(0)))
		FAIL(o, "engine: cannot open %s", vp_dev_name(0));
	rc = engine_register(&e, by_dmabuf, h.udev, h.memfd);
	if (rc)
		FAIL(o, "engine: %s: %s", by_dmabuf ? "ibv_reg_dmabuf_mr" :
		     "ibv_reg_mr", strerror(-rc));
	o->lkey = e.mr->lkey;
	o->rkey = e.mr->rkey;
	o->pin_kb_engine = vmpin_kb();
	if (o->preload && !h.query(&ps))
		o->on_proxy = (int)ps.nr_on_proxy;
	o->listed = listed_on_proxy(o->lkey);
	if (peer_open(&p, &e))
		FAIL(o, "peer: cannot connect %s to %s", vp_dev_name(1),
		     vp_dev_name(0));
	o->awake_read = peer_read(&p, 3, o->rkey, seed, 0, NULL);
	o->awake_write = peer_write(&p, 5, o->rkey, seed + 1000);

	for (c = 0; c < CYCLES; c++) {
		/* sleep: the hook asks the preload, revokes, frees memory */
		o->sleep_rc = o->preload ? h.sleep("kv_cache", why,
						   sizeof(why)) : 0;
		if (o->sleep_rc)
			FAIL(o, "sleep refused: %s", why);
		o->revoke_rc = kvd_revoke(h.dev, h.proxy, 5000);
		if (o->revoke_rc)
			FAIL(o, "revoke: %s", strerror(-o->revoke_rc));
		hook_free(&h);
		if (!kvd_query(h.dev, h.proxy, &q)) {
			o->attach_after += q.backing_attachments;
			o->stale_after += q.stale_backings;
			o->maps_after += q.live_mappings;
		}
		o->asleep[c] = peer_read(&p, 1, o->rkey, 0, seed, &st);
		o->asleep_status[c] = st;
		if (peer_renew(&p, &e))
			FAIL(o, "peer: new queue pairs: %s", strerror(errno));

		/* wake: new memory at the same address behind the proxy */
		seed = SEED0 + 1 + (uint32_t)c;
		rc = hook_alloc(&h, seed);
		if (!rc)
			rc = kvd_attach(h.dev, h.proxy, h.ubuf, 0);
		if (rc)
			FAIL(o, "wake: new backing: %s", strerror(-rc));
		if (o->preload && h.wake("kv_cache", why, sizeof(why)))
			FAIL(o, "wake: %s", why);
		o->keys_changed |= e.mr->lkey != o->lkey ||
				   e.mr->rkey != o->rkey;
		o->woke[c] = peer_read(&p, 7, o->rkey, seed, seed - 1, NULL);
		o->wrote[c] = peer_write(&p, 2, o->rkey, seed + 1000);
		if (o->wrote[c] == SEEN_ERROR && peer_renew(&p, &e))
			FAIL(o, "peer: new queue pairs: %s", strerror(errno));
	}
out:
	peer_close(&p);
	if (e.mr)
		ibv_dereg_mr(e.mr);
	if (e.export_fd >= 0)
		close(e.export_fd);
	vp_close(&e.a);
	hook_close(&h);
	if (p.buf != MAP_FAILED)
		munmap(p.buf, BLK);
}

static const char *seen_name(int s)
{
	static const char *const n[] = { "nothing", "the new bytes",
					 "the OLD bytes", "other bytes",
					 "an error, no byte" };

	return s >= 0 && s <= SEEN_ERROR ? n[s] : "?";
}

/* The scenario without the preload: run by a child exec'd without it. */
__attribute__((constructor(200))) static void baseline_child(int argc,
							    char **argv)
{
	struct obs o;
	ssize_t n;

	if (argc != 3 || strcmp(argv[1], "--baseline-child"))
		return;
	scenario(&o, !strcmp(argv[2], "dmabuf"));
	n = write(STDOUT_FILENO, &o, sizeof(o));
	_exit(n == (ssize_t)sizeof(o) ? 0 : 1);
}

/* Runs the baseline child (no LD_PRELOAD) and reads what it saw. */
static int run_baseline(struct obs *o, bool by_dmabuf)
{
	int pfd[2], status;
	size_t got = 0;
	ssize_t n;
	pid_t pid;

	if (pipe(pfd))
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (!pid) {
		char *argv[] = { "preload_follow", "--baseline-child",
				 by_dmabuf ? "dmabuf" : "address", NULL };

		dup2(pfd[1], STDOUT_FILENO);
		close(pfd[0]);
		unsetenv("LD_PRELOAD");
		setenv("KVDMABUF_PRELOAD_TRIED", "1", 1);
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	close(pfd[1]);
	while (got < sizeof(*o) &&
	       (n = read(pfd[0], (char *)o + got, sizeof(*o) - got)) > 0)
		got += (size_t)n;
	close(pfd[0]);
	if (waitpid(pid, &status, 0) < 0)
		return -errno;
	return got == sizeof(*o) && WIFEXITED(status) &&
	       !WEXITSTATUS(status) ? 0 : -EIO;
}

FIXTURE(pf) {
	struct obs o;
};

FIXTURE_VARIANT(pf) {
	bool by_dmabuf;
};

/* ibv_reg_mr of the KV's address range */
FIXTURE_VARIANT_ADD(pf, address) { .by_dmabuf = false };
/* ibv_reg_dmabuf_mr of the engine's own export of that range */
FIXTURE_VARIANT_ADD(pf, dmabuf) { .by_dmabuf = true };

FIXTURE_SETUP(pf)
{
	if (rxe_dmabuf_missing())
		SKIP(return, "%s", rxe_dmabuf_missing());
	if (access(KVDMABUF_DEVICE_PATH, F_OK))
		SKIP(return, "%s absent (module not loaded)",
		     KVDMABUF_DEVICE_PATH);
	if (access("/dev/udmabuf", F_OK))
		SKIP(return, "/dev/udmabuf absent (CONFIG_UDMABUF)");
}

FIXTURE_TEARDOWN(pf)
{
}

static void log_obs(struct __test_metadata *_metadata, const struct obs *o)
{
	int c;

	TH_LOG("preload %d, MRs on proxy %d (state file: %d), keys 0x%x/0x%x, VmPin %ld kB; "
	       "awake: peer read %s, write %s; revoke %d, asleep proxy: "
	       "%u backing attachments, %u stale, %u mappings", o->preload,
	       o->on_proxy, o->listed, o->lkey, o->rkey, o->pin_kb_engine,
	       seen_name(o->awake_read), seen_name(o->awake_write),
	       o->revoke_rc, o->attach_after, o->stale_after, o->maps_after);
	for (c = 0; c < CYCLES; c++)
		TH_LOG("cycle %d: asleep the peer read %s (status %d); after "
		       "wake %s, its write %s", c + 1, seen_name(o->asleep[c]),
		       o->asleep_status[c], seen_name(o->woke[c]),
		       o->wrote[c] == SEEN_NEW ? "landed in the new memory" :
		       o->wrote[c] == SEEN_OLD ? "went to the OLD memory" :
		       "failed");
	if (o->err[0])
		TH_LOG("stopped: %s", o->err);
}

/* Under the preload: keys unchanged, new bytes after wake, errors asleep. */
TEST_F_TIMEOUT(pf, engine_mr_follows_sleep_and_wake_under_the_preload, 120)
{
	struct obs *o = &self->o;
	int c;

	ASSERT_NE(NULL, dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare"));
	scenario(o, variant->by_dmabuf);
	log_obs(_metadata, o);
	ASSERT_EQ(0, o->err[0]);
	EXPECT_EQ(1, o->on_proxy);
	EXPECT_EQ(1, o->listed);
	EXPECT_EQ(0, o->pin_kb_engine);
	EXPECT_EQ(SEEN_NEW, o->awake_read);
	EXPECT_EQ(SEEN_NEW, o->awake_write);
	EXPECT_EQ(0, o->sleep_rc);
	EXPECT_EQ(0, o->revoke_rc);
	/* the old memory is no one's: no attachment, mapping or pin */
	EXPECT_EQ(0u, o->attach_after);
	EXPECT_EQ(0u, o->stale_after);
	EXPECT_EQ(0u, o->maps_after);
	EXPECT_EQ(0, o->keys_changed);
	for (c = 0; c < CYCLES; c++) {
		EXPECT_EQ(SEEN_ERROR, o->asleep[c]);
		EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, o->asleep_status[c]);
		EXPECT_EQ(SEEN_NEW, o->woke[c]);
		EXPECT_EQ(SEEN_NEW, o->wrote[c]);
	}
}

/*
 * The baseline: the same engine without the preload. Its MR pins the first
 * memory, so the peer reads old bytes while asleep and after each wake,
 * and its writes go to freed memory, all "successful": the silent stale
 * registration the preload exists to prevent. If this stops being stale,
 * the scenario no longer tells the two apart.
 */
TEST_F_TIMEOUT(pf, without_the_preload_the_peer_silently_reads_old_bytes, 120)
{
	struct obs *o = &self->o;
	int c;

	ASSERT_EQ(0, run_baseline(o, variant->by_dmabuf));
	log_obs(_metadata, o);
	ASSERT_EQ(0, o->err[0]);
	EXPECT_EQ(0, o->preload);
	if (!variant->by_dmabuf)
		EXPECT_LT(0, o->pin_kb_engine);
	EXPECT_EQ(SEEN_NEW, o->awake_read);
	EXPECT_EQ(0, o->keys_changed);
	for (c = 0; c < CYCLES; c++) {
		EXPECT_EQ(SEEN_OLD, o->asleep[c]);
		EXPECT_EQ(SEEN_OLD, o->woke[c]);
		EXPECT_EQ(SEEN_OLD, o->wrote[c]);
	}
}

TEST_HARNESS_MAIN
