// SPDX-License-Identifier: MIT
/*
 * preload_lib - libkvdmabuf's regions under libkvdmabuf-preload.so: a
 * region the library adds with a proxy is declared to the preload with
 * its proxy and the library's own revoke/replace operations, so that the
 * engine's own cuMemUnmap puts that region to sleep (the library's sleep
 * of it: proxy revoked, old backing dropped, its MRs deregistered where
 * they cannot follow) and its cuMemMap + cuMemSetAccess of new memory
 * wake it on that memory (the preload's export becomes the backing; keys
 * unchanged where the NIC follows, new and announced where it pins).
 * Removal undeclares; an undeclare while the preload runs one of the
 * region's operations is refused (-EBUSY).
 *
 * Host-only. What stands in: tests/fake_cuda/libcuda.so.1 for the CUDA
 * driver (its VMM calls, its dma-buf export, a log of its calls); the
 * library's fake backends (tests/lib_fake.h) for the NIC and the module.
 * The preload and the fake libcuda are dlopen()ed RTLD_GLOBAL in that
 * order before the library's first call (as LD_PRELOAD puts the preload
 * first); the library finds the preload with dlsym(RTLD_DEFAULT).
 */
#include <dlfcn.h>

#include "harness.h"
#include "lib_fake.h"
#include "cuda_api.h"
#include "kvdmabuf_preload.h"

#define PAGE 4096ul
#define CHUNK (16 * PAGE)
#define LEN (2 * CHUNK)
#define RW KVD_CU_MEM_ACCESS_FLAGS_PROT_READWRITE

static struct {
	kvd_cuMemUnmap_fn *unmap;       /* the engine's: the interposer */
	kvd_cuMemMap_fn *map;
	kvd_cuMemSetAccess_fn *access;
	kvd_cuMemMap_fn *d_map;         /* the driver's own */
	kvd_cuMemSetAccess_fn *d_access;
	kvd_cuMemCreate_fn *d_create;
	kvd_cuMemRelease_fn *d_release;
	kvd_cuMemAddressReserve_fn *d_reserve;
	void (*log)(char *, size_t);
	void (*last_export)(unsigned long long *, size_t *, unsigned long *);
	unsigned long (*export_calls)(void);
	unsigned long long (*last_export_flags)(void);
	int (*declare)(void *, size_t, const char *, int, uint64_t);
	int (*undeclare)(void *);
	int (*set_ops)(void *, const struct kvdmabuf_preload_proxy_ops *);
	int (*query)(struct kvdmabuf_preload_state *);
	int (*cuda_error)(char *, size_t);
} t;

/* What the library's sleep-start callback saw (the preload holding the
 * region's operations meanwhile). */
static struct {
	int calls, undeclare_rc, set_ops_rc;
	void *base;
} cb;

static int on_sleep_begin(struct kvdmabuf_region *const *r, unsigned int n,
			  void *arg)
{
	(void)r;
	(void)n;
	(void)arg;
	cb.calls++;
	cb.undeclare_rc = t.undeclare(cb.base);
	cb.set_ops_rc = t.set_ops(cb.base, NULL);
	return 0;
}

static int keys_announced;

static void on_keys(struct kvdmabuf_region *const *r, unsigned int n,
		    void *arg)
{
	(void)r;
	(void)arg;
	keys_announced += (int)n;
}

