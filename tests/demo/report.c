// SPDX-License-Identifier: GPL-2.0
/*
 * report.c - the demo's table and verdict. Every figure printed was
 * measured in this run; the verdict only compares measured figures.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo.h"

struct demo_row *demo_row(struct demo_results *r, const char *group,
			  const char *phase)
{
	unsigned int i;

	for (i = 0; i < r->nr_rows; i++)
		if (!strcmp(r->rows[i].group, group) &&
		    !strcmp(r->rows[i].phase, phase))
			return &r->rows[i];
	if (r->nr_rows == DEMO_MAX_ROWS) {
		r->dropped_rows++;
		return NULL;
	}
	r->rows[r->nr_rows].group = group;
	r->rows[r->nr_rows].phase = phase;
	return &r->rows[r->nr_rows++];
}

struct demo_memrow *demo_memrow(struct demo_results *r, const char *label)
{
	unsigned int i;

	for (i = 0; i < r->nr_mem; i++)
		if (!strcmp(r->mem[i].label, label))
			return &r->mem[i];
	if (r->nr_mem == DEMO_MAX_MEMROWS) {
		r->dropped_mem++;
		return NULL;
	}
	r->mem[r->nr_mem].label = label;
	return &r->mem[r->nr_mem++];
}

/* ---- verdict bookkeeping ---- */

struct verdict {
	bool ok;
	char why[2048];
	size_t len;
};

