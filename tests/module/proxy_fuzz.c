// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_fuzz: a bounded-time fuzzer of /dev/kvdmabuf that knows what each
 * call must answer.
 *
 * Several forked worker processes, each with several threads, run random
 * sequences of every ioctl of the module with valid and invalid arguments
 * (fds of the wrong type, closed fds, absurd sizes, every flag bit, short
 * and long structs, bad pointers), interleaved with close, dup, reopening
 * the device, forked children that exit or are killed with SIGKILL mid-call,
 * and with three importer devices importing (dynamic, lazy and pinned),
 * accessing and releasing proxies: the test importer, and ib_core's
 * dma-buf umem through tests/kmod/kvd_umem on its two devices (one with a
 * 32-bit DMA mask); with backings from vgem and from the dynamic test
 * exporter (tests/kmod/kvd_exporter), which moves and revokes them under
 * the proxies; and draining a revoke or replace while another thread
 * unmaps. A storm runs control calls on one proxy from several threads at
 * once, judged by what the uapi allows whatever their order (do_storm()).
 *
 * Each worker keeps a model of every proxy it created (state, generation,
 * current backing, what each of its pages maps, pinned and lazily mapped
 * imports, the creating device file). Every call is checked against that
 * model, not against the union of the errnos the uapi lists for it: -EBUSY
 * only while a pin is held, -ETIMEDOUT only where an importer still maps a
 * stale backing (and 0 from a revoke, or a replace of a backed proxy, only
 * once none does), -EAGAIN only with KVDMABUF_MAX_STALE_BACKINGS stale
 * backings held, -EPERM only for control from another device file, -EINTR
 * never (nothing signals the workers), -ENOMEM only where the model says
 * memory can run out (mem_ran_out()); and a success that the state forbids
 * fails (a revoke or replace under a pin, an attach of a backed proxy, a
 * generation that is not the model's). Every backing is filled with a
 * pattern of its own, so an importer read that returns another
 * generation's bytes fails.
 *
 * RANGES batches (1 to 3 ranges, backed by backing slots' buffers or a
 * fresh one at page-aligned offsets, or unbacked; one range or the struct
 * made wrong now and then) are answered as a replace is (the same pins,
 * stale bound, owner and drain rules: swap_expect(), swap_done()), and a
 * batch that swapped rewrites the model's layout: the pages it lists map
 * their new backing at their offset or nothing, the others keep what they
 * mapped (nothing if the proxy was not backed). A read must then return
 * each backed page's pattern at its offset and zeros in unbacked pages;
 * once an importer wrote into an unbacked page (it writes SCRATCH_MARK
 * there), the layout's unbacked pages may read 0 or SCRATCH_MARK, never a
 * backing's bytes, until the next layout.
 *
 * It runs a fixed list of seeds, the same in every run, then one seed from
 * the clock, each for an equal share of the time; every seed is printed,
 * and each seed's run is judged on its own. After each it prints per
 * operation kind the successes, attempts and errnos, and fails when a kind
 * has fewer successes than its floor (scaled by the run time) or a smaller
 * share of successes among its attempts than its ratio floor (a starved
 * kind), when a worker or child exited abnormally, when the kernel log has
 * a report (including the test importers' own error messages), when the
 * module still holds anything once every process is gone, or when it does
 * not unload. On a check failure it prints the seed and the shortest tail
 * of the failing thread's sequence that reproduces it when replayed alone.
 *
 *   proxy_fuzz [--seconds N] [--seed S]   (or KVDMABUF_FUZZ_SECONDS/SEED)
 *
 * --seed S runs seed S alone for all N seconds: the replay of a failure
 * (tests/vm/check.sh run LANE tests/module/proxy_fuzz --seed S --seconds N, with
 * the seed and seconds of the failing run's "replay:" line; the threads'
 * interleaving differs from run to run, the operations do not).
 * KVDMABUF_FUZZ_SEEDS=S1,S2,... replaces the fixed list.
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "../uapi/kvdmabuf.h"
#include "harness.h"
#include "ko_load.h"
#include "proxy_common.h"
#include "race_window.h"

#define WORKERS		3
#define THREADS		2
#define PSLOTS		6	/* proxy fds */
#define BSLOTS		4	/* shared backing fds */
#define ISLOTS		8	/* importer handles */
#define MAX_DEVS	16	/* device files per process (reopen) */
#define LOG_LEN		256
#define MAX_REPLAY	LOG_LEN
#define CHILD_OPS	40
#define ACCESS_MAX	16384
#define NERRNO		160
#define FZ_PAGE		4096ull
#define MAX_PAGES	16	/* pages of pick_length()'s longest proxy */
#define RANGES_MAX	3	/* ranges in one fuzzed RANGES batch */
/* What importers write into an unbacked range: no pattern's run of bytes. */
#define SCRATCH_MARK	0xa5

enum op_kind {
	OP_VERSION, OP_CREATE, OP_ATTACH, OP_REPLACE, OP_RANGES, OP_REVOKE,
	OP_QUERY, OP_BADCMD, OP_BADPTR, OP_VGEM, OP_CLOSE, OP_DUP, OP_IMPORT,
	OP_IMPORT_LAZY, OP_IMPORT_PIN, OP_ACCESS, OP_RELEASE, OP_READEV,
	OP_REOPEN, OP_DRAIN, OP_FORK,
	/* Not in forked children (they take kinds below OP_DRAIN only). */
	OP_UIMPORT, OP_UACCESS, OP_EXP_INVAL, OP_STORM, OP_NKINDS
};

static const char *const op_names[OP_NKINDS] = {
	"version", "create", "attach", "replace", "ranges", "revoke", "query",
	"bad-cmd", "bad-ptr", "vgem", "close", "dup", "import", "import-lazy",
	"import-pin", "access", "release", "read-events", "reopen", "drain",
	"fork", "umem-import", "umem-access", "exp-inval", "storm",
};

/*
 * Floors: the least number of successes ("ok": the call did what the model
 * says it must; for bad-cmd and bad-ptr the expected errno) per second of
 * run time, per kind. About a twentieth of what the 6.1 lane measured (2
 * CPUs, KVM, 20 s, seed 12345: e.g. access 21/s, attach 18/s, replace
 * 25/s, revoke 35/s, import-pin 18/s, drain 8/s, fork 22/s), so that the
 * debug lane (KASAN, lockdep, TCG: many times slower, but 60 s) holds them
 * too, while a fuzzer that stops covering a kind (the importer's table
 * full, every access ENOENT) falls below. Each floor is at least 1. The
 * umem and exporter kinds: about a twentieth of their 6.1 rates (umem-import
 * 85/s, umem-access 45/s, exp-inval 12/s). Divided by
 * KVDMABUF_TIMEOUT_SCALE: the debug lane (4) measured about a fifth of
 * these rates with the new kinds (e.g. attach 0.7/s, exp-inval 0.05/s
 * with other guests sharing the 2 CPUs); the ratio floors hold there as
 * they are. storm: 6.12 ran 47-54/s (157-177 per 3.3 s seed), debug
 * 2.4-2.5/s (73-76 per 30 s seed; its floor there 15).
 */
static const double floor_per_s[OP_NKINDS] = {
	[OP_VERSION] = 1, [OP_CREATE] = 3, [OP_ATTACH] = 1, [OP_REPLACE] = 1,
	[OP_RANGES] = 1,
	[OP_REVOKE] = 1.5, [OP_QUERY] = 3, [OP_BADCMD] = 1.5, [OP_BADPTR] = 1.5,
	[OP_VGEM] = 3, [OP_CLOSE] = 2, [OP_DUP] = 1, [OP_IMPORT] = 2,
	[OP_IMPORT_LAZY] = 2, [OP_IMPORT_PIN] = 0.8, [OP_ACCESS] = 1,
	[OP_RELEASE] = 1.5, [OP_READEV] = 1, [OP_REOPEN] = 0, [OP_DRAIN] = 0.3,
	[OP_FORK] = 1, [OP_UIMPORT] = 2, [OP_UACCESS] = 1,
	[OP_EXP_INVAL] = 0.15, [OP_STORM] = 2,
};

/*
 * Ratio floors: the least share of successes among the attempts of a kind
 * (successes, other answers, and attempts that found nothing to act on: an
 * empty slot, a proxy in no state to drain). The absolute floors above
 * hold for a run that is 95 % starved on a fast lane; these do not, since
 * a share does not grow with the speed of the machine. Each is about a
 * fifth of the least share the 6.1 lane measured (the fixed seeds, 3.3 s
 * each, on a loaded and an idle host: e.g. attach 14-18 %, replace 12-23
 * %, revoke 20-32 %, access 7.6-17 %, import-pin 16-23 %, drain 11-16 %,
 * umem-import 30-51 %, umem-access 15-24 %, exp-inval 18-22 %), so that a
 * kind starved by more than four fifths fails on any lane, while the
 * spread between seeds, loads and lanes (about a factor of two) passes.
 * access: a third (a run with 95 % of its accesses starved measured 1.4 %:
 * 3 successes in 220 tries, too few for a fifth to stand clear). ranges:
 * a fifth of 19.8-21.3 % (the 6.1 and 6.12 lanes, the fixed seeds and one
 * from the clock; replace measured 20.6-21.2 % in the same runs); its
 * absolute floor is replace's (it ran at 105-134/s there, as replace).
 * storm: a fifth of 100 % (6.12 and debug: every storm succeeded).
 */
static const double ratio_floor[OP_NKINDS] = {
	[OP_VERSION] = 0.14, [OP_CREATE] = 0.12, [OP_ATTACH] = 0.03,
	[OP_REPLACE] = 0.025, [OP_RANGES] = 0.04, [OP_REVOKE] = 0.04,
	[OP_QUERY] = 0.07, [OP_BADCMD] = 0.2, [OP_BADPTR] = 0.2,
	[OP_VGEM] = 0.2,
	[OP_CLOSE] = 0.12, [OP_DUP] = 0.08, [OP_IMPORT] = 0.09,
	[OP_IMPORT_LAZY] = 0.12, [OP_IMPORT_PIN] = 0.03, [OP_ACCESS] = 0.025,
	[OP_RELEASE] = 0.1, [OP_READEV] = 0.13, [OP_REOPEN] = 0,
	[OP_DRAIN] = 0.03, [OP_FORK] = 0.2, [OP_UIMPORT] = 0.08,
	[OP_UACCESS] = 0.03, [OP_EXP_INVAL] = 0.035, [OP_STORM] = 0.2,
};

struct op {
	uint8_t kind;
	uint8_t a, b, c;	/* slot or fd selectors */
	uint32_t flags;
	uint64_t x, y;
};

/* What one thread did, in shared memory so that a killed worker's log survives. */
struct op_log {
	uint64_t n;		/* ops executed */
	struct op ops[LOG_LEN];
};

struct fail_info {
	int failed;		/* set once, by the first failure */
	int worker, thread;
	uint64_t index;		/* op index in that thread's log */
	int ret;
	char what[256];
	char why[256];
};

struct shared {
	struct fail_info fail;
	struct op_log logs[WORKERS][THREADS + 1];	/* + forked children */
	uint64_t total_ops;
	/* Per kind: calls that did what they must, and errnos seen. */
	uint64_t ok[OP_NKINDS], err[OP_NKINDS];
	/* Per kind: attempts that found nothing to act on (an empty slot). */
	uint64_t idle[OP_NKINDS];
	uint64_t errnos[OP_NKINDS][NERRNO];
	uint64_t data_checks;		/* importer reads compared byte by byte */
	uint64_t range_checks;		/* of them, of ranges */
	uint64_t forks_killed, forks_exited;
	uint64_t exp_backed;		/* attaches of kvd_exporter buffers */
};

/*
 * What the pages of a proxy map, as the model knows it: each page a page
 * of a backing (its pattern's seed and the page's offset in it) or nothing
 * (an unbacked range, reading zeros). A proxy attached whole is one
 * backing from its offset on; RANGES rewrites the pages it lists and keeps
 * the others. An importer's write into an unbacked page puts SCRATCH_MARK
 * there (into the layout's scratch, shared by all its unbacked pages):
 * until the next layout those pages may read 0 or SCRATCH_MARK, never a
 * backing's bytes.
 */
struct ppage {
	uint32_t seed;			/* 0: unbacked (seeds are odd) */
	uint64_t off;			/* its offset in the backing */
};

struct layout {
	struct ppage pg[MAX_PAGES];
	bool dirty;			/* an unbacked page was written */
	bool ranges;			/* made by RANGES */
};

/* An open /dev/kvdmabuf file: the identity that may control its proxies. */
struct devf {
	int fd;
};

/* The model of one proxy this process created. */
struct pmodel {
	pthread_mutex_t lock;
	int refs;			/* pslots + islots naming it; w->mlock */
	const struct devf *owner;	/* creating device file */
	uint64_t id, length, gen, notifications;
	uint32_t state, reason;
	uint64_t bid;			/* current backing (0: none) */
	uint64_t boff;			/* its offset (0 for ranges) */
	struct layout lay;		/* what its pages map while backed */
	int pins;			/* pinned imports */
	int dyn;			/* dynamic and lazy imports */
	int exp_fd;			/* the current backing, if a kvd_exporter
					 * buffer (else -1): for OP_EXP_INVAL */
	/* Per import slot: the backing a lazy import still maps (0: none). */
	uint64_t lazy_map[ISLOTS];
};

struct pslot {
	pthread_mutex_t lock;
	int fd;				/* -1: empty */
	struct pmodel *m;		/* NULL with fd >= 0: inherited (child) */
};

struct bslot {
	pthread_mutex_t lock;
	int fd;
	uint64_t size, bid;
	uint32_t seed;
	ino_t ino;			/* the dma-buf's inode: who fd names */
};

struct islot {
	pthread_mutex_t lock;
	int handle;			/* -1: empty */
	int mode;			/* OP_IMPORT, OP_IMPORT_LAZY, OP_IMPORT_PIN */
	struct pmodel *m;		/* the proxy's model, if ours */
	int what;			/* IMP_OURS, IMP_VGEM, IMP_INHERITED */
	int via;			/* VIA_IMPORTER, VIA_UMEM, VIA_UMEM32 */
	uint64_t size;
	uint32_t seed;			/* IMP_VGEM: the buffer's pattern */
};

enum { IMP_OURS, IMP_VGEM, IMP_INHERITED };

/*
 * The importer an import slot went through: the test importer
 * (tests/kmod/kvd_importer.c), or ib_core's dma-buf umem through
 * tests/kmod/kvd_umem.c, for its first device or its second one (32-bit
 * DMA mask, KVD_UMEM_IMPORT_DEV32): three importer devices.
 */
enum { VIA_IMPORTER, VIA_UMEM, VIA_UMEM32 };

/* One process's objects and model, shared by its threads. */
struct world {
	struct devf devs[MAX_DEVS];
	int nr_devs, cur_dev;		/* atomics */
	int imp, drm;
	int umem, exp;			/* -1 where the test module is missing */
	int child;			/* a forked child: imports only dynamic of inherited */
	pthread_mutex_t mlock;		/* pmodel refs */
	struct pslot p[PSLOTS];
	struct bslot b[BSLOTS];
	struct islot i[ISLOTS];
	uint64_t next_bid;		/* atomic */
	uint32_t salt;
};

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64: small, seedable, good enough to pick operations. */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ---- backing patterns: byte @pos of a backing with @seed ---- */

static uint8_t pat_byte(uint32_t seed, uint64_t pos)
{
	uint32_t w = seed * 2654435761u + (uint32_t)(pos / 4);

	return (uint8_t)(w >> (8 * (pos % 4)));
}

static void pat_expect(uint8_t *buf, uint32_t seed, uint64_t pos, size_t len)
{
	size_t k;

	for (k = 0; k < len; k++)
		buf[k] = pat_byte(seed, pos + k);
}

/* The whole proxy maps backing @seed from byte @off on (an attach). */
static void layout_whole(struct layout *l, uint32_t seed, uint64_t off)
{
	int p;

	for (p = 0; p < MAX_PAGES; p++)
		l->pg[p] = (struct ppage){ seed, off + (uint64_t)p * FZ_PAGE };
	l->dirty = false;
	l->ranges = false;
}

/* Byte @pos of a proxy of layout @l; -1 where it may be 0 or SCRATCH_MARK. */
static int layout_byte(const struct layout *l, uint64_t pos)
{
	const struct ppage *pg = &l->pg[(pos / FZ_PAGE) % MAX_PAGES];

	if (pg->seed)
		return pat_byte(pg->seed, pg->off + pos % FZ_PAGE);
	return l->dirty ? -1 : 0;
}

/* The first of the @len bytes @got at proxy byte @off that layout @l
 * cannot hold, or @len. */
static size_t layout_mismatch(const struct layout *l, const uint8_t *got,
			      uint64_t off, size_t len)
{
	size_t k;
	int b;

	for (k = 0; k < len; k++) {
		b = layout_byte(l, off + k);
		if (b >= 0 ? got[k] != b :
		    got[k] != 0 && got[k] != SCRATCH_MARK)
			return k;
	}
	return len;
}

/* What an importer writes to proxy bytes [@off, @off + @len): what a
 * backed page holds, SCRATCH_MARK into unbacked pages; true if any. */
static bool layout_fill(const struct layout *l, uint8_t *buf, uint64_t off,
			size_t len)
{
	bool unbacked = false;
	size_t k;
	int b;

	for (k = 0; k < len; k++) {
		b = l->pg[((off + k) / FZ_PAGE) % MAX_PAGES].seed ?
		    layout_byte(l, off + k) : -1;
		unbacked |= b < 0;
		buf[k] = b < 0 ? SCRATCH_MARK : (uint8_t)b;
	}
	return unbacked;
}

static uint64_t new_bid(struct world *w)
{
	return __atomic_add_fetch(&w->next_bid, 1, __ATOMIC_RELAXED);
}

static uint32_t bid_seed(struct world *w, uint64_t bid)
{
	uint64_t s = bid ^ ((uint64_t)w->salt << 32);

	return (uint32_t)rng_next(&s) | 1;
}

/* A vgem dma-buf of @size bytes filled with pattern @seed; fd or -errno. */
static int pattern_backing(struct world *w, uint64_t size, uint32_t seed)
{
	return w->drm < 0 ? -ENODEV : vgem_pattern_buf(w->drm, size, seed);
}

/* The inode of what @fd names (each dma-buf has its own), 0 if none. */
static ino_t fd_ino(int fd)
{
	struct stat st;

	return fstat(fd, &st) ? 0 : st.st_ino;
}

/* ---- world ---- */

static void world_locks_init(struct world *w)
{
	int i;

	pthread_mutex_init(&w->mlock, NULL);
	for (i = 0; i < PSLOTS; i++)
		pthread_mutex_init(&w->p[i].lock, NULL);
	for (i = 0; i < BSLOTS; i++)
		pthread_mutex_init(&w->b[i].lock, NULL);
	for (i = 0; i < ISLOTS; i++)
		pthread_mutex_init(&w->i[i].lock, NULL);
}

static void world_init(struct world *w, uint32_t salt)
{
	int i;

	memset(w, 0, sizeof(*w));
	w->devs[0].fd = open(KVDMABUF_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	w->nr_devs = 1;
	w->imp = open(KVD_IMPORTER_PATH, O_RDWR | O_CLOEXEC);
	w->drm = vgem_open();
	w->umem = open(KVD_UMEM_PATH, O_RDWR | O_CLOEXEC);
	w->exp = open(KVD_EXPORTER_PATH, O_RDWR | O_CLOEXEC);
	w->salt = salt;
	world_locks_init(w);
	for (i = 0; i < PSLOTS; i++)
		w->p[i].fd = -1;
	for (i = 0; i < BSLOTS; i++)
		w->b[i].fd = -1;
	for (i = 0; i < ISLOTS; i++)
		w->i[i].handle = -1;
}

static void model_put(struct world *w, struct pmodel *m)
{
	int last;

	if (!m)
		return;
	pthread_mutex_lock(&w->mlock);
	last = !--m->refs;
	pthread_mutex_unlock(&w->mlock);
	if (last) {
		pthread_mutex_destroy(&m->lock);
		if (m->exp_fd >= 0)
			close(m->exp_fd);
		free(m);
	}
}

static struct pmodel *model_get(struct world *w, struct pmodel *m)
{
	if (m) {
		pthread_mutex_lock(&w->mlock);
		m->refs++;
		pthread_mutex_unlock(&w->mlock);
	}
	return m;
}

static const struct devf *cur_devf(struct world *w)
{
	return &w->devs[__atomic_load_n(&w->cur_dev, __ATOMIC_ACQUIRE)];
}

/* The device file a call goes through: mostly the current one. */
static const struct devf *pick_devf(struct world *w, uint8_t sel)
{
	int n = __atomic_load_n(&w->nr_devs, __ATOMIC_ACQUIRE);

	if (sel % 8 == 0 && n > 1)
		return &w->devs[(sel >> 3) % n];
	return cur_devf(w);
}

/* ---- checks ---- */

/* Where a check failure is described; one per calling thread. */
static __thread char *cur_why;

#define BAD(fmt, ...) do {						\
	if (cur_why && !cur_why[0])					\
		snprintf(cur_why, 256, fmt, ##__VA_ARGS__);		\
} while (0)

static const char *ename(int e)
{
	const char *n = e > 0 ? strerrorname_np(e) : NULL;

	return e == 0 ? "0" : n ? n : "?";
}

/* @ret must be exactly -@want. */
static void want_err(const char *what, int ret, int want)
{
	if (ret != -want)
		BAD("%s: got %s, the model says %s", what, ename(-ret),
		    ename(want));
}

/* @ret must be one of the errnos in @set (0 ends it; 0 is never allowed). */
static void want_one_of(const char *what, int ret, const int *set)
{
	int k;

	for (k = 0; set[k]; k++)
		if (ret == -set[k])
			return;
	BAD("%s: got %s, not one the model allows", what, ename(-ret));
}

static const int junk_fd_errs[] = { EBADF, EINVAL, 0 };

/*
 * Where memory can run out, as the model sees it. Every allocation the
 * fuzzer's calls make in the kernel is small: the module's and importers'
 * structs, tables of a few entries, the importer's bounce buffer of at
 * most 8 KiB; only the vgem buffers are larger (2 MiB at most, a few dozen
 * MiB alive in all). GFP_KERNEL allocations that small do not fail while
 * the guest has memory to reclaim: -ENOMEM is an answer only of a call
 * that allocates, after every check the module makes before it allocates
 * (the pin check first), and only while the guest is nearly out of memory
 * (MemAvailable below LOW_MEM_KB when the answer came). Anywhere else it
 * is a failure like any other errno the model does not expect.
 */
#define LOW_MEM_KB	(64 * 1024)

static bool mem_ran_out(int ret)
{
	FILE *f;
	char line[128];
	long kb = -1;

	if (ret != -ENOMEM)
		return false;
	f = fopen("/proc/meminfo", "r");
	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %ld kB", &kb) == 1)
			break;
	fclose(f);
	if (kb >= LOW_MEM_KB)
		BAD("ENOMEM with %ld MiB of memory available", kb / 1024);
	return kb >= 0 && kb < LOW_MEM_KB;
}

/* The size field of an extensible struct: mostly right; short, longer with
 * a zero or non-zero tail, or absurd one time in four. Sets *err to what
 * the module must answer for it (0: fine). */
static uint32_t pick_size(uint8_t sel, uint32_t right, void *buf, int *err)
{
	*err = 0;
	switch (sel % 16) {
	case 0:
		*err = EINVAL;
		return 8;
	case 1:
		memset((char *)buf + right, 0, 64);
		return right + 64;
	case 2:
		memset((char *)buf + right, 0, 64);
		((char *)buf)[right + 3] = 1;
		*err = E2BIG;
		return right + 64;
	case 3:
		*err = E2BIG;
		return 1u << 20;
	default:
		return right;
	}
}

static uint32_t pick_flags(uint64_t y)
{
	/* Sometimes one stray bit, sometimes every bit, else 0 or bit 0. */
	switch (y % 4) {
	case 0:
		return 1u << ((y >> 8) % 32);
	case 1:
		return (uint32_t)(y >> 16);
	default:
		return (y >> 8) & 1;
	}
}

/* Non-zero one time in sixteen: a reserved or pad field set. */
static uint64_t pick_junk(uint32_t flags, int shift)
{
	return ((flags >> shift) & 15) == 0 ? 1 : 0;
}

static uint64_t pick_length(uint64_t x, int *err)
{
	*err = 0;
	if (x % 16 == 0) {
		switch ((x >> 4) % 3) {
		case 0:
			*err = EINVAL;
			return 0;
		case 1:
			*err = EINVAL;
			return 4095;
		default:
			*err = EFBIG;
			return ~0ull & ~4095ull;
		}
	}
	return 4096ull << ((x >> 4) % 5);
}

/* A junk fd for a proxy or backing argument: never one of our proxies. */
static int junk_fd(struct world *w, uint8_t sel)
{
	switch (sel % 4) {
	case 0:
		return cur_devf(w)->fd;	/* not a dma-buf */
	case 1:
		return -1;
	case 2:
		return w->drm;		/* a DRM fd, not a dma-buf */
	default:
		return 900 + sel % 64;	/* not open */
	}
}

/* ---- the model's answers ---- */

/* Distinct backings that lazy imports still map other than the current. */
static int stale_held(const struct pmodel *m)
{
	uint64_t seen[ISLOTS];
	int n = 0, i, j;

	for (i = 0; i < ISLOTS; i++) {
		uint64_t b = m->lazy_map[i];

		if (!b || (m->state == KVDMABUF_STATE_BACKED && b == m->bid))
			continue;
		for (j = 0; j < n && seen[j] != b; j++)
			;
		if (j == n)
			seen[n++] = b;
	}
	return n;
}

/* The current backing goes away (revoke, replace): dynamic imports unmap. */
static void model_unback(struct pmodel *m)
{
	m->notifications++;
	if (m->exp_fd >= 0)
		close(m->exp_fd);
	m->exp_fd = -1;
}

static void query_check(struct pmodel *m, const struct kvdmabuf_query *q)
{
	if (q->state != m->state || q->generation != m->gen ||
	    q->length != m->length || q->id != m->id)
		BAD("query: state %u gen %llu length %llu id %llu, the model says %u %llu %llu %llu",
		    q->state, (unsigned long long)q->generation,
		    (unsigned long long)q->length, (unsigned long long)q->id,
		    m->state, (unsigned long long)m->gen,
		    (unsigned long long)m->length, (unsigned long long)m->id);
	else if (q->offset != (m->state == KVDMABUF_STATE_BACKED ? m->boff : 0))
		BAD("query: offset %llu, the model says %llu",
		    (unsigned long long)q->offset, (unsigned long long)m->boff);
	else if (q->blocking_pins != (uint32_t)m->pins ||
		 q->pinned_importers != (uint32_t)m->pins)
		BAD("query: %u blocking pins by %u importers, the model holds %d pinned imports",
		    q->blocking_pins, q->pinned_importers, m->pins);
	else if (q->dynamic_importers < (uint32_t)m->dyn)
		BAD("query: %u dynamic importers, the model holds %d",
		    q->dynamic_importers, m->dyn);
	else if (q->stale_backings != (uint32_t)stale_held(m))
		BAD("query: %u stale backings, lazy imports still map %d",
		    q->stale_backings, stale_held(m));
	else if (q->notifications != m->notifications)
		BAD("query: %llu notifications, the model counts %llu",
		    (unsigned long long)q->notifications,
		    (unsigned long long)m->notifications);
	else if (q->revoke_reason != m->reason)
		BAD("query: revoke reason %u, the model says %u",
		    q->revoke_reason, m->reason);
}

/* Compares an importer read of proxy bytes [off, off + len) of
 * generation @gen with layout @l: each page its backing's pattern at the
 * right offset, zeros where unbacked (or SCRATCH_MARK once written). */
static void data_check(struct shared *sh, const struct layout *l,
		       uint64_t gen, const uint8_t *got, uint64_t off,
		       size_t len, const char *who)
{
	size_t k = layout_mismatch(l, got, off, len);
	int b;

	__atomic_fetch_add(&sh->data_checks, 1, __ATOMIC_RELAXED);
	if (l->ranges)
		__atomic_fetch_add(&sh->range_checks, 1, __ATOMIC_RELAXED);
	if (k == len)
		return;
	b = layout_byte(l, off + k);
	if (b < 0)
		BAD("%s: byte %llu of generation %llu, unbacked and written since, reads %#x (neither 0 nor what was written: a backing's bytes)",
		    who, (unsigned long long)(off + k),
		    (unsigned long long)gen, got[k]);
	else
		BAD("%s: byte %llu of generation %llu reads %#x, its %s has %#x (another backing's bytes)",
		    who, (unsigned long long)(off + k),
		    (unsigned long long)gen, got[k],
		    l->pg[((off + k) / FZ_PAGE) % MAX_PAGES].seed ?
		    "backing" : "unbacked range", b);
}

/* ---- operations ---- */

/* Where forked children log (set in each worker before its threads run). */
static struct shared *fork_log;
static int fork_worker;

/* A revoke or replace of a backed proxy returned 0 before the lazy
 * imports the model knows of dropped their stale mappings. */
static void early_drain(const char *what)
{
	BAD("%s returned 0 while %s", what,
	    "a lazy import still maps a stale backing");
}

static int imp_ioctl(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) ? -errno : 0;
}

static int imp_do_access(int imp, int handle, int write, uint64_t off,
			 uint64_t len, void *buf)
{
	struct kvd_imp_access ac = {
		.handle = (uint32_t)handle,
		.flags = write ? KVD_IMP_ACCESS_WRITE : 0,
		.offset = off, .length = len, .buf = (uintptr_t)buf,
	};

	return imp_ioctl(imp, KVD_IMP_IOCTL_ACCESS, &ac);
}

static int imp_do_release(int imp, int handle)
{
	struct kvd_imp_release rl = { .handle = (uint32_t)handle };

	return imp_ioctl(imp, KVD_IMP_IOCTL_RELEASE, &rl);
}

/*
 * The proxy an ioctl targets, by selector @sel: junk one time in eight
 * (*@junk set), else proxy slot @sel >> 3's fd with the slot's lock and
 * its model's (if any) held in *@psp and *@mp. False when that slot is
 * empty: nothing locked, nothing to do.
 */
static bool lock_proxy(struct world *w, uint64_t sel, __u32 *fd,
		       struct pslot **psp, struct pmodel **mp, int *junk)
{
	struct pslot *ps;

	if (sel % 8 == 7) {
		*fd = (__u32)junk_fd(w, sel >> 3);
		*junk = 1;
		return true;
	}
	ps = &w->p[(sel >> 3) % PSLOTS];
	pthread_mutex_lock(&ps->lock);
	if (ps->fd < 0) {
		pthread_mutex_unlock(&ps->lock);
		return false;
	}
	*psp = ps;
	*mp = ps->m;
	if (*mp)
		pthread_mutex_lock(&(*mp)->lock);
	*fd = (__u32)ps->fd;
	return true;
}

/* The importer device file of import slot @is. */
static int islot_fd(const struct world *w, const struct islot *is)
{
	return is->via == VIA_IMPORTER ? w->imp : w->umem;
}

/* Empties import slot @s (its lock held): release, update the model. */
static void islot_release(struct world *w, int s)
{
	struct islot *is = &w->i[s];
	struct pmodel *m = is->m;
	int ret;

	if (is->handle < 0)
		return;
	if (m)
		pthread_mutex_lock(&m->lock);
	ret = imp_do_release(islot_fd(w, is), is->handle);
	if (ret)
		BAD("release of handle %d: %s", is->handle, ename(-ret));
	if (m) {
		if (is->mode == OP_IMPORT_PIN)
			m->pins--;
		else
			m->dyn--;
		m->lazy_map[s] = 0;
		pthread_mutex_unlock(&m->lock);
	}
	is->handle = -1;
	is->m = NULL;
	model_put(w, m);
}

struct args_err {
	int size;		/* from pick_size() */
	int inval;		/* flags, pad, reserved, offset, timeout */
};

static int args_expected(const struct args_err *e)
{
	return e->size ? e->size : e->inval ? EINVAL : 0;
}

/*
 * The model's answer to a call that swaps a proxy's backing (ATTACH, with
 * or without KVDMABUF_ATTACH_REPLACE, and RANGES) once the module found
 * its arguments good, in the module's order: -EEXIST for a plain attach
 * of a backed proxy, -EAGAIN with @held_before stale backings at the
 * bound, -EBUSY under a pin; else 0, or -ETIMEDOUT after the swap (or
 * -ENOMEM where memory ran out). True when the call swapped: the caller
 * then calls swap_done().
 */
static bool swap_expect(struct pmodel *m, const char *name, int ret,
			bool replace, int held_before)
{
	char what[96];

	if (m->state == KVDMABUF_STATE_BACKED && !replace) {
		want_err("attach of a backed proxy", ret, EEXIST);
		return false;
	}
	/* In any state: an exporter's invalidations are not bounded by
	 * the stale bound, the attach that follows them is. */
	if (held_before >= KVDMABUF_MAX_STALE_BACKINGS) {
		snprintf(what, sizeof(what), "%s with every stale backing held",
			 name);
		want_err(what, ret, EAGAIN);
		return false;
	}
	if (m->state == KVDMABUF_STATE_BACKED && m->pins) {
		if (!ret || ret == -ETIMEDOUT) {
			BAD("%s succeeded under %d pinned import(s)", name,
			    m->pins);
		} else {
			snprintf(what, sizeof(what), "%s under a pin", name);
			want_err(what, ret, EBUSY);
		}
		if (ret)
			return false;
	}
	if (mem_ran_out(ret))
		return false;
	if (ret && ret != -ETIMEDOUT) {
		BAD("%s of a %s proxy: %s", name,
		    m->state == KVDMABUF_STATE_BACKED ? "backed" : "unbacked",
		    ename(-ret));
		return false;
	}
	return true;
}

/*
 * A swap that swap_expect() accepted: backing @bid (at offset @boff) is
 * current, one generation on; the caller sets m->lay. @generation: what
 * the call returned, NULL if it returned none.
 */
static void swap_done(struct pmodel *m, const char *name, int ret,
		      uint64_t bid, uint64_t boff, const __u64 *generation)
{
	bool was_backed = m->state == KVDMABUF_STATE_BACKED;

	if (was_backed)
		model_unback(m);
	else if (ret)
		BAD("%s of an unbacked proxy (nothing to replace) returned %s",
		    name, ename(-ret));
	m->gen++;
	m->state = KVDMABUF_STATE_BACKED;
	m->reason = KVDMABUF_REVOKE_NONE;
	m->bid = bid;
	m->boff = boff;
	if (generation && !ret && *generation != m->gen)
		BAD("%s returned generation %llu, the model says %llu", name,
		    (unsigned long long)*generation,
		    (unsigned long long)m->gen);
	/*
	 * A replace of a backed proxy waits exactly while lazy imports map a
	 * stale backing; an attach of an unbacked one (REPLACE flag or not)
	 * never waits, whatever an earlier timed-out revoke left (checked
	 * above: it returns 0).
	 */
	if (was_backed && !ret && stale_held(m))
		early_drain(name);
	else if (was_backed && ret && !stale_held(m))
		BAD("%s returned ETIMEDOUT with no stale mapping", name);
}

/* ATTACH or REPLACE on proxy slot @op->b with a fresh or shared backing. */
static int do_attach(struct world *w, const struct op *op)
{
	struct kvdmabuf_attach u[4];	/* room for pick_size()'s 64-byte tail */
	const struct devf *d = pick_devf(w, op->c);
	struct pslot *ps = NULL;
	struct bslot *bs = NULL;
	struct pmodel *m = NULL;
	struct args_err e = { 0 };
	uint64_t bid = 0, bsize = 0, end;
	uint32_t seed = 0;
	int ret, want, fresh = -1, junk_proxy = 0, junk_backing = 0, loop = 0;
	int replace, held_before = 0, exp = 0;
	const char *name = op_names[op->kind];

	memset(u, 0, sizeof(u));
	u->flags = op->kind == OP_REPLACE ? KVDMABUF_ATTACH_REPLACE : 0;
	if (op->y % 8 == 0)
		u->flags |= pick_flags(op->y >> 3);
	e.inval |= !!(u->flags & ~KVDMABUF_ATTACH_VALID_FLAGS);
	replace = u->flags & KVDMABUF_ATTACH_REPLACE;
	u->offset = op->x % 16 ? ((op->x >> 4) % 3) * 4096 : op->x & ~4095ull;
	if (op->x % 64 == 16)
		u->offset |= 512;	/* not page aligned */
	e.inval |= !!(u->offset % 4096);
	u->timeout_ms = op->flags % 32 == 0 ? KVDMABUF_MAX_TIMEOUT_MS + 1 :
			op->flags % 20;
	e.inval |= u->timeout_ms > KVDMABUF_MAX_TIMEOUT_MS;
	u->pad = pick_junk(op->flags, 12);
	u->reserved = pick_junk(op->flags, 16);
	e.inval |= u->pad || u->reserved;
	u->size = pick_size(op->a, sizeof(*u), u, &e.size);

	/* The proxy: a slot of ours, or junk one time in eight. */
	if (!lock_proxy(w, op->b, &u->proxy_fd, &ps, &m, &junk_proxy))
		return 1;	/* nothing to attach: not counted */

	/* The backing: a fresh pattern buffer, a shared one, the proxy
	 * itself (ELOOP) or junk. */
	switch (op->c % 16) {
	case 0:
		u->backing_fd = (uint32_t)junk_fd(w, op->c >> 4);
		junk_backing = 1;
		break;
	case 1:
		if (ps) {
			u->backing_fd = u->proxy_fd;
			loop = 1;
			break;
		}
		/* fall through */
	case 2 ... 3:
		bs = &w->b[(op->c >> 4) % BSLOTS];
		pthread_mutex_lock(&bs->lock);
		if (bs->fd < 0) {
			pthread_mutex_unlock(&bs->lock);
			bs = NULL;
			goto fresh;
		}
		u->backing_fd = (uint32_t)bs->fd;
		bsize = bs->size;
		/* A new backing of the proxy's, whatever the buffer. */
		bid = new_bid(w);
		seed = bs->seed;
		break;
	default:
fresh:
		/* Big enough mostly; one time in eight one page short. */
		bsize = (m ? m->length : 4096) + u->offset % (1ull << 20) +
			((op->y >> 20) % 2) * 4096;
		if ((op->y >> 24) % 8 == 0 && bsize > 4096)
			bsize -= 4096;
		if (bsize > (1ull << 21))
			bsize = 4096;
		bid = new_bid(w);
		seed = bid_seed(w, bid);
		/* One time in two a kvd_exporter buffer (dynamic: it moves
		 * and revokes under the proxy, OP_EXP_INVAL), else vgem. */
		if (w->exp >= 0 && (op->y >> 28) % 2 == 0) {
			bsize = (bsize + 4095) & ~4095ull;
			fresh = exp_buf(w->exp, bsize, 0, seed);
			exp = fresh >= 0;
		} else {
			fresh = pattern_backing(w, bsize, seed);
		}
		if (fresh < 0) {
			ret = 1;
			goto out;
		}
		u->backing_fd = (uint32_t)fresh;
		break;
	}

	if (m)
		held_before = stale_held(m);
	ret = ioctl(d->fd, KVDMABUF_IOCTL_ATTACH, u) ? -errno : 0;

	/* What the module must have answered, in its order of checks. */
	want = args_expected(&e);
	if (want) {
		want_err(name, ret, want);
		goto out;
	}
	if (junk_proxy) {
		want_one_of(name, ret, junk_fd_errs);
		goto out;
	}
	if (!m) {	/* inherited from the parent (a child) */
		want_err("attach of an inherited proxy", ret, EPERM);
		goto out;
	}
	if (m->owner != d) {
		want_err("attach from another device file", ret, EPERM);
		goto out;
	}
	if (junk_backing) {
		want_one_of(name, ret, junk_fd_errs);
		goto out;
	}
	if (loop) {
		want_err("attach of a proxy as backing", ret, ELOOP);
		goto out;
	}
	if (__builtin_add_overflow(u->offset, m->length, &end)) {
		want_err(name, ret, EOVERFLOW);
		goto out;
	}
	if (end > bsize) {
		want_err("attach of a short backing", ret, ERANGE);
		goto out;
	}
	if (!swap_expect(m, name, ret, replace, held_before))
		goto out;
	/* Done: the new backing is current. */
	swap_done(m, name, ret, bid, u->offset,
		  u->size >= KVDMABUF_ATTACH_SIZE_VER0 ? &u->generation : NULL);
	layout_whole(&m->lay, seed, u->offset);
	if (exp) {
		m->exp_fd = fresh;	/* the model keeps it */
		fresh = -1;
		if (fork_log)	/* not in a replay */
			__atomic_fetch_add(&fork_log->exp_backed, 1,
					   __ATOMIC_RELAXED);
	}
out:
	if (fresh >= 0)
		close(fresh);
	if (bs)
		pthread_mutex_unlock(&bs->lock);
	if (m)
		pthread_mutex_unlock(&m->lock);
	if (ps)
		pthread_mutex_unlock(&ps->lock);
	return ret;
}

/* What names a range's backing in a fuzzed RANGES batch. */
enum { RB_UNBACKED, RB_SLOT, RB_FRESH, RB_PROXY, RB_JUNK };

struct rpick {
	int kind;
	int slot;			/* RB_SLOT: the backing slot */
	uint32_t seed;			/* its pattern */
	uint64_t size;			/* its size */
	bool tail;			/* a non-zero byte past the struct */
};

/*
 * What the module must answer for range @r of a proxy of @plen bytes (0:
 * good), in kvd_range_read()'s order; *@junk set where the backing_fd is
 * junk that is open or not (EBADF or EINVAL).
 */
static int range_expect(const struct kvdmabuf_range *r,
			const struct rpick *rp, uint64_t plen, bool *junk)
{
	uint64_t end;

	if (rp->tail)
		return E2BIG;
	if (r->flags || r->reserved || !r->length || r->start % FZ_PAGE ||
	    r->length % FZ_PAGE || r->backing_offset % FZ_PAGE)
		return EINVAL;
	if (__builtin_add_overflow(r->start, r->length, &end))
		return EOVERFLOW;
	if (end > plen)
		return ERANGE;
	if (r->backing_fd == KVDMABUF_RANGE_UNBACKED)
		return r->backing_offset ? EINVAL : 0;
	if (r->backing_fd < 0)
		return EBADF;
	if (rp->kind == RB_JUNK) {
		*junk = true;
		return EBADF;
	}
	if (rp->kind == RB_PROXY)
		return ELOOP;
	if (__builtin_add_overflow(r->backing_offset, r->length, &end))
		return EOVERFLOW;
	return end > rp->size ? ERANGE : 0;
}

/* Whether two of @n ranges overlap (the module's -EINVAL after each
 * range passed its own checks). */
static bool ranges_overlap(const struct kvdmabuf_range *r, int n)
{
	int i, j;

	for (i = 0; i < n; i++)
		for (j = i + 1; j < n; j++)
			if (r[i].start < r[j].start + r[j].length &&
			    r[j].start < r[i].start + r[i].length)
				return true;
	return false;
}

/*
 * RANGES on proxy slot @op->b: a batch of 1 to RANGES_MAX ranges that do
 * not overlap, each backed by a backing slot's buffer, a fresh one or
 * nothing, at page-aligned offsets within their sizes; one time in four
 * one range made wrong (flags, reserved, zero or unaligned length or
 * offsets, overflow, beyond the proxy or its backing, a junk fd, the proxy
 * itself, an overlap), now and then the struct (flags, count, range_size,
 * a non-zero tail, no array). The model decides every answer as for a
 * replace (swap_expect(): pins, the stale bound, the owner) and, when it
 * swapped, the new layout: the listed pages as the batch says, the others
 * as they were (all unbacked if the proxy was not backed).
 */
static int do_ranges(struct world *w, const struct op *op)
{
	struct kvdmabuf_ranges u[4];	/* room for pick_size()'s 64-byte tail */
	const size_t rsz = sizeof(struct kvdmabuf_range);
	/* the batch as sent: RANGES_MAX entries of up to rsz + 64 bytes */
	uint64_t raw[RANGES_MAX * (sizeof(struct kvdmabuf_range) + 64) / 8];
	const struct devf *d = pick_devf(w, op->c);
	struct kvdmabuf_range r[RANGES_MAX];
	struct rpick rp[RANGES_MAX];
	struct pslot *ps = NULL;
	struct pmodel *m = NULL;
	struct layout nl;
	uint64_t rs = op->x, bits, plen = FZ_PAGE, fsize = 0;
	uint32_t fseed = 0, npages = 1, slots = 0;
	int ret, want = 0, n, k, i, fresh = -1, junk_proxy = 0, held_before = 0;
	int sel = (int)((op->y >> 8) % 64), mut = -1, mk = 0;
	bool junk = false, inval, e2big;
	size_t stride = rsz;

	memset(u, 0, sizeof(u));
	memset(raw, 0, sizeof(raw));
	memset(r, 0, sizeof(r));
	memset(rp, 0, sizeof(rp));
	u->flags = op->y % 16 == 0 ? pick_flags(op->y >> 4) : 0;
	u->reserved = pick_junk(op->flags, 16);
	u->timeout_ms = op->flags % 32 == 0 ? KVDMABUF_MAX_TIMEOUT_MS + 1 :
			op->flags % 20;
	u->size = pick_size(op->a, sizeof(*u), u, &want);

	if (!lock_proxy(w, op->b, &u->proxy_fd, &ps, &m, &junk_proxy))
		return 1;	/* nothing to change: not counted */
	if (m) {
		plen = m->length;
		npages = (uint32_t)(plen / FZ_PAGE);
	}

	/* The batch's geometry: n ranges, one in each n-th of the proxy,
	 * or the whole proxy as one; sent in a rotated order. */
	bits = rng_next(&rs);
	n = 1 + (int)(bits % RANGES_MAX);
	if ((uint32_t)n > npages)
		n = (int)npages;
	if ((bits >> 2) % 8 == 0)
		n = 1;
	for (k = 0; k < n; k++) {
		uint32_t lo = (uint32_t)k * npages / (uint32_t)n;
		uint32_t hi = (uint32_t)(k + 1) * npages / (uint32_t)n;
		uint32_t s = lo + (uint32_t)(rng_next(&rs) % (hi - lo));
		uint32_t e = s + 1 + (uint32_t)(rng_next(&rs) % (hi - s));
		uint64_t pick;
		int at = (k + (int)((bits >> 5) % (uint64_t)n)) % n;

		if (n == 1 && (bits >> 2) % 8 == 0) {
			s = 0;
			e = npages;
		}
		r[at].start = s * FZ_PAGE;
		r[at].length = (e - s) * FZ_PAGE;
		/* unbacked 3/8, a backing slot 3/8, a fresh buffer 2/8 */
		pick = (bits >> (8 + 3 * k)) % 8;
		rp[at].kind = pick < 3 ? RB_UNBACKED :
			      pick < 6 ? RB_SLOT : RB_FRESH;
		rp[at].slot = (int)((bits >> (20 + 2 * k)) % BSLOTS);
		if (rp[at].kind == RB_SLOT)
			slots |= 1u << rp[at].slot;
	}

	/* One wrong range one time in four: which, and how. */
	if ((op->y >> 16) % 4 == 0) {
		mut = (int)((op->y >> 18) % (uint64_t)n);
		mk = (int)((op->y >> 20) % 13);
	}

	/* The backing slots it names, locked in slot order. */
	for (i = 0; i < BSLOTS; i++)
		if (slots & (1u << i))
			pthread_mutex_lock(&w->b[i].lock);
	for (k = 0; k < n; k++) {
		struct bslot *bs = &w->b[rp[k].slot];
		uint64_t len = r[k].length, room;

		if (rp[k].kind == RB_SLOT && (bs->fd < 0 || bs->size < len))
			rp[k].kind = RB_FRESH;	/* empty or too small */
		if (rp[k].kind == RB_UNBACKED) {
			r[k].backing_fd = KVDMABUF_RANGE_UNBACKED;
			continue;
		}
		if (rp[k].kind == RB_SLOT) {
			r[k].backing_fd = bs->fd;
			rp[k].seed = bs->seed;
			rp[k].size = bs->size;
		} else {
			/* One fresh buffer for the batch, a page longer
			 * than the proxy. */
			if (fresh < 0) {
				fseed = bid_seed(w, new_bid(w));
				fsize = plen + FZ_PAGE;
				fresh = pattern_backing(w, fsize, fseed);
				if (fresh < 0) {
					ret = 1;
					goto out;
				}
			}
			r[k].backing_fd = fresh;
			rp[k].seed = fseed;
			rp[k].size = fsize;
		}
		room = rp[k].size / FZ_PAGE - len / FZ_PAGE + 1;
		r[k].backing_offset = (rng_next(&rs) % room) * FZ_PAGE;
	}

	if (mut >= 0) {
		struct kvdmabuf_range *x = &r[mut];

		switch (mk) {
		case 0:
			x->flags = 1u << (op->x % 32);
			break;
		case 1:
			x->reserved = 1;
			break;
		case 2:
			x->length = 0;
			break;
		case 3:
			x->start += 512;
			break;
		case 4:
			x->length -= 2048;
			break;
		case 5:
			x->backing_offset += x->backing_fd < 0 ? FZ_PAGE : 512;
			break;
		case 6:
			x->start = ~0ull & ~(FZ_PAGE - 1);
			break;
		case 7:
			x->length = plen - x->start + FZ_PAGE;
			break;
		case 8:
			if (ps) {
				x->backing_fd = (int32_t)u->proxy_fd;
				rp[mut].kind = RB_PROXY;
			}
			break;
		case 9:
			x->backing_fd = junk_fd(w, (uint8_t)(op->x >> 8));
			rp[mut].kind = RB_JUNK;
			if (x->backing_fd == KVDMABUF_RANGE_UNBACKED)
				x->backing_fd = -2;
			break;
		case 10:
			x->backing_offset = x->backing_fd < 0 ? 0 :
					    ~0ull & ~(FZ_PAGE - 1);
			break;
		case 11:
			x->backing_offset = x->backing_fd < 0 ? 0 :
					    rp[mut].size;
			break;
		default:
			/* overlap the next one (nothing with one range) */
			if (n > 1) {
				x->start = r[(mut + 1) % n].start;
				x->length = r[(mut + 1) % n].length;
			}
			break;
		}
	}

	/* The struct around it. */
	switch (sel) {
	case 0:
		u->count = 0;
		break;
	case 1:
		u->count = KVDMABUF_MAX_RANGES + 1 + (uint32_t)(op->x % 4096);
		break;
	case 2:
		stride = KVDMABUF_RANGE_SIZE_VER0 - 8;
		break;
	case 3:
		stride = 8192;
		break;
	case 4:
		stride = rsz + 64;	/* a newer caller's zero tail */
		break;
	case 5:
		stride = rsz + 64;
		rp[(op->x >> 16) % (uint64_t)n].tail = true;
		break;
	}
	if (sel > 1)
		u->count = (uint32_t)n;
	u->range_size = (uint32_t)stride;
	if (stride <= rsz + 64) {
		for (k = 0; k < n; k++) {
			memcpy((char *)raw + k * stride, &r[k], rsz);
			if (rp[k].tail)
				((char *)raw)[k * stride + rsz + 3] = 1;
		}
	}
	u->ranges = sel == 6 ? 0 : (uintptr_t)raw;

	if (m)
		held_before = stale_held(m);
	ret = ioctl(d->fd, KVDMABUF_IOCTL_RANGES, u) ? -errno : 0;

	/* What the module must have answered, in its order of checks. */
	inval = u->flags || u->reserved || !u->count ||
		u->range_size < KVDMABUF_RANGE_SIZE_VER0 ||
		u->timeout_ms > KVDMABUF_MAX_TIMEOUT_MS;
	e2big = u->count > KVDMABUF_MAX_RANGES || u->range_size > 4096;
	if (!want)
		want = inval ? EINVAL : e2big ? E2BIG : 0;
	if (want) {
		want_err("ranges", ret, want);
		goto out;
	}
	if (junk_proxy) {
		want_one_of("ranges", ret, junk_fd_errs);
		goto out;
	}
	if (!m) {	/* inherited from the parent (a child) */
		want_err("ranges of an inherited proxy", ret, EPERM);
		goto out;
	}
	if (m->owner != d) {
		want_err("ranges from another device file", ret, EPERM);
		goto out;
	}
	if (!u->ranges) {
		want_err("ranges with no array", ret, EFAULT);
		goto out;
	}
	for (k = 0; k < n && !want; k++)
		want = range_expect(&r[k], &rp[k], plen, &junk);
	if (junk && want == EBADF) {
		want_one_of("ranges with a junk backing fd", ret, junk_fd_errs);
		goto out;
	}
	if (!want && ranges_overlap(r, n))
		want = EINVAL;
	if (want) {
		want_err("ranges", ret, want);
		goto out;
	}
	/* Its array is allocated before the pins are looked at. */
	if (mem_ran_out(ret))
		goto out;
	if (ret == -EBUSY && !u->pins)
		BAD("ranges returned EBUSY with no pins");
	if (!swap_expect(m, "ranges", ret, true, held_before))
		goto out;

	/* Swapped: the new layout, from what the proxy mapped before. */
	nl = m->lay;
	if (m->state != KVDMABUF_STATE_BACKED)
		memset(&nl, 0, sizeof(nl));
	nl.dirty = false;		/* a new layout, a new scratch */
	nl.ranges = true;
	for (k = 0; k < n; k++) {
		uint64_t p;

		for (p = 0; p < r[k].length / FZ_PAGE; p++) {
			struct ppage *pg = &nl.pg[r[k].start / FZ_PAGE + p];

			if (rp[k].kind == RB_UNBACKED)
				*pg = (struct ppage){ 0, 0 };
			else
				*pg = (struct ppage){ rp[k].seed,
					r[k].backing_offset + p * FZ_PAGE };
		}
	}
	swap_done(m, "ranges", ret, new_bid(w), 0, &u->generation);
	m->lay = nl;
out:
	if (fresh >= 0)
		close(fresh);
	for (i = BSLOTS - 1; i >= 0; i--)
		if (slots & (1u << i))
			pthread_mutex_unlock(&w->b[i].lock);
	if (m)
		pthread_mutex_unlock(&m->lock);
	if (ps)
		pthread_mutex_unlock(&ps->lock);
	return ret;
}

static int do_revoke(struct world *w, const struct op *op)
{
	struct kvdmabuf_revoke u[4];	/* room for pick_size()'s 64-byte tail */
	const struct devf *d = pick_devf(w, op->c);
	struct pslot *ps = NULL;
	struct pmodel *m = NULL;
	struct args_err e = { 0 };
	int ret, want, junk_proxy = 0;

	memset(u, 0, sizeof(u));
	u->timeout_ms = op->flags % 32 == 0 ? KVDMABUF_MAX_TIMEOUT_MS + 1 :
			op->flags % 20;
	u->flags = op->y % 8 ? 0 : pick_flags(op->y >> 3);
	u->reserved = pick_junk(op->flags, 16);
	e.inval = u->flags || u->reserved ||
		  u->timeout_ms > KVDMABUF_MAX_TIMEOUT_MS;
	u->size = pick_size(op->a, sizeof(*u), u, &e.size);
	if (!lock_proxy(w, op->b, &u->proxy_fd, &ps, &m, &junk_proxy))
		return 1;
	ret = ioctl(d->fd, KVDMABUF_IOCTL_REVOKE, u) ? -errno : 0;

	want = args_expected(&e);
	if (want) {
		want_err("revoke", ret, want);
	} else if (junk_proxy) {
		want_one_of("revoke", ret, junk_fd_errs);
	} else if (!m) {
		want_err("revoke of an inherited proxy", ret, EPERM);
	} else if (m->owner != d) {
		want_err("revoke from another device file", ret, EPERM);
	} else if (m->state == KVDMABUF_STATE_BACKED &&
		   stale_held(m) >= KVDMABUF_MAX_STALE_BACKINGS) {
		want_err("revoke with every stale backing held", ret, EAGAIN);
	} else if (m->state == KVDMABUF_STATE_BACKED && m->pins) {
		if (!ret || ret == -ETIMEDOUT)
			BAD("revoke succeeded under %d pinned import(s)", m->pins);
		else
			want_err("revoke under a pin", ret, EBUSY);
	} else if (ret && ret != -ETIMEDOUT && !mem_ran_out(ret)) {
		BAD("revoke of a %s proxy: %s",
		    m->state == KVDMABUF_STATE_BACKED ? "backed" : "unbacked",
		    ename(-ret));
	} else if (!ret || ret == -ETIMEDOUT) {
		if (m->state == KVDMABUF_STATE_BACKED) {
			model_unback(m);
			m->gen++;
			m->state = KVDMABUF_STATE_REVOKED;
			m->reason = KVDMABUF_REVOKE_USER;
		}
		if (!ret && u->size >= KVDMABUF_REVOKE_SIZE_VER0 &&
		    u->generation != m->gen)
			BAD("revoke returned generation %llu, the model says %llu",
			    (unsigned long long)u->generation,
			    (unsigned long long)m->gen);
		/* The drain: waits exactly while lazy imports map a stale backing. */
		if (stale_held(m) && !ret)
			early_drain("revoke");
		if (!stale_held(m) && ret)
			BAD("revoke returned ETIMEDOUT with no stale mapping");
	}
	if (m)
		pthread_mutex_unlock(&m->lock);
	if (ps)
		pthread_mutex_unlock(&ps->lock);
	return ret;
}

static int do_query(struct world *w, const struct op *op)
{
	struct kvdmabuf_query u[4];	/* room for pick_size()'s 64-byte tail */
	const struct devf *d = pick_devf(w, op->c);
	struct pslot *ps = NULL;
	struct pmodel *m = NULL;
	struct args_err e = { 0 };
	int ret, want, junk_proxy = 0;

	memset(u, 0, sizeof(u));
	u->flags = op->y % 8 ? 0 : pick_flags(op->y >> 3);
	u->reserved = pick_junk(op->flags, 16);
	e.inval = u->flags || u->reserved;
	u->size = pick_size(op->a, sizeof(*u), u, &e.size);
	if (!lock_proxy(w, op->b, &u->proxy_fd, &ps, &m, &junk_proxy))
		return 1;
	ret = ioctl(d->fd, KVDMABUF_IOCTL_QUERY, u) ? -errno : 0;
	want = args_expected(&e);
	if (want)
		want_err("query", ret, want);
	else if (junk_proxy)
		want_one_of("query", ret, junk_fd_errs);
	else if (ret)
		BAD("query of a live proxy: %s", ename(-ret));
	else if (m)
		query_check(m, u);
	if (m)
		pthread_mutex_unlock(&m->lock);
	if (ps)
		pthread_mutex_unlock(&ps->lock);
	return ret;
}

static int do_create(struct world *w, const struct op *op)
{
	struct kvdmabuf_create u[4];	/* room for pick_size()'s 64-byte tail */
	const struct devf *d = pick_devf(w, op->c);
	struct pslot *ps = &w->p[op->b % PSLOTS];
	struct args_err e = { 0 };
	struct pmodel *m, *old;
	int ret, want, lerr, oldfd;

	memset(u, 0, sizeof(u));
	u->length = pick_length(op->x, &lerr);
	u->flags = op->y % 8 ? (op->y >> 8) & 1 : pick_flags(op->y >> 3);
	u->pad = pick_junk(op->flags, 8);
	u->reserved = pick_junk(op->flags, 16);
	e.inval = (u->flags & ~KVDMABUF_CREATE_VALID_FLAGS) || u->pad ||
		  u->reserved || lerr == EINVAL;
	u->size = pick_size(op->a, sizeof(*u), u, &e.size);
	ret = ioctl(d->fd, KVDMABUF_IOCTL_CREATE, u) ? -errno : 0;
	want = args_expected(&e);
	if (!want && lerr == EFBIG)
		want = EFBIG;
	if (want) {
		want_err("create", ret, want);
		if (!ret)
			close((int)u->fd);
		return ret;
	}
	if (ret) {
		if (!mem_ran_out(ret))
			BAD("create: %s", ename(-ret));
		return ret;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		close((int)u->fd);
		return -ENOMEM;
	}
	pthread_mutex_init(&m->lock, NULL);
	m->refs = 1;
	m->owner = d;
	m->id = u->id;
	m->length = u->length;
	m->state = KVDMABUF_STATE_UNBACKED;
	m->exp_fd = -1;
	pthread_mutex_lock(&ps->lock);
	oldfd = ps->fd;
	old = ps->m;
	ps->fd = (int)u->fd;
	ps->m = m;
	pthread_mutex_unlock(&ps->lock);
	if (oldfd >= 0)
		close(oldfd);
	model_put(w, old);
	return 0;
}

static int do_import(struct world *w, const struct op *op)
{
	struct islot *is = &w->i[op->c % ISLOTS];
	int s = op->c % ISLOTS;
	struct kvd_imp_import im = { 0 };
	struct pslot *ps = NULL;
	struct bslot *bs = NULL;
	struct pmodel *m = NULL;
	int ret, mode = op->kind, junk = 0, via = VIA_IMPORTER, fd = w->imp;

	/* Through ib_core's umem, on either of its devices: dynamic, lazy
	 * or pinned as the test importer's. */
	if (op->kind == OP_UIMPORT) {
		if (w->umem < 0)
			return 1;
		mode = OP_IMPORT + (int)((op->y >> 8) % 3);
		via = op->a % 2 ? VIA_UMEM32 : VIA_UMEM;
		fd = w->umem;
	}
	pthread_mutex_lock(&is->lock);
	/* The old import goes first (its model's lock is taken alone);
	 * only when there is something to import in its place. */
	if ((op->b % 16 == 1 && __atomic_load_n(&w->b[(op->b >> 4) % BSLOTS].fd,
						 __ATOMIC_RELAXED) < 0) ||
	    (op->b % 16 > 1 && __atomic_load_n(&w->p[(op->b >> 4) % PSLOTS].fd,
						__ATOMIC_RELAXED) < 0)) {
		pthread_mutex_unlock(&is->lock);
		return 1;
	}
	islot_release(w, s);
	switch (op->b % 16) {
	case 0:
		im.fd = (uint32_t)junk_fd(w, op->b >> 4);
		junk = 1;
		break;
	case 1:
		bs = &w->b[(op->b >> 4) % BSLOTS];
		pthread_mutex_lock(&bs->lock);
		if (bs->fd < 0) {
			pthread_mutex_unlock(&bs->lock);
			pthread_mutex_unlock(&is->lock);
			return 1;
		}
		im.fd = (uint32_t)bs->fd;
		break;
	default:
		ps = &w->p[(op->b >> 4) % PSLOTS];
		pthread_mutex_lock(&ps->lock);
		if (ps->fd < 0) {
			pthread_mutex_unlock(&ps->lock);
			pthread_mutex_unlock(&is->lock);
			return 1;
		}
		m = ps->m;
		if (!m && mode != OP_IMPORT) {
			/* A child pins or lazily maps only its own proxies:
			 * its parent's model must stay exact. */
			pthread_mutex_unlock(&ps->lock);
			pthread_mutex_unlock(&is->lock);
			return 1;
		}
		if (m)
			pthread_mutex_lock(&m->lock);
		im.fd = (uint32_t)ps->fd;
		break;
	}
	im.flags = mode == OP_IMPORT_PIN ? KVD_IMP_IMPORT_PINNED :
		   mode == OP_IMPORT_LAZY ? KVD_IMP_IMPORT_LAZY : 0;
	if (op->y % 16 == 0)
		im.flags |= KVD_IMP_IMPORT_PINNED | KVD_IMP_IMPORT_LAZY;
	if (via == VIA_UMEM32)
		im.flags |= KVD_UMEM_IMPORT_DEV32;
	ret = imp_ioctl(fd, KVD_IMP_IOCTL_IMPORT, &im);
	im.flags &= ~KVD_UMEM_IMPORT_DEV32;

	if (im.flags == (KVD_IMP_IMPORT_PINNED | KVD_IMP_IMPORT_LAZY)) {
		want_err("import pinned and lazy", ret, EINVAL);
	} else if (junk) {
		want_one_of("import of junk", ret, junk_fd_errs);
	} else if (mem_ran_out(ret)) {
		/* the importer's own allocation comes before any pin */
	} else if (bs) {
		if (ret && !(mode == OP_IMPORT_PIN && ret == -EOPNOTSUPP))
			BAD("import of a vgem buffer: %s", ename(-ret));
	} else if (mode == OP_IMPORT_PIN && m &&
		   m->state != KVDMABUF_STATE_BACKED) {
		want_err("pinned import of an unbacked proxy", ret, ENODEV);
	} else if (mode == OP_IMPORT_PIN && m) {
		if (ret)
			BAD("pinned import of a backed proxy: %s", ename(-ret));
	} else if (ret) {
		BAD("%s of a proxy: %s", op_names[mode], ename(-ret));
	}
	if (!ret && im.flags != (KVD_IMP_IMPORT_PINNED | KVD_IMP_IMPORT_LAZY)) {
		is->handle = (int)im.handle;
		is->mode = mode;
		is->via = via;
		is->m = model_get(w, m);
		is->what = bs ? IMP_VGEM : m ? IMP_OURS : IMP_INHERITED;
		is->seed = bs ? bs->seed : 0;
		is->size = bs ? bs->size : 0;
		if (!bs) {
			struct kvdmabuf_query q = { .size = sizeof(q),
						    .proxy_fd = im.fd };

			if (m)
				is->size = m->length;
			else if (!ioctl(cur_devf(w)->fd, KVDMABUF_IOCTL_QUERY, &q))
				is->size = q.length;
		}
		if (m) {
			if (mode == OP_IMPORT_PIN)
				m->pins++;
			else
				m->dyn++;
			m->lazy_map[s] = 0;
		}
	} else if (!ret) {
		imp_do_release(fd, (int)im.handle);
	}
	if (m)
		pthread_mutex_unlock(&m->lock);
	if (ps)
		pthread_mutex_unlock(&ps->lock);
	if (bs)
		pthread_mutex_unlock(&bs->lock);
	pthread_mutex_unlock(&is->lock);
	return ret;
}

static int do_access(struct world *w, struct shared *sh, const struct op *op)
{
	static __thread uint8_t buf[ACCESS_MAX];
	int s = op->c % ISLOTS;
	struct islot *is = &w->i[s];
	struct pmodel *m;
	uint64_t off, len;
	int ret, write = op->y & 1, badlen, range, k;
	bool scratch = false;

	off = op->x % 8 ? (op->x % 16) * 1024 : op->x;
	len = op->y % 8 ? 1 + (op->y >> 8) % 8192 :
	      (op->y >> 3) % 2 ? 0 : (KVD_IMP_MAX_ACCESS + 1 + (op->y >> 8) % 4096);
	badlen = !len || len > KVD_IMP_MAX_ACCESS;
	/* umem-access: the first slot from @op->c on that went through
	 * ib_core's umem. */
	for (k = 0; k < ISLOTS; k++) {
		s = (int)((op->c + (unsigned int)k) % ISLOTS);
		is = &w->i[s];
		pthread_mutex_lock(&is->lock);
		if (op->kind != OP_UACCESS ||
		    (is->handle >= 0 && is->via != VIA_IMPORTER))
			break;
		pthread_mutex_unlock(&is->lock);
	}
	if (k == ISLOTS)
		return 1;
	m = is->m;
	if (m)
		pthread_mutex_lock(&m->lock);
	range = off > is->size || len > is->size - off;
	/* Writes put back the bytes the backing must hold; never into a
	 * parent's proxy (its model is not ours). */
	if (is->what == IMP_INHERITED)
		write = 0;
	if (write && !badlen && !range && is->handle >= 0) {
		if (is->what == IMP_VGEM)
			pat_expect(buf, is->seed, off, len);
		else if (m->state == KVDMABUF_STATE_BACKED)
			scratch = layout_fill(&m->lay, buf, off, len);
	}
	ret = imp_do_access(is->handle < 0 ? w->imp : islot_fd(w, is),
			    is->handle, write, off, len, buf);
	/* Written into unbacked pages (whatever the answer: some bytes may
	 * have gone): they may read SCRATCH_MARK until the next layout. */
	if (scratch)
		m->lay.dirty = true;
	if (badlen)
		want_err("access of a bad length", ret, EINVAL);
	else if (is->handle < 0)
		want_err("access of no import", ret, ENOENT);
	else if (range)
		want_err("access out of range", ret, EINVAL);
	else if (mem_ran_out(ret))
		;
	else if (is->what == IMP_VGEM) {
		if (ret)
			BAD("access of a vgem import: %s", ename(-ret));
		else if (!write) {
			struct layout v;

			layout_whole(&v, is->seed, 0);
			data_check(sh, &v, 0, buf, off, len,
				   "importer read of vgem");
		}
	} else if (is->what == IMP_INHERITED) {
		if (ret && ret != -ENODEV)
			BAD("access of an inherited proxy: %s", ename(-ret));
	} else if (m->state != KVDMABUF_STATE_BACKED) {
		want_err("access of an unbacked proxy", ret, ENODEV);
		m->lazy_map[s] = 0;	/* a stale mapping was dropped */
	} else if (ret) {
		BAD("access of a backed proxy: %s", ename(-ret));
	} else {
		if (!write)
			data_check(sh, &m->lay, m->gen, buf, off, len,
				   "importer read");
		if (is->mode == OP_IMPORT_LAZY)
			m->lazy_map[s] = m->bid;
	}
	if (m)
		pthread_mutex_unlock(&m->lock);
	pthread_mutex_unlock(&is->lock);
	return ret;
}

/*
 * A drain under concurrency: a lazy import maps the current backing; a
 * helper thread keeps accessing it while this thread revokes or replaces
 * with a long timeout. The helper's access drops the stale mapping, which
 * must wake the drain (0, not ETIMEDOUT); each of its reads must hold the
 * old or the new backing's bytes, nothing else.
 */
struct drain_helper {
	struct world *w;
	struct shared *sh;
	int handle, replace;
	uint64_t len;
	struct layout old, new;		/* before and after */
	char why[256];
	int done;
};

static void *drain_helper_fn(void *p)
{
	struct drain_helper *h = p;
	static __thread uint8_t got[4096];
	double end = __th_now() + 10;
	int ret;

	cur_why = h->why;
	while (__th_now() < end) {
		ret = imp_do_access(h->w->imp, h->handle, 0, 0, h->len, got);
		if (!h->replace && ret == -ENODEV)
			break;		/* revoked, stale mapping dropped */
		if (ret) {
			BAD("drain helper: access returned %s", ename(-ret));
			break;
		}
		__atomic_fetch_add(&h->sh->data_checks, 1, __ATOMIC_RELAXED);
		if (h->replace &&
		    layout_mismatch(&h->new, got, 0, h->len) == h->len)
			break;		/* replaced, new mapping */
		if (layout_mismatch(&h->old, got, 0, h->len) != h->len) {
			BAD("drain helper: read neither the old nor the new backing's bytes");
			break;
		}
		usleep(500);
	}
	if (__th_now() >= end)
		BAD("drain helper: the revoke or replace never showed");
	return NULL;
}

/*
 * Proxy slot @sel's model, with the slot's lock and the model's held; NULL
 * (nothing held) when the slot is empty or the proxy is not ours.
 */
static struct pmodel *lock_own_proxy(struct world *w, uint64_t sel,
				     struct pslot **psp)
{
	struct pslot *ps = &w->p[sel % PSLOTS];

	pthread_mutex_lock(&ps->lock);
	if (ps->fd < 0 || !ps->m) {
		pthread_mutex_unlock(&ps->lock);
		return NULL;
	}
	pthread_mutex_lock(&ps->m->lock);
	*psp = ps;
	return ps->m;
}

/*
 * A temporary import (@flags) of the backed proxy in @ps that maps it:
 * its first *@len bytes read and checked. The handle, or -errno: the
 * import or its first access failed (a check failure written unless
 * memory ran out; nothing left imported).
 */
static int import_mapped(struct world *w, struct shared *sh,
			 struct pslot *ps, struct pmodel *m, uint32_t flags,
			 uint64_t *len, const char *who)
{
	struct kvd_imp_import im = { .fd = (uint32_t)ps->fd, .flags = flags };
	uint8_t tmp[64];
	int ret;

	ret = imp_ioctl(w->imp, KVD_IMP_IOCTL_IMPORT, &im);
	if (ret) {
		if (!mem_ran_out(ret))
			BAD("%s: import of a backed proxy: %s", who, ename(-ret));
		return ret;
	}
	*len = m->length < sizeof(tmp) ? m->length : sizeof(tmp);
	ret = imp_do_access(w->imp, (int)im.handle, 0, 0, *len, tmp);
	if (ret) {
		BAD("%s: first access of a backed proxy: %s", who, ename(-ret));
		imp_do_release(w->imp, (int)im.handle);
		return ret;
	}
	data_check(sh, &m->lay, m->gen, tmp, 0, *len, who);
	return (int)im.handle;
}

static int do_drain(struct world *w, struct shared *sh, const struct op *op)
{
	struct pslot *ps = NULL;
	const struct devf *d;
	struct drain_helper h = { .w = w, .sh = sh, .replace = op->y % 2 };
	struct pmodel *m;
	pthread_t tid;
	uint64_t bid = 0;
	uint32_t new_seed = 0;
	int ret, i, fresh = -1;

	m = lock_own_proxy(w, op->b, &ps);
	if (!m)
		return 1;
	d = m->owner;
	/* Only where nothing else would hold the drain: a backed proxy, no
	 * pin, no other lazy mapping. */
	ret = 1;
	if (m->state != KVDMABUF_STATE_BACKED || m->pins || stale_held(m))
		goto out;
	for (i = 0; i < ISLOTS; i++)
		if (m->lazy_map[i])
			goto out;
	h.handle = import_mapped(w, sh, ps, m, KVD_IMP_IMPORT_LAZY, &h.len,
				 "drain: lazy import");
	if (h.handle < 0) {
		ret = h.handle;
		goto out;
	}
	h.old = m->lay;
	if (h.replace) {
		bid = new_bid(w);
		new_seed = bid_seed(w, bid);
		layout_whole(&h.new, new_seed, 0);
		fresh = pattern_backing(w, m->length, new_seed);
		if (fresh < 0) {
			ret = 1;
			goto release;
		}
	}
	if (pthread_create(&tid, NULL, drain_helper_fn, &h)) {
		ret = 1;
		goto release;
	}
	if (h.replace) {
		struct kvdmabuf_attach a = {
			.size = sizeof(a), .flags = KVDMABUF_ATTACH_REPLACE,
			.proxy_fd = (uint32_t)ps->fd,
			.backing_fd = (uint32_t)fresh, .timeout_ms = 5000,
		};

		ret = ioctl(d->fd, KVDMABUF_IOCTL_ATTACH, &a) ? -errno : 0;
		if (!ret || ret == -ETIMEDOUT) {
			model_unback(m);
			m->gen++;
			m->bid = bid;
			m->boff = 0;
			m->lay = h.new;
			if (!ret && a.generation != m->gen)
				BAD("drain: replace returned generation %llu, the model says %llu",
				    (unsigned long long)a.generation,
				    (unsigned long long)m->gen);
		}
	} else {
		struct kvdmabuf_revoke r = {
			.size = sizeof(r), .proxy_fd = (uint32_t)ps->fd,
			.timeout_ms = 5000,
		};

		ret = ioctl(d->fd, KVDMABUF_IOCTL_REVOKE, &r) ? -errno : 0;
		if (!ret || ret == -ETIMEDOUT) {
			model_unback(m);
			m->gen++;
			m->state = KVDMABUF_STATE_REVOKED;
			m->reason = KVDMABUF_REVOKE_USER;
			if (!ret && r.generation != m->gen)
				BAD("drain: revoke returned generation %llu, the model says %llu",
				    (unsigned long long)r.generation,
				    (unsigned long long)m->gen);
		}
	}
	pthread_join(tid, NULL);
	if (h.why[0])
		BAD("%s", h.why);
	if (ret)
		BAD("drain: %s with a helper dropping the stale mapping: %s (the unmap did not wake it)",
		    h.replace ? "replace" : "revoke", ename(-ret));
release:
	i = imp_do_release(w->imp, h.handle);
	if (i)
		BAD("drain: release: %s", ename(-i));
out:
	if (fresh >= 0)
		close(fresh);
	pthread_mutex_unlock(&m->lock);
	pthread_mutex_unlock(&ps->lock);
	return ret;
}

/*
 * The backing's exporter invalidates it: kvd_exporter moves the buffer
 * (new pages, a move notification) or revokes it, under a proxy it backs.
 * Only where the model knows what must follow: a proxy of ours backed by
 * a kvd_exporter buffer, no pin (a move under a pin is the exporter's
 * breach, not the module's), and mapped: a dynamic import of its own maps
 * the backing first, so that the module's slot of it is mapped and the
 * notification must revoke the proxy (reason EXPORTER, one generation,
 * one notification) in its work item; the importers that mapped it drop
 * their mappings, lazy ones keep theirs stale until their next access.
 */
static int do_exp_inval(struct world *w, struct shared *sh,
			const struct op *op)
{
	struct pslot *ps = NULL;
	struct kvdmabuf_query q;
	const char *what = op->y % 2 ? "move" : "revoke";
	uint8_t tmp[64];
	struct pmodel *m;
	uint64_t len;
	double end;
	int ret, r, h;

	/* The first such proxy from slot @op->b on. */
	for (h = 0; h < PSLOTS; h++) {
		m = lock_own_proxy(w, op->b + (uint64_t)h, &ps);
		if (m && m->state == KVDMABUF_STATE_BACKED && m->exp_fd >= 0 &&
		    !m->pins)
			break;
		if (m) {
			pthread_mutex_unlock(&m->lock);
			pthread_mutex_unlock(&ps->lock);
		}
	}
	if (h == PSLOTS)
		return 1;
	h = import_mapped(w, sh, ps, m, 0, &len, "exp-inval: dynamic import");
	if (h < 0) {
		ret = h;
		goto out;
	}
	ret = op->y % 2 ? exp_move(w->exp, m->exp_fd) :
			  exp_revoke(w->exp, m->exp_fd);
	if (ret) {
		BAD("exp-inval: the exporter's %s: %s", what, ename(-ret));
		goto release;
	}
	/* The module revokes in a work item: wait for it, bounded. */
	end = __th_now() + kvd_scaled_ms(2000) / 1e3;
	do {
		r = kvd_query(cur_devf(w)->fd, ps->fd, &q);
		if (r || q.state != KVDMABUF_STATE_BACKED)
			break;
		usleep(1000);
	} while (__th_now() < end);
	model_unback(m);
	m->gen++;
	m->state = KVDMABUF_STATE_REVOKED;
	m->reason = KVDMABUF_REVOKE_EXPORTER;
	if (r)
		BAD("exp-inval: query: %s", ename(-r));
	else if (q.state == KVDMABUF_STATE_BACKED)
		BAD("exp-inval: the exporter's %s of a mapped backing left the proxy backed",
		    what);
	else
		query_check(m, &q);
	/* The import that mapped it now reads nothing. */
	r = imp_do_access(w->imp, h, 0, 0, len, tmp);
	if (r != -ENODEV)
		BAD("exp-inval: access after the exporter's %s: %s (the model says ENODEV)",
		    what, ename(-r));
release:
	r = imp_do_release(w->imp, h);
	if (r)
		BAD("exp-inval: release: %s", ename(-r));
out:
	pthread_mutex_unlock(&m->lock);
	pthread_mutex_unlock(&ps->lock);
	return ret;
}

/*
 * storm: control operations on one proxy from several threads at once.
 * The other kinds hold the proxy's slot and model locks around each call
 * (the model could not say what a call must answer otherwise), so they
 * never run two control calls on one proxy together. A storm does, on a
 * proxy of its own that no slot names, with STORM_BACK vgem backings of
 * their own patterns: STORM_CTL threads run STORM_OPS random ATTACH,
 * REPLACE, REVOKE, QUERY and QUERY of a dup that is closed again, while a
 * thread reads through a dynamic import. Each answer must be one the uapi
 * allows whatever the others did (ATTACH: 0, -EEXIST while backed,
 * -EAGAIN at the stale bound; REPLACE: 0, -EAGAIN; REVOKE: 0; QUERY: 0,
 * BACKED or REVOKED, a generation that never goes back; -ENOMEM where
 * mem_ran_out()); each read -ENODEV or exactly one backing's bytes, and
 * that backing the proxy's at some moment of the read
 * (race_read_in_window()); the generations the calls answered must give
 * them an order the module could have taken, with a REVOKE just before
 * each plain ATTACH that succeeded (race_gens_check()). Then, the import
 * released, a revoke must leave nothing mapped, attached or stale.
 */
#define STORM_CTL	3
#define STORM_OPS	12
#define STORM_BACK	3
#define STORM_PAGES	4
#define STORM_LOG	(STORM_CTL * STORM_OPS + 1)
#define STORM_READS	512

struct storm {
	struct world *w;
	int dev, proxy, handle;
	int back[STORM_BACK];
	uint32_t seed[STORM_BACK];
	struct race_op op[STORM_LOG];	/* op[0]: the first attach */
	int nops, nreads, done;		/* atomics */
	struct race_read rd[STORM_READS];
	pthread_mutex_t elock;
	char err[160];			/* the first wrong answer */
};

struct storm_ctl {
	struct storm *s;
	uint64_t rng;
};

/* Records the storm's first failure (its threads have no cur_why). */
static void __attribute__((format(printf, 2, 3)))
storm_bad(struct storm *s, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&s->elock);
	if (!s->err[0]) {
		va_start(ap, fmt);
		vsnprintf(s->err, sizeof(s->err), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&s->elock);
}

static void storm_log(struct storm *s, int target, int64_t t0, uint64_t gen,
		      bool plain)
{
	int k = __atomic_fetch_add(&s->nops, 1, __ATOMIC_RELAXED);

	if (k < STORM_LOG)
		s->op[k] = (struct race_op){ target, t0, race_now_ns(), gen,
					     plain };
}

/* @ret of @what: 0, one of @allowed (0-ended), or memory that ran out. */
static void storm_answer(struct storm *s, const char *what, int ret,
			 const int *allowed)
{
	int k;

	for (k = 0; ret && allowed[k]; k++)
		if (ret == -allowed[k])
			return;
	if (ret && !mem_ran_out(ret))
		storm_bad(s, "%s: %s", what, ename(-ret));
}

static void storm_query(struct storm *s, int fd, uint64_t *gen)
{
	struct kvdmabuf_query q;
	int ret = kvd_query(s->dev, fd, &q);

	if (ret) {
		storm_answer(s, "query", ret, (const int[]){ 0 });
		return;
	}
	if (q.state != KVDMABUF_STATE_BACKED &&
	    q.state != KVDMABUF_STATE_REVOKED)
		storm_bad(s, "query: state %u, neither BACKED nor REVOKED",
			  q.state);
	else if (q.generation < *gen)
		storm_bad(s, "query: generation %llu after %llu",
			  (unsigned long long)q.generation,
			  (unsigned long long)*gen);
	*gen = q.generation;
}

static void *storm_controller(void *p)
{
	struct storm_ctl *c = p;
	struct storm *s = c->s;
	uint64_t gen = 0, made;
	int k, i, ret, fd;
	int64_t t0;

	for (k = 0; k < STORM_OPS; k++) {
		uint64_t r = rng_next(&c->rng);

		i = (int)(r % STORM_BACK);
		t0 = race_now_ns();
		switch ((r >> 8) % 5) {
		case 0:
			ret = kvd_revoke_full(s->dev, s->proxy,
					      kvd_scaled_ms(2000), &made);
			if (!ret)
				storm_log(s, RACE_REVOKED, t0, made, false);
			storm_answer(s, "revoke", ret, (const int[]){ 0 });
			break;
		case 1:
			ret = kvd_attach_full(s->dev, s->proxy, s->back[i], 0,
					      0, 0, &made);
			if (!ret)
				storm_log(s, i, t0, made, true);
			storm_answer(s, "attach", ret,
				     (const int[]){ EEXIST, EAGAIN, 0 });
			break;
		case 2:
			ret = kvd_attach_full(s->dev, s->proxy, s->back[i], 0,
					      KVDMABUF_ATTACH_REPLACE,
					      kvd_scaled_ms(2000), &made);
			if (!ret)
				storm_log(s, i, t0, made, false);
			storm_answer(s, "replace", ret,
				     (const int[]){ EAGAIN, 0 });
			break;
		case 3:
			storm_query(s, s->proxy, &gen);
			break;
		default:
			/* a second fd of the proxy comes and goes */
			fd = dup(s->proxy);
			if (fd < 0) {
				storm_answer(s, "dup", -errno, (const int[]){ 0 });
				break;
			}
			storm_query(s, fd, &gen);
			close(fd);
			break;
		}
	}
	return NULL;
}

static void *storm_reader(void *p)
{
	struct storm *s = p;
	uint8_t got[FZ_PAGE], want[FZ_PAGE];
	uint64_t rng = (uint64_t)s->seed[0] << 1, off;
	int ret, i, match, k;
	int64_t t0, t1;

	while (!__atomic_load_n(&s->done, __ATOMIC_ACQUIRE)) {
		off = rng_next(&rng) % STORM_PAGES * FZ_PAGE;
		t0 = race_now_ns();
		ret = imp_do_access(s->w->imp, s->handle, 0, off, FZ_PAGE, got);
		t1 = race_now_ns();
		if (ret == -ENODEV)
			continue;
		if (ret) {
			storm_answer(s, "read", ret, (const int[]){ 0 });
			continue;
		}
		match = -1;
		for (i = 0; i < STORM_BACK && match < 0; i++) {
			pat_expect(want, s->seed[i], off, FZ_PAGE);
			if (!memcmp(got, want, FZ_PAGE))
				match = i;
		}
		if (match < 0) {
			storm_bad(s, "read at %llu: bytes of no backing whole",
				  (unsigned long long)off);
			continue;
		}
		k = __atomic_fetch_add(&s->nreads, 1, __ATOMIC_RELAXED);
		if (k < STORM_READS)
			s->rd[k] = (struct race_read){ match, t0, t1 };
	}
	return NULL;
}

/* Runs the threads on @s, its proxy backed by back[0]; judges the reads. */
static void storm_run(struct storm *s, const struct op *op)
{
	struct storm_ctl c[STORM_CTL];
	pthread_t tid[STORM_CTL + 1];
	int i, n = 0, nops, nreads;
	char why[120];

	for (i = 0; i < STORM_CTL; i++) {
		c[i] = (struct storm_ctl){ s, op->x ^ (op->y * (uint64_t)(i + 1)) };
		if (!pthread_create(&tid[n], NULL, storm_controller, &c[i]))
			n++;
	}
	if (!pthread_create(&tid[n], NULL, storm_reader, s))
		n++;
	for (i = 0; i < n; i++) {
		/* the reader is last: it stops once the controllers are done */
		if (i == n - 1)
			__atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
		pthread_join(tid[i], NULL);
	}
	if (n < STORM_CTL + 1)
		storm_bad(s, "%d of %d threads started", n, STORM_CTL + 1);
	nops = s->nops < STORM_LOG ? s->nops : STORM_LOG;
	nreads = s->nreads < STORM_READS ? s->nreads : STORM_READS;
	if (race_gens_check(s->op, nops, why, sizeof(why)))
		storm_bad(s, "%s", why);
	for (i = 0; i < nreads && !s->err[0]; i++)
		if (!race_read_in_window(s->op, nops, &s->rd[i]))
			storm_bad(s, "read: a backing the proxy did not have then");
}

static int do_storm(struct world *w, const struct op *op)
{
	static const uint64_t len = STORM_PAGES * FZ_PAGE;
	struct storm *s;
	struct kvdmabuf_query q;
	int i, ret;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->elock, NULL);
	s->w = w;
	s->dev = cur_devf(w)->fd;
	s->handle = -1;
	for (i = 0; i < STORM_BACK; i++) {
		s->seed[i] = bid_seed(w, new_bid(w));
		s->back[i] = pattern_backing(w, len, s->seed[i]);
	}
	s->proxy = kvd_create(s->dev, len, NULL);
	ret = s->proxy < 0 ? s->proxy : 0;
	for (i = 0; !ret && i < STORM_BACK; i++)
		ret = s->back[i] < 0 ? s->back[i] : 0;
	if (!ret) {
		s->op[0] = (struct race_op){ 0, race_now_ns(), 0, 0, true };
		ret = kvd_attach_full(s->dev, s->proxy, s->back[0], 0, 0, 0,
				      &s->op[0].gen);
		s->op[0].t1 = race_now_ns();
		s->nops = 1;
	}
	if (!ret) {
		s->handle = imp_import(w->imp, s->proxy, 0);
		ret = s->handle < 0 ? s->handle : 0;
	}
	if (ret) {
		if (!mem_ran_out(ret))
			BAD("storm: setting up: %s", ename(-ret));
		goto out;
	}
	storm_run(s, op);
	ret = imp_release(w->imp, s->handle);
	s->handle = -1;
	if (ret)
		storm_bad(s, "release of the import: %s", ename(-ret));
	ret = kvd_revoke(s->dev, s->proxy, kvd_scaled_ms(2000));
	storm_answer(s, "the last revoke", ret, (const int[]){ 0 });
	if (!ret && !kvd_query(s->dev, s->proxy, &q) &&
	    (q.live_mappings || q.backing_attachments || q.stale_backings ||
	     q.dynamic_importers || q.pinned_importers))
		storm_bad(s, "revoked, the import gone: still mapped, attached or stale");
	if (s->err[0])
		BAD("storm (%d operations changed the backing, %d reads): %s",
		    s->nops - 1, s->nreads, s->err);
	ret = s->err[0] ? -EIO : 0;
out:
	if (s->handle >= 0)
		imp_release(w->imp, s->handle);
	if (s->proxy >= 0)
		close(s->proxy);
	for (i = 0; i < STORM_BACK; i++)
		if (s->back[i] >= 0)
			close(s->back[i]);
	pthread_mutex_destroy(&s->elock);
	free(s);
	return ret;
}

static int do_version(struct world *w, const struct op *op)
{
	struct kvdmabuf_version u[4];	/* room for pick_size()'s 64-byte tail */
	struct args_err e = { 0 };
	int ret;

	memset(u, 0, sizeof(u));
	u->flags = pick_junk(op->flags, 0) ? pick_flags(op->y) : 0;
	u->reserved = pick_junk(op->flags, 4) ? op->x | 1 : 0;
	u->pad = pick_junk(op->flags, 8);
	e.inval = u->flags || u->reserved || u->pad;
	u->size = pick_size(op->a, sizeof(*u), u, &e.size);
	ret = ioctl(cur_devf(w)->fd, KVDMABUF_IOCTL_VERSION, u) ? -errno : 0;
	if (args_expected(&e))
		want_err("version", ret, args_expected(&e));
	else if (ret)
		BAD("version: %s", ename(-ret));
	else if (u->version >> 16 != KVDMABUF_API_VERSION_MAJOR)
		BAD("version: %#x", u->version);
	return ret;
}

static int do_readev(struct world *w, const struct op *op)
{
	struct kvdmabuf_event ev[4];
	int fd = cur_devf(w)->fd;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	size_t want_len = op->x % 3 ? sizeof(ev) : op->x % sizeof(ev[0]);
	ssize_t n;
	int ret, k;

	poll(&p, 1, 0);
	fcntl(fd, F_SETFL, O_NONBLOCK);
	n = read(fd, ev, want_len);
	ret = n < 0 ? -errno : 0;
	if (want_len < sizeof(ev[0])) {
		want_err("read of a short buffer", ret, EINVAL);
	} else if (ret) {
		want_err("read of an empty queue", ret, EAGAIN);
	} else if (n % sizeof(ev[0])) {
		BAD("read returned %zd bytes, not whole records", n);
	} else {
		for (k = 0; k < n / (ssize_t)sizeof(ev[0]); k++)
			if (ev[k].size != sizeof(ev[0]) ||
			    ev[k].type != KVDMABUF_EVENT_STATE ||
			    ev[k].state < KVDMABUF_STATE_BACKED ||
			    ev[k].state > KVDMABUF_STATE_RELEASED || !ev[k].id)
				BAD("event %d: size %u type %u state %u id %llu",
				    k, ev[k].size, ev[k].type, ev[k].state,
				    (unsigned long long)ev[k].id);
	}
	return ret;
}

/* Runs a forked child's few ops on its own device file and importer fd. */
static void fork_child(struct world *w, uint64_t seed);

static int do_fork(struct world *w, struct shared *sh, const struct op *op,
		   uint64_t *rng)
{
	uint64_t seed = rng_next(rng);
	pid_t pid = fork();
	int st;

	if (pid == 0)
		fork_child(w, seed);	/* never returns */
	if (pid < 0)
		return -errno;
	if (op->x % 2) {
		usleep(op->y % 3000);
		kill(pid, SIGKILL);
	}
	if (waitpid(pid, &st, 0) != pid) {
		BAD("fork: waitpid: %s", strerror(errno));
		return -ECHILD;
	}
	if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && op->x % 2) {
		__atomic_fetch_add(&sh->forks_killed, 1, __ATOMIC_RELAXED);
		return 0;
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		__atomic_fetch_add(&sh->forks_exited, 1, __ATOMIC_RELAXED);
		return 0;
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 1 && sh->fail.failed)
		return -EIO;	/* its own check failed: recorded already */
	BAD("forked child %s %d", WIFEXITED(st) ? "exited with" : "died of signal",
	    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	return -EIO;
}

static int do_simple(struct world *w, const struct op *op)
{
	union {
		struct kvdmabuf_version v;
		char raw[4096];
	} u;
	int fd, old, ret = 0, dev = cur_devf(w)->fd;

	memset(&u, 0, sizeof(u));
	switch (op->kind) {
	case OP_BADCMD:
		/* Unknown numbers of the module's magic, any direction/size. */
		ret = ioctl(dev, _IOC(op->x % 4, KVDMABUF_IOCTL_MAGIC,
				      7 + op->y % 249, op->flags % 512),
			    &u) ? -errno : 0;
		want_err("unknown command", ret, ENOTTY);
		break;
	case OP_BADPTR: {
		static const unsigned long cmds[] = {
			KVDMABUF_IOCTL_VERSION, KVDMABUF_IOCTL_CREATE,
			KVDMABUF_IOCTL_ATTACH, KVDMABUF_IOCTL_REVOKE,
			KVDMABUF_IOCTL_QUERY, KVDMABUF_IOCTL_LIST,
			KVDMABUF_IOCTL_RANGES,
		};

		ret = ioctl(dev, cmds[op->x % (sizeof(cmds) / sizeof(*cmds))],
			    op->y % 2 ? NULL :
			    (void *)(uintptr_t)(0xffff800000000000ull)) ? -errno : 0;
		want_err("bad argument pointer", ret, EFAULT);
		break;
	}
	case OP_VGEM: {
		struct bslot *bs = &w->b[op->b % BSLOTS];
		uint64_t size = 4096ull << (op->x % 5), bid = new_bid(w);
		uint32_t seed = bid_seed(w, bid);
		ino_t ino;

		fd = pattern_backing(w, size, seed);
		if (fd < 0)
			return fd;
		ino = fd_ino(fd);
		pthread_mutex_lock(&bs->lock);
		old = bs->fd;
		/* The inode first: a fork may copy this memory between the
		 * two stores (see fork_child()). */
		bs->ino = ino;
		__atomic_store_n(&bs->fd, fd, __ATOMIC_RELEASE);
		bs->size = size;
		bs->bid = bid;
		bs->seed = seed;
		pthread_mutex_unlock(&bs->lock);
		if (old >= 0)
			close(old);
		break;
	}
	case OP_CLOSE:
		if (op->a % 2) {
			struct bslot *bs = &w->b[op->b % BSLOTS];

			pthread_mutex_lock(&bs->lock);
			old = bs->fd;
			bs->fd = -1;
			pthread_mutex_unlock(&bs->lock);
			if (old < 0)
				return 1;
			close(old);
		} else {
			struct pslot *ps = &w->p[op->b % PSLOTS];
			struct pmodel *m;

			pthread_mutex_lock(&ps->lock);
			old = ps->fd;
			m = ps->m;
			ps->fd = -1;
			ps->m = NULL;
			pthread_mutex_unlock(&ps->lock);
			if (old < 0)
				return 1;
			close(old);
			model_put(w, m);
		}
		break;
	case OP_DUP: {
		int s1 = op->b % PSLOTS, s2 = op->c % PSLOTS;
		struct pslot *lo = &w->p[s1 < s2 ? s1 : s2];
		struct pslot *hi = &w->p[s1 < s2 ? s2 : s1];
		struct pmodel *m = NULL;

		if (s1 == s2)
			return 1;
		pthread_mutex_lock(&lo->lock);
		pthread_mutex_lock(&hi->lock);
		if (w->p[s1].fd < 0) {
			ret = 1;
		} else {
			fd = fcntl(w->p[s1].fd, F_DUPFD_CLOEXEC, 0);
			if (fd < 0) {
				ret = -errno;
				BAD("dup of a proxy: %s", ename(errno));
			} else {
				old = w->p[s2].fd;
				m = w->p[s2].m;
				w->p[s2].fd = fd;
				w->p[s2].m = model_get(w, w->p[s1].m);
				if (old >= 0)
					close(old);
			}
		}
		pthread_mutex_unlock(&hi->lock);
		pthread_mutex_unlock(&lo->lock);
		model_put(w, m);
		break;
	}
	case OP_RELEASE: {
		int s = op->c % ISLOTS;

		pthread_mutex_lock(&w->i[s].lock);
		ret = w->i[s].handle < 0 ? 1 : 0;
		islot_release(w, s);
		pthread_mutex_unlock(&w->i[s].lock);
		break;
	}
	case OP_REOPEN: {
		int slot = __atomic_load_n(&w->nr_devs, __ATOMIC_RELAXED);

		/* Device files stay open until the end: a proxy's creator
		 * stays a distinct file, never a reused number. */
		if (slot >= MAX_DEVS || w->child)
			return 1;
		fd = open(KVDMABUF_DEVICE_PATH, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		/* Only thread 0 reopens: no race on the slot. */
		w->devs[slot].fd = fd;
		__atomic_store_n(&w->nr_devs, slot + 1, __ATOMIC_RELEASE);
		__atomic_store_n(&w->cur_dev, slot, __ATOMIC_RELEASE);
		break;
	}
	}
	return ret;
}

/* Runs one operation; returns 0 or -errno of its main call (1: not run,
 * nothing to act on). A check failure is written to cur_why. */
static int run_op(struct world *w, struct shared *sh, const struct op *op,
		  uint64_t *rng)
{
	switch (op->kind) {
	case OP_VERSION:
		return do_version(w, op);
	case OP_CREATE:
		return do_create(w, op);
	case OP_ATTACH:
	case OP_REPLACE:
		return do_attach(w, op);
	case OP_RANGES:
		return do_ranges(w, op);
	case OP_REVOKE:
		return do_revoke(w, op);
	case OP_QUERY:
		return do_query(w, op);
	case OP_IMPORT:
	case OP_IMPORT_LAZY:
	case OP_IMPORT_PIN:
	case OP_UIMPORT:
		return do_import(w, op);
	case OP_ACCESS:
	case OP_UACCESS:
		return do_access(w, sh, op);
	case OP_EXP_INVAL:
		return do_exp_inval(w, sh, op);
	case OP_READEV:
		return do_readev(w, op);
	case OP_DRAIN:
		return do_drain(w, sh, op);
	case OP_FORK:
		return do_fork(w, sh, op, rng);
	case OP_STORM:
		return do_storm(w, op);
	default:
		return do_simple(w, op);
	}
}

/* Whether @ret is the answer that counts as coverage for the kind. */
static int op_ok(int kind, int ret)
{
	switch (kind) {
	case OP_BADCMD:
		return ret == -ENOTTY;
	case OP_BADPTR:
		return ret == -EFAULT;
	default:
		return ret == 0;
	}
}

static void count_op(struct shared *sh, const struct op *op, int ret)
{
	if (ret == 1) {
		__atomic_fetch_add(&sh->idle[op->kind], 1, __ATOMIC_RELAXED);
		return;
	}
	__atomic_fetch_add(&sh->total_ops, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(op_ok(op->kind, ret) ? &sh->ok[op->kind] :
			   &sh->err[op->kind], 1, __ATOMIC_RELAXED);
	if (ret < 0 && ret > -NERRNO)
		__atomic_fetch_add(&sh->errnos[op->kind][-ret], 1,
				   __ATOMIC_RELAXED);
}

static void op_describe(const struct op *op, char *buf, size_t len)
{
	snprintf(buf, len, "%s a=%u b=%u c=%u flags=%#x x=%#llx y=%#llx",
		 op_names[op->kind], op->a, op->b, op->c, op->flags,
		 (unsigned long long)op->x, (unsigned long long)op->y);
}

/* Records the first failure of the whole run. */
static void fail_record(struct shared *sh, int worker, int thread,
			uint64_t index, const struct op *op, int ret,
			const char *why)
{
	struct fail_info *f = &sh->fail;

	if (__atomic_exchange_n(&f->failed, 1, __ATOMIC_ACQ_REL))
		return;
	f->worker = worker;
	f->thread = thread;
	f->index = index;
	f->ret = ret;
	op_describe(op, f->what, sizeof(f->what));
	snprintf(f->why, sizeof(f->why), "%s", why);
}

/* Operation weights: module calls dominate, life-cycle events are rarer. */
static struct op gen_op(uint64_t *rng, int thread0)
{
	static const uint8_t table[] = {
		OP_VERSION, OP_CREATE, OP_CREATE, OP_CREATE, OP_ATTACH,
		OP_ATTACH, OP_ATTACH, OP_REPLACE, OP_REPLACE, OP_REPLACE,
		OP_RANGES, OP_RANGES, OP_RANGES, OP_REVOKE, OP_REVOKE,
		OP_REVOKE, OP_QUERY, OP_QUERY, OP_BADCMD, OP_BADPTR, OP_VGEM,
		OP_VGEM, OP_CLOSE, OP_CLOSE, OP_DUP,
		OP_IMPORT, OP_IMPORT, OP_IMPORT_LAZY, OP_IMPORT_LAZY,
		OP_IMPORT_PIN, OP_IMPORT_PIN, OP_ACCESS, OP_ACCESS, OP_ACCESS,
		OP_ACCESS, OP_ACCESS, OP_RELEASE, OP_RELEASE, OP_READEV,
		OP_DRAIN, OP_REOPEN, OP_FORK, OP_FORK, OP_UIMPORT, OP_UIMPORT,
		OP_UIMPORT, OP_UACCESS, OP_UACCESS, OP_UACCESS, OP_EXP_INVAL,
		OP_STORM,
	};
	uint64_t r = rng_next(rng);
	struct op op = {
		.kind = table[r % sizeof(table)],
		.a = r >> 8, .b = r >> 16, .c = r >> 24,
		.flags = (uint32_t)(r >> 32),
		.x = rng_next(rng), .y = rng_next(rng),
	};

	/* Reopen, fork: thread 0 only, and reopen rarely. */
	if ((op.kind == OP_FORK || op.kind == OP_REOPEN) && !thread0)
		op.kind = OP_QUERY;
	if (op.kind == OP_REOPEN && (op.x % 8))
		op.kind = OP_ACCESS;
	return op;
}

/* Releases every import and closes every fd; checks the releases. */
static void world_fini(struct world *w)
{
	int i;

	for (i = 0; i < ISLOTS; i++)
		islot_release(w, i);
	for (i = 0; i < PSLOTS; i++) {
		if (w->p[i].fd >= 0)
			close(w->p[i].fd);
		model_put(w, w->p[i].m);
		w->p[i].fd = -1;
		w->p[i].m = NULL;
	}
	for (i = 0; i < BSLOTS; i++)
		if (w->b[i].fd >= 0)
			close(w->b[i].fd);
	for (i = 0; i < w->nr_devs; i++)
		if (w->devs[i].fd >= 0)
			close(w->devs[i].fd);
	if (w->imp >= 0)
		close(w->imp);
	if (w->umem >= 0)
		close(w->umem);
	if (w->exp >= 0)
		close(w->exp);
	if (w->drm >= 0)
		close(w->drm);
}

static void fork_child(struct world *w, uint64_t seed)
{
	struct op_log *log = &fork_log->logs[fork_worker][THREADS];
	char why[256] = "";
	struct op cop;
	int i, fd, ret;

	/* Other threads' locks may have been held at the fork: only this
	 * thread runs now. The parent's imports and device files are not
	 * ours; its proxies are inherited: queried, imported dynamically,
	 * never controlled (EPERM). The snapshot may name fds that a racing
	 * thread had closed or reused: keep only those that are proxies. */
	cur_why = why;
	world_locks_init(w);
	w->child = 1;
	/* Imports through the parent's umem file would land in its table;
	 * the exporter's buffers are the parent's models'. */
	w->umem = w->exp = -1;
	w->salt ^= 0x5a5a0000u | (uint32_t)getpid();
	for (i = 0; i < ISLOTS; i++) {
		w->i[i].handle = -1;
		w->i[i].m = NULL;
	}
	for (i = 0; i < PSLOTS; i++) {
		struct kvdmabuf_query q = { .size = sizeof(q) };

		w->p[i].m = NULL;	/* the parent's models are not ours */
		q.proxy_fd = (uint32_t)w->p[i].fd;
		if (w->p[i].fd >= 0 &&
		    ioctl(cur_devf(w)->fd, KVDMABUF_IOCTL_QUERY, &q))
			w->p[i].fd = -1;
	}
	/* fork() copies the fd table before the memory: a parent thread
	 * may have closed a backing and reused its number in between, or
	 * made one after the table was copied, so a slot is kept only if
	 * its fd still names the buffer it records (an inode of 0 is none:
	 * fd_ino() of a number that is not open). */
	for (i = 0; i < BSLOTS; i++)
		if (w->b[i].fd >= 0 &&
		    (!w->b[i].ino || fd_ino(w->b[i].fd) != w->b[i].ino))
			w->b[i].fd = -1;
	/* Its own files, above any number a slot may name. */
	fd = open(KVDMABUF_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	w->imp = open(KVD_IMPORTER_PATH, O_RDWR | O_CLOEXEC);
	if (fd < 0 || w->imp < 0)
		_exit(2);
	i = fcntl(fd, F_DUPFD_CLOEXEC, 700);
	close(fd);
	fd = i;
	i = fcntl(w->imp, F_DUPFD_CLOEXEC, 700);
	close(w->imp);
	w->imp = i;
	if (fd < 0 || w->imp < 0)
		_exit(2);
	memset(w->devs, 0, sizeof(w->devs));
	w->devs[0].fd = fd;
	w->nr_devs = 1;
	w->cur_dev = 0;
	for (i = 0; i < CHILD_OPS; i++) {
		uint64_t r = rng_next(&seed);

		cop = (struct op){ .kind = r % OP_DRAIN,
			.a = r >> 8, .b = r >> 16, .c = r >> 24,
			.flags = (uint32_t)(r >> 32),
			.x = rng_next(&seed), .y = rng_next(&seed) };
		if (cop.kind == OP_REOPEN)
			cop.kind = OP_QUERY;
		log->ops[log->n % LOG_LEN] = cop;
		log->n++;
		ret = run_op(w, fork_log, &cop, &seed);
		if (why[0]) {
			fail_record(fork_log, fork_worker, THREADS, log->n - 1,
				    &cop, ret, why);
			_exit(1);
		}
	}
	/* Release what it took, checked; inherited fds are the parent's. */
	for (i = 0; i < ISLOTS; i++)
		islot_release(w, i);
	if (why[0]) {
		fail_record(fork_log, fork_worker, THREADS, log->n, &cop, 0, why);
		_exit(1);
	}
	_exit(0);
}

struct thread_arg {
	struct shared *sh;
	struct world *w;
	int worker, thread;
	uint64_t seed;
	double deadline;
};

static void *fuzz_thread(void *p)
{
	struct thread_arg *ta = p;
	struct op_log *log = &ta->sh->logs[ta->worker][ta->thread];
	uint64_t rng = ta->seed;
	char why[256];

	cur_why = why;
	while (__th_now() < ta->deadline && !ta->sh->fail.failed) {
		struct op op = gen_op(&rng, ta->thread == 0);
		int ret;

		why[0] = 0;
		log->ops[log->n % LOG_LEN] = op;
		__atomic_store_n(&log->n, log->n + 1, __ATOMIC_RELEASE);
		ret = run_op(ta->w, ta->sh, &op, &rng);
		count_op(ta->sh, &op, ret);
		if (why[0])
			fail_record(ta->sh, ta->worker, ta->thread, log->n - 1,
				    &op, ret, why);
	}
	return NULL;
}

static int fuzz_worker(struct shared *sh, int worker, uint64_t seed,
		       double deadline)
{
	struct thread_arg ta[THREADS];
	pthread_t tid[THREADS];
	static struct world w;
	char why[256] = "";
	int i;

	world_init(&w, (uint32_t)(worker + 1) * 0x01000193u);
	if (w.devs[0].fd < 0 || w.imp < 0 || w.drm < 0) {
		printf("# worker %d: cannot open the device, importer or vgem\n",
		       worker);
		return 2;
	}
	fork_log = sh;
	fork_worker = worker;
	for (i = 0; i < THREADS; i++) {
		ta[i] = (struct thread_arg){ sh, &w, worker, i,
			seed ^ (0x1000193ull * (uint64_t)(worker * THREADS + i + 1)),
			deadline };
		pthread_create(&tid[i], NULL, fuzz_thread, &ta[i]);
	}
	for (i = 0; i < THREADS; i++)
		pthread_join(tid[i], NULL);
	cur_why = why;
	world_fini(&w);
	if (why[0]) {
		struct op none = { .kind = OP_RELEASE };

		fail_record(sh, worker, 0, sh->logs[worker][0].n, &none, 0, why);
		return 1;
	}
	return 0;
}

/* ---- kernel log ---- */

static int kmsg_open(void)
{
	int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);

	if (fd >= 0)
		lseek(fd, 0, SEEK_END);
	return fd;
}

/*
 * Prints and counts new kernel log records that report a problem: the
 * kernel's own reports and the test importers' error messages (a broken
 * contract seen from the importer's side, such as a move notification on
 * an import that holds a pin).
 */
static int kmsg_bad(int fd)
{
	static const char *const bad[] = {
		"WARNING:", "BUG:", "Oops", "general protection", "lockdep",
		"possible circular", "possible recursive",
		"inconsistent lock state", "KASAN", "UBSAN",
		"list_add corruption", "list_del corruption", "refcount_t:",
		"sleeping function", "Call Trace", "DMA-API: ",
		"move notification on a pinned import",
	};
	char rec[8192];
	int n = 0;
	ssize_t len;
	size_t i;

	if (fd < 0)
		return 0;
	while ((len = read(fd, rec, sizeof(rec) - 1)) != 0) {
		if (len < 0) {
			if (errno == EPIPE)
				continue;	/* overwritten records */
			break;
		}
		rec[len] = 0;
		for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			if (strstr(rec, bad[i])) {
				if (n < 20)
					printf("# kernel: %s", strchr(rec, ';') ?
					       strchr(rec, ';') + 1 : rec);
				n++;
				break;
			}
		}
	}
	return n;
}

/* ---- replay: the shortest failing tail ---- */

/* Replays @n ops alone on fresh objects; 1 when a check fails again. */
static int replay(struct shared *sh, const struct op *ops, int n, int kmsg)
{
	pid_t pid = fork();
	int st, i;

	if (pid == 0) {
		static struct world w;
		char why[256] = "";
		uint64_t rng = 1;

		cur_why = why;
		world_init(&w, 0x77u);
		for (i = 0; i < n; i++) {
			struct op op = ops[i];

			if (op.kind == OP_FORK)
				continue;
			run_op(&w, sh, &op, &rng);
			if (why[0])
				_exit(1);
		}
		world_fini(&w);
		_exit(why[0] ? 1 : 0);
	}
	if (pid < 0 || waitpid(pid, &st, 0) < 0)
		return 0;
	return (WIFEXITED(st) && WEXITSTATUS(st) == 1) || kmsg_bad(kmsg) > 0;
}

static void report_tail(struct shared *sh, int kmsg)
{
	const struct fail_info *f = &sh->fail;
	const struct op_log *log = &sh->logs[f->worker][f->thread];
	static struct op tail[MAX_REPLAY];
	uint64_t end = f->index + 1, avail;
	char buf[256];
	int k, i;

	if (end > log->n)
		end = log->n;
	avail = end < LOG_LEN ? end : LOG_LEN;
	/* The replay's own failures are its own: keep the run's. */
	sh->fail.failed = 1;
	for (k = 1; k <= (int)avail; k++) {
		for (i = 0; i < k; i++)
			tail[i] = log->ops[(end - k + i) % LOG_LEN];
		if (replay(sh, tail, k, kmsg)) {
			printf("# shortest reproducing tail (%d ops, replayed alone):\n", k);
			for (i = 0; i < k; i++) {
				op_describe(&tail[i], buf, sizeof(buf));
				printf("#   %s\n", buf);
			}
			return;
		}
	}
	printf("# no tail reproduces alone (a race); last ops of worker %d %s %d:\n",
	       f->worker, f->thread == THREADS ? "forked child" : "thread",
	       f->thread);
	for (i = (int)(avail > 16 ? avail - 16 : 0); i < (int)avail; i++) {
		op_describe(&log->ops[(end - avail + i) % LOG_LEN], buf, sizeof(buf));
		printf("#   %s\n", buf);
	}
}

/* ---- end state ---- */

/* Reads debugfs stats; returns the sum of proxies, backings, attachments. */
static long module_holds(char *text, size_t len)
{
	FILE *f = fopen("/sys/kernel/debug/kvdmabuf/stats", "r");
	long sum = 0, v;
	char key[64];
	size_t used = 0;

	if (!f)
		return -1;
	text[0] = 0;
	while (fscanf(f, "%63s %ld", key, &v) == 2) {
		sum += v;
		used += snprintf(text + used, used < len ? len - used : 0,
				 "%s=%ld ", key, v);
	}
	fclose(f);
	return sum;
}

/*
 * Unload and load the module again. Its stats reach zero in the proxies'
 * release callbacks, before the dma-buf core drops the module reference
 * (dma_buf_release(), from a delayed fput): the unload may meet that
 * reference for a moment (EAGAIN), so it is tried for up to 5 s; one kept
 * longer is a leak.
 */
static int reload_module(void)
{
	const char *build = getenv("KVDMABUF_BUILD");
	char ko[4096];
	int i;

	for (i = 0; syscall(SYS_delete_module, "kvdmabuf", O_NONBLOCK); i++) {
		if (errno != EAGAIN || i == kvd_scaled_ms(5000) / 10)
			return -errno;
		usleep(10000);
	}
	if (i)
		printf("# unload waited %d ms for the last module reference\n",
		       i * 10);
	if (!build)
		return -ENOENT;
	snprintf(ko, sizeof(ko), "%s/module/kvdmabuf.ko", build);
	return kvd_ko_load(ko);
}

/*
 * The seeds of a run: a fixed list, the same in every run of every lane
 * (KVDMABUF_FUZZ_SEEDS overrides it: comma-separated), then one from the
 * clock, printed; each for an equal share of --seconds. --seed S runs S
 * alone for all of it: the replay of a failure (see tests/README.md).
 */
static const uint64_t fixed_seeds[] = { 12345, 1796127092 };
#define MAX_SEEDS	8

static int fuzz_seconds = 10;
static uint64_t run_seeds[MAX_SEEDS];
static int nr_seeds;
/* The test modules found: their kinds are judged only then. */
static bool have_umem, have_exp;

static bool kind_runs(int kind)
{
	if (kind == OP_UIMPORT || kind == OP_UACCESS)
		return have_umem;
	return kind != OP_EXP_INVAL || have_exp;
}

/*
 * Prints the per-kind table of one seed's run of @secs seconds; returns
 * how many kinds fell below a floor: their absolute one (successes) or
 * their ratio one (successes among attempts).
 */
static int coverage_table(const struct shared *sh, double secs)
{
	int i, e, low = 0;

	/* Successes per second: a wall-clock rate, slower on the debug lane. */
	double scale = kvd_scaled_ms(1000) / 1000.0;

	for (i = 0; i < OP_NKINDS; i++) {
		uint64_t floor = (uint64_t)(floor_per_s[i] * secs / scale);
		uint64_t tries = sh->ok[i] + sh->err[i] + sh->idle[i];
		double ratio = tries ? (double)sh->ok[i] / (double)tries : 0;
		int below_abs, below_ratio;
		char line[512];
		size_t used = 0;

		if (floor_per_s[i] > 0 && floor < 1)
			floor = 1;
		if (!kind_runs(i))
			floor = 0;
		below_abs = sh->ok[i] < floor;
		below_ratio = kind_runs(i) && ratio_floor[i] > 0 &&
			      ratio < ratio_floor[i];
		line[0] = 0;
		for (e = 1; e < NERRNO; e++)
			if (sh->errnos[i][e] && used < sizeof(line))
				used += snprintf(line + used, sizeof(line) - used,
						 " %s:%llu", ename(e),
						 (unsigned long long)sh->errnos[i][e]);
		printf("#   %-12s %7llu ok (floor %5llu) %5.1f%% of %7llu (floor %4.1f%%) %6llu idle %7llu other%s%s%s\n",
		       op_names[i], (unsigned long long)sh->ok[i],
		       (unsigned long long)floor, 100 * ratio,
		       (unsigned long long)tries, 100 * ratio_floor[i],
		       (unsigned long long)sh->idle[i],
		       (unsigned long long)sh->err[i], line,
		       below_abs ? "   <-- BELOW FLOOR" : "",
		       below_ratio ? "   <-- BELOW RATIO FLOOR" : "");
		low += below_abs || below_ratio;
	}
	return low;
}

/* One seed's run of @secs seconds, judged on its own; false if it failed. */
static bool fuzz_one(struct __test_metadata *_metadata, struct shared *sh,
		     int kmsg, uint64_t seed, double secs)
{
	pid_t pids[WORKERS];
	double deadline, t0 = __th_now();
	char stats[256];
	int i, st, dirty, low, abnormal = 0, reload = 0;
	long held = -1;

	memset(sh, 0, sizeof(*sh));
	TH_LOG("seed %llu, %.1f s, %d workers x %d threads (replay: --seed %llu --seconds %.0f)",
	       (unsigned long long)seed, secs, WORKERS, THREADS,
	       (unsigned long long)seed, secs < 1 ? 1 : secs);

	deadline = t0 + secs;
	for (i = 0; i < WORKERS; i++) {
		pids[i] = fork();
		ASSERT_GE(pids[i], 0);
		if (!pids[i])
			_exit(fuzz_worker(sh, i, seed + (uint64_t)i, deadline));
	}
	for (i = 0; i < WORKERS; i++) {
		if (waitpid(pids[i], &st, 0) != pids[i]) {
			TH_LOG("worker %d: waitpid: %s", i, strerror(errno));
			abnormal++;
		} else if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			TH_LOG("worker %d %s %d", i,
			       WIFEXITED(st) ? "exited with" : "died of signal",
			       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			abnormal++;
		}
	}
	TH_LOG("%llu operations, %llu importer reads compared with their backing's pattern (%llu of a layout of ranges), %llu kvd_exporter backings, forked children: %llu exited, %llu killed",
	       (unsigned long long)sh->total_ops,
	       (unsigned long long)sh->data_checks,
	       (unsigned long long)sh->range_checks,
	       (unsigned long long)sh->exp_backed,
	       (unsigned long long)sh->forks_exited,
	       (unsigned long long)sh->forks_killed);
	low = coverage_table(sh, secs);
	if (low)
		TH_LOG("seed %llu: %d operation kind(s) below a floor of successes",
		       (unsigned long long)seed, low);

	if (sh->fail.failed) {
		TH_LOG("seed %llu: worker %d %s %d op #%llu: %s returned %d (%s)",
		       (unsigned long long)seed, sh->fail.worker,
		       sh->fail.thread == THREADS ? "forked child" : "thread",
		       sh->fail.thread, (unsigned long long)sh->fail.index,
		       sh->fail.what, sh->fail.ret, ename(-sh->fail.ret));
		TH_LOG("check: %s", sh->fail.why);
		report_tail(sh, kmsg);
	}
	EXPECT_FALSE(sh->fail.failed);
	EXPECT_EQ(0, abnormal);
	EXPECT_EQ(0, low);

	/* Every process is gone: the module must hold nothing. Releases
	 * of fds closed at exit may run a little later (delayed fput). */
	for (i = 0; i < 500; i++) {
		held = module_holds(stats, sizeof(stats));
		if (held <= 0)
			break;
		usleep(10000);
	}
	if (held < 0)
		TH_LOG("no /sys/kernel/debug/kvdmabuf/stats: the end state cannot be checked");
	else
		TH_LOG("module state after exit: %s", stats);
	EXPECT_EQ(0, held);

	dirty = kmsg_bad(kmsg);
	if (dirty)
		TH_LOG("seed %llu: %d kernel log reports", (unsigned long long)seed,
		       dirty);
	EXPECT_EQ(0, dirty);

	/* ... and unload (then load again for the next seed and the tests
	 * that follow). */
	if (getenv("KVDMABUF_BUILD"))
		reload = reload_module();
	else
		TH_LOG("KVDMABUF_BUILD not set: unload not checked");
	EXPECT_EQ(0, reload);
	st = sh->fail.failed || abnormal || low || held || dirty || reload;
	TH_LOG("seed %llu: %s in %.1f s", (unsigned long long)seed,
	       st ? "FAILED" : "passed", __th_now() - t0);
	return !st;
}

TEST_TIMEOUT(fuzz, 3600)
{
	struct shared *sh;
	int i, kmsg;

	if (access(KVDMABUF_DEVICE_PATH, R_OK | W_OK))
		SKIP(return, "no %s (load module/kvdmabuf.ko)", KVDMABUF_DEVICE_PATH);
	if (access(KVD_IMPORTER_PATH, R_OK | W_OK))
		SKIP(return, "no %s (load tests/kmod/kvd_importer.ko)",
		     KVD_IMPORTER_PATH);
	i = vgem_open();
	if (i < 0)
		SKIP(return, "no vgem device (modprobe vgem)");
	close(i);
	/*
	 * The other importer (ib_core's umem, two devices) and the exporter
	 * that invalidates: loaded from $KVDMABUF_BUILD if need be, and
	 * required there (the VM lanes); elsewhere fuzzed where present.
	 */
	i = kvd_test_module_load("kvd_umem", "ib_uverbs", KVD_UMEM_PATH);
	have_umem = !i;
	if (i)
		TH_LOG("%s: %s: imports through ib_core's umem not fuzzed",
		       KVD_UMEM_PATH, strerror(-i));
	i = kvd_test_module_load("kvd_exporter", NULL, KVD_EXPORTER_PATH);
	have_exp = !i;
	if (i)
		TH_LOG("%s: %s: exporter invalidations not fuzzed",
		       KVD_EXPORTER_PATH, strerror(-i));
	if (getenv("KVDMABUF_BUILD")) {
		ASSERT_TRUE(have_umem);
		ASSERT_TRUE(have_exp);
	}
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, sh);
	kmsg = kmsg_open();
	/* Up to the first seed that fails: its replay line is printed. */
	for (i = 0; i < nr_seeds; i++)
		if (!fuzz_one(_metadata, sh, kmsg, run_seeds[i],
			      (double)fuzz_seconds / nr_seeds))
			break;
	if (kmsg >= 0)
		close(kmsg);
	munmap(sh, sizeof(*sh));
}

/* The run's seeds: --seed / KVDMABUF_FUZZ_SEED alone, else the fixed
 * list (or KVDMABUF_FUZZ_SEEDS) and one from the clock. */
static void pick_seeds(const char *one)
{
	const char *list = getenv("KVDMABUF_FUZZ_SEEDS");
	struct timespec ts;
	char *end;
	size_t i;

	if (one) {
		run_seeds[nr_seeds++] = strtoull(one, NULL, 0);
		return;
	}
	if (list) {
		while (*list && nr_seeds < MAX_SEEDS - 1) {
			run_seeds[nr_seeds++] = strtoull(list, &end, 0);
			if (end == list)
				break;
			list = *end == ',' ? end + 1 : end;
		}
	} else {
		for (i = 0; i < sizeof(fixed_seeds) / sizeof(fixed_seeds[0]); i++)
			run_seeds[nr_seeds++] = fixed_seeds[i];
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	run_seeds[nr_seeds++] = (uint64_t)ts.tv_sec * 1000003u +
				(uint64_t)ts.tv_nsec / 1000;
}

int main(int argc, char **argv)
{
	const char *s = getenv("KVDMABUF_FUZZ_SECONDS");
	const char *seed = getenv("KVDMABUF_FUZZ_SEED");
	int i;

	if (s)
		fuzz_seconds = atoi(s);
	for (i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--seconds"))
			fuzz_seconds = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--seed"))
			seed = argv[i + 1];
		else
			break;
	}
	pick_seeds(seed);
	if (fuzz_seconds < nr_seeds)
		fuzz_seconds = nr_seeds;
	printf("# proxy_fuzz: %d s in all, seeds", fuzz_seconds);
	for (i = 0; i < nr_seeds; i++)
		printf(" %llu", (unsigned long long)run_seeds[i]);
	printf("\n");
	_fuzz_object.timeout = fuzz_seconds + 600 * nr_seeds;
	return test_harness_run(1, argv);
}
