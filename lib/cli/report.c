// SPDX-License-Identifier: MIT
/* report.c - the CLI's verdict table and its JSON form. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

static const char *const vname[] = { "OK", "INFO", "SKIP", "WARN", "FAIL" };

void report_add(struct report *r, enum verdict v, const char *item,
		const char *fmt, ...)
{
	struct report_item *it;
	va_list ap;

	if (r->n == r->cap) {
		size_t cap = r->cap ? 2 * r->cap : 16;
		void *p = realloc(r->items, cap * sizeof(*r->items));

		if (!p)
			return;
		r->items = p;
		r->cap = cap;
	}
	it = &r->items[r->n++];
	snprintf(it->item, sizeof(it->item), "%s", item);
	it->v = v;
	va_start(ap, fmt);
	vsnprintf(it->detail, sizeof(it->detail), fmt, ap);
	va_end(ap);
}

void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", *s);
		else
			putchar(*s);
	}
	putchar('"');
}

int report_print(const struct report *r, bool json)
{
	int failed = 0;
	size_t i;

	for (i = 0; i < r->n; i++)
		failed |= r->items[i].v == V_FAIL;
	if (json) {
		printf("{\"verdict\": \"%s\", \"items\": [", failed ? "FAIL" :
		       "PASS");
		for (i = 0; i < r->n; i++) {
			printf("%s\n  {\"item\": ", i ? "," : "");
			json_str(r->items[i].item);
			printf(", \"verdict\": \"%s\", \"detail\": ",
			       vname[r->items[i].v]);
			json_str(r->items[i].detail);
			putchar('}');
		}
		printf("\n]}\n");
	} else {
		for (i = 0; i < r->n; i++)
			printf("%-4s  %-28s %s\n", vname[r->items[i].v],
			       r->items[i].item, r->items[i].detail);
		printf("verdict: %s\n", failed ? "FAIL" : "PASS");
	}
	return failed;
}

void report_free(struct report *r)
{
	free(r->items);
	memset(r, 0, sizeof(*r));
}
