/*
 * slow_exit.c - a uprobe_exit that takes its time: it says "exit start", waits 300 ms and
 * says "exit end" (nanosleep and uprobe_printf are async-signal-safe). For a signal sent
 * while the report runs.
 */
#include <time.h>

#include "uprobe.h"

int uprobe_init(void)
{
	return 0;
}

void uprobe_exit(void)
{
	struct timespec wait = { 0, 300 * 1000 * 1000 };
	uprobe_printf("exit start\n");
	while (nanosleep(&wait, &wait) != 0)
		;
	uprobe_printf("exit end\n");
}
