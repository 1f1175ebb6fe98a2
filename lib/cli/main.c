// SPDX-License-Identifier: MIT
/*
 * kvdmabuf - the admin's command: is this node ready (check), what do
 * the proxies look like (status), do the checks pass on this hardware
 * (selftest: what is safe on a serving node; --vm-suite: the VM suite,
 * for test machines), a CDI spec for containers (cdi). Options are parsed with getopt_long, per command; anything
 * it does not know is named and nothing runs (exit status 2).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "../kvdmabuf.h"
#include "report.h"

static int usage(FILE *f)
{
	fprintf(f, "usage: kvdmabuf check [--json]    is this node ready for "
		"kvdmabuf?\n"
		"       kvdmabuf status [--json]   proxies this user may see, and\n"
		"                                  processes under the preload\n"
		"       kvdmabuf status --preload [--json]  only those processes\n"
		"       kvdmabuf selftest [--list] run the installed self-tests "
		"that are\n"
		"                                  safe on a serving node (TAP)\n"
		"       kvdmabuf selftest --vm-suite [--list]  the VM suite: "
		"loads test\n"
		"                                  modules, sets up soft-RoCE; "
		"test machines only\n"
		"       kvdmabuf cdi [--group NAME]  a CDI spec of the device "
		"for\n"
		"                                  container runtimes "
		"(/etc/cdi)\n"
		"       kvdmabuf --version | --help\n"
		"exit status: 0 pass, 1 something failed, 2 usage or setup "
		"error\n");
	return f == stderr ? 2 : 0;
}

/* The options of each command (and --help, which every one takes). */
enum { O_HELP = 'h', O_JSON = 'j', O_PRELOAD = 'p', O_LIST = 'l',
       O_VM_SUITE = 'v', O_GROUP = 'g' };

static const struct command {
	const char *name;
	struct option opts[4];
} commands[] = {
	{ "check", { { "json", no_argument, NULL, O_JSON },
		     { "help", no_argument, NULL, O_HELP }, { 0 } } },
	{ "status", { { "json", no_argument, NULL, O_JSON },
		      { "preload", no_argument, NULL, O_PRELOAD },
		      { "help", no_argument, NULL, O_HELP }, { 0 } } },
	{ "selftest", { { "list", no_argument, NULL, O_LIST },
			{ "vm-suite", no_argument, NULL, O_VM_SUITE },
			{ "help", no_argument, NULL, O_HELP }, { 0 } } },
	{ "cdi", { { "group", required_argument, NULL, O_GROUP },
		   { "help", no_argument, NULL, O_HELP }, { 0 } } },
};

static int usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "kvdmabuf: %s '%s'\n", what, arg);
	return usage(stderr);
}

static int version(void)
{
	unsigned int v = kvdmabuf_version();

	printf("kvdmabuf %u.%u.%u\n", v >> 16, (v >> 8) & 0xff, v & 0xff);
	return 0;
}

int main(int argc, char **argv)
{
	bool json = false, preload = false, list = false, vm_suite = false;
	const char *group = "kvdmabuf";	/* the udev rule's */
	const struct command *c = NULL;
	char what[64];
	size_t i;
	int o;

	if (argc < 2)
		return usage(stderr);
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V"))
		return argc == 2 ? version() :
		       usage_error("unexpected argument", argv[2]);
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
		return usage(stdout);
	for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name))
			c = &commands[i];
	if (!c)
		return usage_error(argv[1][0] == '-' ? "unknown option" :
				   "unknown command", argv[1]);
	/* the command's own options, after its name; errors are ours */
	opterr = 0;
	optind = 1;
	while ((o = getopt_long(argc - 1, argv + 1, "+:", c->opts, NULL)) != -1) {
		switch (o) {
		case O_HELP:
			return usage(stdout);
		case O_JSON:
			json = true;
			break;
		case O_PRELOAD:
			preload = true;
			break;
		case O_LIST:
			list = true;
			break;
		case O_VM_SUITE:
			vm_suite = true;
			break;
		case O_GROUP:
			group = optarg;
			break;
		case ':':
			snprintf(what, sizeof(what), "%s: option needs an "
				 "argument", c->name);
			return usage_error(what, argv[optind]);
		default:
			snprintf(what, sizeof(what), "%s: unknown option",
				 c->name);
			return usage_error(what, argv[optind]);
		}
	}
	if (optind < argc - 1) {
		snprintf(what, sizeof(what), "%s: unexpected argument",
			 c->name);
		return usage_error(what, argv[optind + 1]);
	}
	if (!strcmp(c->name, "check"))
		return cmd_check(json);
	if (!strcmp(c->name, "status"))
		return cmd_status(json, preload);
	if (!strcmp(c->name, "cdi"))
		return cmd_cdi(group);
	return cmd_selftest(list, vm_suite);
}
