// SPDX-License-Identifier: MIT
/*
 * lib_api - the public API's contracts: kvdmabuf_open() errors (no
 * config, refused protocol, module required but absent, protocol rdma
 * without a verbs device, bad options), region description checks, sleep
 * and wake idempotent and selectable by tag, callbacks cannot re-enter,
 * region lookup, removal refused while a transfer is in flight, a new DRM
 * handle only while asleep. Host-only: fake NICs and module
 * (tests/lib_fake.h) except where the real verbs backend is the subject.
 */
#include <infiniband/verbs.h>
#include <pthread.h>
#ifdef __SANITIZE_ADDRESS__
/* the sanitizers' allocator interface (gcc installs no header for it) */
size_t __sanitizer_get_current_allocated_bytes(void);
void __sanitizer_purge_allocator(void);
#else
#include <malloc.h>
#endif
#include <sys/wait.h>
#include <time.h>

#include "harness.h"
#include "lib_fake.h"

#define LEN (4 * 4096)

static int open_yaml(const char *yaml, struct kvdmabuf_ctx **ctx, char *err,
		     size_t len)
{
	return fake_open(yaml, NULL, ctx, err, len);
}

TEST(open_config_named_or_the_defaults)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_ctx *ctx = NULL;
	char err[512];
	int rc;

	/* none named: the defaults (protocol rdma), never -ENOENT */
	unsetenv(KVDMABUF_CONFIG_ENV);
	rc = kvdmabuf_open(&o, &ctx, err, sizeof(err));
	TH_LOG("%d %s", rc, rc ? err : "");
	EXPECT_NE(-ENOENT, rc);
	if (!rc)
		kvdmabuf_close(ctx);
	ctx = NULL;
	setenv(KVDMABUF_CONFIG_ENV, "/nonexistent/k.yaml", 1);
	ASSERT_EQ(-ENOENT, kvdmabuf_open(&o, &ctx, err, sizeof(err)));
	EXPECT_NE(NULL, strstr(err, "/nonexistent/k.yaml"));
	EXPECT_NULL(ctx);
}

TEST(open_refused_by_gate)
{
	struct kvdmabuf_ctx *ctx;
	char err[512];

	fake_reset(1);
	ASSERT_EQ(-EPROTONOSUPPORT, open_yaml("protocol: nvlink\n", &ctx, err,
					      sizeof(err)));
	EXPECT_NE(NULL, strstr(err, "nvlink"));
	setenv("MC_FORCE_MNNVL", "0", 1);
	ASSERT_EQ(-EPROTONOSUPPORT, open_yaml("protocol: rdma\n", &ctx, err,
					      sizeof(err)));
	EXPECT_NE(NULL, strstr(err, "MC_FORCE_MNNVL"));
	unsetenv("MC_FORCE_MNNVL");
}

TEST(open_module_require_absent)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_state st;
	char err[512];

	fake_reset(1);
	fw.module = 0;
	ASSERT_EQ(-ENODEV, open_yaml("protocol: rdma\nmodule: require\n", &ctx,
				     err, sizeof(err)));
	TH_LOG("%s", err);
	/* auto goes without it; off does not even look */
	ASSERT_EQ(0, open_yaml("protocol: rdma\nmodule: auto\n", &ctx, err,
			       sizeof(err)));
	ASSERT_EQ(0, kvdmabuf_query(ctx, &st));
	EXPECT_EQ(0, st.module);
	kvdmabuf_close(ctx);
	fw.module = 1;
	ASSERT_EQ(0, open_yaml("protocol: rdma\nmodule: off\n", &ctx, err,
			       sizeof(err)));
	ASSERT_EQ(0, kvdmabuf_query(ctx, &st));
	EXPECT_EQ(0, st.module);
	kvdmabuf_close(ctx);
}

/*
 * The configuration as text (options.config_yaml) instead of a file: the
 * same keys, the environment over it, never both text and a file.
 */
TEST(config_as_yaml_text)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_state st;
	char err[512];

	fake_reset(1);
	unsetenv("KVDMABUF_PROTOCOL");
	o.config_yaml = "protocol: tcp\ndrain_timeout_s: 3\n";
	ASSERT_EQ(0, fake_open_options(&o, &ctx, err, sizeof(err)));
	ASSERT_EQ(0, kvdmabuf_query(ctx, &st));
	EXPECT_EQ(0, st.protocol_rdma);
	kvdmabuf_close(ctx);
	/* a JSON object is YAML too (what the Python binding sends) */
	o.config_yaml = "{\"protocol\": \"rdma\", \"module\": \"off\"}";
	ASSERT_EQ(0, fake_open_options(&o, &ctx, err, sizeof(err)));
	ASSERT_EQ(0, kvdmabuf_query(ctx, &st));
	EXPECT_EQ(1, st.protocol_rdma);
	EXPECT_EQ(0, st.module);
	kvdmabuf_close(ctx);
	/* the environment still wins */
	setenv("KVDMABUF_PROTOCOL", "tcp", 1);
	ASSERT_EQ(0, fake_open_options(&o, &ctx, err, sizeof(err)));
	unsetenv("KVDMABUF_PROTOCOL");
	ASSERT_EQ(0, kvdmabuf_query(ctx, &st));
	EXPECT_EQ(0, st.protocol_rdma);
	kvdmabuf_close(ctx);
	/* errors name the text; a file and text together are refused */
	o.config_yaml = "drain_timeout_s: soon\n";
	EXPECT_EQ(-EINVAL, fake_open_options(&o, &ctx, err,
					     sizeof(err)));
	TH_LOG("%s", err);
	EXPECT_NOT_NULL(strstr(err, "options.config_yaml"));
	o.config_yaml = "protocol: tcp\n";
	o.config_path = "/etc/kvdmabuf.yaml";
	EXPECT_EQ(-EINVAL, fake_open_options(&o, &ctx, err,
					     sizeof(err)));
	EXPECT_NOT_NULL(strstr(err, "config_path or config_yaml, not both"));
}

/* kvdmabuf_query() says which protocol the configuration chose. */
TEST(query_says_the_protocol)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_state st;
	char err[512];

	fake_reset(1);
	ASSERT_EQ(0, open_yaml("protocol: rdma\n", &ctx, err, sizeof(err)));
	ASSERT_EQ(0, kvdmabuf_query(ctx, &st));
	EXPECT_EQ(1, st.protocol_rdma);
	kvdmabuf_close(ctx);
	ASSERT_EQ(0, open_yaml("protocol: tcp\n", &ctx, err, sizeof(err)));
	ASSERT_EQ(0, kvdmabuf_query(ctx, &st));
	EXPECT_EQ(0, st.protocol_rdma);
	kvdmabuf_close(ctx);
}

TEST(open_rdma_without_verbs_device)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_ctx *ctx;
	struct ibv_device **l;
	char err[512];
	int n = 0;

	l = ibv_get_device_list(&n);
	if (l)
		ibv_free_device_list(l);
	if (n > 0)
		SKIP(return, "this machine has verbs devices");
	o.config_path = write_config("protocol: rdma\n");
	/* the real verbs backend */
	ASSERT_EQ(-ENODEV, kvdmabuf_open(&o, &ctx, err, sizeof(err)));
	TH_LOG("%s", err);
	EXPECT_NE(NULL, strstr(err, "no RDMA device"));
	/* tcp needs none */
	o.config_path = write_config("protocol: tcp\n");
	ASSERT_EQ(0, kvdmabuf_open(&o, &ctx, err, sizeof(err)));
	kvdmabuf_close(ctx);
	unlink(o.config_path);
}

