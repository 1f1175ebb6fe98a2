// SPDX-License-Identifier: MIT
/*
 * cuda_vmm - on a GPU node: what kvdmabuf assumes about the CUDA driver,
 * measured with cuMemGetInfo on memory built as vLLM's sleep mode builds
 * it (cuMemAddressReserve + cuMemCreate + cuMemMap + cuMemSetAccess).
 *
 * Part 1 (driver only; no kernel module, runs where modules cannot be
 * loaded):
 *   - dmabuf_fd_holds_released_memory: after cuMemUnmap + cuMemRelease the
 *     memory is NOT back while the exported dma-buf fd is open, and is
 *     back once it is closed (why the library must drop the backing at
 *     sleep); control: without an export it is back at once;
 *   - wake_at_same_va_reexports: new memory mapped at the same VA exports
 *     again, and holds what was written;
 *   - export_needs_mapped_va, range_over_two_allocations: the fake
 *     libcuda's model (tests/fake_cuda) checked on the real driver;
 *   - library_on_real_driver: libkvdmabuf's CUDA path (fake NICs and
 *     module, tests/lib_fake.h) from a thread with no CUDA context: add,
 *     sleep, release, a wake before cuMemMap fails with -EFAULT, a wake
 *     after it works.
 * Part 2 (needs /dev/kvdmabuf and /dev/kvd_importer, else skipped):
 *   - proxy_sleep_frees_memory: a region behind a proxy with the test
 *     importer attached; after kvdmabuf_sleep + release the memory is
 *     back while proxy and importer stay open; without the library's
 *     sleep it is not; after the wake the importer reads the new bytes.
 *
 * Part 3 (under LD_PRELOAD=libkvdmabuf-preload.so, else skipped; the
 * driver-only test needs no module):
 *   - preload_answers_driver_and_runtime_lookups: dlsym on an RTLD_LOCAL
 *     handle of libcuda, the driver's cuGetProcAddress_v2 and the CUDA
 *     runtime's cudaGetDriverEntryPoint[ByVersion] (libcudart, where one
 *     loads) hand back the preload's cuMemUnmap/cuMemMap/cuMemSetAccess;
 *   - preload_engine_unmap_sleeps_and_set_access_wakes: a declared region
 *     with a stand-in proxy owner: the engine's cuMemUnmap revokes and the
 *     memory is back, its cuMemSetAccess hands over a dma-buf of the new
 *     memory of the region's size, and with the owner's copy dropped
 *     nothing keeps it (control: an owner that keeps it holds it);
 *   - preload_proxy_follows_the_engines_own_calls (module and test
 *     importer): the same through libkvdmabuf's region and the real proxy,
 *     key unchanged, the importer reads the new bytes.
 *
 * libcuda is opened with dlopen (KVDMABUF_CUDA_LIBRARY, default
 * libcuda.so.1), each entry point by the symbol of lib/cuda_api.h's lists;
 * built against the CUDA toolkit's cuda.h where make finds one, else
 * against the project's declarations (tests/cuda_compat.h). Skips, with
 * the reason, without libcuda (or with the toolkit's stub), a GPU, VMM or
 * dma-buf support. KVDMABUF_HW_MIB sets the allocation size (default 1024).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>

#include "harness.h"
#include "lib_fake.h"
#include "lib_imp_nic.h"
#include "kmod/kvd_importer.h"
#include "../uapi/kvdmabuf.h"
#include "../lib/kvdmabuf_preload.h"
#include "cuda_compat.h"

static struct {
	void *dl;
	const char *path;
	/* each entry point with the type of its prototype: cuda.h's where
	 * make found the toolkit, else the project's (tests/cuda_compat.h) */
#define FIELD(name, symbol) __typeof__(name) *name;
	KVD_CUDA_LIB_CALLS(FIELD)
	KVD_CUDA_TEST_CALLS(FIELD)
#undef FIELD
	CUcontext pctx;
	int gdr;                /* VMM memory can be GPUDirect RDMA capable */
	size_t gran, size, tol;
} cu;

static const char *cuerr(CUresult r)
{
	const char *s = NULL;

	if (cu.cuGetErrorName && !cu.cuGetErrorName(r, &s) && s)
		return s;
	return "?";
}

