// SPDX-License-Identifier: MIT
/*
 * tms_standin.c - a stand-in for torch_memory_saver (SGLang's
 * release_memory_occupation / resume_memory_occupation), read from
 * fzyzcjy/torch_memory_saver 0.0.10b1 (commit 4a43c97, 2026-08-20),
 * csrc/core.cpp, class TorchMemorySaver. Like it, an object of its own in
 * LD_PRELOAD (there it interposes cudaMalloc/cudaFree, which needs the
 * CUDA runtime: here the engine calls the allocator directly), linked
 * with -lcuda and calling the driver's VMM functions by name:
 *   tms_standin_malloc  TorchMemorySaver::malloc: cuMemCreate (GPUDirect
 *                       RDMA capable), cuMemAddressReserve, cuMemMap,
 *                       cuMemSetAccess; one reservation per allocation;
 *   tms_pause           TorchMemorySaver::pause(tag): cuMemUnmap and
 *                       cuMemRelease of each active allocation of the tag
 *                       ("" or NULL: all);
 *   tms_resume          TorchMemorySaver::resume(tag): cuMemCreate,
 *                       cuMemMap, cuMemSetAccess of each paused one;
 *   tms_standin_free    TorchMemorySaver::free: cuMemUnmap + cuMemRelease
 *                       if active, then cuMemAddressFree.
 * No CPU backup, one device (0), no locking beyond what the test needs.
 * For tests/preload/tms_engine under both interposers.
 */
#include <stddef.h>
#include <string.h>

#include "cuda_compat.h"

#define TMS_MAX 16

static struct tms_alloc {
	CUdeviceptr ptr;
	size_t size;
	CUmemGenericAllocationHandle h;
	char tag[32];
	int active;
} allocs[TMS_MAX];

static int create_map_access(struct tms_alloc *a)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc rw;

	kvd_kv_alloc_props(&prop, &rw);
	if (cuMemCreate(&a->h, a->size, &prop, 0) ||
	    cuMemMap(a->ptr, a->size, 0, a->h, 0) ||
	    cuMemSetAccess(a->ptr, a->size, &rw, 1))
		return -1;
	a->active = 1;
	return 0;
}

static int unmap_release(struct tms_alloc *a)
{
	if (cuMemUnmap(a->ptr, a->size) || cuMemRelease(a->h))
		return -1;
	a->active = 0;
	return 0;
}

static int matches(const struct tms_alloc *a, const char *tag)
{
	return a->size && (!tag || !tag[0] || !strcmp(a->tag, tag));
}

void *tms_standin_malloc(size_t size, const char *tag);
void *tms_standin_malloc(size_t size, const char *tag)
{
	struct tms_alloc *a = NULL;
	int i;

	for (i = 0; i < TMS_MAX && !a; i++)
		if (!allocs[i].size)
			a = &allocs[i];
	if (!a || cuMemAddressReserve(&a->ptr, size, 0, 0, 0))
		return NULL;
	a->size = size;
	strncpy(a->tag, tag, sizeof(a->tag) - 1);
	if (create_map_access(a)) {
		a->size = 0;
		return NULL;
	}
	return (void *)(uintptr_t)a->ptr;
}

int tms_pause(const char *tag);
int tms_pause(const char *tag)
{
	int i;

	for (i = 0; i < TMS_MAX; i++)
		if (matches(&allocs[i], tag) && allocs[i].active &&
		    unmap_release(&allocs[i]))
			return -1;
	return 0;
}

int tms_resume(const char *tag);
int tms_resume(const char *tag)
{
	int i;

	for (i = 0; i < TMS_MAX; i++)
		if (matches(&allocs[i], tag) && !allocs[i].active &&
		    create_map_access(&allocs[i]))
			return -1;
	return 0;
}

int tms_standin_free(void *p);
int tms_standin_free(void *p)
{
	int i;

	for (i = 0; i < TMS_MAX; i++) {
		struct tms_alloc *a = &allocs[i];

		if (!a->size || a->ptr != (CUdeviceptr)(uintptr_t)p)
			continue;
		if ((a->active && unmap_release(a)) ||
		    cuMemAddressFree(a->ptr, a->size))
			return -1;
		a->size = 0;
		return 0;
	}
	return -1;
}
