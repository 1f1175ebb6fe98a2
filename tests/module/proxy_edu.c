// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_edu: the proxy under a real DMA engine behind a real (emulated)
 * IOMMU. The importer is tests/kmod/kvd_edu.c, bound to qemu's edu PCI
 * device: every byte it reads or writes moves by the edu's DMA through the
 * addresses of its mapping, translated by intel-iommu in strict mode. A
 * table made for another device, a stale address or a mapping the proxy
 * forgot to make would fault in the IOMMU here instead of reaching the
 * pages (the other importers read DMA addresses as physical ones).
 *
 * Needs a VM started with -machine q35 -device intel-iommu -device edu and
 * intel_iommu=on iommu.strict=1 (the 6.1, 7.3 and debug lanes); skips
 * where there is no edu device. Each edu DMA takes ~100 ms, so the tests
 * move a few KiB only.
 */
#include <dirent.h>

#include "harness.h"
#include "proxy_common.h"
#include "kmod/kvd_edu.h"

#define SIZE		(4 * KVD_PAGE)
#define SEED_A		0xa1
#define SEED_B		0xb2
#define MAXIO		KVD_EDU_MAX_ACCESS

/* Is an edu PCI device (1234:11e8) present? */
static int edu_present(void)
{
	DIR *d = opendir("/sys/bus/pci/devices");
	struct dirent *e;
	int found = 0;

	if (!d)
		return 0;
	while (!found && (e = readdir(d))) {
		char path[512], id[32] = "";
		FILE *f;

		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/vendor",
			 e->d_name);
		f = fopen(path, "re");
		if (!f)
			continue;
		if (fgets(id, sizeof(id), f) && !strncmp(id, "0x1234", 6)) {
			fclose(f);
			snprintf(path, sizeof(path),
				 "/sys/bus/pci/devices/%s/device", e->d_name);
			f = fopen(path, "re");
			if (!f)
				continue;
			found = fgets(id, sizeof(id), f) &&
				!strncmp(id, "0x11e8", 6);
		}
		fclose(f);
	}
	closedir(d);
	return found;
}

/* /dev/kmsg from now on, to count the IOMMU's fault reports. */
static int kmsg_from_now(void)
{
	int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);

	if (fd >= 0)
		lseek(fd, 0, SEEK_END);
	return fd;
}

/* DMAR fault reports ("... fault addr 0x...") since the last call. */
static int iommu_faults(int kmsg, char *last, size_t last_len)
{
	char rec[2048];
	ssize_t n;
	int faults = 0;

	while ((n = read(kmsg, rec, sizeof(rec) - 1)) != -1 || errno == EPIPE) {
		if (n <= 0)
			continue;
		rec[n] = 0;
		if (strstr(rec, "DMAR") && strstr(rec, "fault addr")) {
			faults++;
			if (last)
				snprintf(last, last_len, "%s", rec);
		}
	}
	return faults;
}

FIXTURE(edu) {
	int dev, edu, drm, kmsg;
	int proxy, a, b;
	uint8_t expect_a[SIZE], expect_b[SIZE];
	uint8_t buf[MAXIO];
	struct kvd_edu_info info;
};

FIXTURE_SETUP(edu)
{
	int ret;

	self->edu = self->kmsg = -1;
	KVD_PROXY_SETUP(self, SIZE, SEED_A, SEED_B);
	if (!edu_present())
		SKIP(return, "no edu PCI device (qemu -device edu)");
	pattern_fill(self->expect_a, SIZE, SEED_A);
	pattern_fill(self->expect_b, SIZE, SEED_B);
	ret = kvd_test_module_load("kvd_edu", NULL, KVD_EDU_PATH);
	if (ret)
		TH_LOG("loading kvd_edu: %s", strerror(-ret));
	ASSERT_EQ(0, ret);
	self->edu = open(KVD_EDU_PATH, O_RDWR | O_CLOEXEC);
	ASSERT_GE(self->edu, 0);
	ASSERT_EQ(0, kvd_ioctl(self->edu, KVD_EDU_IOCTL_INFO, &self->info));
	/* The lanes that have edu boot with intel_iommu=on iommu.strict=1. */
	TH_LOG("edu %s: IOMMU translated %u, strict %u", self->info.pci_slot,
	       self->info.translated, self->info.strict);
	ASSERT_EQ(1, self->info.translated);
	ASSERT_EQ(1, self->info.strict);
	self->kmsg = kmsg_from_now();
	ASSERT_GE(self->kmsg, 0);
}

