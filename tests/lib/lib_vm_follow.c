// SPDX-License-Identifier: MIT
/*
 * lib_vm_follow - the follow path with real exporters and the real module:
 * DRM (vgem) regions, and CUDA regions through tests/fake_cuda (which
 * exports vgem buffers), behind kvdmabuf proxies, with the test importer
 * (/dev/kvd_importer) as the NIC. A dynamic importer (a NIC that follows
 * moves, like mlx5) keeps its attachment and key over several cycles and
 * always reads the current backing's data; a pinning importer (like efa)
 * makes the region REREGISTER (measured), re-imported at every wake. An
 * engine's own pinning import of the proxy makes sleep fail, naming it,
 * before any revoke; a CUDA region's mapping is in region info, in its
 * proxy's dma-buf name and in `kvdmabuf status`.
 * The importer NIC plugs in behind the library's ops table; export,
 * module and sleep/wake are the real code.
 */
#include <dlfcn.h>
#include <sys/ioctl.h>

#include "harness.h"
#include "lib_fake.h"
#include "lib_imp_nic.h"
#include "vgem.h"
#include "kmod/kvd_importer.h"
#include "../uapi/kvdmabuf.h"

#define LEN (256u * 1024)
#define BLK 4096u

/* The test importer as the library's NIC (lib_imp_nic.h). */
static struct imp_nic imp = { .fd = -1 };

static int imp_access(uint32_t handle, int write, uint64_t off, void *buf,
		      size_t len)
{
	struct kvd_imp_access a = {
		.handle = handle, .flags = write ? KVD_IMP_ACCESS_WRITE : 0,
		.offset = off, .length = len, .buf = (uintptr_t)buf,
	};

	return ioctl(imp.fd, KVD_IMP_IOCTL_ACCESS, &a) ? -errno : 0;
}

static int imp_counters(uint32_t handle, struct kvd_imp_counters *c)
{
	memset(c, 0, sizeof(*c));
	c->handle = handle;
	return ioctl(imp.fd, KVD_IMP_IOCTL_COUNTERS, c) ? -errno : 0;
}

static int proxy_query(struct kvdmabuf_region *r, struct kvdmabuf_query *q)
{
	memset(q, 0, sizeof(*q));
	q->size = sizeof(*q);
	q->proxy_fd = (__u32)r->proxy_fd;
	return ioctl(r->ctx->module_fd, KVDMABUF_IOCTL_QUERY, q) ? -errno : 0;
}

static int open_ctx(struct kvdmabuf_ctx **ctx, const char *cuda)
{
	struct kvdmabuf_options o = { 0 };
	char err[512];
	const char *path = write_config("protocol: rdma\nmodule: require\n"
					"drain_timeout_s: 5\n");
	int rc;

	o.config_path = path;
	o.cuda_library = cuda;
	rc = kvd_open_ops(&o, &imp_nic_ops, &imp, ctx, err, sizeof(err));
	if (rc)
		printf("# open: %s\n", err);
	unlink(path);
	return rc;
}

FIXTURE(fo) {
	int drm;
	struct kvdmabuf_ctx *ctx;
};

FIXTURE_VARIANT(fo) {
	int pinned;
	int mode;
};

FIXTURE_VARIANT_ADD(fo, dynamic_importer) {
	.pinned = 0, .mode = KVDMABUF_MODE_FOLLOW,
};
FIXTURE_VARIANT_ADD(fo, pinning_importer) {
	.pinned = 1, .mode = KVDMABUF_MODE_REREGISTER,
};

FIXTURE_SETUP(fo)
{
	self->drm = vgem_open();
	if (self->drm < 0)
		SKIP(return, "no vgem device");
	imp.fd = open(KVD_IMPORTER_PATH, O_RDWR | O_CLOEXEC);
	if (imp.fd < 0)
		SKIP(return, "%s absent (test importer not loaded)",
		     KVD_IMPORTER_PATH);
	if (access(KVDMABUF_DEVICE_PATH, F_OK))
		SKIP(return, "%s absent (module not loaded)",
		     KVDMABUF_DEVICE_PATH);
	imp.pinned = variant->pinned;
	ASSERT_EQ(0, open_ctx(&self->ctx, NULL));
}

