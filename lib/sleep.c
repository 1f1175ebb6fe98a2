// SPDX-License-Identifier: MIT
/*
 * sleep.c - sleep and wake: stop I/O, drain, release / restore every
 * targeted region, all or nothing, idempotent.
 *
 * Sleep runs in two phases so that it can be undone: phase 1 does the
 * reversible steps (deregister, revoke) while the old backing fd is kept;
 * only when every region succeeded, phase 2 closes the old backing fds
 * (cannot fail), after which nothing of ours holds the old memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static bool tag_match(const struct kvdmabuf_region *r, const char *tag)
{
	return !tag || !strcmp(r->tag, tag);
}

static void fd_close(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void region_name(const struct kvdmabuf_region *r, unsigned int idx,
			char *buf, size_t len)
{
	snprintf(buf, len, "region %u (%s, tag '%s', %p+%zu)", idx,
		 kvdmabuf_mode_name(r->mode), r->tag, r->addr, r->len);
}

/* Append a rollback failure to the message of the original error. */
static void note_rollback(struct kvdmabuf_ctx *ctx, const char *saved,
			  const char *what, int rc)
{
	if (snprintf(kvd_msg(ctx), KVD_ERRMAX, "%s; rollback also failed: "
		     "%s (%s)", saved, what, strerror(-rc)) < 0)
		kvd_msg(ctx)[0] = '\0';
}

static void msg_save(struct kvdmabuf_ctx *ctx, char *saved)
{
	memcpy(saved, kvd_msg(ctx), KVD_ERRMAX);
}

static void msg_restore(struct kvdmabuf_ctx *ctx, const char *saved)
{
	memcpy(kvd_msg(ctx), saved, KVD_ERRMAX);
}

/* ---- drain ---- */

static int drain_err(char *msg, size_t len, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int drain_err(char *msg, size_t len, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, len, fmt, ap);
	va_end(ap);
	return rc;
}

/* Longest wait between two looks at the counts and the engine callback. */
#define DRAIN_POLL_NS 1000000

/* Runs without ctx->lock: reports through @msg, not the context message. */
static int drain(struct kvdmabuf_ctx *ctx, struct kvdmabuf_region **t,
		 unsigned int n, char *msg, size_t msglen)
{
	int64_t start = kvd_now_ns();
	int64_t deadline = start + (int64_t)ctx->drain_timeout_ms * 1000000;
	struct kvd_inflight *wait_io;
	uint32_t wait_seen = 0;
	uint64_t total;
	unsigned int i, busy_regions;
	int64_t now, oldest;
	int idle, rc;

	for (;;) {
		total = 0;
		busy_regions = 0;
		oldest = 0;
		wait_io = NULL;
		for (i = 0; i < n; i++) {
			/* 'ended' before the count: a wake-up in between
			 * makes the wait below return at once. */
			uint32_t seen = atomic_load(&t[i]->io.ended);
			uint64_t c = kvd_io_count(&t[i]->io);

			if (c && !wait_io) {
				wait_io = &t[i]->io;
				wait_seen = seen;
			}
			if (c) {
				int64_t s = atomic_load(&t[i]->io.busy_since_ns);

				total += c;
				busy_regions++;
				if (!oldest || s < oldest)
					oldest = s;
			}
		}
		idle = 1;
		if (ctx->drain) {
			rc = ctx->drain(ctx->drain_arg);
			if (rc < 0)
				return drain_err(msg, msglen, rc, "sleep: engine drain "
					       "callback failed: %s; everything "
					       "stays registered and awake",
					       strerror(-rc));
			idle = rc > 0;
		}
		if (!total && idle)
			return 0;
		now = kvd_now_ns();
		if (now >= deadline)
			break;
		/* Woken by the last io_end of a busy region, with no bound
		 * but the drain's own: the count only falls once sleep closed
		 * the region. The engine's callback, if any, is asked again
		 * every millisecond. */
		if (wait_io) {
			int64_t left = deadline - now;

			kvd_io_wait_ended(wait_io, wait_seen,
					  ctx->drain && left > DRAIN_POLL_NS ?
					  DRAIN_POLL_NS : left);
		} else {
			struct timespec ts = { 0, DRAIN_POLL_NS };

			nanosleep(&ts, NULL);
		}
	}
	if (total)
		return drain_err(msg, msglen, -ETIMEDOUT, "sleep: drain timed out after "
			       "%.3f s: %llu transfer(s) still in flight on %u "
			       "region(s), the count above zero without a "
			       "break for %.3f s (a transfer path that misses "
			       "kvdmabuf_io_end()?)%s; everything stays "
			       "registered and awake",
			       (now - start) / 1e9, (unsigned long long)total,
			       busy_regions, (now - oldest) / 1e9,
			       idle ? "" : "; the engine drain callback also "
			       "still reports busy queues");
	return drain_err(msg, msglen, -ETIMEDOUT, "sleep: drain timed out after %.3f s: "
		       "no transfer in flight here, but the engine drain "
		       "callback still reports busy queues; everything stays "
		       "registered and awake", (now - start) / 1e9);
}

