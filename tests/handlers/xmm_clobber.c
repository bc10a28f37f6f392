/*
 * xmm_clobber.c - a handler on jump_asm.S's regcheck_site that overwrites xmm3, to show which
 * hits save the vector registers around their handlers (regcheck_call reports the change).
 *
 * Parameters: novec=1 declares the probe UPROBE_NO_VECTORS (a promise this handler breaks on
 * purpose); mixed=1 also registers a second, plain probe at the same place, with a handler
 * that touches nothing: the point must then save the vectors for both.
 */
#include <string.h>

#include "uprobe.h"

static struct uprobe clobbering, plain;

static void on_hit(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	__asm__ volatile("pcmpeqd %%xmm3, %%xmm3" ::: "xmm3");
}

static void on_plain_hit(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
}

static int param_is(const char *name, const char *value)
{
	const char *v = uprobe_param(name);
	return v && strcmp(v, value) == 0;
}

int uprobe_init(void)
{
	clobbering.symbol_name = "regcheck_site";
	clobbering.handler = on_hit;
	if (param_is("novec", "1"))
		clobbering.flags = UPROBE_NO_VECTORS;
	int rc = register_uprobe(&clobbering);
	if (rc == 0 && param_is("mixed", "1")) {
		plain.symbol_name = "regcheck_site";
		plain.handler = on_plain_hit;
		rc = register_uprobe(&plain);
	}
	return rc;
}
