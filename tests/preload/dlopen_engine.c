// SPDX-License-Identifier: MIT
/*
 * dlopen_engine.c - engines that never link libibverbs but load it
 * themselves and look its entry points up on their handle, run by
 * tests/preload/preload_symver.py under LD_PRELOAD=libkvdmabuf-preload.so
 * with the stand-in libibverbs first on the library path:
 *   tent  dlopen("libibverbs.so.1", RTLD_LOCAL) + dlsym, as Mooncake's
 *         TENT transfer engine loads verbs;
 *   nccl  dlopen + dlvsym at IBVERBS_1.1 (and ibv_reg_dmabuf_mr at 1.12),
 *         as NCCL's ibvwrap does;
 *   ext   dlopen(verbs_ext.so, RTLD_LOCAL), an object linked with
 *         -libverbs (a Python extension such as Mooncake's): its calls
 *         bind to the interposer, whose next one is in no global scope;
 *   deep  the same object loaded RTLD_DEEPBIND: its calls bind to its own
 *         libibverbs, past the interposer, which cannot see them; the
 *         sleep check must refuse and name it;
 *   ns    the same object loaded by dlmopen(LM_ID_NEWLM): a link-map
 *         namespace of its own, with its own libibverbs and no
 *         LD_PRELOAD; the sleep check must refuse and name it;
 *   mlx5  dlopen("libmlx5.so.1", RTLD_LOCAL) + dlsym of
 *         mlx5dv_reg_dmabuf_mr (a stand-in: tests/preload/fake_mlx5.c), a
 *         dma-buf MR the provider makes without ibv_reg_dmabuf_mr.
 * It declares a KV region with a proxy, registers in it through the
 * looked-up entry point, asks the sleep check, and deregisters, printing
 * the interposer's counts and state after each: a registration that
 * bypassed the interposer shows "mrs 0" and no preload count.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvdmabuf_preload.h"

struct ibv_pd;
struct ibv_mr;
typedef struct ibv_mr *reg_fn(struct ibv_pd *, void *, size_t, int);
typedef struct ibv_mr *reg_dmabuf_fn(struct ibv_pd *, uint64_t, size_t,
				     uint64_t, int, int);
typedef struct ibv_mr *ext_dmabuf_fn(struct ibv_pd *, void *, size_t);
typedef struct ibv_mr *mlx5_dmabuf_fn(struct ibv_pd *, uint64_t, size_t,
				      uint64_t, int, int, int);
typedef int dereg_fn(struct ibv_mr *);

static void state(const char *when)
{
	int (*query)(struct kvdmabuf_preload_state *) =
		(int (*)(struct kvdmabuf_preload_state *))
		dlsym(RTLD_DEFAULT, "kvdmabuf_preload_query");
	long long (*calls)(const char *) = (long long (*)(const char *))
		dlsym(RTLD_DEFAULT, "kvdmabuf_preload_calls");
	struct kvdmabuf_preload_state st;

	query(&st);
	printf("%s: mrs %u proxy %u calls reg_mr@1.1 %lld reg_dmabuf_mr@1.12 "
	       "%lld mlx5dv_reg_dmabuf_mr@MLX5_1.25 %lld dereg_mr@1.1 %lld\n",
	       when, st.nr_mrs, st.nr_on_proxy,
	       calls("ibv_reg_mr@IBVERBS_1.1"),
	       calls("ibv_reg_dmabuf_mr@IBVERBS_1.12"),
	       calls("mlx5dv_reg_dmabuf_mr@MLX5_1.25"),
	       calls("ibv_dereg_mr@IBVERBS_1.1"));
}

/* The sleep check of the whole region, as a sleep would ask it. */
static void check(void *buf, size_t len)
{
	int (*chk)(const void *, size_t, char *, size_t) =
		(int (*)(const void *, size_t, char *, size_t))
		dlsym(RTLD_DEFAULT, "kvdmabuf_preload_check");
	char why[512];
	int rc = chk(buf, len, why, sizeof(why));

	printf("check: %d %s\n", rc, why);
}

/* What the stand-in provider was last asked (case mlx5). */
static void mlx5_asked(void *hm)
{
	void *hv = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
	long *calls = dlsym(hm, "fake_mlx5_calls");
	int *access = dlsym(hm, "fake_mlx5_last_access");
	int *fd = hv ? dlsym(hv, "fake_last_dmabuf_fd") : NULL;

	if (calls && access && fd)
		printf("mlx5: calls %ld access %#x fd %d\n", *calls, *access,
		       *fd);
}