static void fail(struct verdict *v, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void fail(struct verdict *v, const char *fmt, ...)
{
	va_list ap;
	int n;

	v->ok = false;
	if (v->len + 4 >= sizeof(v->why))
		return;
	if (v->len) {
		memcpy(v->why + v->len, "; ", 3);
		v->len += 2;
	}
	va_start(ap, fmt);
	n = vsnprintf(v->why + v->len, sizeof(v->why) - v->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		v->len += (size_t)n;
	if (v->len >= sizeof(v->why))
		v->len = sizeof(v->why) - 1;
}

/* The name of pass @p: the move-capable column is rxedb or umem. */
static const char *pass_name(const struct demo_results *r, unsigned int p)
{
	static const char *const names[DEMO_NR_PASSES] = {
		"rxe kvdmabuf", "rxe baseline", "umem kvdmabuf",
		"umem baseline",
	};

	if (p >= 2 && r->move_kind == DEMO_NIC_RXEDB)
		return p % 2 ? "rxedb baseline" : "rxedb kvdmabuf";
	return names[p];
}

/* Pass @p was left out on request: the pinning NIC's, --move-capable-only. */
static bool left_out(const struct demo_results *r, unsigned int p)
{
	return r->move_only && p / 2 == DEMO_NIC_RXE;
}

static void cell(char *buf, size_t len, const struct demo_row *r,
		 unsigned int pass)
{
	const struct demo_count *c = &r->c[pass];

	if (!r->used[pass])
		snprintf(buf, len, "-");
	else if (c->errors)
		snprintf(buf, len, "%u/%u e%u", c->ok, c->total, c->errors);
	else
		snprintf(buf, len, "%u/%u", c->ok, c->total);
}

static long mib(long kb)
{
	return (kb + (kb >= 0 ? 512 : -512)) / 1024;
}

/* Two system-wide Shmem figures agree: within a MiB (other processes'
 * tmpfs files move it meanwhile; a held KV region is many MiB). */
static bool within_mib(long a_kb, long b_kb)
{
	return labs(a_kb - b_kb) <= 1024;
}

static void memcell(char *buf, size_t len, const struct demo_mem *m)
{
	if (!m->valid)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%ld / %ld / %ld", mib(m->pin_kb),
			 mib(m->res_kb), mib(m->held_kb));
}

#define COLS "%-40s %10s %10s   %10s %10s\n"

static void print_rows(struct demo_results *r, struct verdict *v,
		       struct demo_count *tot)
{
	const char *group = NULL;
	unsigned int i, p, bug[DEMO_NR_PASSES][2];
	char c[DEMO_NR_PASSES][32];

	memset(bug, 0, sizeof(bug));
	bool rxedb = r->move_kind == DEMO_NIC_RXEDB;

	printf("\n%-40s %21s   %21s\n", "", "soft-RoCE: pins,",
	       rxedb ? "soft-RoCE dma-buf MR," : "kvd_umem: dma-buf MR,");
	printf("%-40s %21s   %21s\n", "", "keys change", rxedb ?
	       "follows, same keys" : "moves, same keys");
	printf(COLS, "phase (8 prompts each)", "kvdmabuf", "baseline",
	       "kvdmabuf", "baseline");
	for (i = 0; i < r->nr_rows; i++) {
		const struct demo_row *w = &r->rows[i];

		if (!group || strcmp(group, w->group)) {
			group = w->group;
			if (!strcmp(group, "sleep/wake cycles"))
				printf("%s (%u)\n", group, r->plain_cycles);
			else
				printf("%s\n", group);
		}
		for (p = 0; p < DEMO_NR_PASSES; p++)
			cell(c[p], sizeof(c[p]), w, p);
		printf("  %-38s %10s %10s   %10s %10s%s\n", w->phase, c[0],
		       c[1], c[2], c[3], w->gate ? "  (gate)" : "");
		for (p = 0; p < DEMO_NR_PASSES; p++) {
			const struct demo_count *x = &w->c[p];

			if (!w->used[p])
				continue;
			/* every block the phase ran was counted */
			if (r->pass_done[p] &&
			    x->total != w->expect_runs * DEMO_PROMPTS)
				fail(v, "%s: %s / %s: %u blocks counted, the "
				     "phase runs %u x %u", pass_name(r, p),
				     w->group, w->phase, x->total,
				     w->expect_runs, DEMO_PROMPTS);
			if (p % 2 == 0 && (x->ok != x->total || x->errors))
				fail(v, "%s: %s / %s: %u/%u correct, %u "
				     "transfer errors", pass_name(r, p),
				     w->group, w->phase, x->ok, x->total,
				     x->errors);
			if (w->gate)
				continue;	/* refusals, not data */
			tot[p].ok += x->ok;
			tot[p].errors += x->errors;
			tot[p].total += x->total;
			if (p % 2 == 0)
				continue;
			if (!w->expect_bug && x->ok != x->total)
				fail(v, "%s already wrong before any sleep "
				     "(%s: %u/%u): the setup is broken",
				     pass_name(r, p), w->phase, x->ok,
				     x->total);
			/* the bug: wrong bytes, delivered without an error */
			if (w->expect_bug)
				bug[p][w->who == 'B'] += x->total - x->ok -
							 x->errors;
		}
	}
	for (p = 0; p < DEMO_NR_PASSES; p++)
		snprintf(c[p], sizeof(c[p]), "%u/%u", tot[p].ok,
			 tot[p].total);
	printf(COLS, "all data blocks (gate row not counted)", c[0], c[1],
	       c[2], c[3]);
	for (p = 0; p < DEMO_NR_PASSES; p++)
		snprintf(c[p], sizeof(c[p]), "%u", tot[p].total - tot[p].ok -
			 tot[p].errors);
	printf(COLS, "  wrong, delivered without any error", c[0], c[1],
	       c[2], c[3]);
	for (p = 0; p < DEMO_NR_PASSES; p++)
		snprintf(c[p], sizeof(c[p]), "%llu",
			 (unsigned long long)r->xfer_errors[p]);
	printf(COLS, "  transfer errors (puts and gets)", c[0], c[1], c[2],
	       c[3]);
	for (p = 0; p < DEMO_NR_PASSES; p++) {
		if (p % 2 == 0) {
			if (r->xfer_errors[p])
				fail(v, "%s: %llu transfer errors",
				     pass_name(r, p),
				     (unsigned long long)r->xfer_errors[p]);
			continue;
		}
		if (!r->pass_done[p])
			continue;
		/* silent: the baseline's wrong blocks came with no error at
		 * all, or it is not the bug the seed measured */
		if (r->xfer_errors[p])
			fail(v, "%s: %llu transfer errors (the bug is wrong "
			     "data delivered without any error)",
			     pass_name(r, p),
			     (unsigned long long)r->xfer_errors[p]);
		if (!bug[p][0])
			fail(v, "%s did not reproduce wrong blocks delivered "
			     "silently on A after a wake", pass_name(r, p));
		if (!bug[p][1])
			fail(v, "%s did not reproduce wrong blocks delivered "
			     "silently on B (A's stale puts, A's stale key)",
			     pass_name(r, p));
	}
}

/*
 * The stress run's drift: free memory after its first and its last wake,
 * minutes of transfers apart (page cache and slab of the whole guest).
 */
#define STRESS_HELD_SLACK_KB (8 * 1024)

static void print_mem(struct demo_results *r, struct verdict *v,
		      long *asleep_base)
{
	unsigned int i, p;
	char a[64], s[64], w[64];

	printf("\nmemory of engine A, MiB: pinned (VmPin) / resident (rxe: "
	       "its regions' pages, mincore; %s: Shmem its vgem buffers "
	       "add) / held (drop in free memory)\n",
	       r->move_kind == DEMO_NIC_RXEDB ? "rxedb" : "umem");
	printf("%-37s %-16s %-16s %-16s\n", "", "awake", "asleep",
	       "after wake");
	for (i = 0; i < r->nr_mem; i++) {
		const struct demo_memrow *m = &r->mem[i];

		for (p = 0; p < DEMO_NR_PASSES; p++) {
			const struct demo_mem *x = m->m[p];
			unsigned int nic = p / 2;
			long exp_pin = m->expect_asleep_pin_kb[nic];
			long exp_res = m->expect_asleep_res_kb[nic];
			long kept;

			memcell(a, sizeof(a), &x[DEMO_M_AWAKE]);
			memcell(s, sizeof(s), &x[DEMO_M_ASLEEP]);
			memcell(w, sizeof(w), &x[DEMO_M_WOKE]);
			printf("%-22s %-14s %-16s %-16s %-16s\n",
			       p ? "" : m->label, pass_name(r, p), a, s, w);
			if (!x[DEMO_M_ASLEEP].valid || !x[DEMO_M_AWAKE].valid)
				continue;
			if (p % 2) {
				/* baseline: the old memory stays, pinned on
				 * rxe; on the move-capable NIC the first
				 * cycle's is still held in later cycles,
				 * whose sleeps free their own memory */
				long extra = nic == DEMO_NIC_RXE ?
					x[DEMO_M_ASLEEP].pin_kb - exp_pin :
					x[DEMO_M_ASLEEP].held_kb - exp_res;

				if (extra <= (nic == DEMO_NIC_RXE ? 0 :
					      m->sleep_kb / 2))
					fail(v, "%s: %s: nothing held while "
					     "asleep (bug not reproduced)",
					     pass_name(r, p), m->label);
				if (extra > asleep_base[nic])
					asleep_base[nic] = extra;
				continue;
			}
			/* kvdmabuf: nothing of the sleeping regions held
			 * (umem: resident is a system-wide Shmem figure:
			 * within a MiB) */
			if (x[DEMO_M_ASLEEP].pin_kb != exp_pin ||
			    (nic == DEMO_NIC_RXE ?
			     x[DEMO_M_ASLEEP].res_kb != exp_res :
			     !within_mib(x[DEMO_M_ASLEEP].res_kb, exp_res)))
				fail(v, "%s: %s: asleep %ld KiB pinned, %ld "
				     "KiB resident (expected %ld, %ld)",
				     pass_name(r, p), m->label,
				     x[DEMO_M_ASLEEP].pin_kb,
				     x[DEMO_M_ASLEEP].res_kb, exp_pin, exp_res);
			if (x[DEMO_M_WOKE].valid &&
			    (x[DEMO_M_WOKE].pin_kb != x[DEMO_M_AWAKE].pin_kb ||
			     (nic == DEMO_NIC_RXE ?
			      x[DEMO_M_WOKE].res_kb != x[DEMO_M_AWAKE].res_kb :
			      !within_mib(x[DEMO_M_WOKE].res_kb,
					  x[DEMO_M_AWAKE].res_kb))))
				fail(v, "%s: %s: after wake %ld/%ld KiB "
				     "pinned/resident, before sleep %ld/%ld",
				     pass_name(r, p), m->label,
				     x[DEMO_M_WOKE].pin_kb,
				     x[DEMO_M_WOKE].res_kb,
				     x[DEMO_M_AWAKE].pin_kb,
				     x[DEMO_M_AWAKE].res_kb);
			/* what free memory did not get back of them */
			kept = m->sleep_kb - (x[DEMO_M_AWAKE].held_kb -
					      x[DEMO_M_ASLEEP].held_kb);
			if (kept > DEMO_FREED_SLACK_KB)
				fail(v, "%s: %s: the sleep gave %ld KiB back "
				     "to free memory of the %ld KiB that sleep",
				     pass_name(r, p), m->label,
				     m->sleep_kb - kept, m->sleep_kb);
		}
	}
}

static void print_keys(struct demo_results *r, struct verdict *v)
{
	const struct demo_keys *k;
	unsigned int p;

	printf("\nkeys of A's kv_cache, as B and the store hold them:\n");
	for (p = 0; p < DEMO_NR_PASSES; p++) {
		k = &r->keys[p];
		if (!r->pass_done[p])
			continue;
		printf("  %-14s key 0x%x -> 0x%x, generation %llu -> %llu "
		       "over %llu wakes, republished %llu times%s%s\n",
		       pass_name(r, p), k->rkey_first, k->rkey_last,
		       (unsigned long long)k->gen_first,
		       (unsigned long long)k->gen_last,
		       (unsigned long long)k->wakes,
		       (unsigned long long)k->republished,
		       p % 2 ? "" : ", mode ",
		       p % 2 ? "" : r->mode[p / 2][0] ? r->mode[p / 2] : "?");
		if (k->stale_tried)
			printf("  %-14s B's previous key after each wake: %u/%u "
			       "refused with an access error (%s), %u blocks "
			       "of old pages read\n", "", k->stale_refused,
			       k->stale_tried, k->stale_status,
			       k->stale_delivered);
		if (k->probe_tried)
			printf("  %-14s keys not A's (deregistered, foreign) at "
			       "A's address after each cycle: %u/%u refused by "
			       "the remote access check (%s), %u blocks "
			       "delivered\n", "", k->probe_refused,
			       k->probe_tried, k->probe_refused ==
			       k->probe_tried ? "remote access error" :
			       k->probe_status, k->probe_delivered);
	}
	/* rxe kvdmabuf: REREGISTER, keys change and stale ones fail */
	k = &r->keys[0];
	if (r->pass_done[0]) {
		if (strcmp(r->mode[DEMO_NIC_RXE], "reregister"))
			fail(v, "rxe kvdmabuf: mode '%s', expected reregister",
			     r->mode[DEMO_NIC_RXE]);
		if (k->gen_last == k->gen_first || !k->stale_tried)
			fail(v, "rxe kvdmabuf: A's keys never changed at a "
			     "wake");
		if (k->stale_refused != k->stale_tried || k->stale_delivered)
			fail(v, "rxe kvdmabuf: stale key: %u/%u refused, %u "
			     "blocks of old pages read", k->stale_refused,
			     k->stale_tried, k->stale_delivered);
	}
	/* the move-capable NIC: FOLLOW, the same key throughout */
	k = &r->keys[2];
	if (r->pass_done[2]) {
		if (strcmp(r->mode[DEMO_NIC_UMEM], "follow"))
			fail(v, "%s: mode '%s', expected follow",
			     pass_name(r, 2), r->mode[DEMO_NIC_UMEM]);
		if (k->gen_last != k->gen_first || k->rkey_last != k->rkey_first
		    || !k->wakes)
			fail(v, "%s: A's key changed (FOLLOW keeps it)",
			     pass_name(r, 2));
	}
	/* rxedb: keys that are not A's are refused on the wire, two
	 * (deregistered, foreign) after each cycle: the plain ones, the
	 * selective wake, the KV-only release */
	if (r->pass_done[2] && r->move_kind == DEMO_NIC_RXEDB &&
	    (k->probe_tried != 2 * (r->plain_cycles + 2) ||
	     k->probe_refused != k->probe_tried || k->probe_delivered))
		fail(v, "%s: keys not A's: %u/%u refused by the remote access "
		     "check over %u cycles, %u blocks delivered",
		     pass_name(r, 2), k->probe_refused, k->probe_tried,
		     r->plain_cycles + 2, k->probe_delivered);
}

static void print_stress(struct demo_results *r, struct verdict *v,
			 unsigned int nic)
{
	struct demo_stress *s = &r->stress[nic];
	const char *name = pass_name(r, nic * 2);

	if (!r->pass_done[nic * 2])
		return;
	if (!s->ran) {
		fail(v, "%s: stress did not run", name);
		return;
	}
	printf("\nstress (%s): %llu transfers begun on 4 threads up to "
	       "%llu sleeps, %llu completed correct, %llu failed, %llu wrong "
	       "-> %llu lost; up to %llu in flight when a sleep began, "
	       "%llu refused once closed\n", name,
	       (unsigned long long)s->begun, (unsigned long long)s->sleeps,
	       (unsigned long long)s->completed, (unsigned long long)s->failed,
	       (unsigned long long)s->wrong,
	       (unsigned long long)(s->begun - s->completed),
	       (unsigned long long)s->inflight_at_sleep,
	       (unsigned long long)s->refused);
	if (s->qp_errors)
		printf("  stress QPs found in the error state right after a "
		       "sleep (their transfers had all completed): %llu\n",
		       (unsigned long long)s->qp_errors);
	printf("  memory after the first / last wake: pinned %ld / %ld MiB, "
	       "resident %ld / %ld MiB, held %ld / %ld MiB\n",
	       mib(s->pin_first_kb), mib(s->pin_last_kb), mib(s->res_first_kb),
	       mib(s->res_last_kb), mib(s->held_first_kb),
	       mib(s->held_last_kb));
	if (s->failed || s->wrong || s->begun != s->completed)
		fail(v, "%s: stress: of %llu transfers, %llu lost, %llu "
		     "failed, %llu wrong", name, (unsigned long long)s->begun,
		     (unsigned long long)(s->begun - s->completed),
		     (unsigned long long)s->failed,
		     (unsigned long long)s->wrong);
	if (!s->begun)
		fail(v, "%s: stress: no transfer ran", name);
	if (s->qp_errors)
		fail(v, "%s: stress: %llu QPs broke at a sleep", name,
		     (unsigned long long)s->qp_errors);
	/* umem: resident is a Shmem figure, within a MiB */
	if (s->pin_first_kb != s->pin_last_kb ||
	    (nic == DEMO_NIC_RXE ? s->res_first_kb != s->res_last_kb :
	     !within_mib(s->res_first_kb, s->res_last_kb)) ||
	    labs(s->held_last_kb - s->held_first_kb) > STRESS_HELD_SLACK_KB)
		fail(v, "%s: stress: memory drifted (pinned %ld -> %ld KiB, "
		     "resident %ld -> %ld KiB, held %ld -> %ld KiB)", name,
		     s->pin_first_kb, s->pin_last_kb, s->res_first_kb,
		     s->res_last_kb, s->held_first_kb, s->held_last_kb);
}

static void print_follow(struct demo_results *r, struct verdict *v)
{
	struct demo_follow *f = &r->follow;

	printf("\nfollow path: vgem buffer behind a kvdmabuf proxy, test "
	       "importer as a move-capable NIC\n");
	if (!f->ran) {
		printf("  not run: %s\n", f->skip);
		fail(v, "follow path not run: %s", f->skip);
		return;
	}
	if (f->lib[0])
		printf("  libkvdmabuf, DRM region on rxe1: %s\n  so the "
		       "test importer takes the NIC's place on the proxy\n",
		       f->lib);
	printf("  %u sleep/wake cycle%s of a %zu MiB buffer; importer handle "
	       "and proxy %s across cycles\n", f->cycles,
	       f->cycles == 1 ? "" : "s", f->len >> 20,
	       f->same_handle && f->same_proxy ? "unchanged" : "CHANGED");
	printf("  reads through the importer after each wake: %u/%u correct; "
	       "accesses while asleep refused: %u/%u\n", f->correct, f->total,
	       f->refused_asleep, f->cycles);
	printf("  importer: %llu maps, %llu move notifications, %llu maps "
	       "refused (asleep); module backings awake/asleep: %ld/%ld\n",
	       (unsigned long long)f->maps,
	       (unsigned long long)f->invalidations,
	       (unsigned long long)f->failed_maps, f->backings_awake,
	       f->backings_asleep);
	printf("  Shmem awake / asleep / after wake: %ld / %ld / %ld MiB "
	       "(old vgem buffer freed while asleep, within %u ms of the "
	       "revoke)\n", mib(f->shmem_awake_kb), mib(f->shmem_asleep_kb),
	       mib(f->shmem_woke_kb), f->free_wait_ms);
	if (f->err[0])
		fail(v, "follow path: %s", f->err);
	if (!f->total || f->correct != f->total)
		fail(v, "follow path: %u/%u reads correct", f->correct,
		     f->total);
	if (!f->same_handle || !f->same_proxy)
		fail(v, "follow path: importer handle or proxy changed");
	if (f->refused_asleep != f->cycles)
		fail(v, "follow path: %u/%u accesses refused while asleep",
		     f->refused_asleep, f->cycles);
	if (f->backings_asleep != 0)
		fail(v, "follow path: module still holds %ld backing(s) "
		     "while asleep", f->backings_asleep);
	if (f->min_drop_kb < (long)(f->len / 1024) * 9 / 10)
		fail(v, "follow path: Shmem fell by only %ld KiB at sleep "
		     "(buffer %zu KiB)", f->min_drop_kb, f->len / 1024);
	if (f->invalidations < f->cycles)
		fail(v, "follow path: %llu move notifications for %u cycles",
		     (unsigned long long)f->invalidations, f->cycles);
}

bool demo_report(struct demo_results *r, bool stress)
{
	struct verdict v = { .ok = true };
	struct demo_count tot[DEMO_NR_PASSES];
	long asleep_base[DEMO_NR_NICS] = { 0, 0 };
	unsigned int p;

	memset(tot, 0, sizeof(tot));
	for (p = 0; p < DEMO_NR_PASSES; p++)
		if (!r->pass_done[p] && !left_out(r, p))
			fail(&v, "%s", r->pass_err[p][0] ? r->pass_err[p] :
			     "a pass did not run");
	if (r->dropped_rows || r->dropped_mem)
		fail(&v, "%u phase(s) and %u memory point(s) left out of a "
		     "full table (at most %d and %d): raise DEMO_MAX_ROWS "
		     "or DEMO_MAX_MEMROWS", r->dropped_rows, r->dropped_mem,
		     DEMO_MAX_ROWS, DEMO_MAX_MEMROWS);
	print_rows(r, &v, tot);
	print_mem(r, &v, asleep_base);
	print_keys(r, &v);
	if (stress) {
		print_stress(r, &v, DEMO_NIC_RXE);
		print_stress(r, &v, DEMO_NIC_UMEM);
	}
	print_follow(r, &v);
	printf("\n");
	if (r->move_kind != DEMO_NIC_RXEDB)
		printf("move-capable NIC: kvd_umem, not soft-RoCE with dma-buf "
		       "MRs (%s)\n", r->rxedb_missing[0] ? r->rxedb_missing :
		       "not run");
	if (v.ok && r->move_only)
		printf("verdict: PASS - the move-capable NIC only "
		       "(--move-capable-only): kvdmabuf %u/%u (%s, same keys) "
		       "blocks correct, 0 transfer errors, nothing held while "
		       "asleep;\n  baseline %u/%u correct, the rest wrong data "
		       "delivered with 0 transfer errors, with %ld MiB still "
		       "held while asleep (the bug, reproduced)\n",
		       tot[2].ok, tot[2].total,
		       r->move_kind == DEMO_NIC_RXEDB ?
		       "soft-RoCE dma-buf MRs" : "kvd_umem",
		       tot[3].ok, tot[3].total, mib(asleep_base[1]));
	else if (v.ok)
		printf("verdict: PASS - kvdmabuf %u/%u (soft-RoCE) and %u/%u "
		       "(%s, same keys) blocks correct, 0 "
		       "transfer errors, nothing held while asleep;\n  "
		       "baseline %u/%u and %u/%u correct, the rest wrong data "
		       "delivered with 0 transfer errors, with %ld and %ld MiB "
		       "still held while asleep (the bug, reproduced)\n",
		       tot[0].ok, tot[0].total, tot[2].ok, tot[2].total,
		       r->move_kind == DEMO_NIC_RXEDB ?
		       "soft-RoCE dma-buf MRs" : "kvd_umem",
		       tot[1].ok, tot[1].total, tot[3].ok, tot[3].total,
		       mib(asleep_base[0]), mib(asleep_base[1]));
	else
		printf("verdict: FAIL - %s\n", v.why);
	fflush(stdout);
	return v.ok;
}
