//! The out-of-line copy of a displaced instruction for the ptrace engine, decoded and
//! re-encoded by iced-x86 (RIP-relative operands re-targeted at the copy's address). Only
//! instructions that go on to the next one are taken: a branch, call or return at the probed
//! address is refused rather than relocated.

use iced_x86::{BlockEncoder, BlockEncoderOptions, Decoder, DecoderOptions, FlowControl, InstructionBlock};

/// `jmp *0(%rip)` followed by the absolute target: reaches anywhere.
pub fn absolute_jmp(target: u64) -> [u8; 14] {
    let mut out = [0u8; 14];
    out[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    out[6..].copy_from_slice(&target.to_le_bytes());
    out
}

/// An out-of-line copy of the instruction at `from` (whose bytes start `code`), to run at
/// `to`, followed by a jump back to the next instruction at `from`. Returns the bytes and the
/// length of the displaced instruction.
pub fn relocate(code: &[u8], from: u64, to: u64) -> Result<(Vec<u8>, usize), String> {
    let insn = Decoder::with_ip(64, code, from, DecoderOptions::NONE).decode();
    if insn.is_invalid() {
        return Err(format!("no instruction at {from:#x} (truncated or invalid)"));
    }
    if insn.flow_control() != FlowControl::Next {
        return Err(format!("{:?} at {from:#x} changes the flow of control", insn.mnemonic()));
    }
    let block = InstructionBlock::new(std::slice::from_ref(&insn), to);
    let encoded = BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
        .map_err(|e| format!("{:?} at {from:#x} cannot run at {to:#x}: {e}", insn.mnemonic()))?;
    let mut out = encoded.code_buffer;
    out.extend_from_slice(&absolute_jmp(insn.next_ip()));
    Ok((out, insn.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len(code: &[u8]) -> usize {
        relocate(code, 0x1000, 0x2000).unwrap().1
    }

    #[test]
    fn lengths_of_function_entry_forms() {
        assert_eq!(len(&[0x55]), 1); // push %rbp
        assert_eq!(len(&[0x41, 0x57]), 2); // push %r15
        assert_eq!(len(&[0x48, 0x89, 0xe5]), 3); // mov %rsp,%rbp
        assert_eq!(len(&[0x48, 0x8d, 0x47, 0x01]), 4); // lea 0x1(%rdi),%rax
        assert_eq!(len(&[0x48, 0x83, 0xec, 0x18]), 4); // sub $0x18,%rsp
        assert_eq!(len(&[0x48, 0x81, 0xec, 0, 1, 0, 0]), 7); // sub $0x100,%rsp
        assert_eq!(len(&[0xf3, 0x0f, 0x1e, 0xfa]), 4); // endbr64
        assert_eq!(len(&[0x8b, 0x44, 0x24, 0x08]), 4); // mov 0x8(%rsp),%eax
        assert_eq!(len(&[0x8b, 0x04, 0x25, 1, 2, 3, 4]), 7); // mov 0x4030201,%eax (SIB, no base)
        assert_eq!(len(&[0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8]), 10); // movabs
        assert_eq!(len(&[0x66, 0xc7, 0x07, 1, 0]), 5); // movw $1,(%rdi)
        assert_eq!(len(&[0x0f, 0x1f, 0x44, 0x00, 0x00]), 5); // nopl 0(%rax,%rax,1)
    }

    #[test]
    fn branches_and_truncation_are_refused() {
        for code in [&[0xe8, 0, 0, 0, 0][..], &[0x74, 0x02], &[0x0f, 0x84, 0, 0, 0, 0], &[0xc3], &[0x48, 0x8d], &[]] {
            assert!(relocate(code, 0x1000, 0x2000).is_err(), "{code:x?}");
        }
    }

    #[test]
    fn relocation_retargets_the_displacement_and_jumps_back() {
        let from = 0x5555_5555_1780;
        let to = 0x5555_5545_0000;
        let mov = [0x8b, 0x05, 0x1a, 0x29, 0x00, 0x00, 0x01, 0xf8]; // mov 0x291a(%rip),%eax
        let (bytes, len) = relocate(&mov, from, to).unwrap();
        assert_eq!(len, 6);
        assert_eq!(bytes[..2], [0x8b, 0x05]);
        let disp = i32::from_le_bytes(bytes[2..6].try_into().unwrap());
        assert_eq!((to + 6).wrapping_add(disp as i64 as u64), from + 6 + 0x291a, "same absolute target");
        assert_eq!(&bytes[6..], &absolute_jmp(from + 6));
    }

    #[test]
    fn relocation_copies_position_independent_instructions_verbatim() {
        let (bytes, len) = relocate(&[0x55, 0x48, 0x89, 0xe5], 0x1000, 0x9000).unwrap();
        assert_eq!(len, 1);
        assert_eq!(bytes[0], 0x55);
        assert_eq!(&bytes[1..], &absolute_jmp(0x1001));
    }

    #[test]
    fn relocation_refuses_a_slot_out_of_reach() {
        let mov = [0x8b, 0x05, 0, 0, 0, 0];
        assert!(relocate(&mov, 0x7fff_0000_0000, 0x1000).is_err());
    }
}
