/*
 * uretprobe_example.c - the classic return-probe example, in-process.
 *
 * Probes the entry and the return of one function, printing each call and each return
 * value, and the totals at exit:
 *
 *   uprobe-run --handlers uretprobe_example.so --param func=myfunc ./myprog
 *   Function at 0x401126 called
 *   Function at 0x401126 returns 0x1
 *   ...
 *   5 calls, 5 returns
 *
 * Parameters: func (required): the function, "sym", "module:sym" or "0xADDRESS".
 * Handlers run in signal context (the entry) or on the return path: only
 * async-signal-safe calls, so output goes through uprobe_printf.
 */
#include "uprobe.h"

#include <stdlib.h>

static struct uretprobe rp;
static unsigned long calls, returns;
static unsigned long func_addr;

static int entry_handler(struct uretprobe_instance *ri, struct pt_regs *regs)
{
	(void)ri;
	__atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
	uprobe_printf("Function at %#lx called\n", regs->rip);
	return 0;
}

static void ret_handler(struct uretprobe_instance *ri, struct pt_regs *regs)
{
	(void)ri;
	__atomic_fetch_add(&returns, 1, __ATOMIC_RELAXED);
	uprobe_printf("Function at %#lx returns %#lx\n", func_addr, regs_return_value(regs));
}

int uprobe_init(void)
{
	const char *func = uprobe_param("func");
	int ret;

	if (func == NULL) {
		uprobe_printf("uretprobe_example: missing --param func=FUNCTION\n");
		return 1;
	}
	func_addr = uprobe_lookup(func);
	if (func[0] == '0' && (func[1] == 'x' || func[1] == 'X'))
		rp.u.vaddr = strtoul(func, NULL, 16);
	else
		rp.u.symbol_name = func;
	rp.handler = ret_handler;
	rp.entry_handler = entry_handler;
	ret = register_uretprobe(&rp);
	if (ret < 0) {
		uprobe_printf("register_uretprobe() failed, returned %d\n", ret);
		return ret;
	}
	return 0;
}

void uprobe_exit(void)
{
	unregister_uretprobe(&rp);
	uprobe_printf("%lu calls, %lu returns\n", calls, returns);
	if (rp.nmissed)
		uprobe_printf("Missed probing %lu instances of %#lx\n", rp.nmissed, func_addr);
}