/* ---- one region ---- */

/*
 * Revoke at sleep. The module can fail a revoke after making it
 * (-ETIMEDOUT: importers kept mappings of the old backing past the bound;
 * -EINTR is retried by proxy.c): the proxy is then revoked although the
 * step failed, so this region undoes its own step at once by putting the
 * old backing, still open, back behind the proxy (-EEXIST: it never left).
 */
static int revoke_or_restore(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	char saved[KVD_ERRMAX];
	int rc, rc2;

	rc = ctx->ops->proxy_revoke(ctx, r->proxy_fd, ctx->revoke_timeout_ms);
	if (!rc)
		return 0;
	msg_save(ctx, saved);
	/* its ranges (kvdmabuf_region_ranges()) left it no export to put back */
	rc2 = r->backing_fd < 0 ? -ESTALE :
	      ctx->ops->proxy_attach(ctx, r->proxy_fd, r->backing_fd,
				     r->backing_off, 0);
	if (rc2 && rc2 != -EEXIST) {
		note_rollback(ctx, saved, "attach the old backing again", rc2);
		kvd_region_break(r, rc);
	} else {
		msg_restore(ctx, saved);
	}
	return rc;
}

/*
 * Revoke when undoing a wake: -ETIMEDOUT counts as done (the proxy is
 * revoked; the module drops the new backing when its last mapping goes).
 */
static int revoke_for_undo(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	int rc;

	if (r->proxy_fd < 0)
		return 0;
	rc = ctx->ops->proxy_revoke(ctx, r->proxy_fd, ctx->revoke_timeout_ms);
	return rc == -ETIMEDOUT ? 0 : rc;
}

/*
 * Before a revoke: a pin on the proxy that is not the library's own (an
 * engine that registered kvdmabuf_region_dmabuf() itself on a NIC that
 * pins) would make the revoke fail (blocking pin) or, for a revocable
 * pin (irdma, Linux 7.1+), end that MR for good with sleep and wake
 * returning 0. The library's own MRs never pin a FOLLOW region's proxy
 * (measured), and a REREGISTER region's are deregistered by now: every
 * pin left is foreign, and the sleep is refused with its cause.
 */
static int refuse_foreign_pins(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	struct kvd_proxy_info pi;
	int rc;

	rc = ctx->ops->proxy_query(ctx, r->proxy_fd, &pi);
	if (rc)
		return rc;
	if (!pi.nr_pinned && !pi.nr_blocking_pins && !pi.nr_revocable_pins)
		return 0;
	return kvd_err(ctx, -EBUSY, "an importer that is not this library "
		       "pins the proxy (%u pinned, %u of its pins revocable): "
		       "a registration of kvdmabuf_region_dmabuf() on a NIC "
		       "that pins, which a revoke would %s; register such NICs "
		       "through the library (kvdmabuf_nic_add()) or use the "
		       "proxy only on NICs that follow moves", pi.nr_pinned,
		       pi.nr_revocable_pins, pi.nr_revocable_pins ?
		       "end for good" : "not get past");
}

