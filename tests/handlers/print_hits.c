/*
 * print_hits.c - prints one line on every hit of tick(), for the test that stops uprobe-run
 * while a handler prints: "tick hit N" (N counts from 1). At uprobe_exit: "print_hits: N hits".
 */
#include "uprobe.h"

static unsigned long hits;

static void on_tick(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	uprobe_printf("tick hit %lu\n", __atomic_add_fetch(&hits, 1, __ATOMIC_RELAXED));
}

static struct uprobe tick_probe = { .symbol_name = "tick", .handler = on_tick };

int uprobe_init(void)
{
	return register_uprobe(&tick_probe);
}

void uprobe_exit(void)
{
	unregister_uprobe(&tick_probe);
	uprobe_printf("print_hits: %lu hits\n", hits);
}
