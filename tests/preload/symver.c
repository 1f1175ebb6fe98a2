// SPDX-License-Identifier: MIT
/*
 * symver.c - built against the real libibverbs (so its references carry
 * the real symbol versions), run by tests/preload/preload_symver.py under
 * LD_PRELOAD=libkvdmabuf-preload.so with the stand-in libibverbs of
 * fake_ibverbs.c first on the library path. `symver CASE` makes one kind
 * of call and prints what changed: the interposer's entry counts and the
 * stand-in's, and the interposer's state; the driver judges. CASE
 * containing "rereg_access", "rereg_in" or "rereg_out" then calls
 * ibv_rereg_mr on the MR and prints the same again; "hold" waits for a
 * byte on stdin after the registration (the driver runs the CLI then).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "kvdmabuf_preload.h"

/* A program built against the 1.0 ABI references these. */
struct ibv_mr *old_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
			  int access);
int old_dereg_mr(struct ibv_mr *mr);
__asm__(".symver old_reg_mr, ibv_reg_mr@IBVERBS_1.0");
__asm__(".symver old_dereg_mr, ibv_dereg_mr@IBVERBS_1.0");

static const char *const preload_names[] = {
	"ibv_reg_mr@IBVERBS_1.0", "ibv_reg_mr@IBVERBS_1.1",
	"ibv_reg_mr_iova@IBVERBS_1.7", "ibv_reg_mr_iova2@IBVERBS_1.8",
	"ibv_reg_dmabuf_mr@IBVERBS_1.12", "ibv_dereg_mr@IBVERBS_1.0",
	"ibv_dereg_mr@IBVERBS_1.1", "ibv_rereg_mr@IBVERBS_1.1",
};
#define NR 8

static long long (*calls)(const char *);
static long *fake;
static long long before_p[NR];
static long before_f[NR];

static void snap(void)
{
	int i;

	for (i = 0; i < NR; i++) {
		before_p[i] = calls(preload_names[i]);
		before_f[i] = fake[i];
	}
}

/* "preload: NAME+N ...; fake: NAME+N ..." for what moved */
static void diff(void)
{
	int i;

	printf("preload:");
	for (i = 0; i < NR; i++)
		if (calls(preload_names[i]) != before_p[i])
			printf(" %s+%lld", preload_names[i],
			       calls(preload_names[i]) - before_p[i]);
	printf("\nfake:");
	for (i = 0; i < NR; i++)
		if (fake[i] != before_f[i])
			printf(" %s+%ld", preload_names[i],
			       fake[i] - before_f[i]);
	printf("\n");
}

static void state(void)
{
	int (*query)(struct kvdmabuf_preload_state *) =
		(int (*)(struct kvdmabuf_preload_state *))
		dlsym(RTLD_DEFAULT, "kvdmabuf_preload_query");
	int (*check)(const void *, size_t, char *, size_t) =
		(int (*)(const void *, size_t, char *, size_t))
		dlsym(RTLD_DEFAULT, "kvdmabuf_preload_check");
	struct kvdmabuf_preload_state st;
	char reason[512];
	int rc;

	query(&st);
	printf("state: regions %u mrs %u in %u proxy %u cannot %u\n",
	       st.nr_regions, st.nr_mrs, st.nr_in_regions, st.nr_on_proxy,
	       st.nr_cannot_follow);
	rc = check(NULL, ~(size_t)0 >> 1, reason, sizeof(reason));
	printf("check: %d %s\n", rc, reason);
}