static int sleep_one(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	char saved[KVD_ERRMAX];
	int rc, rc2;

	switch (r->mode) {
	case KVDMABUF_MODE_FOLLOW:
		rc = refuse_foreign_pins(r);
		return rc ? rc : revoke_or_restore(r);
	case KVDMABUF_MODE_REREGISTER:
		rc = kvd_region_dereg_all(r);
		if (rc || r->proxy_fd < 0)
			return rc;
		rc = refuse_foreign_pins(r);
		if (!rc)
			rc = revoke_or_restore(r);
		if (!rc || r->broken)
			return rc;
		msg_save(ctx, saved);
		rc2 = kvd_region_reg_all(r);
		if (rc2) {
			note_rollback(ctx, saved, "register again", rc2);
			kvd_region_break(r, rc2);
		} else {
			msg_restore(ctx, saved);
		}
		return rc;
	default:
		return 0;
	}
}

/* Back to awake on the old backing (kept open by phase 1). */
static int undo_sleep_one(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	int rc;

	switch (r->mode) {
	case KVDMABUF_MODE_FOLLOW:
		if (r->backing_fd < 0)
			return kvd_err(ctx, -ESTALE, "its ranges "
				       "(kvdmabuf_region_ranges()) cannot be "
				       "put back behind its proxy");
		return ctx->ops->proxy_attach(ctx, r->proxy_fd, r->backing_fd,
					      r->backing_off, 0);
	case KVDMABUF_MODE_REREGISTER:
		if (r->proxy_fd >= 0) {
			rc = ctx->ops->proxy_attach(ctx, r->proxy_fd,
						    r->backing_fd,
						    r->backing_off, 0);
			if (rc)
				return rc;
		}
		return kvd_region_reg_all(r);
	default:
		return 0;
	}
}

/*
 * Wake @r on its new memory @fd (-1 for host memory; taken: kept as the
 * backing or closed). A failed wake undoes its own steps: the region
 * stays asleep.
 */
static int wake_on(struct kvdmabuf_region *r, int fd, uint64_t off)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	const struct kvd_ops *ops = ctx->ops;
	char saved[KVD_ERRMAX];
	int rc, rc2;

	r->wake_key_gen = r->key_gen;
	memcpy(r->wake_last, r->last, sizeof(r->wake_last));
	if (r->proxy_fd >= 0) {
		kvd_region_label(r);    /* the mapping may have changed */
		rc = ops->proxy_attach(ctx, r->proxy_fd, fd, off, 0);
		if (rc) {
			fd_close(&fd);
			return rc;
		}
	}
	r->backing_fd = fd;
	r->backing_off = off;
	if (r->mode == KVDMABUF_MODE_FOLLOW || r->mode == KVDMABUF_MODE_ODP)
		return 0;       /* the NIC follows: keys unchanged */
	rc = kvd_region_reg_all(r);
	if (!rc)
		return 0;
	msg_save(ctx, saved);
	rc2 = revoke_for_undo(r);
	if (rc2) {
		note_rollback(ctx, saved, "revoke", rc2);
		kvd_region_break(r, rc2);
	} else {
		msg_restore(ctx, saved);
	}
	fd_close(&r->backing_fd);
	return rc;
}

static int wake_one(struct kvdmabuf_region *r)
{
	int fd = -1, rc;
	uint64_t off = 0;

	if (r->mode == KVDMABUF_MODE_NOREG)
		return 0;
	if (r->mem != KVDMABUF_MEM_HOST) {
		rc = r->ctx->ops->export_dmabuf(r->ctx, r, &fd, &off);
		if (rc)
			return kvd_err_prefix(r->ctx, rc, "export");
	}
	return wake_on(r, fd, off);
}

/*
 * Back to asleep: nothing of the new memory kept, and the keys the engine
 * knows are the ones it had (the new ones were never published). A region
 * that cannot get there is broken: awake on memory the engine is about to
 * release is the one state we must not leave it in silently.
 */
