/*
 * mdwe.c - W^X: makes the process refuse writable code (prctl PR_SET_MDWE with
 * PR_MDWE_REFUSE_EXEC_GAIN) in its uprobe_init, then registers a probe on `func`.
 * Prints "mdwe: unsupported" when the kernel lacks PR_SET_MDWE, else
 * "mdwe: register_uprobe=RC", and returns RC.
 */
#include <errno.h>
#include <sys/prctl.h>

#include "uprobe.h"

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif

static struct uprobe probe;

int uprobe_init(void)
{
	int rc;

	if (prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0L, 0L, 0L) != 0) {
		uprobe_printf("mdwe: unsupported (errno %d)\n", errno);
		return 0;
	}
	probe.symbol_name = uprobe_param("func");
	rc = register_uprobe(&probe);
	uprobe_printf("mdwe: register_uprobe=%d\n", rc);
	return rc;
}
