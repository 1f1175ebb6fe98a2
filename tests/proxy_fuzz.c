// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_fuzz: a bounded-time fuzzer of /dev/kvdmabuf.
 *
 * Several forked worker processes, each with several threads, run random
 * sequences of every ioctl of the module with valid and invalid arguments
 * (fds of the wrong type, closed fds, proxies inherited from other
 * processes, absurd sizes, every flag bit, short and long structs, bad
 * pointers), interleaved with close, dup, reopening the device, forked
 * children that exit or are killed with SIGKILL mid-call, and with the test
 * importer importing (dynamic and pinned), accessing and releasing proxies.
 *
 * It checks that every call returns 0 or an errno the uapi documents for
 * it, that the kernel log stays clean, and that once every process is gone
 * the module holds nothing (debugfs stats all zero) and unloads.
 * On a failure it prints the seed and the shortest tail of the failing
 * thread's sequence that reproduces it when replayed alone.
 *
 *   proxy_fuzz [--seconds N] [--seed S]   (or KVDMABUF_FUZZ_SECONDS/SEED)
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "../uapi/kvdmabuf.h"
#include "harness.h"
#include "kmod/kvd_importer.h"
#include "vgem.h"

#define WORKERS		3
#define THREADS		2
#define SLOTS		8
#define LOG_LEN		256
/* run_op()'s answer when the device fd was not open during the call. */
#define DEV_CLOSED	1
#define MAX_REPLAY	LOG_LEN

enum op_kind {
	OP_VERSION, OP_CREATE, OP_ATTACH, OP_REVOKE, OP_QUERY, OP_BADCMD,
	OP_BADPTR, OP_VGEM, OP_CLOSE, OP_DUP, OP_IMPORT, OP_ACCESS,
	OP_RELEASE, OP_READEV, OP_REOPEN, OP_FORK, OP_NKINDS
};

static const char *const op_names[OP_NKINDS] = {
	"version", "create", "attach", "revoke", "query", "bad-cmd",
	"bad-ptr", "vgem", "close", "dup", "import", "access", "release",
	"read-events", "reopen", "fork",
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
};

struct shared {
	struct fail_info fail;
	struct op_log logs[WORKERS][THREADS + 1];	/* + forked children */
	uint64_t total_ops;
	/* Per kind: calls that succeeded and that failed, to show coverage. */
	uint64_t ok[OP_NKINDS], err[OP_NKINDS];
	uint64_t errnos[OP_NKINDS][160];
};

