// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_faults: every failure the kernel can inject into the module's
 * ioctl paths, one at a time. fail-nth (/proc/thread-self/fail-nth,
 * CONFIG_FAULT_INJECTION) makes the Nth fault point this thread reaches
 * fail: a slab or page allocation (failslab, fail_page_alloc, told here to
 * fail sleeping allocations too) or a user copy (fail_usercopy). For each
 * step of a proxy's life and N = 1, 2, ... until the step no longer
 * reaches an Nth point, the steps before it run plainly, then the step
 * runs once with the fault armed, and:
 *  - it succeeds, or fails with -ENOMEM (and changed nothing: the step
 *    runs again without faults and succeeds) or -EFAULT (a copy-out that
 *    faulted after the change: either state is allowed, never one between);
 *  - the steps after it work and the importer reads the right backing;
 *  - once everything is closed, the module's live proxies, backings and
 *    backing attachments are back where they were (caught: an error path
 *    that does not unwind, a reference or an fd left behind).
 * The lane's kernel log check and KASAN see the rest (a warning, a use
 * after free on an error path). Allocations the kernel makes on its own
 * behalf (KASAN's stack depot, the first time it sees a stack) shift the
 * count from run to run, so an allocation sweep may reach a point twice
 * and miss its neighbour; a third sweep fails user copies alone (slab
 * and page allocations filtered out), whose numbering nothing shifts, so
 * every copy-out of every step is reached in each run. The exporter is
 * vgem and the importer kvd_importer, in the same thread, so their
 * allocations fail too.
 * Debian's kernels have no CONFIG_FAULT_INJECTION: the debug lane runs it.
 */
#include <stdbool.h>

#include "harness.h"
#include "proxy_common.h"

#define SIZE		(16 * KVD_PAGE)
#define SEED_A		0xa
#define SEED_B		0xb
/* More fault points than any step reaches: a sweep that never ends fails. */
#define MAX_POINTS	400

#define FAIL_NTH	"/proc/thread-self/fail-nth"
#define FAULT_DEBUGFS	"/sys/kernel/debug"

struct world {
	int dev, drm, imp, a, b, proxy, h;
	uint32_t imp_flags;
	uint32_t seed;		/* the pattern of the current backing */
	char buf[SIZE];
};

/*
 * One step: 0 or -errno; @took: its effect is there; @seed: the pattern of
 * the backing once it took (0: unchanged).
 */
struct step {
	const char *name;
	int (*run)(struct world *w);
	int (*took)(struct world *w);
	uint32_t seed;
};

static int proxy_state(struct world *w)
{
	struct kvdmabuf_query q;

	return kvd_query(w->dev, w->proxy, &q) ? -1 : (int)q.state;
}

static int run_create(struct world *w)
{
	int fd = kvd_create(w->dev, SIZE, NULL);

	if (fd >= 0)
		w->proxy = fd;
	return fd < 0 ? fd : 0;
}

static int took_create(struct world *w)
{
	return w->proxy >= 0;
}

static int run_attach(struct world *w)
{
	return kvd_attach(w->dev, w->proxy, w->a, 0);
}

static int took_backed(struct world *w)
{
	return proxy_state(w) == KVDMABUF_STATE_BACKED;
}

static int run_import(struct world *w)
{
	int h = imp_import(w->imp, w->proxy, w->imp_flags);

	if (h >= 0)
		w->h = h;
	return h < 0 ? h : 0;
}

static int took_import(struct world *w)
{
	return w->h >= 0;
}

/*
 * The first access maps (a slot and the exporter's map, or a vmap); every
 * access must read the current backing's bytes (-EIO if not).
 */
static int run_read(struct world *w)
{
	int ret = imp_read(w->imp, w->h, 0, w->buf, SIZE);

	if (!ret && pattern_check(w->buf, SIZE, w->seed) != -1)
		ret = -EIO;
	return ret;
}

static int took_nothing(struct world *w)
{
	(void)w;
	return 0;
}

static int run_replace(struct world *w)
{
	return kvd_replace(w->dev, w->proxy, w->b, 0);
}

static int took_replace(struct world *w)
{
	struct kvdmabuf_query q;

	return !kvd_query(w->dev, w->proxy, &q) && q.generation == 2;
}

static int run_revoke(struct world *w)
{
	return kvd_revoke(w->dev, w->proxy, 1000);
}

static int took_revoke(struct world *w)
{
	return proxy_state(w) == KVDMABUF_STATE_REVOKED;
}

static int run_query(struct world *w)
{
	struct kvdmabuf_query q;

	return kvd_query(w->dev, w->proxy, &q);
}

/* A proxy's life as an engine's sleep and wake lead it. */
static const struct step steps[] = {
	{ "create", run_create, took_create, 0 },
	{ "attach", run_attach, took_backed, SEED_A },
	{ "import", run_import, took_import, 0 },
	{ "first_access", run_read, took_nothing, 0 },
	{ "replace", run_replace, took_replace, SEED_B },
	{ "access_after_replace", run_read, took_nothing, 0 },
	{ "revoke", run_revoke, took_revoke, 0 },
	{ "attach_after_revoke", run_attach, took_backed, SEED_A },
	{ "query", run_query, took_nothing, 0 },
};
#define NR_STEPS	(int)(sizeof(steps) / sizeof(steps[0]))

/* Runs step @k without faults. */
static int step_plain(struct world *w, int k)
{
	int ret = steps[k].run(w);

	if (!ret && steps[k].seed)
		w->seed = steps[k].seed;
	return ret;
}

static int write_str(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, val, strlen(val)) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/*
 * failslab and fail_page_alloc skip sleeping allocations unless told, and
 * each injection would log a stack dump (the lane's log check reads the
 * kernel log); fail-nth needs no probability.
 */
static int faults_configure(bool copies_only)
{
	/*
	 * Copies only: no cache is marked for failslab's cache filter, and no
	 * allocation has an order above fail_page_alloc's minimum.
	 */
	const char *const knobs[][2] = {
		{ "failslab/ignore-gfp-wait", "N" },
		{ "failslab/cache-filter", copies_only ? "Y" : "N" },
		{ "failslab/verbose", "0" },
		{ "fail_page_alloc/ignore-gfp-wait", "N" },
		{ "fail_page_alloc/ignore-gfp-highmem", "N" },
		{ "fail_page_alloc/min-order", copies_only ? "64" : "0" },
		{ "fail_page_alloc/verbose", "0" },
		{ "fail_usercopy/verbose", "0" },
	};
	char path[256];
	size_t i;
	int ret;

	kvd_debugfs_mount();
	for (i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++) {
		snprintf(path, sizeof(path), FAULT_DEBUGFS "/%s", knobs[i][0]);
		ret = write_str(path, knobs[i][1]);
		if (ret)
			return ret;
	}
	return 0;
}

/* Arms the @n-th fault point of this thread (0 disarms). */
static int fault_arm(int fd, int n)
{
	char v[16];
	int len = snprintf(v, sizeof(v), "%d", n);

	return pwrite(fd, v, (size_t)len, 0) == len ? 0 : -errno;
}

/*
 * Whether the armed fault was injected, and disarms it. The read itself
 * is a fault point (its copy to user space): a count of 1 left fails it
 * with EFAULT, which means "not reached" as well.
 */
static int fault_injected(int fd)
{
	char v[16] = "";
	ssize_t n = pread(fd, v, sizeof(v) - 1, 0);

	fault_arm(fd, 0);
	return n > 0 && atoi(v) == 0;
}

static long module_objects(void)
{
	return kvd_stat("proxies") + kvd_stat("backings") +
	       kvd_stat("backing_attachments");
}

/* The module's live objects back to @base: polls, releases may be deferred. */
static long objects_settle(long base)
{
	long now = module_objects();
	int i;

	for (i = 0; now != base && i < kvd_scaled_ms(2000) / 10; i++) {
		usleep(10000);
		now = module_objects();
	}
	return now;
}

FIXTURE(faults) {
	int nth;
	long base;
	struct world w;
};

FIXTURE_VARIANT(faults) {
	uint32_t imp_flags;
	bool copies_only;	/* fail user copies, never allocations */
};

/* A dynamic importer (a NIC's MR), and a CPU importer (rxe's vmap). */
FIXTURE_VARIANT_ADD(faults, dynamic) { .imp_flags = 0 };
FIXTURE_VARIANT_ADD(faults, cpu) { .imp_flags = KVD_IMP_IMPORT_CPU };
FIXTURE_VARIANT_ADD(faults, user_copies) { .copies_only = true };

static void world_close(struct world *w)
{
	if (w->h >= 0)
		imp_release(w->imp, w->h);
	w->h = -1;
	kvd_close(&w->imp);
	KVD_PROXY_TEARDOWN(w);
}

FIXTURE_SETUP(faults)
{
	struct kvdmabuf_version v = { .size = sizeof(v) };
	int ret;

	self->nth = -1;
	self->w.imp = self->w.h = -1;
	KVD_PROXY_SETUP(&self->w, SIZE, SEED_A, SEED_B);
	kvd_close(&self->w.proxy);
	KVD_OPEN_IMP(self->w.imp);
	ASSERT_EQ(0, kvd_ioctl(self->w.dev, KVDMABUF_IOCTL_VERSION, &v));
	if (variant->imp_flags & KVD_IMP_IMPORT_CPU &&
	    !(v.features & KVDMABUF_FEATURE_VMAP))
		SKIP(return, "no CPU access to proxies before Linux 6.2");
	self->nth = open(FAIL_NTH, O_RDWR | O_CLOEXEC);
	if (self->nth < 0)
		SKIP(return, "no %s: a kernel without CONFIG_FAULT_INJECTION",
		     FAIL_NTH);
	ret = faults_configure(variant->copies_only);
	if (ret)
		SKIP(return, "fault injection not configurable in debugfs (%s): CONFIG_FAULT_INJECTION_DEBUG_FS, CONFIG_FAILSLAB, CONFIG_FAIL_PAGE_ALLOC and CONFIG_FAULT_INJECTION_USERCOPY",
		     strerror(-ret));
	self->w.imp_flags = variant->imp_flags;
	world_close(&self->w);
	self->base = module_objects();
	ASSERT_GE(self->base, 0);
}

FIXTURE_TEARDOWN(faults)
{
	if (self->nth >= 0) {
		fault_arm(self->nth, 0);
		close(self->nth);
	}
	world_close(&self->w);
}

static void world_open(struct __test_metadata *_metadata, struct world *w)
{
	char byte;
	int bk[2], i, h;

	w->h = -1;
	KVD_PROXY_SETUP(w, SIZE, SEED_A, SEED_B);
	kvd_close(&w->proxy);
	w->imp = imp_open();
	ASSERT_GE(w->imp, 0);
	if (!(w->imp_flags & KVD_IMP_IMPORT_CPU))
		return;
	/*
	 * The dma-buf core warns at any exporter's failed vmap, vgem's
	 * failing an injected allocation too (no error path of ours): the
	 * backings stay vmapped through importers of their own, so the
	 * proxy's vmap of them takes the core's existing mapping and no
	 * fault reaches vgem's vmap.
	 */
	bk[0] = w->a;
	bk[1] = w->b;
	for (i = 0; i < 2; i++) {
		h = imp_import(w->imp, bk[i], KVD_IMP_IMPORT_CPU);
		ASSERT_GE(h, 0);
		ASSERT_EQ(0, imp_read(w->imp, h, 0, &byte, 1));
	}
}

struct tally {
	int points, ok, nomem, fault, took;
};

/*
 * One run with the @n-th fault point of step @k failing; returns whether
 * the fault was reached at all.
 */
static int run_with_fault(struct __test_metadata *_metadata,
			  FIXTURE_DATA(faults) *self, int k, int n,
			  struct tally *t)
{
	struct world *w = &self->w;
	int i, ret, reached, took;

	world_open(_metadata, w);
	for (i = 0; i < k; i++)
		ASSERT_EQ(0, step_plain(w, i));
	ASSERT_EQ(0, fault_arm(self->nth, n));
	ret = steps[k].run(w);
	reached = fault_injected(self->nth);
	if (reached) {
		took = steps[k].took(w);
		if (ret != 0 && ret != -ENOMEM && ret != -EFAULT)
			TH_LOG("%s, fault point %d: %s", steps[k].name, n,
			       strerror(-ret));
		ASSERT_TRUE(ret == 0 || ret == -ENOMEM || ret == -EFAULT);
		/* -ENOMEM: all or nothing */
		if (ret == -ENOMEM && took)
			TH_LOG("%s, fault point %d: -ENOMEM but the step took",
			       steps[k].name, n);
		ASSERT_FALSE(ret == -ENOMEM && took);
		t->ok += !ret;
		t->nomem += ret == -ENOMEM;
		t->fault += ret == -EFAULT;
		t->took += ret && took;
		if (!ret || took) {
			if (steps[k].seed)
				w->seed = steps[k].seed;
		} else {
			ASSERT_EQ(0, step_plain(w, k));
		}
	} else {
		ASSERT_EQ(0, ret);
		if (steps[k].seed)
			w->seed = steps[k].seed;
	}
	for (i = k + 1; i < NR_STEPS; i++)
		ASSERT_EQ(0, step_plain(w, i));
	ASSERT_EQ(0, run_read(w));
	world_close(w);
	EXPECT_EQ(self->base, objects_settle(self->base));
	return reached;
}

static void sweep(struct __test_metadata *_metadata,
		  FIXTURE_DATA(faults) *self,
		  const FIXTURE_VARIANT(faults) *variant, const char *name)
{
	struct tally t = { 0 };
	int k, n;

	for (k = 0; k < NR_STEPS && strcmp(steps[k].name, name); k++)
		;
	ASSERT_LT(k, NR_STEPS);
	for (n = 1; n <= MAX_POINTS; n++) {
		if (!run_with_fault(_metadata, self, k, n, &t))
			break;
		t.points++;
		if (!_metadata->passed) {
			TH_LOG("%s: fault point %d broke it", name, n);
			return;
		}
	}
	ASSERT_LE(n, MAX_POINTS);
	/* Every step copies an ioctl's argument in; no allocation failed. */
	if (variant->copies_only) {
		EXPECT_LT(0, t.points);
		EXPECT_EQ(0, t.nomem);
	}
	TH_LOG("%s: %d fault points: %d succeeded, %d -ENOMEM, %d -EFAULT (%d after the change)",
	       name, t.points, t.ok, t.nomem, t.fault, t.took);
}

#define FAULT_TEST(step)						\
	TEST_F_TIMEOUT(faults, step, 600)				\
	{								\
		sweep(_metadata, self, variant, #step);			\
	}

FAULT_TEST(create)
FAULT_TEST(attach)
FAULT_TEST(import)
FAULT_TEST(first_access)
FAULT_TEST(replace)
FAULT_TEST(access_after_replace)
FAULT_TEST(revoke)
FAULT_TEST(attach_after_revoke)
FAULT_TEST(query)

TEST_HARNESS_MAIN
