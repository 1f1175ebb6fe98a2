// SPDX-License-Identifier: MIT
/*
 * mr_table.c - the preload's registration records (mr_table.h): a list of
 * every record and a hash of the live ones by struct ibv_mr pointer, so
 * that a pass-through ibv_reg_mr + ibv_dereg_mr costs the same with 10 or
 * 100k MRs live.
 */
#include <errno.h>
#include <stdlib.h>

#include "mr_table.h"

#define KP_FIRST_BUCKETS 64u

static unsigned int slot(const struct ibv_mr *mr, unsigned int nr_bucket)
{
	/* Fibonacci hashing: the struct's low bits are its alignment */
	uint64_t h = (uint64_t)(uintptr_t)mr * 0x9e3779b97f4a7c15ull;

	return (unsigned int)(h >> 32) & (nr_bucket - 1);
}

static void hash_in(struct kp_mr_table *t, struct kp_mr *m)
{
	unsigned int s = slot(m->mr, t->nr_bucket);

	m->hnext = t->bucket[s];
	t->bucket[s] = m;
	t->nr_live++;
}

static void hash_out(struct kp_mr_table *t, struct kp_mr *m)
{
	struct kp_mr **p = &t->bucket[slot(m->mr, t->nr_bucket)];

	while (*p && *p != m)
		p = &(*p)->hnext;
	if (*p) {
		*p = m->hnext;
		t->nr_live--;
	}
	m->hnext = NULL;
}

/* Twice the buckets once they hold one record each on average; where
 * that memory is not there, the chains grow instead. */
static int grow(struct kp_mr_table *t)
{
	unsigned int n = t->nr_bucket ? t->nr_bucket * 2 : KP_FIRST_BUCKETS;
	struct kp_mr **b, *m;

	if (t->nr_bucket && t->nr_live < t->nr_bucket)
		return 0;
	b = calloc(n, sizeof(*b));
	if (!b)
		return t->nr_bucket ? 0 : -ENOMEM;
	free(t->bucket);
	t->bucket = b;
	t->nr_bucket = n;
	t->nr_live = 0;
	kp_mr_for_each(t, m)
		if (!m->dying)
			hash_in(t, m);
	return 0;
}

int kp_mr_add(struct kp_mr_table *t, const struct kp_mr *rec)
{
	struct kp_mr *m;

	if (grow(t))
		return -ENOMEM;
	m = malloc(sizeof(*m));
	if (!m)
		return -ENOMEM;
	*m = *rec;
	m->dying = false;
	m->prev = NULL;
	m->next = t->all;
	if (t->all)
		t->all->prev = m;
	t->all = m;
	t->nr++;
	hash_in(t, m);
	return 0;
}

struct kp_mr *kp_mr_find(const struct kp_mr_table *t, const struct ibv_mr *mr)
{
	struct kp_mr *m;

	if (!t->nr_bucket)
		return NULL;
	for (m = t->bucket[slot(mr, t->nr_bucket)]; m; m = m->hnext)
		if (m->mr == mr)
			return m;
	return NULL;
}

void kp_mr_dying(struct kp_mr_table *t, struct kp_mr *m)
{
	hash_out(t, m);
	m->dying = true;
}

void kp_mr_revive(struct kp_mr_table *t, struct kp_mr *m)
{
	m->dying = false;
	hash_in(t, m);
}

void kp_mr_forget(struct kp_mr_table *t, struct kp_mr *m)
{
	if (!m->dying)
		hash_out(t, m);
	if (m->prev)
		m->prev->next = m->next;
	else
		t->all = m->next;
	if (m->next)
		m->next->prev = m->prev;
	t->nr--;
	free(m);
}

void kp_mr_clear(struct kp_mr_table *t)
{
	struct kp_mr *m, *n;

	for (m = t->all; m; m = n) {
		n = m->next;
		free(m);
	}
	free(t->bucket);
	*t = (struct kp_mr_table){ 0 };
}
