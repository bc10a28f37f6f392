/*
 * self_reg.c - registering and unregistering from inside a handler.
 * A probe on tick() registers a probe on other() at its 3rd hit, tries the same object again
 * at its 4th (-EEXIST through the callback), and unregisters itself at its 10th.
 */
#include "uprobe.h"

static struct uprobe tick_probe, other_probe;
static int tick_hits, other_hits;

static void on_callback(struct uprobe *u, int reg, enum uprobe_type type, int result)
{
	uprobe_printf("callback: %s reg=%d type=%d result=%d\n", u == &tick_probe ? "tick" : "other", reg,
		      (int)type, result);
}

static void on_other(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	other_hits++;
}

static void on_tick(struct uprobe *u, struct pt_regs *regs)
{
	(void)regs;
	tick_hits++;
	if (tick_hits == 3 || tick_hits == 4)
		uprobe_printf("tick hit %d: register_uprobe(other) = %d\n", tick_hits, register_uprobe(&other_probe));
	if (tick_hits == 10) {
		unregister_uprobe(u);
		uprobe_printf("tick hit %d: unregister_uprobe(tick) queued\n", tick_hits);
	}
}

int uprobe_init(void)
{
	tick_probe.symbol_name = "tick";
	tick_probe.handler = on_tick;
	tick_probe.registration_callback = on_callback;
	other_probe.symbol_name = "other";
	other_probe.handler = on_other;
	other_probe.registration_callback = on_callback;
	return register_uprobe(&tick_probe);
}

void uprobe_exit(void)
{
	unregister_uprobe(&other_probe);
	uprobe_printf("exit: tick=%d other=%d\n", tick_hits, other_hits);
}
