// SPDX-License-Identifier: GPL-2.0
/*
 * ranges-bench - what changing chunks of a registered elastic KV pool
 * costs (KVDMABUF_IOCTL_RANGES, issue 38), against registering the pool
 * again. The NIC standing in for a move-capable mlx5 is kvd_umem
 * (tests/kmod): ib_core's own dma-buf MR code, dynamic (ib_umem_dmabuf_get,
 * ib_umem_dmabuf_map_pages after each invalidation).
 *
 * Per pool size (256 MiB, 1 GiB, 4 GiB where the guest holds it), 2 MiB chunks (vgem buffers), the whole pool backed by one RANGES
 * call and imported once; in turns, per repetition:
 *   (r)  registering the pool again: release of the import, import of the
 *        proxy, first 4 KiB access (the MR maps the pool);
 *   (1)  one chunk swapped: one RANGES call (and one back);
 *   (16) sixteen chunks swapped in one RANGES call (and back);
 *   (f)  the MR's first 4 KiB access after a batch (it maps the pool again:
 *        a dma-buf MR is invalidated whole, whatever the batch);
 * medians; after every change the changed chunks are read through the MR
 * and checked (the pattern of the buffer now behind them), so a call that
 * did nothing fails the run instead of looking fast. Targets (printed,
 * judged unless --sanity): (16) <= (r) / 10 at 1 GiB; (1) at the largest
 * pool <= 1.5 x (1) at 256 MiB (the call does not grow with the chunks
 * that stay). --sanity: pools of 32 and 64 MiB.
 *
 *   ranges-bench [--sanity] [--reps N]
 */
#define KVD_IMP_UMEM
#include <getopt.h>
#include <inttypes.h>
#include <sys/resource.h>
#include <time.h>

#include "../proxy_common.h"
#include "bench_stats.h"

#define MIB		((uint64_t)1 << 20)
#define CHUNK		(2 * MIB)
#define BATCH		16
#define MAX_REPS	64
#define MAX_SIZES	3

struct pool {
	uint64_t size;
	unsigned int n;			/* chunks */
	int *chunk;			/* the chunks' buffers, seed 1000 + i */
	int spare[BATCH];		/* seed 50 + j */
	int proxy, h;
};

struct figures {
	uint64_t size;
	int measured;
	double rereg, one, batch, first;	/* medians, ns */
};

static int dev = -1, imp = -1, drm = -1, sanity, reps = 9;

