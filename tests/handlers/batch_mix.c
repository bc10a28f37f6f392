/*
 * batch_mix.c - one uprobe_init registering good and bad probes together (one placement
 * batch): the good ones must be placed and counted, each bad one refused with its own errno.
 * Param: func=SYMBOL, a function starting with `push %rbp; mov %rsp,%rbp` (+2 is inside).
 * Prints "NAME=RESULT" per registration at init and "hits NAME=N" per good probe at exit.
 */
#include "uprobe.h"

static unsigned long hits_func, hits_main;

static void on_func(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	hits_func++;
}

static void on_main(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	hits_main++;
}

static struct uprobe func, inside, main_probe, unknown;

int uprobe_init(void)
{
	const char *name = uprobe_param("func");

	func.symbol_name = name;
	func.handler = on_func;
	inside.symbol_name = name;
	inside.offset = 2;
	inside.handler = on_func;
	main_probe.symbol_name = "main";
	main_probe.handler = on_main;
	unknown.symbol_name = "no_such_function";
	unknown.handler = on_func;
	uprobe_printf("func=%d\n", register_uprobe(&func));
	uprobe_printf("inside=%d\n", register_uprobe(&inside));
	uprobe_printf("main=%d\n", register_uprobe(&main_probe));
	uprobe_printf("unknown=%d\n", register_uprobe(&unknown));
	return 0;
}

void uprobe_exit(void)
{
	uprobe_printf("hits func=%lu\n", hits_func);
	uprobe_printf("hits main=%lu\n", hits_main);
}
