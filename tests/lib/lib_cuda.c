// SPDX-License-Identifier: MIT
/*
 * lib_cuda - the CUDA export path through dlopen: CUDA absent gives a
 * clear error (not a crash) and the rest of the library keeps working;
 * each CUDA failure is reported with its CUDA error name; a working export
 * asks for exactly the region's range and is redone at every wake.
 * Against a driver as strict as the real one (tests/fake_cuda): a thread
 * without a current CUDA context exports (the library pushes the primary
 * context of the pointer's device, retained once, and pops it); the PCIe
 * mapping flag by config, with a fallback for older drivers; memory that
 * is not GPUDirect RDMA capable, a range with a hole, over two devices or
 * two VA reservations, and a wake before the memory is mapped again are
 * named errors; a range over several allocations mapped back to back is
 * one export. A stub libcuda (the toolkit's, and the fake acting as one)
 * is named as such by the library and by `kvdmabuf check`, a driver
 * before CUDA 11.7 (the fake without the export) by the library.
 * Host-only: tests/fake_cuda/libcuda.so.1 stands for the CUDA driver,
 * fake NICs and module (tests/lib_fake.h) for the rest.
 */
#include <dlfcn.h>
#include <pthread.h>

#include "harness.h"
#include "lib_fake.h"
#include "cuda_api.h"

#define LEN (8 * 4096)

static const char *fake_cuda_path(void)
{
	static char path[PATH_MAX];

	if (kvd_build_path(path, sizeof(path), "tests/fake_cuda/libcuda.so.1"))
		return NULL;
	return access(path, R_OK) ? NULL : path;
}

/* The fake driver's test API and the driver calls the tests make. */
static struct {
	void *dl;
	void *(*reserve)(size_t, void *);
	int (*map)(void *, size_t, int, int);
	int (*unmap)(void *);
	void (*last)(unsigned long long *, size_t *, unsigned long *);
	unsigned long long (*last_flags)(void);
	unsigned long (*export_calls)(void);
	int (*last_ctx_dev)(void);
	int (*primary_refs)(int);
	int (*current_dev)(void);
	kvd_cuDevicePrimaryCtxRetain_fn *retain;
	kvd_cuDevicePrimaryCtxRelease_fn *release;
	kvd_cuCtxPushCurrent_fn *push;
	kvd_cuCtxPopCurrent_fn *pop;
	kvd_cuPointerGetAttribute_fn *attr;
	kvd_cuMemGetAddressRange_fn *range;
	kvd_cuMemGetHandleForAddressRange_fn *export;
} fc;

static int fc_load(const char *lib)
{
	fc.dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!fc.dl)
		return -1;
#define SYM(f, name) \
	if (!(*(void **)&fc.f = dlsym(fc.dl, name))) return -1
	SYM(reserve, "fakecu_reserve");
	SYM(map, "fakecu_map");
	SYM(unmap, "fakecu_unmap");
	SYM(last, "fakecu_last_export");
	SYM(last_flags, "fakecu_last_export_flags");
	SYM(export_calls, "fakecu_export_calls");
	SYM(last_ctx_dev, "fakecu_last_export_ctx_dev");
	SYM(primary_refs, "fakecu_primary_refs");
	SYM(current_dev, "fakecu_current_dev");
	SYM(retain, "cuDevicePrimaryCtxRetain");
	SYM(release, "cuDevicePrimaryCtxRelease_v2");
	SYM(push, "cuCtxPushCurrent_v2");
	SYM(pop, "cuCtxPopCurrent_v2");
	SYM(attr, "cuPointerGetAttribute");
	SYM(range, "cuMemGetAddressRange_v2");
	SYM(export, "cuMemGetHandleForAddressRange");
#undef SYM
	return 0;
}

/* Reserve @len and map it as one allocation on @dev. */
static char *dev_mem(size_t len, int dev, int gdr)
{
	char *p = fc.reserve(len, NULL);

	if (p && fc.map(p, len, dev, gdr))
		return NULL;
	return p;
}

static int open_ctx(const char *cuda, struct kvdmabuf_ctx **ctx)
{
	struct kvdmabuf_options o = { 0 };
	char err[512];

	o.cuda_library = cuda;
	return fake_open("protocol: rdma\n", &o, ctx, err, sizeof(err));
}

static int open_ctx_yaml(const char *cuda, const char *yaml,
			 struct kvdmabuf_ctx **ctx, char *err, size_t len)
{
	struct kvdmabuf_options o = { 0 };