static int load(char *why, size_t len)
{
	char pre[PATH_MAX], cuda[PATH_MAX];
	void *hc;

	kvd_build_path(pre, sizeof(pre), "lib/libkvdmabuf-preload.so");
	kvd_build_path(cuda, sizeof(cuda), "tests/fake_cuda/libcuda.so.1");
	if (access(pre, R_OK) || access(cuda, R_OK)) {
		snprintf(why, len, "%.150s or %.150s not built", pre, cuda);
		return -1;
	}
	if (!dlopen(pre, RTLD_NOW | RTLD_GLOBAL) ||
	    !(hc = dlopen(cuda, RTLD_NOW | RTLD_GLOBAL))) {
		snprintf(why, len, "dlopen: %s", dlerror());
		return -1;
	}
#define G(f, name) *(void **)&t.f = dlsym(RTLD_DEFAULT, name)
#define D(f, name) *(void **)&t.f = dlsym(hc, name)
	G(unmap, "cuMemUnmap");
	G(map, "cuMemMap");
	G(access, "cuMemSetAccess");
	D(d_map, "cuMemMap");
	D(d_access, "cuMemSetAccess");
	D(d_create, "cuMemCreate");
	D(d_release, "cuMemRelease");
	D(d_reserve, "cuMemAddressReserve");
	D(log, "fakecu_log");
	D(last_export, "fakecu_last_export");
	D(export_calls, "fakecu_export_calls");
	D(last_export_flags, "fakecu_last_export_flags");
	G(declare, "kvdmabuf_preload_declare");
	G(undeclare, "kvdmabuf_preload_undeclare");
	G(set_ops, "kvdmabuf_preload_set_proxy_ops");
	G(query, "kvdmabuf_preload_query");
	G(cuda_error, "kvdmabuf_preload_cuda_error");
#undef G
#undef D
	if (!t.unmap || !t.map || !t.access || !t.d_map || !t.d_access ||
	    !t.d_create || !t.d_release || !t.d_reserve || !t.log ||
	    !t.last_export || !t.export_calls || !t.last_export_flags ||
	    !t.declare || !t.undeclare || !t.set_ops ||
	    !t.query || !t.cuda_error) {
		snprintf(why, len, "a symbol is missing");
		return -1;
	}
	return 0;
}

static const kvd_CUmemAccessDesc rw = {
	.location = { .type = KVD_CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
	.flags = RW,
};

/* New memory for chunk @i of @base: cuMemCreate, cuMemMap, cuMemSetAccess
 * through @map and @access. */
/* New memory for chunk @i (GPUDirect RDMA capable unless gdr_off). */
static int gdr_off;

static int map_chunk(char *base, int i, kvd_cuMemMap_fn *map,
		     kvd_cuMemSetAccess_fn *access)
{
	kvd_CUdeviceptr p = (kvd_CUdeviceptr)(uintptr_t)(base + i * CHUNK);
	kvd_CUmemAllocationProp prop = { 0 };
	kvd_CUmemGenericAllocationHandle h;

	prop.type = KVD_CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = KVD_CU_MEM_LOCATION_TYPE_DEVICE;
	prop.allocFlags.gpuDirectRDMACapable = !gdr_off;
	if (t.d_create(&h, CHUNK, &prop, 0) || map(p, CHUNK, 0, h, 0))
		return -1;
	t.d_release(h);
	return access(p, CHUNK, &rw, 1) ? -1 : 0;
}

static char *log_now(void)
{
	static char buf[4096];

	t.log(buf, sizeof(buf));
	return buf;
}

static struct kvdmabuf_preload_state pstate(void)
{
	struct kvdmabuf_preload_state st = { .nr_regions = ~0u };

	t.query(&st);
	return st;
}

static struct kvdmabuf_region_info rinfo(struct kvdmabuf_region *r)
{
	struct kvdmabuf_region_info in = { .asleep = -1 };

	kvdmabuf_region_info(r, &in);
	return in;
}

#define LOG_IS(want)                                                    \
	do {                                                            \
		const char *l_ = log_now();                             \
		if (strcmp(l_, want))                                   \
			TH_LOG("call log '%s', expected '%s'", l_, want); \
		EXPECT_EQ(0, strcmp(l_, want));                         \
	} while (0)

FIXTURE(lr) {
	char *base;
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
};

FIXTURE_VARIANT(lr) {
	int pins;                       /* the NIC pins: REREGISTER */
};

FIXTURE_VARIANT_ADD(lr, follow) { .pins = 0 };
FIXTURE_VARIANT_ADD(lr, reregister) { .pins = 1 };

FIXTURE_SETUP(lr)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region_desc d = { 0 };
	kvd_CUdeviceptr p;
	char why[400];
	int rc;

	self->ctx = NULL;
	if (load(why, sizeof(why)))
		SKIP(return, "%s", why);
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.d_reserve(&p, LEN, 0, 0, 0));
	self->base = (char *)(uintptr_t)p;
	ASSERT_EQ(0, map_chunk(self->base, 0, t.d_map, t.d_access));
	ASSERT_EQ(0, map_chunk(self->base, 1, t.d_map, t.d_access));
	memset(&cb, 0, sizeof(cb));
	cb.base = self->base;
	keys_announced = 0;
	fake_reset(1);
	fw.module = 1;
	fw.nic_pins[0] = variant->pins;
	o.sleep_begin = on_sleep_begin;
	o.key_change = on_keys;
	rc = fake_open("protocol: rdma\n", &o, &self->ctx, why, sizeof(why));
	if (rc)
		TH_LOG("%s", why);
	ASSERT_EQ(0, rc);
	d.addr = self->base;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_CUDA;
	d.tag = "kv_cache";
	rc = kvdmabuf_region_add(self->ctx, &d, &self->r);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	ASSERT_EQ(0, rc);
	ASSERT_EQ(variant->pins ? KVDMABUF_MODE_REREGISTER :
		  KVDMABUF_MODE_FOLLOW, rinfo(self->r).mode);
	log_now();
}

