//! Whether a handler's code provably touches no vector or floating-point state (pure: bytes in,
//! answer out).
//!
//! A jump probe saves xmm0-15 (or the whole XSAVE state) around handlers that may use them.
//! A handler that does not declare `UPROBE_NO_VECTORS` is read at its registration instead:
//! every instruction reachable from its entry, through conditional and direct branches and
//! direct calls, is decoded; where each one is a general-purpose instruction (of an allowed
//! CPUID feature, naming no vector, x87, MMX, mask or tile register) and none transfers control
//! to an address the code does not name (an indirect call or jump: a call through the PLT, a
//! jump table, a function pointer), the handler touches no such state and its hits may skip
//! the save. Anything else, or more than [`BUDGET`] instructions, keeps the save: the answer
//! errs only towards saving.

use std::collections::BTreeSet;

use iced_x86::{Code, CpuidFeature, FlowControl, Instruction, OpKind, Register};

use crate::insn::decode::{decode_at, MAX_INSN_LEN};

/// The most instructions read for one handler (its callees included).
pub const BUDGET: usize = 4096;

/// Why a handler's code may touch vector state (the first reason found).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touches {
    /// An instruction (its mnemonic) that uses vector, floating-point or other non-general
    /// state, or that is not followed.
    Instruction { at: u64, text: String },
    /// A call or jump through a register or memory: where it goes is not in the code.
    Indirect { at: u64 },
    /// Code that cannot be read or decoded (outside the handler's object, or not code).
    Unreadable { at: u64 },
    /// More than [`BUDGET`] instructions reachable.
    TooLong,
}

impl core::fmt::Display for Touches {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Touches::Instruction { at, text } => write!(f, "`{text}` at {at:#x}"),
            Touches::Indirect { at } => write!(f, "a call or jump through a pointer at {at:#x}"),
            Touches::Unreadable { at } => write!(f, "code at {at:#x} that cannot be read"),
            Touches::TooLong => write!(f, "more than {BUDGET} instructions"),
        }
    }
}

/// The CPUID features of the instructions allowed: general registers, flags and memory only.
const GENERAL: [CpuidFeature; 24] = [
    CpuidFeature::INTEL8086,
    CpuidFeature::INTEL8086_ONLY,
    CpuidFeature::INTEL186,
    CpuidFeature::INTEL286,
    CpuidFeature::INTEL386,
    CpuidFeature::INTEL486,
    CpuidFeature::X64,
    CpuidFeature::CMOV,
    CpuidFeature::CX8,
    CpuidFeature::CMPXCHG16B,
    CpuidFeature::MULTIBYTENOP,
    CpuidFeature::BMI1,
    CpuidFeature::BMI2,
    CpuidFeature::LZCNT,
    CpuidFeature::POPCNT,
    CpuidFeature::ADX,
    CpuidFeature::MOVBE,
    CpuidFeature::CET_IBT,
    CpuidFeature::PAUSE,
    CpuidFeature::TSC,
    CpuidFeature::RDTSCP,
    CpuidFeature::RDPID,
    CpuidFeature::CPUID,
    CpuidFeature::FSGSBASE,
];

/// Instructions of other features that touch no register at all (fences and prefetches, which
/// C atomics and loops emit).
const HARMLESS: [Code; 7] = [
    Code::Mfence,
    Code::Lfence,
    Code::Sfence,
    Code::Prefetcht0_m8,
    Code::Prefetcht1_m8,
    Code::Prefetcht2_m8,
    Code::Prefetchnta_m8,
];

fn non_general(reg: Register) -> bool {
    reg.is_xmm() || reg.is_ymm() || reg.is_zmm() || reg.is_mm() || reg.is_st() || reg.is_k() || reg.is_tmm()
}

/// Whether `insn` uses only general state.
fn general(insn: &Instruction) -> bool {
    if HARMLESS.contains(&insn.code()) {
        return true;
    }
    if !insn.cpuid_features().iter().all(|f| GENERAL.contains(f)) {
        return false;
    }
    let mut regs = (0..insn.op_count()).filter_map(|i| match insn.op_kind(i) {
        OpKind::Register => Some(insn.op_register(i)),
        _ => None,
    });
    !regs.any(non_general) && !non_general(insn.memory_base()) && !non_general(insn.memory_index())
}

/// The instruction's mnemonic, as disassemblers write it.
fn mnemonic(insn: &Instruction) -> String {
    format!("{:?}", insn.mnemonic()).to_lowercase()
}

