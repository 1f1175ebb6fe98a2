// SPDX-License-Identifier: GPL-2.0
/*
 * proxy_lifetime: proxies outlive the device fd that created them; a
 * process killed at any point (backed and mapped, between revoke and
 * attach) leaks nothing (debugfs counters return to their baseline); the
 * module cannot be unloaded while a proxy exists and unloads cleanly once
 * the last one is gone (then it is loaded again from $KVDMABUF_BUILD).
 */
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "harness.h"
#include "ko_load.h"
#include "proxy_common.h"

#define SIZE		(16 * KVD_PAGE)

struct baseline {
	long proxies, backings, slots;
};

static int read_baseline(struct baseline *b)
{
	b->proxies = kvd_stat("proxies");
	b->backings = kvd_stat("backings");
	b->slots = kvd_stat("backing_attachments");
	return b->proxies < 0 ? (int)b->proxies : 0;
}

/* Waits (bounded) for the counters to come back to @b; 1 when they did. */
static int back_to_baseline(const struct baseline *b)
{
	struct baseline now;
	int i;

	for (i = 0; i < kvd_scaled_ms(3000) / 10; i++) {
		read_baseline(&now);
		if (now.proxies == b->proxies && now.backings == b->backings &&
		    now.slots == b->slots)
			return 1;
		usleep(10000);
	}
	printf("# counters: proxies %ld/%ld backings %ld/%ld slots %ld/%ld\n",
	       now.proxies, b->proxies, now.backings, b->backings, now.slots,
	       b->slots);
	return 0;
}

FIXTURE(life) {
	int dev, imp, drm;
	struct baseline base;
};

FIXTURE_SETUP(life)
{
	self->dev = self->imp = self->drm = -1;
	KVD_OPEN_DEV(self->dev);
	KVD_OPEN_IMP(self->imp);
	KVD_OPEN_VGEM(self->drm);
	if (read_baseline(&self->base))
		SKIP(return, "no %s/stats (debugfs not mounted, not root?)",
		     KVD_DEBUGFS);
}

FIXTURE_TEARDOWN(life)
{
	if (self->drm >= 0)
		close(self->drm);
	if (self->imp >= 0)
		close(self->imp);
	if (self->dev >= 0)
		close(self->dev);
}

TEST_F(life, device_fd_closed_with_proxies_alive)
{
	char buf[KVD_PAGE];
	struct kvdmabuf_query q;
	int proxy, a, b, h, dev2;

	a = vgem_pattern_buf(self->drm, SIZE, 1);
	b = vgem_pattern_buf(self->drm, SIZE, 2);
	ASSERT_GE(a, 0);
	ASSERT_GE(b, 0);
	proxy = kvd_create(self->dev, SIZE, NULL);
	ASSERT_GE(proxy, 0);
	ASSERT_EQ(0, kvd_attach(self->dev, proxy, a, 0));
	h = imp_import(self->imp, proxy, 0);
	ASSERT_GE(h, 0);
	close(self->dev);
	self->dev = -1;

	/*
	 * The proxy still works, keeps its backing, and can still be
	 * queried, but no other opener of the device controls it.
	 */
	ASSERT_EQ(0, imp_read(self->imp, h, 0, buf, sizeof(buf)));
	EXPECT_EQ(-1, pattern_check(buf, sizeof(buf), 1));
	dev2 = kvd_dev_open();
	ASSERT_GE(dev2, 0);
	EXPECT_EQ(-EPERM, kvd_revoke(dev2, proxy, 1000));
	EXPECT_EQ(-EPERM, kvd_replace(dev2, proxy, b, 0));
	ASSERT_EQ(0, imp_read(self->imp, h, 0, buf, sizeof(buf)));
	EXPECT_EQ(-1, pattern_check(buf, sizeof(buf), 1));
	ASSERT_EQ(0, kvd_query(dev2, proxy, &q));
	EXPECT_EQ(KVDMABUF_STATE_BACKED, q.state);
	EXPECT_EQ(1, q.generation);

	ASSERT_EQ(0, imp_release(self->imp, h));
	close(proxy);
	close(a);
	close(b);
	close(dev2);
	EXPECT_TRUE(back_to_baseline(&self->base));
}

FIXTURE(killed) {
	struct baseline base;
};

FIXTURE_VARIANT(killed) {
	int revoke_first;
};

FIXTURE_VARIANT_ADD(killed, while_backed_and_mapped) { .revoke_first = 0 };
FIXTURE_VARIANT_ADD(killed, between_revoke_and_attach) { .revoke_first = 1 };