/* Load and set up: NULL, or the reason to skip. */
static const char *cuda_setup(char *why, size_t len)
{
	CUmemAllocationProp prop = { 0 };
	const char *env = getenv("KVDMABUF_HW_MIB");
	int dev, v = 0;
	CUresult r;

	cu.path = getenv("KVDMABUF_CUDA_LIBRARY");
	if (!cu.path)
		cu.path = "libcuda.so.1";
	cu.dl = dlopen(cu.path, RTLD_NOW | RTLD_LOCAL);
	if (!cu.dl) {
		snprintf(why, len, "no CUDA driver library (%s)", dlerror());
		return why;
	}
	if (dlsym(cu.dl, "fakecu_map")) {
		snprintf(why, len, "%s is the fake libcuda: a GPU is needed",
			 cu.path);
		return why;
	}
#define SYM(name, symbol) \
	if (!(*(void **)&cu.name = dlsym(cu.dl, #symbol))) { \
		snprintf(why, len, "%s lacks " #symbol, cu.path); return why; }
	KVD_CUDA_LIB_CALLS(SYM)
	KVD_CUDA_TEST_CALLS(SYM)
#undef SYM
	r = cu.cuInit(0);
	if (r == CUDA_ERROR_STUB_LIBRARY) {
		snprintf(why, len, "CUDA driver stub: no GPU driver on this "
			 "machine (%s is the toolkit's stub libcuda)", cu.path);
		return why;
	}
	if (r) {
		snprintf(why, len, "cuInit: %s (%d; no GPU?)", cuerr(r), (int)r);
		return why;
	}
	if (cu.cuDeviceGet(&dev, 0)) {
		snprintf(why, len, "no CUDA device 0");
		return why;
	}
	if (cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
				    dev) || !v) {
		snprintf(why, len, "device 0 has no dma-buf support "
			 "(open kernel modules needed)");
		return why;
	}
	v = 0;
	cu.cuDeviceGetAttribute(&v,
		CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev);
	cu.gdr = v;
	if (cu.cuDevicePrimaryCtxRetain(&cu.pctx, dev) ||
	    cu.cuCtxPushCurrent_v2(cu.pctx)) {
		snprintf(why, len, "no primary context on device 0");
		return why;
	}
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	r = cu.cuMemGetAllocationGranularity(&cu.gran, &prop,
					     CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r || !cu.gran) {
		snprintf(why, len, "no VMM on device 0 (granularity: %s)",
			 cuerr(r));
		return why;
	}
	cu.size = (size_t)(env ? atoi(env) : 1024) << 20;
	cu.size = (cu.size + cu.gran - 1) / cu.gran * cu.gran;
	cu.tol = cu.size / 4;
	return NULL;
}

#define CUDA_OR_SKIP()                                                   \
	do {                                                             \
		char _why[256];                                          \
		if (cuda_setup(_why, sizeof(_why)))                      \
			SKIP(return, "%s", _why);                        \
	} while (0)

#define CU_OK(call)                                                      \
	do {                                                             \
		CUresult _r = (call);                                    \
		if (_r)                                                  \
			TH_LOG("%s: %s (%d)", #call, cuerr(_r), _r);     \
		ASSERT_EQ(CUDA_SUCCESS, _r);                             \
	} while (0)

static size_t free_mem(void)
{
	size_t f = 0, t = 0;

	cu.cuCtxSynchronize();
	cu.cuMemGetInfo_v2(&f, &t);
	return f;
}

/* Free memory once it has settled at least @want (or after 2 s). */
static size_t free_mem_at_least(size_t want)
{
	struct timespec ts = { 0, 50 * 1000 * 1000 };
	size_t f = free_mem();
	int i;

	for (i = 0; i < 40 && f < want; i++) {
		nanosleep(&ts, NULL);
		f = free_mem();
	}
	return f;
}

/* cuMemCreate of @size on device 0 (GPUDirect RDMA capable if @gdr). */
static CUresult create(CUmemGenericAllocationHandle *h, size_t size, int gdr)
{
	CUmemAllocationProp prop = { 0 };

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.allocFlags.gpuDirectRDMACapable = gdr && cu.gdr;
	return cu.cuMemCreate(h, size, &prop, 0);
}

/* cuMemCreate + cuMemMap at @va + cuMemSetAccess. */
static CUresult create_map(CUdeviceptr va, size_t size,
			   CUmemGenericAllocationHandle *h)
{
	CUmemAccessDesc acc = { { CU_MEM_LOCATION_TYPE_DEVICE, 0 },
				CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUresult r = create(h, size, 1);

	if (r)
		return r;
	r = cu.cuMemMap(va, size, 0, *h, 0);
	if (!r)
		r = cu.cuMemSetAccess(va, size, &acc, 1);
	return r;
}

static CUresult unmap_release(CUdeviceptr va, size_t size,
			      CUmemGenericAllocationHandle h)
{
	CUresult r = cu.cuMemUnmap(va, size);

	return r ? r : cu.cuMemRelease(h);
}

static int export_fd(CUdeviceptr va, size_t size, int *fd)
{
	return cu.cuMemGetHandleForAddressRange(fd, va, size,
						CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
						0);
}

#define MIB(x) ((x) >> 20)

/* ---- part 1: the driver alone ---- */

TEST_TIMEOUT(dmabuf_fd_holds_released_memory, 120)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	size_t f0, f1, f2, f3;
	int fd = -1;

	CUDA_OR_SKIP();
	CU_OK(cu.cuMemAddressReserve(&va, cu.size, 0, 0, 0));
	/* control: no export, the memory is back at once */
	f0 = free_mem();
	CU_OK(create_map(va, cu.size, &h));
	f1 = free_mem();
	CU_OK(unmap_release(va, cu.size, h));
	f2 = free_mem_at_least(f0 - cu.tol);
	TH_LOG("no export: free %zu MiB, allocated %zu, released %zu",
	       MIB(f0), MIB(f1), MIB(f2));
	EXPECT_GE(f0 - f1 + cu.tol, cu.size);
	EXPECT_LE(f0 - f2, cu.tol);
	/* exported: held while the fd is open, back once it is closed */
	f0 = free_mem();
	CU_OK(create_map(va, cu.size, &h));
	CU_OK(export_fd(va, cu.size, &fd));
	f1 = free_mem();
	CU_OK(unmap_release(va, cu.size, h));
	f2 = free_mem();
	close(fd);
	f3 = free_mem_at_least(f0 - cu.tol);
	TH_LOG("exported: free %zu MiB, allocated %zu, released with the fd "
	       "open %zu, fd closed %zu", MIB(f0), MIB(f1), MIB(f2), MIB(f3));
	EXPECT_GE(f0 - f2 + cu.tol, cu.size);   /* not back: fd open */
	EXPECT_LE(f0 - f3, cu.tol);             /* back: fd closed */
	cu.cuMemAddressFree(va, cu.size);
}

TEST_TIMEOUT(wake_at_same_va_reexports, 120)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	struct stat s1, s2;
	uint32_t in[1024], out[1024];
	int fd1 = -1, fd2 = -1, i;

	CUDA_OR_SKIP();
	CU_OK(cu.cuMemAddressReserve(&va, cu.size, 0, 0, 0));
	CU_OK(create_map(va, cu.size, &h));
	CU_OK(export_fd(va, cu.size, &fd1));
	ASSERT_EQ(0, fstat(fd1, &s1));
	close(fd1);
	CU_OK(unmap_release(va, cu.size, h));
	/* an export of the VA now, reserved but unmapped, must fail */
	EXPECT_NE(CUDA_SUCCESS, export_fd(va, cu.size, &fd2));
	CU_OK(create_map(va, cu.size, &h));
	for (i = 0; i < 1024; i++)
		in[i] = 0x5eed0000u + (uint32_t)i;
	CU_OK(cu.cuMemcpyHtoD_v2(va + cu.size / 2, in, sizeof(in)));
	CU_OK(export_fd(va, cu.size, &fd2));
	ASSERT_EQ(0, fstat(fd2, &s2));
	EXPECT_NE(s1.st_ino, s2.st_ino);        /* a new dma-buf */
	CU_OK(cu.cuMemcpyDtoH_v2(out, va + cu.size / 2, sizeof(out)));
	EXPECT_EQ(0, memcmp(in, out, sizeof(in)));
	close(fd2);
	CU_OK(unmap_release(va, cu.size, h));
	cu.cuMemAddressFree(va, cu.size);
}

TEST_TIMEOUT(range_over_two_allocations, 120)
{
	CUmemGenericAllocationHandle h1, h2;
	size_t half;
	CUdeviceptr va;
	int fd = -1;
	CUresult r;

	CUDA_OR_SKIP();
	half = cu.size / 2 / cu.gran * cu.gran;
	if (!half)
		half = cu.gran;
	CU_OK(cu.cuMemAddressReserve(&va, 2 * half, 0, 0, 0));
	CU_OK(create_map(va, half, &h1));
	CU_OK(create_map(va + half, half, &h2));
	/* the whole range, and a sub-range across the seam */
	CU_OK(export_fd(va, 2 * half, &fd));
	close(fd);
	r = export_fd(va + half - 4096 * 4, 4096 * 8, &fd);
	TH_LOG("sub-range across the seam: %s", cuerr(r));
	EXPECT_EQ(CUDA_SUCCESS, r);
	if (!r)
		close(fd);
	CU_OK(unmap_release(va + half, half, h2));
	CU_OK(unmap_release(va, half, h1));
	cu.cuMemAddressFree(va, 2 * half);
}

struct lib_run {
	CUdeviceptr va;
	size_t size;
	int rc[4];
	char msg[4][512];
};

/* The library, from a thread that never touched CUDA. */
static void *lib_thread(void *p)
{
	struct lib_run *l = p;
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	char err[512];

	o.cuda_library = cu.path;
	l->rc[0] = fake_open("protocol: rdma\n", &o, &ctx, err, sizeof(err));
	if (l->rc[0]) {
		snprintf(l->msg[0], sizeof(l->msg[0]), "%s", err);
		return NULL;
	}
	d.addr = (void *)(uintptr_t)l->va;
	d.len = l->size;
	d.mem = KVDMABUF_MEM_CUDA;
	d.tag = "kv_cache";
	l->rc[0] = kvdmabuf_region_add(ctx, &d, &r);
	snprintf(l->msg[0], sizeof(l->msg[0]), "%s", kvdmabuf_last_error(ctx));
	if (!l->rc[0]) {
		l->rc[1] = kvdmabuf_sleep(ctx, NULL);
		/* the test thread releases here, then wakes too early */
		l->rc[2] = 1;
		while (__atomic_load_n(&l->rc[2], __ATOMIC_ACQUIRE) == 1)
			usleep(1000);
		l->rc[2] = kvdmabuf_wake(ctx, NULL);
		snprintf(l->msg[2], sizeof(l->msg[2]), "%s",
			 kvdmabuf_last_error(ctx));
		l->rc[3] = 1;
		while (__atomic_load_n(&l->rc[3], __ATOMIC_ACQUIRE) == 1)
			usleep(1000);
		l->rc[3] = kvdmabuf_wake(ctx, NULL);
		snprintf(l->msg[3], sizeof(l->msg[3]), "%s",
			 kvdmabuf_last_error(ctx));
	}
	kvdmabuf_close(ctx);
	return NULL;
}

TEST_TIMEOUT(library_on_real_driver, 120)
{
	CUmemGenericAllocationHandle h;
	struct lib_run l = { 0 };
	pthread_t t;
	int gdr = -1;

	CUDA_OR_SKIP();
	fake_reset(1);
	fw.module = 1;
	fw.real_export = 1;
	l.size = cu.size;
	CU_OK(cu.cuMemAddressReserve(&l.va, l.size, 0, 0, 0));
	CU_OK(create_map(l.va, l.size, &h));
	cu.cuPointerGetAttribute(&gdr,
				 CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
				 l.va);
	TH_LOG("IS_GPU_DIRECT_RDMA_CAPABLE: %d (VMM GDR supported: %d)",
	       gdr & 0xff, cu.gdr);
	ASSERT_EQ(0, pthread_create(&t, NULL, lib_thread, &l));
	while (!__atomic_load_n(&l.rc[2], __ATOMIC_ACQUIRE) && !l.rc[0])
		usleep(1000);
	if (!l.rc[0]) {
		ASSERT_EQ(0, l.rc[1]);
		CU_OK(unmap_release(l.va, l.size, h));      /* engine sleeps */
		__atomic_store_n(&l.rc[2], 2, __ATOMIC_RELEASE);
		while (__atomic_load_n(&l.rc[3], __ATOMIC_ACQUIRE) != 1)
			usleep(1000);
		CU_OK(create_map(l.va, l.size, &h));         /* engine wakes */
		__atomic_store_n(&l.rc[3], 2, __ATOMIC_RELEASE);
	}
	pthread_join(t, NULL);
	TH_LOG("add: %d %s", l.rc[0], l.msg[0]);
	if (cu.gdr || (gdr & 0xff)) {
		ASSERT_EQ(0, l.rc[0]);
	} else {
		/* memory the driver says is not GPUDirect RDMA capable */
		EXPECT_EQ(-EOPNOTSUPP, l.rc[0]);
		goto out;
	}
	TH_LOG("wake before cuMemMap: %d %s", l.rc[2], l.msg[2]);
	EXPECT_EQ(-EFAULT, l.rc[2]);
	TH_LOG("wake after cuMemMap: %d %s", l.rc[3], l.msg[3]);
	EXPECT_EQ(0, l.rc[3]);
out:
	unmap_release(l.va, l.size, h);
	cu.cuMemAddressFree(l.va, l.size);
}

/* ---- part 2: proxy and test importer ---- */

static struct imp_nic imp = { .fd = -1 };

/* A context on the module, its regions imported by the test importer
 * (imp); false: skipped (no module or importer). */
static bool module_ctx(struct __test_metadata *_metadata,
		       struct kvdmabuf_ctx **ctx)
{
	struct kvdmabuf_options o = { 0 };
	const char *path;
	char err[512];
	int rc;

	if (access(KVDMABUF_DEVICE_PATH, F_OK))
		SKIP(return false, "%s absent (module not loaded)",
		     KVDMABUF_DEVICE_PATH);
	imp.fd = open(KVD_IMPORTER_PATH, O_RDWR | O_CLOEXEC);
	if (imp.fd < 0)
		SKIP(return false, "%s absent (test importer not loaded)",
		     KVD_IMPORTER_PATH);
	path = write_config("protocol: rdma\nmodule: require\n");
	o.config_path = path;
	o.cuda_library = cu.path;
	rc = kvd_open_ops(&o, &imp_nic_ops, &imp, ctx, err, sizeof(err));
	unlink(path);
	if (rc)
		TH_LOG("%s", err);
	ASSERT_EQ(0, rc);
	return true;
}

/* [va, +cu.size) as the KV region of @ctx. */
static struct kvdmabuf_region *kv_region(struct __test_metadata *_metadata,
					 struct kvdmabuf_ctx *ctx,
					 CUdeviceptr va)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r = NULL;
	int rc;

	d.addr = (void *)(uintptr_t)va;
	d.len = cu.size;
	d.mem = KVDMABUF_MEM_CUDA;
	d.tag = "kv_cache";
	rc = kvdmabuf_region_add(ctx, &d, &r);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(ctx));
	ASSERT_EQ(0, rc);
	return r;
}

TEST_TIMEOUT(proxy_sleep_frees_memory, 180)
{
	CUmemGenericAllocationHandle h;
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	uint32_t key0, key, in[1024], out[1024];
	struct kvd_imp_access a = { 0 };
	size_t f0, f1, f2;
	CUdeviceptr va;
	int i, rc;

	CUDA_OR_SKIP();
	if (!module_ctx(_metadata, &ctx))
		return;
	CU_OK(cu.cuMemAddressReserve(&va, cu.size, 0, 0, 0));

	/* without the library's sleep: the proxy's backing holds it */
	f0 = free_mem();
	CU_OK(create_map(va, cu.size, &h));
	r = kv_region(_metadata, ctx, va);
	CU_OK(unmap_release(va, cu.size, h));
	f1 = free_mem();
	TH_LOG("released without sleep: free %zu -> %zu MiB", MIB(f0),
	       MIB(f1));
	EXPECT_GE(f0 - f1 + cu.tol, cu.size);
	ASSERT_EQ(0, kvdmabuf_region_remove(r));
	f1 = free_mem_at_least(f0 - cu.tol);
	EXPECT_LE(f0 - f1, cu.tol);

	/* with it: back while proxy and importer stay open */
	f0 = free_mem();
	CU_OK(create_map(va, cu.size, &h));
	r = kv_region(_metadata, ctx, va);
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &key0, NULL, NULL));
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	CU_OK(unmap_release(va, cu.size, h));
	f1 = free_mem_at_least(f0 - cu.tol);
	TH_LOG("asleep (proxy and importer open): free %zu -> %zu MiB",
	       MIB(f0), MIB(f1));
	EXPECT_LE(f0 - f1, cu.tol);
	CU_OK(create_map(va, cu.size, &h));
	for (i = 0; i < 1024; i++)
		in[i] = 0xa11ce000u + (uint32_t)i;
	CU_OK(cu.cuMemcpyHtoD_v2(va, in, sizeof(in)));
	rc = kvdmabuf_wake(ctx, NULL);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(ctx));
	ASSERT_EQ(0, rc);
	f2 = free_mem();
	TH_LOG("awake again: free %zu MiB", MIB(f2));
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &key, NULL, NULL));
	a.handle = key;
	a.length = sizeof(out);
	a.buf = (uintptr_t)out;
	if (ioctl(imp.fd, KVD_IMP_IOCTL_ACCESS, &a)) {
		TH_LOG("importer read after wake: %s (CPU access to GPU "
		       "dma-bufs is exporter-dependent; not checked)",
		       strerror(errno));
	} else {
		EXPECT_EQ(0, memcmp(in, out, sizeof(in)));
	}
	TH_LOG("key %u -> %u", key0, key);
	kvdmabuf_close(ctx);
	CU_OK(unmap_release(va, cu.size, h));
	cu.cuMemAddressFree(va, cu.size);
	close(imp.fd);
}

