//! Trap-free probes: the first instructions of a function replaced by a 5-byte `jmp` to a
//! per-probe stub that calls the handlers directly, as optimized kprobes do.
//!
//! The stub steps over the red zone, saves the registers into a `struct pt_regs` (plus flags
//! and the SSE registers), calls [`jump_hit`] in normal thread context, restores everything
//! (with the handlers' changes), runs the relocated displaced instructions and jumps back. A hit
//! costs tens of nanoseconds instead of a signal.
//!
//! [`plan`] decides, from the function's own code, whether the jump is safe: the covered
//! instructions decode and relocate, nothing in the function branches into the bytes the jump
//! overwrites, the function has no indirect jump (a jump table could land anywhere), and the
//! patched bytes stay in the function, or in the padding after it when the function is shorter
//! than 5 bytes. Anything else keeps the `int3` of the trap path. Only function entries take
//! jumps: an entry is not an exception landing pad or a `setjmp` return point.

use core::fmt;

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionBlock,
    MemoryOperand, Mnemonic, Register,
};

use crate::abi::PtRegs;

/// The length of `jmp rel32`, and its opcode.
pub const JMP_LEN: usize = 5;
pub const JMP_OPCODE: u8 = 0xe9;
/// Bytes reserved for one stub.
pub const STUB_SIZE: usize = 160;

/// Why a probe keeps the `int3` strategy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoJump {
    /// `--no-optimize`.
    Disabled,
    /// No sized symbol covers the address.
    NoFunction,
    /// Not the function's first instruction.
    NotEntry,
    /// Registered while other threads may run the code (or from a handler).
    Live,
    Undecodable {
        at: u64,
    },
    IndirectJump {
        at: u64,
    },
    BranchIntoPatch {
        from: u64,
        to: u64,
    },
    CallNotLast {
        at: u64,
    },
    IndirectCall {
        at: u64,
    },
    Unrelocatable {
        at: u64,
        why: String,
    },
    TooShort {
        len: u64,
    },
    /// Another probe point lies in the bytes the jump would overwrite.
    ProbeInside {
        at: u64,
    },
    Stub(String),
}

impl fmt::Display for NoJump {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            NoJump::Disabled => write!(f, "jump probes disabled (--no-optimize)"),
            NoJump::NoFunction => write!(f, "no function symbol covers it"),
            NoJump::NotEntry => write!(f, "not a function entry"),
            NoJump::Live => write!(f, "registered while other threads run (live patching uses int3)"),
            NoJump::Undecodable { at } => write!(f, "the function does not decode at {at:#x}"),
            NoJump::IndirectJump { at } => write!(f, "indirect jump at {at:#x} (jump table)"),
            NoJump::BranchIntoPatch { from, to } => {
                write!(f, "branch at {from:#x} lands in the patched bytes at {to:#x}")
            }
            NoJump::CallNotLast { at } => write!(f, "call at {at:#x} returns into the patched bytes"),
            NoJump::IndirectCall { at } => write!(f, "indirect call at {at:#x} in the patched bytes"),
            NoJump::Unrelocatable { at, why } => write!(f, "instruction at {at:#x} cannot be relocated: {why}"),
            NoJump::TooShort { len } => write!(f, "function of {len} bytes with no free padding after it"),
            NoJump::ProbeInside { at } => write!(f, "another probe at {at:#x} lies in the patched bytes"),
            NoJump::Stub(why) => write!(f, "stub: {why}"),
        }
    }
}

/// What the jump replaces: the covered instructions and how many bytes are overwritten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JumpPlan {
    pub covered: Vec<Instruction>,
    pub patch_len: usize,
}

fn decode_all(bytes: &[u8], ip: u64) -> Result<Vec<Instruction>, NoJump> {
    let mut decoder = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let mut out = Vec::new();
    while decoder.can_decode() {
        let at = decoder.ip();
        let insn = decoder.decode();
        if insn.is_invalid() {
            return Err(NoJump::Undecodable { at });
        }
        out.push(insn);
    }
    Ok(out)
}

/// Whether the first `need` bytes of `bytes` are alignment padding: whole nop or int3
/// instructions (a multi-byte nop may run past `need`).
fn is_padding(bytes: &[u8], need: usize) -> bool {
    let mut decoder = Decoder::new(64, bytes, DecoderOptions::NONE);
    let mut covered = 0;
    while covered < need {
        if !decoder.can_decode() {
            return false;
        }
        let insn = decoder.decode();
        if insn.is_invalid() || !matches!(insn.mnemonic(), Mnemonic::Nop | Mnemonic::Int3) {
            return false;
        }
        covered += insn.len();
    }
    true
}

