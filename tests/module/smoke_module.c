// SPDX-License-Identifier: GPL-2.0
/*
 * smoke_module: the kvdmabuf module unloads and loads again cleanly, and
 * its device node comes and goes with it. Needs the module loaded, or
 * KVDMABUF_BUILD pointing at a build tree holding module/kvdmabuf.ko.
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "harness.h"
#include "ko_load.h"

static int is_loaded(void)
{
	struct stat st;

	return !stat("/sys/module/kvdmabuf", &st);
}

static int dev_present(void)
{
	/* udev (or devtmpfs) creates the node asynchronously: give it time. */
	int i, fd;

	for (i = 0; i < kvd_scaled_ms(1000) / 10; i++) {
		fd = open("/dev/kvdmabuf", O_RDWR | O_CLOEXEC);
		if (fd >= 0) {
			close(fd);
			return 1;
		}
		usleep(10000);
	}
	return 0;
}

static int unload(void)
{
	return syscall(SYS_delete_module, "kvdmabuf", O_NONBLOCK) ? -errno : 0;
}

TEST(unload_and_load_again)
{
	const char *build = getenv("KVDMABUF_BUILD");
	char ko[4096];
	int i;

	if (!build)
		SKIP(return, "KVDMABUF_BUILD not set (path of a built tree)");
	if (geteuid())
		SKIP(return, "needs root to load modules");
	snprintf(ko, sizeof(ko), "%s/module/kvdmabuf.ko", build);
	ASSERT_EQ(0, access(ko, R_OK));
	if (!is_loaded())
		ASSERT_EQ(0, kvd_ko_load(ko));
	ASSERT_TRUE(dev_present());

	for (i = 0; i < 3; i++) {
		ASSERT_EQ(0, unload());
		ASSERT_FALSE(is_loaded());
		EXPECT_NE(0, access("/dev/kvdmabuf", F_OK));
		ASSERT_EQ(0, kvd_ko_load(ko));
		ASSERT_TRUE(is_loaded());
		ASSERT_TRUE(dev_present());
	}
	/* Loading twice is refused, not a second instance. */
	EXPECT_EQ(-EEXIST, kvd_ko_load(ko));
}

/* A layout block size the module cannot use refuses the load, cleanly. */
TEST(a_bad_layout_block_size_refuses_the_load)
{
	static const char *const bad[] = {
		"layout_block_pieces=0", "layout_block_pieces=1",
		"layout_block_pieces=65",
	};
	const char *build = getenv("KVDMABUF_BUILD");
	char ko[4096];
	unsigned int i;

	if (!build)
		SKIP(return, "KVDMABUF_BUILD not set (path of a built tree)");
	if (geteuid())
		SKIP(return, "needs root to load modules");
	snprintf(ko, sizeof(ko), "%s/module/kvdmabuf.ko", build);
	if (is_loaded())
		ASSERT_EQ(0, unload());
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		EXPECT_EQ(-EINVAL, kvd_ko_load_params(ko, bad[i]));
		EXPECT_FALSE(is_loaded());
	}
	/* the bounds themselves load */
	ASSERT_EQ(0, kvd_ko_load_params(ko, "layout_block_pieces=2"));
	ASSERT_EQ(0, unload());
	ASSERT_EQ(0, kvd_ko_load_params(ko, "layout_block_pieces=64"));
	ASSERT_EQ(0, unload());
	/* back as the lane loads it */
	ASSERT_EQ(0, kvd_ko_load(ko));
	ASSERT_TRUE(dev_present());
}

TEST_HARNESS_MAIN
