/* SPDX-License-Identifier: GPL-2.0 */
/*
 * demo.h - shared declarations of kvdmabuf-demo (make demo).
 *
 * Processes (all forked by main.c, one set per pass):
 *   store  - a KV store's memory server: its segments registered on the NIC
 *   A, B   - two serving engines, each with a KV cache region; A sleeps
 *            and wakes like an engine, B never sleeps and also reads A's
 *            KV directly by A's key (a decode instance reading a prefill
 *            instance's KV)
 * Two NIC columns, each run with kvdmabuf and as the baseline (4 passes):
 *   rxe  - soft-RoCE (store on rxe0, engines on rxe1; B's peer QP on rxe0):
 *          a pinning NIC without dma-buf MRs, A's regions are host memory,
 *          kvdmabuf takes REREGISTER (keys change, republished)
 *   move-capable, one of:
 *   rxedb - soft-RoCE with dma-buf MRs (tests/rxe, dynamic: follows
 *          moves), wherever the guest loaded it (6.12, 7.3): the same
 *          store, QPs and wire as rxe, but A's and B's regions are vgem
 *          buffers (DRM): kvdmabuf registers their proxies through the
 *          library's public path (ibv_reg_dmabuf_mr): FOLLOW (keys
 *          unchanged); the baseline registers each buffer itself once.
 *          B also probes A's QP with a deregistered MR's key and with a
 *          foreign (its own) MR's key: the remote access check refuses
 *   umem - elsewhere (6.1: no dma-buf rxe), a move-capable NIC on
 *          /dev/kvd_umem (ib_core's dma-buf MR code,
 *          dynamic imports as mlx5): one open file shared by the pass's
 *          processes is the fabric, an import handle is a key, a transfer
 *          moves bytes from (key, offset) to (key, offset) through both
 *          MRs' DMA addresses. A's regions are vgem buffers (DRM) behind
 *          kvdmabuf proxies: FOLLOW (keys unchanged)
 * The parent orchestrates them over SOCK_SEQPACKET socketpairs with
 * struct demo_msg requests and replies (ipc.c), and keeps the metadata (which
 * prompt is in which store slot) as a KV store's master does.
 *
 * Files: main.c (arguments, passes, verdict), ipc.c (processes, messages),
 * rdma.c (verbs QPs across processes), store.c (store process), engine.c
 * (engine process: regions, sleep/wake, transfers, stress threads), mem.c
 * (memory figures), follow.c (follow path with vgem + test importer),
 * report.c (table).
 */
#ifndef KVDMABUF_DEMO_H
#define KVDMABUF_DEMO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define DEMO_BLOCK		(128u * 1024)	/* one KV block, bytes */
#define DEMO_PROMPTS		8		/* prompts per phase */
#define DEMO_KV_LEN		(64ul << 20)	/* KV cache region of A and B */
#define DEMO_W_LEN		(16ul << 20)	/* weights region of A */
#define DEMO_SEGMENTS		2		/* store segments */
#define DEMO_SLOTS		256		/* store slots (blocks), all segments */
#define DEMO_SLOTS_KV		192		/* slots 0..191: KV blocks */
#define DEMO_SLOT_W		192		/* slots 192..199: published weights */
#define DEMO_SLOT_STRESS	200		/* slots 200..: stress threads */
#define DEMO_STRESS_THREADS	4
#define DEMO_MAX_QPS		(1 + DEMO_STRESS_THREADS)
#define DEMO_W_SEED		0x77000000u	/* seed of weights shard i: + i */
#define DEMO_STRESS_BLOCK0	384		/* first KV block of stress threads */

/* Region indices of an engine. */
enum { DEMO_R_KV = 0, DEMO_R_W = 1, DEMO_NR_REGIONS = 2 };
/* Tag selectors of sleep/wake requests. */
enum { DEMO_TAG_ALL = 0, DEMO_TAG_WEIGHTS = 1, DEMO_TAG_KV = 2 };
/* Engine modes. */
enum { DEMO_KVDMABUF = 1, DEMO_BASELINE = 2 };
/*
 * NIC columns; pass index = column * 2 + (baseline ? 1 : 0). Column
 * DEMO_NIC_UMEM is the move-capable NIC: DEMO_NIC_RXEDB (a NIC kind, not
 * a column) where soft-RoCE has dma-buf MRs, else kvd_umem.
 */
