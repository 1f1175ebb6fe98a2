// SPDX-License-Identifier: MIT
/*
 * busy.c - who may change a context now: not a forked child (its MRs and
 * proxies are the parent's), not a second thread while a sleep or wake
 * runs with the lock released, not a callback of that sleep or wake.
 * Below the regions: every file that changes a region asks here first.
 */
#include <errno.h>
#include <unistd.h>

#include "internal.h"

/* Before the lock: a forked child may have inherited it held. */
int kvd_not_forked(struct kvdmabuf_ctx *ctx, const char *what)
{
	if (ctx->pid == getpid())
		return 0;
	return kvd_err(ctx, -EPERM, "%s: this context was opened by process "
		       "%d; a forked child cannot use it (its MRs and proxies "
		       "are the parent's)", what, (int)ctx->pid);
}

int kvd_may_change(struct kvdmabuf_ctx *ctx, const char *what)
{
	if (ctx->busy && pthread_equal(ctx->busy_thread, pthread_self()))
		return kvd_err(ctx, -EDEADLK, "%s from a callback", what);
	if (ctx->busy)
		return kvd_err(ctx, -EBUSY, "%s while a sleep or wake runs in "
			       "another thread", what);
	return 0;
}

void kvd_busy_begin(struct kvdmabuf_ctx *ctx)
{
	ctx->busy = true;
	ctx->busy_thread = pthread_self();
}

void kvd_busy_end(struct kvdmabuf_ctx *ctx)
{
	ctx->busy = false;
}