/* ---- part 3: under LD_PRELOAD=libkvdmabuf-preload.so ---- */

/* The preload's API, found at run time as the engine's hooks find it. */
static struct {
	int (*declare)(void *, size_t, const char *, int, uint64_t);
	int (*undeclare)(void *);
	int (*set_ops)(void *, const struct kvdmabuf_preload_proxy_ops *);
	int (*query)(struct kvdmabuf_preload_state *);
	int (*cuda_error)(char *, size_t);
} pl;

static const char *preload_setup(void)
{
	*(void **)&pl.declare = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare");
	*(void **)&pl.undeclare = dlsym(RTLD_DEFAULT,
					"kvdmabuf_preload_undeclare");
	*(void **)&pl.set_ops = dlsym(RTLD_DEFAULT,
				      "kvdmabuf_preload_set_proxy_ops");
	*(void **)&pl.query = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_query");
	*(void **)&pl.cuda_error = dlsym(RTLD_DEFAULT,
					 "kvdmabuf_preload_cuda_error");
	if (!pl.declare || !pl.undeclare || !pl.set_ops || !pl.query ||
	    !pl.cuda_error)
		return "libkvdmabuf-preload.so is not loaded (run under "
		       "LD_PRELOAD, as tests/hw/gpu-node.sh does)";
	return NULL;
}

