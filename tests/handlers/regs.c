/*
 * regs.c - a handler that changes registers: fault injection and return-value override.
 * Params: entry=SPEC (the function), ret=SPEC (its ret instruction).
 *   call 1: at entry, return 7 at once (rax = 7, rip = return address, rsp += 8): the
 *           function body is skipped;
 *   call 2: at entry, the first argument becomes 100;
 *   call 3: at the ret, the return value becomes 1000.
 */
#include "uprobe.h"

static struct uprobe entry, ret;
static int entry_hits, ret_hits;

static void on_entry(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	entry_hits++;
	if (entry_hits == 1) {
		regs->rax = 7;
		regs->rip = *(unsigned long *)regs->rsp;
		regs->rsp += 8;
	} else if (entry_hits == 2) {
		regs->rdi = 100;
	}
}

static void on_ret(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	ret_hits++;
	if (ret_hits == 2)
		regs->rax = 1000;
}

int uprobe_init(void)
{
	int rc;

	entry.vaddr = uprobe_lookup(uprobe_param("entry"));
	entry.handler = on_entry;
	ret.vaddr = uprobe_lookup(uprobe_param("ret"));
	ret.handler = on_ret;
	rc = register_uprobe(&entry);
	if (rc == 0)
		rc = register_uprobe(&ret);
	return rc;
}

void uprobe_exit(void)
{
	uprobe_printf("regs: entry hits %d, ret hits %d\n", entry_hits, ret_hits);
}
