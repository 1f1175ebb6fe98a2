/* SPDX-License-Identifier: MIT */
/*
 * dmabuf_origin.h - which device memory each dma-buf the engine exported
 * (cuMemGetHandleForAddressRange, interposed) holds, so that the engine's
 * own ibv_reg_dmabuf_mr of KV memory is seen as such whatever iova it asks
 * for (zero-based MRs: iova 0). A dma-buf is known by its inode (a number
 * the kernel never hands out twice per boot for dma-bufs); the fd may be
 * closed, dup'ed or passed on in between. The last KP_ORIGINS exports are
 * kept. The caller serialises every call (preload.c's kp.lock).
 */
#ifndef KVDMABUF_PRELOAD_DMABUF_ORIGIN_H
#define KVDMABUF_PRELOAD_DMABUF_ORIGIN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define KP_ORIGINS 256u

struct kp_origin {
	dev_t dev;
	ino_t ino;                      /* 0: a free entry */
	uintptr_t va;                   /* what the dma-buf's byte 0 is */
	size_t len;
};

struct kp_origin_table {
	struct kp_origin e[KP_ORIGINS];
	unsigned int next;              /* the oldest, replaced next */
};

/* The dma-buf @dev/@ino holds [@va, @va + @len). */
void kp_origin_note(struct kp_origin_table *t, dev_t dev, ino_t ino,
		    uintptr_t va, size_t len);

/* Its record, or NULL where the engine did not export it here. */
const struct kp_origin *kp_origin_of(const struct kp_origin_table *t,
				     dev_t dev, ino_t ino);

#endif /* KVDMABUF_PRELOAD_DMABUF_ORIGIN_H */
