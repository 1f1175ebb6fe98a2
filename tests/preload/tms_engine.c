// SPDX-License-Identifier: MIT
/*
 * tms_engine.c - for tests/preload/preload_cuda: SGLang's memory release
 * and resume through torch_memory_saver (tests/preload/tms_standin.c),
 * with libkvdmabuf-preload.so in the same LD_PRELOAD, in either order.
 * Two KV "layers" (tag kv_cache, one reservation each, as
 * torch_memory_saver makes them) are declared as KV regions with
 * stand-in proxy operations (what the sleep hooks do once the KV pool
 * exists), one weights allocation is not. Then, as SGLang's scheduler:
 * release_memory_occupation(["kv_cache"]), resume(["kv_cache"]),
 * release of everything, resume of everything, and the KV tensors freed.
 * Prints "key: value" lines: per step the revokes and replaces the
 * stand-in proxies saw and the regions the preload has asleep.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_compat.h"
#include "kvdmabuf_preload.h"

#define LAYER (16 * 4096ul)

static int revokes, replaces;

static int do_revoke(void *arg, void *addr, size_t len, char *err, size_t n)
{
	(void)arg, (void)addr, (void)len, (void)err, (void)n;
	revokes++;
	return 0;
}

static int do_replace(void *arg, void *addr, size_t len, int fd, char *err,
		      size_t n)
{
	(void)arg, (void)addr, (void)len, (void)fd, (void)err, (void)n;
	replaces++;
	return 0;
}

int main(void)
{
	struct kvdmabuf_preload_proxy_ops ops = { do_revoke, do_replace, NULL };
	int (*declare)(void *, size_t, const char *, int, uint64_t);
	int (*set_ops)(void *, const struct kvdmabuf_preload_proxy_ops *);
	int (*query)(struct kvdmabuf_preload_state *);
	void *(*tms_malloc)(size_t, const char *);
	int (*tms_pause)(const char *), (*tms_resume)(const char *);
	int (*tms_free)(void *);
	struct kvdmabuf_preload_state st;
	void *kv[2], *w;
	int i, proxy;

	*(void **)&declare = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_declare");
	*(void **)&set_ops = dlsym(RTLD_DEFAULT,
				   "kvdmabuf_preload_set_proxy_ops");
	*(void **)&query = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_query");
	*(void **)&tms_malloc = dlsym(RTLD_DEFAULT, "tms_standin_malloc");
	*(void **)&tms_pause = dlsym(RTLD_DEFAULT, "tms_pause");
	*(void **)&tms_resume = dlsym(RTLD_DEFAULT, "tms_resume");
	*(void **)&tms_free = dlsym(RTLD_DEFAULT, "tms_standin_free");
	if (!declare || !set_ops || !query || !tms_malloc || !tms_pause ||
	    !tms_resume || !tms_free) {
		printf("error: not under both preloads\n");
		return 1;
	}
	if (cuInit(0))
		return 1;
	proxy = memfd_create("stand-in-proxy", MFD_CLOEXEC);
	for (i = 0; i < 2; i++) {
		kv[i] = tms_malloc(LAYER, "kv_cache");
		if (!kv[i] || declare(kv[i], LAYER, "kv_cache", proxy, 0) ||
		    set_ops(kv[i], &ops))
			return 1;
	}
	w = tms_malloc(LAYER, "weights");
	if (!w)
		return 1;
#define STEP(name, call)                                                  \
	do {                                                              \
		int rc_ = (call);                                         \
		query(&st);                                               \
		printf("%s: rc %d revokes %d replaces %d asleep %u\n", name, \
		       rc_, revokes, replaces, st.nr_asleep);             \
	} while (0)
	STEP("pause-kv", tms_pause("kv_cache"));
	STEP("resume-kv", tms_resume("kv_cache"));
	STEP("pause-all", tms_pause(NULL));
	STEP("resume-all", tms_resume(""));
	STEP("free-kv", tms_free(kv[0]) | tms_free(kv[1]));
	close(proxy);
	return 0;
}
