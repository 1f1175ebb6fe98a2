/* SPDX-License-Identifier: MIT */
/*
 * mr_table.h - the preload's record of each engine registration: found by
 * its struct ibv_mr in constant time (a dereg, a rereg), walked in full
 * only where a range is checked (declare, sleep, query). The caller
 * serialises every call (preload.c's kp.lock).
 */
#ifndef KVDMABUF_PRELOAD_MR_TABLE_H
#define KVDMABUF_PRELOAD_MR_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KP_NAMEMAX 64
#define KP_WHYMAX 320

struct ibv_mr;

enum kp_mode {
	KP_OUTSIDE = 0,                 /* in no region when made */
	KP_ON_PROXY = 1,                /* made on a region's proxy */
	KP_CANNOT_FOLLOW = 2,           /* by address, or the engine's dma-buf */
};

struct kp_mr {
	struct ibv_mr *mr;              /* a key only: freed once dying */
	uint32_t lkey;                  /* its lkey, for the lines we print */
	uintptr_t addr;                 /* the range the engine registered */
	size_t len;
	char nic[KP_NAMEMAX];
	int mode;                       /* enum kp_mode */
	char why[KP_WHYMAX];            /* KP_CANNOT_FOLLOW: the cause */
	/*
	 * Its dereg is in the provider: out of the lookup (the provider may
	 * hand the struct to another thread's registration meanwhile, whose
	 * record must be the one found), still walked (a sleep check sees it).
	 */
	bool dying;
	struct kp_mr *next, *prev;      /* every record */
	struct kp_mr *hnext;            /* same bucket; live records only */
};

struct kp_mr_table {
	struct kp_mr *all;
	unsigned int nr;
	struct kp_mr **bucket;          /* by struct ibv_mr pointer */
	unsigned int nr_bucket;         /* a power of two, or 0 */
	unsigned int nr_live;
};

#define kp_mr_for_each(t, m) for ((m) = (t)->all; (m); (m) = (m)->next)

/* A copy of @rec, live. -ENOMEM: nothing recorded. */
int kp_mr_add(struct kp_mr_table *t, const struct kp_mr *rec);
/* The live record of @mr, or NULL. */
struct kp_mr *kp_mr_find(const struct kp_mr_table *t, const struct ibv_mr *mr);
/* @m's dereg starts (out of the lookup) / failed (back in it). */
void kp_mr_dying(struct kp_mr_table *t, struct kp_mr *m);
void kp_mr_revive(struct kp_mr_table *t, struct kp_mr *m);
/* @m, dying, is gone. */
void kp_mr_forget(struct kp_mr_table *t, struct kp_mr *m);
/* Every record gone (a forked child's). */
void kp_mr_clear(struct kp_mr_table *t);

#endif /* KVDMABUF_PRELOAD_MR_TABLE_H */
