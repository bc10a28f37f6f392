/*
 * attach_hits.c - counts the calls of tick() and sees work() being hit, for the attach tests.
 *
 * Prints "attached" when its probes are in place, "work is hit" at the first hit of work()
 * (hits arrive while the session runs), and at uprobe_exit "tick: N hits". With
 * --param tag=T every line starts with "T " (the handler of work() reads it when hit).
 */
#include <stddef.h>

#include "uprobe.h"

static unsigned long ticks, works;
static const char *tag = "";
static const char *space = "";

static void on_tick(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	__atomic_add_fetch(&ticks, 1, __ATOMIC_RELAXED);
}

/* Reads its tag again on the hit: a handler sees its session's parameters too. */
static void on_work(struct uprobe *u, struct pt_regs *regs)
{
	const char *now = uprobe_param("tag");

	(void)u;
	(void)regs;
	if (__atomic_add_fetch(&works, 1, __ATOMIC_RELAXED) == 1)
		uprobe_printf("%s%swork is hit\n", now != NULL ? now : "", space);
}

static struct uprobe tick_probe = { .symbol_name = "tick", .handler = on_tick };
static struct uprobe work_probe = { .symbol_name = "work", .handler = on_work };

int uprobe_init(void)
{
	int ret;

	if (uprobe_param("tag") != NULL) {
		tag = uprobe_param("tag");
		space = " ";
	}
	ret = register_uprobe(&tick_probe);
	if (ret != 0)
		return ret;
	ret = register_uprobe(&work_probe);
	if (ret != 0) {
		unregister_uprobe(&tick_probe);
		return ret;
	}
	uprobe_printf("%s%sattached\n", tag, space);
	return 0;
}

void uprobe_exit(void)
{
	unregister_uprobe(&work_probe);
	unregister_uprobe(&tick_probe);
	uprobe_printf("%s%stick: %lu hits\n", tag, space, __atomic_load_n(&ticks, __ATOMIC_RELAXED));
}