FIXTURE_TEARDOWN(fo)
{
	if (self->ctx)
		kvdmabuf_close(self->ctx);
	if (imp.fd >= 0)
		close(imp.fd);
	if (self->drm >= 0)
		close(self->drm);
}

TEST_F_TIMEOUT(fo, drm_regions_follow_through_cycles, 120)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;
	struct kvd_imp_counters c0, c;
	struct kvdmabuf_query q;
	uint32_t key, key0, prev_key, h = 0;
	uint64_t gen, prev_gen;
	char *addr, buf[BLK];
	int cycle, rc;

	ASSERT_EQ(0, vgem_create(self->drm, LEN, &h));
	addr = vgem_map(self->drm, h, LEN, NULL);
	ASSERT_NE(NULL, addr);
	pattern_fill(addr, LEN, 1000);
	d.addr = addr;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_DRM;
	d.drm_fd = self->drm;
	d.drm_handle = h;
	d.tag = "kv_cache";
	rc = kvdmabuf_region_add(self->ctx, &d, &r);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	ASSERT_EQ(0, rc);
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(variant->mode, in.mode);
	EXPECT_EQ(1, in.proxied);
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &key0, NULL, &gen));
	key = prev_key = key0;
	prev_gen = gen;
	ASSERT_EQ(0, imp_access(key, 0, 0, buf, BLK));
	EXPECT_EQ(-1, pattern_check(buf, BLK, 1000));
	ASSERT_EQ(0, imp_counters(key, &c0));

	for (cycle = 1; cycle <= 3; cycle++) {
		uint32_t seed = 1000 + (uint32_t)cycle;

		rc = kvdmabuf_sleep(self->ctx, NULL);
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		ASSERT_EQ(0, rc);
		/* nothing of the module holds the old buffer any more */
		ASSERT_EQ(0, proxy_query(r, &q));
		EXPECT_EQ(KVDMABUF_STATE_REVOKED, q.state);
		EXPECT_EQ(0u, q.backing_attachments);
		EXPECT_EQ(0u, q.stale_backings);
		EXPECT_EQ(0u, q.live_mappings);
		if (variant->mode == KVDMABUF_MODE_FOLLOW) {
			/* the NIC's access fails, nothing oopses */
			EXPECT_EQ(-ENODEV, imp_access(key, 0, 0, buf, BLK));
		} else {
			EXPECT_EQ(0u, q.pinned_importers);
		}
		/* the engine frees the buffer, maps a new one there */
		munmap(addr, LEN);
		vgem_close_handle(self->drm, h);
		ASSERT_EQ(0, vgem_create(self->drm, LEN, &h));
		ASSERT_EQ(addr, vgem_map(self->drm, h, LEN, addr));
		pattern_fill(addr, LEN, seed);
		ASSERT_EQ(0, kvdmabuf_region_set_drm_handle(r, self->drm, h));
		rc = kvdmabuf_wake(self->ctx, NULL);
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		ASSERT_EQ(0, rc);

		ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &key, NULL, &gen));
		if (variant->mode == KVDMABUF_MODE_FOLLOW) {
			/* same attachment and key, never re-imported */
			EXPECT_EQ(key0, key);
			EXPECT_EQ(1u, gen);
			ASSERT_EQ(0, imp_counters(key, &c));
			EXPECT_EQ(c0.invalidations + (uint64_t)cycle,
				  c.invalidations);
		} else {
			/* a fresh import (the importer may reuse a released
			 * handle number: the generation moves only when a key
			 * value changes) */
			ASSERT_EQ(0, imp_counters(key, &c));
			EXPECT_EQ(0u, c.invalidations);
			EXPECT_EQ(prev_gen + (key != prev_key), gen);
		}
		prev_key = key;
		prev_gen = gen;
		/* data is always the current backing's */
		ASSERT_EQ(0, imp_access(key, 0, 0, buf, BLK));
		EXPECT_EQ(-1, pattern_check(buf, BLK, seed));
		ASSERT_EQ(0, imp_access(key, 0, LEN - BLK, buf, BLK));
		EXPECT_EQ(0, memcmp(buf, addr + LEN - BLK, BLK));
		/* and the NIC's writes land in the new buffer */
		pattern_fill(buf, BLK, 7 * seed);
		ASSERT_EQ(0, imp_access(key, 1, BLK, buf, BLK));
		EXPECT_EQ(-1, pattern_check(addr + BLK, BLK, 7 * seed));
	}
	ASSERT_EQ(0, kvdmabuf_region_remove(r));
	munmap(addr, LEN);
	vgem_close_handle(self->drm, h);
}

