/* SPDX-License-Identifier: MIT */
/*
 * verbs_ex.h - ibv_reg_mr_ex@IBVERBS_1.15 (rdma-core 59, 2025): its
 * argument as libibverbs' verbs.h declares it, for a preload built against
 * an older libibverbs (Debian's rdma-core 44 and 56 have none). The caller
 * owns the struct, whose size is its headers' (later versions append
 * fields): a field is read only where comp_mask says it is set, and only
 * the fields below exist in every version that has the call
 * (buf: rdma-core 63).
 */
#ifndef KVDMABUF_PRELOAD_VERBS_EX_H
#define KVDMABUF_PRELOAD_VERBS_EX_H

#include <stddef.h>
#include <stdint.h>

struct ibv_pd;
struct ibv_mr;

enum {
	KP_MR_MASK_IOVA = 1 << 0,
	KP_MR_MASK_ADDR = 1 << 1,
	KP_MR_MASK_FD = 1 << 2,
	KP_MR_MASK_FD_OFFSET = 1 << 3,
	KP_MR_MASK_DMAH = 1 << 4,       /* a DMA handle (TPH): kept */
	KP_MR_MASK_BUF = 1 << 5,        /* a provider's ibv_buf */
};

struct kp_mr_init_attr {
	size_t length;
	int access;
	uint64_t comp_mask;
	uint64_t iova;
	void *addr;
	int fd;
	uint64_t fd_offset;
	void *dmah;                     /* struct ibv_dmah * */
	void *buf;                      /* struct ibv_buf *, rdma-core 63 */
};

typedef struct ibv_mr *(*reg_ex_fn)(struct ibv_pd *,
				    struct kp_mr_init_attr *);

#endif /* KVDMABUF_PRELOAD_VERBS_EX_H */