TEST(open_bad_options)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_ctx *ctx;
	char err[256];

	o.reserved[3] = 1;
	EXPECT_EQ(-EINVAL, kvdmabuf_open(&o, &ctx, err, sizeof(err)));
	o.reserved[3] = 0;
	o.module = 7;
	EXPECT_EQ(-EINVAL, kvdmabuf_open(&o, &ctx, err, sizeof(err)));
	o.module = 0;
	o.nr_pds = 1;
	EXPECT_EQ(-EINVAL, kvdmabuf_open(&o, &ctx, err, sizeof(err)));
	EXPECT_EQ(-EINVAL, kvdmabuf_open(NULL, &ctx, err, sizeof(err)));
}

FIXTURE(api) {
	struct kvdmabuf_ctx *ctx;
	char *mem;
	int keys_seen;
	int reentry_rc;
	int close_rc;
};

static struct _test_data_api *cur;

static void on_keys(struct kvdmabuf_region *const *rs, unsigned int n,
		    void *arg)
{
	(void)arg;
	cur->keys_seen += n;
	cur->reentry_rc = kvdmabuf_sleep(rs[0]->ctx, NULL);
	cur->close_rc = kvdmabuf_close(rs[0]->ctx);
}

FIXTURE_SETUP(api)
{
	struct kvdmabuf_options o = { 0 };
	char err[256];

	fake_reset(1);
	fw.module = 1;
	cur = self;
	o.key_change = on_keys;
	ASSERT_EQ(0, fake_open("protocol: rdma\n", &o, &self->ctx, err,
			       sizeof(err)));
	self->mem = region_mem(16 * LEN);
	ASSERT_NE(NULL, self->mem);
}

FIXTURE_TEARDOWN(api)
{
	kvdmabuf_close(self->ctx);
	munmap(self->mem, 16 * LEN);
}

static int add(struct kvdmabuf_ctx *ctx, void *a, size_t len, int mem,
	       unsigned int flags, const char *tag,
	       struct kvdmabuf_region **r)
{
	struct kvdmabuf_region_desc d = { 0 };

	d.addr = a;
	d.len = len;
	d.mem = mem;
	d.flags = flags;
	d.tag = tag;
	return kvdmabuf_region_add(ctx, &d, r);
}

TEST_F(api, region_description_checks)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r;
	char *m = self->mem;

	EXPECT_EQ(-EINVAL, add(self->ctx, m + 1, LEN, KVDMABUF_MEM_HOST, 0,
			       NULL, &r));
	EXPECT_EQ(-EINVAL, add(self->ctx, m, LEN - 1, KVDMABUF_MEM_HOST, 0,
			       NULL, &r));
	/* an unaligned tensor: the message names the pages that hold it */
	{
		char want[64];

		EXPECT_EQ(-EINVAL, add(self->ctx, m + 100, LEN,
				       KVDMABUF_MEM_HOST, 0, NULL, &r));
		snprintf(want, sizeof(want), "are %p+%d", (void *)m,
			 LEN + 4096);
		TH_LOG("%s", kvdmabuf_last_error(self->ctx));
		EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx), want));
	}
	EXPECT_EQ(-EINVAL, add(self->ctx, m, 0, KVDMABUF_MEM_HOST, 0, NULL,
			       &r));
	EXPECT_EQ(-EINVAL, add(self->ctx, m, LEN, 9, 0, NULL, &r));
	EXPECT_EQ(-EINVAL, add(self->ctx, m, LEN, KVDMABUF_MEM_HOST, 0x10,
			       NULL, &r));
	EXPECT_EQ(-EINVAL, add(self->ctx, m, LEN, KVDMABUF_MEM_CUDA,
			       KVDMABUF_REGION_RELEASED_AT_SLEEP, NULL, &r));
	d.addr = m;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_DRM;
	d.drm_fd = -1;
	EXPECT_EQ(-EINVAL, kvdmabuf_region_add(self->ctx, &d, &r));
	d.mem = KVDMABUF_MEM_HOST;
	d.reserved[0] = 1;
	EXPECT_EQ(-EINVAL, kvdmabuf_region_add(self->ctx, &d, &r));
	/* overlap */
	ASSERT_EQ(0, add(self->ctx, m + LEN, 2 * LEN, KVDMABUF_MEM_HOST, 0,
			 NULL, &r));
	EXPECT_EQ(-EINVAL, add(self->ctx, m, 2 * LEN, KVDMABUF_MEM_HOST, 0,
			       NULL, &r));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx), "overlaps"));
	EXPECT_EQ(-EINVAL, add(self->ctx, m + 2 * LEN, 4 * LEN,
			       KVDMABUF_MEM_HOST, 0, NULL, &r));
	/* adjacent is fine */
	EXPECT_EQ(0, add(self->ctx, m + 3 * LEN, LEN, KVDMABUF_MEM_HOST, 0,
			 NULL, &r));
	EXPECT_EQ(0, fake_mrs_live() - 2);
}

TEST_F(api, idempotent_and_selective_by_tag)
{
	struct kvdmabuf_region *kv, *w, *h;
	struct kvdmabuf_region_info in;
	char *m = self->mem;

	ASSERT_EQ(0, add(self->ctx, m, LEN, KVDMABUF_MEM_DRM, 0, "kv_cache",
			 &kv));
	ASSERT_EQ(0, add(self->ctx, m + LEN, LEN, KVDMABUF_MEM_HOST,
			 KVDMABUF_REGION_RELEASED_AT_SLEEP, "weights", &w));
	ASSERT_EQ(0, add(self->ctx, m + 2 * LEN, LEN, KVDMABUF_MEM_HOST, 0,
			 "kv_cache", &h));

	/* wake when awake: success, nothing done */
	inj_arm(OP_EXPORT, 0, 0);
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	EXPECT_EQ(0ul, fw.calls[OP_EXPORT] + fw.calls[OP_REG] +
		       fw.calls[OP_ATTACH]);

	/* sleep of one tag leaves the other awake and registered */
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, "kv_cache"));
	ASSERT_EQ(0, kvdmabuf_region_info(kv, &in));
	EXPECT_EQ(1, in.asleep);
	ASSERT_EQ(0, kvdmabuf_region_info(w, &in));
	EXPECT_EQ(0, in.asleep);
	EXPECT_EQ(1, fake_mrs_at(0, m + LEN, LEN));
	EXPECT_EQ(0, kvdmabuf_io_begin(w));
	kvdmabuf_io_end(w);
	ASSERT_EQ(0, kvdmabuf_region_info(h, &in));
	EXPECT_EQ(0, in.asleep);       /* host regions never sleep */

	/* sleep again: success, nothing done */
	inj_arm(OP_REVOKE, 0, 0);
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, "kv_cache"));
	EXPECT_EQ(0ul, fw.calls[OP_REVOKE] + fw.calls[OP_DEREG]);

	/* everything asleep, then selective wake */
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_region_info(w, &in));
	EXPECT_EQ(1, in.asleep);
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, "weights"));
	ASSERT_EQ(0, kvdmabuf_region_info(w, &in));
	EXPECT_EQ(0, in.asleep);
	ASSERT_EQ(0, kvdmabuf_region_info(kv, &in));
	EXPECT_EQ(1, in.asleep);
	EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(kv));
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, "no_such_tag"));
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, "kv_cache"));
	ASSERT_EQ(0, kvdmabuf_region_info(kv, &in));
	EXPECT_EQ(0, in.asleep);
	ASSERT_EQ(0, kvdmabuf_io_begin(kv));
	kvdmabuf_io_end(kv);
}