	o.cuda_library = cuda;
	return fake_open(yaml, &o, ctx, err, len);
}

static int add(struct kvdmabuf_ctx *ctx, void *addr, size_t len, int mem,
	       struct kvdmabuf_region **r)
{
	struct kvdmabuf_region_desc d = { 0 };

	d.addr = addr;
	d.len = len;
	d.mem = mem;
	d.tag = "kv_cache";
	return kvdmabuf_region_add(ctx, &d, r);
}

static const char *hex(const void *p)
{
	static char s[32];

	snprintf(s, sizeof(s), "0x%llx", (unsigned long long)(uintptr_t)p);
	return s;
}

#define HAS(ctx, what) \
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(ctx), what))

/* Set up a test on the fake driver: fake NICs, fake module. */
#define FAKE_CUDA_OR_SKIP(lib)                                            \
	do {                                                              \
		lib = fake_cuda_path();                                   \
		if (!lib)                                                 \
			SKIP(return, "tests/fake_cuda/libcuda.so.1 not built"); \
		ASSERT_EQ(0, fc_load(lib));                               \
		fake_reset(2);                                            \
		fw.module = 1;                                            \
		fw.real_export = 1;                                       \
	} while (0)

TEST(cuda_absent_is_a_clear_error)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	void *m = region_mem(2 * LEN);
	int fds;

	fake_reset(1);
	fw.real_export = 1;
	fds = fds_open();
	ASSERT_EQ(0, open_ctx("/nonexistent/libcuda.so.1", &ctx));
	ASSERT_EQ(-ELIBACC, add(ctx, m, LEN, KVDMABUF_MEM_CUDA, &r));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(ctx),
			       "/nonexistent/libcuda.so.1"));
	EXPECT_EQ(0, fake_mrs_live());
	/* the library still works for other memory */
	ASSERT_EQ(0, add(ctx, (char *)m + LEN, LEN, KVDMABUF_MEM_HOST, &r));
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
	kvdmabuf_close(ctx);
	EXPECT_EQ(fds, fds_open());
	munmap(m, 2 * LEN);
}

TEST(default_cuda_library_absent_here)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	void *m = region_mem(LEN);
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (h) {
		dlclose(h);
		SKIP(return, "a real libcuda.so.1 is installed here");
	}
	fake_reset(1);
	fw.real_export = 1;
	ASSERT_EQ(0, open_ctx(NULL, &ctx));
	ASSERT_EQ(-ELIBACC, add(ctx, m, LEN, KVDMABUF_MEM_CUDA, &r));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(ctx), "libcuda.so.1"));
	kvdmabuf_close(ctx);
	munmap(m, LEN);
}

/* A driver before CUDA 11.7: named, -ELIBACC, other memory goes on. */
TEST(old_driver_is_named)
{
	const char *fake = fake_cuda_path();
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	void *m = region_mem(2 * LEN);
	char lib[PATH_MAX];

	if (!fake)
		SKIP(return, "tests/fake_cuda/libcuda.so.1 not built");
	snprintf(lib, sizeof(lib), "%s", fake);
	snprintf(strrchr(lib, '/'), sizeof(lib) - (strrchr(lib, '/') - lib),
		 "/old/libcuda.so.1");
	fake_reset(1);
	fw.real_export = 1;
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	ASSERT_EQ(-ELIBACC, add(ctx, m, LEN, KVDMABUF_MEM_CUDA, &r));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	HAS(ctx, "lacks cuMemGetHandleForAddressRange");
	HAS(ctx, "CUDA 11.7");
	ASSERT_EQ(0, add(ctx, (char *)m + LEN, LEN, KVDMABUF_MEM_HOST, &r));
	kvdmabuf_close(ctx);
	munmap(m, 2 * LEN);
}

#define STUB_MSG "CUDA driver stub: no GPU driver on this machine"

/*
 * A CUDA region on a stub libcuda (@lib; FAKE_CUDA_MODE as set): the
 * library, kvd_cuda_survey() and `kvdmabuf check` (which calls it) say it
 * is the stub, -ELIBACC; the library goes on for other memory.
 */
