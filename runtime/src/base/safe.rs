//! Reads of memory that may not be mapped, that never harm the program: a fault in one of the
//! routines below is caught by the runtime's SIGSEGV/SIGBUS handler, which finds the faulting
//! instruction in [`fixup`] and resumes at the routine's failure exit, as the kernel's
//! exception tables do for `copy_from_user`.
//!
//! Signal-safe, no state. A fault is caught only while the runtime's fault handler is the one
//! the kernel runs (it always is, see `hazard::signals`) and SIGSEGV/SIGBUS are not blocked.

core::arch::global_asm!(
    ".pushsection .text.uprobe_safe,\"ax\",@progbits",
    ".p2align 4",
    // u64 uprobe_safe_read_u64(addr: rdi, out: rsi) -> 0 ok, 1 fault
    ".globl uprobe_safe_read_u64",
    ".hidden uprobe_safe_read_u64",
    ".type uprobe_safe_read_u64,@function",
    "uprobe_safe_read_u64:",
    ".globl uprobe_safe_read_insn",
    ".hidden uprobe_safe_read_insn",
    "uprobe_safe_read_insn:",
    "mov rax, qword ptr [rdi]",
    "mov qword ptr [rsi], rax",
    "xor eax, eax",
    "ret",
    ".globl uprobe_safe_read_fail",
    ".hidden uprobe_safe_read_fail",
    "uprobe_safe_read_fail:",
    "mov eax, 1",
    "ret",
    ".size uprobe_safe_read_u64, . - uprobe_safe_read_u64",
    // usize uprobe_safe_copy(dst: rdi, src: rsi, len: rdx) -> bytes copied (stops at a fault)
    ".p2align 4",
    ".globl uprobe_safe_copy",
    ".hidden uprobe_safe_copy",
    ".type uprobe_safe_copy,@function",
    "uprobe_safe_copy:",
    "xor eax, eax",
    "test rdx, rdx",
    "jz 2f",
    "1:",
    ".globl uprobe_safe_copy_insn",
    ".hidden uprobe_safe_copy_insn",
    "uprobe_safe_copy_insn:",
    "movzx ecx, byte ptr [rsi + rax]",
    "mov byte ptr [rdi + rax], cl",
    "inc rax",
    "cmp rax, rdx",
    "jne 1b",
    "2:",
    ".globl uprobe_safe_copy_fail",
    ".hidden uprobe_safe_copy_fail",
    "uprobe_safe_copy_fail:",
    "ret",
    ".size uprobe_safe_copy, . - uprobe_safe_copy",
    ".popsection",
);

extern "C" {
    fn uprobe_safe_read_u64(addr: usize, out: *mut u64) -> u64;
    fn uprobe_safe_read_insn();
    fn uprobe_safe_read_fail();
    fn uprobe_safe_copy(dst: *mut u8, src: usize, len: usize) -> usize;
    fn uprobe_safe_copy_insn();
    fn uprobe_safe_copy_fail();
}

/// The 8 bytes at `addr`, or None where reading them faults.
pub fn read_u64(addr: usize) -> Option<u64> {
    let mut out = 0u64;
    // SAFETY: the routine reads `addr` with a fault fixup and writes only `out`.
    (unsafe { uprobe_safe_read_u64(addr, &mut out) } == 0).then_some(out)
}

/// Copies up to `dst.len()` bytes from `src` into `dst`; returns how many were copied before
/// a fault (all of them when none).
pub fn copy(dst: &mut [u8], src: usize) -> usize {
    // SAFETY: the routine reads `src` with a fault fixup and writes only within `dst`.
    unsafe { uprobe_safe_copy(dst.as_mut_ptr(), src, dst.len()) }
}

/// Where to resume after a fault at instruction `rip`, if it is one of the guarded reads
/// (signal context: called by the fault handler).
pub fn fixup(rip: usize) -> Option<usize> {
    if rip == uprobe_safe_read_insn as *const () as usize {
        Some(uprobe_safe_read_fail as *const () as usize)
    } else if rip == uprobe_safe_copy_insn as *const () as usize {
        Some(uprobe_safe_copy_fail as *const () as usize)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_what_is_mapped() {
        let word = 0x1122_3344_5566_7788u64;
        assert_eq!(super::read_u64(&word as *const u64 as usize), Some(word));
        let src = *b"hello";
        let mut dst = [0u8; 5];
        assert_eq!(super::copy(&mut dst, src.as_ptr() as usize), 5);
        assert_eq!(&dst, b"hello");
        assert!(super::fixup(0x1000).is_none());
    }
}
