// SPDX-License-Identifier: MIT
/*
 * verbs_ext.c - a shared object linked with -libverbs, as a Python
 * extension (Mooncake's engine.so) is: tests/preload/dlopen_engine loads it
 * RTLD_LOCAL, so its libibverbs is in no global scope, and registers
 * through it. Its references bind to the interposer, which must reach
 * that libibverbs as the next one.
 */
#include <infiniband/verbs.h>

struct ibv_mr *ext_reg(struct ibv_pd *pd, void *addr, size_t len);
struct ibv_mr *ext_reg_dmabuf(struct ibv_pd *pd, void *iova, size_t len);
int ext_dereg(struct ibv_mr *mr);

struct ibv_mr *ext_reg(struct ibv_pd *pd, void *addr, size_t len)
{
	return ibv_reg_mr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
}

struct ibv_mr *ext_reg_dmabuf(struct ibv_pd *pd, void *iova, size_t len)
{
	return ibv_reg_dmabuf_mr(pd, 0, len, (uintptr_t)iova, 7,
				 IBV_ACCESS_LOCAL_WRITE);
}

int ext_dereg(struct ibv_mr *mr)
{
	return ibv_dereg_mr(mr);
}