static void stub_is_named(struct __test_metadata *_metadata, const char *lib)
{
	char cli[PATH_MAX], cmd[2 * PATH_MAX + 64], line[512], err[256];
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	void *m = region_mem(2 * LEN);
	unsigned int ndev = 7;
	uint64_t mask = 7;
	int fds = fds_open(), said = 0;
	FILE *f;

	fake_reset(1);
	fw.real_export = 1;
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	ASSERT_EQ(-ELIBACC, add(ctx, m, LEN, KVDMABUF_MEM_CUDA, &r));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	HAS(ctx, STUB_MSG);
	HAS(ctx, "CUDA_ERROR_STUB_LIBRARY");
	ASSERT_EQ(0, add(ctx, (char *)m + LEN, LEN, KVDMABUF_MEM_HOST, &r));
	kvdmabuf_close(ctx);
	EXPECT_EQ(fds, fds_open());
	munmap(m, 2 * LEN);

	EXPECT_EQ(-ELIBACC, kvd_cuda_survey(lib, &ndev, &mask, err,
					    sizeof(err)));
	EXPECT_NE(NULL, strstr(err, STUB_MSG));
	EXPECT_EQ(0, ndev);

	ASSERT_EQ(0, kvd_build_path(cli, sizeof(cli), "lib/cli/kvdmabuf"));
	snprintf(cmd, sizeof(cmd), "KVDMABUF_CUDA_LIBRARY='%s' '%s' check",
		 lib, cli);
	f = popen(cmd, "r");
	ASSERT_NOT_NULL(f);
	while (fgets(line, sizeof(line), f)) {
		/* "SKIP  CUDA    <the message>": said plainly, first */
		char *d = line + strspn(line, "SKIP ") + strlen("CUDA");

		if (!strncmp(line, "SKIP  CUDA ", 11) &&
		    !strncmp(d + strspn(d, " "), STUB_MSG, strlen(STUB_MSG)))
			said = 1;
		else if (strstr(line, "CUDA"))
			TH_LOG("kvdmabuf check: %s", line);
	}
	pclose(f);
	EXPECT_TRUE(said);
}

/* The fake driver as the toolkit's stub behaves (always built). */
TEST(stub_driver_is_named)
{
	const char *lib = fake_cuda_path();

	if (!lib)
		SKIP(return, "tests/fake_cuda/libcuda.so.1 not built");
	setenv("FAKE_CUDA_MODE", "stub", 1);
	stub_is_named(_metadata, lib);
	unsetenv("FAKE_CUDA_MODE");
}

/* NVIDIA's own stub, from the CUDA toolkit make found. */
TEST(toolkit_stub_is_named)
{
	const char *lib = getenv("KVDMABUF_CUDA_STUB");

#ifdef KVD_CUDA_STUB
	if (!lib)
		lib = KVD_CUDA_STUB;
#endif
	if (!lib)
		SKIP(return, "no CUDA toolkit found by make (nvcc, CUDA_HOME): "
		     "no stub libcuda.so to load");
	stub_is_named(_metadata, lib);
}

FIXTURE(cu) {
	struct kvdmabuf_ctx *ctx;
	char *mem;
	const char *lib;
};

FIXTURE_VARIANT(cu) {
	const char *mode;
	int rc;
	const char *msg;
};

FIXTURE_VARIANT_ADD(cu, no_device) {
	.mode = "noinit", .rc = -ENODEV, .msg = "CUDA_ERROR_NO_DEVICE",
};
FIXTURE_VARIANT_ADD(cu, no_dmabuf_support) {
	.mode = "nodmabuf", .rc = -ENODEV, .msg = "DMA_BUF_SUPPORTED",
};
FIXTURE_VARIANT_ADD(cu, export_fails) {
	.mode = "export_fail", .rc = -EIO, .msg = "CUDA_ERROR_NOT_SUPPORTED",
};
FIXTURE_VARIANT_ADD(cu, not_device_memory) {
	.mode = "notdevice", .rc = -EINVAL, .msg = "CUDA_ERROR_INVALID_VALUE",
};

FIXTURE_SETUP(cu)
{
	FAKE_CUDA_OR_SKIP(self->lib);
	self->mem = dev_mem(4 * LEN, 0, 1);
	ASSERT_NE(NULL, self->mem);
	ASSERT_EQ(0, open_ctx(self->lib, &self->ctx));
}

FIXTURE_TEARDOWN(cu)
{
	unsetenv("FAKE_CUDA_MODE");
	if (self->ctx)
		kvdmabuf_close(self->ctx);
}

TEST_F(cu, failure_is_named_and_rolled_back)
{
	struct kvdmabuf_region *r;
	int fds = fds_open();

	setenv("FAKE_CUDA_MODE", variant->mode, 1);
	ASSERT_EQ(variant->rc, add(self->ctx, self->mem, LEN,
				   KVDMABUF_MEM_CUDA, &r));
	TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	HAS(self->ctx, variant->msg);
	EXPECT_EQ(0, fake_mrs_live());
	EXPECT_EQ(-1, fc.current_dev());
	fake_proxy_gc();
	EXPECT_EQ(fds, fds_open());
}