FIXTURE_TEARDOWN(lr)
{
	if (self->ctx)
		EXPECT_EQ(0, kvdmabuf_close(self->ctx));
	fake_proxy_gc();
	EXPECT_EQ(0, fake_mrs_live());
}

TEST_F(lr, the_engines_unmap_and_map_sleep_and_wake_the_region)
{
	kvd_CUdeviceptr b = (kvd_CUdeviceptr)(uintptr_t)self->base;
	uint32_t lk0, rk0, lk, rk;
	uint64_t gen0, gen;
	unsigned long ex0, ex;
	unsigned long long ptr;
	size_t size;
	int p = fake_find_proxy(self->r->proxy_fd);

	ASSERT_LE(0, p);
	/* declared by the library, with its proxy */
	EXPECT_EQ(1u, pstate().nr_regions);
	ASSERT_EQ(0, kvdmabuf_region_keys(self->r, 0, &lk0, &rk0, &gen0));
	t.last_export(&ptr, &size, &ex0);

	/* the engine releases its memory: the library's sleep of it first */
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.unmap(b, LEN));
	LOG_IS("unmap");
	EXPECT_EQ(1, rinfo(self->r).asleep);
	EXPECT_EQ(1u, pstate().nr_asleep);
	EXPECT_EQ(KVD_PROXY_REVOKED, fw.px[p].state);
	EXPECT_EQ(0, fds_named("fake-backing"));        /* nothing kept */
	EXPECT_EQ(1, cb.calls);
	EXPECT_EQ(variant->pins ? 0 : 1, fake_mrs_live());
	EXPECT_NE(0, kvdmabuf_io_begin(self->r));     /* I/O stopped */

	/* new memory, mapped and made accessible: woken on it */
	ASSERT_EQ(0, map_chunk(self->base, 0, t.map, t.access));
	EXPECT_EQ(1, rinfo(self->r).asleep);
	ASSERT_EQ(0, map_chunk(self->base, 1, t.map, t.access));
	LOG_IS("map access map access export");
	EXPECT_EQ(0, rinfo(self->r).asleep);
	EXPECT_EQ(0u, pstate().nr_asleep);
	t.last_export(&ptr, &size, &ex);
	EXPECT_EQ(ex0 + 1, ex);
	EXPECT_EQ(b, ptr);
	EXPECT_EQ((size_t)LEN, size);
	/* the library's own export is the backing, as kvdmabuf_wake's */
	EXPECT_EQ(KVD_PROXY_BACKED, fw.px[p].state);
	EXPECT_EQ(2u, fw.exports);
	EXPECT_EQ(1, fake_mrs_live());
	ASSERT_EQ(0, kvdmabuf_region_keys(self->r, 0, &lk, &rk, &gen));
	if (variant->pins) {
		/* registered anew, the engine told */
		EXPECT_EQ(gen0 + 1, gen);
		EXPECT_NE(lk0, lk);
		EXPECT_EQ(1, keys_announced);
	} else {
		EXPECT_EQ(gen0, gen);
		EXPECT_EQ(lk0, lk);
		EXPECT_EQ(rk0, rk);
		EXPECT_EQ(0, keys_announced);
	}
	EXPECT_EQ(0, kvdmabuf_io_begin(self->r));
	kvdmabuf_io_end(self->r);
	/* the library's own sleep and wake work on as before */
	EXPECT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	EXPECT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	EXPECT_EQ(0, rinfo(self->r).asleep);
}