#define PRELOAD_OR_SKIP()                                                \
	do {                                                             \
		const char *_why = preload_setup();                     \
		if (_why)                                                \
			SKIP(return, "%s", _why);                        \
	} while (0)

static unsigned int asleep_regions(void)
{
	struct kvdmabuf_preload_state st = { 0 };

	pl.query(&st);
	return st.nr_asleep;
}

/* Whether @f lies in the preload (its file name says so). */
static int in_preload(void *f)
{
	Dl_info di;

	return f && dladdr(f, &di) && di.dli_fname &&
	       strstr(di.dli_fname, "kvdmabuf-preload");
}

static const char *const interposed[] = {
	"cuMemUnmap", "cuMemMap", "cuMemSetAccess",
};

/* The CUDA runtime's lookup of a driver entry point (12.5+: by version;
 * before: cudaGetDriverEntryPoint, given the 12.x status pointer, which
 * 11.x ignores). */
static int runtime_lookup(void *rt, const char *name, void **fn)
{
	int (*by_version)(const char *, void **, unsigned int,
			  unsigned long long, int *);
	int (*old)(const char *, void **, unsigned long long, int *);
	int status = -1;

	*(void **)&by_version = dlsym(rt, "cudaGetDriverEntryPointByVersion");
	if (by_version)
		return by_version(name, fn, 12000, 0, &status);
	*(void **)&old = dlsym(rt, "cudaGetDriverEntryPoint");
	return old ? old(name, fn, 0, &status) : -1;
}