/* Bytes the process holds on the heap now (the sanitizer's own count in
 * an ASan build, whose allocator glibc's statistics do not see). */
static size_t heap_bytes(void)
{
#ifdef __SANITIZE_ADDRESS__
	return __sanitizer_get_current_allocated_bytes();
#else
	return mallinfo2().uordblks;
#endif
}

/* A sleep or wake with nothing to do (a second sleep, a tag with no
 * region, a context with no region) allocates nothing that it keeps. */
TEST_F(api, nothing_to_do_keeps_no_memory)
{
	struct kvdmabuf_region *kv;
	struct kvdmabuf_ctx *empty;
	char err[256];
	size_t before, after;
	int i;

	ASSERT_EQ(0, fake_open("protocol: rdma\n", NULL, &empty, err,
			       sizeof(err)));
	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_DRM, 0,
			 "kv_cache", &kv));
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	before = heap_bytes();
	for (i = 0; i < 1000; i++) {
		ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
		ASSERT_EQ(0, kvdmabuf_wake(self->ctx, "no_such_tag"));
		ASSERT_EQ(0, kvdmabuf_sleep(empty, NULL));
		ASSERT_EQ(0, kvdmabuf_wake(empty, NULL));
	}
	after = heap_bytes();
	TH_LOG("heap before %zu, after 4000 calls %zu", before, after);
	EXPECT_LE(after, before);
	ASSERT_EQ(0, kvdmabuf_close(empty));
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
}

TEST_F(api, callbacks_cannot_reenter)
{
	struct kvdmabuf_region *w;

	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_HOST,
			 KVDMABUF_REGION_RELEASED_AT_SLEEP, "weights", &w));
	EXPECT_EQ(0, self->keys_seen);   /* not for the first registration */
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	EXPECT_EQ(1, self->keys_seen);
	EXPECT_EQ(-EDEADLK, self->reentry_rc);
	EXPECT_EQ(-EDEADLK, self->close_rc);
}

/* close is all or nothing: a transfer in flight on one region keeps every
 * region as it was (awake ones open to I/O, asleep ones closed). */
TEST_F(api, close_refused_while_a_transfer_is_in_flight)
{
	struct kvdmabuf_region *a, *b;

	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_DRM, 0,
			 "kv", &a));
	ASSERT_EQ(0, add(self->ctx, self->mem + LEN, LEN, KVDMABUF_MEM_DRM,
			 0, "busy", &b));
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, "kv"));
	ASSERT_EQ(0, kvdmabuf_io_begin(b));
	EXPECT_EQ(-EBUSY, kvdmabuf_close(self->ctx));
	TH_LOG("%s", kvdmabuf_last_error(self->ctx));
	EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin(a));
	kvdmabuf_io_end(b);
	ASSERT_EQ(0, kvdmabuf_io_begin(b));
	kvdmabuf_io_end(b);
}

static void *fail_in_thread(void *arg)
{
	struct kvdmabuf_region *r = arg;
	static char seen[512];

	if (kvdmabuf_region_set_drm_handle(r, 0, 1) != -EINVAL)
		return NULL;
	snprintf(seen, sizeof(seen), "%s", kvdmabuf_last_error(cur->ctx));
	return seen;
}

/* Each thread reads the message of its own failure. */
TEST_F(api, messages_are_per_thread)
{
	struct kvdmabuf_region *h, *bad;
	pthread_t t;
	char *other;

	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_HOST, 0,
			 "h", &h));
	ASSERT_EQ(-EINVAL, add(self->ctx, self->mem + LEN, LEN,
			       KVDMABUF_MEM_HOST, 0x80, "x", &bad));
	ASSERT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx),
			       "unknown flags"));
	ASSERT_EQ(0, pthread_create(&t, NULL, fail_in_thread, h));
	ASSERT_EQ(0, pthread_join(t, (void **)&other));
	ASSERT_NE(NULL, other);
	EXPECT_NE(NULL, strstr(other, "not a DRM region"));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx),
			       "unknown flags"));
	EXPECT_EQ(0, strcmp("", kvdmabuf_last_error(NULL)));
}

TEST_F(api, find_remove_and_drm_handle)
{
	struct kvdmabuf_region *a, *b;
	char *m = self->mem;

	ASSERT_EQ(0, add(self->ctx, m, 2 * LEN, KVDMABUF_MEM_DRM, 0, "kv",
			 &a));
	ASSERT_EQ(0, add(self->ctx, m + 4 * LEN, LEN, KVDMABUF_MEM_HOST, 0,
			 "h", &b));
	EXPECT_EQ(a, kvdmabuf_region_find(self->ctx, m + LEN, LEN));
	EXPECT_EQ(a, kvdmabuf_region_find(self->ctx, m, 2 * LEN));
	EXPECT_NULL(kvdmabuf_region_find(self->ctx, m + LEN, 2 * LEN));
	EXPECT_NULL(kvdmabuf_region_find(self->ctx, m + 3 * LEN, 1));
	EXPECT_EQ(b, kvdmabuf_region_find(self->ctx, m + 4 * LEN, 10));

	EXPECT_EQ(-EBUSY, kvdmabuf_region_set_drm_handle(a, 0, 77));
	EXPECT_EQ(-EINVAL, kvdmabuf_region_set_drm_handle(b, 0, 77));
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_region_set_drm_handle(a, 0, 77));
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	EXPECT_EQ(77u, fw.last_drm_handle);

	ASSERT_EQ(0, kvdmabuf_io_begin(a));
	EXPECT_EQ(-EBUSY, kvdmabuf_region_remove(a));
	kvdmabuf_io_end(a);
	EXPECT_EQ(0, kvdmabuf_region_remove(a));
	EXPECT_NULL(kvdmabuf_region_find(self->ctx, m, LEN));
}

/* A NIC without dma-buf MRs (rxe-like): device memory is refused, never
 * registered by address; host memory is registered by address. */
TEST(nic_without_dmabuf_mrs)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	char err[256];
	char *m = region_mem(2 * LEN);
	int module;

	for (module = 0; module <= 1; module++) {
		fake_reset(2);
		fw.nic_dmabuf[1] = 0;
		fw.module = module;
		ASSERT_EQ(0, open_yaml("protocol: rdma\n", &ctx, err,
				       sizeof(err)));
		EXPECT_EQ(-EOPNOTSUPP, add(ctx, m, LEN, KVDMABUF_MEM_DRM, 0,
					   NULL, &r));
		TH_LOG("%s", kvdmabuf_last_error(ctx));
		EXPECT_NE(NULL, strstr(kvdmabuf_last_error(ctx), "fake1"));
		EXPECT_EQ(0, fake_mrs_live());
		EXPECT_EQ(0, add(ctx, m + LEN, LEN, KVDMABUF_MEM_HOST,
				 KVDMABUF_REGION_RELEASED_AT_SLEEP, NULL, &r));
		EXPECT_EQ(2, fake_mrs_live());
		kvdmabuf_close(ctx);
		fake_proxy_gc();
		EXPECT_EQ(0, fds_named("fake-"));
	}
	munmap(m, 2 * LEN);
}

