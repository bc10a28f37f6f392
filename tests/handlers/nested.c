/*
 * nested.c - a handler that calls the probed function itself. The inner hit runs no handler
 * (it is counted as missed by the runtime), and the call still computes the right value.
 */
#include "uprobe.h"

static struct uprobe probe;
static unsigned long hits, wrong;
static long (*work)(int);

static void on_work(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	__atomic_fetch_add(&hits, 1, __ATOMIC_RELAXED);
	if (work((int)regs->rdi) != (long)(int)regs->rdi * 3 + 1)
		__atomic_fetch_add(&wrong, 1, __ATOMIC_RELAXED);
}

int uprobe_init(void)
{
	work = (long (*)(int))uprobe_lookup("work");
	probe.symbol_name = "work";
	probe.handler = on_work;
	return register_uprobe(&probe);
}

void uprobe_exit(void)
{
	uprobe_printf("nested: hits=%lu wrong=%lu\n", hits, wrong);
}