enum { DEMO_NIC_RXE = 0, DEMO_NIC_UMEM = 1, DEMO_NR_NICS = 2,
       DEMO_NIC_RXEDB = 2 };
#define DEMO_COL(kind)		((kind) == DEMO_NIC_RXE ? DEMO_NIC_RXE : \
				 DEMO_NIC_UMEM)
#define DEMO_NR_PASSES		(2 * DEMO_NR_NICS)
#define DEMO_PEER_BLOCK0	32	/* B's blocks that receive A's KV */

enum demo_op {
	OP_INIT = 1,	/* store: a[0] = client count; engine: see engine.c */
	OP_CONNECT,	/* peer QPs (+ store segments) -> RTS */
	OP_REGIONS,	/* engine: map and register its regions */
	OP_PUT,		/* engine: a[0] slot0, a[1] n, a[2] seed0, a[3] block0 */
	OP_GET,		/* engine: same, a[4] region; reply a[0] ok a[1] correct
			 * a[2] refused a[3] errors */
	OP_SLEEP,	/* engine: a[0] tag; reply a[5..9] stress counts,
			 * a[10] in flight at sleep, a[11] QPs in error */
	OP_WAKE,	/* engine: a[0] tag */
	OP_MEM,		/* engine: reply a[0] VmPin kB, a[1] kv resident bytes,
			 * a[2] weights resident bytes */
	OP_KEYS,	/* store: a[0] client, a[1] region, a[2] key gen,
			 * a[3] rkey (republished keys) */
	OP_STRESS,	/* engine: a[0] threads, start transfer threads */
	OP_PEER_QP,	/* engine (rxe): create (or reset) its peer QP; reply
			 * qp[0] */
	OP_PEER_CONNECT, /* engine (rxe): connect the peer QP to qp[0] */
	OP_PEEK,	/* B: read a[3] blocks of A's KV from a[1] + block
			 * a[2] by key a[0] into its own blocks, check seeds
			 * a[4] + i; reply a[0] delivered a[1] correct
			 * a[2] errors a[3] access errors (key refused) */
	OP_DEAD_KEY,	/* A (rxedb): register a dma-buf MR at the iova of
			 * KV block a[0] and deregister it; reply a[0] its
			 * rkey, a[1] its iova */
	OP_QUIT,
};

struct demo_qp_info {
	uint32_t qpn;
	uint32_t pad;
	uint8_t gid[16];
};

struct demo_seg {
	uint64_t addr;
	uint32_t rkey;
	uint32_t pad;
};

struct demo_msg {
	uint32_t op;
	int32_t rc;		/* reply: 0 or -errno (text says why) */
	uint32_t n;		/* QP infos in qp[] */
	uint32_t client;	/* CONNECT to the store: client index */
	uint64_t a[12];
	struct demo_qp_info qp[DEMO_MAX_QPS];
	struct demo_seg seg[DEMO_SEGMENTS];
	char text[400];
};

/* ---- ipc.c ---- */
struct demo_child {
	const char *name;
	pid_t pid;
	int fd;
};
typedef int (*demo_handler)(struct demo_msg *m, void *arg);
/* Fork a child that serves requests with @fn until OP_QUIT. */
int demo_spawn(struct demo_child *c, const char *name, demo_handler fn,
	       void *arg);
/* Send @m to @c and wait for the reply (into @m). Returns the reply's rc,
 * or -errno of the channel (child died, timeout); messages go to stderr. */
int demo_call(struct demo_child *c, struct demo_msg *m);
/* Ask @c to quit and reap it (kill it if it does not). Returns its exit
 * status (0 clean). */