/* ---- callbacks without the lock, batched; sleep start; batches ---- */

static int batch_calls, batch_regions, getter_rc, other_thread_rc;
static int begin_calls, begin_n, begin_io_rc, begin_ret;

static void *getter_thread(void *arg)
{
	struct kvdmabuf_region_info in;

	getter_rc = kvdmabuf_region_info(arg, &in);
	other_thread_rc = kvdmabuf_sleep(((struct kvdmabuf_region *)arg)->ctx,
					 NULL);
	return NULL;
}

static void batch_keys(struct kvdmabuf_region *const *rs, unsigned int n,
		       void *arg)
{
	struct timespec ts;
	pthread_t t;

	(void)arg;
	batch_calls++;
	batch_regions += n;
	/* another thread can take the context lock meanwhile */
	getter_rc = other_thread_rc = 1;
	if (pthread_create(&t, NULL, getter_thread, rs[0]))
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 5;
	if (pthread_timedjoin_np(t, NULL, &ts)) {
		getter_rc = -ETIMEDOUT;     /* blocked on the lock */
		pthread_join(t, NULL);
	}
}

static int sleep_starts(struct kvdmabuf_region *const *rs, unsigned int n,
			void *arg)
{
	(void)arg;
	begin_calls++;
	begin_n = (int)n;
	begin_io_rc = kvdmabuf_io_begin(rs[0]);
	if (!begin_io_rc)
		kvdmabuf_io_end(rs[0]);
	return begin_ret;
}

/*
 * One key-change call per wake for all regions with new keys, made without
 * the context lock (another thread's getter completes, its sleep gets
 * -EBUSY); the sleep-start callback comes once, I/O already refused, and
 * can abort the sleep.
 */
TEST(callbacks_batched_and_outside_the_lock)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region *r[3];
	struct kvdmabuf_region_info in;
	struct kvdmabuf_ctx *ctx;
	char err[256], *m = region_mem(3 * LEN);
	int i;

	fake_reset(1);
	o.key_change = batch_keys;
	o.sleep_begin = sleep_starts;
	ASSERT_EQ(0, fake_open("protocol: rdma\n", &o, &ctx, err, sizeof(err)));
	for (i = 0; i < 3; i++)
		ASSERT_EQ(0, add(ctx, m + i * LEN, LEN, KVDMABUF_MEM_HOST,
				 i < 2 ? KVDMABUF_REGION_RELEASED_AT_SLEEP : 0,
				 "kv", &r[i]));
	begin_ret = -ECANCELED;
	EXPECT_EQ(-ECANCELED, kvdmabuf_sleep(ctx, NULL));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	EXPECT_EQ(1, begin_calls);
	EXPECT_EQ(2, begin_n);          /* the kept host region is untouched */
	EXPECT_EQ(-ESHUTDOWN, begin_io_rc);
	ASSERT_EQ(0, kvdmabuf_region_info(r[0], &in));
	EXPECT_EQ(0, in.asleep);
	EXPECT_EQ(0, kvdmabuf_io_begin(r[0]));
	kvdmabuf_io_end(r[0]);

	begin_ret = 0;
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	EXPECT_EQ(2, begin_calls);
	EXPECT_EQ(0, batch_calls);
	ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
	EXPECT_EQ(1, batch_calls);
	EXPECT_EQ(2, batch_regions);
	EXPECT_EQ(0, getter_rc);
	EXPECT_EQ(-EBUSY, other_thread_rc);
	EXPECT_EQ(0, kvdmabuf_close(ctx));
	munmap(m, 3 * LEN);
}

TEST_F(api, io_begin_many_is_all_or_nothing)
{
	struct kvdmabuf_region *r[3];
	struct kvdmabuf_state st;
	int i;

	for (i = 0; i < 3; i++)
		ASSERT_EQ(0, add(self->ctx, self->mem + i * LEN, LEN,
				 KVDMABUF_MEM_DRM, 0, i == 2 ? "b" : "a",
				 &r[i]));
	ASSERT_EQ(0, kvdmabuf_io_begin_many(r, 3));
	ASSERT_EQ(0, kvdmabuf_query(self->ctx, &st));
	EXPECT_EQ(3, st.inflight);
	kvdmabuf_io_end_many(r, 3);
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, "b"));
	EXPECT_EQ(-ESHUTDOWN, kvdmabuf_io_begin_many(r, 3));
	ASSERT_EQ(0, kvdmabuf_query(self->ctx, &st));
	EXPECT_EQ(0, st.inflight);
	EXPECT_EQ(0, st.unbalanced_io_end);
	EXPECT_EQ(3, st.nr_follow);   /* the mode stays while asleep */
	EXPECT_EQ(1, st.nr_asleep);
}

/*
 * kvdmabuf_region_ranges() refuses what it cannot change before it asks
 * the module (the VM's lib_vm_follow runs the change itself): no proxy,
 * no ranges, an asleep region.
 */
TEST_F(api, region_ranges_refuses_before_the_module)
{
	struct kvdmabuf_region_range rr = { .len = LEN,
					    .fd = KVDMABUF_RANGE_RELEASE };
	struct kvdmabuf_region *dev, *host;

	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_DRM, 0, "kv",
			 &dev));
	ASSERT_EQ(0, add(self->ctx, self->mem + LEN, LEN, KVDMABUF_MEM_HOST, 0,
			 "h", &host));
	EXPECT_EQ(-EINVAL, kvdmabuf_region_ranges(NULL, &rr, 1));
	EXPECT_EQ(-EINVAL, kvdmabuf_region_ranges(dev, NULL, 1));
	EXPECT_EQ(-EINVAL, kvdmabuf_region_ranges(dev, &rr, 0));
	EXPECT_EQ(-ENOENT, kvdmabuf_region_ranges(host, &rr, 1));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx), "no proxy"));
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, "kv"));
	EXPECT_EQ(-EBUSY, kvdmabuf_region_ranges(dev, &rr, 1));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx), "asleep"));
}

/*
 * An elastic pool that starts empty (KVDMABUF_REGION_EMPTY): nothing
 * exported, the proxy's one range unbacked (the module's scratch), the NIC
 * registered once (FOLLOW); a page brought in later keeps the keys. Host
 * memory, no module, or a NIC that pins: refused, nothing left behind.
 */
