/*
 * malloc_reenter.c - reentrancy: a probe on libc's malloc whose handler calls libc, malloc
 * included, for the calls of the marked size (12345 bytes). The inner malloc hit must run no
 * handler (the runtime counts it as missed), and nothing recurses or deadlocks.
 * At exit: "malloc_reenter: marked=N inner=OK|BAD".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uprobe.h"

#define MARK 12345

static struct uprobe probe;
static unsigned long marked, bad;

static void on_malloc(struct uprobe *u, struct pt_regs *regs)
{
	char *p;

	(void)u;
	if (regs->rdi != MARK)
		return;
	marked++;
	p = malloc(64);
	if (p == NULL || snprintf(p, 64, "hit %lu", marked) <= 0 || strncmp(p, "hit ", 4) != 0)
		bad++;
	free(p);
	if (marked == 1)
		uprobe_printf("malloc_reenter: first marked call, handler's own malloc done\n");
}

int uprobe_init(void)
{
	probe.symbol_name = "libc.so.6:malloc";
	probe.handler = on_malloc;
	return register_uprobe(&probe);
}

void uprobe_exit(void)
{
	unregister_uprobe(&probe);
	uprobe_printf("malloc_reenter: marked=%lu inner=%s\n", marked, bad ? "BAD" : "OK");
}
