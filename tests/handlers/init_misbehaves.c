/*
 * init_misbehaves.c - a handler library whose uprobe_init registers a probe on work() and
 * then, by --param how=: faults (segv: a write through a null pointer), aborts (abort), or
 * never returns (hang: sleeps in a loop). For the test that an attached process survives it.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "uprobe.h"

static unsigned long works;

static void on_work(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	__atomic_add_fetch(&works, 1, __ATOMIC_RELAXED);
}

static struct uprobe work_probe = { .symbol_name = "work", .handler = on_work };

int uprobe_init(void)
{
	const char *how = uprobe_param("how");
	int ret = register_uprobe(&work_probe);

	if (ret != 0 || how == NULL)
		return ret;
	if (strcmp(how, "segv") == 0)
		*(volatile int *)(long)works = 1;
	if (strcmp(how, "abort") == 0)
		abort();
	if (strcmp(how, "hang") == 0)
		for (;;)
			sleep(1);
	return 0;
}

void uprobe_exit(void)
{
	unregister_uprobe(&work_probe);
}
