// SPDX-License-Identifier: MIT
/*
 * lib_vm_rereg - real verbs (soft-RoCE rxe0/rxe1 in the VM; any two verbs
 * devices named by KVDMABUF_IBDEV_A/B elsewhere): a host-memory region that
 * the engine releases at sleep goes through sleep (its pinned pages are
 * released: VmPin falls by the region size, a kept host region stays
 * pinned) and wake (new memory at the same address, registered again with
 * new keys; an RDMA write from the other device lands in the new pages,
 * read back through the new key). Also: a device (vgem) region on a NIC
 * without dma-buf MRs is refused with -EOPNOTSUPP, measured on the device.
 */
#include "harness.h"
#include "lib_vm.h"
#include "procfs.h"
#include "vgem.h"

#define LEN (1u << 20)
#define BLK 4096u

FIXTURE(vr) {
	struct lib_vm v;
	struct kvdmabuf_region *kv, *host;
	char *kvmem, *hostmem;
};

FIXTURE_SETUP(vr)
{
	struct kvdmabuf_region_desc d = { 0 };
	int rc;

	LIB_VM_OPEN(&self->v, LEN, "drain_timeout_s: 5\n");
	self->kvmem = region_mem(LEN);
	self->hostmem = region_mem(LEN);
	ASSERT_NE(NULL, self->kvmem);
	ASSERT_NE(NULL, self->hostmem);
	memset(self->kvmem, 0x11, LEN);
	memset(self->hostmem, 0x22, LEN);
	d.addr = self->kvmem;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
	d.tag = "kv_cache";
	rc = kvdmabuf_region_add(self->v.ctx, &d, &self->kv);
	if (rc)
		TH_LOG("%s", kvdmabuf_last_error(self->v.ctx));
	ASSERT_EQ(0, rc);
	d.addr = self->hostmem;
	d.flags = 0;
	d.tag = "host";
	ASSERT_EQ(0, kvdmabuf_region_add(self->v.ctx, &d, &self->host));
}

FIXTURE_TEARDOWN(vr)
{
	lib_vm_close(&self->v);
}

/* The peer writes @seed's pattern into our region at @off via @rkey. */
static int peer_write(struct _test_data_vr *self, size_t off, uint32_t seed,
		      uint32_t rkey)
{
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	int rc;

	pattern_fill(self->v.peerbuf, BLK, seed);
	rc = vp_rdma(&self->v.b, IBV_WR_RDMA_WRITE, self->v.peerbuf, BLK,
		     self->v.peer_mr->lkey,
		     (uint64_t)(uintptr_t)(self->kvmem + off), rkey, &st);
	return rc;
}

TEST_F_TIMEOUT(vr, sleep_releases_pins_wake_lands_in_new_pages, 120)
{
	struct kvdmabuf_region_info in;
	uint32_t rkey, rkey_old, l;
	uint64_t gen;
	long pin_awake, pin_asleep, pin_woken;
	int cycle, rc;

	ASSERT_EQ(0, kvdmabuf_region_info(self->kv, &in));
	EXPECT_EQ(KVDMABUF_MODE_REREGISTER, in.mode);
	ASSERT_EQ(0, kvdmabuf_region_info(self->host, &in));
	EXPECT_EQ(KVDMABUF_MODE_HOST, in.mode);
	ASSERT_EQ(0, kvdmabuf_region_keys(self->kv, 0, &l, &rkey, &gen));
	EXPECT_EQ(1u, gen);

	/* awake: a peer write lands */
	ASSERT_EQ(0, kvdmabuf_io_begin(self->kv));
	ASSERT_EQ(0, peer_write(self, 0, 1, rkey));
	kvdmabuf_io_end(self->kv);
	EXPECT_EQ(-1, pattern_check(self->kvmem, BLK, 1));

	for (cycle = 1; cycle <= 2; cycle++) {
		pin_awake = vmpin_kb();
		rc = kvdmabuf_sleep(self->v.ctx, "kv_cache");
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(self->v.ctx));
		ASSERT_EQ(0, rc);
		pin_asleep = vmpin_kb();
		TH_LOG("cycle %d: VmPin awake %ld kB, asleep %ld kB", cycle,
		       pin_awake, pin_asleep);
		/* exactly the released region's pages are unpinned */
		EXPECT_EQ((long)(LEN / 1024), pin_awake - pin_asleep);
		EXPECT_EQ(-ENOENT, kvdmabuf_region_keys(self->kv, 0, NULL,
							NULL, NULL));
		EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(self->kv));

		/* the engine frees the memory and maps new memory there */
		ASSERT_EQ(0, remap_fresh(self->kvmem, LEN));
		memset(self->kvmem, 0, LEN);

		rc = kvdmabuf_wake(self->v.ctx, "kv_cache");
		if (rc)
			TH_LOG("%s", kvdmabuf_last_error(self->v.ctx));
		ASSERT_EQ(0, rc);
		pin_woken = vmpin_kb();
		EXPECT_EQ(pin_awake, pin_woken);
		rkey_old = rkey;
		ASSERT_EQ(0, kvdmabuf_region_keys(self->kv, 0, &l, &rkey,
						  &gen));
		EXPECT_EQ((uint64_t)cycle + 1, gen);
		TH_LOG("cycle %d: rkey 0x%x -> 0x%x, generation %llu", cycle,
		       rkey_old, rkey, (unsigned long long)gen);

		/* a write through the new key lands in the new pages */
		ASSERT_EQ(0, kvdmabuf_io_begin(self->kv));
		ASSERT_EQ(0, peer_write(self, (size_t)cycle * BLK,
					100 + (uint32_t)cycle, rkey));
		kvdmabuf_io_end(self->kv);
		EXPECT_EQ(-1, pattern_check(self->kvmem + (size_t)cycle * BLK,
					    BLK, 100 + (uint32_t)cycle));
	}
	/* the kept host region was never touched */
	ASSERT_EQ(0, kvdmabuf_region_info(self->host, &in));
	EXPECT_EQ(0, in.asleep);
	EXPECT_EQ(1u, in.key_gen);
}

TEST_F(vr, device_memory_on_nic_without_dmabuf_mrs_is_refused)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r;
	uint32_t h = 0;
	void *addr;
	int fd, rc;

	fd = vgem_open();
	if (fd < 0)
		SKIP(return, "no vgem device");
	ASSERT_EQ(0, vgem_create(fd, LEN, &h));
	addr = region_mem(LEN);        /* the engine's address of it */
	d.addr = addr;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_DRM;
	d.drm_fd = fd;
	d.drm_handle = h;
	rc = kvdmabuf_region_add(self->v.ctx, &d, &r);
	TH_LOG("%s", kvdmabuf_last_error(self->v.ctx));
	if (rc == 0)
		SKIP(return, "%s has dma-buf MRs", vp_dev_name(0));
	EXPECT_EQ(-EOPNOTSUPP, rc);
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->v.ctx),
			       "no dma-buf memory regions"));
	vgem_close_handle(fd, h);
	close(fd);
	munmap(addr, LEN);
}

TEST_HARNESS_MAIN
