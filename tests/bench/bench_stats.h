/* SPDX-License-Identifier: MIT */
/*
 * The benchmarks' clock and medians (kvdmabuf-bench, preload-bench,
 * ranges-bench).
 */
#ifndef KVDMABUF_BENCH_STATS_H
#define KVDMABUF_BENCH_STATS_H

#include <math.h>
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

/* Student's t at 97.5% for @df degrees of freedom (a table to 30, then
 * within 0.005 of it). */
static inline double t975(int df)
{
	static const double t[30] = {
		12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
		2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110,
		2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
		2.052, 2.048, 2.045, 2.042,
	};

	return df < 1 ? 0 : df <= 30 ? t[df - 1] : 1.96 + 2.4 / df;
}

/*
 * Geometric mean of @n positive per-cycle ratios, and in *@lo, *@hi its
 * 95% confidence interval (Student's t on their logarithms): how far one
 * run's ratio can be trusted. Fewer than two samples: the interval is the
 * value. 0 when one is not positive.
 */
static inline double geomean_ci(const double *r, int n, double *lo,
				double *hi)
{
	double sum = 0, ss = 0, m, half;
	int i;

	*lo = *hi = 0;
	for (i = 0; i < n; i++) {
		if (!(r[i] > 0))
			return 0;
		sum += log(r[i]);
	}
	if (n < 1)
		return 0;
	m = sum / n;
	for (i = 0; i < n; i++)
		ss += (log(r[i]) - m) * (log(r[i]) - m);
	half = n < 2 ? 0 : t975(n - 1) * sqrt(ss / (n - 1) / n);
	*lo = exp(m - half);
	*hi = exp(m + half);
	return exp(m);
}

/* What percentile(v, n, 99) is: below 100 samples the nearest rank of
 * p99 is the largest, and the rows say so. */
static inline const char *p99_name(int n)
{
	return n >= 100 ? "p99" : "max";
}

#endif /* KVDMABUF_BENCH_STATS_H */
