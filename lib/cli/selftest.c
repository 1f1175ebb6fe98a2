// SPDX-License-Identifier: MIT
/*
 * selftest.c - `kvdmabuf selftest`: runs the installed kselftest-style
 * programs on this machine and streams their TAP; each skips, with its
 * reason, what the machine lacks. selftest.list in the selftest folder
 * holds those safe on a serving node (the hardware tests: a small GPU
 * allocation, no module loaded, no network device touched);
 * selftest-vm.list, run only with --vm-suite, the VM suite's programs,
 * which load test modules, add soft-RoCE devices and addresses and run the
 * fuzzer: for a test machine or a VM.
 * A run in which nothing passed and nothing failed tested nothing: exit 2,
 * as for a set-up error, never 0.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "report.h"

#define PROGRAM_TIMEOUT_S 1200
/* GPU memory a hardware test takes at a time, unless KVDMABUF_HW_MIB says */
#define NODE_HW_MIB "256"

/* Installed beside the command: BINDIR/../libexec/kvdmabuf/selftests,
 * wherever PREFIX (and DESTDIR) put both. */
static void default_dir(char *dir, size_t len)
{
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	char *slash;

	if (n <= 0) {
		snprintf(dir, len, "/usr/local/libexec/kvdmabuf/selftests");
		return;
	}
	exe[n] = '\0';
	slash = strrchr(exe, '/');
	if (slash)
		*slash = '\0';
	if (snprintf(dir, len, "%s/../libexec/kvdmabuf/selftests", exe) < 0)
		dir[0] = '\0';
}

struct tally {
	unsigned int pass, fail, skip;
};

/* Runs @path, copying its output and counting its TAP lines. */
static int run_one(const char *path, struct tally *t)
{
	char line[1024];
	int pipefd[2], status, failed_before = (int)t->fail;
	time_t start = time(NULL);
	FILE *out;
	pid_t pid;

	if (pipe(pipefd))
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (!pid) {
		dup2(pipefd[1], 1);
		dup2(pipefd[1], 2);
		close(pipefd[0]);
		alarm(PROGRAM_TIMEOUT_S);   /* kills a hung program */
		execl(path, path, (char *)NULL);
		printf("not ok - %s: cannot run it: %s\n", path,
		       strerror(errno));
		_exit(1);
	}
	close(pipefd[1]);
	out = fdopen(pipefd[0], "r");
	while (out && fgets(line, sizeof(line), out)) {
		fputs(line, stdout);
		if (!strncmp(line, "not ok", 6))
			t->fail++;
		else if (!strncmp(line, "ok", 2) && strstr(line, "# SKIP"))
			t->skip++;
		else if (!strncmp(line, "ok", 2))
			t->pass++;
	}
	if (out)
		fclose(out);
	waitpid(pid, &status, 0);
	if ((!WIFEXITED(status) || (WEXITSTATUS(status) != 0 &&
				    WEXITSTATUS(status) != 4)) &&
	    (int)t->fail == failed_before) {
		printf("not ok - %s: ended with status 0x%x after %lds\n", path,
		       status, (long)(time(NULL) - start));
		t->fail++;
	}
	fflush(stdout);
	return 0;
}

int cmd_selftest(bool list_only, bool vm_suite)
{
	const char *file = vm_suite ? "selftest-vm.list" : "selftest.list";
	const char *dir = getenv("KVDMABUF_SELFTEST_DIR");
	char path[8192], name[256], here[4096];
	struct tally t = { 0 };
	FILE *list;

	if (!dir) {
		default_dir(here, sizeof(here));
		dir = here;
	}
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	list = fopen(path, "re");
	if (!list) {
		fprintf(stderr, "kvdmabuf selftest: %s: %s (installed with "
			"'make install'; KVDMABUF_SELFTEST_DIR names another "
			"folder)\n", path, strerror(errno));
		return 2;
	}
	setenv("KVDMABUF_HW_MIB", NODE_HW_MIB, 0);
	while (fscanf(list, "%255s%*[^\n]", name) == 1) {
		if (name[0] == '#')
			continue;
		if (list_only) {
			puts(name);
			continue;
		}
		printf("# ===== %s\n", name);
		fflush(stdout);
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		if (run_one(path, &t)) {
			printf("not ok - %s: cannot start it\n", name);
			t.fail++;
		}
	}
	fclose(list);
	if (list_only)
		return 0;
	printf("# selftest: %u passed, %u failed, %u skipped\n", t.pass,
	       t.fail, t.skip);
	if (t.fail)
		return 1;
	/* every test skipped (no module, no device): not a pass */
	if (!t.pass) {
		printf("# selftest: nothing was tested on this machine (the "
		       "skips above say what it lacks)\n");
		return 2;
	}
	return 0;
}
