// SPDX-License-Identifier: GPL-2.0
/*
 * demo_verdict - make demo's verdict (tests/demo/report.c) on made-up
 * results, host-only: a run that shows the fix and the silent bug passes;
 * a baseline whose wrong blocks came with transfer errors (a loud failure,
 * as with nvidia-peermem's invalidation, not the bug the demo portrays), a
 * baseline with no wrong block, and a kvdmabuf pass with a wrong block or
 * a transfer error each fail, for their own reason. With soft-RoCE with
 * dma-buf MRs as the move-capable NIC (rxedb) the same checks name it, and
 * a key not A's (deregistered, foreign) that was not refused by the remote
 * access check, or delivered, or not probed after each cycle, fails; so
 * does a mode other than FOLLOW or a key that changed. So do a phase whose
 * blocks were not all counted, a table too small for every phase, memory
 * held by kvdmabuf while asleep (or none by the baseline), lost or wrong
 * transfers under stress, and a follow path that read wrong bytes or kept
 * the old backing. --move-capable-only leaves the pinning NIC's column
 * out and judges the rest alike. tests/demo/demo_once.py runs the real
 * demo in the 6.1 (kvd_umem), 6.12 and debug (rxedb) lanes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "demo/report.c"

/* Two rows where the baseline must show the bug (A's and B's), the keys,
 * the follow path: every check of the verdict satisfied. */
static void good_run(struct demo_results *r)
{
	static const char *const ph[2] = {
		"A gets KV that B put while A slept",
		"B gets KV that A put after its wake",
	};
	unsigned int i, p;

	memset(r, 0, sizeof(*r));
	for (i = 0; i < 2; i++) {
		struct demo_row *w = demo_row(r, "sleep/wake cycles", ph[i]);

		w->expect_bug = true;
		w->who = ph[i][0];
		w->expect_runs = 1;
		for (p = 0; p < DEMO_NR_PASSES; p++) {
			w->used[p] = true;
			w->c[p].total = DEMO_PROMPTS;
			w->c[p].ok = p % 2 ? 0 : DEMO_PROMPTS;
		}
	}
	for (p = 0; p < DEMO_NR_PASSES; p++)
		r->pass_done[p] = true;
	strcpy(r->mode[DEMO_NIC_RXE], "reregister");
	strcpy(r->mode[DEMO_NIC_UMEM], "follow");
	r->keys[0].gen_first = 1;
	r->keys[0].gen_last = 2;
	r->keys[0].stale_tried = r->keys[0].stale_refused = 1;
	r->keys[2].gen_first = r->keys[2].gen_last = 1;
	r->keys[2].wakes = 1;
	r->follow.ran = true;
	r->follow.cycles = 1;
	r->follow.total = r->follow.correct = 2;
	r->follow.refused_asleep = 1;
	r->follow.same_handle = r->follow.same_proxy = true;
	r->follow.len = 1 << 20;
	r->follow.min_drop_kb = 1024;
	r->follow.invalidations = 1;
}

/* good_run() with a memory row: kvdmabuf holds nothing of A's regions
 * while asleep and the same as before once awake; the baselines keep
 * the old memory (pinned on rxe, Shmem on the move-capable NIC). */
static void good_mem_run(struct demo_results *r)
{
	struct demo_memrow *m;
	unsigned int p;

	good_run(r);
	m = demo_memrow(r, "sleep/wake cycle 1");
	m->sleep_kb = 81920;
	for (p = 0; p < DEMO_NR_PASSES; p++) {
		struct demo_mem *x = m->m[p];

		x[DEMO_M_AWAKE] = (struct demo_mem){ true, 81920, 81920, 81920 };
		x[DEMO_M_WOKE] = x[DEMO_M_AWAKE];
		x[DEMO_M_ASLEEP] = p % 2 ? x[DEMO_M_AWAKE] :
				   (struct demo_mem){ true, 0, 0, 0 };
	}
}

/* good_run() with both stress runs clean: every transfer begun ended
 * right, memory the same after the first and the last wake. */
static void good_stress_run(struct demo_results *r)
{
	unsigned int nic;

	good_run(r);
	for (nic = 0; nic < DEMO_NR_NICS; nic++) {
		struct demo_stress *st = &r->stress[nic];

		st->ran = true;
		st->begun = st->completed = 400;
		st->sleeps = 3;
		st->pin_first_kb = st->pin_last_kb = 81920;
		st->res_first_kb = st->res_last_kb = 81920;
		st->held_first_kb = 81920;
		st->held_last_kb = 81920 + 512;	/* noise */
	}
}

/* The same with soft-RoCE with dma-buf MRs as the move-capable NIC: one
 * plain cycle, the selective wake and the KV-only release, two probes of
 * keys not A's after each, all refused. */