FIXTURE_TEARDOWN(edu)
{
	kvd_close(&self->edu);
	kvd_close(&self->kmsg);
	KVD_PROXY_TEARDOWN(self);
}

/* @len bytes read by the edu's DMA at @off equal @expect + @off. */
#define EXPECT_EDU_READS(h, off, len, expect)				\
	do {								\
		ASSERT_EQ(0, imp_read(self->edu, h, off, self->buf, len)); \
		if (memcmp(self->buf, (expect) + (off), len))		\
			TH_LOG("edu DMA read at %lu+%lu differs",	\
			       (unsigned long)(off), (unsigned long)(len)); \
		EXPECT_EQ(0, memcmp(self->buf, (expect) + (off), len));	\
	} while (0)

#define EXPECT_NO_IOMMU_FAULT()						\
	do {								\
		char rec_[2048] = "";					\
		int n_ = iommu_faults(self->kmsg, rec_, sizeof(rec_));	\
		if (n_)							\
			TH_LOG("IOMMU fault: %s", rec_);		\
		EXPECT_EQ(0, n_);					\
	} while (0)

TEST_F_TIMEOUT(edu, dma_reads_and_writes_through_the_iommu, 120)
{
	uint8_t data[512];
	struct kvd_edu_info after;
	int h;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	h = imp_import(self->edu, self->proxy, 0);
	ASSERT_GE(h, 0);
	EXPECT_EDU_READS(h, 0, MAXIO, self->expect_a);
	/* Across a page boundary: two pieces of the table. */
	EXPECT_EDU_READS(h, KVD_PAGE - 1024, MAXIO, self->expect_a);
	EXPECT_EDU_READS(h, SIZE - MAXIO, MAXIO, self->expect_a);

	memset(data, 0x5c, sizeof(data));
	ASSERT_EQ(0, imp_write(self->edu, h, 2 * KVD_PAGE + 100, data,
			       sizeof(data)));
	/* The CPU sees what the DMA engine wrote, in backing A. */
	EXPECT_EQ(1, dmabuf_equals(self->a, 2 * KVD_PAGE + 100, data,
				   sizeof(data)));
	memcpy(self->expect_a + 2 * KVD_PAGE + 100, data, sizeof(data));
	EXPECT_EDU_READS(h, 2 * KVD_PAGE, MAXIO, self->expect_a);

	ASSERT_EQ(0, kvd_ioctl(self->edu, KVD_EDU_IOCTL_INFO, &after));
	/* 3 reads of 2 pieces + poison + copy-out, 1 write, 1 read. */
	EXPECT_LE(self->info.dmas + 14, after.dmas);
	EXPECT_EQ(0, imp_release(self->edu, h));
	EXPECT_NO_IOMMU_FAULT();
}

TEST_F_TIMEOUT(edu, follows_revoke_and_a_new_backing, 120)
{
	struct kvd_imp_counters c;
	int h;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	h = imp_import(self->edu, self->proxy, 0);
	ASSERT_GE(h, 0);
	EXPECT_EDU_READS(h, KVD_PAGE, MAXIO, self->expect_a);

	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_EQ(-ENODEV, imp_read(self->edu, h, 0, self->buf, MAXIO));

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->b, 0));
	EXPECT_EDU_READS(h, KVD_PAGE, MAXIO, self->expect_b);
	ASSERT_EQ(0, imp_counters(self->edu, h, &c));
	EXPECT_EQ(2, c.maps);
	EXPECT_EQ(1, c.invalidations);
	EXPECT_EQ(1, c.failed);
	EXPECT_EQ(0, imp_release(self->edu, h));
	EXPECT_NO_IOMMU_FAULT();
}