int main(int argc, char **argv)
{
	/* the head of struct ibv_pd/ibv_context/ibv_device as the preload
	 * reads it for the NIC's name: none here ("?") */
	static void *pd[4];
	int (*declare)(void *, size_t, const char *, int, uint64_t);
	const char *c = argc > 1 ? argv[1] : "";
	bool nccl = !strcmp(c, "nccl"), deep = !strcmp(c, "deep");
	bool ns = !strcmp(c, "ns");
	bool ext = !strcmp(c, "ext") || deep || ns, mlx5 = !strcmp(c, "mlx5");
	mlx5_dmabuf_fn *reg_mlx5 = NULL;
	reg_dmabuf_fn *reg_dmabuf;
	void *hm = NULL;
	size_t len = 1 << 16;
	struct ibv_mr *mr, *mr2;
	dereg_fn *dereg;
	reg_fn *reg;
	char *buf;
	void *h;

	if (!nccl && !ext && !mlx5 && strcmp(c, "tent"))
		return 2;
	*(void **)&declare = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare");
	if (ext) {
		char path[4096];
		ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 32);

		if (n <= 0)
			return 2;
		path[n] = '\0';
		strcpy(strrchr(path, '/') + 1, "verbs_ext.so");
		h = ns ? dlmopen(LM_ID_NEWLM, path, RTLD_NOW) :
		     dlopen(path, RTLD_NOW | RTLD_LOCAL |
			    (deep ? RTLD_DEEPBIND : 0));
	} else {
		if (mlx5) {
			hm = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL);
			*(void **)&reg_mlx5 = hm ? dlsym(hm,
					"mlx5dv_reg_dmabuf_mr") : NULL;
			if (!reg_mlx5) {
				printf("no mlx5dv_reg_dmabuf_mr: %s\n",
				       dlerror());
				return 2;
			}
		}
		h = dlopen("libibverbs.so.1",
			   nccl ? RTLD_NOW : RTLD_NOW | RTLD_LOCAL);
	}
	if (!declare || !h) {
		printf("not loaded: preload %p, libibverbs %p\n",
		       *(void **)&declare, h);
		return 2;
	}
	if (ext) {
		*(void **)&reg = dlsym(h, "ext_reg");
		*(void **)&reg_dmabuf = dlsym(h, "ext_reg_dmabuf");
		*(void **)&dereg = dlsym(h, "ext_dereg");
	} else if (nccl) {
		*(void **)&reg = dlvsym(h, "ibv_reg_mr", "IBVERBS_1.1");
		*(void **)&reg_dmabuf = dlvsym(h, "ibv_reg_dmabuf_mr",
					       "IBVERBS_1.12");
		*(void **)&dereg = dlvsym(h, "ibv_dereg_mr", "IBVERBS_1.1");
	} else {
		*(void **)&reg = dlsym(h, "ibv_reg_mr");
		*(void **)&reg_dmabuf = dlsym(h, "ibv_reg_dmabuf_mr");
		*(void **)&dereg = dlsym(h, "ibv_dereg_mr");
	}
	if (!reg || !reg_dmabuf || !dereg)
		return 2;
	buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	declare(buf, len, "kv_cache", 99, 0);
	state("before");
	mr = reg((struct ibv_pd *)pd, buf, 4096, 1);
	if (ext)
		mr2 = ((ext_dmabuf_fn *)(void *)reg_dmabuf)(
			(struct ibv_pd *)pd, buf + 8192, 4096);
	else if (mlx5)
		mr2 = reg_mlx5((struct ibv_pd *)pd, 0, 4096,
			       (uintptr_t)buf + 8192, 7, 1, 0x5);
	else
		mr2 = reg_dmabuf((struct ibv_pd *)pd, 0, 4096,
				 (uintptr_t)buf + 8192, 7, 1);
	printf("mr: %s %s\n", mr ? "made" : "failed", mr2 ? "made" : "failed");
	state("registered");
	if (mlx5)
		mlx5_asked(hm);
	check(buf, len);
	if (mr)
		dereg(mr);
	if (mr2)
		dereg(mr2);
	state("deregistered");
	return 0;
}
