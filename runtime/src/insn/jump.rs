//! Trap-free probes: whether the first instructions of a function may be replaced by a
//! 5-byte `jmp` to a per-probe stub (built by [`crate::insn::stub`]), as optimized kprobes
//! do, and the bytes of that jump. Pure: bytes in, answers out.
//!
//! [`plan`] decides, from the function's own code, whether the jump is safe: the covered
//! instructions decode and relocate, nothing in the function branches into the bytes the jump
//! overwrites, the function has no indirect jump (a jump table could land anywhere), and the
//! patched bytes stay in the function, or in the padding after it when the function is shorter
//! than 5 bytes. Anything else keeps the `int3` of the trap path. Only function entries take
//! jumps: an entry is not an exception landing pad or a `setjmp` return point.

use core::fmt;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic};

/// The length of `jmp rel32`, and its opcode.
pub const JMP_LEN: usize = 5;
pub const JMP_OPCODE: u8 = 0xe9;

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
    /// A thread held stopped (attach) would resume inside the bytes the jump would overwrite.
    ThreadInside {
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
            NoJump::ThreadInside { at } => write!(f, "a stopped thread resumes at {at:#x}, in the patched bytes"),
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
    plan_at(func, addr, addr, padding)
}

/// [`plan`] for an instruction boundary `addr` inside the function that starts at `start`
/// (a USDT marker's `nop`): the same checks, branches into the patched bytes searched in the
/// whole function.
pub fn plan_at(func: &[u8], start: u64, addr: u64, padding: &[u8]) -> Result<JumpPlan, NoJump> {
    let insns = decode_all(func, start)?;
    if let Some(i) = insns.iter().find(|i| i.flow_control() == FlowControl::IndirectBranch) {
        return Err(NoJump::IndirectJump { at: i.ip() });
    }
    let mut covered = Vec::new();
    let mut len = 0;
    for insn in insns.iter().skip_while(|i| i.ip() != addr) {
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

/// The bytes written over the patched range, into `out` (its length is the patch length):
/// `jmp stub`, then `int3` filler. No allocation: placement writes these while it may not.
pub fn patch_bytes(addr: u64, stub: u64, out: &mut [u8]) {
    let rel = (stub as i64 - (addr as i64 + JMP_LEN as i64)) as i32;
    out.fill(0xcc);
    out[0] = JMP_OPCODE;
    out[1..JMP_LEN].copy_from_slice(&rel.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn plans_inside_a_function_and_sees_branches_from_before() {
        // xor %eax,%eax; nop (a marker, at +2); add $1,%eax; ret
        let f = [0x31, 0xc0, 0x90, 0x83, 0xc0, 0x01, 0xc3, 0xcc, 0xcc];
        let p = plan_at(&f, AT, AT + 2, &[]).unwrap();
        assert_eq!((p.covered[0].ip(), p.covered.len(), p.patch_len), (AT + 2, 3, 5));
        // jne to +3 from before the nop: lands inside the patched bytes
        let f = [0x75, 0x01, 0x90, 0x83, 0xc0, 0x01, 0x90, 0xc3];
        assert_eq!(plan_at(&f, AT, AT + 2, &[]), Err(NoJump::BranchIntoPatch { from: AT, to: AT + 3 }));
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
}