static int undo_wake_one(struct kvdmabuf_region *r)
{
	int rc = 0;

	if (r->mode == KVDMABUF_MODE_NOREG)
		return 0;
	if (r->mode == KVDMABUF_MODE_REREGISTER)
		rc = kvd_region_dereg_all(r);
	if (!rc)
		rc = revoke_for_undo(r);
	/* Ours is one reference among the module's: never keep it. */
	fd_close(&r->backing_fd);
	if (rc) {
		kvd_region_break(r, rc);
		return rc;
	}
	r->key_gen = r->wake_key_gen;
	memcpy(r->last, r->wake_last, sizeof(r->last));
	r->keys_changed = false;
	return 0;
}

/* ---- targets ---- */

static int targets(struct kvdmabuf_ctx *ctx, const char *tag, bool asleep,
		   struct kvdmabuf_region ***tp, unsigned int **idxp,
		   unsigned int *np)
{
	unsigned int i, n = 0;

	*tp = calloc(ctx->nr_regions + 1, sizeof(**tp));
	*idxp = calloc(ctx->nr_regions + 1, sizeof(**idxp));
	if (!*tp || !*idxp) {
		free(*tp);
		free(*idxp);
		return kvd_err(ctx, -ENOMEM, "out of memory");
	}
	for (i = 0; i < ctx->nr_regions; i++) {
		struct kvdmabuf_region *r = ctx->regions[i];

		if (r->mode == KVDMABUF_MODE_HOST || r->asleep != asleep ||
		    r->broken || !tag_match(r, tag))
			continue;
		(*idxp)[n] = i;
		(*tp)[n++] = r;
	}
	*np = n;
	return 0;
}

/*
 * Runs @step on every target; when region k fails (a failing step leaves
 * its own region as it was, or broken), undoes regions k-1..0 (newest
 * first) and returns its error, the message naming the failed region and
 * any undo that failed as well (that region is then broken).
 */
static int all_or_nothing(struct kvdmabuf_ctx *ctx, const char *what,
			  struct kvdmabuf_region **t, const unsigned int *idx,
			  unsigned int n, int (*step)(struct kvdmabuf_region *),
			  int (*undo)(struct kvdmabuf_region *))
{
	char name[160], saved[KVD_ERRMAX];
	unsigned int k, j;
	int rc, rc2;

	for (k = 0; k < n; k++) {
		rc = step(t[k]);
		if (!rc)
			continue;
		region_name(t[k], idx[k], name, sizeof(name));
		kvd_err_prefix(ctx, rc, "%s: %s%s", what, name,
			       t[k]->broken ? " (now broken)" : "");
		msg_save(ctx, saved);
		for (j = k; j-- > 0;) {
			rc2 = undo(t[j]);
			if (rc2) {
				if (!t[j]->broken)
					kvd_region_break(t[j], rc2);
				region_name(t[j], idx[j], name, sizeof(name));
				strncat(name, " (now broken)",
					sizeof(name) - strlen(name) - 1);
				note_rollback(ctx, saved, name, rc2);
				msg_save(ctx, saved);
			}
		}
		msg_restore(ctx, saved);
		return rc;
	}
	return 0;
}

/*
 * The engine's sleep-start callback, then the drain: both with the lock
 * released (ctx busy), so that a transfer path may read its keys or the
 * state before its io_end and a callback may call the getters.
 */
static int quiesce(struct kvdmabuf_ctx *ctx, struct kvdmabuf_region **t,
		   unsigned int n)
{
	char msg[KVD_ERRMAX];
	int rc = 0;

	pthread_mutex_unlock(&ctx->lock);
	if (ctx->sleep_begin) {
		rc = ctx->sleep_begin(t, n, ctx->sleep_begin_arg);
		if (rc >= 0)
			rc = 0;
		else
			snprintf(msg, sizeof(msg), "sleep: the engine's sleep-"
				 "start callback failed: %s; everything stays "
				 "registered and awake", strerror(-rc));
	}
	if (!rc)
		rc = drain(ctx, t, n, msg, sizeof(msg));
	pthread_mutex_lock(&ctx->lock);
	if (rc)
		kvd_err(ctx, rc, "%s", msg);
	return rc;
}