int main(int argc, char **argv)
{
	static struct ibv_device dev = { .name = "fake0" };
	static struct ibv_context vctx = { .device = &dev };
	static struct ibv_pd pd = { .context = &vctx };
	int (*declare)(void *, size_t, const char *, int, uint64_t);
	const char *c = argc > 1 ? argv[1] : "";
	size_t len = 1 << 16;
	struct ibv_mr *mr = NULL;
	char *buf;
	int *dmabuf_errno, *last_fd;
	uint64_t *last_off;

	*(void **)&calls = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_calls");
	*(void **)&declare = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare");
	fake = dlsym(RTLD_DEFAULT, "fake_calls");
	last_off = dlsym(RTLD_DEFAULT, "fake_last_dmabuf_offset");
	last_fd = dlsym(RTLD_DEFAULT, "fake_last_dmabuf_fd");
	dmabuf_errno = dlsym(RTLD_DEFAULT, "fake_dmabuf_errno");
	if (!calls || !declare || !fake || !dmabuf_errno || !last_off ||
	    !last_fd) {
		printf("not loaded: preload %p, stand-in %p\n",
		       (void *)calls, (void *)fake);
		return 2;
	}
	buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	/* KV: the region in the middle; "kv-proxy" declares a proxy fd */
	if (strstr(c, "kv"))
		declare(buf + 4096, len - 8192, "kv_cache",
			strstr(c, "proxy") ? 99 : -1, 4096);
	if (strstr(c, "eopnotsupp"))
		*dmabuf_errno = EOPNOTSUPP;
	snap();
	if (!strncmp(c, "reg_mr_optional", 15))
		mr = ibv_reg_mr(&pd, buf + 4096, 4096, IBV_ACCESS_LOCAL_WRITE |
				IBV_ACCESS_RELAXED_ORDERING);
	else if (!strncmp(c, "reg_mr_1_0", 10))
		mr = old_reg_mr(&pd, buf + 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
	else if (!strncmp(c, "reg_mr_iova2", 12))
		mr = ibv_reg_mr_iova2(&pd, buf + 4096, 4096,
				      (uintptr_t)buf + 4096,
				      IBV_ACCESS_LOCAL_WRITE);
	else if (!strncmp(c, "reg_mr_iova", 11))
		mr = ibv_reg_mr_iova(&pd, buf + 4096, 4096,
				     (uintptr_t)buf + 4096,
				     IBV_ACCESS_LOCAL_WRITE);
	else if (!strncmp(c, "reg_dmabuf", 10))
		mr = ibv_reg_dmabuf_mr(&pd, 0, 4096, (uintptr_t)buf + 4096, 7,
				       IBV_ACCESS_LOCAL_WRITE);
	else if (!strncmp(c, "reg_mr_mid", 10))   /* a page into the region */
		mr = ibv_reg_mr(&pd, buf + 8192, 4096, IBV_ACCESS_LOCAL_WRITE);
	else if (!strncmp(c, "reg_mr_head", 11))  /* below the region */
		mr = ibv_reg_mr(&pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	else if (!strncmp(c, "reg_mr_across", 13))
		mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	else if (!strncmp(c, "reg_mr", 6))
		mr = ibv_reg_mr(&pd, buf + 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
	else
		return 2;
	printf("mr: %s lkey 0x%x addr %s dmabuf %#llx fd %d\n",
	       mr ? "made" : "failed", mr ? mr->lkey : 0,
	       mr && (mr->addr == buf + 4096 || mr->addr == buf + 8192) ?
	       "as asked" : "other", (unsigned long long)*last_off, *last_fd);
	diff();
	state();
	if (strstr(c, "hold")) {        /* for `kvdmabuf status` */
		char ch;

		printf("held\n");
		fflush(stdout);
		if (read(0, &ch, 1) < 0)
			return 2;
	}
	if (strstr(c, "churn")) {       /* pass-through calls, then held */
		static struct ibv_mr *many[300];
		char ch;
		int i;

		for (i = 0; i < 1000; i++) {
			struct ibv_mr *m = ibv_reg_mr(&pd, buf, 4096,
						      IBV_ACCESS_LOCAL_WRITE);

			if (!m || ibv_dereg_mr(m))
				return 2;
		}
		printf("churned\n");
		fflush(stdout);
		if (read(0, &ch, 1) < 0)
			return 2;
		/* 300 live in the region: the records' table grows */
		for (i = 0; i < 300; i++) {
			many[i] = ibv_reg_mr(&pd, buf + 4096, 4096,
					     IBV_ACCESS_LOCAL_WRITE);
			if (!many[i])
				return 2;
		}
		printf("many\n");
		fflush(stdout);
		if (read(0, &ch, 1) < 0)
			return 2;
		for (i = 0; i < 300; i++)
			if (ibv_dereg_mr(many[i]))
				return 2;
		printf("none\n");
		fflush(stdout);
		if (read(0, &ch, 1) < 0)
			return 2;
	}
	if (strstr(c, "later"))  /* declared after the registration */
		declare(buf, len, "kv_cache", -1, 0);
	if (strstr(c, "later"))
		state();
	if (mr && strstr(c, "rereg")) {
		/* rereg_access; rereg_in: to buf + 8192 (in the region);
		 * rereg_out: to buf (below it) */
		int flags = strstr(c, "rereg_access") ?
			    IBV_REREG_MR_CHANGE_ACCESS :
			    IBV_REREG_MR_CHANGE_TRANSLATION;
		char *to = strstr(c, "rereg_out") ? buf : buf + 8192;
		int rc;

		snap();
		errno = 0;
		rc = ibv_rereg_mr(mr, flags, &pd, to, 4096,
				  IBV_ACCESS_LOCAL_WRITE);
		printf("rereg: %d %s addr %s\n", rc, strerror(errno),
		       mr->addr == to ? "new" : "old");
		diff();
		state();
	}
	snap();
	if (mr && strstr(c, "1_0"))
		old_dereg_mr(mr);
	else if (mr)
		ibv_dereg_mr(mr);
	diff();
	state();
	return 0;
}
