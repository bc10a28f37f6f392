/*
 * soak.c - an entry probe and a return probe on every function named in a file, in one
 * module: the libc-wide soak. Registrations the runtime refuses are counted, not fatal; names
 * that resolve to an address already probed (aliases) are skipped.
 * Params: list=FILE (one symbol a line), module=NAME (e.g. libc.so.6).
 * At exit, one line per probed function with any call, and a summary:
 *   soak[PID]: NAME addr=0xADDR calls=C returns=R nmissed=M ret=0|1
 *   soak[PID]: registered=N refused=F
 * calls counts every entry hit; returns the return handler; ret says whether the return
 * probe was placed.
 */
#include "uprobe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fn {
	struct uprobe up;
	struct uretprobe rp;
	char spec[128];
	unsigned long addr, calls, returns;
	int has_ret;
};

static struct fn *fns;
static int count, refused;

static void on_call(struct uprobe *u, struct pt_regs *regs)
{
	(void)regs;
	struct fn *f = (struct fn *)((char *)u - __builtin_offsetof(struct fn, up));
	__atomic_fetch_add(&f->calls, 1, __ATOMIC_RELAXED);
}

static void on_return(struct uretprobe_instance *ri, struct pt_regs *regs)
{
	(void)regs;
	struct fn *f = (struct fn *)((char *)ri->rp - __builtin_offsetof(struct fn, rp));
	__atomic_fetch_add(&f->returns, 1, __ATOMIC_RELAXED);
}

static int seen(unsigned long addr)
{
	for (int i = 0; i < count; i++)
		if (fns[i].addr == addr)
			return 1;
	return 0;
}

int uprobe_init(void)
{
	const char *list = uprobe_param("list"), *module = uprobe_param("module");
	FILE *f = list ? fopen(list, "r") : NULL;
	char line[100];
	int n = 0;

	if (!f || !module) {
		uprobe_printf("soak: needs --param list=FILE --param module=NAME\n");
		return 1;
	}
	while (fgets(line, sizeof(line), f))
		n++;
	rewind(f);
	fns = calloc((size_t)n, sizeof(*fns));
	while (fgets(line, sizeof(line), f)) {
		struct fn *p = &fns[count];
		line[strcspn(line, "\n")] = 0;
		snprintf(p->spec, sizeof(p->spec), "%s:%s", module, line);
		unsigned long addr = uprobe_lookup(p->spec);
		if (!addr || seen(addr))
			continue;
		p->addr = addr;
		p->up.symbol_name = p->spec;
		p->up.handler = on_call;
		if (register_uprobe(&p->up) != 0) {
			refused++;
			continue;
		}
		p->rp.u.symbol_name = p->spec;
		p->rp.handler = on_return;
		p->has_ret = register_uretprobe(&p->rp) == 0;
		if (!p->has_ret)
			refused++;
		count++;
	}
	fclose(f);
	return 0;
}

void uprobe_exit(void)
{
	int pid = getpid();
	for (int i = 0; i < count; i++) {
		struct fn *p = &fns[i];
		if (p->calls || p->returns)
			uprobe_printf("soak[%d]: %s addr=%#lx calls=%lu returns=%lu nmissed=%lu ret=%d\n", pid, p->spec, p->addr,
				      p->calls, p->returns, p->rp.nmissed, p->has_ret);
	}
	uprobe_printf("soak[%d]: registered=%d refused=%d\n", pid, count, refused);
}
