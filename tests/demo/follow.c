// SPDX-License-Identifier: GPL-2.0
/*
 * follow.c - the follow path, on the module's uapi: a vgem buffer (DRM,
 * standing in for GPU memory) behind a kvdmabuf proxy, imported once by
 * the test importer (/dev/kvd_importer, dynamic: a NIC that handles
 * dma-buf move notification, as mlx5 MRs do). Sleep = revoke the proxy and
 * drop the buffer; wake = a new vgem buffer attached behind the same proxy.
 * The importer keeps its attachment and handle (its "keys") and reads the
 * new buffer at its next access.
 *
 * The library is not used here: its DRM regions register on the NIC with
 * ibv_reg_dmabuf_mr(), which soft-RoCE does not have (EOPNOTSUPP), so in
 * this VM the importer takes the NIC's place directly on the proxy.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../lib/kvdmabuf.h"
#include "demo.h"
#include "proxy_common.h"

#define FOLLOW_LEN	(16ul << 20)
#define FOLLOW_SEED	0x66000000u

/* Reads the whole buffer through the importer; 1 if it has @seed. */
static int read_check(int imp, int h, char *buf, uint32_t seed,
		      struct demo_follow *f)
{
	size_t off;
	int rc;

	memset(buf, 0, FOLLOW_LEN);
	for (off = 0; off < FOLLOW_LEN; off += KVD_IMP_MAX_ACCESS) {
		rc = imp_read(imp, h, off, buf + off, KVD_IMP_MAX_ACCESS);
		if (rc) {
			snprintf(f->err, sizeof(f->err), "importer read at "
				 "%zu: %s", off, strerror(-rc));
			return rc;
		}
	}
	return pattern_check(buf, FOLLOW_LEN, seed) < 0;
}

/*
 * Asks the library for a DRM region on the configured verbs NIC and records
 * its answer: on soft-RoCE it must refuse (no dma-buf MRs), which is why
 * the importer stands in for the NIC below.
 */
static void library_drm_region(struct demo_follow *f, int drm,
			       const char *config)
{
	struct kvdmabuf_options o;
	struct kvdmabuf_region_desc d;
	struct kvdmabuf_region *r = NULL;
	struct kvdmabuf_region_info info;
	struct kvdmabuf_ctx *ctx = NULL;
	char err[256] = "";
	uint32_t handle = 0;
	int rc;

	memset(&o, 0, sizeof(o));
	o.config_path = config;
	rc = kvdmabuf_open(&o, &ctx, err, sizeof(err));
	if (rc) {
		snprintf(f->lib, sizeof(f->lib), "kvdmabuf_open: %s", err);
		return;
	}
	rc = vgem_create(drm, 1 << 20, &handle);
	if (rc) {
		snprintf(f->lib, sizeof(f->lib), "vgem buffer: %s",
			 strerror(-rc));
		kvdmabuf_close(ctx);
		return;
	}
	memset(&d, 0, sizeof(d));
	d.addr = (void *)(uintptr_t)0x100000000ull;     /* device address */
	d.len = 1 << 20;
	d.mem = KVDMABUF_MEM_DRM;
	d.drm_fd = drm;
	d.drm_handle = handle;
	d.tag = "kv_cache";
	rc = kvdmabuf_region_add(ctx, &d, &r);
	if (rc) {
		/* the library's reason, without the region and verbs prefix */
		const char *why = kvdmabuf_last_error(ctx);
		const char *nic = strstr(why, "NIC ");
		const char *end = nic ? strstr(nic, ": ") : NULL;

		if (nic)
			snprintf(f->lib, sizeof(f->lib), "refused (%s): %.*s",
				 strerror(-rc), end ? (int)(end - nic) : 120,
				 nic);
		else
			snprintf(f->lib, sizeof(f->lib), "refused (%s): %.160s",
				 strerror(-rc), why);
	} else {
		rc = kvdmabuf_region_info(r, &info);
		snprintf(f->lib, sizeof(f->lib), "accepted, mode %s",
			 rc ? "?" : kvdmabuf_mode_name(info.mode));
		rc = kvdmabuf_region_remove(r);
		if (rc)
			snprintf(f->err, sizeof(f->err), "region_remove: %s",
				 strerror(-rc));
	}
	kvdmabuf_close(ctx);
	vgem_close_handle(drm, handle);
}

