// SPDX-License-Identifier: MIT
/*
 * preload-bench - what libkvdmabuf-preload.so adds to the calls it
 * interposes (issue 32 item 10). Each figure is measured in child
 * processes of this one, with and without LD_PRELOAD, taking turns, in
 * the same run; a figure is the median over rounds of each child's
 * median over batches.
 *
 *  P1. a pass-through ibv_reg_mr + ibv_dereg_mr pair (memory in no KV
 *      region: an engine's bounce buffer) with 10, 1000 and 100000 MRs
 *      live, on tests/preload's stand-in libibverbs (a provider that
 *      costs next to nothing, so that what is measured is the preload's
 *      own cost); target: the pair with 100000 live within 1.5x of the
 *      pair with 10 (flat). That nothing is written per call is a test
 *      (preload_symver pass_through_calls_leave_the_state_file_alone);
 *  P2. the same pair on a real provider (the first verbs device: rxe0 in
 *      the VM lanes) with 10 MRs live; target: within 1.5x of the direct
 *      pair. NOT MEASURED, with the reason, where no verbs device is;
 *  P3. an interposed CUDA driver call (cuMemSetAccess of mapped memory in
 *      no KV region) on the fake libcuda; target: within 100 ns of the
 *      direct call.
 *
 * --sanity: few rounds and small batches, every figure produced, targets
 * printed but not judged (make check-unit). Exit status: 0, or 1 when a
 * figure could not be made (or, without --sanity, a target failed).
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "cuda_compat.h"
#include "bench_stats.h"

#define PAGE 4096u
#define MAX_ROUNDS 15
#define MAX_BATCHES 64

/* ---- children: print "ns X preload P" (median ns per pair or call;
 * whether the preload is in this process: ld.so ignores an LD_PRELOAD it
 * cannot load, and the figure would then be the direct one twice) ---- */

static int preloaded(void)
{
	return dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare") != NULL;
}

/* The preload's state folder is in use, with one KV region declared (as
 * under an engine), when the preload is there. */
static void declare_a_region(void)
{
	int (*declare)(void *, size_t, const char *, int, uint64_t);
	void *kv;

	*(void **)&declare = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare");
	if (!declare)
		return;
	kv = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE,
		  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (kv != MAP_FAILED)
		declare(kv, 1 << 20, "kv_cache", -1, 0);
}

static struct ibv_pd *real_pd(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;

	if (!list || !list[0]) {
		fprintf(stderr, "no verbs device\n");
		return NULL;
	}
	ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	return ctx ? ibv_alloc_pd(ctx) : NULL;
}

static int child_verbs(bool real, long live, int batches, int per)
{
	static struct ibv_device dev = { .name = "stand-in0" };
	static struct ibv_context vctx = { .device = &dev };
	static struct ibv_pd fake_pd = { .context = &vctx };
	struct ibv_pd *pd = real ? real_pd() : &fake_pd;
	double v[MAX_BATCHES];
	struct ibv_mr **mrs;
	char *buf;
	long i;
	int b;

	if (!pd)
		return 2;
	declare_a_region();
	buf = mmap(NULL, (size_t)(live + 1) * PAGE, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	mrs = calloc((size_t)live, sizeof(*mrs));
	if (buf == MAP_FAILED || !mrs)
		return 2;
	for (i = 0; i < live; i++) {
		mrs[i] = ibv_reg_mr(pd, buf + i * PAGE, PAGE,
				    IBV_ACCESS_LOCAL_WRITE);
		if (!mrs[i]) {
			fprintf(stderr, "live MR %ld: %s\n", i, strerror(errno));
			return 2;
		}
	}
	for (b = 0; b < batches; b++) {
		int64_t t0 = now_ns();

		for (i = 0; i < per; i++) {
			struct ibv_mr *mr = ibv_reg_mr(pd, buf + live * PAGE,
						       PAGE,
						       IBV_ACCESS_LOCAL_WRITE);

			if (!mr || ibv_dereg_mr(mr)) {
				fprintf(stderr, "pair: %s\n", strerror(errno));
				return 2;
			}
		}
		v[b] = (double)(now_ns() - t0) / per;
	}
	printf("ns %.1f preload %d\n", median(v, batches), preloaded());
	for (i = 0; i < live; i++)
		ibv_dereg_mr(mrs[i]);
	return 0;
}

/* On the fake libcuda (tests/fake_cuda, linked by its soname), called
 * by name as an engine does: the preload, when there, comes first. */
static int child_cuda(int batches, int per)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc rw;
	CUmemGenericAllocationHandle h;
	size_t size = 2u << 20;
	double v[MAX_BATCHES];
	CUdeviceptr va;
	int b, i;

	kvd_kv_alloc_props(&prop, &rw);
	if (cuInit(0) || cuMemAddressReserve(&va, size, 0, 0, 0) ||
	    cuMemCreate(&h, size, &prop, 0) || cuMemMap(va, size, 0, h, 0) ||
	    cuMemSetAccess(va, size, &rw, 1)) {
		fprintf(stderr, "fake libcuda: no mapping to set access on\n");
		return 2;
	}
	declare_a_region();
	for (b = 0; b < batches; b++) {
		int64_t t0 = now_ns();

		for (i = 0; i < per; i++)
			if (cuMemSetAccess(va, size, &rw, 1))
				return 2;
		v[b] = (double)(now_ns() - t0) / per;
	}
	printf("ns %.1f preload %d\n", median(v, batches), preloaded());
	return 0;
}

