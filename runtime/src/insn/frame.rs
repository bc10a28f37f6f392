//! The register frame of the trap-free paths: assembly that builds a `struct pt_regs` on the
//! stack (its address left in %rbx, which calls preserve), saves the vector registers below
//! it, and the way back. The jump probes' common entry and the return trampoline (in
//! `probe::dispatch` and `probe::retprobe`) are made of it, so one definition serves both.
//! The invoking `global_asm!` names `vector_area` and `vector_mask` (see [`crate::insn::vector`]).

/// Assembly shared by the jump stubs' common code and the return trampoline: a
/// `struct pt_regs` built on the stack (its address left in %rbx, which the call preserves),
/// the vector registers saved below it, and the way back. The invoking `global_asm!` names
/// `vector_area`: 0 to save xmm0-15 with plain moves (what a handler built for x86-64 may
/// change), or the size of an XSAVE area for the whole vector state (`--full-vector-state`).
/// The flags come back without popfq, which costs more than the rest of the restore: OF by an
/// addition that overflows exactly when it was set, then the others with sahf (DF is clear at
/// function entries and returns, as the ABI has it).
macro_rules! save_pt_regs {
    () => {
        concat!(
            "push 0\n", // ss
            "push 0\n", // rsp
            "pushfq\n",
            "push 0\n",  // cs
            "push 0\n",  // rip
            "push -1\n", // orig_rax
            "push rdi\n push rsi\n push rdx\n push rcx\n push rax\n",
            "push r8\n push r9\n push r10\n push r11\n",
            "push rbx\n push rbp\n push r12\n push r13\n push r14\n push r15\n",
            "mov rbx, rsp\n",
            "mov rax, qword ptr [rip + {vector_area}]\n",
            "test rax, rax\n jnz 71f\n",
            "sub rsp, 256\n and rsp, -16\n",
            "movaps [rsp], xmm0\n movaps [rsp + 16], xmm1\n movaps [rsp + 32], xmm2\n",
            "movaps [rsp + 48], xmm3\n movaps [rsp + 64], xmm4\n movaps [rsp + 80], xmm5\n",
            "movaps [rsp + 96], xmm6\n movaps [rsp + 112], xmm7\n movaps [rsp + 128], xmm8\n",
            "movaps [rsp + 144], xmm9\n movaps [rsp + 160], xmm10\n movaps [rsp + 176], xmm11\n",
            "movaps [rsp + 192], xmm12\n movaps [rsp + 208], xmm13\n movaps [rsp + 224], xmm14\n",
            "movaps [rsp + 240], xmm15\n",
            "jmp 72f\n",
            "71:\n",
            "sub rsp, rax\n and rsp, -64\n",
            // XRSTOR wants the header's reserved bytes zero; XSAVE does not write them all.
            "xor eax, eax\n",
            "mov [rsp + 512], rax\n mov [rsp + 520], rax\n mov [rsp + 528], rax\n mov [rsp + 536], rax\n",
            "mov [rsp + 544], rax\n mov [rsp + 552], rax\n mov [rsp + 560], rax\n mov [rsp + 568], rax\n",
            "mov eax, dword ptr [rip + {vector_mask}]\n mov edx, dword ptr [rip + {vector_mask} + 4]\n",
            "xsave64 [rsp]\n",
            "72:\n",
            "cld\n",
        )
    };
}

/// The way back from [`save_pt_regs`], leaving %rsp where it was before the first push.
macro_rules! restore_pt_regs {
    () => {
        concat!(
            "cmp qword ptr [rip + {vector_area}], 0\n jnz 73f\n",
            "movaps xmm0, [rsp]\n movaps xmm1, [rsp + 16]\n movaps xmm2, [rsp + 32]\n",
            "movaps xmm3, [rsp + 48]\n movaps xmm4, [rsp + 64]\n movaps xmm5, [rsp + 80]\n",
            "movaps xmm6, [rsp + 96]\n movaps xmm7, [rsp + 112]\n movaps xmm8, [rsp + 128]\n",
            "movaps xmm9, [rsp + 144]\n movaps xmm10, [rsp + 160]\n movaps xmm11, [rsp + 176]\n",
            "movaps xmm12, [rsp + 192]\n movaps xmm13, [rsp + 208]\n movaps xmm14, [rsp + 224]\n",
            "movaps xmm15, [rsp + 240]\n",
            "jmp 74f\n",
            "73:\n",
            "mov eax, dword ptr [rip + {vector_mask}]\n mov edx, dword ptr [rip + {vector_mask} + 4]\n",
            "xrstor64 [rsp]\n",
            "74:\n",
            "mov rsp, rbx\n",
            "pop r15\n pop r14\n pop r13\n pop r12\n pop rbp\n pop rbx\n",
            "pop r11\n pop r10\n pop r9\n pop r8\n",
            "mov al, byte ptr [rsp + 65]\n", // OF is bit 3 of the flags' second byte
            "and al, 8\n shl al, 4\n add al, 0x80\n",
            "mov ah, byte ptr [rsp + 64]\n sahf\n",
            "pop rax\n pop rcx\n pop rdx\n pop rsi\n pop rdi\n",
            "lea rsp, [rsp + 48]\n", // orig_rax, rip, cs, eflags, rsp, ss; lea keeps the flags
        )
    };
}

pub(crate) use restore_pt_regs;
pub(crate) use save_pt_regs;