/* One worker process's objects, shared by its threads (racy on purpose). */
struct world {
	int dev;
	int imp;
	int drm;
	int proxies[SLOTS];
	int backings[SLOTS];
	int imports[SLOTS];	/* importer handles, -1 when free */
	/* Replaced device fds, closed at the end: a thread racing with a
	 * reopen must not see its device fd vanish (that is our EBADF). */
	int old_devs[16];
	int nr_old_devs;
};

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64: small, seedable, good enough to pick operations. */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void world_init(struct world *w)
{
	int i;

	w->dev = open(KVDMABUF_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	w->imp = open(KVD_IMPORTER_PATH, O_RDWR | O_CLOEXEC);
	w->drm = vgem_open();
	for (i = 0; i < SLOTS; i++)
		w->proxies[i] = w->backings[i] = w->imports[i] = -1;
}

static void world_fini(struct world *w)
{
	int i;

	for (i = 0; i < SLOTS; i++) {
		if (w->proxies[i] >= 0)
			close(w->proxies[i]);
		if (w->backings[i] >= 0)
			close(w->backings[i]);
	}
	if (w->dev >= 0)
		close(w->dev);
	for (i = 0; i < w->nr_old_devs && i < 16; i++)
		close(w->old_devs[i]);
	if (w->imp >= 0)
		close(w->imp);
	if (w->drm >= 0)
		close(w->drm);
}

/* Picks an fd for a "proxy" or "backing" argument: mostly right, often not. */
static int pick_fd(struct world *w, uint8_t sel)
{
	switch (sel % 16) {
	case 0 ... 7:
		return __atomic_load_n(&w->proxies[sel % SLOTS], __ATOMIC_RELAXED);
	case 8 ... 11:
		return __atomic_load_n(&w->backings[sel % SLOTS], __ATOMIC_RELAXED);
	case 12:
		return w->dev;	/* not a dma-buf */
	case 13:
		return -1;
	case 14:
		return 1000 + sel;	/* most likely closed */
	default:
		return w->drm;	/* a DRM fd, not a dma-buf */
	}
}

/* A struct size: mostly right; short, longer with a zero or non-zero
 * tail, or absurd one time in four. */
static uint32_t pick_size(uint8_t sel, uint32_t right, void *buf)
{
	switch (sel % 16) {
	case 0:
		return 8;
	case 1:
		memset((char *)buf + right, 0, 64);
		return right + 64;
	case 2:
		memset((char *)buf + right, 0, 64);
		((char *)buf)[right + 3] = 1;
		return right + 64;
	case 3:
		return 1u << 20;
	default:
		return right;
	}
}

/* A proxy argument: mostly a proxy slot, sometimes anything. */
static int pick_proxy(struct world *w, uint8_t sel)
{
	if (sel % 8)
		return __atomic_load_n(&w->proxies[(sel >> 3) % SLOTS],
				       __ATOMIC_RELAXED);
	return pick_fd(w, sel >> 3);
}

static uint32_t pick_flags(uint64_t y);

/* Flags: mostly valid (bit 0 or none), one time in eight anything. */
static uint32_t pick_valid_flags(uint64_t y)
{
	return y % 8 ? (y >> 8) & 1 : pick_flags(y >> 3);
}

/* A backing argument: mostly a backing, sometimes a proxy or junk. */
static int pick_backing(struct world *w, uint8_t sel)
{
	if (sel % 4)
		return __atomic_load_n(&w->backings[(sel >> 2) % SLOTS],
				       __ATOMIC_RELAXED);
	return pick_fd(w, sel >> 2);
}

/* Non-zero one time in sixteen: a reserved or pad field set. */
static uint64_t pick_junk(uint32_t flags, int shift)
{
	return ((flags >> shift) & 15) == 0 ? 1 : 0;
}

static uint64_t pick_length(uint64_t x)
{
	static const uint64_t bad[] = { 0, 4095, 1ull << 62, ~0ull & ~4095ull };

	if (x % 16 == 0)
		return bad[(x >> 4) % 4];
	return 4096ull << ((x >> 4) % 5);
}

static uint32_t pick_flags(uint64_t y)
{
	/* Mostly valid flags, sometimes every bit, sometimes one stray bit. */
	switch (y % 4) {
	case 0:
		return 1u << ((y >> 8) % 32);
	case 1:
		return (uint32_t)(y >> 16);
	default:
		return (y >> 8) & 1;
	}
}

/* The errnos the uapi documents for each call (0 ends a list; 0 is allowed). */
#define COMMON EFAULT, EINVAL, E2BIG
#define PROXY_ARG COMMON, EBADF

static const int allowed[OP_NKINDS][20] = {
	[OP_VERSION] = { COMMON },
	[OP_CREATE] = { COMMON, EFBIG, ENOSPC, ENOMEM, EMFILE, ENFILE },
	[OP_ATTACH] = { PROXY_ARG, EPERM, ELOOP, EOVERFLOW, ERANGE, EEXIST,
			EAGAIN, EBUSY, EINTR, ETIMEDOUT, ENOMEM, EOPNOTSUPP,
			ENODEV, EIO },
	[OP_REVOKE] = { PROXY_ARG, EPERM, EAGAIN, EBUSY, EINTR, ETIMEDOUT },
	[OP_QUERY] = { PROXY_ARG },
	[OP_BADCMD] = { ENOTTY },
	[OP_BADPTR] = { EFAULT },
	[OP_READEV] = { EAGAIN, EINVAL, EINTR },
};

/* Module calls are checked against their list; other ops (vgem, importer,
 * close, dup) only have to leave the kernel sane. */
static int is_checked(int kind)
{
	return allowed[kind][0] != 0;
}

static int op_allowed(const struct op *op, int ret)
{
	int i;

	if (!is_checked(op->kind) || ret == DEV_CLOSED)
		return 1;
	if (op->kind == OP_BADCMD || op->kind == OP_BADPTR)
		return ret == -allowed[op->kind][0];
	if (ret == 0)
		return 1;
	for (i = 0; i < 20 && allowed[op->kind][i]; i++)
		if (ret == -allowed[op->kind][i])
			return 1;
	return 0;
}

/* Whether @fd is an open /dev/kvdmabuf. */
static int is_device(int fd)
{
	struct stat a, b;

	return !fstat(fd, &a) && !stat(KVDMABUF_DEVICE_PATH, &b) &&
	       S_ISCHR(a.st_mode) && a.st_rdev == b.st_rdev;
}

/* Where forked children log (set in each worker before its threads run). */
static struct shared *fork_log;
static int fork_worker;

static void op_describe(const struct op *op, char *buf, size_t len);

/* Records the first failure of the whole run. */
static void fail_record(struct shared *sh, int worker, int thread,
			uint64_t index, const struct op *op, int ret)
{
	struct fail_info *f = &sh->fail;

	if (__atomic_exchange_n(&f->failed, 1, __ATOMIC_ACQ_REL))
		return;
	f->worker = worker;
	f->thread = thread;
	f->index = index;
	f->ret = ret;
	op_describe(op, f->what, sizeof(f->what));
}

/* Runs one operation; returns 0 or -errno. Never fails itself. */
static int run_op(struct world *w, const struct op *op, uint64_t *rng)
{
	union {
		struct kvdmabuf_version v;
		struct kvdmabuf_create c;
		struct kvdmabuf_attach a;
		struct kvdmabuf_revoke r;
		struct kvdmabuf_query q;
		char raw[4096];
	} u;
	int dev = w->dev;	/* one read: a racing reopen may swap it */
	int ret = 0, fd, old;

	memset(&u, 0, sizeof(u));
	switch (op->kind) {
	case OP_VERSION:
		u.v.flags = pick_junk(op->flags, 0) ? pick_flags(op->y) : 0;
		u.v.reserved = pick_junk(op->flags, 4) ? op->x : 0;
		u.v.size = pick_size(op->a, sizeof(u.v), &u);
		ret = ioctl(dev, KVDMABUF_IOCTL_VERSION, &u);
		break;
	case OP_CREATE:
		u.c.length = pick_length(op->x);
		u.c.flags = pick_valid_flags(op->y);
		u.c.pad = pick_junk(op->flags, 8);
		u.c.size = pick_size(op->a, sizeof(u.c), &u);
		ret = ioctl(dev, KVDMABUF_IOCTL_CREATE, &u);
		if (!ret) {
			old = __atomic_exchange_n(&w->proxies[op->b % SLOTS],
						  (int)u.c.fd, __ATOMIC_RELAXED);
			if (old >= 0)
				close(old);
		}
		break;
	case OP_ATTACH:
		u.a.proxy_fd = pick_proxy(w, op->b);
		u.a.backing_fd = pick_backing(w, op->c);
		u.a.offset = op->x % 16 ? ((op->x >> 4) % 3) * 4096 : op->x;
		u.a.flags = pick_valid_flags(op->y);
		u.a.timeout_ms = op->flags % 20;
		u.a.reserved = pick_junk(op->flags, 12);
		u.a.size = pick_size(op->a, sizeof(u.a), &u);
		ret = ioctl(dev, KVDMABUF_IOCTL_ATTACH, &u);
		break;
	case OP_REVOKE:
		u.r.proxy_fd = pick_proxy(w, op->b);
		u.r.timeout_ms = op->flags % 20;
		u.r.flags = op->y % 8 ? 0 : pick_flags(op->y >> 3);
		u.r.size = pick_size(op->a, sizeof(u.r), &u);
		ret = ioctl(dev, KVDMABUF_IOCTL_REVOKE, &u);
		break;
	case OP_QUERY:
		u.q.proxy_fd = pick_proxy(w, op->b);
		u.q.flags = op->y % 8 ? 0 : pick_flags(op->y >> 3);
		u.q.size = pick_size(op->a, sizeof(u.q), &u);
		ret = ioctl(dev, KVDMABUF_IOCTL_QUERY, &u);
		break;
	case OP_BADCMD:
		/* Unknown numbers of the module's magic, any direction/size. */
		ret = ioctl(dev, _IOC(op->x % 4, KVDMABUF_IOCTL_MAGIC,
					 5 + op->y % 250, op->flags % 512),
			    &u);
		break;
	case OP_BADPTR: {
		static const unsigned long cmds[] = {
			KVDMABUF_IOCTL_VERSION, KVDMABUF_IOCTL_CREATE,
			KVDMABUF_IOCTL_ATTACH, KVDMABUF_IOCTL_REVOKE,
			KVDMABUF_IOCTL_QUERY,
		};

		ret = ioctl(dev, cmds[op->x % 5], op->y % 2 ? NULL :
			    (void *)(uintptr_t)(0xffff800000000000ull));
		break;
	}
	case OP_VGEM:
		if (w->drm < 0)
			break;
		fd = vgem_dmabuf(w->drm, 4096ull << (op->x % 6));
		ret = fd < 0 ? fd : 0;
		if (fd >= 0) {
			old = __atomic_exchange_n(&w->backings[op->b % SLOTS],
						  fd, __ATOMIC_RELAXED);
			if (old >= 0)
				close(old);
		}
		break;
	case OP_CLOSE:
		old = __atomic_exchange_n(op->a % 2 ? &w->backings[op->b % SLOTS] :
					  &w->proxies[op->b % SLOTS], -1,
					  __ATOMIC_RELAXED);
		if (old >= 0)
			close(old);
		break;
	case OP_DUP:
		fd = pick_fd(w, op->b);
		fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
		if (fd >= 0) {
			old = __atomic_exchange_n(&w->proxies[op->c % SLOTS], fd,
						  __ATOMIC_RELAXED);
			if (old >= 0)
				close(old);
		}
		break;
	case OP_IMPORT: {
		struct kvd_imp_import im = {
			.fd = (uint32_t)pick_proxy(w, op->b),
			.flags = op->y % 4 ? 0 : KVD_IMP_IMPORT_PINNED,
		};

		ret = ioctl(w->imp, KVD_IMP_IOCTL_IMPORT, &im) ? -errno : 0;
		if (!ret) {
			old = __atomic_exchange_n(&w->imports[op->c % SLOTS],
						  (int)im.handle,
						  __ATOMIC_RELAXED);
			if (old >= 0) {
				struct kvd_imp_release rl = { .handle = old };

				ioctl(w->imp, KVD_IMP_IOCTL_RELEASE, &rl);
			}
		}
		break;
	}
	case OP_ACCESS: {
		struct kvd_imp_access ac = {
			.handle = (uint32_t)__atomic_load_n(&w->imports[op->c % SLOTS],
							    __ATOMIC_RELAXED),
			.flags = op->y & 1 ? KVD_IMP_ACCESS_WRITE : 0,
			.offset = op->x % 3 ? (op->x % 16) * 1024 : op->x,
			.length = op->y % 5 ? 1 + (op->y >> 8) % 8192 : op->y,
			.buf = (uintptr_t)u.raw,
		};

		if (ac.length > sizeof(u.raw))
			ac.length = sizeof(u.raw);
		return ioctl(w->imp, KVD_IMP_IOCTL_ACCESS, &ac) ? -errno : 0;
	}
	case OP_RELEASE: {
		struct kvd_imp_release rl;

		old = __atomic_exchange_n(&w->imports[op->c % SLOTS], -1,
					  __ATOMIC_RELAXED);
		rl = (struct kvd_imp_release){ .handle = (uint32_t)old };
		if (old >= 0)
			ioctl(w->imp, KVD_IMP_IOCTL_RELEASE, &rl);
		break;
	}
	case OP_READEV: {
		struct pollfd p = { .fd = dev, .events = POLLIN };
		ssize_t n;

		poll(&p, 1, 0);
		fcntl(dev, F_SETFL, O_NONBLOCK);
		n = read(dev, u.raw, op->x % 3 ? 4 * sizeof(struct kvdmabuf_event) :
			 op->x % sizeof(struct kvdmabuf_event));
		ret = n < 0 ? -errno : 0;
		if (ret == -EBADF && !is_device(dev))
			return DEV_CLOSED;
		return ret;
	}
	case OP_REOPEN: {
		int slot = __atomic_fetch_add(&w->nr_old_devs, 1, __ATOMIC_RELAXED);

		if (slot >= 16)
			break;
		fd = open(KVDMABUF_DEVICE_PATH, O_RDWR | O_CLOEXEC);
		w->old_devs[slot] = __atomic_exchange_n(&w->dev, fd < 0 ? w->dev : fd,
							__ATOMIC_RELAXED);
		if (fd < 0)
			w->old_devs[slot] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		break;
	}
	case OP_FORK: {
		/* A child inherits every fd (other processes' proxies) and
		 * runs a few ops; half the time it is killed mid-way. */
		uint64_t seed = rng_next(rng);
		pid_t pid = fork();

		if (pid == 0) {
			struct op_log *log = &fork_log->logs[fork_worker][THREADS];
			struct op cop;
			int i;

			/* The snapshot of a racing parent may name fds that
			 * were closed at the instant of the fork: forget those
			 * first, so that no fd opened here can be taken for an
			 * inherited one. Then a device fd of its own; the
			 * inherited proxies and backings stay the parent's. */
			for (i = 0; i < SLOTS; i++) {
				if (w->proxies[i] >= 0 &&
				    fcntl(w->proxies[i], F_GETFD) < 0)
					w->proxies[i] = -1;
				if (w->backings[i] >= 0 &&
				    fcntl(w->backings[i], F_GETFD) < 0)
					w->backings[i] = -1;
			}
			fd = open(KVDMABUF_DEVICE_PATH, O_RDWR | O_CLOEXEC);
			if (fd >= 0)
				w->dev = fd;

			for (i = 0; i < 40; i++) {
				uint64_t r = rng_next(&seed);

				cop = (struct op){ .kind = r % OP_FORK,
					.a = r >> 8, .b = r >> 16, .c = r >> 24,
					.flags = (uint32_t)(r >> 32),
					.x = rng_next(&seed), .y = rng_next(&seed) };
				log->ops[log->n % LOG_LEN] = cop;
				log->n++;
				ret = run_op(w, &cop, &seed);
				if (!op_allowed(&cop, ret)) {
					fail_record(fork_log, fork_worker,
						    THREADS, log->n - 1, &cop,
						    ret);
					_exit(1);
				}
			}
			_exit(0);
		}
		if (pid > 0) {
			int st;

			if (op->x % 2) {
				usleep(op->y % 3000);
				kill(pid, SIGKILL);
			}
			waitpid(pid, &st, 0);
		}
		return 0;
	}
	}
	if (ret < 0 && op->kind <= OP_BADPTR) {
		ret = -errno;
		/* EBADF/ENOTTY when the fd no longer is the device (closed,
		 * or its number reused, in a forked child's snapshot of a
		 * racing parent) are the VFS's answers, not the module's; with
		 * the device really there they still fail. */
		if ((ret == -EBADF || ret == -ENOTTY) && !is_device(dev))
			return DEV_CLOSED;
	}
	return ret;
}

static void op_describe(const struct op *op, char *buf, size_t len)
{
	snprintf(buf, len, "%s a=%u b=%u c=%u flags=%#x x=%#llx y=%#llx",
		 op_names[op->kind], op->a, op->b, op->c, op->flags,
		 (unsigned long long)op->x, (unsigned long long)op->y);
}

/* Operation weights: module calls dominate, life-cycle events are rarer. */
static struct op gen_op(uint64_t *rng, int allow_fork)
{
	static const uint8_t table[] = {
		OP_VERSION, OP_CREATE, OP_CREATE, OP_CREATE, OP_ATTACH,
		OP_ATTACH, OP_ATTACH, OP_ATTACH, OP_REVOKE, OP_REVOKE,
		OP_REVOKE, OP_QUERY, OP_QUERY, OP_BADCMD, OP_BADPTR, OP_VGEM,
		OP_VGEM, OP_VGEM, OP_CLOSE, OP_CLOSE, OP_DUP, OP_IMPORT,
		OP_IMPORT, OP_ACCESS, OP_ACCESS, OP_ACCESS, OP_RELEASE,
		OP_READEV, OP_REOPEN, OP_FORK,
	};
	uint64_t r = rng_next(rng);
	struct op op = {
		.kind = table[r % sizeof(table)],
		.a = r >> 8, .b = r >> 16, .c = r >> 24,
		.flags = (uint32_t)(r >> 32),
		.x = rng_next(rng), .y = rng_next(rng),
	};

	if (op.kind == OP_FORK && !allow_fork)
		op.kind = OP_QUERY;
	return op;
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

	while (__th_now() < ta->deadline && !ta->sh->fail.failed) {
		struct op op = gen_op(&rng, ta->thread == 0);
		int ret;

		log->ops[log->n % LOG_LEN] = op;
		__atomic_store_n(&log->n, log->n + 1, __ATOMIC_RELEASE);
		ret = run_op(ta->w, &op, &rng);
		__atomic_fetch_add(&ta->sh->total_ops, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(ret ? &ta->sh->err[op.kind] : &ta->sh->ok[op.kind],
				   1, __ATOMIC_RELAXED);
		if (ret < 0 && ret > -160)
			__atomic_fetch_add(&ta->sh->errnos[op.kind][-ret], 1,
					   __ATOMIC_RELAXED);
		if (!op_allowed(&op, ret))
			fail_record(ta->sh, ta->worker, ta->thread, log->n - 1,
				    &op, ret);
	}
	return NULL;
}

static void fuzz_worker(struct shared *sh, int worker, uint64_t seed,
			double deadline)
{
	struct thread_arg ta[THREADS];
	pthread_t tid[THREADS];
	struct world w;
	int i;

	world_init(&w);
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
	world_fini(&w);
}

/* ---- kernel log ---- */

static int kmsg_open(void)
{
	int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);

	if (fd >= 0)
		lseek(fd, 0, SEEK_END);
	return fd;
}

/* Prints and counts new kernel log records that report a problem. */
static int kmsg_bad(int fd)
{
	static const char *const bad[] = {
		"WARNING:", "BUG:", "Oops", "general protection", "lockdep",
		"possible circular", "KASAN", "list_add corruption",
		"list_del corruption", "refcount_t:", "sleeping function",
		"Call Trace",
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
static int replay(const struct op *ops, int n, int kmsg)
{
	pid_t pid = fork();
	int st, i;

	if (pid == 0) {
		struct world w;
		uint64_t rng = 1;

		world_init(&w);
		for (i = 0; i < n; i++) {
			struct op op = ops[i];

			if (op.kind == OP_FORK)
				continue;
			if (!op_allowed(&op, run_op(&w, &op, &rng)))
				_exit(1);
		}
		world_fini(&w);
		_exit(0);
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

	avail = end < LOG_LEN ? end : LOG_LEN;
	for (k = 1; k <= (int)avail; k++) {
		for (i = 0; i < k; i++)
			tail[i] = log->ops[(end - k + i) % LOG_LEN];
		if (replay(tail, k, kmsg)) {
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

static int reload_module(void)
{
	const char *build = getenv("KVDMABUF_BUILD");
	char ko[4096];
	int fd, ret;

	if (syscall(SYS_delete_module, "kvdmabuf", O_NONBLOCK))
		return -errno;
	if (!build)
		return -ENOENT;
	snprintf(ko, sizeof(ko), "%s/module/kvdmabuf.ko", build);
	fd = open(ko, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ret = syscall(SYS_finit_module, fd, "", 0) ? -errno : 0;
	close(fd);
	return ret;
}

static int fuzz_seconds = 10;
static uint64_t fuzz_seed;

TEST_TIMEOUT(fuzz, 3600)
{
	struct shared *sh;
	pid_t pids[WORKERS];
	double deadline;
	char stats[256];
	int i, st, kmsg, dirty;
	long held = -1;

	if (access(KVDMABUF_DEVICE_PATH, R_OK | W_OK))
		SKIP(return, "no %s (load module/kvdmabuf.ko)", KVDMABUF_DEVICE_PATH);
	if (access(KVD_IMPORTER_PATH, R_OK | W_OK))
		SKIP(return, "no %s (load tests/kmod/kvd_importer.ko)",
		     KVD_IMPORTER_PATH);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, sh);
	kmsg = kmsg_open();
	TH_LOG("seed %llu, %d s, %d workers x %d threads (replay: --seed %llu)",
	       (unsigned long long)fuzz_seed, fuzz_seconds, WORKERS, THREADS,
	       (unsigned long long)fuzz_seed);

	deadline = __th_now() + fuzz_seconds;
	for (i = 0; i < WORKERS; i++) {
		pids[i] = fork();
		ASSERT_GE(pids[i], 0);
		if (!pids[i]) {
			fuzz_worker(sh, i, fuzz_seed + (uint64_t)i, deadline);
			_exit(0);
		}
	}
	for (i = 0; i < WORKERS; i++)
		waitpid(pids[i], &st, 0);
	TH_LOG("%llu operations", (unsigned long long)sh->total_ops);
	for (i = 0; i < OP_NKINDS; i++) {
		char line[512];
		size_t used = 0;
		int e;

		line[0] = 0;
		for (e = 1; e < 160; e++)
			if (sh->errnos[i][e] && used < sizeof(line))
				used += snprintf(line + used, sizeof(line) - used,
						 " %s:%llu", strerrorname_np(e),
						 (unsigned long long)sh->errnos[i][e]);
		printf("#   %-12s %8llu ok %8llu errors%s\n", op_names[i],
		       (unsigned long long)sh->ok[i], (unsigned long long)sh->err[i],
		       line);
	}

	if (sh->fail.failed) {
		TH_LOG("seed %llu: worker %d thread %d op #%llu: %s returned %d (%s)",
		       (unsigned long long)fuzz_seed, sh->fail.worker,
		       sh->fail.thread, (unsigned long long)sh->fail.index,
		       sh->fail.what, sh->fail.ret, strerror(-sh->fail.ret));
		report_tail(sh, kmsg);
	}
	EXPECT_FALSE(sh->fail.failed);

	/* Every process is gone: the module must hold nothing. Releases
	 * of fds closed at exit may run a little later (delayed fput). */
	for (i = 0; i < 500; i++) {
		held = module_holds(stats, sizeof(stats));
		if (held <= 0)
			break;
		usleep(10000);
	}
	if (held < 0)
		TH_LOG("no /sys/kernel/debug/kvdmabuf/stats: counts not checked");
	else
		TH_LOG("module state after exit: %s", stats);
	EXPECT_LE(held, 0);

	dirty = kmsg_bad(kmsg);
	if (dirty)
		TH_LOG("seed %llu: %d kernel log reports", (unsigned long long)fuzz_seed,
		       dirty);
	EXPECT_EQ(0, dirty);

	/* ... and unload (then load again for the tests that follow). */
	if (getenv("KVDMABUF_BUILD"))
		EXPECT_EQ(0, reload_module());
	else
		TH_LOG("KVDMABUF_BUILD not set: unload not checked");
	munmap(sh, sizeof(*sh));
}

int main(int argc, char **argv)
{
	const char *s = getenv("KVDMABUF_FUZZ_SECONDS");
	const char *seed = getenv("KVDMABUF_FUZZ_SEED");
	int i;

	fuzz_seed = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL);
	if (s)
		fuzz_seconds = atoi(s);
	for (i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--seconds"))
			fuzz_seconds = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--seed"))
			fuzz_seed = strtoull(argv[i + 1], NULL, 0);
		else
			break;
	}
	if (fuzz_seconds < 1)
		fuzz_seconds = 1;
	_fuzz_object.timeout = fuzz_seconds + 600;
	return test_harness_run(1, argv);
}
