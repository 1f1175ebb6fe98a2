// SPDX-License-Identifier: MIT
/*
 * fake_ibverbs.c - a stand-in libibverbs.so.1 for tests/preload/preload_symver.py:
 * the registration entry points at the versions the real one exports
 * (fake_ibverbs.map), each counting its calls and handing out a fake MR,
 * so that the interposer's forwarding is checked on a machine without a
 * NIC. Like the real one, the 1.0 forms call the current ones through the
 * PLT (ibv_reg_mr@1.0 -> ibv_reg_mr_iova2, ibv_dereg_mr@1.0 ->
 * ibv_dereg_mr). ibv_rereg_mr@1.1 (its only version) applies its PD and
 * translation changes to the fake MR. ibv_reg_dmabuf_mr fails with
 * fake_dmabuf_errno when set, the address forms with fake_addr_errno.
 * fake_reuse: the struct of the last deregistered MR is the next one
 * handed out (a provider's MR pool; malloc does the same by chance);
 * fake_after_dereg, when set, runs inside ibv_dereg_mr once the struct is
 * free, fake_in_reg inside a registration by address before it returns
 * (a provider slow to return).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct ibv_pd;
struct ibv_mr;

/* The head of struct ibv_mr (verbs.h), as much as the tests read. */
struct fake_mr {
	void *context;
	struct ibv_pd *pd;
	void *addr;
	size_t length;
	uint32_t handle;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t pad;
	char rest[64];
};

int fake_dmabuf_errno;
int fake_addr_errno;
long fake_calls[9];
enum { F_REG_1_0, F_REG_1_1, F_IOVA, F_IOVA2, F_DMABUF, F_DEREG_1_0,
       F_DEREG_1_1, F_REREG_1_1, F_REG_EX };
static uint32_t next_key = 0x100;
int fake_reuse;
/* What the last ibv_reg_dmabuf_mr was asked: offset into the dma-buf, fd. */
uint64_t fake_last_dmabuf_offset;
int fake_last_dmabuf_fd = -1;
void (*fake_after_dereg)(void);
void (*fake_in_reg)(void);
static struct fake_mr *pool;

/* Engines register from several threads at once (preload_cuda's stress
 * test, under ThreadSanitizer too): the counters and keys are atomic. */
#define COUNT(f) __atomic_fetch_add(&fake_calls[f], 1, __ATOMIC_RELAXED)

/* the current forms, which the 1.0 ones call through the PLT */
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len,
				uint64_t iova, unsigned int access);
int ibv_dereg_mr(struct ibv_mr *mr);

/* ibv_reg_mr_ex's argument, as rdma-core 63's verbs.h has it (the call
 * itself is in rdma-core 59 and later, IBVERBS_1.15). */
struct fake_mr_init_attr {
	size_t length;
	int access;
	uint64_t comp_mask;     /* IOVA 1, ADDR 2, FD 4, FD_OFFSET 8, DMAH 16,
				 * BUF 32 */
	uint64_t iova;
	void *addr;
	int fd;
	uint64_t fd_offset;
	void *dmah;
	void *buf;
};

/* What the last ibv_reg_mr_ex was asked (the fields comp_mask sets). */
struct fake_mr_init_attr fake_last_ex;

static struct ibv_mr *mr_new(struct ibv_pd *pd, void *addr, size_t len)
{
	struct fake_mr *m = __atomic_exchange_n(&pool, NULL, __ATOMIC_ACQ_REL);

	if (m)
		memset(m, 0, sizeof(*m));
	else
		m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	m->pd = pd;
	m->addr = addr;
	m->length = len;
	m->lkey = m->rkey = __atomic_fetch_add(&next_key, 1, __ATOMIC_RELAXED);
	return (struct ibv_mr *)m;
}

/* A registration by address (pinning the pages, as a NIC would). */
static struct ibv_mr *addr_mr(struct ibv_pd *pd, void *addr, size_t len)
{
	if (fake_in_reg)
		fake_in_reg();
	if (fake_addr_errno) {
		errno = fake_addr_errno;
		return NULL;
	}
	return mr_new(pd, addr, len);
}