TEST_F(cu, wake_failure_keeps_asleep_then_retry)
{
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;

	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_CUDA, &r));
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	setenv("FAKE_CUDA_MODE", variant->mode, 1);
	if (!strcmp(variant->mode, "noinit") ||
	    !strcmp(variant->mode, "nodmabuf")) {
		/* cuInit ran once, at first use, and the device was checked
		 * once, when its primary context was retained: a wake does
		 * not redo them */
		ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
		return;
	}
	ASSERT_EQ(variant->rc, kvdmabuf_wake(self->ctx, NULL));
	HAS(self->ctx, variant->msg);
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(1, in.asleep);
	EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(r));
	unsetenv("FAKE_CUDA_MODE");
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	EXPECT_EQ(0, kvdmabuf_io_begin(r));
	kvdmabuf_io_end(r);
}

TEST(export_exact_range_every_wake)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;
	const char *lib;
	unsigned long long p;
	unsigned long count, before;
	size_t sz;
	char *m;
	int cycle;

	FAKE_CUDA_OR_SKIP(lib);
	m = dev_mem(4 * LEN, 0, 1);
	ASSERT_NE(NULL, m);
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	/* a range inside a larger allocation: export exactly that range */
	ASSERT_EQ(0, add(ctx, m + LEN, 2 * LEN, KVDMABUF_MEM_CUDA, &r));
	fc.last(&p, &sz, &count);
	EXPECT_EQ((unsigned long long)(uintptr_t)(m + LEN), p);
	EXPECT_EQ((size_t)(2 * LEN), sz);
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(KVDMABUF_MODE_FOLLOW, in.mode);
	before = count;
	for (cycle = 1; cycle <= 2; cycle++) {
		ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
		ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
		fc.last(&p, &sz, &count);
		EXPECT_EQ(before + (unsigned long)cycle, count);
		EXPECT_EQ((unsigned long long)(uintptr_t)(m + LEN), p);
		EXPECT_EQ((size_t)(2 * LEN), sz);
	}
	kvdmabuf_close(ctx);
}

TEST(cuda_library_from_config)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	const char *lib;
	char yaml[PATH_MAX + 64], err[512];
	char *m;

	FAKE_CUDA_OR_SKIP(lib);
	m = dev_mem(LEN, 0, 1);
	ASSERT_NE(NULL, m);
	snprintf(yaml, sizeof(yaml), "protocol: rdma\ncuda_library: %s\n",
		 lib);
	ASSERT_EQ(0, fake_open(yaml, &o, &ctx, err, sizeof(err)));
	ASSERT_EQ(0, add(ctx, m, LEN, KVDMABUF_MEM_CUDA, &r));
	kvdmabuf_close(ctx);
}

/* ---- the CUDA context ---- */

struct wake_arg {
	struct kvdmabuf_ctx *ctx;
	int rc;
	int dev_after;
};

static void *wake_thread(void *p)
{
	struct wake_arg *a = p;

	a->rc = kvdmabuf_wake(a->ctx, NULL);
	a->dev_after = fc.current_dev();
	return NULL;
}

/* The driver needs a current context for the export; the engine's thread
 * that adds or wakes a region may never have touched CUDA. */
TEST(thread_without_cuda_context_exports)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	struct wake_arg a = { 0 };
	const char *lib;
	pthread_t t;
	char *m;

	FAKE_CUDA_OR_SKIP(lib);
	m = dev_mem(2 * LEN, 0, 1);
	ASSERT_NE(NULL, m);
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	ASSERT_EQ(-1, fc.current_dev());
	ASSERT_EQ(0, add(ctx, m, 2 * LEN, KVDMABUF_MEM_CUDA, &r));
	EXPECT_EQ(0, fc.last_ctx_dev());
	EXPECT_EQ(-1, fc.current_dev());        /* popped again */
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	/* a wake from a fresh thread */
	a.ctx = ctx;
	ASSERT_EQ(0, pthread_create(&t, NULL, wake_thread, &a));
	ASSERT_EQ(0, pthread_join(t, NULL));
	if (a.rc)
		TH_LOG("%s", kvdmabuf_last_error(ctx));
	EXPECT_EQ(0, a.rc);
	EXPECT_EQ(-1, a.dev_after);
	kvdmabuf_close(ctx);
}