/*
 * The engine's wake is the library's wake: the new memory is exported by
 * the library as kvdmabuf_wake() exports it (its GPUDirect check, its
 * cuda_dmabuf_mapping, the mapping region_info reports), not taken from
 * the preload's export. Memory that is not GPUDirect RDMA capable is
 * refused (the engine's cuMemSetAccess fails, the region stays asleep);
 * capable memory wakes it, with the PCIe mapping recorded. (Before, the
 * preload's export became the backing unchecked.)
 */
TEST_F(lr, the_engines_wake_is_the_librarys_own_export)
{
	kvd_CUdeviceptr b = (kvd_CUdeviceptr)(uintptr_t)self->base;
	unsigned long n0;
	char err[512];
	int p = fake_find_proxy(self->r->proxy_fd);

	ASSERT_LE(0, p);
	fw.real_export = 1;     /* the library's export: the fake libcuda */
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.unmap(b, LEN));
	EXPECT_EQ(1, rinfo(self->r).asleep);
	n0 = t.export_calls();

	gdr_off = 1;
	ASSERT_EQ(0, map_chunk(self->base, 0, t.map, t.access));
	EXPECT_NE(0, map_chunk(self->base, 1, t.map, t.access));
	gdr_off = 0;
	t.cuda_error(err, sizeof(err));
	TH_LOG("memory without GPUDirect RDMA: %s", err);
	EXPECT_NOT_NULL(strstr(err, "GPUDirect"));
	EXPECT_EQ(1, rinfo(self->r).asleep);
	EXPECT_EQ(KVD_PROXY_REVOKED, fw.px[p].state);
	EXPECT_NE(0, kvdmabuf_io_begin(self->r));

	/* the engine maps capable memory instead: woken on the library's
	 * export (one by the preload, one by the library) */
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.unmap(b, LEN));
	n0 = t.export_calls();
	ASSERT_EQ(0, map_chunk(self->base, 0, t.map, t.access));
	ASSERT_EQ(0, map_chunk(self->base, 1, t.map, t.access));
	EXPECT_EQ(0, rinfo(self->r).asleep);
	EXPECT_EQ(KVD_PROXY_BACKED, fw.px[p].state);
	EXPECT_EQ(n0 + 2, t.export_calls());
	EXPECT_EQ(KVDMABUF_MAPPING_PCIE, rinfo(self->r).mapping);
	EXPECT_EQ(1ull, t.last_export_flags());
	fw.real_export = 0;
}

TEST_F(lr, operations_held_while_they_run)
{
	ASSERT_EQ(KVD_CUDA_SUCCESS,
		  t.unmap((kvd_CUdeviceptr)(uintptr_t)self->base, LEN));
	/* the sleep-start callback ran inside the preload's revoke */
	EXPECT_EQ(1, cb.calls);
	EXPECT_EQ(-EBUSY, cb.undeclare_rc);
	EXPECT_EQ(-EBUSY, cb.set_ops_rc);
	EXPECT_EQ(1u, pstate().nr_regions);
}

TEST_F(lr, a_hooks_identical_declaration_keeps_the_operations)
{
	/* Mooncake's hook: preload_declare(..., dmabuf=region.dmabuf()) */
	EXPECT_EQ(0, t.declare(self->base, LEN, "kv_cache",
			       self->r->proxy_fd, 0));
	EXPECT_EQ(-EINVAL, t.declare(self->base, CHUNK, "kv_cache",
				     self->r->proxy_fd, 0));
	EXPECT_EQ(1u, pstate().nr_regions);
	ASSERT_EQ(KVD_CUDA_SUCCESS,
		  t.unmap((kvd_CUdeviceptr)(uintptr_t)self->base, LEN));
	EXPECT_EQ(1, rinfo(self->r).asleep);
}

