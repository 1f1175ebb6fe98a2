// SPDX-License-Identifier: MIT
/*
 * check.c - `kvdmabuf check`: is this node ready for kvdmabuf? The
 * configuration ($KVDMABUF_CONFIG, as kvdmabuf_open() reads it), the module
 * and its API version, the device node's permissions for the caller, CUDA
 * GPUs that export dma-bufs, DRM devices, every verbs device (the caller's
 * access; takes dma-buf MRs? follows moves or pins, probed through a
 * proxy), IOMMU hints. A FAIL is what makes kvdmabuf_open() fail with that
 * configuration; what the library goes on without is a WARN.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <linux/udmabuf.h>
#include <xf86drm.h>

#include "../internal.h"
#include "../../uapi/kvdmabuf.h"
#include "report.h"

#define PROBE_LEN (64 * 1024)

/* The library's proxy calls need a context only for the device fd and the
 * message: the checks share one that is never opened. */

/* Where make modules_install and DKMS put the module, and compressed. */
static const char *const module_files[] = {
	"extra/kvdmabuf.ko", "extra/kvdmabuf.ko.xz", "extra/kvdmabuf.ko.zst",
	"updates/dkms/kvdmabuf.ko", "updates/dkms/kvdmabuf.ko.xz",
	"updates/dkms/kvdmabuf.ko.zst",
};

/*
 * Is the module installed for the running kernel? 2: modprobe finds it
 * (modules.dep lists it), 1: its file is there but depmod has not run,
 * 0: not installed. @release gets the running kernel's release.
 */
static int module_installed(char *release, size_t len)
{
	char path[512], line[1024];
	struct utsname u;
	unsigned int i;
	FILE *f;

	if (uname(&u))
		return 0;
	snprintf(release, len, "%s", u.release);
	snprintf(path, sizeof(path), "/lib/modules/%s/modules.dep", u.release);
	f = fopen(path, "re");
	while (f && fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');

		*(colon ? colon : line) = '\0';
		if (strstr(line, "/kvdmabuf.ko")) {
			fclose(f);
			return 2;
		}
	}
	if (f)
		fclose(f);
	for (i = 0; i < sizeof(module_files) / sizeof(module_files[0]); i++) {
		snprintf(path, sizeof(path), "/lib/modules/%s/%s", u.release,
			 module_files[i]);
		if (!access(path, F_OK))
			return 1;
	}
	return 0;
}

static const char *module_use_says(int use)
{
	if (use == KVDMABUF_MODULE_REQUIRE)
		return "; the configuration says module: require, so "
		       "kvdmabuf_open() fails";
	if (use == KVDMABUF_MODULE_OFF)
		return "; the configuration says module: off (not used)";
	return "; with module: auto the library goes on without it: "
	       "regions re-register at each wake instead of following";
}

/*
 * @use: the configuration's module setting. Without the module, `auto`
 * goes on (regions re-register at each wake instead of following: a
 * WARN), `require` fails kvdmabuf_open() (a FAIL), `off` never uses it.
 */
static void check_module(struct report *r, struct kvdmabuf_ctx *ctx, int use)
{
	enum verdict v = use == KVDMABUF_MODULE_REQUIRE ? V_FAIL :
			 use == KVDMABUF_MODULE_OFF ? V_INFO : V_WARN;
	char release[128] = "";
	struct stat st;
	int rc;

	if (stat(KVDMABUF_DEVICE_PATH, &st)) {
		switch (module_installed(release, sizeof(release))) {
		case 2:
			report_add(r, v, "module", "%s missing: the "
				   "kvdmabuf module is not loaded (modprobe "
				   "kvdmabuf)%s", KVDMABUF_DEVICE_PATH,
				   module_use_says(use));
			break;
		case 1:
			report_add(r, v, "module", "%s missing: the "
				   "kvdmabuf module is installed for %s but "
				   "not in its modules.dep (depmod -a, then "
				   "modprobe kvdmabuf)%s", KVDMABUF_DEVICE_PATH,
				   release, module_use_says(use));
			break;
		default:
			report_add(r, v, "module", "%s missing: the "
				   "kvdmabuf module is not installed for kernel "
				   "%s: make modules_install (source tree) or "
				   "make dkms-src && dkms install "
				   "kvdmabuf/%d.%d.%d, then modprobe kvdmabuf%s",
				   KVDMABUF_DEVICE_PATH, release,
				   KVDMABUF_VERSION_MAJOR,
				   KVDMABUF_VERSION_MINOR,
				   KVDMABUF_VERSION_PATCH,
				   module_use_says(use));
		}
		return;
	}
	if (access(KVDMABUF_DEVICE_PATH, R_OK | W_OK)) {
		report_add(r, V_FAIL, "device permissions", "%s is mode %o, "
			   "owner %u:%u; uid %u cannot open it (install "
			   "70-kvdmabuf.rules and join group kvdmabuf)",
			   KVDMABUF_DEVICE_PATH, st.st_mode & 0777, st.st_uid,
			   st.st_gid, getuid());
		return;
	}
	report_add(r, V_OK, "device permissions", "%s mode %o, owner %u:%u: "
		   "usable by uid %u", KVDMABUF_DEVICE_PATH, st.st_mode & 0777,
		   st.st_uid, st.st_gid, getuid());
	rc = kvd_proxy_dev_open(ctx, &ctx->module_fd);
	if (rc)
		report_add(r, V_FAIL, "module", "%s", kvd_msg(ctx));
	else
		report_add(r, V_OK, "module", "loaded, API %u.x as this "
			   "library speaks", KVDMABUF_API_VERSION_MAJOR);
}