void demo_follow_run(struct demo_follow *f, unsigned int cycles,
		     const char *config)
{
	int dev = -1, imp = -1, drm = -1, proxy = -1, backing = -1, h = -1;
	struct kvd_imp_counters ic;
	struct kvdmabuf_query q;
	uint64_t id0 = 0;
	struct timespec ts = { 0, 10000000 };
	long shmem, drop;
	unsigned int w;
	char *buf = NULL;
	unsigned int c;
	int rc;

	memset(f, 0, sizeof(f[0]));
	f->len = FOLLOW_LEN;
	f->min_drop_kb = -1;
	f->same_handle = f->same_proxy = true;
	dev = kvd_dev_open();
	if (dev < 0) {
		snprintf(f->skip, sizeof(f->skip), "%s: %s (kvdmabuf module "
			 "not loaded)", KVDMABUF_DEVICE_PATH, strerror(-dev));
		goto out;
	}
	imp = imp_open();
	if (imp < 0) {
		snprintf(f->skip, sizeof(f->skip), "%s: %s (kvd_importer "
			 "module not loaded)", KVD_IMPORTER_PATH,
			 strerror(-imp));
		goto out;
	}
	drm = vgem_open();
	if (drm < 0) {
		snprintf(f->skip, sizeof(f->skip), "no vgem device (modprobe "
			 "vgem)");
		goto out;
	}
	library_drm_region(f, drm, config);
	buf = malloc(FOLLOW_LEN);
	if (!buf) {
		snprintf(f->skip, sizeof(f->skip), "out of memory");
		goto out;
	}
	f->ran = true;

	/* awake: buffer 0 behind the proxy, imported once */
	proxy = kvd_create(dev, FOLLOW_LEN, &id0);
	if (proxy < 0) {
		snprintf(f->err, sizeof(f->err), "create proxy: %s",
			 strerror(-proxy));
		goto out;
	}
	backing = vgem_pattern_buf(drm, FOLLOW_LEN, FOLLOW_SEED);
	if (backing < 0) {
		snprintf(f->err, sizeof(f->err), "vgem buffer: %s",
			 strerror(-backing));
		goto out;
	}
	rc = kvd_attach(dev, proxy, backing, 0);
	/* the module holds its own reference: the buffer lives as long as
	 * the proxy is backed by it */
	close(backing);
	backing = -1;
	if (rc) {
		snprintf(f->err, sizeof(f->err), "attach: %s", strerror(-rc));
		goto out;
	}
	h = imp_import(imp, proxy, 0);
	if (h < 0) {
		snprintf(f->err, sizeof(f->err), "import: %s", strerror(-h));
		goto out;
	}
	rc = read_check(imp, h, buf, FOLLOW_SEED, f);
	if (rc < 0)
		goto out;
	f->correct += rc;
	f->total++;

	for (c = 1; c <= cycles; c++) {
		f->backings_awake = kvd_stat("backings");
		f->shmem_awake_kb = meminfo_kb("Shmem");
		/* sleep: revoke (the importer is told and unmaps), drop */
		rc = kvd_revoke(dev, proxy, 2000);
		if (rc) {
			snprintf(f->err, sizeof(f->err), "revoke: %s",
				 strerror(-rc));
			goto out;
		}
		/* the module may drop the backing from a worker (and the
		 * last fput there is deferred): give it up to 1 s */
		shmem = meminfo_kb("Shmem");
		for (w = 0; w < 100 && f->shmem_awake_kb - shmem <
		     (long)(FOLLOW_LEN / 1024) * 9 / 10; w++) {
			nanosleep(&ts, NULL);
			shmem = meminfo_kb("Shmem");
		}
		if (w * 10 > f->free_wait_ms)
			f->free_wait_ms = w * 10;
		f->shmem_asleep_kb = shmem;
		f->backings_asleep = kvd_stat("backings");
		drop = f->shmem_awake_kb - shmem;
		if (f->min_drop_kb < 0 || drop < f->min_drop_kb)
			f->min_drop_kb = drop;
		/* the NIC touching the memory now must fail, not read garbage */
		rc = imp_read(imp, h, 0, buf, 4096);
		if (rc == -ENODEV)
			f->refused_asleep++;
		/* wake: new memory, same proxy, same importer handle */
		backing = vgem_pattern_buf(drm, FOLLOW_LEN, FOLLOW_SEED + c);
		if (backing < 0) {
			snprintf(f->err, sizeof(f->err), "vgem buffer: %s",
				 strerror(-backing));
			goto out;
		}
		rc = kvd_attach(dev, proxy, backing, 0);
		close(backing);
		backing = -1;
		if (rc) {
			snprintf(f->err, sizeof(f->err), "attach at wake: %s",
				 strerror(-rc));
			goto out;
		}
		f->shmem_woke_kb = meminfo_kb("Shmem");
		rc = read_check(imp, h, buf, FOLLOW_SEED + c, f);
		if (rc < 0)
			goto out;
		f->correct += rc;
		f->total++;
		rc = kvd_query(dev, proxy, &q);
		if (rc || q.id != id0 || q.dynamic_importers != 1)
			f->same_proxy = false;
	}
	f->cycles = cycles;
	rc = imp_counters(imp, h, &ic);
	if (rc) {
		f->same_handle = false;
		snprintf(f->err, sizeof(f->err), "importer counters: %s",
			 strerror(-rc));
		goto out;
	}
	f->maps = ic.maps;
	f->invalidations = ic.invalidations;
	f->failed_maps = ic.failed;
out:
	if (h >= 0) {
		rc = imp_release(imp, h);
		if (rc && !f->err[0])
			snprintf(f->err, sizeof(f->err), "importer release: "
				 "%s", strerror(-rc));
	}
	if (backing >= 0)
		close(backing);
	if (proxy >= 0)
		close(proxy);
	if (drm >= 0)
		close(drm);
	if (imp >= 0)
		close(imp);
	if (dev >= 0)
		close(dev);
	free(buf);
}