TEST_TIMEOUT(preload_answers_driver_and_runtime_lookups, 60)
{
	static const char *const rts[] = {
		"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
	};
	CUresult (*gpa)(const char *, void **, int, cuuint64_t, void *);
	const char *rtpath = getenv("KVDMABUF_CUDART_LIBRARY");
	void *rt = NULL, *f;
	unsigned int i;
	int st;

	PRELOAD_OR_SKIP();
	CUDA_OR_SKIP();
	/* dlsym on the engine's own RTLD_LOCAL handle of libcuda */
	*(void **)&gpa = dlsym(cu.dl, "cuGetProcAddress_v2");
	for (i = 0; i < sizeof(interposed) / sizeof(interposed[0]); i++) {
		f = dlsym(cu.dl, interposed[i]);
		TH_LOG("dlsym(libcuda, %s) in the preload: %d", interposed[i],
		       in_preload(f));
		EXPECT_TRUE(in_preload(f));
		f = NULL;
		ASSERT_TRUE(gpa != NULL);
		EXPECT_EQ(CUDA_SUCCESS, gpa(interposed[i], &f, 12000, 0, &st));
		EXPECT_TRUE(in_preload(f));
	}
	/* the CUDA runtime's own lookups (what PyTorch's allocator uses) */
	for (i = 0; !rtpath && i < sizeof(rts) / sizeof(rts[0]); i++) {
		rt = dlopen(rts[i], RTLD_NOW | RTLD_LOCAL);
		if (rt)
			rtpath = rts[i];
	}
	if (!rt && rtpath)
		rt = dlopen(rtpath, RTLD_NOW | RTLD_LOCAL);
	if (!rt) {
		TH_LOG("no CUDA runtime library (libcudart.so.13/12/11.0; "
		       "KVDMABUF_CUDART_LIBRARY): its lookups not checked");
		return;
	}
	for (i = 0; i < sizeof(interposed) / sizeof(interposed[0]); i++) {
		f = NULL;
		st = runtime_lookup(rt, interposed[i], &f);
		TH_LOG("%s: cudaGetDriverEntryPoint(%s): %d, in the preload: "
		       "%d", rtpath, interposed[i], st, in_preload(f));
		EXPECT_EQ(0, st);
		EXPECT_TRUE(in_preload(f));
	}
	dlclose(rt);
}

