/* SPDX-License-Identifier: GPL-2.0 */
/*
 * timeout_scale.h - wall-clock bounds and polling deadlines of tests,
 * scaled by KVDMABUF_TIMEOUT_SCALE (the debug lane runs 4x slower under
 * KASAN and lockdep; tests/vm/check.sh sets it). Shared by the harness and
 * the programs built without it (demo, bench).
 */
#ifndef KVD_TIMEOUT_SCALE_H
#define KVD_TIMEOUT_SCALE_H

#include <stdlib.h>

/* @ms times KVDMABUF_TIMEOUT_SCALE (at least 1). */
static inline int kvd_scaled_ms(int ms)
{
	const char *s = getenv("KVDMABUF_TIMEOUT_SCALE");
	int k = s ? atoi(s) : 1;

	return ms * (k < 1 ? 1 : k);
}

#endif