static void good_rxedb_run(struct demo_results *r)
{
	good_run(r);
	r->move_kind = DEMO_NIC_RXEDB;
	r->plain_cycles = 1;
	r->keys[2].probe_tried = r->keys[2].probe_refused = 6;
	r->keys[2].rkey_first = r->keys[2].rkey_last = 0x12f4;
}

/* The verdict (@stress: the stress runs judged too), its printed line
 * in @line. */
static bool verdict_of(struct demo_results *r, bool stress, char *line,
		       size_t len)
{
	FILE *f = tmpfile();
	char buf[4096];
	int saved;
	bool ok;

	if (!f)
		abort();
	fflush(stdout);
	saved = dup(STDOUT_FILENO);
	if (saved < 0 || dup2(fileno(f), STDOUT_FILENO) < 0)
		abort();
	ok = demo_report(r, stress);
	fflush(stdout);
	if (dup2(saved, STDOUT_FILENO) < 0)
		abort();
	close(saved);
	rewind(f);
	line[0] = 0;
	while (fgets(buf, sizeof(buf), f))
		if (!strncmp(buf, "verdict: ", 9))
			snprintf(line, len, "%s", buf);
	fclose(f);
	printf("# %s", line);
	return ok;
}

/* The verdict on *@r is PASS and its line names @msg. */
#define PASSES_WITH(r, msg)						\
	do {								\
		ASSERT_TRUE(verdict_of(r, false, line, sizeof(line)));	\
		ASSERT_TRUE(strstr(line, msg) != NULL);			\
	} while (0)

/* The verdict on *@r is FAIL and its line names @msg. */
#define FAILS_WITH(r, stress, msg)					\
	do {								\
		ASSERT_FALSE(verdict_of(r, stress, line, sizeof(line)));\
		ASSERT_TRUE(strstr(line, msg) != NULL);			\
	} while (0)

static bool verdict(struct demo_results *r, char *line, size_t len)
{
	return verdict_of(r, false, line, len);
}

TEST(silent_baseline_and_correct_kvdmabuf_pass)
{
	static struct demo_results r;
	char line[4096];

	good_run(&r);
	PASSES_WITH(&r, "verdict: PASS");
}

TEST(baseline_transfer_errors_fail)
{
	static struct demo_results r;
	char line[4096];
	unsigned int p;

	for (p = 1; p < DEMO_NR_PASSES; p += 2) {
		good_run(&r);
		r.xfer_errors[p] = 8;	/* the same wrong blocks, loudly */
		FAILS_WITH(&r, false, p == 1 ?
				      "rxe baseline: 8 transfer errors" :
				      "umem baseline: 8 transfer errors");
	}
}

TEST(baseline_without_wrong_blocks_fails)
{
	static struct demo_results r;
	char line[4096];

	good_run(&r);
	r.rows[0].c[1].ok = DEMO_PROMPTS;	/* A's blocks right */
	FAILS_WITH(&r, false, "rxe baseline did not reproduce wrong "
			      "blocks delivered silently on A");
}

TEST(kvdmabuf_wrong_block_or_transfer_error_fails)
{
	static struct demo_results r;
	char line[4096];

	good_run(&r);
	r.rows[1].c[2].ok = DEMO_PROMPTS - 1;
	FAILS_WITH(&r, false, "umem kvdmabuf: sleep/wake cycles / B gets "
			      "KV that A put after its wake: 7/8 correct");
	good_run(&r);
	r.xfer_errors[0] = 1;
	FAILS_WITH(&r, false, "rxe kvdmabuf: 1 transfer errors");
}

TEST(rxedb_column_passes_and_is_named)
{
	static struct demo_results r;
	char line[4096];

	good_rxedb_run(&r);
	PASSES_WITH(&r, "(soft-RoCE dma-buf MRs, same keys)");
	good_run(&r);
	PASSES_WITH(&r, "(kvd_umem, same keys)");
}

TEST(rxedb_blocks_and_silent_baseline_judged)
{
	static struct demo_results r;
	char line[4096];

	good_rxedb_run(&r);
	r.rows[1].c[2].ok = DEMO_PROMPTS - 1;
	FAILS_WITH(&r, false, "rxedb kvdmabuf: sleep/wake cycles / B gets "
			      "KV that A put after its wake: 7/8 correct");
	good_rxedb_run(&r);
	r.xfer_errors[3] = 8;
	FAILS_WITH(&r, false, "rxedb baseline: 8 transfer errors");
	good_rxedb_run(&r);
	r.rows[0].c[3].ok = DEMO_PROMPTS;
	FAILS_WITH(&r, false, "rxedb baseline did not reproduce wrong "
			      "blocks delivered silently on A");
}