/// Decides whether the entry `addr` of the function `func` (its bytes, as before any probe,
/// starting at `addr`) can take a jump. `padding` are the bytes between the function's end and
/// the next symbol.
pub fn plan(func: &[u8], addr: u64, padding: &[u8]) -> Result<JumpPlan, NoJump> {
    let insns = decode_all(func, addr)?;
    if let Some(i) = insns.iter().find(|i| i.flow_control() == FlowControl::IndirectBranch) {
        return Err(NoJump::IndirectJump { at: i.ip() });
    }
    let mut covered = Vec::new();
    let mut len = 0;
    for insn in &insns {
        if len >= JMP_LEN {
            break;
        }
        covered.push(*insn);
        len += insn.len();
    }
    let last = covered.last().copied().ok_or(NoJump::TooShort { len: 0 })?;
    let ends_flow = matches!(last.flow_control(), FlowControl::Return | FlowControl::UnconditionalBranch);
    let patch_len = if len >= JMP_LEN {
        len
    } else if ends_flow && is_padding(padding, JMP_LEN - len) {
        JMP_LEN
    } else {
        return Err(NoJump::TooShort { len: func.len() as u64 });
    };
    for (k, insn) in covered.iter().enumerate() {
        let at = insn.ip();
        match insn.flow_control() {
            FlowControl::Call if insn.is_call_near() && k + 1 != covered.len() => {
                return Err(NoJump::CallNotLast { at })
            }
            FlowControl::IndirectCall => return Err(NoJump::IndirectCall { at }),
            FlowControl::Interrupt if matches!(insn.mnemonic(), Mnemonic::Int3 | Mnemonic::Int1) => {
                return Err(NoJump::Unrelocatable { at, why: "breakpoint".into() })
            }
            FlowControl::XbeginXabortXend => return Err(NoJump::Unrelocatable { at, why: "transactional".into() }),
            _ if insn.is_jmp_far()
                || insn.is_call_far()
                || insn.is_jmp_far_indirect()
                || insn.is_call_far_indirect() =>
            {
                return Err(NoJump::Unrelocatable { at, why: "far transfer".into() })
            }
            _ => {}
        }
    }
    let inside = |t: u64| t > addr && t < addr + patch_len as u64;
    for insn in &insns {
        let target = match insn.flow_control() {
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
                if insn.op0_kind() == iced_x86::OpKind::NearBranch64 =>
            {
                insn.near_branch_target()
            }
            _ => continue,
        };
        if inside(target) {
            return Err(NoJump::BranchIntoPatch { from: insn.ip(), to: target });
        }
    }
    Ok(JumpPlan { covered, patch_len })
}

/// Where the relocated instructions start in a stub (after [`stub_head`]).
pub const BODY_OFFSET: usize = 31;

/// The fixed head of every stub: step over the red zone, leave the probe point's address on
/// the stack, and call the common save/restore code through a pointer stored after the stub.
fn stub_head(pp: u64) -> Vec<u8> {
    let mut head = vec![0x48, 0x8d, 0xa4, 0x24, 0x78, 0xff, 0xff, 0xff]; // lea -0x88(%rsp),%rsp
    head.push(0x50); // push %rax
    head.extend([0x48, 0xb8]); // movabs $pp,%rax
    head.extend(pp.to_le_bytes());
    head.extend([0x48, 0x89, 0x44, 0x24, 0x08]); // mov %rax,0x8(%rsp)
    head.push(0x58); // pop %rax
    head.extend([0xff, 0x15, 0, 0, 0, 0]); // call *disp32(%rip), patched below
    head
}