FIXTURE_SETUP(killed)
{
	int fd = kvd_dev_open();

	if (fd < 0)
		SKIP(return, "%s: %s (kvdmabuf module not loaded)",
		     KVDMABUF_DEVICE_PATH, strerror(-fd));
	close(fd);
	fd = imp_open();
	if (fd < 0)
		SKIP(return, "%s: %s (%s test module not loaded)",
		     KVD_IMP_PATH, strerror(-fd), KVD_IMP_MODULE);
	close(fd);
	if (read_baseline(&self->base))
		SKIP(return, "no %s/stats (debugfs not mounted, not root?)",
		     KVD_DEBUGFS);
}

FIXTURE_TEARDOWN(killed)
{
}

/* Child: sets everything up, reports readiness on @wfd, waits to die. */
static void __attribute__((noreturn)) victim(int wfd, int revoke_first)
{
	int dev = kvd_dev_open(), imp = imp_open(), drm = vgem_open();
	char buf[KVD_PAGE], c = 1;
	int proxy, proxy2, a, h;

	if (dev < 0 || imp < 0 || drm < 0)
		_exit(10);
	a = vgem_pattern_buf(drm, SIZE, 3);
	proxy = kvd_create(dev, SIZE, NULL);
	proxy2 = kvd_create(dev, SIZE, NULL);
	if (a < 0 || proxy < 0 || proxy2 < 0)
		_exit(11);
	if (kvd_attach(dev, proxy, a, 0) || kvd_attach(dev, proxy2, a, 0))
		_exit(12);
	h = imp_import(imp, proxy, 0);
	if (h < 0 || imp_read(imp, h, 0, buf, sizeof(buf)))
		_exit(13);
	if (imp_import(imp, proxy2, KVD_IMP_IMPORT_PINNED) < 0)
		_exit(14);
	if (revoke_first && kvd_revoke(dev, proxy, 1000))
		_exit(15);
	if (write(wfd, &c, 1) != 1)
		_exit(16);
	for (;;)
		pause();
}

TEST_F(killed, process_killed_leaks_nothing)
{
	int pfd[2], status;
	pid_t pid;
	char c;

	ASSERT_EQ(0, pipe(pfd));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (!pid) {
		close(pfd[0]);
		victim(pfd[1], variant->revoke_first);
	}
	close(pfd[1]);
	ASSERT_EQ(1, read(pfd[0], &c, 1));
	close(pfd[0]);
	EXPECT_EQ(self->base.proxies + 2, kvd_stat("proxies"));
	ASSERT_EQ(0, kill(pid, SIGKILL));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_TRUE(WIFSIGNALED(status));
	EXPECT_TRUE(back_to_baseline(&self->base));
}

/* ---- module unload ---- */

static int mod_loaded(void)
{
	struct stat st;

	return !stat("/sys/module/kvdmabuf", &st);
}

static int mod_unload(void)
{
	return syscall(SYS_delete_module, "kvdmabuf", O_NONBLOCK) ? -errno : 0;
}

static int dev_wait(void)
{
	int i, fd;

	for (i = 0; i < kvd_scaled_ms(2000) / 10; i++) {
		fd = kvd_dev_open();
		if (fd >= 0)
			return fd;
		usleep(10000);
	}
	return fd;
}

TEST(rmmod_refused_while_a_proxy_exists)
{
	const char *build = getenv("KVDMABUF_BUILD");
	char ko[4096];
	int dev, proxy, ret, i;

	if (!build)
		SKIP(return, "KVDMABUF_BUILD not set (path of a built tree)");
	if (geteuid())
		SKIP(return, "needs root to unload and load modules");
	snprintf(ko, sizeof(ko), "%s/module/kvdmabuf.ko", build);
	ASSERT_EQ(0, access(ko, R_OK));
	if (!mod_loaded())
		ASSERT_EQ(0, kvd_ko_load(ko));
	dev = dev_wait();
	ASSERT_GE(dev, 0);
	proxy = kvd_create(dev, SIZE, NULL);
	ASSERT_GE(proxy, 0);
	close(dev);

	/* Only the proxy holds the module now. */
	EXPECT_EQ(-EWOULDBLOCK, mod_unload());
	EXPECT_TRUE(mod_loaded());
	close(proxy);

	for (i = 0, ret = -EWOULDBLOCK; i < kvd_scaled_ms(1000) / 10 && ret == -EWOULDBLOCK;
	     i++) {
		ret = mod_unload();
		if (ret == -EWOULDBLOCK)
			usleep(10000);
	}
	EXPECT_EQ(0, ret);
	EXPECT_FALSE(mod_loaded());
	if (!mod_loaded())
		ASSERT_EQ(0, kvd_ko_load(ko));
	dev = dev_wait();
	ASSERT_GE(dev, 0);
	close(dev);
}

TEST_HARNESS_MAIN