static void check_cuda(struct report *r)
{
	unsigned int n, i;
	uint64_t mask;
	char err[256];
	int rc = kvd_cuda_survey(getenv("KVDMABUF_CUDA_LIBRARY"), &n, &mask,
				 err, sizeof(err));

	if (rc == -ELIBACC) {
		/* the toolkit's stub libcuda: the message says it all */
		if (!strncmp(err, "CUDA driver stub:", 17))
			report_add(r, V_SKIP, "CUDA", "%s", err);
		else
			report_add(r, V_SKIP, "CUDA", "no CUDA driver here (%s)",
				   err);
		return;
	}
	if (rc) {
		report_add(r, V_WARN, "CUDA", "%s", err);
		return;
	}
	if (!n)
		report_add(r, V_INFO, "CUDA", "driver loaded, no GPU");
	for (i = 0; i < n; i++) {
		char item[32];

		snprintf(item, sizeof(item), "CUDA GPU %u", i);
		if (mask >> i & 1)
			report_add(r, V_OK, item, "exports dma-bufs");
		else
			report_add(r, V_FAIL, item, "no dma-buf export "
				   "(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 0: "
				   "the open GPU kernel modules are needed)");
	}
}

static void check_drm(struct report *r)
{
	char path[32], item[32];
	int i, fd, n = 0;

	for (i = 0; i < 16; i++) {
		drmVersionPtr v;

		snprintf(path, sizeof(path), "/dev/dri/card%d", i);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			continue;
		v = drmGetVersion(fd);
		snprintf(item, sizeof(item), "DRM card%d", i);
		report_add(r, V_INFO, item, "driver %s", v ? v->name : "?");
		if (v)
			drmFreeVersion(v);
		close(fd);
		n++;
	}
	if (!n)
		report_add(r, V_INFO, "DRM", "no DRM device");
}

/* A small dma-buf to probe NICs with: udmabuf, else vgem. */
static int probe_dmabuf(void)
{
	struct udmabuf_create c = { 0 };
	int fd, mfd, i;

	fd = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	mfd = memfd_create("kvdmabuf-check", MFD_ALLOW_SEALING | MFD_CLOEXEC);
	if (fd >= 0 && mfd >= 0 && !ftruncate(mfd, PROBE_LEN) &&
	    !fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK)) {
		c.memfd = (uint32_t)mfd;
		c.flags = UDMABUF_FLAGS_CLOEXEC;
		c.size = PROBE_LEN;
		i = ioctl(fd, UDMABUF_CREATE, &c);
		close(fd);
		close(mfd);
		if (i >= 0)
			return i;
	} else {
		if (fd >= 0)
			close(fd);
		if (mfd >= 0)
			close(mfd);
	}
	for (i = 0; i < 16; i++) {
		struct drm_mode_create_dumb cd = { .width = 4096, .bpp = 8,
						   .height = PROBE_LEN / 4096 };
		char path[32];
		drmVersionPtr v;
		int buf = -1;

		snprintf(path, sizeof(path), "/dev/dri/card%d", i);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			continue;
		v = drmGetVersion(fd);
		if (v && !strcmp(v->name, "vgem") &&
		    !drmIoctl(fd, DRM_IOCTL_MODE_CREATE_DUMB, &cd))
			drmPrimeHandleToFD(fd, cd.handle, DRM_CLOEXEC | DRM_RDWR,
					   &buf);
		if (v)
			drmFreeVersion(v);
		close(fd);      /* the dma-buf keeps the buffer */
		if (buf >= 0)
			return buf;
	}
	return -ENODEV;
}

