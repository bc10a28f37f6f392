/*
 * attach_end.c - ends the process while its uprobe_init runs, for the attach tests: sends the
 * process the signal --param signal=N names (the service fixture exits on SIGUSR1 and execs
 * on SIGUSR2), then waits, so that the end comes while the attach is still in progress.
 */
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "uprobe.h"

int uprobe_init(void)
{
	const char *sig = uprobe_param("signal");

	kill(getpid(), sig != NULL ? atoi(sig) : SIGUSR1);
	sleep(5);
	return 0;
}