/* The environment may have changed since open (a transport set to NVLink
 * later): the gate answers for each sleep. */
static int sleep_gate(struct kvdmabuf_ctx *ctx)
{
	char reason[KVD_ERRMAX];

	if (kvd_gate_check(&ctx->cfg, reason, sizeof(reason)) == 1)
		return 0;
	return kvd_err(ctx, -EPROTONOSUPPORT, "sleep: %s", reason);
}

/* Sleep of the @n (> 0) awake regions @t, ctx locked and not busy. */
static int sleep_set(struct kvdmabuf_ctx *ctx, struct kvdmabuf_region **t,
		     const unsigned int *idx, unsigned int n)
{
	unsigned int k;
	int rc;

	/* Under libkvdmabuf-preload.so: an engine registration of this
	 * memory that cannot follow refuses the sleep before anything
	 * stops or is released. */
	for (k = 0; k < n; k++) {
		rc = kvd_preload_check(t[k]);
		if (rc)
			return rc;
	}

	kvd_busy_begin(ctx);
	for (k = 0; k < n; k++)
		kvd_io_close(&t[k]->io);
	rc = quiesce(ctx, t, n);
	if (rc)
		goto reopen;
	rc = all_or_nothing(ctx, "sleep", t, idx, n, sleep_one, undo_sleep_one);
	if (rc)
		goto reopen;
	/* phase 2: drop the old memory; cannot fail */
	for (k = 0; k < n; k++) {
		fd_close(&t[k]->backing_fd);
		t[k]->asleep = true;
	}
	ctx->sleeps++;
	kvd_fire_key_callbacks(ctx, t, n);
	goto out;

reopen:
	/* A rollback may have made new keys: they reach the engine before
	 * any transfer may begin, as at wake. */
	kvd_fire_key_callbacks(ctx, t, n);
	for (k = 0; k < n; k++)
		kvd_region_unretire(t[k]);
out:
	kvd_busy_end(ctx);
	return rc;
}

/*
 * The entry of kvdmabuf_sleep() (@asleep false: the targets are the awake
 * regions of @tag) and kvdmabuf_wake() (true: the asleep ones): 0 with ctx
 * locked and the targets in @tp, @idxp, @np (leave() frees them), else the
 * error with ctx unlocked.
 */
static int enter(struct kvdmabuf_ctx *ctx, const char *what, const char *tag,
		 bool asleep, struct kvdmabuf_region ***tp,
		 unsigned int **idxp, unsigned int *np)
{
	int rc;

	if (!ctx)
		return -EINVAL;
	rc = kvd_not_forked(ctx, what);
	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->lock);
	rc = kvd_may_change(ctx, what);
	if (!rc)
		rc = targets(ctx, tag, asleep, tp, idxp, np);
	if (rc)
		pthread_mutex_unlock(&ctx->lock);
	return rc;
}

static int leave(struct kvdmabuf_ctx *ctx, struct kvdmabuf_region **t,
		 unsigned int *idx, int rc)
{
	free(t);
	free(idx);
	pthread_mutex_unlock(&ctx->lock);
	return rc;
}

int kvdmabuf_sleep(struct kvdmabuf_ctx *ctx, const char *tag)
{
	struct kvdmabuf_region **t;
	unsigned int *idx, n;
	int rc;

	rc = enter(ctx, "sleep", tag, false, &t, &idx, &n);
	if (rc)
		return rc;
	rc = sleep_gate(ctx);
	if (!rc && n)   /* !n: nothing awake to put to sleep */
		rc = sleep_set(ctx, t, idx, n);
	return leave(ctx, t, idx, rc);
}

/*
 * prefetch_at_wake: the NICs map what @r's MRs follow now, so that the
 * first transfer does not (the cost moves into the wake). A hint: a NIC
 * that cannot (EOPNOTSUPP) or fails maps at the first access as it would
 * have; kvdmabuf_state counts both.
 */
