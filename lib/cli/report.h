/* SPDX-License-Identifier: MIT */
/*
 * report.h - the CLI's verdict table: items added one by one, printed as
 * an aligned table or as JSON at the end.
 */
#ifndef KVDMABUF_CLI_REPORT_H
#define KVDMABUF_CLI_REPORT_H

#include <stdbool.h>
#include <stddef.h>

enum verdict { V_OK, V_INFO, V_SKIP, V_WARN, V_FAIL };

struct report {
	struct report_item {
		char item[48];
		enum verdict v;
		char detail[256];
	} *items;
	size_t n, cap;
};

void report_add(struct report *r, enum verdict v, const char *item,
		const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Prints the table (or JSON); returns 1 when any item FAILed, else 0. */
int report_print(const struct report *r, bool json);
void report_free(struct report *r);
/* @s as a JSON string, quoted and escaped, on stdout. */
void json_str(const char *s);

int cmd_check(bool json);
int cmd_status(bool json, bool only_preload);
int cmd_selftest(bool list_only, bool vm_suite);
/* cdi.c: the CDI spec of /dev/kvdmabuf on stdout; @group's id added. */
int cmd_cdi(const char *group);
/* preload.c: live processes under libkvdmabuf-preload.so; how many. */
int preload_status(bool json);

#endif