static const char *fake_cuda_path(void)
{
	static char path[PATH_MAX];

	if (kvd_build_path(path, sizeof(path), "tests/fake_cuda/libcuda.so.1"))
		return NULL;
	return access(path, R_OK) ? NULL : path;
}

/*
 * The engine registers the proxy itself (kvdmabuf_region_dmabuf()) on a
 * NIC that pins (the test importer, pinned): the module's pin counts show
 * a pin that is not the library's, and sleep refuses it, by name, before
 * any revoke; once the engine drops it, sleep and wake go through.
 */
TEST_F_TIMEOUT(fo, engines_own_pinning_registration_refuses_sleep, 120)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;
	struct kvdmabuf_query q;
	struct imp_nic engine;
	struct kvd_mr mr = { 0 };
	uint32_t h = 0;
	uint64_t off;
	char *addr;
	int pfd;

	ASSERT_EQ(0, vgem_create(self->drm, LEN, &h));
	addr = vgem_map(self->drm, h, LEN, NULL);
	ASSERT_NE(NULL, addr);
	d.addr = addr;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_DRM;
	d.drm_fd = self->drm;
	d.drm_handle = h;
	d.tag = "kv_cache";
	ASSERT_EQ(0, kvdmabuf_region_add(self->ctx, &d, &r));
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(variant->mode, in.mode);
	ASSERT_EQ(0, kvdmabuf_region_dmabuf(r, &pfd, &off));
	/* the engine's own registration, on a NIC that pins */
	engine.fd = imp.fd;
	engine.pinned = 1;
	self->ctx->ops_arg = &engine;
	ASSERT_EQ(0, imp_nic_reg_dmabuf(self->ctx, 0, pfd, off, LEN,
					(uint64_t)(uintptr_t)addr, &mr));
	self->ctx->ops_arg = &imp;
	ASSERT_EQ(0, proxy_query(r, &q));
	EXPECT_LE(1u, q.pinned_importers);
	EXPECT_EQ(-EBUSY, kvdmabuf_sleep(self->ctx, NULL));
	TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx),
			       "not this library"));
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(0, in.asleep);
	EXPECT_EQ(0, in.broken);
	ASSERT_EQ(0, proxy_query(r, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	/* the engine drops it: sleep and wake go through */
	self->ctx->ops_arg = &engine;
	ASSERT_EQ(0, imp_nic_dereg(self->ctx, 0, &mr));
	self->ctx->ops_arg = &imp;
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_region_remove(r));
	munmap(addr, LEN);
	vgem_close_handle(self->drm, h);
}

/* The line of `kvdmabuf status --json` (beside this program's build tree)
 * about proxy @id, in @line; 0 when found. */
static int status_line(uint64_t id, char *line, size_t len)
{
	char cli[PATH_MAX], cmd[PATH_MAX + 64], want[64];
	int found = 0;
	FILE *p;

	if (kvd_build_path(cli, sizeof(cli), "lib/cli/kvdmabuf"))
		return -1;
	snprintf(cmd, sizeof(cmd), "%s status --json", cli);
	snprintf(want, sizeof(want), "  {\"id\": %llu,",
		 (unsigned long long)id);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	while (!found && fgets(line, (int)len, p))
		found = !strncmp(line, want, strlen(want));
	pclose(p);
	return found ? 0 : -1;
}

/* The proxy's dma-buf name, from /proc/self/fdinfo ("" when none). */
static void proxy_name(int fd, char *name, size_t len)
{
	char path[64], line[128];
	FILE *f;

	name[0] = '\0';
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "name:\t", 6)) {
			snprintf(name, len, "%s", line + 6);
			name[strcspn(name, "\n")] = '\0';
		}
	fclose(f);
}

