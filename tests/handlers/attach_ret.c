/*
 * attach_ret.c - a return probe on sleepy(), for detaching while a thread is inside it.
 *
 * Prints "attached" once registered, "sleepy entered with X" at each entry and "sleepy returns
 * V" at each return it sees; at uprobe_exit "sleepy: N entries, M returns".
 */
#include "uprobe.h"

static unsigned long entries, returns;

static int on_entry(struct uretprobe_instance *ri, struct pt_regs *regs)
{
	(void)ri;
	__atomic_add_fetch(&entries, 1, __ATOMIC_RELAXED);
	uprobe_printf("sleepy entered with %ld\n", (long)regs->rdi);
	return 0;
}

static void on_return(struct uretprobe_instance *ri, struct pt_regs *regs)
{
	(void)ri;
	__atomic_add_fetch(&returns, 1, __ATOMIC_RELAXED);
	uprobe_printf("sleepy returns %ld\n", (long)regs_return_value(regs));
}

static struct uretprobe probe = {
	.u = { .symbol_name = "sleepy" },
	.handler = on_return,
	.entry_handler = on_entry,
};

int uprobe_init(void)
{
	int ret = register_uretprobe(&probe);

	if (ret == 0)
		uprobe_printf("attached\n");
	return ret;
}

void uprobe_exit(void)
{
	unregister_uretprobe(&probe);
	uprobe_printf("sleepy: %lu entries, %lu returns\n", entries, returns);
}