TEST_F(lr, without_the_librarys_operations_the_unmap_is_refused)
{
	char e[512];

	/* what a region with a proxy and no owner gets */
	ASSERT_EQ(0, t.set_ops(self->base, NULL));
	memset(self->base, 0x5a, LEN);
	EXPECT_EQ(KVD_CUDA_ERROR_NOT_PERMITTED,
		  t.unmap((kvd_CUdeviceptr)(uintptr_t)self->base, LEN));
	t.cuda_error(e, sizeof(e));
	EXPECT_NOT_NULL(strstr(e, "no proxy operations"));
	LOG_IS("");
	EXPECT_EQ(0, rinfo(self->r).asleep);
	EXPECT_EQ(0x5a, self->base[LEN - 1]);
}

/* The size of what fd @fd holds (a fake export: its memfd), or -1. */
static long fd_size(int fd)
{
	struct stat st;

	return fd < 0 || fstat(fd, &st) ? -1 : (long)st.st_size;
}

/*
 * An elastic pool (issue 38): the engine gives one chunk of an awake region
 * back with its own cuMemUnmap and maps it again later. Where the NIC
 * follows moves, the region stays awake: the chunk's range of the proxy is
 * unbacked in one module call (one notification), the rest is backed by an
 * export per allocation (the whole-region export, which holds every chunk,
 * is gone), keys and MRs unchanged; the engine's cuMemSetAccess of new
 * memory there brings that range in again (the library's export of the
 * chunk). A driver that refuses the unmap gets the range back at once.
 * Where the NIC pins, the region sleeps whole, as before. The fake module's
 * RANGES (tests/lib_fake.h) stands for the real one (tests/module/
 * proxy_ranges) and keeps the layout for the test to read.
 */
