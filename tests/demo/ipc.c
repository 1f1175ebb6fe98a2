// SPDX-License-Identifier: GPL-2.0
/*
 * ipc.c - the demo's processes and their request/reply channel: one
 * SOCK_SEQPACKET socketpair per child, one struct demo_msg per message.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "demo.h"

#define DEMO_CALL_TIMEOUT_MS 120000

/* Parent ends of every live channel: a new child closes them. */
static int live_fds[16];
static unsigned int nr_live;

int demo_fail(struct demo_msg *m, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m->text, sizeof(m->text), fmt, ap);
	va_end(ap);
	return rc;
}

static void serve(int fd, demo_handler fn, void *arg)
{
	struct demo_msg m;
	ssize_t n;
	int quit;

	for (;;) {
		n = recv(fd, &m, sizeof(m), 0);
		if (n == 0)
			_exit(3);       /* parent gone */
		if (n != (ssize_t)sizeof(m)) {
			fprintf(stderr, "demo child: bad request (%zd bytes): "
				"%s\n", n, n < 0 ? strerror(errno) : "short");
			_exit(3);
		}
		quit = m.op == OP_QUIT;
		m.text[0] = '\0';
		m.rc = fn(&m, arg);
		if (send(fd, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m))
			_exit(3);
		if (quit)
			_exit(m.rc ? 1 : 0);
	}
}

int demo_spawn(struct demo_child *c, const char *name, demo_handler fn,
	       void *arg)
{
	unsigned int i;
	int sv[2];
	pid_t pid;

	c->name = name;
	c->pid = -1;
	c->fd = -1;
	if (nr_live == sizeof(live_fds) / sizeof(live_fds[0]))
		return -EMFILE;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
		int rc = -errno;

		fprintf(stderr, "demo: socketpair: %s\n", strerror(errno));
		return rc;
	}
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		int rc = -errno;

		fprintf(stderr, "demo: fork: %s\n", strerror(errno));
		close(sv[0]);
		close(sv[1]);
		return rc;
	}
	if (pid == 0) {
		for (i = 0; i < nr_live; i++)
			close(live_fds[i]);
		close(sv[0]);
		serve(sv[1], fn, arg);
		_exit(3);
	}
	close(sv[1]);
	c->pid = pid;
	c->fd = sv[0];
	live_fds[nr_live++] = sv[0];
	return 0;
}

int demo_call(struct demo_child *c, struct demo_msg *m)
{
	struct pollfd p = { .fd = c->fd, .events = POLLIN };
	uint32_t op = m->op;
	ssize_t n;
	int rc;

	if (c->fd < 0)
		return -EBADF;
	if (send(c->fd, m, sizeof(*m), MSG_NOSIGNAL) != (ssize_t)sizeof(*m)) {
		rc = -errno;
		fprintf(stderr, "demo: %s: send request %u: %s\n", c->name, op,
			strerror(errno));
		return rc;
	}
	do
		rc = poll(&p, 1, DEMO_CALL_TIMEOUT_MS);
	while (rc < 0 && errno == EINTR);
	if (rc == 0) {
		fprintf(stderr, "demo: %s: no reply to request %u within %d s\n",
			c->name, op, DEMO_CALL_TIMEOUT_MS / 1000);
		return -ETIMEDOUT;
	}
	n = recv(c->fd, m, sizeof(*m), 0);
	if (n != (ssize_t)sizeof(*m)) {
		fprintf(stderr, "demo: %s: %s while waiting for the reply to "
			"request %u\n", c->name,
			n < 0 ? strerror(errno) : "process exited", op);
		return n < 0 ? -errno : -EPIPE;
	}
	if (m->rc)
		fprintf(stderr, "demo: %s: request %u failed: %s (%s)\n",
			c->name, op, m->text[0] ? m->text : "no message",
			strerror(-m->rc));
	return m->rc;
}

int demo_stop(struct demo_child *c)
{
	struct demo_msg m;
	struct timespec ts = { 0, 20000000 };
	unsigned int i;
	int status = 0, tries;
	pid_t w;

	if (c->pid <= 0)
		return 0;
	if (c->fd >= 0) {
		memset(&m, 0, sizeof(m));
		m.op = OP_QUIT;
		demo_call(c, &m);
		for (i = 0; i < nr_live; i++)
			if (live_fds[i] == c->fd) {
				live_fds[i] = live_fds[--nr_live];
				break;
			}
		close(c->fd);
		c->fd = -1;
	}
	for (tries = 0; tries < 250; tries++) {
		w = waitpid(c->pid, &status, WNOHANG);
		if (w == c->pid)
			break;
		nanosleep(&ts, NULL);
	}
	if (tries == 250) {
		fprintf(stderr, "demo: %s (pid %d) did not exit: killing it\n",
			c->name, (int)c->pid);
		kill(c->pid, SIGKILL);
		waitpid(c->pid, &status, 0);
		status = 1 << 8;
	}
	c->pid = -1;
	if (WIFSIGNALED(status)) {
		fprintf(stderr, "demo: %s died of signal %d\n", c->name,
			WTERMSIG(status));
		return 128 + WTERMSIG(status);
	}
	return WEXITSTATUS(status);
}
