// SPDX-License-Identifier: MIT
/*
 * syslib.c - the system libraries that only some uses need, loaded at
 * first use: libyaml (configuration text: a file, options.config_yaml,
 * the environment's keys) and libdrm (the PRIME export of DRM regions).
 * A machine without them runs everything else; the call that needs one
 * fails with -ELIBACC and a message naming the Debian package. Each is
 * loaded once per process (as its handle would be anyway) and kept.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#include "internal.h"

struct syslib {
	const char *soname;
	const char *package;	/* Debian's */
	pthread_once_t once;
	void *dl;
	char why[256];		/* dlerror() of the failed load */
};

static struct syslib syslibs[] = {
	[KVD_SYSLIB_YAML] = { "libyaml-0.so.2", "libyaml-0-2",
			      PTHREAD_ONCE_INIT, NULL, "" },
	[KVD_SYSLIB_DRM] = { "libdrm.so.2", "libdrm2", PTHREAD_ONCE_INIT,
			     NULL, "" },
};

static void syslib_open(struct syslib *l)
{
	const char *e;

	dlerror();
	l->dl = dlopen(l->soname, RTLD_NOW | RTLD_LOCAL);
	e = l->dl ? NULL : dlerror();
	if (!l->dl)
		snprintf(l->why, sizeof(l->why), "%s", e ? e : "not found");
}

static void yaml_open(void)
{
	syslib_open(&syslibs[KVD_SYSLIB_YAML]);
}

static void drm_open(void)
{
	syslib_open(&syslibs[KVD_SYSLIB_DRM]);
}

void *kvd_syslib_sym(enum kvd_syslib id, const char *name, const char *use,
		     char *err, size_t errlen)
{
	struct syslib *l = &syslibs[id];
	void *sym;

	pthread_once(&l->once, id == KVD_SYSLIB_YAML ? yaml_open : drm_open);
	if (!l->dl) {
		snprintf(err, errlen, "%s needs %s, which cannot be loaded "
			 "(%s): install %s", use, l->soname, l->why,
			 l->package);
		return NULL;
	}
	sym = dlsym(l->dl, name);
	if (!sym)
		snprintf(err, errlen, "%s needs %s from %s, which lacks it",
			 use, name, l->soname);
	return sym;
}
