//! Just enough x86-64 decoding for the out-of-line ptrace engine: the length of the displaced
//! instruction and where its RIP-relative displacement sits, for the plain data-movement and
//! arithmetic forms that start functions (push/pop, mov, lea, add/sub/cmp/test, endbr64, nop).
//! Anything else, relative branches included, is refused rather than guessed.

/// One decoded instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub len: usize,
    /// Byte offset of a RIP-relative disp32, if the instruction has one.
    pub rip_disp_at: Option<usize>,
}

/// Immediate that follows the ModRM operand.
#[derive(Clone, Copy)]
enum Imm {
    None,
    Byte,
    /// 4 bytes, or 2 with an operand-size prefix.
    Word,
}

/// Decodes the instruction at the start of `code`.
pub fn decode(code: &[u8]) -> Result<Insn, String> {
    let byte = |i: usize| code.get(i).copied().ok_or_else(|| "truncated instruction".to_owned());
    let mut i = 0;
    let mut opsize16 = false;
    let mut rep = false;
    loop {
        match byte(i)? {
            0x66 => opsize16 = true,
            0xf3 => rep = true,
            _ => break,
        }
        i += 1;
    }
    let mut rex_w = false;
    if (0x40..=0x4f).contains(&byte(i)?) {
        rex_w = byte(i)? & 0x08 != 0;
        i += 1;
    }
    let op = byte(i)?;
    i += 1;
    let imm = match op {
        0x50..=0x5f | 0x90 => return Ok(Insn { len: i, rip_disp_at: None }),
        0xb8..=0xbf => {
            let len = i + if rex_w { 8 } else { 4 };
            byte(len - 1)?;
            return Ok(Insn { len, rip_disp_at: None });
        }
        0x00..=0x03
        | 0x08..=0x0b
        | 0x10..=0x13
        | 0x18..=0x1b
        | 0x20..=0x23
        | 0x28..=0x2b
        | 0x30..=0x33
        | 0x38..=0x3b
        | 0x63
        | 0x84..=0x8b
        | 0x8d => Imm::None,
        0x6b | 0x83 | 0xc0 | 0xc1 | 0xc6 => Imm::Byte,
        0x69 | 0x81 | 0xc7 => Imm::Word,
        0x0f => {
            let op2 = byte(i)?;
            i += 1;
            match op2 {
                0x1e if rep && byte(i)? == 0xfa => {
                    return Ok(Insn { len: i + 1, rip_disp_at: None });
                }
                0x1f | 0xaf | 0xb6 | 0xb7 | 0xbe | 0xbf => Imm::None,
                0x80..=0x8f => return Err("relative branch: not relocated by this engine".into()),
                _ => return Err(format!("unsupported opcode 0f {op2:02x}")),
            }
        }
        0x70..=0x7f | 0xe8 | 0xe9 | 0xeb => return Err("relative branch: not relocated by this engine".into()),
        _ => return Err(format!("unsupported opcode {op:02x}")),
    };

    let modrm = byte(i)?;
    i += 1;
    let (md, rm) = (modrm >> 6, modrm & 7);
    let mut rip_disp_at = None;
    if md != 3 {
        let mut disp = match md {
            1 => 1,
            2 => 4,
            _ => 0,
        };
        if rm == 4 {
            let sib = byte(i)?;
            i += 1;
            if md == 0 && sib & 7 == 5 {
                disp = 4;
            }
        } else if md == 0 && rm == 5 {
            rip_disp_at = Some(i);
            disp = 4;
        }
        i += disp;
    }
    i += match imm {
        Imm::None => 0,
        Imm::Byte => 1,
        Imm::Word if opsize16 => 2,
        Imm::Word => 4,
    };
    byte(i - 1)?;
    Ok(Insn { len: i, rip_disp_at })
}

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
    let insn = decode(code)?;
    let mut out = code[..insn.len].to_vec();
    if let Some(at) = insn.rip_disp_at {
        let disp = i32::from_le_bytes(out[at..at + 4].try_into().expect("4 bytes"));
        let target = (from + insn.len as u64).wrapping_add(disp as i64 as u64);
        let new_disp = target.wrapping_sub(to + insn.len as u64) as i64;
        let new_disp =
            i32::try_from(new_disp).map_err(|_| format!("slot {to:#x} is out of rip-relative reach of {target:#x}"))?;
        out[at..at + 4].copy_from_slice(&new_disp.to_le_bytes());
    }
    out.extend_from_slice(&absolute_jmp(from + insn.len as u64));
    Ok((out, insn.len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len(code: &[u8]) -> usize {
        decode(code).unwrap().len
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
    fn rip_relative_displacement_is_located() {
        let mov = [0x8b, 0x05, 0x1a, 0x29, 0x00, 0x00]; // mov 0x291a(%rip),%eax
        assert_eq!(decode(&mov).unwrap(), Insn { len: 6, rip_disp_at: Some(2) });
        let cmp = [0x48, 0x83, 0x3d, 1, 2, 3, 4, 0]; // cmpq $0,0x4030201(%rip)
        assert_eq!(decode(&cmp).unwrap(), Insn { len: 8, rip_disp_at: Some(3) });
    }

    #[test]
    fn branches_unknown_opcodes_and_truncation_are_refused() {
        assert!(decode(&[0xe8, 0, 0, 0, 0]).is_err());
        assert!(decode(&[0x74, 0x02]).is_err());
        assert!(decode(&[0x0f, 0x84, 0, 0, 0, 0]).is_err());
        assert!(decode(&[0xc3]).is_err());
        assert!(decode(&[0x48, 0x8d]).is_err());
        assert!(decode(&[]).is_err());
    }

    #[test]
    fn relocation_retargets_the_displacement_and_jumps_back() {
        let from = 0x5555_5555_1780;
        let to = 0x5555_5545_0000;
        let mov = [0x8b, 0x05, 0x1a, 0x29, 0x00, 0x00, 0x01, 0xf8];
        let (bytes, len) = relocate(&mov, from, to).unwrap();
        assert_eq!(len, 6);
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
