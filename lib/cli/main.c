// SPDX-License-Identifier: MIT
/*
 * kvdmabuf - the admin's command: is this node ready (check), what do
 * the proxies look like (status), do the checks pass on this hardware
 * (selftest).
 */
#include <stdio.h>
#include <string.h>

#include "report.h"

static int usage(FILE *f)
{
	fprintf(f, "usage: kvdmabuf check [--json]    is this node ready for "
		"kvdmabuf?\n"
		"       kvdmabuf status [--json]   proxies this user may see, and\n"
		"                                  processes under the preload\n"
		"       kvdmabuf status --preload [--json]  only those processes\n"
		"       kvdmabuf selftest [--list] run the installed self-tests "
		"(TAP)\n"
		"exit status: 0 pass, 1 something failed, 2 usage or setup "
		"error\n");
	return f == stderr ? 2 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr);
	if (!strcmp(argv[1], "check"))
		return cmd_check(argc - 1, argv + 1);
	if (!strcmp(argv[1], "status"))
		return cmd_status(argc - 1, argv + 1);
	if (!strcmp(argv[1], "selftest"))
		return cmd_selftest(argc - 1, argv + 1);
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))
		return usage(stdout);
	return usage(stderr);
}
