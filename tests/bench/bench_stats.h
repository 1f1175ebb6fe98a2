/* SPDX-License-Identifier: MIT */
/*
 * The benchmarks' clock and medians (kvdmabuf-bench, preload-bench,
 * ranges-bench).
 */
#ifndef KVDMABUF_BENCH_STATS_H
#define KVDMABUF_BENCH_STATS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* A sorted copy of @n samples (free it); NULL when empty or OOM. */
static inline double *sorted_copy(const double *v, int n)
{
	double *c;

	if (n <= 0)
		return NULL;
	c = malloc((size_t)n * sizeof(*c));
	if (!c)
		return NULL;
	memcpy(c, v, (size_t)n * sizeof(*c));
	qsort(c, (size_t)n, sizeof(*c), cmp_dbl);
	return c;
}

/* Median of any number of samples; 0 when empty or OOM. */
static inline double median(const double *v, int n)
{
	double *c = sorted_copy(v, n), m;

	if (!c)
		return 0;
	m = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
	free(c);
	return m;
}

/* Nearest-rank percentile @p of any number of samples; 0 when empty. */
static inline double percentile(const double *v, int n, int p)
{
	double *c = sorted_copy(v, n), x;
	int k = (p * n + 99) / 100;	/* ceil(p/100 * n), 1-based */

	if (!c)
		return 0;
	x = c[k < 1 ? 0 : k - 1];
	free(c);
	return x;
}

/* What percentile(v, n, 99) is: below 100 samples the nearest rank of
 * p99 is the largest, and the rows say so. */
static inline const char *p99_name(int n)
{
	return n >= 100 ? "p99" : "max";
}

#endif /* KVDMABUF_BENCH_STATS_H */
