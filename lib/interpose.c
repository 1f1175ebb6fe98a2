// SPDX-License-Identifier: MIT
/*
 * interpose.c - the library's side of libkvdmabuf-preload.so, when an
 * engine runs under it: the library's own registrations are marked as
 * such (the library carries them through sleep itself), and a sleep asks
 * the preload first whether the engine registered any of the memory in a
 * way that cannot follow (refused by name, nothing released). Found at
 * run time with dlsym(): without the preload both are no-ops.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

#include "internal.h"
#include "kvdmabuf_preload.h"

static struct {
	pthread_once_t once;
	void (*own)(int on);
	int (*check)(const void *addr, size_t len, char *reason, size_t n);
} preload = { .once = PTHREAD_ONCE_INIT };

static void preload_find(void)
{
	*(void **)&preload.own = dlsym(RTLD_DEFAULT, "kvdmabuf_preload_own");
	*(void **)&preload.check = dlsym(RTLD_DEFAULT,
					 "kvdmabuf_preload_check");
}

void kvd_preload_own(int on)
{
	pthread_once(&preload.once, preload_find);
	if (preload.own)
		preload.own(on);
}

int kvd_preload_check(struct kvdmabuf_region *r)
{
	char reason[KVD_ERRMAX - 128];
	int rc;

	pthread_once(&preload.once, preload_find);
	if (!preload.check)
		return 0;
	rc = preload.check(r->addr, r->len, reason, sizeof(reason));
	if (!rc)
		return 0;
	return kvd_err(r->ctx, rc, "sleep: region %p+%zu (tag '%s'): %s",
		       r->addr, r->len, r->tag, reason);
}
