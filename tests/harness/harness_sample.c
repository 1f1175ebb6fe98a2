// SPDX-License-Identifier: GPL-2.0
/*
 * harness_sample: NOT a test of kvdmabuf. A program of deliberately
 * passing, failing, skipping, hanging and crashing tests that
 * harness_selftest runs to prove that the harness reports each correctly.
 */
#include <signal.h>

#include "harness.h"

#ifdef __SANITIZE_ADDRESS__
/* "crashes" must die of its signal, not of the sanitizer's handler. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	return "handle_segv=0";
}
#endif

/* Where nothing points to it any more (a sanitized build's leak check). */
static void *volatile leak_slot;

TEST(passes)
{
	ASSERT_EQ(1, 1);
}

TEST(assert_fails)
{
	ASSERT_EQ(1, 2);
	printf("# AFTER-ASSERT\n");
}

TEST(expect_fails_and_continues)
{
	EXPECT_EQ(1, 2);
	printf("# AFTER-EXPECT\n");
}

TEST(skips)
{
	SKIP(return, "no widget here");
	printf("# AFTER-SKIP\n");
}

TEST_TIMEOUT(hangs, 1)
{
	pause();
}

TEST(crashes)
{
	raise(SIGSEGV);
}

FIXTURE(fx) {
	int value;
};

FIXTURE_VARIANT(fx) {
	int value;
};

FIXTURE_VARIANT_ADD(fx, one) {
	.value = 1,
};

FIXTURE_VARIANT_ADD(fx, two) {
	.value = 2,
};

FIXTURE_SETUP(fx)
{
	self->value = variant->value;
}

FIXTURE_TEARDOWN(fx)
{
	printf("# TEARDOWN %d\n", self->value);
}

TEST_F(fx, sees_its_variant)
{
	ASSERT_EQ(variant->value, self->value);
}

TEST_F(fx, assert_still_tears_down)
{
	ASSERT_EQ(0, self->value);
}

FIXTURE(skipping) {
	int unused;
};

FIXTURE_SETUP(skipping)
{
	SKIP(return, "setup cannot run here");
}

FIXTURE_TEARDOWN(skipping)
{
}

TEST_F(skipping, body_never_runs)
{
	printf("# BODY-RAN\n");
}

TEST(leaks)
{
	leak_slot = malloc(100);
	ASSERT_NOT_NULL(leak_slot);
	leak_slot = NULL;
}

TEST_HARNESS_MAIN
