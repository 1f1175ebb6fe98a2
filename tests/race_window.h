/* SPDX-License-Identifier: GPL-2.0 */
/*
 * race_window.h: the oracle of reads made while several threads change a
 * proxy's backing at once (tests/module/proxy_races.c's concurrent
 * controllers, proxy_fuzz.c's storm). Each controller logs every
 * operation that changed what the proxy maps: what it made current and
 * when it began and returned. Each reader logs which backing its bytes
 * were and when it began and returned. The module orders the operations;
 * the log only brackets them in time, so a read is judged by what the
 * brackets allow: race_read_in_window().
 */
#ifndef KVD_RACE_WINDOW_H
#define KVD_RACE_WINDOW_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define RACE_REVOKED	(-1)	/* a race_op's target: no backing */

struct race_op {
	int target;		/* the backing it made current, or RACE_REVOKED */
	int64_t t0, t1;		/* began, returned */
	uint64_t gen;		/* the generation it answered */
	bool plain;		/* an ATTACH without REPLACE */
};

struct race_read {
	int got;		/* the backing its bytes are */
	int64_t t0, t1;
};

static inline int64_t race_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * Was @rd's backing current at some moment of the read? The operation
 * that made it current last, among those begun before the read ended
 * (the latest to return: an earlier one is superseded whenever it is),
 * must not be followed, entirely before the read began, by one that made
 * something else current. @op holds @nops operations, the proxy's first
 * attach among them.
 */
static inline bool race_read_in_window(const struct race_op *op, int nops,
				       const struct race_read *rd)
{
	int64_t made = -1, other = -1;
	int k;

	for (k = 0; k < nops; k++) {
		const struct race_op *o = &op[k];

		if (o->target == rd->got && o->t0 < rd->t1 && o->t1 > made)
			made = o->t1;
		if (o->target != rd->got && o->t1 < rd->t0 && o->t0 > other)
			other = o->t0;
	}
	return made >= 0 && other <= made;
}

/*
 * The generations the operations answered give the module's order of
 * them, whatever their times: each ATTACH or REPLACE makes one, each
 * REVOKE of a backed proxy makes one and a REVOKE of a revoked one
 * answers the generation it found. So every generation from 1 to the
 * last must come from one swap, or from revokes only; and a plain ATTACH
 * succeeds only on a proxy that is not backed: the generation before its
 * own must be a revoke's. @op holds @nops operations, each with the
 * generation it answered (every one: 0 is no generation). NULL, or what
 * is wrong, in @why.
 */
static inline const char *race_gens_check(const struct race_op *op, int nops,
					  char *why, size_t len)
{
	uint64_t g, last = 0;
	int *swap, *revoke, k;	/* per generation: swaps, revokes that answered it */

	for (k = 0; k < nops; k++)
		last = op[k].gen > last ? op[k].gen : last;
	swap = calloc(last + 1, sizeof(*swap));
	revoke = calloc(last + 1, sizeof(*revoke));
	if (!swap || !revoke) {
		snprintf(why, len, "out of memory");
		goto out;
	}
	for (k = 0; k < nops; k++) {
		g = op[k].gen;
		if (!g) {
			snprintf(why, len, "an operation without its generation");
			goto out;
		}
		if (op[k].target == RACE_REVOKED)
			revoke[g]++;
		else
			swap[g]++;
	}
	for (g = 1; g <= last; g++) {
		if (swap[g] > 1 || (swap[g] && revoke[g]) ||
		    (!swap[g] && !revoke[g])) {
			snprintf(why, len, "generation %llu answered by %d swaps and %d revokes",
				 (unsigned long long)g, swap[g], revoke[g]);
			goto out;
		}
	}
	for (k = 0; k < nops; k++) {
		g = op[k].gen;
		if (op[k].plain && g > 1 && !revoke[g - 1]) {
			snprintf(why, len, "a plain attach made generation %llu on a backed proxy (generation %llu a swap's)",
				 (unsigned long long)g,
				 (unsigned long long)(g - 1));
			goto out;
		}
	}
	why = NULL;
out:
	free(swap);
	free(revoke);
	return why;
}

#endif /* KVD_RACE_WINDOW_H */