TEST_F(lr, an_engine_giving_back_one_chunk_keeps_the_region_awake)
{
	kvd_CUdeviceptr b = (kvd_CUdeviceptr)(uintptr_t)self->base;
	int p = fake_find_proxy(self->r->proxy_fd);
	const struct fake_piece *pc;
	uint32_t lk0, rk0, lk, rk;
	uint64_t gen0, gen, n0;

	ASSERT_LE(0, p);
	ASSERT_EQ(0, kvdmabuf_region_keys(self->r, 0, &lk0, &rk0, &gen0));
	n0 = fw.px[p].notifications;
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.unmap(b + CHUNK, CHUNK));
	if (variant->pins) {
		/* a pinned registration cannot follow part of it: the
		 * region sleeps whole and wakes once the chunk is back */
		EXPECT_EQ(1, rinfo(self->r).asleep);
		EXPECT_EQ(KVD_PROXY_REVOKED, fw.px[p].state);
		EXPECT_EQ(0u, fw.px[p].ranges_calls);
		ASSERT_EQ(0, map_chunk(self->base, 1, t.map, t.access));
		EXPECT_EQ(0, rinfo(self->r).asleep);
		return;
	}
	/* chunk 0 exported alone, then the engine's unmap */
	LOG_IS("export unmap");
	EXPECT_EQ(0, rinfo(self->r).asleep);
	EXPECT_EQ(0u, pstate().nr_asleep);
	EXPECT_EQ(0, cb.calls);                 /* no sleep began */
	EXPECT_EQ(1u, fw.px[p].ranges_calls);
	EXPECT_EQ(n0 + 1, fw.px[p].notifications);
	pc = fake_piece_at(p, 0);
	ASSERT_NOT_NULL(pc);
	EXPECT_EQ((long)CHUNK, fd_size(pc->fd)); /* not the whole export */
	pc = fake_piece_at(p, CHUNK);
	ASSERT_NOT_NULL(pc);
	EXPECT_EQ(-1, pc->fd);                  /* the chunk: unbacked */
	EXPECT_EQ(1, fds_named("fake-backing")); /* chunk 0's, in the proxy */
	EXPECT_EQ(1, fake_mrs_live());
	ASSERT_EQ(0, kvdmabuf_region_keys(self->r, 0, &lk, &rk, &gen));
	EXPECT_EQ(gen0, gen);
	EXPECT_EQ(lk0, lk);
	EXPECT_EQ(rk0, rk);
	EXPECT_EQ(0, kvdmabuf_io_begin(self->r));       /* serving */
	kvdmabuf_io_end(self->r);

	/* new memory for the chunk: brought in, nothing else touched */
	ASSERT_EQ(0, map_chunk(self->base, 1, t.map, t.access));
	LOG_IS("map access export");
	EXPECT_EQ(2u, fw.px[p].ranges_calls);
	EXPECT_EQ(n0 + 2, fw.px[p].notifications);
	pc = fake_piece_at(p, CHUNK);
	ASSERT_NOT_NULL(pc);
	EXPECT_EQ((long)CHUNK, fd_size(pc->fd));
	EXPECT_EQ(2, fds_named("fake-backing"));
	/* a cuMemSetAccess over it again changes nothing */
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.access(b + CHUNK, CHUNK, &rw, 1));
	EXPECT_EQ(2u, fw.px[p].ranges_calls);

	/* the driver refuses the unmap: the chunk is brought in again */
	setenv("FAKE_CUDA_MODE", "unmap_fail", 1);
	EXPECT_NE(KVD_CUDA_SUCCESS, t.unmap(b + CHUNK, CHUNK));
	unsetenv("FAKE_CUDA_MODE");
	EXPECT_EQ(4u, fw.px[p].ranges_calls);
	pc = fake_piece_at(p, CHUNK);
	ASSERT_NOT_NULL(pc);
	EXPECT_EQ((long)CHUNK, fd_size(pc->fd));
	EXPECT_EQ(0, rinfo(self->r).asleep);

	/* both chunks given back, one at a time: an empty pool holds
	 * nothing and stays awake; each comes back on its own */
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.unmap(b + CHUNK, CHUNK));
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.unmap(b, CHUNK));
	EXPECT_EQ(0, fds_named("fake-backing"));
	EXPECT_EQ(0, rinfo(self->r).asleep);
	ASSERT_EQ(0, map_chunk(self->base, 0, t.map, t.access));
	ASSERT_EQ(0, map_chunk(self->base, 1, t.map, t.access));
	EXPECT_EQ(0, rinfo(self->r).asleep);
	pc = fake_piece_at(p, CHUNK);
	ASSERT_NOT_NULL(pc);
	EXPECT_LE(0, pc->fd);
	ASSERT_EQ(0, kvdmabuf_region_keys(self->r, 0, &lk, &rk, &gen));
	EXPECT_EQ(lk0, lk);
	EXPECT_EQ(rk0, rk);
	EXPECT_EQ(1, fake_mrs_live());

	/* given back again; both mapped, then one cuMemSetAccess over the
	 * two: one export per allocation, else a dma-buf of both would hold
	 * either chunk after the engine gives it back */
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.unmap(b, CHUNK));
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.unmap(b + CHUNK, CHUNK));
	for (int i = 0; i < 2; i++) {
		kvd_CUmemAllocationProp prop = { 0 };
		kvd_CUmemGenericAllocationHandle h;

		prop.type = KVD_CU_MEM_ALLOCATION_TYPE_PINNED;
		prop.location.type = KVD_CU_MEM_LOCATION_TYPE_DEVICE;
		prop.allocFlags.gpuDirectRDMACapable = 1;
		ASSERT_EQ(KVD_CUDA_SUCCESS, t.d_create(&h, CHUNK, &prop, 0));
		ASSERT_EQ(KVD_CUDA_SUCCESS, t.map(b + i * CHUNK, CHUNK, 0, h, 0));
		t.d_release(h);
	}
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.access(b, LEN, &rw, 1));
	for (int i = 0; i < 2; i++) {
		pc = fake_piece_at(p, i * CHUNK);
		ASSERT_NOT_NULL(pc);
		EXPECT_EQ((long)CHUNK, fd_size(pc->fd));
	}
}

