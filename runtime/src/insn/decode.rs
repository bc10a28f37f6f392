//! Instruction decoding for probe placement (pure: bytes in, answers out).
//!
//! Three questions are answered here: is an address an instruction boundary of its function;
//! how is the instruction displaced by a probe's `int3` executed afterwards (emulated on the
//! signal context, or run out of line); and what bytes does its out-of-line copy hold.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, ConditionCode, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, Mnemonic, OpKind, Register,
};
use thiserror::Error;

/// The longest x86 instruction.
pub const MAX_INSN_LEN: usize = 15;

/// Decodes the instruction at the start of `bytes`, which lives at `ip`.
pub fn decode_at(bytes: &[u8], ip: u64) -> Option<Instruction> {
    let mut decoder = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let insn = decoder.decode();
    (!insn.is_invalid()).then_some(insn)
}

#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum BoundaryError {
    #[error("{addr:#x} is inside the instruction at {insn:#x}")]
    Inside { addr: u64, insn: u64 },
    #[error("the code at {at:#x} does not decode")]
    Undecodable { at: u64 },
    #[error("{addr:#x} lies past the end of the function")]
    PastEnd { addr: u64 },
}

/// Checks that `addr` starts an instruction when `func` (the bytes of a function at `func_ip`)
/// is decoded from its first byte.
pub fn check_boundary(func: &[u8], func_ip: u64, addr: u64) -> Result<(), BoundaryError> {
    let mut decoder = Decoder::with_ip(64, func, func_ip, DecoderOptions::NONE);
    let mut insn = Instruction::default();
    while decoder.can_decode() {
        let ip = decoder.ip();
        if ip == addr {
            return Ok(());
        }
        if ip > addr {
            return Err(BoundaryError::Inside { addr, insn: insn.ip() });
        }
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            return Err(BoundaryError::Undecodable { at: ip });
        }
    }
    if decoder.ip() > addr {
        return Err(BoundaryError::Inside { addr, insn: insn.ip() });
    }
    Err(BoundaryError::PastEnd { addr })
}

/// Whether the function `func` (its bytes, at `func_ip`) can return to its caller: it holds
/// a `ret`, or a jump that leaves it (a tail call, or any indirect jump). A function with
/// neither (`_start`, a wrapper that ends in `call exit`, `hlt` or `ud2`) never returns,
/// and a return probe on it would only hold a record forever. Code that does not decode
/// counts as returning (no claim is made about it).
pub fn may_return(func: &[u8], func_ip: u64) -> bool {
    let end = func_ip + func.len() as u64;
    let mut decoder = Decoder::with_ip(64, func, func_ip, DecoderOptions::NONE);
    let mut insn = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            return true;
        }
        match insn.flow_control() {
            FlowControl::Return | FlowControl::IndirectBranch => return true,
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
                if insn.op0_kind() == OpKind::NearBranch64 && !(func_ip..end).contains(&insn.near_branch_target()) =>
            {
                return true
            }
            _ => {}
        }
    }
    false
}

/// How an instruction displaced by `int3` is executed after the handlers have run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Carried out by editing the signal context.
    Emulate(Emulation),
    /// Copied, relocated, into an out-of-line slot that jumps back afterwards.
    OutOfLine,
}

/// The instructions the runtime carries out itself. Targets are absolute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emulation {
    /// nop, multi-byte nop, endbr64.
    Nop,
    Push(Register),
    PushImm(u64),
    Pop(Register),
    /// mov %src,%dst between 64-bit registers (`mov %rsp,%rbp`).
    MovReg {
        dst: Register,
        src: Register,
    },
    /// add/sub $imm,%reg on a 64-bit register, flags included.
    AddImm {
        reg: Register,
        imm: u64,
        sub: bool,
    },
    Jmp(u64),
    Jcc {
        cond: ConditionCode,
        target: u64,
    },
    /// loop/loope/loopne with RCX as the counter.
    Loop {
        cond: ConditionCode,
        target: u64,
    },
    Jrcxz(u64),
    Call(u64),
    /// call through a register or memory operand; the target is computed at each hit.
    CallIndirect(Instruction),
    /// ret, with the bytes `ret imm16` releases.
    Ret(u16),
}

