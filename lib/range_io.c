// SPDX-License-Identifier: MIT
/*
 * range_io.c - transfers on parts of a region (kvdmabuf_io_begin_range()),
 * counted per unit of KVD_IO_UNIT bytes, so that kvdmabuf_region_ranges()
 * waits for those on the pages it changes while transfers to the rest of
 * an elastic pool go on.
 *
 * Each unit is one atomic word, its count and KVD_IO_CLOSED, for the same
 * reason as inflight.c's: a begin and a close are two read-modify-writes
 * on one word, so either the drain sees the transfer or the transfer sees
 * the close and backs out. A range transfer is a region transfer too
 * (kvd_io_begin() first): a sleep drains it as any other.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

int kvd_range_io_init(struct kvd_range_io *rio, size_t len)
{
	rio->nr_units = (len + KVD_IO_UNIT - 1) / KVD_IO_UNIT;
	rio->unit = calloc(rio->nr_units ? rio->nr_units : 1,
			   sizeof(*rio->unit));
	return rio->unit ? 0 : -ENOMEM;
}

void kvd_range_io_free(struct kvd_range_io *rio)
{
	free(rio->unit);
	rio->unit = NULL;
	rio->nr_units = 0;
}

/* One transfer of unit @u ended; the drain woken when it was the last of
 * a closed unit. An end without a begin is counted and ignored. */
static void unit_end(struct kvdmabuf_region *r, size_t u)
{
	struct kvd_range_io *rio = &r->rio;
	uint64_t cur = atomic_load_explicit(&rio->unit[u],
					    memory_order_relaxed);

	do {
		if (!(cur & ~KVD_IO_CLOSED)) {
			atomic_fetch_add(&r->io.unbalanced, 1);
			return;
		}
	} while (!atomic_compare_exchange_weak(&rio->unit[u], &cur, cur - 1));
	if ((cur & KVD_IO_CLOSED) && (cur & ~KVD_IO_CLOSED) == 1) {
		atomic_fetch_add(&rio->ended, 1);
		syscall(SYS_futex, &rio->ended, FUTEX_WAKE_PRIVATE, INT_MAX,
			NULL, NULL, 0);
	}
}

int kvdmabuf_io_begin_range(struct kvdmabuf_region *r, size_t offset,
			    size_t len)
{
	size_t u, first, last;
	uint64_t old;
	int rc;

	if (!r || !len || offset > r->len || len > r->len - offset)
		return -EINVAL;
	rc = kvd_io_begin(&r->io);
	if (rc || !r->rio.unit)
		return rc;
	first = offset / KVD_IO_UNIT;
	last = (offset + len - 1) / KVD_IO_UNIT;
	for (u = first; u <= last; u++) {
		/* a closed unit is refused without touching its word, so
		 * that retries cannot keep its count up and starve the drain */
		if (atomic_load_explicit(&r->rio.unit[u], memory_order_relaxed)
		    & KVD_IO_CLOSED)
			break;
		old = atomic_fetch_add(&r->rio.unit[u], 1);
		if (old & KVD_IO_CLOSED) {
			unit_end(r, u);
			break;
		}
	}
	if (u <= last) {
		while (u-- > first)
			unit_end(r, u);
		kvd_io_end(&r->io);
		return -ESHUTDOWN;
	}
	return 0;
}

void kvdmabuf_io_end_range(struct kvdmabuf_region *r, size_t offset,
			   size_t len)
{
	size_t u;

	if (!r || !len || offset > r->len || len > r->len - offset)
		return;
	for (u = offset / KVD_IO_UNIT; r->rio.unit &&
	     u <= (offset + len - 1) / KVD_IO_UNIT; u++)
		unit_end(r, u);
	kvd_io_end(&r->io);     /* last: the region outlives the wake above */
}

/* Close (@close) or open the units of the @n ranges of @k. */
static void units_set(struct kvd_range_io *rio, const struct kvd_range *k,
		      unsigned int n, bool close)
{
	unsigned int i;
	size_t u;

	for (i = 0; i < n; i++)
		for (u = k[i].start / KVD_IO_UNIT;
		     u <= (k[i].start + k[i].len - 1) / KVD_IO_UNIT; u++) {
			if (close)
				atomic_fetch_or(&rio->unit[u], KVD_IO_CLOSED);
			else
				atomic_fetch_and(&rio->unit[u], ~KVD_IO_CLOSED);
		}
}

/* Transfers still in flight on the units of @k. */
static uint64_t units_busy(struct kvd_range_io *rio, const struct kvd_range *k,
			   unsigned int n)
{
	uint64_t busy = 0;
	unsigned int i;
	size_t u;

	for (i = 0; i < n; i++)
		for (u = k[i].start / KVD_IO_UNIT;
		     u <= (k[i].start + k[i].len - 1) / KVD_IO_UNIT; u++)
			busy += atomic_load(&rio->unit[u]) & ~KVD_IO_CLOSED;
	return busy;
}

int kvd_range_io_drain(struct kvdmabuf_region *r, const struct kvd_range *k,
		       unsigned int n, unsigned int timeout_ms)
{
	struct kvd_range_io *rio = &r->rio;
	int64_t deadline = kvd_now_ns() + (int64_t)timeout_ms * 1000000;
	int64_t left;
	uint64_t busy;
	uint32_t seen;

	if (!rio->unit)
		return 0;
	units_set(rio, k, n, true);
	for (;;) {
		seen = atomic_load(&rio->ended);
		busy = units_busy(rio, k, n);
		if (!busy)
			return 0;
		left = deadline - kvd_now_ns();
		if (left <= 0)
			break;
		{
			struct timespec to = { left / 1000000000,
					       left % 1000000000 };

			/* returns at once if 'ended' moved meanwhile */
			syscall(SYS_futex, &rio->ended, FUTEX_WAIT_PRIVATE,
				seen, &to, NULL, 0);
		}
	}
	units_set(rio, k, n, false);
	return kvd_err(r->ctx, -EAGAIN, "ranges: %llu transfer(s) on the "
		       "ranges still in flight after %u ms (a "
		       "kvdmabuf_io_begin_range() without its "
		       "kvdmabuf_io_end_range()?); nothing changed",
		       (unsigned long long)busy, timeout_ms);
}

void kvd_range_io_open(struct kvdmabuf_region *r, const struct kvd_range *k,
		       unsigned int n)
{
	if (r->rio.unit)
		units_set(&r->rio, k, n, false);
}