struct ibv_mr *fake_reg_1_0(struct ibv_pd *pd, void *addr, size_t len,
			    int access)
{
	COUNT(F_REG_1_0);
	return ibv_reg_mr_iova2(pd, addr, len, (uintptr_t)addr,
				(unsigned int)access);
}

struct ibv_mr *fake_reg_1_1(struct ibv_pd *pd, void *addr, size_t len,
			    int access)
{
	(void)access;
	COUNT(F_REG_1_1);
	return addr_mr(pd, addr, len);
}

struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len,
			       uint64_t iova, int access)
{
	(void)iova;
	(void)access;
	COUNT(F_IOVA);
	return addr_mr(pd, addr, len);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len,
				uint64_t iova, unsigned int access)
{
	(void)iova;
	(void)access;
	COUNT(F_IOVA2);
	return addr_mr(pd, addr, len);
}

/* The kernel's dma-buf MR, as ibv_cmd_reg_dmabuf_mr makes it for
 * libibverbs and for a provider (the stand-in libmlx5, fake_mlx5.c). */
struct ibv_mr *fake_cmd_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				      size_t len, int fd)
{
	__atomic_store_n(&fake_last_dmabuf_offset, offset, __ATOMIC_RELAXED);
	__atomic_store_n(&fake_last_dmabuf_fd, fd, __ATOMIC_RELAXED);
	if (fake_dmabuf_errno) {
		errno = fake_dmabuf_errno;
		return NULL;
	}
	return mr_new(pd, (void *)(uintptr_t)offset, len);
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				 size_t len, uint64_t iova, int fd, int access)
{
	(void)iova;
	(void)access;
	COUNT(F_DMABUF);
	return fake_cmd_reg_dmabuf_mr(pd, offset, len, fd);
}

int fake_dereg_1_1(struct ibv_mr *mr);

int fake_dereg_1_0(struct ibv_mr *mr)
{
	COUNT(F_DEREG_1_0);
	return ibv_dereg_mr(mr);
}

int fake_dereg_1_1(struct ibv_mr *mr)
{
	struct fake_mr *none = NULL;

	COUNT(F_DEREG_1_1);
	if (!fake_reuse || !__atomic_compare_exchange_n(&pool, &none,
			(struct fake_mr *)mr, false, __ATOMIC_ACQ_REL,
			__ATOMIC_ACQUIRE))
		free(mr);
	if (fake_after_dereg)
		fake_after_dereg();
	return 0;
}

/* ibv_rereg_mr@@IBVERBS_1.1 (flags as IBV_REREG_MR_CHANGE_*) */
int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
		 size_t len, int access)
{
	struct fake_mr *m = (struct fake_mr *)mr;

	(void)access;
	COUNT(F_REREG_1_1);
	if (flags & 2)
		m->pd = pd;
	if (flags & 1) {
		m->addr = addr;
		m->length = len;
	}
	return 0;
}

__asm__(".symver fake_reg_1_0, ibv_reg_mr@IBVERBS_1.0");
__asm__(".symver fake_reg_1_1, ibv_reg_mr@@IBVERBS_1.1");
__asm__(".symver fake_dereg_1_0, ibv_dereg_mr@IBVERBS_1.0");
__asm__(".symver fake_dereg_1_1, ibv_dereg_mr@@IBVERBS_1.1");

struct ibv_mr *ibv_reg_mr_ex(struct ibv_pd *pd, struct fake_mr_init_attr *in)
{
	struct fake_mr_init_attr got = { .length = in->length,
					 .access = in->access,
					 .comp_mask = in->comp_mask };

	COUNT(F_REG_EX);
	if (in->comp_mask & 1)
		got.iova = in->iova;
	if (in->comp_mask & 2)
		got.addr = in->addr;
	if (in->comp_mask & 4)
		got.fd = in->fd;
	if (in->comp_mask & 8)
		got.fd_offset = in->fd_offset;
	if (in->comp_mask & 16)
		got.dmah = in->dmah;
	fake_last_ex = got;
	if (in->comp_mask & 4) {
		if (fake_dmabuf_errno) {
			errno = fake_dmabuf_errno;
			return NULL;
		}
		return mr_new(pd, (void *)(uintptr_t)got.fd_offset,
			      in->length);
	}
	return addr_mr(pd, in->addr, in->length);
}