/*
 * An elastic pool that starts empty (KVDMABUF_REGION_EMPTY, a kvcached-
 * shaped engine: VA reserved, nothing mapped when the transfer engine
 * registers it): each chunk the engine maps and makes accessible comes
 * in, each it unmaps goes, under one registration.
 */
TEST(an_empty_pool_brings_in_each_chunk_the_engine_maps)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_options o = { 0 };
	const struct fake_piece *pc;
	struct kvdmabuf_region *r;
	struct kvdmabuf_ctx *ctx;
	kvd_CUdeviceptr b;
	char why[400];
	int p;

	if (load(why, sizeof(why)))
		SKIP(return, "%s", why);
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.d_reserve(&b, LEN, 0, 0, 0));
	fake_reset(1);
	fw.module = 1;
	ASSERT_EQ(0, fake_open("protocol: rdma\n", &o, &ctx, why,
			       sizeof(why)));
	d.addr = (void *)(uintptr_t)b;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_CUDA;
	d.flags = KVDMABUF_REGION_EMPTY;
	d.tag = "kv_pool";
	ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &r));
	p = fake_find_proxy(r->proxy_fd);
	ASSERT_LE(0, p);
	EXPECT_EQ(1u, fw.px[p].ranges_calls);
	log_now();

	ASSERT_EQ(0, map_chunk(d.addr, 1, t.map, t.access));
	LOG_IS("map access export");
	EXPECT_EQ(2u, fw.px[p].ranges_calls);
	pc = fake_piece_at(p, CHUNK);
	ASSERT_NOT_NULL(pc);
	EXPECT_EQ((long)CHUNK, fd_size(pc->fd));
	EXPECT_EQ(-1, fake_piece_at(p, 0)->fd);
	EXPECT_EQ(0, rinfo(r).asleep);

	ASSERT_EQ(KVD_CUDA_SUCCESS, t.unmap(b + CHUNK, CHUNK));
	EXPECT_EQ(3u, fw.px[p].ranges_calls);
	EXPECT_EQ(-1, fake_piece_at(p, CHUNK)->fd);
	EXPECT_EQ(0, fds_named("fake-backing"));
	EXPECT_EQ(1, fake_mrs_live());
	EXPECT_EQ(0, kvdmabuf_close(ctx));
	fake_proxy_gc();
}

TEST_F(lr, refused_by_the_library_nothing_is_unmapped)
{
	char e[512];

	/* a transfer of the library's in flight: its drain times out */
	self->ctx->drain_timeout_ms = 1;
	ASSERT_EQ(0, kvdmabuf_io_begin(self->r));
	EXPECT_EQ(KVD_CUDA_ERROR_NOT_PERMITTED,
		  t.unmap((kvd_CUdeviceptr)(uintptr_t)self->base, LEN));
	kvdmabuf_io_end(self->r);
	t.cuda_error(e, sizeof(e));
	TH_LOG("%s", e);
	EXPECT_NOT_NULL(strstr(e, "revoke of KV region 'kv_cache'"));
	LOG_IS("");
	EXPECT_EQ(0, rinfo(self->r).asleep);
	EXPECT_EQ(0u, pstate().nr_asleep);
}

TEST_F(lr, removal_undeclares)
{
	ASSERT_EQ(0, kvdmabuf_region_remove(self->r));
	EXPECT_EQ(0u, pstate().nr_regions);
	/* the engine's unmap passes through now */
	ASSERT_EQ(KVD_CUDA_SUCCESS,
		  t.unmap((kvd_CUdeviceptr)(uintptr_t)self->base, LEN));
	LOG_IS("unmap");
	EXPECT_EQ(0, cb.calls);
	ASSERT_EQ(0, kvdmabuf_close(self->ctx));
	self->ctx = NULL;
}

/*
 * registrations: engine (proxy-only): the library opens no NIC and makes
 * no MR; each device region still gets its proxy, declared to the preload
 * with the library's operations, so the engine's own registrations (made
 * on the proxy by the preload) follow the engine's unmap and map. The
 * library's sleep and wake work as well. The module is required, NICs
 * cannot be added, host memory released at sleep is refused.
 */
