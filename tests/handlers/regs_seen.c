/*
 * regs_seen.c - checks that a handler sees the registers jump_asm.S's regcheck_call loaded
 * (in pt_regs) at the entry and at the return of regcheck_site, then clobbers every
 * caller-saved general register and xmm0-15 and clears CF, as any handler may: the runtime
 * must give the program its own values back, on the entry path and through the return
 * trampoline.
 */
#include "uprobe.h"

static const unsigned long expected[15] = {
	0x1111111111111101, 0x2222222222222202, 0x3333333333333303, 0x4444444444444404,
	0x5555555555555505, 0x6666666666666606, 0x7777777777777707, 0x8888888888888808,
	0x9999999999999909, 0xaaaaaaaaaaaaaa0a, 0xbbbbbbbbbbbbbb0b, 0xcccccccccccccc0c,
	0xdddddddddddddd0d, 0xeeeeeeeeeeeeee0e, 0xffffffffffffff0f,
};

static struct uprobe probe;
static struct uretprobe ret_probe;
static int hits, returns, mismatches;

static void check(struct pt_regs *r, unsigned long rip)
{
	const unsigned long seen[15] = { r->rax, r->rbx, r->rcx, r->rdx, r->rsi, r->rdi, r->rbp, r->r8,
					 r->r9, r->r10, r->r11, r->r12, r->r13, r->r14, r->r15 };
	for (int i = 0; i < 15; i++)
		if (seen[i] != expected[i]) {
			mismatches++;
			uprobe_printf("regs_seen: register %d is %#lx\n", i, seen[i]);
		}
	if (!(r->eflags & 1) || r->rip != rip) {
		mismatches++;
		uprobe_printf("regs_seen: eflags %#lx rip %#lx, expected %#lx\n", r->eflags, r->rip, rip);
	}
}

/* Clobbers every caller-saved register and the carry flag, as any handler may. */
static void clobber(void)
{
	__asm__ volatile("xorl %%eax, %%eax\n\t"
			 "movq $-1, %%rcx\n\tmovq $-1, %%rdx\n\tmovq $-1, %%rsi\n\tmovq $-1, %%rdi\n\t"
			 "movq $-1, %%r8\n\tmovq $-1, %%r9\n\tmovq $-1, %%r10\n\tmovq $-1, %%r11\n\t"
			 "pcmpeqb %%xmm0, %%xmm0\n\tpxor %%xmm1, %%xmm1\n\tpcmpeqb %%xmm2, %%xmm2\n\t"
			 "pxor %%xmm3, %%xmm3\n\tpcmpeqb %%xmm4, %%xmm4\n\tpxor %%xmm5, %%xmm5\n\t"
			 "pcmpeqb %%xmm6, %%xmm6\n\tpxor %%xmm7, %%xmm7\n\tpcmpeqb %%xmm8, %%xmm8\n\t"
			 "pxor %%xmm9, %%xmm9\n\tpcmpeqb %%xmm10, %%xmm10\n\tpxor %%xmm11, %%xmm11\n\t"
			 "pcmpeqb %%xmm12, %%xmm12\n\tpxor %%xmm13, %%xmm13\n\tpcmpeqb %%xmm14, %%xmm14\n\t"
			 "pxor %%xmm15, %%xmm15\n\tclc"
			 :
			 :
			 : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "xmm0", "xmm1", "xmm2",
			   "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
			   "xmm13", "xmm14", "xmm15", "cc");
}

static void on_hit(struct uprobe *u, struct pt_regs *r)
{
	hits++;
	check(r, u->vaddr);
	clobber();
}

static void on_return(struct uretprobe_instance *ri, struct pt_regs *r)
{
	returns++;
	check(r, ri->ret_addr);
	clobber();
}

int uprobe_init(void)
{
	int rc;

	probe.symbol_name = "regcheck_site";
	probe.handler = on_hit;
	ret_probe.u.symbol_name = "regcheck_site";
	ret_probe.handler = on_return;
	rc = register_uprobe(&probe);
	return rc ? rc : register_uretprobe(&ret_probe);
}

void uprobe_exit(void)
{
	uprobe_printf("regs_seen: %d hits, %d returns, %d mismatches\n", hits, returns, mismatches);
}
