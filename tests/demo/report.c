// SPDX-License-Identifier: GPL-2.0
/*
 * report.c - the demo's table and verdict. Every figure printed was
 * measured in this run; the verdict only compares measured figures.
 */
#include <stdarg.h>
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
	if (r->nr_rows == DEMO_MAX_ROWS)
		return NULL;
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
	if (r->nr_mem == DEMO_MAX_MEMROWS)
		return NULL;
	r->mem[r->nr_mem].label = label;
	return &r->mem[r->nr_mem++];
}

/* ---- verdict bookkeeping ---- */

struct verdict {
	bool ok;
	char why[1024];
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

static void cell(char *buf, size_t len, const struct demo_row *r,
		 unsigned int pass)
{
	if (!r->used[pass])
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%u/%u", r->c[pass].ok, r->c[pass].total);
}

static long mib(long kb)
{
	return (kb + (kb >= 0 ? 512 : -512)) / 1024;
}

static void memcell(char *buf, size_t len, const struct demo_mem *m)
{
	if (!m->valid)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%ld / %ld / %ld", mib(m->pin_kb),
			 mib(m->res_kb), mib(m->held_kb));
}

static void print_rows(struct demo_results *r, struct verdict *v,
		       struct demo_count *tot)
{
	const char *group = NULL;
	unsigned int i, p, bug_a = 0, bug_b = 0;
	char c0[24], c1[24];

	printf("\n%-46s %12s %12s\n", "phase (8 prompts each)", "kvdmabuf",
	       "baseline");
	for (i = 0; i < r->nr_rows; i++) {
		const struct demo_row *w = &r->rows[i];

		if (!group || strcmp(group, w->group)) {
			group = w->group;
			if (!strcmp(group, "sleep/wake cycles"))
				printf("%s (%u)\n", group, r->plain_cycles);
			else
				printf("%s\n", group);
		}
		cell(c0, sizeof(c0), w, 0);
		cell(c1, sizeof(c1), w, 1);
		printf("  %-44s %12s %12s\n", w->phase, c0, c1);
		for (p = 0; p < 2; p++) {
			tot[p].ok += w->c[p].ok;
			tot[p].total += w->c[p].total;
		}
		if (w->used[0] && w->c[0].ok != w->c[0].total)
			fail(v, "kvdmabuf: %s / %s: %u/%u", w->group, w->phase,
			     w->c[0].ok, w->c[0].total);
		if (!w->used[1])
			continue;
		if (!w->expect_bug && w->c[1].ok != w->c[1].total)
			fail(v, "baseline already wrong before any sleep "
			     "(%s: %u/%u): the setup is broken", w->phase,
			     w->c[1].ok, w->c[1].total);
		if (w->expect_bug && w->phase[0] == 'A')
			bug_a += w->c[1].total - w->c[1].ok;
		if (w->expect_bug && w->phase[0] == 'B')
			bug_b += w->c[1].total - w->c[1].ok;
	}
	snprintf(c0, sizeof(c0), "%u/%u", tot[0].ok, tot[0].total);
	snprintf(c1, sizeof(c1), "%u/%u", tot[1].ok, tot[1].total);
	printf("%-46s %12s %12s\n", "all blocks", c0, c1);
	if (r->pass_done[1] && !bug_a)
		fail(v, "baseline did not reproduce wrong blocks on A after "
		     "a wake");
	if (r->pass_done[1] && !bug_b)
		fail(v, "baseline did not reproduce wrong blocks on B "
		     "(through A's stale puts)");
	if (r->xfer_errors[0])
		fail(v, "kvdmabuf: %llu transfer errors",
		     (unsigned long long)r->xfer_errors[0]);
}

/* free memory is a system-wide figure: small noise from other activity */
#define HELD_SLACK_KB (8 * 1024)

