// SPDX-License-Identifier: MIT
/*
 * lib_cuda - the CUDA export path through dlopen: CUDA absent gives a
 * clear error (not a crash) and the rest of the library keeps working;
 * each CUDA failure is reported with its CUDA error name; a working export
 * asks for exactly the region's range and is redone at every wake.
 * Host-only: tests/fake_cuda/libcuda.so.1 stands for the CUDA driver,
 * fake NICs and module (tests/lib_fake.h) for the rest.
 */
#include <dlfcn.h>
#include <libgen.h>

#include "harness.h"
#include "lib_fake.h"

#define LEN (8 * 4096)

static const char *fake_cuda_path(void)
{
	static char path[PATH_MAX];
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n <= 0)
		return NULL;
	exe[n] = '\0';
	snprintf(path, sizeof(path), "%s/fake_cuda/libcuda.so.1",
		 dirname(exe));
	return access(path, R_OK) ? NULL : path;
}

static int open_ctx(const char *cuda, struct kvdmabuf_ctx **ctx)
{
	struct kvdmabuf_options o = { 0 };
	char err[512];

	o.cuda_library = cuda;
	return fake_open("protocol: rdma\n", &o, ctx, err, sizeof(err));
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

FIXTURE(cu) {
	struct kvdmabuf_ctx *ctx;
	void *mem;
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
	self->lib = fake_cuda_path();
	if (!self->lib)
		SKIP(return, "tests/fake_cuda/libcuda.so.1 not built");
	fake_reset(2);
	fw.module = 1;
	fw.real_export = 1;
	self->mem = region_mem(4 * LEN);
	ASSERT_NE(NULL, self->mem);
	ASSERT_EQ(0, open_ctx(self->lib, &self->ctx));
}

FIXTURE_TEARDOWN(cu)
{
	unsetenv("FAKE_CUDA_MODE");
	if (self->ctx)
		kvdmabuf_close(self->ctx);
	if (self->mem)
		munmap(self->mem, 4 * LEN);
}

TEST_F(cu, failure_is_named_and_rolled_back)
{
	struct kvdmabuf_region *r;
	int fds = fds_open();

	setenv("FAKE_CUDA_MODE", variant->mode, 1);
	ASSERT_EQ(variant->rc, add(self->ctx, self->mem, LEN,
				   KVDMABUF_MEM_CUDA, &r));
	TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx), variant->msg));
	EXPECT_EQ(0, fake_mrs_live());
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
	if (!strcmp(variant->mode, "noinit")) {
		/* cuInit ran once, at first use: a wake does not redo it */
		ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
		return;
	}
	ASSERT_EQ(variant->rc, kvdmabuf_wake(self->ctx, NULL));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx), variant->msg));
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
	void (*last)(unsigned long long *, size_t *, unsigned long *);
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;
	const char *lib = fake_cuda_path();
	unsigned long long p;
	unsigned long count, before;
	size_t sz;
	char *m;
	void *h;
	int cycle;

	if (!lib)
		SKIP(return, "tests/fake_cuda/libcuda.so.1 not built");
	fake_reset(2);
	fw.module = 1;
	fw.real_export = 1;
	m = region_mem(4 * LEN);
	ASSERT_NE(NULL, m);
	ASSERT_EQ(0, open_ctx(lib, &ctx));
	/* a range inside a larger allocation: export exactly that range */
	ASSERT_EQ(0, add(ctx, m + LEN, 2 * LEN, KVDMABUF_MEM_CUDA, &r));
	h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	ASSERT_NE(NULL, h);
	*(void **)&last = dlsym(h, "fakecu_last_export");
	ASSERT_NE(NULL, (void *)last);
	last(&p, &sz, &count);
	EXPECT_EQ((unsigned long long)(uintptr_t)(m + LEN), p);
	EXPECT_EQ((size_t)(2 * LEN), sz);
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(KVDMABUF_MODE_FOLLOW, in.mode);
	before = count;
	for (cycle = 1; cycle <= 2; cycle++) {
		ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
		ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
		last(&p, &sz, &count);
		EXPECT_EQ(before + (unsigned long)cycle, count);
		EXPECT_EQ((unsigned long long)(uintptr_t)(m + LEN), p);
		EXPECT_EQ((size_t)(2 * LEN), sz);
	}
	dlclose(h);
	kvdmabuf_close(ctx);
	munmap(m, 4 * LEN);
}

TEST(cuda_library_from_config)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	const char *lib = fake_cuda_path();
	char yaml[PATH_MAX + 64], err[512];
	void *m = region_mem(LEN);

	if (!lib)
		SKIP(return, "tests/fake_cuda/libcuda.so.1 not built");
	fake_reset(1);
	fw.real_export = 1;
	snprintf(yaml, sizeof(yaml), "protocol: rdma\ncuda_library: %s\n",
		 lib);
	ASSERT_EQ(0, fake_open(yaml, &o, &ctx, err, sizeof(err)));
	ASSERT_EQ(0, add(ctx, m, LEN, KVDMABUF_MEM_CUDA, &r));
	kvdmabuf_close(ctx);
	munmap(m, LEN);
}

TEST_HARNESS_MAIN