/*
 * A stand-in for the proxy's owner (the process's kvdmabuf context and
 * /dev/kvdmabuf, which a GPU node may not be able to load): it holds the
 * dma-buf each wake hands it as the module holds a proxy's backing, and
 * drops it at revoke unless @keep.
 */
struct standin_owner {
	int revokes, replaces, held, keep;
	off_t size_seen;
};

static int standin_revoke(void *arg, void *addr, size_t len, char *err,
			  size_t err_len)
{
	struct standin_owner *o = arg;

	(void)addr, (void)len, (void)err, (void)err_len;
	o->revokes++;
	if (!o->keep && o->held >= 0) {
		close(o->held);
		o->held = -1;
	}
	return 0;
}

static int standin_replace(void *arg, void *addr, size_t len, int fd,
			   char *err, size_t err_len)
{
	struct standin_owner *o = arg;

	(void)addr, (void)len;
	o->replaces++;
	o->size_seen = lseek(fd, 0, SEEK_END);
	if (o->held >= 0)
		close(o->held);
	o->held = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (o->held < 0) {
		snprintf(err, err_len, "dup: %s", strerror(errno));
		return -errno;
	}
	return 0;
}

TEST_TIMEOUT(preload_engine_unmap_sleeps_and_set_access_wakes, 180)
{
	struct standin_owner o = { .held = -1 };
	struct kvdmabuf_preload_proxy_ops ops = {
		.revoke = standin_revoke, .replace = standin_replace, .arg = &o,
	};
	CUmemGenericAllocationHandle h;
	size_t f0, f1;
	CUdeviceptr va;
	char msg[512];
	int pfd;

	PRELOAD_OR_SKIP();
	CUDA_OR_SKIP();
	pfd = memfd_create("standin-proxy", MFD_CLOEXEC);
	ASSERT_LE(0, pfd);
	CU_OK(cu.cuMemAddressReserve(&va, cu.size, 0, 0, 0));
	CU_OK(create_map(va, cu.size, &h));
	ASSERT_EQ(0, pl.declare((void *)(uintptr_t)va, cu.size, "kv_cache",
				pfd, 0));
	ASSERT_EQ(0, pl.set_ops((void *)(uintptr_t)va, &ops));

	/* the engine's own sleep: revoke, then the memory is back */
	f0 = free_mem();
	CU_OK(unmap_release(va, cu.size, h));
	EXPECT_EQ(1, o.revokes);
	EXPECT_EQ(1, asleep_regions());
	f1 = free_mem_at_least(f0 + cu.size - cu.tol);
	TH_LOG("unmapped: free %zu -> %zu MiB", MIB(f0), MIB(f1));
	EXPECT_GE(f1 + cu.tol, f0 + cu.size);

	/* its wake: the last cuMemSetAccess exports the new memory */
	CU_OK(create_map(va, cu.size, &h));
	pl.cuda_error(msg, sizeof(msg));
	TH_LOG("woken: replace calls %d, dma-buf of %lld bytes; last "
	       "interposer error: '%s'", o.replaces, (long long)o.size_seen,
	       msg);
	EXPECT_EQ(1, o.replaces);
	EXPECT_EQ((off_t)cu.size, o.size_seen);
	EXPECT_EQ(0, asleep_regions());

	/* asleep again: the owner drops the backing, nothing else holds it
	 * (the preload closed its export) */
	f0 = free_mem();
	CU_OK(unmap_release(va, cu.size, h));
	f1 = free_mem_at_least(f0 + cu.size - cu.tol);
	TH_LOG("second sleep: free %zu -> %zu MiB", MIB(f0), MIB(f1));
	EXPECT_GE(f1 + cu.tol, f0 + cu.size);

	/* control: an owner that keeps it holds the memory (the measure
	 * can fail) */
	o.keep = 1;
	CU_OK(create_map(va, cu.size, &h));
	EXPECT_EQ(2, o.replaces);
	f0 = free_mem();
	CU_OK(unmap_release(va, cu.size, h));
	f1 = free_mem();
	TH_LOG("owner keeps the backing: free %zu -> %zu MiB", MIB(f0),
	       MIB(f1));
	EXPECT_LT(f1, f0 + cu.tol);
	close(o.held);
	f1 = free_mem_at_least(f0 + cu.size - cu.tol);
	EXPECT_GE(f1 + cu.tol, f0 + cu.size);

	EXPECT_EQ(0, pl.undeclare((void *)(uintptr_t)va));
	cu.cuMemAddressFree(va, cu.size);
	close(pfd);
}