TEST_F(api, an_empty_pool_registers_once_on_an_unbacked_proxy)
{
	struct kvdmabuf_region_range rr = { .offset = 4096, .len = 4096 };
	unsigned int exports0 = fw.exports;
	const struct fake_piece *pc;
	struct kvdmabuf_region_info in;
	struct kvdmabuf_region *r, *r2;
	uint32_t lk0, rk0, lk, rk;
	uint64_t g0, g;
	int p;

	EXPECT_EQ(-EINVAL, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_HOST,
			       KVDMABUF_REGION_EMPTY, "h", &r));
	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_CUDA,
			 KVDMABUF_REGION_EMPTY, "kv", &r));
	EXPECT_EQ(exports0, fw.exports);
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(KVDMABUF_MODE_FOLLOW, in.mode);
	EXPECT_EQ(1, fake_mrs_live());
	p = fake_find_proxy(r->proxy_fd);
	ASSERT_LE(0, p);
	pc = fake_piece_at(p, 0);
	ASSERT_NOT_NULL(pc);
	EXPECT_EQ(-1, pc->fd);
	EXPECT_EQ((uint64_t)LEN, pc->len);
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &lk0, &rk0, &g0));

	/* a page comes in: the caller's dma-buf backs it, keys unchanged */
	rr.fd = memfd_create("fake-backing", MFD_CLOEXEC);
	ASSERT_LE(0, rr.fd);
	ASSERT_EQ(0, ftruncate(rr.fd, 4096));
	ASSERT_EQ(0, kvdmabuf_region_ranges(r, &rr, 1));
	close(rr.fd);
	pc = fake_piece_at(p, 4096);
	ASSERT_NOT_NULL(pc);
	EXPECT_LE(0, pc->fd);
	EXPECT_EQ(-1, fake_piece_at(p, 0)->fd);
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, &lk, &rk, &g));
	EXPECT_EQ(lk0, lk);
	EXPECT_EQ(rk0, rk);
	EXPECT_EQ(g0, g);

	/* a NIC that pins could never reach the pages mapped later */
	fw.nic_pins[0] = 1;
	EXPECT_EQ(-EOPNOTSUPP, add(self->ctx, self->mem + LEN, LEN,
				   KVDMABUF_MEM_DRM, KVDMABUF_REGION_EMPTY,
				   "kv2", &r2));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx), "pins"));
	fw.nic_pins[0] = 0;
	EXPECT_EQ(1, fake_mrs_live());
	fake_proxy_gc();
	EXPECT_EQ(1, fds_named("fake-proxy"));
}

/* Without the module there is no proxy to map an empty pool's pages. */
TEST(an_empty_pool_needs_the_module)
{
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region *r;
	char err[256];
	void *m = region_mem(LEN);

	fake_reset(1);
	ASSERT_NE(NULL, m);
	ASSERT_EQ(0, fake_open("protocol: rdma\n", NULL, &ctx, err,
			       sizeof(err)));
	EXPECT_EQ(-EOPNOTSUPP, add(ctx, m, LEN, KVDMABUF_MEM_CUDA,
				   KVDMABUF_REGION_EMPTY, "kv", &r));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(ctx), "module"));
	EXPECT_EQ(0, fake_mrs_live());
	kvdmabuf_close(ctx);
	munmap(m, LEN);
}

/* Engines that register themselves get the proxy dma-buf. */
TEST_F(api, region_dmabuf_is_the_proxy)
{
	struct kvdmabuf_region *dev, *host;
	struct kvdmabuf_region_info in;
	uint64_t off = 1;
	int fd = -1;

	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_DRM, 0, "kv",
			 &dev));
	ASSERT_EQ(0, add(self->ctx, self->mem + LEN, LEN, KVDMABUF_MEM_HOST, 0,
			 "h", &host));
	ASSERT_EQ(0, kvdmabuf_region_dmabuf(dev, &fd, &off));
	ASSERT_EQ(0, kvdmabuf_region_info(dev, &in));
	EXPECT_EQ(fw.px[in.proxy_id - 1].fd, fd);
	EXPECT_EQ(0, off);
	EXPECT_EQ(-ENOENT, kvdmabuf_region_dmabuf(host, &fd, &off));
}

/*
 * The exporter of a region's backing took the memory away (the module
 * revoked the proxy, reason EXPORTER; the fake module stands for it):
 * region_info says so, and a sleep + wake with new memory recovers it.
 */
TEST_F(api, backing_lost_to_its_exporter_is_reported_and_recovers)
{
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;
	int p;

	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_DRM, 0, "kv",
			 &r));
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(0, in.backing_lost);
	p = (int)in.proxy_id - 1;
	fw.px[p].state = KVD_PROXY_REVOKED;
	fw.px[p].revoke_reason = KVD_REVOKE_EXPORTER;
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(1, in.backing_lost);
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(0, in.backing_lost);           /* asleep: nothing to lose */
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(0, in.backing_lost);
	EXPECT_EQ(KVD_PROXY_BACKED, fw.px[p].state);
}

TEST(run_time_version_is_the_headers)
{
	EXPECT_EQ(KVDMABUF_VERSION, kvdmabuf_version());
	EXPECT_EQ(0x000200u, KVDMABUF_VERSION_CODE(0, 2, 0));
}

/* A forked child cannot change (or release) the parent's context. */
TEST_F(api, forked_child_cannot_use_the_context)
{
	struct kvdmabuf_region *r;
	int status;
	pid_t pid;

	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_DRM, 0, "kv",
			 &r));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (!pid) {
		int bad = 0;

		bad |= kvdmabuf_sleep(self->ctx, NULL) != -EPERM;
		bad |= !strstr(kvdmabuf_last_error(self->ctx), "forked");
		bad |= kvdmabuf_region_remove(r) != -EPERM;
		bad |= kvdmabuf_close(self->ctx) != -EPERM;
		bad |= fake_mrs_live() != 1;
		_exit(bad);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_EQ(0, WEXITSTATUS(status));
	ASSERT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_wake(self->ctx, NULL));
}

/* The gate answers again at every sleep. */
TEST_F(api, gate_is_checked_at_every_sleep)
{
	struct kvdmabuf_region *r;

	ASSERT_EQ(0, add(self->ctx, self->mem, LEN, KVDMABUF_MEM_DRM, 0, "kv",
			 &r));
	setenv("MC_INTRANODE_NVLINK", "1", 1);
	EXPECT_EQ(-EPROTONOSUPPORT, kvdmabuf_sleep(self->ctx, NULL));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(self->ctx),
			       "MC_INTRANODE_NVLINK"));
	unsetenv("MC_INTRANODE_NVLINK");
	EXPECT_EQ(0, kvdmabuf_io_begin(r));
	kvdmabuf_io_end(r);
	EXPECT_EQ(0, kvdmabuf_sleep(self->ctx, NULL));
}

/* ---- messages and getters across contexts and threads ---- */

static struct {
	pthread_barrier_t step;
	struct kvdmabuf_ctx *ctx;
	char before[512], after[512];
} other;

/* Fails a call on other.ctx, then (step 2) reads the message of the
 * context found at that address by then. */
static void *fail_then_read(void *arg)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r;

	(void)arg;
	d.addr = (void *)4096;
	d.len = 4096;
	d.mem = KVDMABUF_MEM_HOST;
	d.flags = 0x80;
	if (kvdmabuf_region_add(other.ctx, &d, &r) == -EINVAL)
		snprintf(other.before, sizeof(other.before), "%s",
			 kvdmabuf_last_error(other.ctx));
	pthread_barrier_wait(&other.step);
	pthread_barrier_wait(&other.step);
	snprintf(other.after, sizeof(other.after), "%s",
		 kvdmabuf_last_error(other.ctx));
	return NULL;
}

/* Another thread's message about a closed context is not the message of a
 * new context that the allocator put at the same address. */
