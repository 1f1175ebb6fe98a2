// SPDX-License-Identifier: GPL-2.0
/*
 * harness_selftest: the test harness reports what really happened. Runs
 * harness_sample (deliberate passes, failures, skips, a hang and a crash)
 * and checks its TAP lines and exit status.
 */
#include <libgen.h>
#include <limits.h>

#include "harness.h"

/* Runs harness_sample with @args; returns its exit status, output in @buf. */
static int run_sample(const char *args, char *buf, size_t len)
{
	char exe[PATH_MAX], cmd[PATH_MAX + 256];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	size_t got;
	FILE *p;
	int st;

	if (n < 0)
		return -1;
	exe[n] = 0;
	snprintf(cmd, sizeof(cmd), "%s/harness_sample %s", dirname(exe), args);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	got = fread(buf, 1, len - 1, p);
	buf[got] = 0;
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int has_line(const char *out, const char *line)
{
	size_t n = strlen(line);
	const char *p = out;

	while ((p = strstr(p, line))) {
		if ((p == out || p[-1] == '\n') && (p[n] == '\n' || p[n] == ' '))
			return 1;
		p += n;
	}
	return 0;
}

TEST(full_run_reports_each_outcome)
{
	static char out[65536];

	ASSERT_EQ(KSFT_FAIL, run_sample("", out, sizeof(out)));
	EXPECT_TRUE(has_line(out, "TAP version 13"));
	EXPECT_TRUE(has_line(out, "1..12"));
	EXPECT_TRUE(has_line(out, "ok 1 passes #"));
	EXPECT_TRUE(has_line(out, "not ok 2 assert_fails"));
	EXPECT_TRUE(has_line(out, "not ok 3 expect_fails_and_continues"));
	EXPECT_TRUE(has_line(out, "ok 4 skips # SKIP no widget here"));
	EXPECT_TRUE(has_line(out, "not ok 5 hangs"));
	EXPECT_NOT_NULL(strstr(out, "timed out after 1 s"));
	EXPECT_TRUE(has_line(out, "not ok 6 crashes"));
	EXPECT_NOT_NULL(strstr(out, "died with signal 11"));
	EXPECT_TRUE(has_line(out, "ok 7 fx.one.sees_its_variant #"));
	EXPECT_TRUE(has_line(out, "ok 8 fx.two.sees_its_variant #"));
	EXPECT_TRUE(has_line(out, "not ok 9 fx.one.assert_still_tears_down"));
	EXPECT_TRUE(has_line(out, "not ok 10 fx.two.assert_still_tears_down"));
	EXPECT_TRUE(has_line(out, "ok 11 skipping.body_never_runs # SKIP setup cannot run here"));
	/* Built with ASan (tests/asan/), each child checks for leaks. */
#ifdef __SANITIZE_ADDRESS__
	EXPECT_TRUE(has_line(out, "not ok 12 leaks"));
	EXPECT_NOT_NULL(strstr(out, "LeakSanitizer: memory leaked"));
#else
	EXPECT_TRUE(has_line(out, "ok 12 leaks #"));
#endif
	/* ASSERT stops the test, EXPECT does not, SKIP stops it too. */
	EXPECT_NULL(strstr(out, "AFTER-ASSERT"));
	EXPECT_NOT_NULL(strstr(out, "AFTER-EXPECT"));
	EXPECT_NULL(strstr(out, "AFTER-SKIP"));
	/* Teardown ran after the failed ASSERT of variant one. */
	EXPECT_NOT_NULL(strstr(out, "TEARDOWN 1"));
	EXPECT_NOT_NULL(strstr(out, "Expected 1 (1) == 2 (2)"));
}

TEST(selected_pass_exits_zero)
{
	static char out[8192];

	ASSERT_EQ(KSFT_PASS, run_sample("-t passes -t fx.two.sees_its_variant",
					out, sizeof(out)));
	EXPECT_TRUE(has_line(out, "1..2"));
}

TEST(only_skips_exit_four)
{
	static char out[8192];

	ASSERT_EQ(KSFT_SKIP, run_sample("-t skips -t body_never_runs", out,
					sizeof(out)));
	EXPECT_TRUE(has_line(out, "ok 2 skipping.body_never_runs # SKIP setup cannot run here"));
	EXPECT_NULL(strstr(out, "BODY-RAN"));
}

TEST(unknown_name_fails)
{
	static char out[8192];

	/* Alone, and next to a name that exists: never "1..0" and exit 0. */
	ASSERT_EQ(KSFT_FAIL, run_sample("-t no_such_test", out, sizeof(out)));
	EXPECT_NOT_NULL(strstr(out, "Bail out! no test matches -t no_such_test"));
	EXPECT_NULL(strstr(out, "1..0"));
	ASSERT_EQ(KSFT_FAIL, run_sample("-t passes -t fx.three.sees_its_variant",
					out, sizeof(out)));
	EXPECT_NOT_NULL(strstr(out, "no test matches -t fx.three.sees_its_variant"));
	EXPECT_NULL(strstr(out, "ok 1 passes"));
}

TEST_HARNESS_MAIN
