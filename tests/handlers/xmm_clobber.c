/*
 * xmm_clobber.c - a handler on jump_asm.S's regcheck_site that overwrites xmm3, to show which
 * hits save the vector registers around their handlers (regcheck_call reports the change).
 *
 * Parameters: novec=1 declares the probe UPROBE_NO_VECTORS (a promise this handler breaks on
 * purpose); mixed=1 also registers a second probe at the same place, without the flag, whose
 * handler only counts (the runtime reads its code and finds no vector instruction: the point
 * still skips the save); mixed=fp registers one whose handler computes with a double instead
 * (the point must then save the vectors for both). ret=1 instead registers a return probe
 * whose return handler overwrites xmm3, ret=novec the same declared UPROBE_NO_VECTORS.
 */
#include <string.h>

#include "uprobe.h"

static struct uprobe clobbering, plain;
static struct uretprobe clobbering_return;

static void on_hit(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	__asm__ volatile("pcmpeqd %%xmm3, %%xmm3" ::: "xmm3");
}

static unsigned long plain_hits;
static volatile double fp_total;

static void on_plain_hit(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	plain_hits++;
}

static void on_fp_hit(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	fp_total = fp_total * 1.5 + 1.0;
}

static void on_return(struct uretprobe_instance *ri, struct pt_regs *regs)
{
	(void)ri;
	(void)regs;
	__asm__ volatile("pcmpeqd %%xmm3, %%xmm3" ::: "xmm3");
}

static int param_is(const char *name, const char *value)
{
	const char *v = uprobe_param(name);
	return v && strcmp(v, value) == 0;
}

int uprobe_init(void)
{
	if (uprobe_param("ret")) {
		clobbering_return.u.symbol_name = "regcheck_site";
		clobbering_return.handler = on_return;
		if (param_is("ret", "novec"))
			clobbering_return.u.flags = UPROBE_NO_VECTORS;
		return register_uretprobe(&clobbering_return);
	}
	clobbering.symbol_name = "regcheck_site";
	clobbering.handler = on_hit;
	if (param_is("novec", "1"))
		clobbering.flags = UPROBE_NO_VECTORS;
	int rc = register_uprobe(&clobbering);
	if (rc == 0 && uprobe_param("mixed")) {
		plain.symbol_name = "regcheck_site";
		plain.handler = param_is("mixed", "fp") ? on_fp_hit : on_plain_hit;
		rc = register_uprobe(&plain);
	}
	return rc;
}