TEST(messages_do_not_outlive_their_context)
{
	struct kvdmabuf_ctx *old, *ctx = NULL;
	char err[256];
	pthread_t t;
	int i;

	fake_reset(1);
	ASSERT_EQ(0, fake_open("protocol: rdma\n", NULL, &old, err,
			       sizeof(err)));
	other.ctx = old;
	ASSERT_EQ(0, pthread_barrier_init(&other.step, NULL, 2));
	ASSERT_EQ(0, pthread_create(&t, NULL, fail_then_read, NULL));
	pthread_barrier_wait(&other.step);
	ASSERT_NE(NULL, strstr(other.before, "unknown flags"));
	ASSERT_EQ(0, kvdmabuf_close(old));
	for (i = 0; i < 64 && ctx != old; i++) {
		if (ctx)
			ASSERT_EQ(0, kvdmabuf_close(ctx));
#ifdef __SANITIZE_ADDRESS__
		/* freed memory out of ASan's quarantine, to be reused */
		__sanitizer_purge_allocator();
#endif
		ASSERT_EQ(0, fake_open("protocol: rdma\n", NULL, &ctx, err,
				       sizeof(err)));
	}
	other.ctx = ctx;
	pthread_barrier_wait(&other.step);
	pthread_join(t, NULL);
	kvdmabuf_close(ctx);
	if (ctx != old)
		SKIP(return, "no new context at the old address in 64 opens "
		     "(an allocator that quarantines freed memory)");
	EXPECT_EQ(0, strcmp("", other.after));
	TH_LOG("message seen for the new context: '%s'", other.after);
}

static struct {
	struct kvdmabuf_ctx *ctx;
	struct ibv_pd *pd;
	_Atomic int done;
} pd_reader;

static void *read_pd(void *arg)
{
	(void)arg;
	pd_reader.pd = kvdmabuf_pd(pd_reader.ctx, 1);
	atomic_store(&pd_reader.done, 1);
	return NULL;
}

/* kvdmabuf_pd() reads the NICs under the context lock (NICs join and
 * leave under it). */
TEST(pd_is_read_under_the_lock)
{
	struct kvdmabuf_options o = { 0 };
	struct timespec ts = { 0, 100 * 1000 * 1000 };
	unsigned int idx;
	char err[256];
	pthread_t t;

	fake_reset(1);
	ASSERT_EQ(0, fake_open("protocol: rdma\n", NULL, &pd_reader.ctx, err,
			       sizeof(err)));
	ASSERT_EQ(0, kvdmabuf_nic_add(pd_reader.ctx, (struct ibv_pd *)&o,
				      &idx));
	ASSERT_EQ(1u, idx);
	pthread_mutex_lock(&pd_reader.ctx->lock);
	ASSERT_EQ(0, pthread_create(&t, NULL, read_pd, NULL));
	nanosleep(&ts, NULL);
	EXPECT_EQ(0, atomic_load(&pd_reader.done));
	pthread_mutex_unlock(&pd_reader.ctx->lock);
	pthread_join(t, NULL);
	EXPECT_EQ((struct ibv_pd *)&o, pd_reader.pd);
	EXPECT_NULL(kvdmabuf_pd(pd_reader.ctx, 2));
	ASSERT_EQ(0, kvdmabuf_close(pd_reader.ctx));
}

/* ---- NICs after open, NIC sets ---- */

static int nic_cb_regions;

static void nic_keys(struct kvdmabuf_region *const *rs, unsigned int n,
		     void *arg)
{
	(void)rs;
	(void)arg;
	nic_cb_regions += n;
}

TEST(nics_join_and_leave_after_open)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region *dev, *host, *only0;
	struct kvdmabuf_region_info in;
	struct kvdmabuf_ctx *ctx;
	struct kvdmabuf_region_desc d = { 0 };
	uint32_t l1, l1b, l;
	unsigned int idx = 99;
	char err[256], *m = region_mem(3 * LEN);

	fake_reset(1);
	fw.module = 1;
	o.key_change = nic_keys;
	ASSERT_EQ(0, fake_open("protocol: rdma\n", &o, &ctx, err, sizeof(err)));
	ASSERT_EQ(0, add(ctx, m, LEN, KVDMABUF_MEM_DRM, 0, "kv", &dev));
	ASSERT_EQ(0, add(ctx, m + LEN, LEN, KVDMABUF_MEM_HOST,
			 KVDMABUF_REGION_RELEASED_AT_SLEEP, "kv", &host));
	d.addr = m + 2 * LEN;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	d.nics = 1;                              /* NIC 0 only */
	ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &only0));
	d.nics = 2;                              /* NIC 1: not there */
	EXPECT_EQ(-EINVAL, kvdmabuf_region_add(ctx, &d, &only0));

	/* a pinning NIC joins: the FOLLOW region becomes REREGISTER */
	fw.nic_pins[1] = 1;
	inj_arm(OP_REG, 2, -EIO);                /* the second region fails */
	EXPECT_EQ(-EIO, kvdmabuf_nic_add(ctx, (struct ibv_pd *)&o, &idx));
	inj_disarm();
	EXPECT_EQ(99u, idx);
	EXPECT_EQ(0, fake_mrs_at(1, m, LEN));
	EXPECT_EQ(-EINVAL, kvdmabuf_region_keys(dev, 1, &l, NULL, NULL));
	ASSERT_EQ(0, kvdmabuf_nic_add(ctx, (struct ibv_pd *)&o, &idx));
	EXPECT_EQ(1u, idx);
	EXPECT_EQ(-EINVAL, kvdmabuf_nic_add(ctx, (struct ibv_pd *)&o, &idx));
	EXPECT_EQ(2, nic_cb_regions);
	EXPECT_EQ(1, fake_mrs_at(1, m, LEN));
	EXPECT_EQ(1, fake_mrs_at(1, m + LEN, LEN));
	EXPECT_EQ(0, fake_mrs_at(1, m + 2 * LEN, LEN));
	EXPECT_EQ(-ENOENT, kvdmabuf_region_keys(only0, 1, &l, NULL, NULL));
	ASSERT_EQ(0, kvdmabuf_region_info(dev, &in));
	EXPECT_EQ(KVDMABUF_MODE_REREGISTER, in.mode);
	ASSERT_EQ(0, kvdmabuf_region_keys(host, 1, &l1, NULL, NULL));

	/* asleep: no NIC changes */
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	EXPECT_EQ(-EBUSY, kvdmabuf_nic_add(ctx, (struct ibv_pd *)err, &idx));
	EXPECT_EQ(-EBUSY, kvdmabuf_nic_remove(ctx, 1));
	ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_region_keys(host, 1, &l1, NULL, NULL));

	/* NIC 0 leaves: only0 has no other NIC, so it must go first */
	EXPECT_EQ(-EBUSY, kvdmabuf_nic_remove(ctx, 0));
	ASSERT_EQ(0, kvdmabuf_region_remove(only0));
	ASSERT_EQ(0, kvdmabuf_nic_remove(ctx, 0));
	EXPECT_EQ(-EINVAL, kvdmabuf_region_keys(host, 1, &l, NULL, NULL));
	ASSERT_EQ(0, kvdmabuf_region_keys(host, 0, &l1b, NULL, NULL));
	EXPECT_EQ(l1, l1b);                      /* old NIC 1 is NIC 0 now */
	EXPECT_EQ(2, fake_mrs_live());
	EXPECT_EQ(0, strcmp("fake1", ctx->nics[0].name));
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
	EXPECT_EQ(2, fake_mrs_live());
	EXPECT_EQ(0, kvdmabuf_close(ctx));
	EXPECT_EQ(0, fake_mrs_live());
	munmap(m, 3 * LEN);
}

/* The engine's PDs and the config's nics must agree. */
static struct {
	struct kvdmabuf_region *seen[4];
	unsigned int calls, n;
	int io_rc;
} renum;