static int fail(const char *what, int rc)
{
	fprintf(stderr, "ranges-bench: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
	return -1;
}

/* The MR reads chunk @i's first 4 KiB: pattern @seed, or the run fails. */
static int check_chunk(struct pool *p, unsigned int i, uint32_t seed)
{
	static char buf[KVD_PAGE];
	int rc = imp_read(imp, p->h, i * CHUNK, buf, sizeof(buf));

	if (rc)
		return fail("read through the MR", rc);
	if (pattern_check(buf, sizeof(buf), seed) != -1) {
		fprintf(stderr, "ranges-bench: chunk %u does not hold seed %u\n",
			i, seed);
		return -1;
	}
	return 0;
}

/* Changes chunks @idx[0..@n) to @fds; returns the call's time or < 0. */
static double swap(struct pool *p, const unsigned int *idx, const int *fds,
		   unsigned int n)
{
	struct kvdmabuf_range r[BATCH];
	int64_t t0;
	unsigned int k;
	int rc;

	for (k = 0; k < n; k++)
		r[k] = (struct kvdmabuf_range){ .start = idx[k] * CHUNK,
						.length = CHUNK,
						.backing_fd = fds[k] };
	t0 = now_ns();
	rc = kvd_ranges(dev, p->proxy, r, n);
	if (rc)
		return fail("RANGES", rc);
	return (double)(now_ns() - t0);
}

static void pool_free(struct pool *p)
{
	unsigned int i;

	if (p->h >= 0)
		imp_release(imp, p->h);
	kvd_close(&p->proxy);
	for (i = 0; p->chunk && i < p->n; i++)
		kvd_close(&p->chunk[i]);
	for (i = 0; i < BATCH; i++)
		kvd_close(&p->spare[i]);
	free(p->chunk);
}

static int pool_new(struct pool *p, uint64_t size)
{
	struct kvdmabuf_range *r;
	unsigned int i;
	int rc;

	memset(p, 0, sizeof(*p));
	p->proxy = p->h = -1;
	for (i = 0; i < BATCH; i++)
		p->spare[i] = -1;
	p->size = size;
	p->n = (unsigned int)(size / CHUNK);
	p->chunk = calloc(p->n, sizeof(*p->chunk));
	r = calloc(p->n, sizeof(*r));
	if (!p->chunk || !r) {
		free(r);
		return fail("memory", ENOMEM);
	}
	for (i = 0; i < p->n; i++)
		p->chunk[i] = -1;
	for (i = 0; i < p->n; i++) {
		p->chunk[i] = vgem_pattern_buf(drm, CHUNK, 1000 + i);
		if (p->chunk[i] < 0) {
			free(r);
			return fail("vgem chunk", p->chunk[i]);
		}
		r[i] = (struct kvdmabuf_range){ .start = i * CHUNK,
						.length = CHUNK,
						.backing_fd = p->chunk[i] };
	}
	for (i = 0; i < BATCH; i++) {
		p->spare[i] = vgem_pattern_buf(drm, CHUNK, 50 + i);
		if (p->spare[i] < 0) {
			free(r);
			return fail("vgem spare", p->spare[i]);
		}
	}
	p->proxy = kvd_create(dev, size, NULL);
	rc = p->proxy < 0 ? p->proxy : kvd_ranges(dev, p->proxy, r, p->n);
	free(r);
	if (rc)
		return fail("proxy of the pool", rc);
	p->h = imp_import(imp, p->proxy, 0);
	if (p->h < 0)
		return fail("import of the pool", p->h);
	return check_chunk(p, p->n - 1, 1000 + p->n - 1);
}

/* One repetition of every figure, the changed chunks checked after each. */
static int one_rep(struct pool *p, int rep, double *rr, double *one,
		   double *batch, double *first)
{
	unsigned int idx[BATCH], k, i;
	int orig[BATCH];
	int64_t t0;
	double t;
	int rc;

	/* (r) */
	imp_release(imp, p->h);
	t0 = now_ns();
	p->h = imp_import(imp, p->proxy, 0);
	if (p->h < 0)
		return fail("import again", p->h);
	if (check_chunk(p, 0, 1000))
		return -1;
	*rr = (double)(now_ns() - t0);

	/* (1): a chunk to a spare and back; both calls count */
	i = (unsigned int)(rep * 7919) % p->n;
	t = swap(p, &i, &p->spare[0], 1);
	if (t < 0 || check_chunk(p, i, 50))
		return -1;
	one[0] = t;
	t = swap(p, &i, &p->chunk[i], 1);
	if (t < 0 || check_chunk(p, i, 1000 + i))
		return -1;
	one[1] = t;

	/* (16) and (f) */
	for (k = 0; k < BATCH; k++) {
		/* distinct: k * (n / BATCH) < n, n >= BATCH */
		idx[k] = (unsigned int)(rep * 31 + k * (p->n / BATCH)) % p->n;
		orig[k] = p->chunk[idx[k]];
	}
	t = swap(p, idx, p->spare, BATCH);
	if (t < 0)
		return -1;
	batch[0] = t;
	t0 = now_ns();
	rc = check_chunk(p, idx[0], 50);
	*first = (double)(now_ns() - t0);
	for (k = 1; k < BATCH && !rc; k++)
		rc = check_chunk(p, idx[k], 50 + k);
	if (rc)
		return -1;
	t = swap(p, idx, orig, BATCH);
	if (t < 0)
		return -1;
	batch[1] = t;
	for (k = 0; k < BATCH; k++)
		if (check_chunk(p, idx[k], 1000 + idx[k]))
			return -1;
	return 0;
}

static int measure(struct figures *f)
{
	double rr[MAX_REPS], one[2 * MAX_REPS], batch[2 * MAX_REPS];
	double first[MAX_REPS];
	struct pool p;
	int rep, rc = -1;
	int64_t t0 = now_ns();

	if (pool_new(&p, f->size))
		goto out;
	/* one warm-up repetition, not counted */
	for (rep = 0; rep <= reps; rep++) {
		int k = rep ? rep - 1 : 0;

		if (one_rep(&p, rep, &rr[k], &one[2 * k], &batch[2 * k],
			    &first[k]))
			goto out;
	}
	f->rereg = median(rr, reps);
	f->one = median(one, 2 * reps);
	f->batch = median(batch, 2 * reps);
	f->first = median(first, reps);
	f->measured = 1;
	rc = 0;
	printf("# pool %" PRIu64 " MiB: %u chunks, %d repetitions in %.1f s\n",
	       f->size / MIB, p.n, reps, (now_ns() - t0) / 1e9);
out:
	pool_free(&p);
	return rc;
}

static void target(const char *name, int measured, int pass,
		   const char *what)
{
	const char *st = !measured ? "UNMEASURED" : pass ? "PASS" : "FAIL";

	printf("# target %s: %s: %s\n", name, what, st);
	printf("BENCH target=%s status=%s\n", name, st);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "sanity", no_argument, NULL, 'S' },
		{ "reps", required_argument, NULL, 'r' },
		{ NULL, 0, NULL, 0 },
	};
	struct figures f[MAX_SIZES] = { { .size = 256 * MIB },
					{ .size = 1024 * MIB },
					{ .size = 4096 * MIB - CHUNK } };
	int nsizes = MAX_SIZES, i, c, judged, ok1, ok2, rc = 0;
	struct figures *small, *gib = NULL, *big = NULL;
	struct rlimit nofile;
	char what[160];
	long avail;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'S') {
			sanity = 1;
		} else if (c == 'r') {
			reps = atoi(optarg);
			if (reps < 1 || reps > MAX_REPS)
				return fprintf(stderr, "--reps 1..%d\n",
					       MAX_REPS), 2;
		} else {
			return fprintf(stderr, "usage: ranges-bench [--sanity] "
				       "[--reps N]\n"), 2;
		}
	}
	if (sanity) {
		f[0].size = BATCH * CHUNK;
		f[1].size = 2 * BATCH * CHUNK;
		nsizes = 2;
		reps = 2;
	}
	/* a chunk is an fd: 2048 of them at 4 GiB */
	if (!getrlimit(RLIMIT_NOFILE, &nofile)) {
		nofile.rlim_cur = nofile.rlim_max;
		setrlimit(RLIMIT_NOFILE, &nofile);
	}
	dev = kvd_dev_open();
	imp = imp_open();
	drm = vgem_open();
	if (dev < 0 || imp < 0 || drm < 0) {
		fprintf(stderr, "ranges-bench: needs %s, %s and vgem (run it in a "
			"VM lane: tests/vm/check.sh run 6.12 "
			"tests/bench/ranges-bench)\n", KVDMABUF_DEVICE_PATH,
			KVD_IMP_PATH);
		return 1;
	}
	printf("# ranges-bench: 2 MiB chunks, NIC kvd_umem (ib_umem_dmabuf), "
	       "medians of %d repetitions after one warm-up%s\n", reps,
	       sanity ? "; SANITY run: tiny pools, targets not judged" : "");
	for (i = 0; i < nsizes; i++) {
		avail = meminfo_kb("MemAvailable");
		if (avail < 0 || (uint64_t)avail * 1024 <
		    f[i].size + BATCH * CHUNK + 256 * MIB) {
			printf("# pool %" PRIu64 " MiB: NOT MEASURED, the guest "
			       "has %ld MiB available\n", f[i].size / MIB,
			       avail / 1024);
			continue;
		}
		if (measure(&f[i])) {
			rc = 1;
			break;
		}
		printf("BENCH name=ranges pool_mib=%" PRIu64 " chunks=%" PRIu64
		       " rereg_ns=%.0f swap1_ns=%.0f swap16_ns=%.0f "
		       "first_access_ns=%.0f swap16_over_rereg=%.4f\n",
		       f[i].size / MIB, f[i].size / CHUNK, f[i].rereg, f[i].one,
		       f[i].batch, f[i].first, f[i].batch / f[i].rereg);
		printf("# pool %4" PRIu64 " MiB: register again %.2f ms, one "
		       "chunk %.3f ms, %d chunks %.3f ms (%.3fx), first access "
		       "after %.2f ms\n", f[i].size / MIB, f[i].rereg / 1e6,
		       f[i].one / 1e6, BATCH, f[i].batch / 1e6,
		       f[i].batch / f[i].rereg, f[i].first / 1e6);
	}
	small = &f[0];
	for (i = 1; i < nsizes; i++) {
		if (f[i].size >= 1024 * MIB - CHUNK && !gib)
			gib = &f[i];
		if (f[i].measured)
			big = &f[i];
	}
	if (sanity)
		gib = &f[1];
	judged = !sanity;
	ok1 = gib && gib->measured && gib->batch <= gib->rereg / 10;
	snprintf(what, sizeof(what), "%d chunks %.3f ms vs registering the "
		 "pool again / 10 = %.3f ms", BATCH, gib ? gib->batch / 1e6 : 0,
		 gib ? gib->rereg / 1e7 : 0);
	target("swap16_le_tenth_of_rereg_1g", gib && gib->measured, ok1, what);
	ok2 = big && small->measured && big->one <= 1.5 * small->one;
	snprintf(what, sizeof(what), "one chunk %.3f ms at %" PRIu64 " MiB vs "
		 "1.5 x %.3f ms at %" PRIu64 " MiB", big ? big->one / 1e6 : 0,
		 big ? big->size / MIB : 0, small->one / 1e6,
		 small->size / MIB);
	target("swap1_flat_in_pool_size", big && small->measured, ok2, what);
	/* --sanity: the figures were made and checked; timings not judged */
	if (judged && (!ok1 || !ok2))
		rc = 1;
	close(drm);
	close(imp);
	close(dev);
	return rc;
}