/* ---- the parent ---- */

static char self[4096], preload[4096], stand_in[4096], fake_cuda[4096],
	    state_dir[64];

/* One child (@with_preload or not); its figure in *@ns. */
static int child(bool with_preload, const char *kind, long live, int batches,
		 int per, bool stand_ins, double *ns, char *why, size_t wlen)
{
	char a_live[32], a_b[16], a_per[16], line[256], libs[8300], *f;
	int fds[2], status, in = -1;
	ssize_t n;
	pid_t pid;

	snprintf(a_live, sizeof(a_live), "%ld", live);
	snprintf(a_b, sizeof(a_b), "%d", batches);
	snprintf(a_per, sizeof(a_per), "%d", per);
	snprintf(libs, sizeof(libs), "%s:%s", stand_in, fake_cuda);
	if (pipe(fds))
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (!pid) {
		dup2(fds[1], 1);
		dup2(fds[1], 2);        /* its reason, if it fails */
		close(fds[0]);
		if (stand_ins)
			setenv("LD_LIBRARY_PATH", libs, 1);
		else
			setenv("LD_LIBRARY_PATH", fake_cuda, 1);
		if (with_preload)
			setenv("LD_PRELOAD", preload, 1);
		else
			unsetenv("LD_PRELOAD");
		setenv("KVDMABUF_PRELOAD_DIR", state_dir, 1);
		execl(self, self, "--child", kind, a_live, a_b, a_per,
		      (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	n = read(fds[0], line, sizeof(line) - 1);
	close(fds[0]);
	waitpid(pid, &status, 0);
	line[n > 0 ? n : 0] = '\0';
	f = strstr(line, "ns ");
	if (!WIFEXITED(status) || WEXITSTATUS(status) || !f ||
	    sscanf(f, "ns %lf preload %d", ns, &in) != 2 ||
	    in != with_preload) {
		line[strcspn(line, "\n")] = '\0';
		snprintf(why, wlen, "%s child (%s, live %ld): exit status "
			 "%#x: %.120s", kind, with_preload ? "preload" : "direct",
			 live, status, line);
		return -EIO;
	}
	return 0;
}

/* Direct and preloaded children in turn for @rounds; medians. */
static int figure(const char *kind, long live, int rounds, int batches,
		  int per, bool stand_ins, double *direct, double *pre,
		  char *why, size_t wlen)
{
	double d[MAX_ROUNDS], p[MAX_ROUNDS];
	int r, rc;

	for (r = 0; r < rounds; r++) {
		rc = child(false, kind, live, batches, per, stand_ins, &d[r],
			   why, wlen);
		if (!rc)
			rc = child(true, kind, live, batches, per, stand_ins,
				   &p[r], why, wlen);
		if (rc)
			return rc;
	}
	*direct = median(d, rounds);
	*pre = median(p, rounds);
	return 0;
}

static int nr_fail;

static void target(bool sanity, bool ok, const char *name, const char *fmt,
		   double a, double b)
{
	printf("# %-4s %-32s ", sanity ? "-" : ok ? "PASS" : "FAIL", name);
	printf(fmt, a, b);
	printf("\n");
	printf("BENCH target=%s status=%s\n", name, ok ? "PASS" : "FAIL");
	nr_fail += !ok && !sanity;
}

static void dir_of(char *out, size_t len, const char *file, const char *rel)
{
	const char *s = strrchr(file, '/');

	snprintf(out, len, "%.*s/%s", s ? (int)(s - file) : 1,
		 s ? file : ".", rel);
}

int main(int argc, char **argv)
{
	static const long lives[] = { 10, 1000, 100000 };
	bool sanity = argc > 1 && !strcmp(argv[1], "--sanity");
	int rounds = sanity ? 3 : 9, batches = sanity ? 5 : 31;
	int per = sanity ? 200 : 2000;
	double d, p, flat[3], real_d = 0, real_p = 0;
	char why[256];
	unsigned int i;
	int rc;

	if (argc == 6 && !strcmp(argv[1], "--child")) {
		int b = atoi(argv[4]);

		if (b < 1 || b > MAX_BATCHES)
			return 2;
		if (!strcmp(argv[2], "cuda"))
			return child_cuda(b, atoi(argv[5]));
		return child_verbs(!strcmp(argv[2], "real"),
				   atol(argv[3]), b, atoi(argv[5]));
	}
	if (readlink("/proc/self/exe", self, sizeof(self) - 1) < 0)
		return 1;
	dir_of(preload, sizeof(preload), self,
	       "../../lib/libkvdmabuf-preload.so");
	dir_of(stand_in, sizeof(stand_in), self, "../preload/fake");
	dir_of(fake_cuda, sizeof(fake_cuda), self, "../fake_cuda");
	snprintf(state_dir, sizeof(state_dir), "/tmp/kvd-preload-bench-XXXXXX");
	if (!mkdtemp(state_dir))
		return 1;

	printf("# preload-bench: %d rounds of %d batches of %d\n", rounds,
	       batches, per);
	for (i = 0; i < 3; i++) {
		rc = figure("stand-in", lives[i], rounds, batches, per, true,
			    &d, &p, why, sizeof(why));
		if (rc) {
			printf("# P1 %s\n", why);
			return 1;
		}
		flat[i] = p;
		printf("BENCH name=preload_pair fig=P1 provider=stand-in "
		       "live=%ld direct_ns=%.1f preload_ns=%.1f overhead_ns=%.1f\n",
		       lives[i], d, p, p - d);
	}
	rc = figure("real", 10, rounds, batches, per / 10, false, &real_d,
		    &real_p, why, sizeof(why));
	if (rc)
		printf("BENCH name=preload_pair_real fig=P2 provider=first-"
		       "verbs-device measured=0\n# P2 NOT MEASURED, %s\n",
		       why);
	else
		printf("BENCH name=preload_pair_real fig=P2 provider=first-"
		       "verbs-device measured=1 live=10 direct_ns=%.1f "
		       "preload_ns=%.1f ratio=%.3f\n", real_d, real_p, real_p / real_d);
	if (figure("cuda", 0, rounds, batches, per, false, &d, &p, why,
		   sizeof(why))) {
		printf("# P3 %s\n", why);
		return 1;
	}
	printf("BENCH name=preload_cuda_call fig=P3 call=cuMemSetAccess "
	       "provider=fake-libcuda "
	       "direct_ns=%.1f preload_ns=%.1f overhead_ns=%.1f\n", d, p, p - d);

	printf("# targets%s\n", sanity ? " (--sanity: not judged)" : "");
	target(sanity, flat[2] <= 1.5 * flat[0], "preload-pair-flat",
	       "pair with 100000 live MRs %.1f ns, with 10: %.1f ns "
	       "(<= 1.5x)", flat[2], flat[0]);
	if (rc)
		printf("# %-4s %-32s %s\nBENCH target=preload-pair-real "
		       "status=UNMEASURED\n", "NOT MEASURED",
		       "preload-pair-real", why);
	else
		target(sanity, real_p <= 1.5 * real_d, "preload-pair-real",
		       "pair under the preload %.1f ns, direct %.1f ns "
		       "(<= 1.5x)", real_p, real_d);
	target(sanity, p - d <= 100, "preload-cuda-call",
	       "interposed cuMemSetAccess %.1f ns, direct %.1f ns "
	       "(<= 100 ns more)", p, d);
	rmdir(state_dir);
	return nr_fail ? 1 : 0;
}