/* The same with the real module: libkvdmabuf's region declares itself to
 * the preload; the engine's unmap revokes the proxy, its set-access
 * replaces the backing, the importer keeps its handle throughout. */
TEST_TIMEOUT(preload_proxy_follows_the_engines_own_calls, 180)
{
	CUmemGenericAllocationHandle h;
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	uint32_t key0, key, in[1024], out[1024];
	struct kvd_imp_access a = { 0 };
	size_t f0, f1;
	CUdeviceptr va;
	char err[512];
	int i;

	PRELOAD_OR_SKIP();
	CUDA_OR_SKIP();
	if (!module_ctx(_metadata, &ctx))
		return;
	CU_OK(cu.cuMemAddressReserve(&va, cu.size, 0, 0, 0));
	CU_OK(create_map(va, cu.size, &h));
	r = kv_region(_metadata, ctx, va);
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &key0, NULL, NULL));

	f0 = free_mem();
	CU_OK(unmap_release(va, cu.size, h));   /* no kvdmabuf_sleep */
	EXPECT_EQ(1, asleep_regions());
	f1 = free_mem_at_least(f0 + cu.size - cu.tol);
	TH_LOG("engine unmapped (proxy and importer open): free %zu -> %zu "
	       "MiB", MIB(f0), MIB(f1));
	EXPECT_GE(f1 + cu.tol, f0 + cu.size);
	CU_OK(create_map(va, cu.size, &h));     /* no kvdmabuf_wake */
	pl.cuda_error(err, sizeof(err));
	TH_LOG("after the engine's map: asleep %u, interposer: '%s'",
	       asleep_regions(), err);
	EXPECT_EQ(0, asleep_regions());
	for (i = 0; i < 1024; i++)
		in[i] = 0xfee10000u + (uint32_t)i;
	CU_OK(cu.cuMemcpyHtoD_v2(va, in, sizeof(in)));
	CU_OK(cu.cuCtxSynchronize());
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &key, NULL, NULL));
	EXPECT_EQ(key0, key);
	a.handle = key;
	a.length = sizeof(out);
	a.buf = (uintptr_t)out;
	if (ioctl(imp.fd, KVD_IMP_IOCTL_ACCESS, &a))
		TH_LOG("importer read after the wake: %s (CPU access to GPU "
		       "dma-bufs is exporter-dependent; not checked)",
		       strerror(errno));
	else
		EXPECT_EQ(0, memcmp(in, out, sizeof(in)));
	CU_OK(unmap_release(va, cu.size, h));
	kvdmabuf_close(ctx);
	cu.cuMemAddressFree(va, cu.size);
	close(imp.fd);
}

TEST_HARNESS_MAIN
