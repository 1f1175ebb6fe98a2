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

/*
 * The QPs' ack timeout (4.096 us << value): about 1 s, 4 s on the debug
 * lane (KVDMABUF_TIMEOUT_SCALE 4). Soft-RoCE under TCG can take longer
 * than 67 ms (the old 14) to send a 64 KiB READ's responses while a
 * swapper holds the buffer's lock; the requester then sends the READ
 * again, and when the test has deregistered that READ's MR meanwhile,
 * rxe's responder answers the duplicate with an access error that moves
 * its QP to the error state, after which it drops every request silently.
 * With KVD_RETRY_CNT retries (7 would be for ever) a QP whose peer stopped
 * answering ends in IBV_WC_RETRY_EXC_ERR within the caller's bound instead
 * (tests/verbs_pair.h, the demo's QPs).
 */
#define KVD_RETRY_CNT 6

static inline int kvd_ack_timeout(void)
{
	int t = 18, s;

	for (s = kvd_scaled_ms(1); s > 1; s >>= 1)
		t++;
	return t;
}

#endif
