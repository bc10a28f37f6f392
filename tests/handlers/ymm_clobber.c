/*
 * ymm_clobber.c - a handler that does what glibc's AVX2 string functions may do inside any
 * handler: it writes all 256 bits of ymm0-15 (the probe is on jump_asm.S's regcheck_site,
 * and ymmcheck_call checks the registers afterwards). Use only on AVX2 machines.
 */
#include "uprobe.h"

static struct uprobe probe;

static void on_hit(struct uprobe *u, struct pt_regs *regs)
{
	(void)u;
	(void)regs;
	__asm__ volatile("vpcmpeqb %%ymm0, %%ymm0, %%ymm0\n\t"
			 "vmovdqa %%ymm0, %%ymm1\n\tvmovdqa %%ymm0, %%ymm2\n\tvmovdqa %%ymm0, %%ymm3\n\t"
			 "vmovdqa %%ymm0, %%ymm4\n\tvmovdqa %%ymm0, %%ymm5\n\tvmovdqa %%ymm0, %%ymm6\n\t"
			 "vmovdqa %%ymm0, %%ymm7\n\tvmovdqa %%ymm0, %%ymm8\n\tvmovdqa %%ymm0, %%ymm9\n\t"
			 "vmovdqa %%ymm0, %%ymm10\n\tvmovdqa %%ymm0, %%ymm11\n\tvmovdqa %%ymm0, %%ymm12\n\t"
			 "vmovdqa %%ymm0, %%ymm13\n\tvmovdqa %%ymm0, %%ymm14\n\tvmovdqa %%ymm0, %%ymm15"
			 :
			 :
			 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
			   "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

int uprobe_init(void)
{
	probe.symbol_name = "regcheck_site";
	probe.handler = on_hit;
	return register_uprobe(&probe);
}