TEST_F_TIMEOUT(edu, replace_moves_dma_to_the_new_pages, 120)
{
	uint8_t data[256];
	int h;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	h = imp_import(self->edu, self->proxy, 0);
	ASSERT_GE(h, 0);
	EXPECT_EDU_READS(h, 0, MAXIO, self->expect_a);

	ASSERT_EQ(0, kvd_replace(self->dev, self->proxy, self->b, 0));
	memset(data, 0x3e, sizeof(data));
	ASSERT_EQ(0, imp_write(self->edu, h, 0, data, sizeof(data)));
	EXPECT_EQ(1, dmabuf_equals(self->b, 0, data, sizeof(data)));
	/* The old pages are not written. */
	EXPECT_EQ(1, dmabuf_equals(self->a, 0, self->expect_a, MAXIO));
	memcpy(self->expect_b, data, sizeof(data));
	EXPECT_EDU_READS(h, 0, MAXIO, self->expect_b);
	EXPECT_EQ(0, imp_release(self->edu, h));
	EXPECT_NO_IOMMU_FAULT();
}

/*
 * Two importer devices on one proxy: kvd_importer (a platform device
 * without IOMMU: its addresses are physical) maps first; the edu must
 * still get addresses its IOMMU maps, not the other device's.
 */
TEST_F_TIMEOUT(edu, each_importer_device_gets_its_own_mapping, 120)
{
	uint8_t data[256], got[256];
	int imp, h1, h2;

	KVD_OPEN_IMP(imp);
	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	h1 = imp_import(imp, self->proxy, 0);
	ASSERT_GE(h1, 0);
	ASSERT_EQ(0, imp_read(imp, h1, 0, self->buf, MAXIO));
	EXPECT_EQ(0, memcmp(self->buf, self->expect_a, MAXIO));
	h2 = imp_import(self->edu, self->proxy, 0);
	ASSERT_GE(h2, 0);
	EXPECT_EDU_READS(h2, KVD_PAGE - 512, MAXIO, self->expect_a);
	memset(data, 0x77, sizeof(data));
	ASSERT_EQ(0, imp_write(self->edu, h2, KVD_PAGE, data, sizeof(data)));
	ASSERT_EQ(0, imp_read(imp, h1, KVD_PAGE, got, sizeof(got)));
	EXPECT_EQ(0, memcmp(got, data, sizeof(data)));
	EXPECT_EQ(0, imp_release(self->edu, h2));
	EXPECT_EQ(0, imp_release(imp, h1));
	close(imp);
	EXPECT_NO_IOMMU_FAULT();
}

