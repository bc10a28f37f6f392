//! The register frame of the trap-free paths: assembly that builds a `struct pt_regs` on the
//! stack (its address left in %rbx, which calls preserve), saves the vector registers below
//! it, and the way back. The jump probes' common entry and the return trampoline (in
//! `probe::dispatch` and `probe::retprobe`) are made of it with `trap_free_entry!`, so one
//! definition serves both; the constants below are the one description of the stack that
//! code builds, read by the stub generator (`stub`) and by the Rust code that reads the area.
//!
//! The stack at the call of the Rust function, upwards from %rbx:
//!
//! ```text
//! rbx + 0                    struct pt_regs (PT_REGS_SIZE bytes, pushed by save_pt_regs)
//! rbx + RESUME_SLOT          the address to resume at: a jump stub's return address (its
//!                            relocated instructions), or the trampoline's pushed 0; the Rust
//!                            function's result is stored here and the entry returns to it
//! jump stubs only:
//! rbx + CONTEXT_SLOT         the stub's context word (the probe point)
//! rbx + CONTEXT_SLOT + 8     the red zone the stub stepped over (RED_ZONE bytes), then the
//!                            program's stack pointer at the probe (JUMP_CALLER_RSP)
//! the trampoline:
//! rbx + RETURN_CALLER_RSP    the caller's stack pointer after the hooked `ret`
//! ```

use crate::base::abi::PtRegs;

/// Bytes of the `struct pt_regs` the frame pushes (21 words, the kernel's order).
pub const PT_REGS_SIZE: usize = core::mem::size_of::<PtRegs>();
/// Bytes below a function's stack pointer that the x86-64 ABI lets it use without moving it:
/// a stub entered in the middle of code steps over them before it pushes anything.
pub const RED_ZONE: usize = 128;
/// From the `struct pt_regs` to the word holding the address to resume at.
pub const RESUME_SLOT: usize = PT_REGS_SIZE;
/// From the `struct pt_regs` to a jump stub's context word (above its return address).
pub const CONTEXT_SLOT: usize = RESUME_SLOT + 8;
/// What a jump stub puts below the program's stack pointer before its `call`: the red zone
/// stepped over and the context word. The common entry's `ret` drops them.
pub const STUB_FRAME: usize = RED_ZONE + 8;
/// From the `struct pt_regs` to the program's stack pointer at a jump probe.
pub const JUMP_CALLER_RSP: usize = CONTEXT_SLOT + 8 + RED_ZONE;
/// From the `struct pt_regs` to the caller's stack pointer after a hooked return.
pub const RETURN_CALLER_RSP: usize = RESUME_SLOT + 8;
/// The saved flags, from the stack pointer the restore has once r15..r8 are popped (its
/// `sahf` reads them there): the ten words before `rax` are gone.
pub const FLAGS_AFTER_POPS: usize = core::mem::offset_of!(PtRegs, eflags) - core::mem::offset_of!(PtRegs, rax);

/// Assembly shared by the jump stubs' common code and the return trampoline: a
/// `struct pt_regs` built on the stack (its address left in %rbx, which the call preserves),
/// the vector registers saved below it unless %r12d is 0 (set by the `$choose` code the
/// entry runs first, once the general registers are saved; %r12 keeps it across the call),
/// and the way back. The flags come back without popfq, which costs more than the rest of the
/// restore: OF by an addition that overflows exactly when it was set, then the others with
/// sahf (DF is clear at function entries and returns, as the ABI has it).
macro_rules! save_pt_regs {
    ($choose:literal) => {
        concat!(
            "push 0x2b\n", // ss: the user data segment, as a signal frame has it
            "push 0\n",    // rsp
            "pushfq\n",
            "push 0x33\n", // cs: the 64-bit user code segment
            "push 0\n",    // rip
            "push -1\n",   // orig_rax
            "push rdi\n push rsi\n push rdx\n push rcx\n push rax\n",
            "push r8\n push r9\n push r10\n push r11\n",
            "push rbx\n push rbp\n push r12\n push r13\n push r14\n push r15\n",
            "mov rbx, rsp\n",
            "and rsp, -16\n", // for the calls, whatever the program's stack alignment was
            $choose,
            "\ntest r12d, r12d\n jz 75f\n",
            $crate::insn::vector::save_vectors!(),
            "75:\n",
            "cld\n",
        )
    };
}

/// The way back from [`save_pt_regs`], leaving %rsp where it was before the first push.
macro_rules! restore_pt_regs {
    () => {
        concat!(
            "test r12d, r12d\n jz 76f\n",
            $crate::insn::vector::restore_vectors!(),
            "76:\n",
            "mov rsp, rbx\n",
            "pop r15\n pop r14\n pop r13\n pop r12\n pop rbp\n pop rbx\n",
            "pop r11\n pop r10\n pop r9\n pop r8\n",
            "mov al, byte ptr [rsp + {flags_after_pops} + 1]\n", // OF is bit 3 of the flags' second byte
            "and al, 8\n shl al, 4\n add al, 0x80\n",
            "mov ah, byte ptr [rsp + {flags_after_pops}]\n sahf\n",
            "pop rax\n pop rcx\n pop rdx\n pop rsi\n pop rdi\n",
            "lea rsp, [rsp + {after_rdi}]\n", // orig_rax, rip, cs, eflags, rsp, ss; lea keeps the flags
        )
    };
}