/// The stub at `stub` for probe point `pp`: head, relocated covered instructions, the jump
/// back to the end of the patched bytes, and the address of `common`.
pub fn build_stub(plan: &JumpPlan, stub: u64, pp: u64, common: u64) -> Result<Vec<u8>, NoJump> {
    let mut code = stub_head(pp);
    let body_ip = stub + code.len() as u64;
    let err = |e: iced_x86::IcedError| NoJump::Stub(e.to_string());
    let resume = plan.covered[0].ip() + plan.patch_len as u64;
    let mut body = Vec::new();
    for insn in &plan.covered {
        if insn.is_call_near() {
            // The call's return address is the original one, so the callee returns into the
            // program and unwinders see the real caller.
            let ret = insn.next_ip();
            body.push(
                Instruction::with2(Code::Lea_r64_m, Register::RSP, MemoryOperand::with_base_displ(Register::RSP, -8))
                    .map_err(err)?,
            );
            body.push(
                Instruction::with2(Code::Mov_rm32_imm32, MemoryOperand::with_base(Register::RSP), ret as u32)
                    .map_err(err)?,
            );
            body.push(
                Instruction::with2(
                    Code::Mov_rm32_imm32,
                    MemoryOperand::with_base_displ(Register::RSP, 4),
                    (ret >> 32) as u32,
                )
                .map_err(err)?,
            );
            body.push(Instruction::with_branch(Code::Jmp_rel32_64, insn.near_branch_target()).map_err(err)?);
        } else {
            body.push(*insn);
        }
    }
    let last = plan.covered.last().expect("a plan covers at least one instruction");
    if !(last.is_call_near() || matches!(last.flow_control(), FlowControl::Return | FlowControl::UnconditionalBranch)) {
        body.push(Instruction::with_branch(Code::Jmp_rel32_64, resume).map_err(err)?);
    }
    let encoded = BlockEncoder::encode(64, InstructionBlock::new(&body, body_ip), BlockEncoderOptions::NONE)
        .map_err(|e| NoJump::Unrelocatable { at: plan.covered[0].ip(), why: e.to_string() })?;
    code.extend(encoded.code_buffer);
    while !code.len().is_multiple_of(8) {
        code.push(0xcc);
    }
    let data = stub + code.len() as u64;
    let call_end = stub + stub_head(pp).len() as u64;
    let disp = (data as i64 - call_end as i64) as i32;
    let at = stub_head(pp).len() - 4;
    code[at..at + 4].copy_from_slice(&disp.to_le_bytes());
    code.extend(common.to_le_bytes());
    if code.len() > STUB_SIZE {
        return Err(NoJump::Stub(format!("{} bytes, more than a stub holds", code.len())));
    }
    Ok(code)
}

/// The bytes written over the patched range: `jmp stub`, then `int3` filler.
pub fn patch_bytes(addr: u64, stub: u64, patch_len: usize) -> Vec<u8> {
    let rel = (stub as i64 - (addr as i64 + JMP_LEN as i64)) as i32;
    let mut bytes = vec![JMP_OPCODE];
    bytes.extend(rel.to_le_bytes());
    bytes.resize(patch_len, 0xcc);
    bytes
}

/// Called by the common stub code with the registers it saved; runs the handlers of the probe
/// point and gives the address to resume at (normal context).
extern "C" fn jump_hit(regs: &mut PtRegs) -> usize {
    // The common code pushed 21 registers below the stub's return address and the probe point.
    let frame = regs as *mut PtRegs as usize + 21 * 8;
    // SAFETY: the stub left its return address and the probe point's address there.
    let (resume, pp) = unsafe { (*(frame as *const usize), *((frame + 8) as *const usize)) };
    regs.rsp = (frame + 16 + 128) as u64;
    regs.cs = 0x33;
    regs.ss = 0x2b;
    // SAFETY: the stub was built for this probe point, which is never freed.
    let pp = unsafe { &*(pp as *const crate::registry::ProbePoint) };
    crate::trap::direct_hit(pp, regs, resume)
}

core::arch::global_asm!(
    ".pushsection .text.uprobe_jump_common,\"ax\",@progbits",
    ".globl uprobe_jump_common",
    ".hidden uprobe_jump_common",
    ".type uprobe_jump_common,@function",
    ".p2align 4",
    "uprobe_jump_common:",
    save_pt_regs_asm!(),
    "mov rdi, rbx",
    "call {jump_hit}",
    "mov qword ptr [rbx + 168], rax",
    restore_pt_regs_asm!(),
    "ret 136",     // to the resume address; drops the probe point and the red zone
    ".size uprobe_jump_common, . - uprobe_jump_common",
    ".popsection",
    jump_hit = sym jump_hit,
    vector_area = sym crate::vector::AREA_SIZE,
    vector_mask = sym crate::vector::MASK,
);

extern "C" {
    fn uprobe_jump_common();
}

