/*
 * uprobe_example.c - the classic uprobe example, as a handler library for uprobe-run.
 *
 * Places a uprobe at the given address of the probed program and counts how often it is hit;
 * at exit it reports the total. Usage, with the fixture program built non-PIE (so the address
 * `nm` prints is the run-time address):
 *
 *   $ gcc -O0 -g -no-pie -o myprog tests/fixtures/myprog.c
 *   $ nm myprog | grep myfunc
 *   0000000000401136 T myfunc
 *   $ uprobe-run --handlers target/release/uprobe_example.so \
 *         --param vaddr=0x401136 ./myprog
 *
 * or, as with insmod on a program already running, attached to it and detached with Ctrl-C:
 *
 *   $ ./myprog &
 *   $ uprobe-run --pid $! --handlers target/release/uprobe_example.so \
 *         --param vaddr=0x401136 --param pid=$!
 *
 * Parameters:
 *   vaddr=ADDRESS  run-time address of the probed instruction. Hexadecimal with a 0x prefix,
 *                  or as nm prints it (zero-padded or containing a-f digits); a plain number
 *                  without leading zero and without a-f is decimal.
 *   symbol=NAME    probe NAME ("sym" or "module:sym") instead of an address.
 *   pid=PID        the probed process (struct uprobe.pid): 0 or its own pid; default: its own.
 *   verbose=N      0: only the total at the end; nonzero (the default): report every hit.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "uprobe.h"

static struct uprobe usp;
static int nhits;
static int verbose = 1;
static int registered;

/* Signal context: async-signal-safe calls only. */
static void uprobe_handler(struct uprobe *u, struct pt_regs *regs)
{
	int hit = __atomic_add_fetch(&nhits, 1, __ATOMIC_RELAXED);

	(void)regs;
	if (verbose)
		uprobe_printf("Hit #%d on probepoint at %#lx\n", hit, u->vaddr);
}

/* Parses ADDRESS as documented above; returns 0 on success. */
static int parse_address(const char *s, unsigned long *out)
{
	const char *digits = s;
	char *end;
	int base = 10;

	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		digits = s + 2;
		base = 16;
	} else if (s[0] == '0' || strpbrk(s, "abcdefABCDEF") != NULL) {
		base = 16;
	}
	if (*digits == '\0' || *digits == '-' || *digits == '+')
		return -1;
	*out = strtoul(digits, &end, base);
	return *end == '\0' ? 0 : -1;
}

int uprobe_init(void)
{
	const char *vaddr_param = uprobe_param("vaddr");
	const char *symbol = uprobe_param("symbol");
	const char *verbose_param = uprobe_param("verbose");
	const char *pid_param = uprobe_param("pid");
	int ret;

	if (verbose_param != NULL)
		verbose = atoi(verbose_param) != 0;

	usp.pid = pid_param != NULL ? atoi(pid_param) : getpid();
	usp.handler = uprobe_handler;

	if (symbol != NULL && *symbol != '\0') {
		if (vaddr_param != NULL) {
			uprobe_printf("uprobe_example: give either --param vaddr or --param symbol, not both\n");
			return 1;
		}
		usp.symbol_name = symbol;
		uprobe_printf("Registering uprobe on pid %d, symbol %s\n", usp.pid, symbol);
	} else {
		if (vaddr_param == NULL) {
			uprobe_printf("uprobe_example: missing --param vaddr=ADDRESS\n");
			return 1;
		}
		if (parse_address(vaddr_param, &usp.vaddr) != 0) {
			uprobe_printf("uprobe_example: bad address in --param vaddr=%s\n", vaddr_param);
			return 1;
		}
		uprobe_printf("Registering uprobe on pid %d, vaddr %#lx\n", usp.pid, usp.vaddr);
	}

	ret = register_uprobe(&usp);
	if (ret != 0) {
		uprobe_printf("register_uprobe() failed, returned %d\n", ret);
		return ret;
	}
	registered = 1;
	return 0;
}

void uprobe_exit(void)
{
	if (!registered)
		return;
	unregister_uprobe(&usp);
	registered = 0;
	uprobe_printf("Probepoint was hit %d times\n", __atomic_load_n(&nhits, __ATOMIC_RELAXED));
}