/// Bytes `save_scratch!` pushes: the flags, the nine registers a call may change (%rax,
/// %rcx, %rdx, %rsi, %rdi, %r8-%r11) and %rbx.
pub const SCRATCH_SIZE: usize = 11 * 8;

/// The small frame of the quick paths (`aggregate::timed`'s entry, the return trampoline's
/// quick way), which call a Rust function that touches no vector register: the flags and every general register the call may change are
/// pushed, %rbx keeps the stack pointer (the function's first argument is free to point
/// above it, [`SCRATCH_SIZE`] bytes up) and the stack is aligned for the call.
macro_rules! save_scratch {
    () => {
        concat!(
            "pushfq\n push rax\n push rcx\n push rdx\n push rsi\n push rdi\n",
            "push r8\n push r9\n push r10\n push r11\n push rbx\n",
            "mov rbx, rsp\n and rsp, -16\n cld\n",
        )
    };
}

/// The way back from [`save_scratch`], the flags as [`restore_pt_regs`] brings them back.
macro_rules! restore_scratch {
    () => {
        concat!(
            "mov rsp, rbx\n pop rbx\n pop r11\n pop r10\n pop r9\n pop r8\n",
            "pop rdi\n pop rsi\n pop rdx\n pop rcx\n",
            "mov al, byte ptr [rsp + 9]\n and al, 8\n shl al, 4\n add al, 0x80\n",
            "mov ah, byte ptr [rsp + 8]\n sahf\n pop rax\n lea rsp, [rsp + 8]\n",
        )
    };
}

/// A trap-free entry point `$name` (after the code `$before`, which runs into it): after
/// `$prologue`, saves a `struct pt_regs` (and the vector state, unless `$choose` leaves %r12d
/// 0), calls
/// `extern "C" fn $callee(&mut PtRegs, vectors_saved: bool) -> usize`, stores its result in
/// the [`RESUME_SLOT`], restores everything and leaves with `$epilogue`, which finds the
/// stack as it was after `$prologue` with the resume address on top. Constants the prologue
/// or the epilogue name follow as `NAME = const VALUE`, then the functions and statics the
/// `$choose` code names as `; NAME = sym PATH` (%rsp is aligned to 16 there).
macro_rules! trap_free_entry {
    ($before:expr, $name:literal, $prologue:expr, $choose:literal, $callee:path, $epilogue:literal $(, $op:ident = const $val:expr)* $(; $sop:ident = sym $sval:path)*) => {
        core::arch::global_asm!(
            concat!(".pushsection .text.", $name, ",\"ax\",@progbits"),
            concat!(".globl ", $name),
            concat!(".hidden ", $name),
            concat!(".type ", $name, ",@function"),
            ".p2align 4",
            $before,
            concat!($name, ":"),
            $prologue,
            $crate::insn::frame::save_pt_regs!($choose),
            "mov rdi, rbx",
            "mov esi, r12d",
            "call {callee}",
            "mov qword ptr [rbx + {resume_slot}], rax",
            $crate::insn::frame::restore_pt_regs!(),
            $epilogue,
            concat!(".size ", $name, ", . - ", $name),
            ".popsection",
            callee = sym $callee,
            vector_area = sym $crate::insn::vector::AREA_SIZE,
            vector_mask = sym $crate::insn::vector::MASK,
            resume_slot = const $crate::insn::frame::RESUME_SLOT,
            flags_after_pops = const $crate::insn::frame::FLAGS_AFTER_POPS,
            after_rdi = const $crate::insn::frame::PT_REGS_SIZE - core::mem::offset_of!($crate::base::abi::PtRegs, orig_rax),
            $($op = const $val,)*
            $($sop = sym $sval,)*
        );
    };
}

pub(crate) use restore_pt_regs;
pub(crate) use restore_scratch;
pub(crate) use save_pt_regs;
pub(crate) use save_scratch;
pub(crate) use trap_free_entry;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_the_one_the_code_pushes() {
        // save_pt_regs pushes 21 words, rsp first below ss: the struct, in the kernel's order.
        assert_eq!(PT_REGS_SIZE, 21 * 8);
        assert_eq!(core::mem::offset_of!(PtRegs, eflags), 18 * 8);
        assert_eq!(FLAGS_AFTER_POPS, 64);
        // `ret {stub_frame}` after popping the resume address leaves the program's %rsp.
        assert_eq!(RESUME_SLOT + 8 + STUB_FRAME, JUMP_CALLER_RSP);
        assert_eq!(JUMP_CALLER_RSP, 312);
        assert_eq!(RETURN_CALLER_RSP, 22 * 8);
    }
}