TEST(proxy_only_the_library_makes_no_mr_of_its_own)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r, *h;
	struct kvdmabuf_ctx *ctx = NULL;
	struct kvdmabuf_state st;
	kvd_CUdeviceptr p;
	char *base, why[512];
	void *host;
	int px, rc;

	if (load(why, sizeof(why)))
		SKIP(return, "%s", why);
	fake_reset(1);
	fw.module = 0;
	EXPECT_EQ(-ENODEV, fake_open("protocol: rdma\nregistrations: engine\n",
				     NULL, &ctx, why, sizeof(why)));
	TH_LOG("without the module: %s", why);
	EXPECT_EQ(-EINVAL, fake_open("protocol: rdma\nregistrations: engine\n"
				     "module: off\n", NULL, &ctx, why,
				     sizeof(why)));
	fw.module = 1;
	rc = fake_open("protocol: rdma\nregistrations: engine\n", NULL, &ctx,
		       why, sizeof(why));
	if (rc)
		TH_LOG("%s", why);
	ASSERT_EQ(0, rc);
	ASSERT_EQ(0, kvdmabuf_query(ctx, &st));
	EXPECT_EQ(0u, st.nr_nics);
	EXPECT_EQ(1, st.module);

	ASSERT_EQ(KVD_CUDA_SUCCESS, t.d_reserve(&p, LEN, 0, 0, 0));
	base = (char *)(uintptr_t)p;
	ASSERT_EQ(0, map_chunk(base, 0, t.d_map, t.d_access));
	ASSERT_EQ(0, map_chunk(base, 1, t.d_map, t.d_access));
	d.addr = base;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_CUDA;
	d.tag = "kv_cache";
	rc = kvdmabuf_region_add(ctx, &d, &r);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(ctx));
	ASSERT_EQ(0, rc);
	EXPECT_EQ(KVDMABUF_MODE_FOLLOW, rinfo(r).mode);
	EXPECT_EQ(0, fake_mrs_live());
	px = fake_find_proxy(r->proxy_fd);
	ASSERT_LE(0, px);
	EXPECT_EQ(KVD_PROXY_BACKED, fw.px[px].state);
	EXPECT_EQ(1u, pstate().nr_regions);

	/* the engine's own sleep and wake move the proxy */
	ASSERT_EQ(KVD_CUDA_SUCCESS, t.unmap(p, LEN));
	EXPECT_EQ(KVD_PROXY_REVOKED, fw.px[px].state);
	EXPECT_EQ(1, rinfo(r).asleep);
	ASSERT_EQ(0, map_chunk(base, 0, t.map, t.access));
	ASSERT_EQ(0, map_chunk(base, 1, t.map, t.access));
	EXPECT_EQ(KVD_PROXY_BACKED, fw.px[px].state);
	EXPECT_EQ(0, rinfo(r).asleep);
	/* and the library's */
	EXPECT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	EXPECT_EQ(KVD_PROXY_REVOKED, fw.px[px].state);
	EXPECT_EQ(0, kvdmabuf_wake(ctx, NULL));
	EXPECT_EQ(KVD_PROXY_BACKED, fw.px[px].state);
	EXPECT_EQ(0, fake_mrs_live());

	EXPECT_EQ(-EINVAL, kvdmabuf_nic_add(ctx, (struct ibv_pd *)base, NULL));
	host = mmap(NULL, PAGE, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, host);
	d.addr = host;
	d.len = PAGE;
	d.mem = KVDMABUF_MEM_HOST;
	d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
	d.tag = "host";
	EXPECT_EQ(-EINVAL, kvdmabuf_region_add(ctx, &d, &h));
	EXPECT_NOT_NULL(strstr(kvdmabuf_last_error(ctx), "registrations: "
			       "engine"));
	EXPECT_EQ(0, kvdmabuf_close(ctx));
	EXPECT_EQ(0u, pstate().nr_regions);
	munmap(host, PAGE);
	fake_proxy_gc();
}

TEST_HARNESS_MAIN