TEST(rxedb_follow_mode_and_same_key)
{
	static struct demo_results r;
	char line[4096];

	good_rxedb_run(&r);
	strcpy(r.mode[DEMO_NIC_UMEM], "reregister");
	FAILS_WITH(&r, false, "rxedb kvdmabuf: mode 'reregister', "
			      "expected follow");
	good_rxedb_run(&r);
	r.keys[2].rkey_last = 0x1300;
	FAILS_WITH(&r, false, "rxedb kvdmabuf: A's key changed");
}

/* good_rxedb_run() as --move-capable-only makes it: the pinning NIC's
 * passes never ran (no rows, keys, mode or error of theirs). */
static void move_only_run(struct demo_results *r)
{
	unsigned int i, p;

	good_rxedb_run(r);
	r->move_only = true;
	for (p = 0; p < 2; p++) {
		r->pass_done[p] = false;
		memset(&r->keys[p], 0, sizeof(r->keys[p]));
		for (i = 0; i < r->nr_rows; i++) {
			r->rows[i].used[p] = false;
			memset(&r->rows[i].c[p], 0, sizeof(r->rows[i].c[p]));
		}
	}
	r->mode[DEMO_NIC_RXE][0] = 0;
}

TEST(move_capable_only_judges_the_rest)
{
	static struct demo_results r;
	char line[4096];

	move_only_run(&r);
	PASSES_WITH(&r, "the move-capable NIC only");
	/* the same results without the option: a column is missing */
	r.move_only = false;
	FAILS_WITH(&r, false, "a pass did not run");
	/* what is left is judged as in a whole run */
	move_only_run(&r);
	r.rows[0].c[3].ok = DEMO_PROMPTS;
	FAILS_WITH(&r, false, "rxedb baseline did not reproduce wrong "
			      "blocks delivered silently on A");
	move_only_run(&r);
	r.rows[1].c[2].ok = DEMO_PROMPTS - 1;
	FAILS_WITH(&r, false, "rxedb kvdmabuf: sleep/wake cycles / B gets "
			      "KV that A put after its wake: 7/8 correct");
	move_only_run(&r);
	r.pass_done[2] = false;
	snprintf(r.pass_err[2], sizeof(r.pass_err[2]),
		 "rxedb kvdmabuf pass stopped: Input/output error");
	FAILS_WITH(&r, false, "rxedb kvdmabuf pass stopped");
}

TEST(rxedb_key_not_refused_fails)
{
	static struct demo_results r;
	char line[4096];

	good_rxedb_run(&r);
	r.keys[2].probe_refused = 5;	/* one went through */
	FAILS_WITH(&r, false, "rxedb kvdmabuf: keys not A's: 5/6 refused "
			      "by the remote access check over 3 cycles, 0 "
			      "blocks delivered");
	good_rxedb_run(&r);
	r.keys[2].probe_delivered = 1;	/* refused, yet a block came */
	FAILS_WITH(&r, false, "6/6 refused by the remote access check "
			      "over 3 cycles, 1 blocks delivered");
	good_rxedb_run(&r);
	r.keys[2].probe_tried = r.keys[2].probe_refused = 4; /* cycle left */
	FAILS_WITH(&r, false, "keys not A's: 4/4 refused");
	good_run(&r);		/* kvd_umem: no keys on a wire to probe */
	ASSERT_TRUE(verdict(&r, line, sizeof(line)));
}

TEST(every_block_of_a_phase_counted)
{
	static struct demo_results r;
	char line[4096];

	good_run(&r);
	r.rows[0].expect_runs = 2;	/* a second cycle's blocks missing */
	FAILS_WITH(&r, false, "rxe kvdmabuf: sleep/wake cycles / A gets KV "
			      "that B put while A slept: 8 blocks counted, the "
			      "phase runs 2 x 8");
	good_run(&r);
	r.rows[1].c[3].total = 0;	/* a baseline's phase not counted */
	FAILS_WITH(&r, false, "umem baseline: sleep/wake cycles / B gets "
			      "KV that A put after its wake: 0 blocks counted");
}

TEST(a_full_table_fails)
{
	static struct demo_results r;
	static char phase[DEMO_MAX_ROWS][16];
	char line[4096];
	unsigned int i;

	good_run(&r);
	for (i = r.nr_rows; i <= DEMO_MAX_ROWS; i++) {
		snprintf(phase[i - 1], sizeof(phase[0]), "extra %u", i);
		if (demo_row(&r, "extra", phase[i - 1]))
			continue;
		ASSERT_EQ(DEMO_MAX_ROWS, i);	/* only the one past the cap */
	}
	ASSERT_EQ(1, r.dropped_rows);
	FAILS_WITH(&r, false, "1 phase(s) and 0 memory point(s) left out "
			      "of a full table");
}