/* The context pushed is the primary context of the pointer's device,
 * retained once for the kvdmabuf context's life; the caller's own current
 * context is current again afterwards. */
TEST(primary_context_of_the_pointers_device)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r, *r2;
	const char *lib;
	kvd_CUcontext engine_ctx, popped;
	char *m1, *m0;

	FAKE_CUDA_OR_SKIP(lib);
	m1 = dev_mem(2 * LEN, 1, 1);
	m0 = dev_mem(LEN, 0, 1);
	ASSERT_NE(NULL, m1);
	ASSERT_NE(NULL, m0);
	/* the engine's thread has device 0's context current */
	ASSERT_EQ(0, fc.retain(&engine_ctx, 0));
	ASSERT_EQ(0, fc.push(engine_ctx));
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	ASSERT_EQ(0, add(ctx, m1, 2 * LEN, KVDMABUF_MEM_CUDA, &r));
	EXPECT_EQ(1, fc.last_ctx_dev());
	EXPECT_EQ(0, fc.current_dev());
	EXPECT_EQ(1, fc.primary_refs(1));
	EXPECT_EQ(1, fc.primary_refs(0));       /* the engine's own */
	ASSERT_EQ(0, add(ctx, m0, LEN, KVDMABUF_MEM_CUDA, &r2));
	EXPECT_EQ(0, fc.last_ctx_dev());
	EXPECT_EQ(2, fc.primary_refs(0));
	/* sleep/wake cycles retain nothing more */
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
	EXPECT_EQ(1, fc.primary_refs(1));
	EXPECT_EQ(2, fc.primary_refs(0));
	EXPECT_EQ(0, fc.current_dev());
	kvdmabuf_close(ctx);
	EXPECT_EQ(0, fc.primary_refs(1));
	EXPECT_EQ(1, fc.primary_refs(0));
	ASSERT_EQ(0, fc.pop(&popped));
	EXPECT_EQ(engine_ctx, popped);
	fc.release(0);
}

/* ---- the PCIe mapping flag ---- */

FIXTURE(map) {
	const char *lib;
	char *mem;
};

FIXTURE_VARIANT(map) {
	const char *config;     /* cuda_dmabuf_mapping, NULL: not set */
	const char *mode;       /* FAKE_CUDA_MODE */
	int rc;
	unsigned long long flags;
	const char *msg;
};

FIXTURE_VARIANT_ADD(map, auto_asks_pcie) {
	.config = NULL, .mode = "ok", .rc = 0, .flags = 1,
};
FIXTURE_VARIANT_ADD(map, auto_explicit) {
	.config = "auto", .mode = "ok", .rc = 0, .flags = 1,
};
FIXTURE_VARIANT_ADD(map, auto_gpu_without_pcie_mapping) {
	.config = "auto", .mode = "nopcie", .rc = 0, .flags = 0,
};
FIXTURE_VARIANT_ADD(map, auto_driver_before_12_8) {
	.config = NULL, .mode = "oldflags", .rc = 0, .flags = 0,
};
FIXTURE_VARIANT_ADD(map, pcie) {
	.config = "pcie", .mode = "ok", .rc = 0, .flags = 1,
};
FIXTURE_VARIANT_ADD(map, pcie_refused_is_named) {
	.config = "pcie", .mode = "nopcie", .rc = -EIO, .flags = 1,
	.msg = "DMA_BUF_MAPPING_TYPE_PCIE",
};
FIXTURE_VARIANT_ADD(map, default_is_flags_0) {
	.config = "default", .mode = "ok", .rc = 0, .flags = 0,
};

FIXTURE_SETUP(map)
{
	FAKE_CUDA_OR_SKIP(self->lib);
	self->mem = dev_mem(LEN, 0, 1);
	ASSERT_NE(NULL, self->mem);
}

FIXTURE_TEARDOWN(map)
{
	unsetenv("FAKE_CUDA_MODE");
}