TEST_F_TIMEOUT(edu, pinned_import_blocks_revoke, 120)
{
	int h;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	h = imp_import(self->edu, self->proxy, KVD_IMP_IMPORT_PINNED);
	ASSERT_GE(h, 0);
	EXPECT_EDU_READS(h, 0, MAXIO, self->expect_a);
	EXPECT_EQ(-EBUSY, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_EQ(-EBUSY, kvd_replace(self->dev, self->proxy, self->b, 0));
	EXPECT_EDU_READS(h, 0, MAXIO, self->expect_a);
	EXPECT_EQ(0, imp_release(self->edu, h));
	EXPECT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	EXPECT_NO_IOMMU_FAULT();
}

/*
 * The negative control of this file: the engine reads the live mapping's
 * first address (the old bytes arrive), then, after a revoke dropped the
 * backing, the same address again: the IOMMU must refuse it (a DMAR
 * fault) although the old pages still hold those bytes.
 */
TEST_F_TIMEOUT(edu, stale_address_faults_in_the_iommu, 120)
{
	struct kvd_edu_probe p = { 0 };
	char rec[2048] = "";
	uint64_t live;
	int h, i, faults = 0;

	ASSERT_EQ(0, kvd_attach(self->dev, self->proxy, self->a, 0));
	h = imp_import(self->edu, self->proxy, 0);
	ASSERT_GE(h, 0);
	p.handle = (uint32_t)h;
	EXPECT_EQ(-ENODATA, kvd_ioctl(self->edu, KVD_EDU_IOCTL_PROBE, &p));
	EXPECT_EDU_READS(h, 0, KVD_EDU_PROBE_LEN, self->expect_a);

	ASSERT_EQ(0, kvd_ioctl(self->edu, KVD_EDU_IOCTL_PROBE, &p));
	EXPECT_EQ(0, memcmp(p.data, self->expect_a, KVD_EDU_PROBE_LEN));
	live = p.dma_addr;
	EXPECT_EQ(0, iommu_faults(self->kmsg, NULL, 0));

	ASSERT_EQ(0, kvd_revoke(self->dev, self->proxy, 1000));
	ASSERT_EQ(0, kvd_stat("backings"));	/* the backing is dropped */
	ASSERT_EQ(0, kvd_ioctl(self->edu, KVD_EDU_IOCTL_PROBE, &p));
	EXPECT_EQ(live, p.dma_addr);
	EXPECT_NE(0, memcmp(p.data, self->expect_a, KVD_EDU_PROBE_LEN));
	/* The old pages do still hold them. */
	EXPECT_EQ(1, dmabuf_equals(self->a, 0, self->expect_a,
				   KVD_EDU_PROBE_LEN));
	/* Reported from the IOMMU's fault interrupt: give it a moment. */
	for (i = 0; i < 50 && !faults; i++) {
		faults = iommu_faults(self->kmsg, rec, sizeof(rec));
		if (!faults)
			usleep(100000);
	}
	EXPECT_LE(1, faults);
	TH_LOG("DMA at %#llx after the revoke: %s",
	       (unsigned long long)p.dma_addr, rec);
	EXPECT_EQ(0, imp_release(self->edu, h));
}

/*
 * A proxy of ranges (KVDMABUF_IOCTL_RANGES): a window of A, an unbacked
 * page, a window of B. Its table is made of each backing's mapping for
 * the edu's device and of the module's scratch, mapped for that device
 * too: reads across the seams move the right bytes (zeros in the hole)
 * with no IOMMU fault, after another device (no IOMMU) mapped it first.
 */
TEST_F_TIMEOUT(edu, ranges_map_through_the_iommu, 120)
{
	struct kvdmabuf_range r[] = {
		{ .start = 0, .length = KVD_PAGE, .backing_fd = self->a,
		  .backing_offset = KVD_PAGE },
		{ .start = KVD_PAGE, .length = KVD_PAGE,
		  .backing_fd = KVDMABUF_RANGE_UNBACKED },
		{ .start = 2 * KVD_PAGE, .length = 2 * KVD_PAGE,
		  .backing_fd = self->b, .backing_offset = 2 * KVD_PAGE },
	};
	uint8_t want[SIZE], data[256];
	int imp, h0, h;

	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, r, 3));
	memcpy(want, self->expect_a + KVD_PAGE, KVD_PAGE);
	memset(want + KVD_PAGE, 0, KVD_PAGE);
	memcpy(want + 2 * KVD_PAGE, self->expect_b + 2 * KVD_PAGE,
	       2 * KVD_PAGE);
	imp = imp_open();
	ASSERT_GE(imp, 0);
	h0 = imp_import(imp, self->proxy, 0);
	ASSERT_GE(h0, 0);
	ASSERT_EQ(0, imp_read(imp, h0, 0, self->buf, MAXIO));
	h = imp_import(self->edu, self->proxy, 0);
	ASSERT_GE(h, 0);
	EXPECT_EDU_READS(h, KVD_PAGE - 1024, MAXIO, want);
	EXPECT_EDU_READS(h, 2 * KVD_PAGE - 1024, MAXIO, want);
	memset(data, 0x6d, sizeof(data));
	ASSERT_EQ(0, imp_write(self->edu, h, 3 * KVD_PAGE, data, sizeof(data)));
	EXPECT_EQ(1, dmabuf_equals(self->b, 3 * KVD_PAGE, data, sizeof(data)));
	memcpy(want + 3 * KVD_PAGE, data, sizeof(data));

	/*
	 * A batch that keeps A's and B's ranges: the new layout shares their
	 * mappings for the edu, which the old layout's teardown must leave
	 * mapped in the IOMMU.
	 */
	r[1].backing_fd = self->b;
	r[1].backing_offset = 0;
	ASSERT_EQ(0, kvd_ranges(self->dev, self->proxy, &r[1], 1));
	memcpy(want + KVD_PAGE, self->expect_b, KVD_PAGE);
	EXPECT_EDU_READS(h, KVD_PAGE - 1024, MAXIO, want);
	EXPECT_EDU_READS(h, 3 * KVD_PAGE, MAXIO, want);
	EXPECT_EQ(0, imp_release(self->edu, h));
	EXPECT_EQ(0, imp_release(imp, h0));
	close(imp);
	EXPECT_NO_IOMMU_FAULT();
}

TEST_HARNESS_MAIN
