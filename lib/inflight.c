// SPDX-License-Identifier: MIT
/*
 * inflight.c - per-region in-flight transfer accounting.
 *
 * Fast path: one atomic add and one atomic load (both sequentially
 * consistent). kvd_io_close() stores closed = 1 before the drain reads the
 * count, and kvd_io_begin() adds to the count before it reads closed, so
 * either the drain sees the transfer or the transfer sees the close (the
 * store-load pattern that needs seq_cst on both sides).
 */
#include <errno.h>
#include <time.h>

#include "internal.h"

int64_t kvd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int kvd_io_begin(struct kvd_inflight *io)
{
	uint64_t prev;

	/* Refuse without touching the count once closed: otherwise threads
	 * retrying io_begin keep the count above zero and starve the drain. */
	if (atomic_load_explicit(&io->closed, memory_order_relaxed))
		return -ESHUTDOWN;
	prev = atomic_fetch_add(&io->count, 1);
	if (atomic_load(&io->closed)) {
		atomic_fetch_sub(&io->count, 1);
		return -ESHUTDOWN;
	}
	if (prev == 0)
		atomic_store_explicit(&io->busy_since_ns, kvd_now_ns(),
				      memory_order_relaxed);
	return 0;
}

void kvd_io_end(struct kvd_inflight *io)
{
	uint64_t cur = atomic_load_explicit(&io->count, memory_order_relaxed);

	/* Never let an unbalanced io_end wrap the count (and hide a real
	 * transfer from the drain): count it and ignore it. */
	do {
		if (cur == 0) {
			atomic_fetch_add(&io->unbalanced, 1);
			return;
		}
	} while (!atomic_compare_exchange_weak(&io->count, &cur, cur - 1));
}

void kvd_io_close(struct kvd_inflight *io)
{
	atomic_store(&io->closed, 1);
}

void kvd_io_open(struct kvd_inflight *io)
{
	atomic_store(&io->closed, 0);
}

uint64_t kvd_io_count(struct kvd_inflight *io)
{
	return atomic_load(&io->count);
}

int kvdmabuf_io_begin(struct kvdmabuf_region *region)
{
	return kvd_io_begin(&region->io);
}

void kvdmabuf_io_end(struct kvdmabuf_region *region)
{
	kvd_io_end(&region->io);
}