/// The address stubs call.
pub fn common_entry() -> u64 {
    uprobe_jump_common as *const () as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode_at;

    const AT: u64 = 0x40_1000;

    #[test]
    fn plans_a_classic_prologue() {
        // endbr64; push %rbp; mov %rsp,%rbp; mov %edi,%eax; pop %rbp; ret
        let f = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x89, 0xf8, 0x5d, 0xc3];
        let p = plan(&f, AT, &[]).unwrap();
        assert_eq!(p.covered.len(), 2);
        assert_eq!(p.patch_len, 5);
    }

    #[test]
    fn refuses_branches_into_the_patched_bytes() {
        // xor %eax,%eax; inc %eax (2 bytes, at +2); cmp $9,%eax; jne +2 (back to inc); ret
        let f = [0x31, 0xc0, 0xff, 0xc0, 0x83, 0xf8, 0x09, 0x75, 0xf9, 0xc3];
        assert_eq!(plan(&f, AT, &[]), Err(NoJump::BranchIntoPatch { from: AT + 7, to: AT + 2 }));
    }

    #[test]
    fn refuses_jump_tables() {
        // mov %edi,%eax; jmp *(%rax); ret  (any indirect jump)
        let f = [0x89, 0xf8, 0x90, 0x90, 0x90, 0xff, 0x20, 0xc3];
        assert_eq!(plan(&f, AT, &[]), Err(NoJump::IndirectJump { at: AT + 5 }));
    }

    #[test]
    fn a_call_must_end_the_patched_bytes() {
        // call +0; nop; ret: the call is 5 bytes and the last covered one
        let f = [0xe8, 0, 0, 0, 0, 0x90, 0xc3];
        assert!(plan(&f, AT, &[]).is_ok());
        // push %rbx; call +0; the call covers bytes 1..6 and ends the range
        let f = [0x53, 0xe8, 0, 0, 0, 0, 0xc3];
        assert_eq!(plan(&f, AT, &[]).unwrap().patch_len, 6);
        // xor; call *%rax: indirect calls stay on int3
        let f = [0x31, 0xc0, 0xff, 0xd0, 0x90, 0xc3];
        assert_eq!(plan(&f, AT, &[]), Err(NoJump::IndirectCall { at: AT + 2 }));
    }

    #[test]
    fn short_functions_use_padding_only_after_a_final_ret() {
        // lea 0x1(%rdi),%eax; ret  (4 bytes), then int3 padding
        let f = [0x8d, 0x47, 0x01, 0xc3];
        assert_eq!(plan(&f, AT, &[0xcc; 12]).unwrap().patch_len, 5);
        // cs nopw 0x0(%rax,%rax,1): one 10-byte nop
        let nopw = [0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x90, 0x90];
        assert_eq!(plan(&f, AT, &nopw).unwrap().patch_len, 5);
        assert_eq!(plan(&f, AT, &nopw[..3]), Err(NoJump::TooShort { len: 4 }));
        assert_eq!(plan(&f, AT, &[0x55]), Err(NoJump::TooShort { len: 4 }));
        assert_eq!(plan(&f, AT, &[]), Err(NoJump::TooShort { len: 4 }));
    }

    #[test]
    fn body_offset_matches_the_head() {
        assert_eq!(stub_head(0).len(), BODY_OFFSET);
    }

    #[test]
    fn stub_relocates_and_jumps_back() {
        // mov 0x100(%rip),%eax (6 bytes) at AT; the stub runs it with the same target
        let f = [0x8b, 0x05, 0x00, 0x01, 0, 0, 0xc3];
        let p = plan(&f, AT, &[]).unwrap();
        let stub = AT + 0x10_0000;
        let code = build_stub(&p, stub, 0x1234, 0x7f00_0000_0000).unwrap();
        let head = stub_head(0x1234).len();
        let moved = decode_at(&code[head..], stub + head as u64).unwrap();
        assert_eq!(moved.ip_rel_memory_address(), AT + 6 + 0x100);
        let back = decode_at(&code[head + moved.len()..], moved.next_ip()).unwrap();
        assert_eq!(back.near_branch_target(), AT + 6);
        let call = decode_at(&code[head - 6..], stub + head as u64 - 6).unwrap();
        assert_eq!(call.mnemonic(), Mnemonic::Call);
        let slot = call.ip_rel_memory_address() - stub;
        assert_eq!(&code[slot as usize..slot as usize + 8], &0x7f00_0000_0000u64.to_le_bytes());
    }

    #[test]
    fn stub_replaces_a_final_call_keeping_the_real_return_address() {
        let f = [0x53, 0xe8, 0x10, 0, 0, 0, 0xc3];
        let p = plan(&f, AT, &[]).unwrap();
        let stub = AT + 0x1000;
        let code = build_stub(&p, stub, 1, 2).unwrap();
        let head = stub_head(1).len();
        let mut decoder = Decoder::with_ip(64, &code[head..], stub + head as u64, DecoderOptions::NONE);
        let mnemonics: Vec<Mnemonic> = (0..5).map(|_| decoder.decode().mnemonic()).collect();
        assert_eq!(mnemonics, [Mnemonic::Push, Mnemonic::Lea, Mnemonic::Mov, Mnemonic::Mov, Mnemonic::Jmp]);
        let patch = patch_bytes(AT, stub, p.patch_len);
        assert_eq!(patch.len(), 6);
        assert_eq!(decode_at(&patch, AT).unwrap().near_branch_target(), stub);
        assert_eq!(patch[5], 0xcc);
    }
}
