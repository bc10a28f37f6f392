//! How much vector state the jump stubs and the return trampoline save around handlers.
//!
//! By default: xmm0-15, with plain moves, which is what a handler built for the x86-64
//! baseline may change. A handler may also reach code that uses wider registers (glibc's
//! AVX2/AVX-512 `memcpy` and `strlen` variants, or a handler built with `-mavx2`): that
//! changes the upper halves of ymm/zmm registers and zmm16-31, which matters only to code
//! that keeps such values live across a call (vector arguments at a probed function entry,
//! vector values across a probed return). `--full-vector-state` saves the whole state with
//! XSAVE instead, at several tens of nanoseconds per hit on this project's machines. The
//! `int3` path always restores everything: the kernel saves it with the signal frame.

use core::sync::atomic::{AtomicU64, Ordering};

/// Bytes of the XSAVE area for [`MASK`], or 0 for the xmm-only save. Read by the assembly.
pub static AREA_SIZE: AtomicU64 = AtomicU64::new(0);
/// The XSAVE components saved: every user component the OS enabled but AMX tile data, whose
/// use needs a per-process permission and whose 8 KiB would not fit small thread stacks.
pub static MASK: AtomicU64 = AtomicU64::new(0);

const AMX_TILE: u64 = (1 << 17) | (1 << 18);

/// Switches to saving the whole vector state with XSAVE, where the processor has it; false
/// where it does not (start-up).
pub fn save_full_state() -> bool {
    let leaf1 = core::arch::x86_64::__cpuid(1);
    if leaf1.ecx & (1 << 27) == 0 {
        return false; // no OSXSAVE
    }
    // SAFETY: OSXSAVE is set, so XGETBV is available and XCR0 readable.
    let xcr0 = unsafe { core::arch::x86_64::_xgetbv(0) };
    let mask = xcr0 & !AMX_TILE;
    // The standard-format area ends after the last component saved.
    let mut size = 576u64;
    for component in 2..63 {
        if mask & (1 << component) != 0 {
            let leaf = core::arch::x86_64::__cpuid_count(0xd, component);
            size = size.max(u64::from(leaf.ebx) + u64::from(leaf.eax));
        }
    }
    MASK.store(mask, Ordering::Relaxed);
    AREA_SIZE.store((size + 63) & !63, Ordering::Relaxed);
    true
}

/// Where `save_vectors!` put xmm0 (xmm1..15 follow, 16 bytes apart) when it saved them
/// below the `struct pt_regs` at `regs` (see `frame`): the xmm-only area, or the XSAVE
/// area's legacy region.
pub fn saved_xmm(regs: usize) -> usize {
    match AREA_SIZE.load(Ordering::Relaxed) as usize {
        0 => (regs - 256) & !15,
        size => ((regs - size) & !63) + 160,
    }
}

/// Saves the vector registers below %rsp, aligning it (clobbers rax and rdx). The invoking
/// `global_asm!` names `vector_area`: 0 to save xmm0-15 with plain moves (what a handler
/// built for x86-64 may change), or the size of an XSAVE area for the whole vector state
/// (`--full-vector-state`), and `vector_mask`, the XSAVE components.
macro_rules! save_vectors {
    () => {
        concat!(
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
        )
    };
}

/// Puts back what [`save_vectors`] saved at %rsp (clobbers rax and rdx; %rsp stays).
macro_rules! restore_vectors {
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
        )
    };
}

pub(crate) use restore_vectors;
pub(crate) use save_vectors;

core::arch::global_asm!(
    ".pushsection .text.uprobe_vector_safe,\"ax\",@progbits",
    ".globl uprobe_vector_safe",
    ".hidden uprobe_vector_safe",
    ".type uprobe_vector_safe,@function",
    ".p2align 4",
    "uprobe_vector_safe:",
    "push rbp\n mov rbp, rsp\n push rbx\n push r12",
    "mov rbx, rdi\n mov r12, rsi",
    save_vectors!(),
    "mov rdi, r12\n call rbx",
    restore_vectors!(),
    "lea rsp, [rbp - 16]\n pop r12\n pop rbx\n pop rbp\n ret",
    ".size uprobe_vector_safe, . - uprobe_vector_safe",
    ".popsection",
    vector_area = sym AREA_SIZE,
    vector_mask = sym MASK,
);

extern "C" {
    /// Calls `f(arg)` with the vector registers saved around it as the jump stubs save them.
    fn uprobe_vector_safe(f: extern "C" fn(usize), arg: usize);
}

/// Runs `f` with the vector registers saved around it, from code that may not touch them
/// itself (a jump probe's hit that skipped their save: see `probe::dispatch`). Any context.
#[inline(always)]
pub fn saving_vectors<F: FnOnce()>(f: F) {
    extern "C" fn call<F: FnOnce()>(arg: usize) {
        // SAFETY: `arg` is the `Option<F>` below, alive for the call, taken once.
        if let Some(f) = unsafe { (*(arg as *mut Option<F>)).take() } {
            f();
        }
    }
    let mut f = Some(f);
    // SAFETY: the helper calls `call::<F>` once with the pointer, on this thread, and saves
    // and restores only registers the ABI lets a call change.
    unsafe { uprobe_vector_safe(call::<F>, &mut f as *mut Option<F> as usize) };
}
