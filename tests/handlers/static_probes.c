/*
 * static_probes.c - registers a probe on the entry of every function named in a file (one
 * symbol a line), in one module, and removes them all at uprobe_exit; everything it uses is
 * static or freed, so what a process keeps after a session of it is the runtime's alone.
 * Params: list=FILE, module=NAME (e.g. libc.so.6). Prints "static_probes: N registered".
 */
#include "uprobe.h"

#include <stdio.h>
#include <string.h>

#define MAX 4096

static struct uprobe probes[MAX], *all[MAX];
static char names[MAX][128];
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

	if (!f || !module) {
		uprobe_printf("static_probes: needs --param list=FILE --param module=NAME\n");
		return 1;
	}
	while (count < MAX && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		snprintf(names[count], sizeof(names[count]), "%s:%s", module, line);
		probes[count].symbol_name = names[count];
		probes[count].handler = nop;
		if (register_uprobe(&probes[count]) == 0) {
			all[count] = &probes[count];
			count++;
		}
	}
	fclose(f);
	uprobe_printf("static_probes: %d registered\n", count);
	return 0;
}

void uprobe_exit(void)
{
	unregister_uprobes(all, count);
}
