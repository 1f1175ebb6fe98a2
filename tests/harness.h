/* SPDX-License-Identifier: GPL-2.0 */
/*
 * harness.h - kvdmabuf's kselftest-style test harness.
 *
 * Same shape as the kernel's tools/testing/selftests/kselftest_harness.h:
 *
 *	FIXTURE(dev) { int fd; };
 *	FIXTURE_VARIANT(dev) { size_t size; };
 *	FIXTURE_VARIANT_ADD(dev, small) { .size = 4096 };
 *	FIXTURE_SETUP(dev) { self->fd = open(...); if (self->fd < 0) SKIP(return, "no dev"); }
 *	FIXTURE_TEARDOWN(dev) { close(self->fd); }
 *	TEST_F(dev, works) { ASSERT_EQ(0, do_it(self->fd, variant->size)); }
 *	TEST(plain) { EXPECT_TRUE(1); }
 *	TEST_HARNESS_MAIN
 *
 * Every test runs in its own forked child (own process group) with a
 * timeout; ASSERT_* ends the test (teardown still runs once setup completed),
 * EXPECT_* records the failure and goes on. Output is TAP 13 on stdout.
 * Exit status: 0 all passed, 1 something failed, 4 everything skipped.
 * Options: -l lists the tests, -t NAME runs only tests whose full name
 * (fixture.variant.test) or test name equals NAME (repeatable); a NAME that
 * matches no test is an error (exit 1), never an empty passing run.
 * KVDMABUF_TIMEOUT_SCALE=N multiplies every timeout (slow emulators).
 * Built with -fsanitize=address, each test's child runs LeakSanitizer
 * before its _exit() (which skips the check at exit): a test that passes
 * but leaks fails, the report on stderr.
 */
#ifndef KVDMABUF_TESTS_HARNESS_H
#define KVDMABUF_TESTS_HARNESS_H

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

#include "timeout_scale.h"

#define KSFT_PASS 0
#define KSFT_FAIL 1
#define KSFT_SKIP 4

#define TEST_TIMEOUT_DEFAULT 30

/*
 * @rel (e.g. "lib/cli/kvdmabuf", "tests/fake_cuda/libcuda.so.1") under the
 * top of the build tree this program was built in, into @buf: the nearest
 * folder above its executable holding both lib/ and tests/, wherever the
 * program lies below tests/ (its part's folder, tests/asan/PART). 0, or
 * -ENOENT when there is none (an installed copy).
 */
static inline int kvd_build_path(char *buf, size_t len, const char *rel)
{
	char top[4096], probe[4096 + 8];
	ssize_t n = readlink("/proc/self/exe", top, sizeof(top) - 1);
	struct stat l, t;
	char *slash;

	buf[0] = '\0';
	if (n <= 0)
		return -ENOENT;
	top[n] = '\0';
	while ((slash = strrchr(top, '/'))) {
		*slash = '\0';
		snprintf(probe, sizeof(probe), "%s/lib", top);
		if (stat(probe, &l) || !S_ISDIR(l.st_mode))
			continue;
		snprintf(probe, sizeof(probe), "%s/tests", top);
		if (stat(probe, &t) || !S_ISDIR(t.st_mode))
			continue;
		n = (ssize_t)strlen(top);
		if ((size_t)n + 1 + strlen(rel) >= len)
			return -ENAMETOOLONG;
		memcpy(buf, top, (size_t)n);
		buf[n] = '/';
		strcpy(buf + n + 1, rel);
		return 0;
	}
	return -ENOENT;
}

struct __fixture_variant_metadata {
	const char *name;
	const void *data;
	struct __fixture_variant_metadata *next;
};

struct __fixture_metadata {
	const char *name;
	struct __fixture_variant_metadata *variants;
	struct __fixture_metadata *next;
};

/* Shared with the parent: what the child found. */
struct __test_results {
	char reason[512];
};

struct __test_metadata {
	const char *name;
	void (*fn)(struct __test_metadata *,
		   const struct __fixture_variant_metadata *);
	struct __fixture_metadata *fixture;
	int timeout;
	/* Child-side state. */
	int passed;
	int skip;
	int setup_completed;
	jmp_buf env;
	struct __test_results *results;
	struct __test_metadata *next;
};

struct __harness_registry {
	struct __fixture_metadata *fixtures;
	struct __test_metadata *tests;
	char **names;   /* the -t names: held here, not leaked, in a child */
};

/* The registry is filled by constructors before main() runs. */
static struct __harness_registry __harness;
static struct __fixture_metadata _global_fixture_object = { .name = "global" };