TEST(memory_held_while_asleep_judged)
{
	static struct demo_results r;
	char line[4096];

	good_mem_run(&r);
	ASSERT_TRUE(verdict(&r, line, sizeof(line)));
	/* kvdmabuf on rxe keeps A's pages pinned while asleep */
	r.mem[0].m[0][DEMO_M_ASLEEP].pin_kb = 81920;
	FAILS_WITH(&r, false, "rxe kvdmabuf: sleep/wake cycle 1: asleep "
			      "81920 KiB pinned, 0 KiB resident (expected 0, 0)");
	/* kvdmabuf on the move-capable NIC: free memory not back */
	good_mem_run(&r);
	r.mem[0].m[2][DEMO_M_ASLEEP].held_kb = 81920;
	FAILS_WITH(&r, false, "umem kvdmabuf: sleep/wake cycle 1: the sleep "
			      "gave 0 KiB back to free memory of the 81920 "
			      "KiB that sleep");
	/* judged against the sleep, within half a MiB either way */
	good_mem_run(&r);
	r.mem[0].m[2][DEMO_M_AWAKE].held_kb = 81920 + 4096;
	r.mem[0].m[2][DEMO_M_ASLEEP].held_kb = 4096 + 512;
	ASSERT_TRUE(verdict(&r, line, sizeof(line)));
	r.mem[0].m[2][DEMO_M_ASLEEP].held_kb = 4096 + 513;
	FAILS_WITH(&r, false, "umem kvdmabuf: sleep/wake cycle 1: the sleep "
			      "gave 81407 KiB back");
	/* a baseline whose sleep gave the memory back did not show the bug */
	good_mem_run(&r);
	r.mem[0].m[3][DEMO_M_ASLEEP].held_kb = 512;
	FAILS_WITH(&r, false, "umem baseline: sleep/wake cycle 1: nothing "
			      "held while asleep");
	/* a baseline that held nothing did not show the bug */
	good_mem_run(&r);
	r.mem[0].m[1][DEMO_M_ASLEEP].pin_kb = 0;
	FAILS_WITH(&r, false, "rxe baseline: sleep/wake cycle 1: nothing "
			      "held while asleep");
	/* after the wake, not what it was before the sleep */
	good_mem_run(&r);
	r.mem[0].m[0][DEMO_M_WOKE].pin_kb = 2 * 81920;
	FAILS_WITH(&r, false, "rxe kvdmabuf: sleep/wake cycle 1: after "
			      "wake 163840/81920 KiB pinned/resident");
}

TEST(stress_losses_and_drift_fail)
{
	static struct demo_results r;
	char line[4096];

	good_stress_run(&r);
	ASSERT_TRUE(verdict_of(&r, true, line, sizeof(line)));
	r.stress[DEMO_NIC_RXE].completed = 399;
	FAILS_WITH(&r, true, "rxe kvdmabuf: stress: of 400 transfers, 1 "
			     "lost, 0 failed, 0 wrong");
	good_stress_run(&r);
	r.stress[DEMO_NIC_UMEM].wrong = 1;
	FAILS_WITH(&r, true, "umem kvdmabuf: stress: of 400 transfers, 0 "
			     "lost, 0 failed, 1 wrong");
	good_stress_run(&r);
	r.stress[DEMO_NIC_RXE].pin_last_kb += 4;	/* one page more */
	FAILS_WITH(&r, true, "rxe kvdmabuf: stress: memory drifted");
	good_stress_run(&r);
	r.stress[DEMO_NIC_UMEM].ran = false;
	FAILS_WITH(&r, true, "umem kvdmabuf: stress did not run");
}

TEST(follow_path_failures_fail)
{
	static struct demo_results r;
	char line[4096];

	good_run(&r);
	r.follow.correct = 1;
	FAILS_WITH(&r, false, "follow path: 1/2 reads correct");
	good_run(&r);
	r.follow.backings_asleep = 1;
	FAILS_WITH(&r, false, "follow path: module still holds 1 "
			      "backing(s) while asleep");
	good_run(&r);
	r.follow.min_drop_kb = 512;	/* half the buffer freed */
	FAILS_WITH(&r, false, "follow path: Shmem fell by only 512 KiB");
	good_run(&r);
	r.follow.refused_asleep = 0;
	FAILS_WITH(&r, false, "follow path: 0/1 accesses refused while "
			      "asleep");
	good_run(&r);
	r.follow.ran = false;
	strcpy(r.follow.skip, "no vgem");
	FAILS_WITH(&r, false, "follow path not run: no vgem");
}

TEST_HARNESS_MAIN