TEST_F_TIMEOUT(fo, cuda_regions_follow_through_fake_driver, 120)
{
	void *(*cu_alloc)(size_t);
	int (*cu_remap)(void *);
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;
	const char *lib = fake_cuda_path();
	uint32_t key, key0;
	char buf[BLK], *addr;
	void *dl;
	int cycle, rc;

	if (!lib)
		SKIP(return, "tests/fake_cuda/libcuda.so.1 not built");
	ASSERT_EQ(0, open_ctx(&ctx, lib));
	dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	ASSERT_NE(NULL, dl);
	*(void **)&cu_alloc = dlsym(dl, "fakecu_alloc");
	*(void **)&cu_remap = dlsym(dl, "fakecu_remap");
	ASSERT_NE(NULL, (void *)cu_alloc);
	addr = cu_alloc(LEN);
	ASSERT_NE(NULL, addr);
	pattern_fill(addr, LEN, 2000);
	d.addr = addr;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_CUDA;
	d.tag = "kv_cache";
	rc = kvdmabuf_region_add(ctx, &d, &r);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(ctx));
	ASSERT_EQ(0, rc);
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(variant->mode, in.mode);
	/* the mapping it got (the fake driver takes the PCIe flag), on the
	 * region, on its proxy's name, and in `kvdmabuf status` */
	EXPECT_EQ(KVDMABUF_MAPPING_PCIE, in.mapping);
	{
		char name[128], want[64], line[1024];

		proxy_name(r->proxy_fd, name, sizeof(name));
		snprintf(want, sizeof(want), "kvd:%llu:pcie",
			 (unsigned long long)in.proxy_id);
		TH_LOG("proxy name '%s'", name);
		EXPECT_EQ(0, strcmp(want, name));
		ASSERT_EQ(0, status_line(in.proxy_id, line, sizeof(line)));
		TH_LOG("status: %s", line);
		EXPECT_NE(NULL, strstr(line, "\"cuda_mapping\": \"pcie\""));
	}
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &key0, NULL, NULL));
	ASSERT_EQ(0, imp_access(key0, 0, 0, buf, BLK));
	EXPECT_EQ(-1, pattern_check(buf, BLK, 2000));
	for (cycle = 1; cycle <= 2; cycle++) {
		ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
		/* cuMemUnmap + cuMemRelease, cuMemCreate + cuMemMap */
		ASSERT_EQ(0, cu_remap(addr));
		pattern_fill(addr, LEN, 2000 + (uint32_t)cycle);
		rc = kvdmabuf_wake(ctx, NULL);
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(ctx));
		ASSERT_EQ(0, rc);
		ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &key, NULL, NULL));
		if (variant->mode == KVDMABUF_MODE_FOLLOW)
			EXPECT_EQ(key0, key);
		ASSERT_EQ(0, imp_access(key, 0, 0, buf, BLK));
		EXPECT_EQ(-1, pattern_check(buf, BLK, 2000 + (uint32_t)cycle));
	}
	kvdmabuf_close(ctx);
	dlclose(dl);
}

/*
 * kvdmabuf_region_ranges() on a DRM region: a chunk released and another
 * backed by new memory in one call, under the same key (one notification;
 * the released chunk reads zeros, the new one its bytes, the rest the
 * region's own); every bad range refused with nothing changed; an asleep
 * region refused; after sleep and wake the region is one range again. A
 * pinning importer's region (REREGISTER) refuses it: it cannot follow.
 */