TEST_F(map, export_flags)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	char yaml[128], err[512];
	int rc;

	snprintf(yaml, sizeof(yaml), "protocol: rdma\n%s%s\n",
		 variant->config ? "cuda_dmabuf_mapping: " : "",
		 variant->config ? variant->config : "");
	ASSERT_EQ(0, open_ctx_yaml(self->lib, yaml, &ctx, err, sizeof(err)));
	setenv("FAKE_CUDA_MODE", variant->mode, 1);
	rc = add(ctx, self->mem, LEN, KVDMABUF_MEM_CUDA, &r);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(ctx));
	ASSERT_EQ(variant->rc, rc);
	if (variant->msg)
		HAS(ctx, variant->msg);
	if (!rc) {
		struct kvdmabuf_region_info in;
		int mapping = variant->flags ? KVDMABUF_MAPPING_PCIE :
				      KVDMABUF_MAPPING_DEFAULT;
		unsigned long calls;
		char label[48];

		EXPECT_EQ(variant->flags, fc.last_flags());
		/* the region says which mapping it got, and so does its
		 * proxy's name (what `kvdmabuf status` shows) */
		ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
		EXPECT_EQ(mapping, in.mapping);
		ASSERT_NE(0ull, in.proxy_id);
		snprintf(label, sizeof(label), "kvd:%llu:%s",
			 (unsigned long long)in.proxy_id,
			 variant->flags ? "pcie" : "default");
		EXPECT_EQ(0, strcmp(label, fw.px[in.proxy_id - 1].label));
		/* and the same at a wake, in one call: a driver that refused
		 * the PCIe mapping once is not asked for it again */
		ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
		calls = fc.export_calls();
		ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
		EXPECT_EQ(calls + 1, fc.export_calls());
		EXPECT_EQ(variant->flags, fc.last_flags());
		ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
		EXPECT_EQ(mapping, in.mapping);
	}
	kvdmabuf_close(ctx);
}

TEST(mapping_config_values_checked)
{
	struct kvdmabuf_ctx *ctx = NULL;
	const char *lib;
	char err[512];

	FAKE_CUDA_OR_SKIP(lib);
	ASSERT_EQ(-EINVAL, open_ctx_yaml(lib, "protocol: rdma\n"
					 "cuda_dmabuf_mapping: nvlink\n", &ctx,
					 err, sizeof(err)));
	TH_LOG("%s", err);
	EXPECT_NE(NULL, strstr(err, "'cuda_dmabuf_mapping' must be auto, "
			       "pcie or default, not 'nvlink'"));
}

/* ---- GPUDirect RDMA capability ---- */

TEST(not_gpudirect_rdma_capable_is_named)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	const char *lib;
	unsigned long long p;
	unsigned long before, after;
	size_t sz;
	char *m;
	int fds;

	FAKE_CUDA_OR_SKIP(lib);
	m = dev_mem(LEN, 0, 0);    /* as vLLM's allocator creates it */
	ASSERT_NE(NULL, m);
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	fds = fds_open();
	fc.last(&p, &sz, &before);
	ASSERT_EQ(-EOPNOTSUPP, add(ctx, m, LEN, KVDMABUF_MEM_CUDA, &r));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	HAS(ctx, "gpuDirectRDMACapable");
	HAS(ctx, "CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE");
	fc.last(&p, &sz, &after);
	EXPECT_EQ(before, after);       /* not exported */
	EXPECT_EQ(0, fake_mrs_live());
	EXPECT_EQ(-1, fc.current_dev());
	fake_proxy_gc();
	EXPECT_EQ(fds, fds_open());
	/* a driver that does not report the attribute: go on */
	setenv("FAKE_CUDA_MODE", "nogdrattr", 1);
	EXPECT_EQ(0, add(ctx, m, LEN, KVDMABUF_MEM_CUDA, &r));
	unsetenv("FAKE_CUDA_MODE");
	kvdmabuf_close(ctx);
}

/* ---- ranges over several allocations ---- */

/* Two cuMemCreate allocations mapped back to back in one reservation:
 * one export of exactly the region's range, across the seam. */
TEST(range_over_two_allocations_is_one_export)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	const char *lib;
	unsigned long long p;
	unsigned long count;
	size_t sz;
	char *m;

	FAKE_CUDA_OR_SKIP(lib);
	m = fc.reserve(4 * LEN, NULL);
	ASSERT_NE(NULL, m);
	ASSERT_EQ(0, fc.map(m, 2 * LEN, 0, 1));
	ASSERT_EQ(0, fc.map(m + 2 * LEN, 2 * LEN, 0, 1));
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	ASSERT_EQ(0, add(ctx, m + LEN, 2 * LEN, KVDMABUF_MEM_CUDA, &r));
	fc.last(&p, &sz, &count);
	EXPECT_EQ((unsigned long long)(uintptr_t)(m + LEN), p);
	EXPECT_EQ((size_t)(2 * LEN), sz);
	/* wake after both are replaced */
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	ASSERT_EQ(0, fc.unmap(m));
	ASSERT_EQ(0, fc.unmap(m + 2 * LEN));
	ASSERT_EQ(0, fc.map(m, 2 * LEN, 0, 1));
	ASSERT_EQ(0, fc.map(m + 2 * LEN, 2 * LEN, 0, 1));
	ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
	fc.last(&p, &sz, &count);
	EXPECT_EQ((unsigned long long)(uintptr_t)(m + LEN), p);
	kvdmabuf_close(ctx);
}

