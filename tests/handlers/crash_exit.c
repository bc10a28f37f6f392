/*
 * crash_exit.c - probes `work` and crashes (a NULL store) in uprobe_exit, or in uprobe_init
 * with --param in=init.
 */
#include <string.h>

#include "uprobe.h"

static struct uprobe probe = { .symbol_name = "work" };

int uprobe_init(void)
{
	const char *in = uprobe_param("in");
	if (in && strcmp(in, "init") == 0)
		*(volatile int *)0 = 1;
	return register_uprobe(&probe);
}

void uprobe_exit(void)
{
	*(volatile int *)0 = 1;
}
