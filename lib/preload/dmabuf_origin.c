// SPDX-License-Identifier: MIT
/*
 * dmabuf_origin.c - the device memory behind each dma-buf the engine
 * exported (dmabuf_origin.h): a small ring, newest over oldest.
 */
#include "dmabuf_origin.h"

/* The entry of @dev/@ino, or KP_ORIGINS. */
static unsigned int index_of(const struct kp_origin_table *t, dev_t dev,
			     ino_t ino)
{
	unsigned int i;

	for (i = 0; i < KP_ORIGINS; i++)
		if (t->e[i].ino == ino && t->e[i].dev == dev)
			break;
	return i;
}

void kp_origin_note(struct kp_origin_table *t, dev_t dev, ino_t ino,
		    uintptr_t va, size_t len)
{
	unsigned int i;

	if (!ino)
		return;
	i = index_of(t, dev, ino);
	if (i == KP_ORIGINS) {
		i = t->next;
		t->next = (t->next + 1) % KP_ORIGINS;
	}
	t->e[i] = (struct kp_origin){ .dev = dev, .ino = ino, .va = va,
				      .len = len };
}

const struct kp_origin *kp_origin_of(const struct kp_origin_table *t,
				     dev_t dev, ino_t ino)
{
	unsigned int i = ino ? index_of(t, dev, ino) : KP_ORIGINS;

	return i < KP_ORIGINS ? &t->e[i] : NULL;
}