static inline void __register_fixture(struct __fixture_metadata *f)
{
	struct __fixture_metadata **p = &__harness.fixtures;

	while (*p)
		p = &(*p)->next;
	*p = f;
}

static inline void __register_fixture_variant(struct __fixture_metadata *f,
					      struct __fixture_variant_metadata *v)
{
	struct __fixture_variant_metadata **p = &f->variants;

	while (*p)
		p = &(*p)->next;
	*p = v;
}

static inline void __register_test(struct __test_metadata *t)
{
	struct __test_metadata **p = &__harness.tests;

	while (*p)
		p = &(*p)->next;
	*p = t;
}

#define __TH_UNUSED __attribute__((unused))

#define TH_LOG(fmt, ...)                                                     \
	do {                                                                 \
		fprintf(stdout, "# %s:%d:%s:" fmt "\n", __FILE__, __LINE__, \
			_metadata->name, ##__VA_ARGS__);                     \
		fflush(stdout);                                              \
	} while (0)

#define SKIP(statement, fmt, ...)                                           \
	do {                                                                \
		snprintf(_metadata->results->reason,                        \
			 sizeof(_metadata->results->reason), fmt,           \
			 ##__VA_ARGS__);                                    \
		_metadata->skip = 1;                                        \
		statement;                                                  \
	} while (0)

/* ---- fixtures ---- */

#define FIXTURE_DATA(fixture_name) struct _test_data_##fixture_name
#define FIXTURE_VARIANT(fixture_name) struct _fixture_variant_##fixture_name

#define FIXTURE(fixture_name)                                               \
	FIXTURE_VARIANT(fixture_name);                                      \
	static struct __fixture_metadata _##fixture_name##_fixture_object = \
		{ .name = #fixture_name };                                  \
	static void __attribute__((constructor))                            \
	_register_##fixture_name##_data(void)                               \
	{                                                                   \
		__register_fixture(&_##fixture_name##_fixture_object);      \
	}                                                                   \
	FIXTURE_DATA(fixture_name)

#define FIXTURE_SETUP(fixture_name)                                         \
	static void fixture_name##_setup(                                   \
		struct __test_metadata __TH_UNUSED *_metadata,              \
		FIXTURE_DATA(fixture_name) __TH_UNUSED *self,               \
		const FIXTURE_VARIANT(fixture_name) __TH_UNUSED *variant)

#define FIXTURE_TEARDOWN(fixture_name)                                      \
	static void fixture_name##_teardown(                                \
		struct __test_metadata __TH_UNUSED *_metadata,              \
		FIXTURE_DATA(fixture_name) __TH_UNUSED *self,               \
		const FIXTURE_VARIANT(fixture_name) __TH_UNUSED *variant)

#define FIXTURE_VARIANT_ADD(fixture_name, variant_name)                     \
	extern const FIXTURE_VARIANT(fixture_name)                          \
		_##fixture_name##_##variant_name##_variant;                 \
	static struct __fixture_variant_metadata                            \
		_##fixture_name##_##variant_name##_object = {               \
			.name = #variant_name,                              \
			.data = &_##fixture_name##_##variant_name##_variant \
		};                                                          \
	static void __attribute__((constructor))                            \
	_register_##fixture_name##_##variant_name(void)                     \
	{                                                                   \
		__register_fixture_variant(                                 \
			&_##fixture_name##_fixture_object,                  \
			&_##fixture_name##_##variant_name##_object);        \
	}                                                                   \
	const FIXTURE_VARIANT(fixture_name)                                 \
		_##fixture_name##_##variant_name##_variant =

/* ---- tests ---- */

#define __TEST_REGISTER(id, test_name, fixture_obj, seconds)                \
	static struct __test_metadata _##id##_object = {                    \
		.name = #test_name,                                         \
		.fn = &wrapper_##id,                                        \
		.fixture = &fixture_obj,                                    \
		.timeout = seconds,                                         \
	};                                                                  \
	static void __attribute__((constructor)) _register_##id(void)      \
	{                                                                   \
		__register_test(&_##id##_object);                           \
	}

#define __TEST_IMPL(test_name, seconds)                                     \
	static void test_name(struct __test_metadata *_metadata);          \
	static void wrapper_##test_name(                                    \
		struct __test_metadata *_metadata,                          \
		const struct __fixture_variant_metadata __TH_UNUSED *v)     \
	{                                                                   \
		if (setjmp(_metadata->env) == 0) {                          \
			_metadata->setup_completed = 1;                     \
			test_name(_metadata);                               \
		}                                                           \
	}                                                                   \
	__TEST_REGISTER(test_name, test_name, _global_fixture_object,       \
			seconds)                                            \
	static void test_name(struct __test_metadata __TH_UNUSED *_metadata)

#define TEST(test_name) __TEST_IMPL(test_name, TEST_TIMEOUT_DEFAULT)
#define TEST_TIMEOUT(test_name, seconds) __TEST_IMPL(test_name, seconds)

#define __TEST_F_IMPL(fixture_name, test_name, seconds)                     \
	static void fixture_name##_##test_name(                             \
		struct __test_metadata *_metadata,                          \
		FIXTURE_DATA(fixture_name) *self,                           \
		const FIXTURE_VARIANT(fixture_name) *variant);              \
	static void wrapper_##fixture_name##_##test_name(                   \
		struct __test_metadata *_metadata,                          \
		const struct __fixture_variant_metadata *v)                 \
	{                                                                   \
		/* Static: both must survive the longjmp of an ASSERT. */  \
		static FIXTURE_DATA(fixture_name) self;                     \
		static const FIXTURE_VARIANT(fixture_name) *variant;        \
		variant = v ? v->data : NULL;                               \
		memset(&self, 0, sizeof(self));                             \
		if (setjmp(_metadata->env) == 0) {                          \
			fixture_name##_setup(_metadata, &self, variant);    \
			_metadata->setup_completed = 1;                     \
			if (!_metadata->skip && _metadata->passed)          \
				fixture_name##_##test_name(_metadata, &self, \
							   variant);        \
		}                                                           \
		if (_metadata->setup_completed) {                           \
			/* An ASSERT in teardown must not loop back. */     \
			_metadata->setup_completed = 0;                     \
			if (setjmp(_metadata->env) == 0)                    \
				fixture_name##_teardown(_metadata, &self,   \
							variant);           \
		}                                                           \
	}                                                                   \
	__TEST_REGISTER(fixture_name##_##test_name, test_name,              \
			_##fixture_name##_fixture_object, seconds)          \
	static void fixture_name##_##test_name(                             \
		struct __test_metadata __TH_UNUSED *_metadata,              \
		FIXTURE_DATA(fixture_name) __TH_UNUSED *self,               \
		const FIXTURE_VARIANT(fixture_name) __TH_UNUSED *variant)