/// Reads the code reachable from `entry`. `read(addr, buf)` fills `buf` with the bytes at
/// `addr` and gives how many it could (0: none: not code the handler's object holds).
pub fn check(entry: u64, read: &mut dyn FnMut(u64, &mut [u8]) -> usize) -> Result<(), Touches> {
    let mut todo = vec![entry];
    let mut seen = BTreeSet::new();
    while let Some(mut ip) = todo.pop() {
        while seen.insert(ip) {
            if seen.len() > BUDGET {
                return Err(Touches::TooLong);
            }
            let mut bytes = [0u8; MAX_INSN_LEN];
            let n = read(ip, &mut bytes);
            let Some(insn) = decode_at(&bytes[..n], ip) else {
                return Err(Touches::Unreadable { at: ip });
            };
            if !general(&insn) {
                return Err(Touches::Instruction { at: ip, text: mnemonic(&insn) });
            }
            match insn.flow_control() {
                FlowControl::Next => ip = insn.next_ip(),
                FlowControl::Return | FlowControl::Exception => break,
                FlowControl::UnconditionalBranch if insn.op0_kind() == OpKind::NearBranch64 => {
                    ip = insn.near_branch_target();
                }
                FlowControl::ConditionalBranch if insn.op0_kind() == OpKind::NearBranch64 => {
                    todo.push(insn.near_branch_target());
                    ip = insn.next_ip();
                }
                FlowControl::Call if insn.is_call_near() => {
                    todo.push(insn.near_branch_target());
                    ip = insn.next_ip();
                }
                FlowControl::IndirectBranch | FlowControl::IndirectCall => {
                    return Err(Touches::Indirect { at: ip });
                }
                // Far branches, interrupts (an `int3` may be another probe), system calls,
                // transactions: not followed.
                _ => return Err(Touches::Instruction { at: ip, text: mnemonic(&insn) }),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x1000;

    fn run(code: &[u8]) -> Result<(), Touches> {
        check(BASE, &mut |addr, buf| {
            let Some(at) = addr.checked_sub(BASE).map(|a| a as usize).filter(|&a| a < code.len()) else {
                return 0;
            };
            let n = buf.len().min(code.len() - at);
            buf[..n].copy_from_slice(&code[at..at + n]);
            n
        })
    }

    #[test]
    fn a_counter_is_vector_free() {
        // endbr64; lock add qword [rip+0x100], 1; ret
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0xf0, 0x48, 0x83, 0x05, 0x00, 0x01, 0x00, 0x00, 0x01, 0xc3];
        assert_eq!(run(&code), Ok(()));
    }

    #[test]
    fn loops_branches_and_direct_calls_are_followed() {
        // 0x0: 48 85 ff        test rdi,rdi
        // 0x3: 74 06           je 0xb
        // 0x5: e8 02 00 00 00  call 0xc
        // 0xa: c3              ret
        // 0xb: c3              ret
        // 0xc: 48 ff c8        dec rax      <- the callee: a loop
        // 0xf: 75 fb           jne 0xc
        // 0x11: c3             ret
        let code = [0x48, 0x85, 0xff, 0x74, 0x06, 0xe8, 0x02, 0, 0, 0, 0xc3, 0xc3, 0x48, 0xff, 0xc8, 0x75, 0xfb, 0xc3];
        assert_eq!(run(&code), Ok(()));
        // The callee's loop body turned into `pxor xmm0,xmm0` (66 0f ef c0) and a 1-byte nop.
        let mut touching = code;
        touching[12..17].copy_from_slice(&[0x66, 0x0f, 0xef, 0xc0, 0x90]);
        touching[17] = 0xc3;
        assert!(matches!(run(&touching), Err(Touches::Instruction { at: 0x100c, .. })), "{:?}", run(&touching));
    }

    #[test]
    fn vector_x87_and_state_instructions_are_found() {
        for code in [
            &[0x0f, 0x28, 0xc1, 0xc3][..],         // movaps xmm0,xmm1
            &[0xc5, 0xf8, 0x77, 0xc3],             // vzeroupper: no operand names a register
            &[0xd9, 0xe8, 0xc3],                   // fld1
            &[0x0f, 0xae, 0x17, 0xc3],             // ldmxcsr [rdi]
            &[0x0f, 0x77, 0xc3],                   // emms
            &[0xf2, 0x0f, 0x2a, 0xc7, 0xc3],       // cvtsi2sd xmm0,edi
            &[0x66, 0x48, 0x0f, 0x6e, 0xc7, 0xc3], // movq xmm0,rdi
            &[0x0f, 0xae, 0x07, 0xc3],             // fxsave [rdi]
            &[0x0f, 0x01, 0xef, 0xc3],             // wrpkru
        ] {
            assert!(matches!(run(code), Err(Touches::Instruction { at: BASE, .. })), "{code:x?}: {:?}", run(code));
        }
    }

    #[test]
    fn fences_and_prefetches_are_harmless() {
        // mfence; prefetcht0 [rdi]; ret
        assert_eq!(run(&[0x0f, 0xae, 0xf0, 0x0f, 0x18, 0x0f, 0xc3]), Ok(()));
    }

    #[test]
    fn indirect_calls_and_jumps_are_not_followed() {
        // call [rip+0] (through the PLT's GOT slot); ret
        assert_eq!(run(&[0xff, 0x15, 0, 0, 0, 0, 0xc3]), Err(Touches::Indirect { at: BASE }));
        // jmp rax (a jump table)
        assert_eq!(run(&[0xff, 0xe0]), Err(Touches::Indirect { at: BASE }));
    }

    #[test]
    fn code_outside_what_can_be_read_is_not_trusted() {
        // jmp +0x100: outside the bytes given
        assert_eq!(run(&[0xe9, 0x00, 0x01, 0, 0]), Err(Touches::Unreadable { at: BASE + 0x105 }));
        // int3 (a probe's, or a breakpoint): not followed
        assert!(matches!(run(&[0xcc]), Err(Touches::Instruction { .. })));
        // syscall
        assert!(matches!(run(&[0x0f, 0x05, 0xc3]), Err(Touches::Instruction { .. })));
    }

    #[test]
    fn code_longer_than_the_budget_is_not_trusted() {
        let mut code = vec![0x90; BUDGET + 1];
        code.push(0xc3);
        assert_eq!(run(&code), Err(Touches::TooLong));
        assert_eq!(run(&code[BUDGET - 10..]), Ok(()));
    }
}
