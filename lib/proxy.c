// SPDX-License-Identifier: MIT
/*
 * proxy.c - the helper module's uapi (/dev/kvdmabuf): version check,
 * create, attach/replace, ranges, revoke, query of proxy dma-bufs.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/dma-buf.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "../uapi/kvdmabuf.h"
#include "internal.h"

/*
 * EINTR is retried except for ATTACH and RANGES, which may have swapped
 * the backing when they are interrupted, and REVOKE, which retries within its own bound
 * (kvd_proxy_dev_revoke()).
 */
static int xioctl(int fd, unsigned long cmd, void *arg)
{
	int rc;

	do {
		rc = ioctl(fd, cmd, arg);
	} while (rc < 0 && errno == EINTR && cmd != KVDMABUF_IOCTL_ATTACH &&
		 cmd != KVDMABUF_IOCTL_REVOKE && cmd != KVDMABUF_IOCTL_RANGES);
	return rc < 0 ? -errno : 0;
}

/* The module behind @fd speaks this library's API major (a minor adds
 * only what a size-versioned struct or a feature bit announces). */
int kvd_proxy_dev_check(struct kvdmabuf_ctx *ctx, int fd)
{
	struct kvdmabuf_version v;
	int rc;

	memset(&v, 0, sizeof(v));
	v.size = sizeof(v);
	rc = xioctl(fd, KVDMABUF_IOCTL_VERSION, &v);
	if (rc)
		return kvd_err(ctx, rc, "%s: version ioctl failed: %s",
			       KVDMABUF_DEVICE_PATH, strerror(-rc));
	if ((v.version >> 16) != KVDMABUF_API_VERSION_MAJOR)
		return kvd_err(ctx, -EPROTO, "%s speaks API %u.%u, this library "
			       "needs %u.x", KVDMABUF_DEVICE_PATH,
			       v.version >> 16, v.version & 0xffff,
			       KVDMABUF_API_VERSION_MAJOR);
	return 0;
}

int kvd_proxy_dev_open(struct kvdmabuf_ctx *ctx, int *devfd)
{
	int fd, rc;

	fd = open(KVDMABUF_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		return kvd_err(ctx, rc, "%s cannot be opened: %s (is the "
			       "kvdmabuf module loaded?)",
			       KVDMABUF_DEVICE_PATH, strerror(-rc));
	}
	rc = kvd_proxy_dev_check(ctx, fd);
	if (rc) {
		close(fd);
		return rc;
	}
	*devfd = fd;
	return 0;
}

int kvd_proxy_dev_create(struct kvdmabuf_ctx *ctx, uint64_t size,
			 int *proxy_fd, uint64_t *id)
{
	struct kvdmabuf_create c;
	int rc;

	memset(&c, 0, sizeof(c));
	c.size = sizeof(c);
	c.length = size;
	rc = xioctl(ctx->module_fd, KVDMABUF_IOCTL_CREATE, &c);
	if (rc)
		return kvd_err(ctx, rc, "kvdmabuf create (%llu bytes) failed: "
			       "%s", (unsigned long long)size, strerror(-rc));
	*proxy_fd = (int)c.fd;
	*id = c.id;
	return 0;
}

int kvd_proxy_dev_attach(struct kvdmabuf_ctx *ctx, int proxy_fd,
			 int backing_fd, uint64_t offset, unsigned int flags)
{
	struct kvdmabuf_attach a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.flags = (flags & KVD_ATTACH_REPLACE) ? KVDMABUF_ATTACH_REPLACE : 0;
	a.proxy_fd = (__u32)proxy_fd;
	a.backing_fd = (__u32)backing_fd;
	a.offset = offset;
	a.timeout_ms = ctx->revoke_timeout_ms;
	rc = xioctl(ctx->module_fd, KVDMABUF_IOCTL_ATTACH, &a);
	if (rc == -EBUSY && a.pins)
		return kvd_err(ctx, rc, "kvdmabuf attach (proxy fd %d): "
			       "importers hold %u pin(s) (a pinned importer "
			       "cannot follow a new backing)", proxy_fd, a.pins);
	if (rc == -EBUSY)
		return kvd_err(ctx, rc, "kvdmabuf attach (proxy fd %d, backing "
			       "fd %d): the backing's exporter is busy (its pin "
			       "or map refused: memory it cannot place now), "
			       "not an importer", proxy_fd, backing_fd);
	if (rc)
		return kvd_err(ctx, rc, "kvdmabuf attach (proxy fd %d, backing "
			       "fd %d, offset %llu) failed: %s", proxy_fd,
			       backing_fd, (unsigned long long)offset,
			       strerror(-rc));
	return 0;
}