#define TEST_F(fixture_name, test_name)                                     \
	__TEST_F_IMPL(fixture_name, test_name, TEST_TIMEOUT_DEFAULT)
#define TEST_F_TIMEOUT(fixture_name, test_name, seconds)                    \
	__TEST_F_IMPL(fixture_name, test_name, seconds)

/* ---- assertions ---- */

static inline void __th_report(struct __test_metadata *m, const char *file,
			       int line, const char *exp, const char *op,
			       const char *seen, long long e, long long s)
{
	printf("# %s:%d:%s:Expected %s (%lld) %s %s (%lld)\n", file, line,
	       m->name, exp, e, op, seen, s);
	fflush(stdout);
	m->passed = 0;
}

#define __TH_CMP(expected, seen, op, is_assert)                             \
	do {                                                                \
		__typeof__(expected) __exp = (expected);                    \
		__typeof__(seen) __seen = (seen);                           \
		_Pragma("GCC diagnostic push")                              \
		_Pragma("GCC diagnostic ignored \"-Wsign-compare\"")        \
		int __ok = (__exp op __seen);                               \
		_Pragma("GCC diagnostic pop")                               \
		if (!__ok) {                                                \
			__th_report(_metadata, __FILE__, __LINE__,          \
				    #expected, #op, #seen,                  \
				    (long long)(uintptr_t)__exp,            \
				    (long long)(uintptr_t)__seen);          \
			if (is_assert)                                      \
				longjmp(_metadata->env, 1);                 \
		}                                                           \
	} while (0)