#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("the instruction is a breakpoint")]
    Breakpoint,
    #[error("far control transfers are not supported")]
    FarTransfer,
}

fn is_gpr64(reg: Register) -> bool {
    reg.is_gpr64()
}

/// Chooses how the displaced `insn` is executed.
pub fn plan(insn: &Instruction) -> Result<Plan, PlanError> {
    use Emulation::*;
    let emulate = |e| Ok(Plan::Emulate(e));
    match insn.mnemonic() {
        Mnemonic::Int3 | Mnemonic::Int1 => return Err(PlanError::Breakpoint),
        Mnemonic::Nop | Mnemonic::Endbr64 => return emulate(Nop),
        _ => {}
    }
    if insn.is_jmp_far() || insn.is_jmp_far_indirect() || insn.is_call_far() || insn.is_call_far_indirect() {
        return Err(PlanError::FarTransfer);
    }
    match insn.flow_control() {
        FlowControl::UnconditionalBranch if insn.is_jmp_short_or_near() => {
            return emulate(Jmp(insn.near_branch_target()))
        }
        FlowControl::ConditionalBranch if insn.is_jcc_short_or_near() => {
            return emulate(Jcc { cond: insn.condition_code(), target: insn.near_branch_target() })
        }
        FlowControl::ConditionalBranch => match insn.code() {
            Code::Loop_rel8_64_RCX => {
                return emulate(Loop { cond: ConditionCode::None, target: insn.near_branch_target() })
            }
            Code::Loope_rel8_64_RCX => {
                return emulate(Loop { cond: ConditionCode::e, target: insn.near_branch_target() })
            }
            Code::Loopne_rel8_64_RCX => {
                return emulate(Loop { cond: ConditionCode::ne, target: insn.near_branch_target() })
            }
            Code::Jrcxz_rel8_64 => return emulate(Jrcxz(insn.near_branch_target())),
            _ => {}
        },
        FlowControl::Call if insn.is_call_near() => return emulate(Call(insn.near_branch_target())),
        FlowControl::IndirectCall => return emulate(CallIndirect(*insn)),
        FlowControl::Return if insn.mnemonic() == Mnemonic::Ret => {
            let pop = if insn.op_count() == 1 { insn.immediate16() } else { 0 };
            return emulate(Ret(pop));
        }
        FlowControl::Return => return Err(PlanError::FarTransfer),
        _ => {}
    }
    let reg0 = insn.op0_kind() == OpKind::Register && is_gpr64(insn.op0_register());
    match insn.code() {
        Code::Push_r64 if reg0 => emulate(Push(insn.op0_register())),
        Code::Pushq_imm8 | Code::Pushq_imm32 => emulate(PushImm(insn.immediate(0))),
        Code::Pop_r64 if reg0 => emulate(Pop(insn.op0_register())),
        Code::Mov_rm64_r64 | Code::Mov_r64_rm64
            if reg0 && insn.op1_kind() == OpKind::Register && is_gpr64(insn.op1_register()) =>
        {
            emulate(MovReg { dst: insn.op0_register(), src: insn.op1_register() })
        }
        Code::Add_rm64_imm8 | Code::Add_rm64_imm32 | Code::Add_RAX_imm32 if reg0 => {
            emulate(AddImm { reg: insn.op0_register(), imm: insn.immediate(1), sub: false })
        }
        Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32 | Code::Sub_RAX_imm32 if reg0 => {
            emulate(AddImm { reg: insn.op0_register(), imm: insn.immediate(1), sub: true })
        }
        _ => Ok(Plan::OutOfLine),
    }
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("cannot relocate the instruction at {ip:#x} to {slot:#x}: {reason}")]
pub struct RelocError {
    pub ip: u64,
    pub slot: u64,
    pub reason: String,
}

