// SPDX-License-Identifier: GPL-2.0
/*
 * vm_verdict: the VM lane's judge (tests/vm/verdict.sh) fails a run for
 * each reason it must, and passes a clean one. Without this, a lane that
 * silently ignored a kernel WARNING would look green. The same for the
 * lanes' other judges: skips.sh (a skip must be listed with its reason)
 * and counts.sh (every program reports as many tests as listed).
 */
#include <limits.h>
#include <stdbool.h>

#include "harness.h"

static const char clean_tail[] =
	"ok 1 something # 0.1s\r\n"
	"KVD-DMESG-BEGIN\r\n"
	"[    0.950682] rcu: \tRCU lockdep checking is enabled.\r\n"
	"[    0.951575] ... MAX_LOCKDEP_SUBCLASSES:  8\r\n"
	"[    1.000000] kvdmabuf: loading out-of-tree module taints kernel.\r\n"
	"KVD-DMESG-END\r\n"
	"KVD-VM-DONE rc=0\r\n";

/* Writes @text to a file, runs verdict.sh @mode on it; returns its status. */
static int judge_as(const char *mode, const char *text, const char *mods)
{
	char sh[PATH_MAX], cmd[PATH_MAX + 128], path[] = "/tmp/kvd-verdict.XXXXXX";
	int fd, st;

	if (kvd_build_path(sh, sizeof(sh), "tests/vm/verdict.sh"))
		return -1;
	fd = mkstemp(path);
	if (fd < 0)
		return -1;
	if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
		close(fd);
		return -1;
	}
	close(fd);
	snprintf(cmd, sizeof(cmd), "%s %s %s %s >/dev/null 2>&1", sh, mode,
		 path, mods);
	st = system(cmd);
	unlink(path);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int judge(const char *text)
{
	return judge_as("", text, "");
}

TEST(clean_run_passes)
{
	EXPECT_EQ(0, judge(clean_tail));
}

TEST(guest_that_never_finished_fails)
{
	EXPECT_EQ(1, judge("ok 1 something\r\n"));
}

TEST(failed_guest_command_fails)
{
	EXPECT_EQ(1, judge("not ok 1 x\r\nKVD-VM-DONE rc=1\r\n"));
}

TEST(fatal_init_step_fails)
{
	char log[1024];

	snprintf(log, sizeof(log), "KVD-VM-FATAL: cannot mount the 9p root\n%s",
		 clean_tail);
	EXPECT_EQ(1, judge(log));
}

FIXTURE(report) {
	int unused;
};

FIXTURE_VARIANT(report) {
	const char *line;
	bool fit;	/* the kernel can judge another breakage after it */
};

FIXTURE_VARIANT_ADD(report, warning) {
	.line = "[   12.3] WARNING: CPU: 1 PID: 77 at module/kvd_ops.c:100 kvd_detach+0x1",
};
FIXTURE_VARIANT_ADD(report, bug) {
	.line = "[   12.3] BUG: unable to handle page fault for address: 0000",
};
FIXTURE_VARIANT_ADD(report, lockdep) {
	.line = "[   12.3] WARNING: possible circular locking dependency detected",
};
FIXTURE_VARIANT_ADD(report, lockdep_off) {
	.line = "[   12.3] INFO: lockdep is turned off.",
};
FIXTURE_VARIANT_ADD(report, rcu) {
	.line = "[   12.3] WARNING: suspicious RCU usage",
};
FIXTURE_VARIANT_ADD(report, kasan) {
	.line = "[   12.3] BUG: KASAN: slab-use-after-free in kvd_release+0x2",
};
FIXTURE_VARIANT_ADD(report, list) {
	.line = "[   12.3] list_del corruption. prev->next should be ffff",
};
FIXTURE_VARIANT_ADD(report, atomic_sleep) {
	.line = "[   12.3] BUG: sleeping function called from invalid context at x.c:1",
};
FIXTURE_VARIANT_ADD(report, refcount) {
	.line = "[   12.3] refcount_t: underflow; use-after-free.",
};
/* The test importers' own reports of a broken contract. */
FIXTURE_VARIANT_ADD(report, importer_pinned_move) {
	.line = "[   12.3] kvd_importer: move notification on a pinned import",
	.fit = true,
};

FIXTURE_SETUP(report)
{
}

FIXTURE_TEARDOWN(report)
{
}

/* A report anywhere in the console fails a run that otherwise passed. */
TEST_F(report, fails_the_run)
{
	char log[2048];

	snprintf(log, sizeof(log), "KVD-DMESG-BEGIN\r\n%s\r\n%s", variant->line,
		 clean_tail);
	EXPECT_EQ(1, judge(log));
}

/*
 * make mutants boots again after a report unless it is a warning of a
 * module the batch loads afresh (tests/mutants/guest_batch.sh): any other
 * (a WARN_ON_ONCE of the kernel's, KASAN, lockdep) would hide the next
 * breakage's. The warning above is the module's, but its line has no
 * module tag: the kernel's own code.
 */
TEST_F(report, leaves_the_kernel_fit_only_when_the_module_warned)
{
	char log[1024];

	snprintf(log, sizeof(log), "%s\n[   12.4] Call Trace:\n", variant->line);
	EXPECT_EQ(variant->fit ? 0 : 1,
		  judge_as("--unfit", log, "kvdmabuf rdma_rxe"));
}