TEST(range_with_a_hole_names_where_the_mapping_ends)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	const char *lib;
	char *m;

	FAKE_CUDA_OR_SKIP(lib);
	m = fc.reserve(3 * LEN, NULL);
	ASSERT_NE(NULL, m);
	ASSERT_EQ(0, fc.map(m, LEN, 0, 1));
	ASSERT_EQ(0, fc.map(m + 2 * LEN, LEN, 0, 1));
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	ASSERT_EQ(-EFAULT, add(ctx, m, 3 * LEN, KVDMABUF_MEM_CUDA, &r));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	HAS(ctx, "not fully mapped");
	HAS(ctx, hex(m + LEN));
	EXPECT_EQ(-1, fc.current_dev());
	kvdmabuf_close(ctx);
}

TEST(range_over_two_devices_is_named)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	const char *lib;
	char *m;

	FAKE_CUDA_OR_SKIP(lib);
	m = fc.reserve(2 * LEN, NULL);
	ASSERT_NE(NULL, m);
	ASSERT_EQ(0, fc.map(m, LEN, 0, 1));
	ASSERT_EQ(0, fc.map(m + LEN, LEN, 1, 1));
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	ASSERT_EQ(-EINVAL, add(ctx, m, 2 * LEN, KVDMABUF_MEM_CUDA, &r));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	HAS(ctx, "spans devices 0 and 1");
	HAS(ctx, hex(m + LEN));
	kvdmabuf_close(ctx);
}

/* Two VA reservations that happen to be adjacent, both mapped: the
 * driver refuses the range; the message names the reservation's end. */
TEST(range_over_two_reservations_is_named)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	const char *lib;
	char *a, *b;

	FAKE_CUDA_OR_SKIP(lib);
	a = region_mem(4 * LEN);        /* find free VA for both */
	ASSERT_NE(NULL, a);
	munmap(a, 4 * LEN);
	ASSERT_EQ(a, fc.reserve(2 * LEN, a));
	b = fc.reserve(2 * LEN, a + 2 * LEN);
	ASSERT_EQ(a + 2 * LEN, b);
	ASSERT_EQ(0, fc.map(a, 2 * LEN, 0, 1));
	ASSERT_EQ(0, fc.map(b, 2 * LEN, 0, 1));
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	ASSERT_EQ(-EINVAL, add(ctx, a + LEN, 2 * LEN, KVDMABUF_MEM_CUDA, &r));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	HAS(ctx, "VA reservation");
	HAS(ctx, hex(b));
	kvdmabuf_close(ctx);
}

/* ---- order of calls ---- */

/* The engine woke the library before mapping new memory: the wake fails
 * with a message that says so, the region stays asleep, and a wake after
 * cuMemMap succeeds. */
TEST(wake_before_cuMemMap_fails_clearly)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;
	const char *lib;
	unsigned long long p;
	unsigned long before, after;
	size_t sz;
	char *m;

	FAKE_CUDA_OR_SKIP(lib);
	m = dev_mem(2 * LEN, 0, 1);
	ASSERT_NE(NULL, m);
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	ASSERT_EQ(0, add(ctx, m, 2 * LEN, KVDMABUF_MEM_CUDA, &r));
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	ASSERT_EQ(0, fc.unmap(m));      /* cuMemUnmap + cuMemRelease */
	fc.last(&p, &sz, &before);
	ASSERT_EQ(-EFAULT, kvdmabuf_wake(ctx, NULL));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	HAS(ctx, "cuMemMap");
	HAS(ctx, hex(m));
	fc.last(&p, &sz, &after);
	EXPECT_EQ(before, after);
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(1, in.asleep);
	EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(r));
	/* half mapped again: still refused, naming where it ends */
	ASSERT_EQ(0, fc.map(m, LEN, 0, 1));
	ASSERT_EQ(-EFAULT, kvdmabuf_wake(ctx, NULL));
	HAS(ctx, hex(m + LEN));
	ASSERT_EQ(0, fc.map(m + LEN, LEN, 0, 1));
	ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
	EXPECT_EQ(0, kvdmabuf_io_begin(r));
	kvdmabuf_io_end(r);
	kvdmabuf_close(ctx);
}