static void renum_keys(struct kvdmabuf_region *const *rs, unsigned int n,
		       void *arg)
{
	(void)arg;
	renum.calls++;
	renum.n = n;
	memcpy(renum.seen, rs, (n < 4 ? n : 4) * sizeof(*rs));
	/* the contract: I/O stays open while a NIC joins or leaves */
	renum.io_rc = kvdmabuf_io_begin(rs[0]);
	if (!renum.io_rc)
		kvdmabuf_io_end(rs[0]);
}

/* A NIC leaving moves the keys of the NICs above it down one index: the
 * key generation says so and the key-change callback lists the region;
 * a region only on a NIC below keeps its keys and generation. */
TEST(nic_remove_renumbers_keys_under_a_new_generation)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *all, *only0;
	struct kvdmabuf_ctx *ctx;
	uint32_t l2, l;
	uint64_t g_all, g0, g;
	unsigned int idx;
	char err[256], *m = region_mem(2 * LEN);

	fake_reset(3);
	memset(&renum, 0, sizeof(renum));
	o.key_change = renum_keys;
	ASSERT_EQ(0, fake_open("protocol: rdma\n", &o, &ctx, err, sizeof(err)));
	ASSERT_EQ(0, add(ctx, m, LEN, KVDMABUF_MEM_HOST,
			 KVDMABUF_REGION_RELEASED_AT_SLEEP, "kv", &all));
	d.addr = m + LEN;
	d.len = LEN;
	d.mem = KVDMABUF_MEM_HOST;
	d.nics = 1;
	ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &only0));
	ASSERT_EQ(0, kvdmabuf_region_keys(all, 2, &l2, NULL, &g_all));
	ASSERT_EQ(0, kvdmabuf_region_keys(only0, 0, NULL, NULL, &g0));

	ASSERT_EQ(0, kvdmabuf_nic_remove(ctx, 1));
	ASSERT_EQ(0, kvdmabuf_region_keys(all, 1, &l, NULL, &g));
	EXPECT_EQ(l2, l);                /* old NIC 2's key, at index 1 */
	EXPECT_EQ(g_all + 1, g);
	EXPECT_EQ(1u, renum.calls);
	EXPECT_EQ(1u, renum.n);
	EXPECT_EQ(all, renum.seen[0]);
	EXPECT_EQ(0, renum.io_rc);
	ASSERT_EQ(0, kvdmabuf_region_keys(only0, 0, NULL, NULL, &g));
	EXPECT_EQ(g0, g);

	/* a NIC joining: the callback, I/O open as well */
	memset(&renum, 0, sizeof(renum));
	renum.io_rc = 1;
	ASSERT_EQ(0, kvdmabuf_nic_add(ctx, (struct ibv_pd *)&o, &idx));
	EXPECT_EQ(1u, renum.calls);
	EXPECT_EQ(0, renum.io_rc);
	EXPECT_EQ(0, kvdmabuf_close(ctx));
	munmap(m, 2 * LEN);
}

/* One MR per region and NIC: a region longer than a NIC's max_mr_size is
 * refused, naming the NIC and its limit, at add and when a NIC joins. */
TEST(region_longer_than_max_mr_size_is_refused_by_name)
{
	struct kvdmabuf_options o = { 0 };
	struct kvdmabuf_region *r, *small;
	struct kvdmabuf_ctx *ctx;
	unsigned int idx = 99;
	char err[256], *m = region_mem(2 * LEN);

	fake_reset(2);
	fw.module = 1;
	fw.nic_max_mr[1] = LEN / 2;
	fw.nic_max_mr[2] = LEN / 4;
	ASSERT_EQ(0, fake_open("protocol: rdma\n", &o, &ctx, err, sizeof(err)));
	EXPECT_EQ(-EFBIG, add(ctx, m, LEN, KVDMABUF_MEM_DRM, 0, "kv", &r));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(ctx), "fake1"));
	EXPECT_NE(NULL, strstr(kvdmabuf_last_error(ctx), "max_mr_size"));
	EXPECT_EQ(0, fake_mrs_live());
	ASSERT_EQ(0, add(ctx, m + LEN, LEN / 2, KVDMABUF_MEM_DRM, 0, "kv",
			 &small));
	/* a NIC that takes less joins: refused, nothing changed */
	EXPECT_EQ(-EFBIG, kvdmabuf_nic_add(ctx, (struct ibv_pd *)&o, &idx));
	EXPECT_EQ(99u, idx);
	EXPECT_EQ(2, fake_mrs_live());
	EXPECT_EQ(0, kvdmabuf_close(ctx));
	munmap(m, 2 * LEN);
}

TEST(pds_must_match_config_nics)
{
	struct kvdmabuf_options o = { 0 };
	struct ibv_pd *pds[1] = { (struct ibv_pd *)&o };
	struct kvdmabuf_ctx *ctx;
	char err[256];

	fake_reset(1);
	o.pds = pds;
	o.nr_pds = 1;
	EXPECT_EQ(-EINVAL, fake_open("protocol: rdma\nnics: [mlx5_7]\n", &o,
				     &ctx, err, sizeof(err)));
	EXPECT_NE(NULL, strstr(err, "pds[0] is on fake0"));
	ASSERT_EQ(0, fake_open("protocol: rdma\nnics: [fake0]\n", &o, &ctx,
			       err, sizeof(err)));
	EXPECT_EQ(0, kvdmabuf_close(ctx));
}

TEST(mode_names)
{
	EXPECT_EQ(0, strcmp("follow", kvdmabuf_mode_name(KVDMABUF_MODE_FOLLOW)));
	EXPECT_EQ(0, strcmp("reregister",
			    kvdmabuf_mode_name(KVDMABUF_MODE_REREGISTER)));
	EXPECT_EQ(0, strcmp("host", kvdmabuf_mode_name(KVDMABUF_MODE_HOST)));
	EXPECT_EQ(0, strcmp("noreg", kvdmabuf_mode_name(KVDMABUF_MODE_NOREG)));
	EXPECT_EQ(0, strcmp("?", kvdmabuf_mode_name(0)));
}

/* Live fake MRs by address that page on demand (1) or pin (0). */
static int mrs_on_demand(int on_demand)
{
	int i, n = 0;

	for (i = 0; i < FAKE_MAX_MR; i++)
		n += fw.mr[i].used && fw.mr[i].ref_fd < 0 &&
		     fw.mr[i].on_demand == on_demand;
	return n;
}

/*
 * Host memory the engine releases at sleep, on NICs that page on demand:
 * mode ODP, registered once with IBV_ACCESS_ON_DEMAND (nothing pinned),
 * and sleep and wake register nothing: the MR follows what is mapped
 * there (caught: ODP regions deregistered or registered again, keys
 * changed, or the mode claimed where a NIC cannot page on demand).
 */