#define ASSERT_EQ(e, s) __TH_CMP(e, s, ==, 1)
#define ASSERT_NE(e, s) __TH_CMP(e, s, !=, 1)
#define ASSERT_LT(e, s) __TH_CMP(e, s, <, 1)
#define ASSERT_LE(e, s) __TH_CMP(e, s, <=, 1)
#define ASSERT_GT(e, s) __TH_CMP(e, s, >, 1)
#define ASSERT_GE(e, s) __TH_CMP(e, s, >=, 1)
#define ASSERT_TRUE(s) __TH_CMP(0, !!(s), !=, 1)
#define ASSERT_FALSE(s) __TH_CMP(0, !!(s), ==, 1)
#define ASSERT_NULL(s) __TH_CMP(NULL, (const void *)(s), ==, 1)
#define ASSERT_NOT_NULL(s) __TH_CMP(NULL, (const void *)(s), !=, 1)
#define EXPECT_EQ(e, s) __TH_CMP(e, s, ==, 0)
#define EXPECT_NE(e, s) __TH_CMP(e, s, !=, 0)
#define EXPECT_LT(e, s) __TH_CMP(e, s, <, 0)
#define EXPECT_LE(e, s) __TH_CMP(e, s, <=, 0)
#define EXPECT_GT(e, s) __TH_CMP(e, s, >, 0)
#define EXPECT_GE(e, s) __TH_CMP(e, s, >=, 0)
#define EXPECT_TRUE(s) __TH_CMP(0, !!(s), !=, 0)
#define EXPECT_FALSE(s) __TH_CMP(0, !!(s), ==, 0)
#define EXPECT_NULL(s) __TH_CMP(NULL, (const void *)(s), ==, 0)
#define EXPECT_NOT_NULL(s) __TH_CMP(NULL, (const void *)(s), !=, 0)

/* Byte-wise comparison of two buffers, reporting the first difference. */
#define __TH_MEMEQ(a, b, len, is_assert)                                    \
	do {                                                                \
		const unsigned char *__a = (const void *)(a);               \
		const unsigned char *__b = (const void *)(b);               \
		size_t __i, __n = (len);                                    \
		for (__i = 0; __i < __n && __a[__i] == __b[__i]; __i++)     \
			;                                                   \
		if (__i != __n) {                                           \
			printf("# %s:%d:%s:%s and %s differ at byte %zu "  \
			       "(0x%02x != 0x%02x)\n", __FILE__, __LINE__, \
			       _metadata->name, #a, #b, __i, __a[__i],      \
			       __b[__i]);                                   \
			fflush(stdout);                                     \
			_metadata->passed = 0;                              \
			if (is_assert)                                      \
				longjmp(_metadata->env, 1);                 \
		}                                                           \
	} while (0)
#define ASSERT_MEMEQ(a, b, len) __TH_MEMEQ(a, b, len, 1)
#define EXPECT_MEMEQ(a, b, len) __TH_MEMEQ(a, b, len, 0)

/* ---- runner ---- */

static inline double __th_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * In a sanitized build: 1 when LeakSanitizer finds memory that nothing
 * points to any more (it prints the report), else 0. The child ends with
 * _exit(), which skips the check LeakSanitizer makes at exit.
 */
static inline int __th_leaked(void)
{
#ifdef __SANITIZE_ADDRESS__
	return __lsan_do_recoverable_leak_check() != 0;
#else
	return 0;
#endif
}

/* Returns KSFT_PASS/FAIL/SKIP; reason filled for skips and time-outs. */
static inline int __th_run_one(struct __test_metadata *t,
			       const struct __fixture_variant_metadata *v,
			       struct __test_results *res, int scale)
{
	double deadline;
	int status;
	pid_t pid;

	memset(res, 0, sizeof(*res));
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		snprintf(res->reason, sizeof(res->reason), "fork: %s",
			 strerror(errno));
		return KSFT_FAIL;
	}
	if (pid == 0) {
		setpgid(0, 0);
		t->passed = 1;
		t->skip = 0;
		t->setup_completed = 0;
		t->results = res;
		t->fn(t, v);
		fflush(stdout);
		if (t->passed && !t->skip && __th_leaked()) {
			snprintf(res->reason, sizeof(res->reason),
				 "LeakSanitizer: memory leaked (report on "
				 "stderr)");
			t->passed = 0;
		}
		_exit(t->skip && t->passed ? KSFT_SKIP :
		      t->passed ? KSFT_PASS : KSFT_FAIL);
	}
	setpgid(pid, pid);
	deadline = __th_now() + (double)t->timeout * scale;
	for (;;) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			break;
		if (r < 0 && errno != EINTR) {
			snprintf(res->reason, sizeof(res->reason),
				 "waitpid: %s", strerror(errno));
			return KSFT_FAIL;
		}
		if (__th_now() > deadline) {
			kill(-pid, SIGKILL);
			waitpid(pid, &status, 0);
			snprintf(res->reason, sizeof(res->reason),
				 "timed out after %d s", t->timeout * scale);
			return KSFT_FAIL;
		}
		usleep(2000);
	}
	/* Reap anything the test left behind in its process group. */
	kill(-pid, SIGKILL);
	if (WIFSIGNALED(status)) {
		snprintf(res->reason, sizeof(res->reason),
			 "died with signal %d", WTERMSIG(status));
		return KSFT_FAIL;
	}
	if (WEXITSTATUS(status) == KSFT_SKIP)
		return KSFT_SKIP;
	return WEXITSTATUS(status) == KSFT_PASS ? KSFT_PASS : KSFT_FAIL;
}