static const char module_warnings[] =
	"[   12.3] WARNING: module/kvd_ops.c:125 at kvd_count_importers+0x7e/0x170 [kvdmabuf], CPU#1: proxy_abi/158\n"
	"[   12.3] Call Trace:\n"
	"[   13.1] WARNING: CPU: 1 PID: 77 at drivers/infiniband/sw/rxe/rxe_dmabuf.c:222 rxe_dmabuf_map_held+0x6f/0x90 [rdma_rxe]\n"
	"[   13.2] kvd_importer: move notification on a pinned import\n";

TEST(warnings_of_modules_loaded_afresh_leave_the_kernel_fit)
{
	EXPECT_EQ(0, judge_as("--unfit", module_warnings, "kvdmabuf rdma_rxe"));
	/* the unbroken module of a library breakage stays loaded */
	EXPECT_EQ(1, judge_as("--unfit", module_warnings, "rdma_rxe"));
	EXPECT_EQ(1, judge_as("--unfit", module_warnings, ""));
}

/* Writes @text to a new temporary file; its path in @path (XXXXXX). */
static int put(char *path, const char *text)
{
	int fd = mkstemp(path);
	ssize_t len = (ssize_t)strlen(text);

	if (fd < 0)
		return -1;
	if (write(fd, text, len) != len) {
		close(fd);
		return -1;
	}
	return close(fd);
}

/* Runs tests/vm/@script @args LOG LIST, on lane 6.1; returns its status. */
static int judge_with(const char *script, const char *args, const char *log,
		      const char *list)
{
	char vm[PATH_MAX], cmd[2 * PATH_MAX + 256];
	char lpath[] = "/tmp/kvd-judge-log.XXXXXX";
	char fpath[] = "/tmp/kvd-judge-list.XXXXXX";
	int st;

	if (kvd_build_path(vm, sizeof(vm), "tests/vm"))
		return -1;
	if (put(lpath, log) || put(fpath, list))
		return -1;
	snprintf(cmd, sizeof(cmd), "%s/%s %s 6.1 %s %s >/dev/null 2>&1",
		 vm, script, args, lpath, fpath);
	st = system(cmd);
	unlink(lpath);
	unlink(fpath);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char skip_log[] =
	"# ===== proxy_udmabuf\r\n"
	"ok 1 udmabuf.reads # SKIP /dev/udmabuf: No such file or directory "
	"(CONFIG_UDMABUF not set)\r\n"
	"# ===== proxy_follow\r\n"
	"ok 1 follow.works\r\n";

TEST(skip_listed_with_its_reason_passes)
{
	EXPECT_EQ(0, judge_with("skips.sh", "", skip_log,
		"# why\n6.1 proxy_udmabuf * # /dev/udmabuf: * (CONFIG_UDMABUF not set)\n"));
}

TEST(skip_listed_for_another_reason_fails)
{
	EXPECT_EQ(1, judge_with("skips.sh", "", skip_log,
		"6.1 proxy_udmabuf * # no edu PCI device*\n"));
}

TEST(skip_of_another_lane_or_program_fails)
{
	EXPECT_EQ(1, judge_with("skips.sh", "", skip_log,
		"6.12 proxy_udmabuf * # *\n6.1 proxy_follow * # *\n"));
}

TEST(skip_list_line_without_reason_fails)
{
	EXPECT_EQ(1, judge_with("skips.sh", "", skip_log,
		"6.1 proxy_udmabuf *\n6.1 proxy_udmabuf * # /dev/udmabuf: *\n"));
}

static const char count_log[] =
	"# ===== smoke_module\r\n"
	"TAP version 13\r\n1..2\r\nok 1 a\r\nnot ok 2 b\r\n"
	"# ===== py_engine.py\r\n"
	"ok 1 c # SKIP why\r\n# ok 1 a nested line\r\n"
	"# ===== proxy_abi\r\n"
	"not ok - proxy_abi: exited with status 139\r\n";

TEST(counts_as_listed_pass)
{
	EXPECT_EQ(0, judge_with("counts.sh", "check", count_log,
		"# LANE PROGRAM TESTS\n6.1 smoke_module 2\n6.1 py_engine.py 1\n"
		"6.1 proxy_abi 0\n6.12 other 5\n"));
}

TEST(program_dropped_from_the_list_fails)
{
	EXPECT_EQ(1, judge_with("counts.sh", "check", count_log,
		"6.1 smoke_module 2\n6.1 py_engine.py 1\n6.1 proxy_abi 0\n"
		"6.1 proxy_races 1\n"));
}

TEST(program_with_fewer_tests_fails)
{
	EXPECT_EQ(1, judge_with("counts.sh", "check", count_log,
		"6.1 smoke_module 2\n6.1 py_engine.py 1\n6.1 proxy_abi 12\n"));
}

TEST(program_not_in_the_counts_fails)
{
	EXPECT_EQ(1, judge_with("counts.sh", "check", count_log,
		"6.1 smoke_module 2\n6.1 py_engine.py 1\n"));
}

TEST_HARNESS_MAIN
