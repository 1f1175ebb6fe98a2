// SPDX-License-Identifier: MIT
/*
 * fake_mlx5.c - a stand-in libmlx5.so.1 (rdma-core's mlx5 provider) with
 * only mlx5dv_reg_dmabuf_mr@MLX5_1.25, for tests/preload/dlopen_engine:
 * like the real one it makes the MR itself, through the kernel command
 * the stand-in libibverbs exposes (fake_cmd_reg_dmabuf_mr, as the real
 * provider calls ibv_cmd_reg_dmabuf_mr), never through ibv_reg_dmabuf_mr,
 * so an interposer of libibverbs alone does not see it. It keeps what it
 * was last asked, for the test to read.
 */
#include <stddef.h>
#include <stdint.h>

struct ibv_pd;
struct ibv_mr;

struct ibv_mr *fake_cmd_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				      size_t len, int fd);
struct ibv_mr *mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				    size_t length, uint64_t iova, int fd,
				    int access, int mlx5_access);

long fake_mlx5_calls;
int fake_mlx5_last_access = -1;

struct ibv_mr *mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				    size_t length, uint64_t iova, int fd,
				    int access, int mlx5_access)
{
	(void)iova;
	(void)access;
	__atomic_fetch_add(&fake_mlx5_calls, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&fake_mlx5_last_access, mlx5_access,
			 __ATOMIC_RELAXED);
	return fake_cmd_reg_dmabuf_mr(pd, offset, length, fd);
}