TEST(host_memory_released_at_sleep_pages_on_demand)
{
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;
	struct kvdmabuf_state st;
	struct kvdmabuf_ctx *ctx;
	uint32_t rkey0, rkey1, k;
	unsigned long regs, deregs;
	unsigned int idx;
	char err[256], *m = region_mem(LEN);
	struct kvdmabuf_options o = { 0 };

	ASSERT_NOT_NULL(m);
	fake_reset(2);
	fw.nic_odp[0] = fw.nic_odp[1] = 1;
	ASSERT_EQ(0, fake_open("protocol: rdma\n", NULL, &ctx, err,
			       sizeof(err)));
	ASSERT_EQ(0, add(ctx, m, LEN, KVDMABUF_MEM_HOST,
			 KVDMABUF_REGION_RELEASED_AT_SLEEP, "kv", &r));
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(KVDMABUF_MODE_ODP, in.mode);
	EXPECT_EQ(0, strcmp("odp", kvdmabuf_mode_name(in.mode)));
	EXPECT_EQ(2, mrs_on_demand(1));
	EXPECT_EQ(0, mrs_on_demand(0));
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, NULL, &rkey0, NULL));
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 1, NULL, &rkey1, NULL));
	regs = fw.calls[OP_REG];
	deregs = fw.calls[OP_DEREG];
	ASSERT_EQ(0, kvdmabuf_sleep(ctx, NULL));
	ASSERT_EQ(0, remap_fresh(m, LEN));
	ASSERT_EQ(0, kvdmabuf_wake(ctx, NULL));
	EXPECT_EQ(regs, fw.calls[OP_REG]);
	EXPECT_EQ(deregs, fw.calls[OP_DEREG]);
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 0, NULL, &k, NULL));
	EXPECT_EQ(rkey0, k);
	ASSERT_EQ(0, kvdmabuf_region_keys(r, 1, NULL, &k, NULL));
	EXPECT_EQ(rkey1, k);
	ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
	EXPECT_EQ(1u, in.key_gen);
	ASSERT_EQ(0, kvdmabuf_query(ctx, &st));
	EXPECT_EQ(1u, st.nr_follow);
	EXPECT_EQ(0u, st.nr_reregister);
	EXPECT_EQ(1u, st.sleeps);
	EXPECT_EQ(1u, st.wakes);
	/* a NIC without on-demand paging cannot join it: named, refused */
	fw.nic_odp[2] = 0;
	EXPECT_EQ(-EOPNOTSUPP, kvdmabuf_nic_add(ctx, (struct ibv_pd *)&o,
						&idx));
	TH_LOG("%s", kvdmabuf_last_error(ctx));
	EXPECT_NOT_NULL(strstr(kvdmabuf_last_error(ctx), "mode odp"));
	EXPECT_EQ(2, mrs_on_demand(1));
	EXPECT_EQ(0, mrs_on_demand(0));
	kvdmabuf_close(ctx);
	EXPECT_EQ(0, fake_mrs_live());
	munmap(m, LEN);
}

/*
 * Measured, never assumed: one NIC of the region without on-demand
 * paging, or one that advertises it but refuses the registration, makes
 * the region REREGISTER, with no on-demand MR left behind; a region on
 * the paging NIC only is ODP (caught: ODP chosen from one NIC's caps, or
 * a refused registration leaking the MRs made before it).
 */
TEST(on_demand_only_where_every_nic_takes_it)
{
	struct kvdmabuf_region_desc d = { 0 };
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;
	struct kvdmabuf_ctx *ctx;
	char err[256], *m = region_mem(2 * LEN);
	int refusal;

	ASSERT_NOT_NULL(m);
	for (refusal = 0; refusal <= 2; refusal += 2) {
		fake_reset(2);
		fw.nic_odp[0] = 1;
		fw.nic_odp[1] = refusal;
		ASSERT_EQ(0, fake_open("protocol: rdma\n", NULL, &ctx, err,
				       sizeof(err)));
		ASSERT_EQ(0, add(ctx, m, LEN, KVDMABUF_MEM_HOST,
				 KVDMABUF_REGION_RELEASED_AT_SLEEP, "kv", &r));
		ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
		EXPECT_EQ(KVDMABUF_MODE_REREGISTER, in.mode);
		EXPECT_EQ(0, mrs_on_demand(1));
		EXPECT_EQ(2, mrs_on_demand(0));
		d.addr = m + LEN;
		d.len = LEN;
		d.mem = KVDMABUF_MEM_HOST;
		d.flags = KVDMABUF_REGION_RELEASED_AT_SLEEP;
		d.nics = 1;                      /* NIC 0 only */
		ASSERT_EQ(0, kvdmabuf_region_add(ctx, &d, &r));
		ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
		EXPECT_EQ(KVDMABUF_MODE_ODP, in.mode);
		EXPECT_EQ(1, mrs_on_demand(1));
		kvdmabuf_close(ctx);
		EXPECT_EQ(0, fake_mrs_live());
	}
	munmap(m, 2 * LEN);
}

/*
 * host_on_demand: off (file or KVDMABUF_HOST_ON_DEMAND) keeps such memory
 * REREGISTER on paging NICs; any other value is refused, named (caught:
 * the key ignored, or the environment not read).
 */
TEST(host_on_demand_off_reregisters)
{
	struct kvdmabuf_region *r;
	struct kvdmabuf_region_info in;
	struct kvdmabuf_ctx *ctx;
	char err[256], *m = region_mem(LEN);
	int env;

	ASSERT_NOT_NULL(m);
	for (env = 0; env < 2; env++) {
		fake_reset(1);
		fw.nic_odp[0] = 1;
		if (env)
			setenv("KVDMABUF_HOST_ON_DEMAND", "off", 1);
		ASSERT_EQ(0, fake_open(env ? "protocol: rdma\n" :
				       "protocol: rdma\nhost_on_demand: off\n",
				       NULL, &ctx, err, sizeof(err)));
		unsetenv("KVDMABUF_HOST_ON_DEMAND");
		ASSERT_EQ(0, add(ctx, m, LEN, KVDMABUF_MEM_HOST,
				 KVDMABUF_REGION_RELEASED_AT_SLEEP, "kv", &r));
		ASSERT_EQ(0, kvdmabuf_region_info(r, &in));
		EXPECT_EQ(KVDMABUF_MODE_REREGISTER, in.mode);
		EXPECT_EQ(0, mrs_on_demand(1));
		kvdmabuf_close(ctx);
	}
	EXPECT_EQ(-EINVAL, fake_open("protocol: rdma\nhost_on_demand: yes\n",
				     NULL, &ctx, err, sizeof(err)));
	EXPECT_NOT_NULL(strstr(err, "'host_on_demand' must be auto, on or off"));
	munmap(m, LEN);
}

/*
 * registrations: engine (proxy-only) is for engines under
 * libkvdmabuf-preload.so: without it (this program) the engine's own MRs
 * would stay on the memory a sleep releases, so open refuses and says
 * why; NICs or PDs for a library that makes no MR are refused too; the
 * key's value is one of two words. (The mode itself: preload_lib.)
 */
TEST(engine_registrations_need_the_preload)
{
	struct kvdmabuf_ctx *ctx = NULL;
	char err[512];

	fake_reset(1);
	fw.module = 1;
	EXPECT_EQ(-EOPNOTSUPP, fake_open("protocol: rdma\n"
					 "registrations: engine\n", NULL,
					 &ctx, err, sizeof(err)));
	EXPECT_NOT_NULL(strstr(err, "libkvdmabuf-preload.so is not loaded"));
	EXPECT_EQ(-EINVAL, fake_open("protocol: rdma\nregistrations: engine\n"
				     "nics: [fake0]\n", NULL, &ctx, err,
				     sizeof(err)));
	EXPECT_NOT_NULL(strstr(err, "takes no NICs"));
	EXPECT_EQ(-EINVAL, fake_open("protocol: rdma\nregistrations: both\n",
				     NULL, &ctx, err, sizeof(err)));
	EXPECT_NOT_NULL(strstr(err, "'registrations' must be library or "
			       "engine, not 'both'"));
	EXPECT_NULL(ctx);
}

TEST_HARNESS_MAIN
