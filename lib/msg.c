// SPDX-License-Identifier: MIT
/*
 * msg.c - the message of a failure, per thread and about one context: the
 * bottom of the library, which every other file uses and which calls
 * nothing of it.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/*
 * The message of the calling thread's last failure, and the context it is
 * about. Per thread, not per context: threads share a context, and one
 * thread's failure must not overwrite the message another is reading.
 * The context is known by its address and its serial: a context opened
 * where a closed one was is another context, and a message another thread
 * kept about the closed one is not its message.
 */
static _Thread_local struct {
	const struct kvdmabuf_ctx *ctx;
	uint64_t serial;
	char text[KVD_ERRMAX];
} last_error;

static bool msg_is_about(const struct kvdmabuf_ctx *ctx)
{
	return last_error.ctx == ctx &&
	       (!ctx || last_error.serial == ctx->serial);
}

char *kvd_msg(const struct kvdmabuf_ctx *ctx)
{
	if (!msg_is_about(ctx)) {
		last_error.ctx = ctx;
		last_error.serial = ctx ? ctx->serial : 0;
		last_error.text[0] = '\0';
	}
	return last_error.text;
}

int kvd_err(struct kvdmabuf_ctx *ctx, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(kvd_msg(ctx), KVD_ERRMAX, fmt, ap);
	va_end(ap);
	return rc;
}

int kvd_err_prefix(struct kvdmabuf_ctx *ctx, int rc, const char *fmt, ...)
{
	char old[KVD_ERRMAX], pre[KVD_ERRMAX];
	char *msg = kvd_msg(ctx);
	va_list ap;

	memcpy(old, msg, sizeof(old));
	va_start(ap, fmt);
	vsnprintf(pre, sizeof(pre), fmt, ap);
	va_end(ap);
	/* truncation is fine: the message is for people */
	if (snprintf(msg, KVD_ERRMAX, "%s: %s", pre,
		     old[0] ? old : strerror(rc < 0 ? -rc : rc)) < 0)
		msg[0] = '\0';
	return rc;
}

const char *kvdmabuf_last_error(const struct kvdmabuf_ctx *ctx)
{
	return ctx && msg_is_about(ctx) ? last_error.text : "";
}
