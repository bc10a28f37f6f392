/*
 * coverage.c - registers a probe on the entry of every function named in a file, in one
 * module; with uprobe-run --verbose, the runtime lists the strategy each one got.
 * Params: list=FILE (one symbol a line), module=NAME (e.g. libc.so.6).
 * Prints "coverage: N registered, M refused" at init; refusals print their own reasons.
 */
#include "uprobe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct uprobe *probes;
static char (*names)[128];
static int count;

static void nop(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
}

int uprobe_init(void)
{
	const char *list = uprobe_param("list"), *module = uprobe_param("module");
	FILE *f = list ? fopen(list, "r") : NULL;
	char line[100];
	int n = 0, refused = 0;

	if (!f || !module) {
		uprobe_printf("coverage: needs --param list=FILE --param module=NAME\n");
		return 1;
	}
	while (fgets(line, sizeof(line), f))
		n++;
	rewind(f);
	probes = calloc((size_t)n, sizeof(*probes));
	names = calloc((size_t)n, sizeof(*names));
	while (count < n && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		snprintf(names[count], sizeof(names[count]), "%s:%s", module, line);
		probes[count].symbol_name = names[count];
		probes[count].handler = nop;
		if (register_uprobe(&probes[count]) != 0)
			refused++;
		count++;
	}
	fclose(f);
	uprobe_printf("coverage: %d registered, %d refused\n", count - refused, refused);
	return 0;
}
