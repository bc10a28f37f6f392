/*
 * errnos.c - every refusal of register_uprobe, printed as NAME=RESULT.
 * Param: func=SYMBOL, a function starting with `push %rbp; mov %rsp,%rbp` (so +2 is inside
 * the 3-byte mov).
 */
#include "uprobe.h"
#include <unistd.h>

int errnos_data = 1;

/* A breakpoint that is not the runtime's. Never called. */
__attribute__((naked, used)) void errnos_foreign_int3(void)
{
	__asm__("int3\n\tret");
}

static void nop_handler(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
}

static int try(const char *name, struct uprobe *u)
{
	int rc;

	u->handler = nop_handler;
	rc = register_uprobe(u);
	uprobe_printf("%s=%d\n", name, rc);
	return rc;
}

int uprobe_init(void)
{
	static struct uprobe ok, inside, unknown, unknown_module, other_pid, data, foreign, none;
	const char *func = uprobe_param("func");

	ok.symbol_name = func;
	try("ok", &ok);
	uprobe_printf("again=%d\n", register_uprobe(&ok));
	inside.symbol_name = func;
	inside.offset = 2;
	try("inside", &inside);
	unknown.symbol_name = "no_such_function";
	try("unknown", &unknown);
	unknown_module.symbol_name = "libnothere:main";
	try("unknown_module", &unknown_module);
	other_pid.symbol_name = func;
	other_pid.pid = getppid();
	try("other_pid", &other_pid);
	data.vaddr = (unsigned long)&errnos_data;
	try("data", &data);
	foreign.vaddr = (unsigned long)&errnos_foreign_int3;
	try("foreign", &foreign);
	try("none", &none);
	unregister_uprobe(&ok);
	unregister_uprobe(&inside); /* never registered: no effect */
	return 0;
}