int demo_stop(struct demo_child *c);
/* printf into m->text and return @rc. */
int demo_fail(struct demo_msg *m, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ---- rdma.c ---- */
struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_qp;

struct demo_nic {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint8_t gid[16];
};
struct demo_qp {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};
int demo_nic_open(struct demo_nic *n, const char *name, char *err,
		  size_t errlen);
void demo_nic_close(struct demo_nic *n);
int demo_qp_create(struct demo_nic *n, struct demo_qp *q);
void demo_qp_destroy(struct demo_qp *q);
int demo_qp_connect(struct demo_qp *q, const struct demo_qp_info *peer);
/* One signalled RDMA write (@write) or read, waited for (30 s). Returns 0,
 * -EIO (completion error, *status set), -ETIMEDOUT (no completion: the QP
 * was moved to the error state and the transfer flushed, so it has ended),
 * -ENOTRECOVERABLE (not even flushed: the transfer never ended, the buffer
 * must stay in use) or -errno of the post. */
int demo_rdma(struct demo_qp *q, int write, void *local, uint32_t len,
	      uint32_t lkey, uint64_t raddr, uint32_t rkey, int *status);
const char *demo_wc_status(int status);
/* 1 if the QP is in the error state, 0 if not, or -errno. */
int demo_qp_in_error(struct demo_qp *q);
/* Back to INIT (after an error), ready for demo_qp_connect(). */
int demo_qp_reset(struct demo_qp *q);

/* ---- umem.c: the move-capable NIC on /dev/kvd_umem ---- */
/* Loads kvd_umem if needed and opens it: fd, or -errno (@why says). */
int demo_umem_open(char *why, size_t len);
/* The NIC moves @len bytes from (@src_key, @src_off) to (@dst_key,
 * @dst_off), through both imports' DMA addresses. 0 or -errno of the
 * access that failed (-ENODEV: a key whose memory is revoked). */
int demo_umem_move(int fd, uint32_t src_key, uint64_t src_off,
		   uint32_t dst_key, uint64_t dst_off, uint32_t len);
/* A vgem buffer for a region: GEM handle, dma-buf fd, CPU mapping
 * (populated). 0 or -errno. */
struct demo_vbuf {
	uint32_t handle;
	int fd;
	char *cpu;
	size_t len;
};
int demo_vbuf_new(int drm, size_t len, struct demo_vbuf *b);
void demo_vbuf_free(int drm, struct demo_vbuf *b);

/* ---- store.c / engine.c ---- */
int demo_store_serve(struct demo_msg *m, void *arg);
struct demo_engine;
/* Store: what its process needs. */
struct demo_store_cfg {
	int nic;		/* DEMO_NIC_* */
	int umem_fd;		/* DEMO_NIC_UMEM: the shared /dev/kvd_umem */
};
struct demo_engine *demo_engine_new(const char *name, int mode, int nic,
				    int umem_fd, const char *config_path);
int demo_engine_serve(struct demo_msg *m, void *arg);

/* ---- mem.c ---- */
long demo_resident(const void *addr, size_t len); /* bytes (mincore) */
long demo_free_kb(void);  /* MemFree + per-CPU free lists, kB, -errno */

/* ---- results (report.c) ---- */
#define DEMO_MAX_ROWS 20
/* A cell: blocks correct, blocks whose transfer failed, of total; the
 * rest were delivered without any error but hold the wrong bytes. */
struct demo_count {
	unsigned int ok, errors, total;
};
struct demo_row {
	const char *group;	/* printed once per group */
	const char *phase;
	struct demo_count c[DEMO_NR_PASSES];	/* by pass index */
	bool used[DEMO_NR_PASSES];
	bool expect_bug;	/* baseline must show the bug here */
	char who;		/* 'A' or 'B': whose data goes wrong */
	bool gate;		/* refusals, not data: not in the totals */
	unsigned int expect_runs;	/* times a pass runs the phase */
};

struct demo_mem {		/* memory of A at one point */
	bool valid;
	long pin_kb;		/* VmPin */
	long res_kb;		/* resident pages of A's regions */
	long held_kb;		/* free memory drop since before A's regions */
};
/* memory points: awake, asleep, after wake */
enum { DEMO_M_AWAKE, DEMO_M_ASLEEP, DEMO_M_WOKE, DEMO_NR_M };
#define DEMO_MAX_MEMROWS 6
/*
 * Free memory is a system-wide figure. A sleep is judged by what it gave
 * back: the rise of settled free memory from just before the sleep to
 * asleep, against the bytes of A's regions that sleep (sleep_kb). Between
 * those two reads only the sleep runs (the kernel's own bookkeeping of
 * the MRs, QPs and proxies it drops moves free memory by tens of KiB).
 */
#define DEMO_FREED_SLACK_KB 512

struct demo_memrow {
	const char *label;
	struct demo_mem m[DEMO_NR_PASSES][DEMO_NR_M];	/* [pass][point] */
	long expect_asleep_pin_kb[DEMO_NR_NICS];	/* regions that stay */
	long expect_asleep_res_kb[DEMO_NR_NICS];	/* awake */
	long sleep_kb;		/* A's regions the cycle puts to sleep */
};

struct demo_stress {
	bool ran;
	uint64_t begun, completed, failed, wrong, refused, inflight_at_sleep;
	uint64_t sleeps;
	uint64_t qp_errors;	/* stress QPs found in error after a sleep */
	long pin_first_kb, pin_last_kb, res_first_kb, res_last_kb;
	long held_first_kb, held_last_kb;
};

struct demo_follow {
	bool ran;
	char skip[200];
	unsigned int cycles;
	unsigned int correct, total;		/* importer reads correct */
	unsigned int refused_asleep;		/* importer access refused */
	bool same_handle, same_proxy;
	uint64_t maps, invalidations, failed_maps;
	long backings_awake, backings_asleep;	/* module debugfs */
	long shmem_awake_kb, shmem_asleep_kb, shmem_woke_kb;
	long min_drop_kb;			/* smallest Shmem drop at sleep */
	unsigned int free_wait_ms;		/* longest wait for that drop */
	size_t len;
	char err[300];
	char lib[300];		/* what the library says of a DRM region */
};

/* Keys of A's kv_cache as B and the store see them, per pass. */
struct demo_keys {
	uint64_t gen_first, gen_last, republished, wakes;
	uint32_t rkey_first, rkey_last;
	/* B's stale-key probes after a wake (keys that changed) */
	unsigned int stale_tried, stale_refused, stale_delivered;
	char stale_status[64];	/* the completion a stale read got */
	/* rxedb: B's probes of A's QP by a key that is not A's: a
	 * deregistered MR's and a foreign one (B's own) */
	unsigned int probe_tried, probe_refused, probe_delivered;
	char probe_status[64];	/* a completion that was not refused */
};

struct demo_results {
	struct demo_row rows[DEMO_MAX_ROWS];
	unsigned int nr_rows;
	struct demo_memrow mem[DEMO_MAX_MEMROWS];
	unsigned int nr_mem;
	/* phases and memory points that found the table full: a verdict
	 * over a table that left something out is no verdict */
	unsigned int dropped_rows, dropped_mem;
	struct demo_keys keys[DEMO_NR_PASSES];
	uint64_t xfer_errors[DEMO_NR_PASSES];
	struct demo_stress stress[DEMO_NR_NICS];
	struct demo_follow follow;
	bool pass_done[DEMO_NR_PASSES];
	char pass_err[DEMO_NR_PASSES][400];
	unsigned int plain_cycles;
	char mode[DEMO_NR_NICS][32];	/* mode libkvdmabuf chose for A's KV */
	char umem_skip[200];		/* why the umem NIC did not run */
	int move_kind;			/* DEMO_NIC_RXEDB or DEMO_NIC_UMEM */
	bool move_only;			/* --move-capable-only: no rxe column */
	char rxedb_missing[300];	/* why not rxedb (umem instead) */
};

struct demo_row *demo_row(struct demo_results *r, const char *group,
			  const char *phase);
struct demo_memrow *demo_memrow(struct demo_results *r, const char *label);
/* Prints the table; returns true when the verdict is PASS. */
bool demo_report(struct demo_results *r, bool stress);

/* ---- follow.c ---- */
void demo_follow_run(struct demo_follow *f, unsigned int cycles,
		     const char *config);

#endif /* KVDMABUF_DEMO_H */