static void prefetch(struct kvdmabuf_region *r)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	unsigned int i;

	if (!ctx->cfg.prefetch_at_wake ||
	    (r->mode != KVDMABUF_MODE_FOLLOW && r->mode != KVDMABUF_MODE_ODP))
		return;
	for (i = 0; i < ctx->nr_nics; i++) {
		if (!r->mr[i].handle)
			continue;
		ctx->prefetches++;
		if (!ctx->ops->prefetch || ctx->ops->prefetch(ctx, i, &r->mr[i]))
			ctx->prefetch_failures++;
	}
}

/* The @n regions @t woke (ctx busy): awake, mapped, keys out, I/O open. */
static void woken(struct kvdmabuf_ctx *ctx, struct kvdmabuf_region **t,
		  unsigned int n)
{
	unsigned int k;

	for (k = 0; k < n; k++) {
		t[k]->asleep = false;
		prefetch(t[k]);
	}
	ctx->wakes++;
	/* New keys reach the engine before any transfer may begin. */
	kvd_fire_key_callbacks(ctx, t, n);
	for (k = 0; k < n; k++)
		kvd_io_open(&t[k]->io);
}

int kvdmabuf_wake(struct kvdmabuf_ctx *ctx, const char *tag)
{
	struct kvdmabuf_region **t;
	unsigned int *idx, n;
	int rc;

	rc = enter(ctx, "wake", tag, true, &t, &idx, &n);
	if (rc)
		return rc;
	if (!n)         /* nothing asleep */
		return leave(ctx, t, idx, 0);
	kvd_busy_begin(ctx);
	/* On failure: still asleep, I/O still stopped, keys as before. */
	rc = all_or_nothing(ctx, "wake", t, idx, n, wake_one, undo_wake_one);
	if (!rc)
		woken(ctx, t, n);
	kvd_busy_end(ctx);
	return leave(ctx, t, idx, rc);
}

/* ---- one region, the engine's own unmap or map (interpose.c) ---- */

static unsigned int region_index(const struct kvdmabuf_region *r)
{
	unsigned int i;

	for (i = 0; i < r->ctx->nr_regions; i++)
		if (r->ctx->regions[i] == r)
			break;
	return i;
}

int kvd_sleep_region(struct kvdmabuf_region *r)
{
	unsigned int idx;
	int rc;

	rc = sleep_gate(r->ctx);
	/* asleep already (kvdmabuf_sleep): nothing maps the memory */
	if (rc || r->asleep || r->mode == KVDMABUF_MODE_HOST)
		return rc;
	idx = region_index(r);
	return sleep_set(r->ctx, &r, &idx, 1);
}

int kvd_wake_region(struct kvdmabuf_region *r, int dmabuf_fd,
		    const char *what)
{
	struct kvdmabuf_ctx *ctx = r->ctx;
	int rc, fd;

	/* awake already (kvdmabuf_wake): its backing is what it exported */
	if (!r->asleep || r->mode == KVDMABUF_MODE_NOREG)
		return 0;
	kvd_busy_begin(ctx);
	if (r->mem == KVDMABUF_MEM_CUDA) {
		/*
		 * The library's own export, as kvdmabuf_wake() makes it: its
		 * cuda_dmabuf_mapping, the mapping recorded for region_info,
		 * its check that every mapping is GPUDirect RDMA capable.
		 * The preload's (@dmabuf_fd) stays the preload's.
		 */
		rc = wake_one(r);
	} else {
		fd = fcntl(dmabuf_fd, F_DUPFD_CLOEXEC, 0);
		rc = fd < 0 ? kvd_err(ctx, -errno, "dup of the new memory's "
				      "dma-buf: %s", strerror(errno)) :
		     wake_on(r, fd, 0);
	}
	if (rc)
		kvd_err_prefix(ctx, rc, "%s: region %u", what,
			       region_index(r));
	else
		woken(ctx, &r, 1);
	kvd_busy_end(ctx);
	return rc;
}
