// SPDX-License-Identifier: MIT
/*
 * inflight.c - per-region in-flight transfer accounting.
 *
 * The count and the closed flag share one atomic word, so that the order
 * between a transfer's io_begin and a sleep's close is the order of two
 * read-modify-writes on that word: either io_begin's add comes first and
 * the drain, which reads the word after the close, sees the transfer; or
 * the close comes first and io_begin sees KVD_IO_CLOSED in the value it
 * added to, and backs out. The fast path is one relaxed load and one
 * fetch_add; a closed region is refused without touching the word, so
 * threads retrying io_begin cannot keep the count above zero and starve
 * the drain.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

int64_t kvd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CLOCK_MONOTONIC_COARSE: same time base as kvd_now_ns(), tick resolution. */
static int64_t kvd_coarse_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int kvd_io_begin(struct kvd_inflight *io)
{
	uint64_t old;

	if (atomic_load_explicit(&io->word, memory_order_relaxed) &
	    KVD_IO_CLOSED)
		return -ESHUTDOWN;
	old = atomic_fetch_add(&io->word, 1);
	if (old & KVD_IO_CLOSED) {
		atomic_fetch_sub(&io->word, 1);
		return -ESHUTDOWN;
	}
	/* Diagnostics only (how long a drain waited): the coarse clock,
	 * a few ns instead of ~30 on the path of every first transfer. */
	if (old == 0)
		atomic_store_explicit(&io->busy_since_ns, kvd_coarse_ns(),
				      memory_order_relaxed);
	return 0;
}

void kvd_io_end(struct kvd_inflight *io)
{
	uint64_t cur = atomic_load_explicit(&io->word, memory_order_relaxed);
	bool waker = false;

	for (;;) {
		/* Never let an unbalanced io_end wrap the count (and hide a
		 * real transfer from the drain): count it and ignore it. */
		if (!(cur & ~KVD_IO_CLOSED)) {
			atomic_fetch_add(&io->unbalanced, 1);
			break;
		}
		/* On a closed region the last io_end wakes the drain after
		 * its decrement, when sleep and remove may already proceed:
		 * say so first, and the region is not freed under us. */
		if ((cur & KVD_IO_CLOSED) && !waker) {
			atomic_fetch_add(&io->wakers, 1);
			waker = true;
			cur = atomic_load(&io->word);
			continue;
		}
		if (atomic_compare_exchange_weak(&io->word, &cur, cur - 1)) {
			/* Only then is there a system call; the awake path
			 * stays one CAS. */
			if ((cur & KVD_IO_CLOSED) &&
			    (cur & ~KVD_IO_CLOSED) == 1) {
				atomic_fetch_add(&io->ended, 1);
				syscall(SYS_futex, &io->ended,
					FUTEX_WAKE_PRIVATE, INT_MAX, NULL,
					NULL, 0);
			}
			break;
		}
	}
	if (waker)
		atomic_fetch_sub(&io->wakers, 1);       /* last touch of *io */
}

void kvd_io_quiesce(struct kvd_inflight *io)
{
	while (atomic_load(&io->wakers))
		sched_yield();
}

void kvd_io_wait_ended(struct kvd_inflight *io, uint32_t seen, int64_t ns)
{
	struct timespec to = { ns / 1000000000, ns % 1000000000 };

	/* Returns at once if 'ended' already moved (no lost wake-up). */
	syscall(SYS_futex, &io->ended, FUTEX_WAIT_PRIVATE, seen, &to, NULL, 0);
}

bool kvd_io_close(struct kvd_inflight *io)
{
	return atomic_fetch_or(&io->word, KVD_IO_CLOSED) & KVD_IO_CLOSED;
}

void kvd_io_open(struct kvd_inflight *io)
{
	atomic_fetch_and(&io->word, ~KVD_IO_CLOSED);
}

uint64_t kvd_io_count(struct kvd_inflight *io)
{
	return atomic_load(&io->word) & ~KVD_IO_CLOSED;
}

int kvdmabuf_io_begin(struct kvdmabuf_region *region)
{
	return kvd_io_begin(&region->io);
}

void kvdmabuf_io_end(struct kvdmabuf_region *region)
{
	kvd_io_end(&region->io);
}

int kvdmabuf_io_begin_many(struct kvdmabuf_region *const *regions,
			   unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++)
		if (kvd_io_begin(&regions[i]->io)) {
			while (i--)
				kvd_io_end(&regions[i]->io);
			return -ESHUTDOWN;
		}
	return 0;
}

void kvdmabuf_io_end_many(struct kvdmabuf_region *const *regions,
			  unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++)
		kvd_io_end(&regions[i]->io);
}
