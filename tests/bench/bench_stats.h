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

/* Median of any number of samples (sorts a copy); 0 when empty or OOM. */
static inline double median(const double *v, int n)
{
	double *c, m;

	if (n <= 0)
		return 0;
	c = malloc((size_t)n * sizeof(*c));
	if (!c)
		return 0;
	memcpy(c, v, (size_t)n * sizeof(*c));
	qsort(c, (size_t)n, sizeof(*c), cmp_dbl);
	m = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
	free(c);
	return m;
}

#endif /* KVDMABUF_BENCH_STATS_H */
