// SPDX-License-Identifier: MIT
/*
 * cuda_engine.c - for tests/preload/preload_cuda: an engine linked with -lcuda (as
 * vLLM's cumem_allocator is), built against the toolkit's cuda.h where
 * there is one, run under LD_PRELOAD=libkvdmabuf-preload.so with the fake
 * libcuda first on LD_LIBRARY_PATH. It calls cuMemUnmap, cuMemMap and
 * cuMemSetAccess by name (bound by the dynamic linker at start), as the
 * CUDA runtime does (dlsym() of cuGetProcAddress_v2 on its own handle of
 * libcuda, then that function), and, for the wake, through cuda.h's
 * cuGetProcAddress (cuGetProcAddress_v2). Its
 * "hook" (what a sleep hook in the same process would do) declares the
 * region and the stand-in proxy operations through the preload's API,
 * found with dlsym(). Prints what the test checks, one "key: value" a
 * line; exits 0 when every call succeeded.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "cuda_compat.h"
#include "kvdmabuf_preload.h"

#define CHUNK (16 * 4096ul)

static void (*note)(const char *);

static int do_revoke(void *arg, void *addr, size_t len, char *err, size_t n)
{
	(void)arg, (void)addr, (void)len, (void)err, (void)n;
	note("revoke");
	return 0;
}

static int do_replace(void *arg, void *addr, size_t len, int fd, char *err,
		   size_t n)
{
	(void)arg, (void)addr, (void)len, (void)fd, (void)err, (void)n;
	note("replace");
	return 0;
}

typedef CUresult map_fn(CUdeviceptr, size_t, size_t,
			CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult access_fn(CUdeviceptr, size_t, const CUmemAccessDesc *,
			   size_t);

static int chunk(CUdeviceptr p, map_fn *map, access_fn *access)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc rw;
	CUmemGenericAllocationHandle h;

	kvd_kv_alloc_props(&prop, &rw);
	if (cuMemCreate(&h, CHUNK, &prop, 0) || map(p, CHUNK, 0, h, 0))
		return -1;
	cuMemRelease(h);
	return access(p, CHUNK, &rw, 1) ? -1 : 0;
}

/* The file that defines @f. */
static const char *from(void *f)
{
	Dl_info info;

	return f && dladdr(f, &info) && info.dli_fname ? info.dli_fname : "?";
}

int main(void)
{
	struct kvdmabuf_preload_proxy_ops ops = { do_revoke, do_replace, NULL };
	int (*declare)(void *, size_t, const char *, int, uint64_t);
	int (*set_ops)(void *, const struct kvdmabuf_preload_proxy_ops *);
	long long (*calls)(const char *);
	int (*query)(struct kvdmabuf_preload_state *);
	struct kvdmabuf_preload_state st;
	void (*get_log)(char *, size_t);
	map_fn *m = NULL;
	access_fn *a = NULL;
	char log[512];
	CUresult (*gpa)(const char *, void **, int, cuuint64_t,
			CUdriverProcAddressQueryResult *);
	CUresult (*unmap)(CUdeviceptr, size_t);
	CUdeviceptr base;
	void *h;
	int proxy;

	*(void **)&declare = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare");
	*(void **)&set_ops = dlsym(RTLD_DEFAULT,
				   "kvdmabuf_preload_set_proxy_ops");
	*(void **)&calls = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_calls");
	*(void **)&query = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_query");
	*(void **)&note = dlsym(RTLD_DEFAULT, "fakecu_note");
	*(void **)&get_log = dlsym(RTLD_DEFAULT, "fakecu_log");
	if (!declare || !set_ops || !calls || !note || !get_log) {
		printf("error: not under the preload and the fake libcuda\n");
		return 1;
	}
	/* which object the linker bound the engine's cuMemUnmap to */
	printf("cuMemUnmap-from: %s\n", from((void *)cuMemUnmap));
	if (cuInit(0) || cuMemAddressReserve(&base, 2 * CHUNK, 0, 0, 0) ||
	    chunk(base, cuMemMap, cuMemSetAccess) ||
	    chunk(base + CHUNK, cuMemMap, cuMemSetAccess))
		return 1;
	proxy = memfd_create("stand-in-proxy", MFD_CLOEXEC);
	if (proxy < 0 ||
	    declare((void *)(uintptr_t)base, 2 * CHUNK, "kv", proxy, 0) ||
	    set_ops((void *)(uintptr_t)base, &ops))
		return 1;
	get_log(log, sizeof(log));
	/* sleep: the engine's own call by name, then as the CUDA runtime
	 * finds entry points: its own handle of libcuda, dlsym() of
	 * cuGetProcAddress_v2 there, and that function */
	if (cuMemUnmap(base, CHUNK))
		return 1;
	h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	*(void **)&gpa = h ? dlsym(h, "cuGetProcAddress_v2") : NULL;
	if (!gpa || gpa("cuMemUnmap", (void **)&unmap, 12000, 0, NULL) ||
	    !unmap || unmap(base + CHUNK, CHUNK))
		return 1;
	get_log(log, sizeof(log));
	printf("sleep: %s\n", log);
	printf("handle-cuGetProcAddress_v2-from: %s\n", from((void *)gpa));
	printf("handle-cuMemUnmap-from: %s\n", from((void *)unmap));
	/* what depends on the caller still does: the next cuMemUnmap after
	 * this program is the preload's (after the preload: the driver's) */
	printf("next-cuMemUnmap-from: %s\n",
	       from(dlsym(RTLD_NEXT, "cuMemUnmap")));
	/* the same through dlvsym: libcuda's symbols have no versions and
	 * glibc's dlvsym wants the exact one, so on its handle it finds none
	 * (with the preload too); the preload's own carry
	 * KVDMABUF_PRELOAD_0.1 */
	printf("handle-dlvsym-cuMemSetAccess-from: %s\n",
	       from(dlvsym(h, "cuMemSetAccess", "ANY_1.0")));
	printf("next-dlvsym-cuMemUnmap-from: %s\n",
	       from(dlvsym(RTLD_NEXT, "cuMemUnmap", "KVDMABUF_PRELOAD_0.1")));
	dlclose(h);
	/* wake: through the entry points cuGetProcAddress hands out */
	if (cuGetProcAddress("cuMemMap", (void **)&m, 12000, 0, NULL) ||
	    cuGetProcAddress("cuMemSetAccess", (void **)&a, 12000, 0, NULL) ||
	    !m ||
	    !a || chunk(base, m, a) || chunk(base + CHUNK, m, a))
		return 1;
	get_log(log, sizeof(log));
	printf("wake: %s\n", log);
	printf("calls: cuMemUnmap %lld cuGetProcAddress_v2 %lld\n",
	       calls("cuMemUnmap"), calls("cuGetProcAddress_v2"));
	printf("flags: %u\n", query && !query(&st) ? st.flags : ~0u);
	close(proxy);
	return 0;
}