static void print_mem(struct demo_results *r, struct verdict *v,
		      long *asleep_base)
{
	unsigned int i, p;
	char a[64], s[64], w[64];

	printf("\nmemory of engine A, MiB: pinned (VmPin) / resident (its "
	       "regions) / held (drop in free memory)\n");
	printf("%-32s %-16s %-16s %-16s\n", "", "awake", "asleep",
	       "after wake");
	for (i = 0; i < r->nr_mem; i++) {
		const struct demo_memrow *m = &r->mem[i];

		for (p = 0; p < 2; p++) {
			const struct demo_mem *x = m->m[p];

			memcell(a, sizeof(a), &x[DEMO_M_AWAKE]);
			memcell(s, sizeof(s), &x[DEMO_M_ASLEEP]);
			memcell(w, sizeof(w), &x[DEMO_M_WOKE]);
			printf("%-22s %-9s %-16s %-16s %-16s\n",
			       p ? "" : m->label, p ? "baseline" : "kvdmabuf",
			       a, s, w);
		}
		/* kvdmabuf: nothing of the sleeping regions held */
		if (m->m[0][DEMO_M_ASLEEP].valid) {
			const struct demo_mem *x = m->m[0];

			if (x[DEMO_M_ASLEEP].pin_kb != m->expect_asleep_pin_kb ||
			    x[DEMO_M_ASLEEP].res_kb != m->expect_asleep_res_kb)
				fail(v, "kvdmabuf: %s: asleep %ld KiB pinned, "
				     "%ld KiB resident (expected %ld, %ld)",
				     m->label, x[DEMO_M_ASLEEP].pin_kb,
				     x[DEMO_M_ASLEEP].res_kb,
				     m->expect_asleep_pin_kb,
				     m->expect_asleep_res_kb);
			if (x[DEMO_M_WOKE].valid &&
			    (x[DEMO_M_WOKE].pin_kb != x[DEMO_M_AWAKE].pin_kb ||
			     x[DEMO_M_WOKE].res_kb != x[DEMO_M_AWAKE].res_kb))
				fail(v, "kvdmabuf: %s: after wake %ld/%ld KiB "
				     "pinned/resident, before sleep %ld/%ld",
				     m->label, x[DEMO_M_WOKE].pin_kb,
				     x[DEMO_M_WOKE].res_kb,
				     x[DEMO_M_AWAKE].pin_kb,
				     x[DEMO_M_AWAKE].res_kb);
			if (x[DEMO_M_ASLEEP].held_kb >
			    m->expect_asleep_res_kb + HELD_SLACK_KB)
				fail(v, "kvdmabuf: %s: free memory still %ld "
				     "KiB lower while asleep (expected %ld)",
				     m->label, x[DEMO_M_ASLEEP].held_kb,
				     m->expect_asleep_res_kb);
		}
		if (m->m[1][DEMO_M_ASLEEP].valid) {
			long extra = m->m[1][DEMO_M_ASLEEP].pin_kb -
				     m->expect_asleep_pin_kb;

			if (extra <= 0)
				fail(v, "baseline: %s: nothing pinned while "
				     "asleep (bug not reproduced)", m->label);
			if (extra > *asleep_base)
				*asleep_base = extra;
		}
	}
}

static void print_stress(struct demo_results *r, struct verdict *v)
{
	struct demo_stress *s = &r->stress;

	if (!s->ran) {
		fail(v, "stress: did not run");
		return;
	}
	printf("\nstress (kvdmabuf): %llu transfers begun on 4 threads up to "
	       "%llu sleeps, %llu completed correct, %llu failed, %llu wrong "
	       "-> %llu lost; up to %llu in flight when a sleep began, "
	       "%llu refused once closed\n",
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
		fail(v, "stress: %llu of %llu transfers lost or wrong",
		     (unsigned long long)(s->begun - s->completed),
		     (unsigned long long)s->begun);
	if (!s->begun)
		fail(v, "stress: no transfer ran");
	if (s->qp_errors)
		fail(v, "stress: %llu QPs broke at a sleep",
		     (unsigned long long)s->qp_errors);
	if (s->pin_first_kb != s->pin_last_kb ||
	    s->res_first_kb != s->res_last_kb ||
	    labs(s->held_last_kb - s->held_first_kb) > HELD_SLACK_KB)
		fail(v, "stress: memory drifted (pinned %ld -> %ld KiB, "
		     "resident %ld -> %ld KiB, held %ld -> %ld KiB)",
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
	       "(old vgem buffer freed while asleep)\n",
	       mib(f->shmem_awake_kb), mib(f->shmem_asleep_kb),
	       mib(f->shmem_woke_kb));
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
	struct demo_count tot[2] = { { 0, 0 }, { 0, 0 } };
	long asleep_base = 0;
	unsigned int p;

	for (p = 0; p < 2; p++)
		if (!r->pass_done[p])
			fail(&v, "%s", r->pass_err[p]);
	print_rows(r, &v, tot);
	print_mem(r, &v, &asleep_base);
	printf("\nA's regions: mode '%s' (chosen by libkvdmabuf: soft-RoCE has "
	       "no dma-buf MRs); keys of its kv_cache: generation %llu -> "
	       "%llu, new keys republished to the store %llu times\n",
	       r->mode[0] ? r->mode : "?",
	       (unsigned long long)r->key_gen_first,
	       (unsigned long long)r->key_gen_last,
	       (unsigned long long)r->republished);
	if (stress)
		print_stress(r, &v);
	print_follow(r, &v);
	printf("\n");
	if (v.ok)
		printf("verdict: PASS - kvdmabuf %u/%u blocks correct, nothing "
		       "pinned or resident while asleep; baseline %u/%u "
		       "correct with %ld MiB still pinned while asleep (the "
		       "bug, reproduced)\n", tot[0].ok, tot[0].total,
		       tot[1].ok, tot[1].total, mib(asleep_base));
	else
		printf("verdict: FAIL - %s\n", v.why);
	fflush(stdout);
	return v.ok;
}