/* Registered through a proxy: does this NIC follow moves or pin? */
static void probe_follow(struct report *r, struct kvdmabuf_ctx *ctx,
			 const char *item, struct ibv_pd *pd, int backing)
{
	struct kvd_proxy_info pi;
	struct ibv_mr *mr;
	uint64_t id;
	int proxy;

	if (kvd_proxy_dev_create(ctx, PROBE_LEN, &proxy, &id) ||
	    kvd_proxy_dev_attach(ctx, proxy, backing, 0, 0)) {
		if (proxy >= 0)
			close(proxy);
		report_add(r, V_WARN, item, "proxy probe failed: %s",
			   kvd_msg(ctx));
		return;
	}
	mr = ibv_reg_dmabuf_mr(pd, 0, PROBE_LEN, 0, proxy,
			       IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		report_add(r, V_WARN, item, "registering a proxy failed: %s",
			   strerror(errno));
	else if (kvd_proxy_dev_query(ctx, proxy, &pi))
		report_add(r, V_WARN, item, "%s", kvd_msg(ctx));
	else if (pi.nr_revocable_pins && !pi.nr_blocking_pins)
		report_add(r, V_INFO, item, "pins dma-bufs, revocably: regions "
			   "use REREGISTER (a sleep ends its MRs; new keys at "
			   "every wake)");
	else if (pi.nr_pinned || pi.nr_blocking_pins)
		report_add(r, V_INFO, item, "pins dma-bufs: regions use "
			   "REREGISTER (new keys at every wake)");
	else
		report_add(r, V_OK, item, "follows moves: regions use FOLLOW "
			   "(keys never change)");
	if (mr)
		ibv_dereg_mr(mr);
	close(proxy);
}

static void check_nic(struct report *r, struct kvdmabuf_ctx *ctx,
		      struct ibv_device *dev, int backing)
{
	const char *name = ibv_get_device_name(dev);
	struct ibv_context *c = ibv_open_device(dev);
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	struct ibv_mr *mr;
	char item[48];

	snprintf(item, sizeof(item), "NIC %s", name);
	if (!pd) {
		report_add(r, V_FAIL, item, "cannot open it: %s",
			   strerror(errno));
		goto out;
	}
	if (backing < 0) {
		report_add(r, V_SKIP, item, "dma-buf MRs not probed: no dma-buf "
			   "exporter here (load udmabuf or vgem)");
		goto out;
	}
	mr = ibv_reg_dmabuf_mr(pd, 0, PROBE_LEN, 0, backing,
			       IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {
		report_add(r, errno == EOPNOTSUPP ? V_WARN : V_FAIL, item,
			   "no dma-buf MRs (%s): GPU memory cannot be "
			   "registered; host memory uses REREGISTER",
			   strerror(errno));
		goto out;
	}
	ibv_dereg_mr(mr);
	if (ctx->module_fd < 0)
		report_add(r, V_OK, item, "takes dma-buf MRs (follow/pin not "
			   "probed: no module)");
	else
		probe_follow(r, ctx, item, pd, backing);
out:
	if (pd)
		ibv_dealloc_pd(pd);
	if (c)
		ibv_close_device(c);
}

/* The caller's access to the verbs character devices. */
static void check_uverbs_access(struct report *r)
{
	DIR *d = opendir("/dev/infiniband");
	unsigned int n = 0, denied = 0;
	char path[300], first[300] = "";
	struct dirent *de;

	while (d && (de = readdir(d))) {
		if (strncmp(de->d_name, "uverbs", 6))
			continue;
		n++;
		snprintf(path, sizeof(path), "/dev/infiniband/%s", de->d_name);
		if (access(path, R_OK | W_OK) && !denied++)
			snprintf(first, sizeof(first), "%s", path);
	}
	if (d)
		closedir(d);
	if (!n)
		report_add(r, V_FAIL, "verbs device access", "no "
			   "/dev/infiniband/uverbs*: ib_uverbs not loaded, "
			   "or not given to this container");
	else if (denied)
		report_add(r, V_FAIL, "verbs device access", "uid %u cannot "
			   "open %u of %u, %s the first (its group, usually "
			   "rdma, or the container's device list)", getuid(),
			   denied, n, first);
	else
		report_add(r, V_OK, "verbs device access", "%u uverbs "
			   "device(s) usable by uid %u", n, getuid());
}

/* @proto: the configuration's protocol (rdma needs a verbs device). */
static void check_nics(struct report *r, struct kvdmabuf_ctx *ctx, int proto)
{
	struct ibv_device **list;
	int n = 0, i, backing;

	list = ibv_get_device_list(&n);
	if (!list || !n) {
		if (proto == KVD_PROTO_RDMA)
			report_add(r, V_FAIL, "NICs", "no verbs device: with "
				   "protocol rdma kvdmabuf_open() fails");
		else
			report_add(r, V_INFO, "NICs", "no verbs device (not "
				   "needed: protocol is not rdma)");
		if (list)
			ibv_free_device_list(list);
		return;
	}
	check_uverbs_access(r);
	backing = probe_dmabuf();
	for (i = 0; i < n; i++)
		check_nic(r, ctx, list[i], backing);
	if (backing >= 0)
		close(backing);
	ibv_free_device_list(list);
}

static void check_iommu(struct report *r)
{
	char type[32] = "";
	struct dirent *de;
	int units = 0;
	DIR *d = opendir("/sys/class/iommu");
	FILE *f;

	if (!d) {
		report_add(r, V_INFO, "IOMMU", "unknown: no /sys/class/iommu "
			   "(sysfs not mounted, or not shown to this "
			   "container)");
		return;
	}
	while ((de = readdir(d)))
		units += de->d_name[0] != '.';
	closedir(d);
	f = fopen("/sys/kernel/iommu_groups/0/type", "re");
	if (f) {
		if (!fgets(type, sizeof(type), f))
			type[0] = '\0';
		type[strcspn(type, "\n")] = '\0';
		fclose(f);
	}
	if (!units)
		report_add(r, V_INFO, "IOMMU", "none: DMA addresses are "
			   "physical (peer-to-peer needs no IOMMU setup)");
	else
		report_add(r, V_INFO, "IOMMU", "%d unit(s), default domain "
			   "'%s'%s", units, type[0] ? type : "?",
			   !strcmp(type, "identity") ? " (passthrough)" :
			   " (translated: GPU-NIC peer-to-peer needs the "
			   "IOMMU to map BARs, or iommu=pt)");
}

/* The configuration kvdmabuf_open() would read; its defaults if it fails. */
static void check_config(struct report *r, struct kvd_config *cfg)
{
	char err[400];

	if (kvd_config_load(NULL, cfg, err, sizeof(err))) {
		report_add(r, V_FAIL, "configuration", "%s: kvdmabuf_open() "
			   "fails the same way", err);
		memset(cfg, 0, sizeof(*cfg));
		cfg->module = KVDMABUF_MODULE_AUTO;
		cfg->proto = KVD_PROTO_RDMA;
		return;
	}
	report_add(r, V_OK, "configuration", "%s: protocol %s, module %s",
		   cfg->path[0] ? cfg->path : "built-in defaults (no "
		   KVDMABUF_CONFIG_ENV ")", cfg->protocol,
		   cfg->module == KVDMABUF_MODULE_REQUIRE ? "require" :
		   cfg->module == KVDMABUF_MODULE_OFF ? "off" : "auto");
}

int cmd_check(bool json)
{
	struct kvdmabuf_ctx ctx = { .module_fd = -1 };
	struct report r = { 0 };
	struct kvd_config *cfg;
	int failed;

	cfg = calloc(1, sizeof(*cfg));
	if (!cfg) {
		fprintf(stderr, "kvdmabuf check: out of memory\n");
		return 1;
	}
	check_config(&r, cfg);
	check_module(&r, &ctx, cfg->module);
	check_cuda(&r);
	check_drm(&r);
	check_nics(&r, &ctx, cfg->proto);
	check_iommu(&r);
	failed = report_print(&r, json);
	report_free(&r);
	free(cfg);
	if (ctx.module_fd >= 0)
		close(ctx.module_fd);
	return failed;
}
