/*
 * ret.c - return probes for the tests.
 * Params:
 *   funcs=F1,F2,...   functions to return-probe (required)
 *   maxactive=N       maxactive of every return probe
 *   entry=1           also a plain uprobe on each function (both must fire)
 *   twice=1           a second return probe on each function (each fires once per return)
 *   override=V        the return handler of the first function makes it return V
 *   trace=1           one line per return: "ret F arg=A ret=R" (A saved by the entry handler)
 * At exit, per function: "ret: F calls=C returns=R nmissed=M" (+ entries=, returns2=).
 */
#include "uprobe.h"

#include <stdlib.h>
#include <string.h>

#define MAX_FUNCS 8

struct probe {
	struct uretprobe rp, rp2;
	struct uprobe up;
	char name[64];
	unsigned long calls, returns, returns2, entries, bad_data;
};

static struct probe probes[MAX_FUNCS];
static int nprobes, trace, twice, entry;
static long override_value;
static int override;

static struct probe *of(struct uretprobe_instance *ri)
{
	for (int i = 0; i < nprobes; i++)
		if (ri->rp == &probes[i].rp || ri->rp == &probes[i].rp2)
			return &probes[i];
	return NULL;
}

static int on_entry(struct uretprobe_instance *ri, struct pt_regs *regs)
{
	struct probe *p = of(ri);

	__atomic_fetch_add(&p->calls, 1, __ATOMIC_RELAXED);
	memcpy(ri->data, &regs->rdi, sizeof(regs->rdi));
	return 0;
}

static void on_return(struct uretprobe_instance *ri, struct pt_regs *regs)
{
	struct probe *p = of(ri);
	unsigned long arg;

	memcpy(&arg, ri->data, sizeof(arg));
	__atomic_fetch_add(&p->returns, 1, __ATOMIC_RELAXED);
	if (regs->rip != ri->ret_addr)
		__atomic_fetch_add(&p->bad_data, 1, __ATOMIC_RELAXED);
	if (trace)
		uprobe_printf("ret %s arg=%ld ret=%ld\n", p->name, (long)arg, (long)regs->rax);
	if (override && p == &probes[0])
		regs->rax = override_value;
}

static void on_return2(struct uretprobe_instance *ri, struct pt_regs *regs)
{
	(void)regs;
	__atomic_fetch_add(&of(ri)->returns2, 1, __ATOMIC_RELAXED);
}

static void on_hit(struct uprobe *u, struct pt_regs *regs)
{
	(void)regs;
	for (int i = 0; i < nprobes; i++)
		if (u == &probes[i].up)
			__atomic_fetch_add(&probes[i].entries, 1, __ATOMIC_RELAXED);
}

static int param_int(const char *name)
{
	const char *v = uprobe_param(name);
	return v ? atoi(v) : 0;
}

int uprobe_init(void)
{
	const char *funcs = uprobe_param("funcs");
	int maxactive = param_int("maxactive");

	trace = param_int("trace");
	twice = param_int("twice");
	entry = param_int("entry");
	if (uprobe_param("override")) {
		override = 1;
		override_value = atol(uprobe_param("override"));
	}
	while (funcs && *funcs && nprobes < MAX_FUNCS) {
		struct probe *p = &probes[nprobes++];
		size_t n = strcspn(funcs, ",");
		int rc;

		memcpy(p->name, funcs, n < 63 ? n : 63);
		funcs += n + (funcs[n] == ',');
		p->rp.u.symbol_name = p->name;
		p->rp.entry_handler = on_entry;
		p->rp.handler = on_return;
		p->rp.data_size = sizeof(unsigned long);
		p->rp.maxactive = maxactive;
		rc = register_uretprobe(&p->rp);
		if (rc == 0 && twice) {
			p->rp2.u.symbol_name = p->name;
			p->rp2.handler = on_return2;
			p->rp2.maxactive = maxactive;
			rc = register_uretprobe(&p->rp2);
		}
		if (rc == 0 && entry) {
			p->up.symbol_name = p->name;
			p->up.handler = on_hit;
			rc = register_uprobe(&p->up);
		}
		if (rc != 0) {
			uprobe_printf("ret: cannot probe %s: %d\n", p->name, rc);
			return rc;
		}
	}
	return 0;
}

void uprobe_exit(void)
{
	for (int i = 0; i < nprobes; i++) {
		struct probe *p = &probes[i];

		unregister_uretprobe(&p->rp);
		unregister_uretprobe(&p->rp2);
		unregister_uprobe(&p->up);
		uprobe_printf("ret: %s calls=%lu returns=%lu nmissed=%lu", p->name, p->calls, p->returns, p->rp.nmissed);
		if (entry)
			uprobe_printf(" entries=%lu", p->entries);
		if (twice)
			uprobe_printf(" returns2=%lu", p->returns2);
		if (p->bad_data)
			uprobe_printf(" wrong_rip=%lu", p->bad_data);
		uprobe_printf("\n");
	}
}