TEST_F_TIMEOUT(fo, drm_region_ranges_change_under_the_same_key, 120)
{
	const size_t ch = LEN / 4;
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region_range rr[2];
	struct kvd_imp_counters c0, c1;
	struct kvdmabuf_region *r;
	uint32_t key0, key, h = 0, h2 = 0;
	char *addr, *want, buf[BLK];
	int fresh, rc;

	ASSERT_EQ(0, vgem_create(self->drm, LEN, &h));
	addr = vgem_map(self->drm, h, LEN, NULL);
	ASSERT_NE(NULL, addr);
	pattern_fill(addr, LEN, 3000);
	d.addr = addr;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_DRM;
	d.drm_fd = self->drm;
	d.drm_handle = h;
	ASSERT_EQ(0, kvdmabuf_region_add(self->ctx, &d, &r));
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &key0, NULL, NULL));
	fresh = vgem_pattern_buf(self->drm, ch, 3100);
	ASSERT_GE(fresh, 0);
	memset(rr, 0, sizeof(rr));
	rr[0].offset = ch;
	rr[0].len = ch;
	rr[0].fd = KVDMABUF_RANGE_RELEASE;
	rr[1].offset = 2 * ch;
	rr[1].len = ch;
	rr[1].fd = fresh;
	if (variant->mode == KVDMABUF_MODE_REREGISTER) {
		EXPECT_EQ(-EOPNOTSUPP, kvdmabuf_region_ranges(r, rr, 2));
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		goto out;
	}
	ASSERT_EQ(0, imp_access(key0, 0, 0, buf, BLK));
	ASSERT_EQ(0, imp_counters(key0, &c0));

	/* bad ranges: nothing changes */
	rr[1].offset = 2 * ch + 1;
	EXPECT_EQ(-EINVAL, kvdmabuf_region_ranges(r, rr, 2));
	rr[1].offset = LEN;
	EXPECT_EQ(-EINVAL, kvdmabuf_region_ranges(r, rr, 2));
	rr[1].offset = 2 * ch;
	rr[1].fd = KVDMABUF_RANGE_EXPORT;	/* DRM memory: not the library's */
	EXPECT_EQ(-EINVAL, kvdmabuf_region_ranges(r, rr, 2));
	rr[1].fd = -3;
	EXPECT_EQ(-EINVAL, kvdmabuf_region_ranges(r, rr, 2));
	rr[1].fd = fresh;
	rr[1].reserved[1] = 1;
	EXPECT_EQ(-EINVAL, kvdmabuf_region_ranges(r, rr, 2));
	rr[1].reserved[1] = 0;
	rr[1].offset = ch;			/* overlaps range 0 */
	EXPECT_EQ(-EINVAL, kvdmabuf_region_ranges(r, rr, 2));
	rr[1].offset = 2 * ch;
	ASSERT_EQ(0, imp_counters(key0, &c1));
	EXPECT_EQ(c0.invalidations, c1.invalidations);

	rc = kvdmabuf_region_ranges(r, rr, 2);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	ASSERT_EQ(0, rc);
	close(fresh);
	fresh = -1;
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &key, NULL, NULL));
	EXPECT_EQ(key0, key);
	ASSERT_EQ(0, imp_counters(key, &c1));
	EXPECT_EQ(c0.invalidations + 1, c1.invalidations);
	EXPECT_EQ(-1, r->backing_fd);	/* no whole export kept */
	want = malloc(LEN);
	ASSERT_NE(NULL, want);
	pattern_fill(want, LEN, 3000);
	memset(want + ch, 0, ch);
	pattern_fill(want + 2 * ch, ch, 3100);
	for (size_t off = 0; off < LEN; off += BLK) {
		ASSERT_EQ(0, imp_access(key, 0, off, buf, BLK));
		if (memcmp(buf, want + off, BLK))
			TH_LOG("offset %zu differs", off);
		ASSERT_EQ(0, memcmp(buf, want + off, BLK));
	}

	/* asleep: refused; after a wake, one range of the new memory */
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	EXPECT_EQ(-EBUSY, kvdmabuf_region_ranges(r, rr, 2));
	munmap(addr, LEN);
	vgem_close_handle(self->drm, h);
	h = 0;
	ASSERT_EQ(0, vgem_create(self->drm, LEN, &h2));
	addr = vgem_map(self->drm, h2, LEN, NULL);
	ASSERT_NE(NULL, addr);
	pattern_fill(addr, LEN, 3200);
	ASSERT_EQ(0, kvdmabuf_region_set_drm_handle(r, self->drm, h2));
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	ASSERT_EQ(0, imp_access(key, 0, ch, buf, BLK));
	EXPECT_EQ(0, memcmp(buf, addr + ch, BLK));
	free(want);
out:
	if (fresh >= 0)
		close(fresh);
	ASSERT_EQ(0, kvdmabuf_region_remove(r));
	munmap(addr, LEN);
	if (h)
		vgem_close_handle(self->drm, h);
	if (h2)
		vgem_close_handle(self->drm, h2);
}

TEST_HARNESS_MAIN