/// The out-of-line copy of `insn` placed at `slot`: the instruction with its RIP-relative
/// operand or branch re-targeted, then a `jmp` back to the instruction after the original.
pub fn relocate(insn: &Instruction, slot: u64) -> Result<Vec<u8>, RelocError> {
    let fail = |reason: String| RelocError { ip: insn.ip(), slot, reason };
    let back = Instruction::with_branch(Code::Jmp_rel32_64, insn.next_ip()).map_err(|e| fail(e.to_string()))?;
    let insns = [*insn, back];
    let block = InstructionBlock::new(&insns, slot);
    BlockEncoder::encode(64, block, BlockEncoderOptions::NONE).map(|r| r.code_buffer).map_err(|e| fail(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(bytes: &[u8]) -> Plan {
        plan(&decode_at(bytes, 0x1000).unwrap()).unwrap()
    }

    #[test]
    fn boundaries_follow_the_decoder() {
        // endbr64; push %rbp; mov %rsp,%rbp; lea 0x1(%rdi),%eax; pop %rbp; ret
        let f = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x8d, 0x47, 0x01, 0x5d, 0xc3];
        for ok in [0x1000, 0x1004, 0x1005, 0x1008, 0x100b, 0x100c] {
            assert_eq!(check_boundary(&f, 0x1000, ok), Ok(()), "{ok:#x}");
        }
        assert_eq!(check_boundary(&f, 0x1000, 0x1002), Err(BoundaryError::Inside { addr: 0x1002, insn: 0x1000 }));
        assert_eq!(check_boundary(&f, 0x1000, 0x1009), Err(BoundaryError::Inside { addr: 0x1009, insn: 0x1008 }));
        assert_eq!(check_boundary(&f, 0x1000, 0x100d), Err(BoundaryError::PastEnd { addr: 0x100d }));
        assert_eq!(check_boundary(&[0x06], 0x1000, 0x1001), Err(BoundaryError::Undecodable { at: 0x1000 }));
    }

    #[test]
    fn functions_that_never_return() {
        // _start: endbr64; xor %ebp,%ebp; ...; call *__libc_start_main(%rip); hlt
        let start = [0xf3, 0x0f, 0x1e, 0xfa, 0x31, 0xed, 0xff, 0x15, 0, 0, 0, 0, 0xf4];
        assert!(!may_return(&start, 0x1000));
        // push %rbp; mov %rsp,%rbp; mov $1,%edi; call exit
        let dies = [0x55, 0x48, 0x89, 0xe5, 0xbf, 1, 0, 0, 0, 0xe8, 0, 0, 0, 0];
        assert!(!may_return(&dies, 0x1000));
        assert!(may_return(&[0x31, 0xc0, 0xc3], 0x1000)); // xor; ret
        assert!(may_return(&[0xe9, 0x00, 0x10, 0, 0], 0x1000)); // jmp elsewhere: a tail call
        assert!(!may_return(&[0xeb, 0xfe], 0x1000)); // jmp to itself forever
        assert!(may_return(&[0xff, 0xe0], 0x1000)); // jmp *%rax
    }

    #[test]
    fn plans_the_emulated_forms() {
        use Emulation::*;
        assert_eq!(plan_of(&[0xf3, 0x0f, 0x1e, 0xfa]), Plan::Emulate(Nop));
        assert_eq!(plan_of(&[0x0f, 0x1f, 0x44, 0, 0]), Plan::Emulate(Nop));
        assert_eq!(plan_of(&[0x55]), Plan::Emulate(Push(Register::RBP)));
        assert_eq!(plan_of(&[0x41, 0x57]), Plan::Emulate(Push(Register::R15)));
        assert_eq!(plan_of(&[0x5d]), Plan::Emulate(Pop(Register::RBP)));
        assert_eq!(plan_of(&[0x6a, 0xff]), Plan::Emulate(PushImm(u64::MAX)));
        assert_eq!(plan_of(&[0x48, 0x89, 0xe5]), Plan::Emulate(MovReg { dst: Register::RBP, src: Register::RSP }));
        assert_eq!(
            plan_of(&[0x48, 0x83, 0xec, 0x18]),
            Plan::Emulate(AddImm { reg: Register::RSP, imm: 0x18, sub: true })
        );
        assert_eq!(
            plan_of(&[0x48, 0x81, 0xc4, 0x00, 0x01, 0, 0]),
            Plan::Emulate(AddImm { reg: Register::RSP, imm: 0x100, sub: false })
        );
        assert_eq!(plan_of(&[0xeb, 0x10]), Plan::Emulate(Jmp(0x1012)));
        assert_eq!(plan_of(&[0x74, 0xfe]), Plan::Emulate(Jcc { cond: ConditionCode::e, target: 0x1000 }));
        assert_eq!(plan_of(&[0xe8, 0, 0, 0, 0]), Plan::Emulate(Call(0x1005)));
        assert_eq!(plan_of(&[0xc3]), Plan::Emulate(Ret(0)));
        assert_eq!(plan_of(&[0xc2, 0x08, 0x00]), Plan::Emulate(Ret(8)));
        assert_eq!(plan_of(&[0xe2, 0x02]), Plan::Emulate(Loop { cond: ConditionCode::None, target: 0x1004 }));
        assert_eq!(plan_of(&[0xe3, 0x02]), Plan::Emulate(Jrcxz(0x1004)));
        assert!(matches!(plan_of(&[0xff, 0xd0]), Plan::Emulate(CallIndirect(_))));
        assert!(matches!(plan_of(&[0x3e, 0xff, 0x14, 0x25, 0, 0, 0, 0]), Plan::Emulate(CallIndirect(_))));
    }

    #[test]
    fn everything_else_runs_out_of_line() {
        assert_eq!(plan_of(&[0x8d, 0x47, 0x01]), Plan::OutOfLine); // lea 0x1(%rdi),%eax
        assert_eq!(plan_of(&[0x8b, 0x05, 0x10, 0, 0, 0]), Plan::OutOfLine); // mov 0x10(%rip),%eax
        assert_eq!(plan_of(&[0xff, 0xe0]), Plan::OutOfLine); // jmp *%rax
        assert_eq!(plan_of(&[0x83, 0xc0, 0x01]), Plan::OutOfLine); // add $1,%eax (32-bit)
        assert_eq!(plan(&decode_at(&[0xcc], 0).unwrap()), Err(PlanError::Breakpoint));
        assert_eq!(plan(&decode_at(&[0xcb], 0).unwrap()), Err(PlanError::FarTransfer));
        // retf
    }

    #[test]
    fn relocation_retargets_rip_relative_operands() {
        // mov 0x10(%rip),%eax at 0x1000 reads 0x1016; the copy at 0x5000 must read it too.
        let insn = decode_at(&[0x8b, 0x05, 0x10, 0, 0, 0], 0x1000).unwrap();
        let code = relocate(&insn, 0x5000).unwrap();
        let copy = decode_at(&code, 0x5000).unwrap();
        assert_eq!(copy.mnemonic(), Mnemonic::Mov);
        assert_eq!(copy.ip_rel_memory_address(), 0x1016);
        let back = decode_at(&code[copy.len()..], copy.next_ip()).unwrap();
        assert_eq!(back.mnemonic(), Mnemonic::Jmp);
        assert_eq!(back.near_branch_target(), 0x1006);
    }

    #[test]
    fn relocation_keeps_plain_instructions_and_jumps_back() {
        let insn = decode_at(&[0x8d, 0x47, 0x01], 0x7000_0000).unwrap();
        let code = relocate(&insn, 0x7000_8000).unwrap();
        assert_eq!(&code[..3], &[0x8d, 0x47, 0x01]);
        let back = decode_at(&code[3..], 0x7000_8003).unwrap();
        assert_eq!(back.near_branch_target(), 0x7000_0003);
    }

    #[test]
    fn relocation_fails_when_a_rip_relative_target_is_out_of_reach() {
        let insn = decode_at(&[0x8b, 0x05, 0x10, 0, 0, 0], 0x7f00_0000_0000).unwrap();
        assert!(relocate(&insn, 0x1000_0000).is_err());
    }
}
