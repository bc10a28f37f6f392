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

core::arch::global_asm!(
    ".pushsection .text.uprobe_vector_safe,\"ax\",@progbits",
    ".globl uprobe_vector_safe",
    ".hidden uprobe_vector_safe",
    ".type uprobe_vector_safe,@function",
    ".p2align 4",
    "uprobe_vector_safe:",
    "push rbp\n mov rbp, rsp\n push rbx\n push r12",
    "mov rbx, rdi\n mov r12, rsi",
    crate::insn::frame::save_vectors!(),
    "mov rdi, r12\n call rbx",
    crate::insn::frame::restore_vectors!(),
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