int kvd_proxy_dev_revoke(struct kvdmabuf_ctx *ctx, int proxy_fd,
			 unsigned int timeout_ms)
{
	struct kvdmabuf_revoke r;
	int rc;

	int64_t deadline = kvd_now_ns() + (int64_t)timeout_ms * 1000000;
	int64_t left_ns;
	unsigned int tries = 0;

	/*
	 * A revoke that a signal interrupted has revoked already and was
	 * waiting for importers to drop the old backing: ask again for what
	 * is left of @timeout_ms, never longer in all (the caller holds the
	 * context lock). Once the time is spent it is the timeout.
	 */
	do {
		left_ns = deadline - kvd_now_ns();
		if (tries++ && left_ns <= 0) {
			rc = -ETIMEDOUT;
			break;
		}
		memset(&r, 0, sizeof(r));
		r.size = sizeof(r);
		r.proxy_fd = (__u32)proxy_fd;
		r.timeout_ms = left_ns <= 0 ? 0 :
			       (__u32)((left_ns + 999999) / 1000000);
		rc = xioctl(ctx->module_fd, KVDMABUF_IOCTL_REVOKE, &r);
	} while (rc == -EINTR);
	if (rc == -EBUSY)
		return kvd_err(ctx, rc, "kvdmabuf revoke (proxy fd %d): "
			       "importers hold %u blocking pin(s)", proxy_fd,
			       r.pins);
	if (rc == -ETIMEDOUT)
		return kvd_err(ctx, rc, "kvdmabuf revoke (proxy fd %d): revoked, "
			       "but importers still map the old backing after "
			       "%u ms", proxy_fd, timeout_ms);
	if (rc)
		return kvd_err(ctx, rc, "kvdmabuf revoke (proxy fd %d, %u ms) "
			       "failed: %s", proxy_fd, timeout_ms,
			       strerror(-rc));
	return 0;
}

int kvd_proxy_dev_query(struct kvdmabuf_ctx *ctx, int proxy_fd,
			struct kvd_proxy_info *info)
{
	struct kvdmabuf_query q;
	int rc;

	memset(&q, 0, sizeof(q));
	q.size = sizeof(q);
	q.proxy_fd = (__u32)proxy_fd;
	rc = xioctl(ctx->module_fd, KVDMABUF_IOCTL_QUERY, &q);
	if (rc)
		return kvd_err(ctx, rc, "kvdmabuf query (proxy fd %d) failed: "
			       "%s", proxy_fd, strerror(-rc));
	memset(info, 0, sizeof(*info));
	info->state = q.state == KVDMABUF_STATE_BACKED ? KVD_PROXY_BACKED :
		      q.state == KVDMABUF_STATE_REVOKED ? KVD_PROXY_REVOKED :
		      KVD_PROXY_EMPTY;
	info->generation = q.generation;
	info->nr_dynamic = q.dynamic_importers;
	info->nr_pinned = q.pinned_importers;
	info->nr_blocking_pins = q.blocking_pins;
	/* 0 from a module older than API 2.2 (its pins all block). */
	info->nr_revocable_pins = q.revocable_pins;
	info->nr_mappings = q.live_mappings;
	info->revoke_reason = q.revoke_reason == KVDMABUF_REVOKE_EXPORTER ?
			      KVD_REVOKE_EXPORTER : q.revoke_reason ?
			      KVD_REVOKE_USER : KVD_REVOKE_NONE;
	return 0;
}

int kvd_proxy_dev_ranges(struct kvdmabuf_ctx *ctx, int proxy_fd,
			 const struct kvd_range *ranges, unsigned int n)
{
	struct kvdmabuf_range *r;
	struct kvdmabuf_ranges a;
	unsigned int i;
	int rc;

	r = calloc(n, sizeof(*r));
	if (!r)
		return kvd_err(ctx, -ENOMEM, "kvdmabuf ranges: out of memory");
	for (i = 0; i < n; i++) {
		r[i].start = ranges[i].start;
		r[i].length = ranges[i].len;
		r[i].backing_fd = ranges[i].fd < 0 ? KVDMABUF_RANGE_UNBACKED :
				  ranges[i].fd;
		r[i].backing_offset = ranges[i].fd < 0 ? 0 : ranges[i].offset;
	}
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.proxy_fd = (__u32)proxy_fd;
	a.count = n;
	a.ranges = (uintptr_t)r;
	a.range_size = sizeof(*r);
	a.timeout_ms = ctx->revoke_timeout_ms;
	rc = xioctl(ctx->module_fd, KVDMABUF_IOCTL_RANGES, &a);
	free(r);
	if (rc == -ENOTTY)
		return kvd_err(ctx, -EOPNOTSUPP, "kvdmabuf ranges: the loaded "
			       "module is older than API 3.2 (no "
			       "KVDMABUF_IOCTL_RANGES): update it");
	if (rc == -EBUSY && a.pins)
		return kvd_err(ctx, rc, "kvdmabuf ranges (proxy fd %d): "
			       "importers hold %u pin(s) (a pinned importer "
			       "cannot follow a range change)", proxy_fd, a.pins);
	if (rc == -ETIMEDOUT)
		return kvd_err(ctx, rc, "kvdmabuf ranges (proxy fd %d): changed, "
			       "but importers still map what it replaced after "
			       "%u ms", proxy_fd, ctx->revoke_timeout_ms);
	if (rc)
		return kvd_err(ctx, rc, "kvdmabuf ranges (proxy fd %d, %u "
			       "range(s)) failed: %s", proxy_fd, n,
			       strerror(-rc));
	return 0;
}

/*
 * The dma-buf's own name (DMA_BUF_SET_NAME, shown in /proc/PID/fdinfo),
 * which `kvdmabuf status` reads for the proxies it lists. A kernel that
 * refuses a new name while importers are attached (before 5.15) keeps the
 * old one: the name is for people, nothing depends on it.
 */
int kvd_proxy_dev_label(struct kvdmabuf_ctx *ctx, int proxy_fd,
			const char *label)
{
	(void)ctx;
	return ioctl(proxy_fd, DMA_BUF_SET_NAME, label) ? -errno : 0;
}
