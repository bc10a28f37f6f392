/*
 * fault.c - a handler that faults: a probe on work whose handler reads address 0x10 at its
 * third hit. The runtime must name the probe, this library and the address, then let the
 * default action (death by SIGSEGV) follow.
 */
#include "uprobe.h"

static struct uprobe probe;
static unsigned long hits;
static volatile unsigned long bad_address = 0x10;

static void on_work(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	if (++hits == 3)
		hits += *(volatile unsigned long *)bad_address;
}

int uprobe_init(void)
{
	probe.symbol_name = "work";
	probe.handler = on_work;
	return register_uprobe(&probe);
}