static inline int __th_selected(char **names, int n, const char *full,
				const char *name)
{
	int i;

	if (!n)
		return 1;
	for (i = 0; i < n; i++)
		if (!strcmp(names[i], full) || !strcmp(names[i], name))
			return 1;
	return 0;
}

static inline void __th_fullname(char *buf, size_t len,
				 const struct __test_metadata *t,
				 const struct __fixture_variant_metadata *v)
{
	if (t->fixture == &_global_fixture_object)
		snprintf(buf, len, "%s", t->name);
	else if (v)
		snprintf(buf, len, "%s.%s.%s", t->fixture->name, v->name,
			 t->name);
	else
		snprintf(buf, len, "%s.%s", t->fixture->name, t->name);
}

/* Iterates over every (test, variant) case; start with *t = NULL. */
static inline int __th_next(struct __test_metadata **t,
			    const struct __fixture_variant_metadata **v)
{
	if (!*t) {
		*t = __harness.tests;
	} else if (*v && (*v)->next) {
		*v = (*v)->next;
		return 1;
	} else {
		*t = (*t)->next;
	}
	*v = *t ? (*t)->fixture->variants : NULL;
	return *t != NULL;
}

static inline int test_harness_run(int argc, char **argv)
{
	const struct __fixture_variant_metadata *v = NULL;
	int pass = 0, fail = 0, skip = 0, total = 0, n = 0, list = 0;
	struct __test_metadata *t = NULL;
	struct __test_results *res;
	int scale = kvd_scaled_ms(1);
	char **names = __harness.names = calloc(argc, sizeof(*names));
	char full[256];
	int nnames = 0, opt;

	while ((opt = getopt(argc, argv, "lt:")) != -1) {
		if (opt == 'l')
			list = 1;
		else if (opt == 't')
			names[nnames++] = optarg;
		else {
			fprintf(stderr, "usage: %s [-l] [-t TEST]...\n",
				argv[0]);
			return KSFT_FAIL;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (t = NULL; __th_next(&t, &v);) {
		__th_fullname(full, sizeof(full), t, v);
		if (__th_selected(names, nnames, full, t->name))
			total++;
	}
	/* Each -t NAME must select something: a typo is not a pass. */
	for (opt = 0; opt < nnames && !list; opt++) {
		int found = 0;

		for (t = NULL; !found && __th_next(&t, &v);) {
			__th_fullname(full, sizeof(full), t, v);
			found = __th_selected(&names[opt], 1, full, t->name);
		}
		if (!found) {
			printf("Bail out! no test matches -t %s (%s -l lists them)\n",
			       names[opt], argv[0]);
			free(names);
			return KSFT_FAIL;
		}
	}
	if (list) {
		for (t = NULL; __th_next(&t, &v);) {
			__th_fullname(full, sizeof(full), t, v);
			printf("%s\n", full);
		}
		return KSFT_PASS;
	}
	res = mmap(NULL, sizeof(*res), PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (res == MAP_FAILED) {
		perror("mmap");
		return KSFT_FAIL;
	}
	printf("TAP version 13\n1..%d\n", total);
	for (t = NULL; __th_next(&t, &v);) {
		double t0;
		int rc;

		__th_fullname(full, sizeof(full), t, v);
		if (!__th_selected(names, nnames, full, t->name))
			continue;
		n++;
		printf("#  RUN           %s ...\n", full);
		t0 = __th_now();
		rc = __th_run_one(t, v, res, scale);
		if (rc == KSFT_SKIP) {
			skip++;
			printf("ok %d %s # SKIP %s\n", n, full, res->reason);
		} else if (rc == KSFT_PASS) {
			pass++;
			printf("ok %d %s # %.2fs\n", n, full, __th_now() - t0);
		} else {
			fail++;
			if (res->reason[0])
				printf("# %s: %s\n", full, res->reason);
			printf("not ok %d %s\n", n, full);
		}
	}
	printf("# Totals: pass:%d fail:%d xfail:0 xpass:0 skip:%d error:0\n",
	       pass, fail, skip);
	munmap(res, sizeof(*res));
	free(names);
	if (fail)
		return KSFT_FAIL;
	return (skip && !pass) ? KSFT_SKIP : KSFT_PASS;
}

#define TEST_HARNESS_MAIN                                                   \
	int main(int argc, char **argv)                                     \
	{                                                                   \
		return test_harness_run(argc, argv);                        \
	}

#endif /* KVDMABUF_TESTS_HARNESS_H */
