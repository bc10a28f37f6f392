/*
 * calls_counted.c - a handler on outer() that calls the program's counted() once per hit:
 * those calls come from inside a handler, so they run no handler and count nowhere, whether
 * the count is made by the handler or in the probe's stub.
 */
#include "uprobe.h"

static struct uprobe probe;
static unsigned long hits;
static void (*counted)(long);

static void on_outer(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	hits++;
	counted((long)regs->rdi);
}

int uprobe_init(void)
{
	counted = (void (*)(long))uprobe_lookup("counted");
	probe.symbol_name = "outer";
	probe.handler = on_outer;
	return counted ? register_uprobe(&probe) : -1;
}

void uprobe_exit(void)
{
	uprobe_printf("calls_counted: hits=%lu\n", hits);
}