/* ---- the fake driver itself is as strict as the driver ---- */

TEST(fake_driver_is_strict)
{
	const char *lib;
	unsigned long long base = 0;
	size_t size = 0;
	kvd_CUcontext pctx, popped;
	char mapped = 7;
	int fd = -1, dev = -1;
	char *m, *plain = region_mem(LEN);

	FAKE_CUDA_OR_SKIP(lib);
	m = fc.reserve(4 * LEN, NULL);
	ASSERT_NE(NULL, m);
	ASSERT_EQ(0, fc.map(m, LEN, 1, 1));
	ASSERT_EQ(0, fc.map(m + LEN, LEN, 1, 1));
	/* no current context */
	EXPECT_EQ(KVD_CUDA_ERROR_INVALID_CONTEXT,
		  fc.export(&fd, (uintptr_t)m, LEN,
			    KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
	EXPECT_EQ(KVD_CUDA_ERROR_INVALID_CONTEXT, fc.push(NULL));
	ASSERT_EQ(0, fc.retain(&pctx, 1));
	ASSERT_EQ(0, fc.push(pctx));
	EXPECT_EQ(1, fc.current_dev());
	/* sub-range, several allocations, the PCIe flag */
	ASSERT_EQ(0, fc.export(&fd, (uintptr_t)m + 4096, LEN,
			       KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 1));
	close(fd);
	EXPECT_EQ(1ull, fc.last_flags());
	EXPECT_EQ(1, fc.last_ctx_dev());
	/* unmapped VA, not CUDA memory, unknown flags, unaligned */
	EXPECT_EQ(KVD_CUDA_ERROR_INVALID_VALUE,
		  fc.export(&fd, (uintptr_t)m + LEN, 2 * LEN,
			    KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
	EXPECT_EQ(KVD_CUDA_ERROR_INVALID_VALUE,
		  fc.export(&fd, (uintptr_t)plain, LEN,
			    KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
	EXPECT_EQ(KVD_CUDA_ERROR_INVALID_VALUE,
		  fc.export(&fd, (uintptr_t)m, LEN,
			    KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 2));
	EXPECT_EQ(KVD_CUDA_ERROR_INVALID_VALUE,
		  fc.export(&fd, (uintptr_t)m + 1, LEN,
			    KVD_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
	/* pointer attributes: device, mapped, reservation, one mapping */
	ASSERT_EQ(0, fc.attr(&dev, KVD_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
			     (uintptr_t)m + LEN));
	EXPECT_EQ(1, dev);
	ASSERT_EQ(0, fc.attr(&mapped, KVD_CU_POINTER_ATTRIBUTE_MAPPED,
			     (uintptr_t)m + 3 * LEN));
	EXPECT_EQ(0, mapped);
	EXPECT_EQ(KVD_CUDA_ERROR_INVALID_VALUE,
		  fc.attr(&dev, KVD_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
			  (uintptr_t)m + 3 * LEN));
	EXPECT_EQ(KVD_CUDA_ERROR_INVALID_VALUE,
		  fc.attr(&mapped, KVD_CU_POINTER_ATTRIBUTE_MAPPED,
			  (uintptr_t)plain));
	ASSERT_EQ(0, fc.attr(&base, KVD_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
			     (uintptr_t)m + LEN));
	ASSERT_EQ(0, fc.attr(&size, KVD_CU_POINTER_ATTRIBUTE_RANGE_SIZE,
			     (uintptr_t)m + LEN));
	EXPECT_EQ((unsigned long long)(uintptr_t)m, base);
	EXPECT_EQ((size_t)(4 * LEN), size);
	ASSERT_EQ(0, fc.range(&base, &size, (uintptr_t)m + LEN + 4096));
	EXPECT_EQ((unsigned long long)(uintptr_t)(m + LEN), base);
	EXPECT_EQ((size_t)LEN, size);
	ASSERT_EQ(0, fc.pop(&popped));
	EXPECT_EQ(pctx, popped);
	EXPECT_EQ(KVD_CUDA_ERROR_INVALID_CONTEXT, fc.pop(&popped));
	EXPECT_EQ(0, fc.release(1));
	EXPECT_EQ(0, fc.primary_refs(1));
	/* a released primary context cannot be made current */
	EXPECT_EQ(KVD_CUDA_ERROR_INVALID_CONTEXT, fc.push(pctx));
	munmap(plain, LEN);
}

TEST_HARNESS_MAIN
