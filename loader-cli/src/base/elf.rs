//! What uprobe-run needs to know about an ELF file before running it: class, byte order,
//! machine, type and whether it asks for a dynamic loader (pure functions over the file's
//! first bytes); and where its segments lie, for file offsets ([`Segments`]).

use object::elf;
use thiserror::Error;

/// Where each loadable segment of a file lies: (link-time address, file offset, size in the
/// file). Turns the addresses of symbols, notes and DWARF into the file offsets that
/// tracefs-style definitions take.
#[derive(Clone, Debug, Default)]
pub struct Segments(Vec<(u64, u64, u64)>);

impl Segments {
    /// The loadable segments of `file`.
    pub fn of(file: &object::File<'_>) -> Segments {
        use object::{Object, ObjectSegment};
        Segments(
            file.segments()
                .map(|s| {
                    let (offset, size) = s.file_range();
                    (s.address(), offset, size)
                })
                .collect(),
        )
    }

    /// The file offset of link-time address `vaddr`; None outside every segment's bytes.
    pub fn offset_of(&self, vaddr: u64) -> Option<u64> {
        self.0.iter().find(|&&(v, _, n)| v <= vaddr && vaddr - v < n).map(|&(v, o, _)| o + (vaddr - v))
    }
}

/// Size of an ELF64 file header.
pub const HEADER_LEN: usize = 64;
const PHDR64_LEN: usize = 56;
/// Indexes into `e_ident`.
const EI_CLASS: usize = 4;
const EI_DATA: usize = 5;

/// Why a file cannot be used. Display is the reason alone; the caller names the file.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ElfProblem {
    #[error("not an ELF file")]
    NotElf,
    #[error("script ({0}), not an ELF program: run its interpreter under uprobe-run instead")]
    Script(String),
    #[error("32-bit ELF (ELFCLASS32): only ELF64 x86-64 is supported")]
    Class32,
    #[error("ELF class {0} is neither ELFCLASS32 nor ELFCLASS64")]
    UnknownClass(u8),
    #[error("big-endian ELF: only ELF64 x86-64 is supported")]
    BigEndian,
    #[error("ELF for {name} (e_machine {0}), not x86-64", name = machine_name(*.0))]
    Machine(u16),
    #[error("truncated ELF file")]
    Truncated,
    #[error("ELF type {}, not an executable", type_name(*.0))]
    NotExecutable(u16),
    #[error("ELF type {}, not a shared object (ET_DYN)", type_name(*.0))]
    NotSharedObject(u16),
}

/// The facts read from a valid ELF64 x86-64 little-endian file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elf {
    /// `e_type`: ET_EXEC, ET_DYN, ...
    pub e_type: u16,
    /// A PT_INTERP program header: the kernel starts the dynamic loader, which honours
    /// LD_PRELOAD.
    pub has_interp: bool,
}

impl Elf {
    /// An executable is ET_EXEC or ET_DYN (position-independent).
    pub fn check_executable(self) -> Result<Self, ElfProblem> {
        match self.e_type {
            elf::ET_EXEC | elf::ET_DYN => Ok(self),
            other => Err(ElfProblem::NotExecutable(other)),
        }
    }

    pub fn check_shared_object(self) -> Result<Self, ElfProblem> {
        match self.e_type {
            elf::ET_DYN => Ok(self),
            other => Err(ElfProblem::NotSharedObject(other)),
        }
    }
}

/// Checks the file header and returns how many bytes from the start of the file hold the
/// header and the program header table, which [`inspect`] needs.
pub fn prefix_len(header: &[u8]) -> Result<usize, ElfProblem> {
    let h = Header::parse(header)?;
    if h.phnum == 0 {
        return Ok(HEADER_LEN);
    }
    if usize::from(h.phentsize) < PHDR64_LEN {
        return Err(ElfProblem::Truncated);
    }
    let table = u64::from(h.phentsize) * u64::from(h.phnum);
    h.phoff
        .checked_add(table)
        .and_then(|end| usize::try_from(end).ok())
        .map(|end| end.max(HEADER_LEN))
        .ok_or(ElfProblem::Truncated)
}

/// Reads an ELF64 x86-64 file from its first [`prefix_len`] bytes.
/// Whether the ELF file `data` defines (exports from its dynamic symbol table) any of
/// `names`; None if its symbols cannot be read.
pub fn exports_any(data: &[u8], names: &[&str]) -> Option<bool> {
    use object::{Object, ObjectSymbol};
    let file = object::File::parse(data).ok()?;
    Some(
        file.dynamic_symbols()
            .any(|s| !s.is_undefined() && s.is_global() && s.name().is_ok_and(|n| names.contains(&n))),
    )
}

/// Whether the ELF file `data` imports (leaves undefined in its dynamic symbol table) any of
/// `names`.
pub fn imports_any(data: &[u8], names: &[&str]) -> bool {
    use object::{Object, ObjectSymbol};
    object::File::parse(data).is_ok_and(|file| {
        file.dynamic_symbols().any(|s| s.is_undefined() && s.name().is_ok_and(|n| names.contains(&n)))
    })
}

pub fn inspect(bytes: &[u8]) -> Result<Elf, ElfProblem> {
    let h = Header::parse(bytes)?;
    let end = prefix_len(bytes)?;
    let table = bytes.get(..end).ok_or(ElfProblem::Truncated)?;
    let phoff = h.phoff as usize; // fits: bounded by `end`
    let has_interp = (0..usize::from(h.phnum)).any(|i| {
        let at = phoff + i * usize::from(h.phentsize);
        u32_at(table, at) == Some(elf::PT_INTERP)
    });
    Ok(Elf { e_type: h.e_type, has_interp })
}

struct Header {
    e_type: u16,
    phoff: u64,
    phentsize: u16,
    phnum: u16,
}

impl Header {
    fn parse(bytes: &[u8]) -> Result<Self, ElfProblem> {
        if let Some(rest) = bytes.strip_prefix(b"#!") {
            let line = rest.split(|&b| b == b'\n').next().unwrap_or_default();
            let interp = String::from_utf8_lossy(line).trim().to_owned();
            return Err(ElfProblem::Script(format!("#!{interp}")));
        }
        if !bytes.starts_with(&elf::ELFMAG) {
            return Err(ElfProblem::NotElf);
        }
        match bytes.get(EI_CLASS) {
            Some(&elf::ELFCLASS64) => {}
            Some(&elf::ELFCLASS32) => return Err(ElfProblem::Class32),
            Some(&other) => return Err(ElfProblem::UnknownClass(other)),
            None => return Err(ElfProblem::Truncated),
        }
        match bytes.get(EI_DATA) {
            Some(&elf::ELFDATA2LSB) => {}
            Some(_) => return Err(ElfProblem::BigEndian),
            None => return Err(ElfProblem::Truncated),
        }
        if bytes.len() < HEADER_LEN {
            return Err(ElfProblem::Truncated);
        }
        let header = Header {
            e_type: u16_at(bytes, 16).ok_or(ElfProblem::Truncated)?,
            phoff: u64_at(bytes, 32).ok_or(ElfProblem::Truncated)?,
            phentsize: u16_at(bytes, 54).ok_or(ElfProblem::Truncated)?,
            phnum: u16_at(bytes, 56).ok_or(ElfProblem::Truncated)?,
        };
        match u16_at(bytes, 18) {
            Some(elf::EM_X86_64) => Ok(header),
            Some(other) => Err(ElfProblem::Machine(other)),
            None => Err(ElfProblem::Truncated),
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn machine_name(machine: u16) -> &'static str {
    match machine {
        elf::EM_386 => "i386",
        elf::EM_ARM => "ARM",
        elf::EM_AARCH64 => "AArch64",
        elf::EM_RISCV => "RISC-V",
        elf::EM_PPC64 => "PowerPC64",
        elf::EM_S390 => "s390",
        elf::EM_MIPS => "MIPS",
        elf::EM_LOONGARCH => "LoongArch",
        _ => "another machine",
    }
}

fn type_name(e_type: u16) -> String {
    match e_type {
        elf::ET_NONE => "ET_NONE".to_owned(),
        elf::ET_REL => "ET_REL (relocatable object)".to_owned(),
        elf::ET_EXEC => "ET_EXEC (executable)".to_owned(),
        elf::ET_DYN => "ET_DYN".to_owned(),
        elf::ET_CORE => "ET_CORE (core dump)".to_owned(),
        other => format!("{other:#x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_turn_addresses_into_file_offsets() {
        let segs = Segments(vec![(0x1000, 0x800, 0x100), (u64::MAX - 0xf, 0x2000, 0x10)]);
        assert_eq!(segs.offset_of(0x1000), Some(0x800));
        assert_eq!(segs.offset_of(0x10ff), Some(0x8ff));
        assert_eq!(segs.offset_of(0x1100), None);
        assert_eq!(segs.offset_of(0xfff), None);
        // No overflow at the top of the address space.
        assert_eq!(segs.offset_of(u64::MAX), Some(0x200f));
    }

    /// A little-endian ELF64 header followed by `phdrs` program headers of the given types.
    fn elf64(e_type: u16, machine: u16, phdrs: &[u32]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[..4].copy_from_slice(&elf::ELFMAG);
        b[EI_CLASS] = elf::ELFCLASS64;
        b[EI_DATA] = elf::ELFDATA2LSB;
        b[6] = elf::EV_CURRENT;
        b[16..18].copy_from_slice(&e_type.to_le_bytes());
        b[18..20].copy_from_slice(&machine.to_le_bytes());
        b[32..40].copy_from_slice(&(HEADER_LEN as u64).to_le_bytes());
        b[52..54].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        b[54..56].copy_from_slice(&(PHDR64_LEN as u16).to_le_bytes());
        b[56..58].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
        for &p_type in phdrs {
            let mut ph = [0u8; PHDR64_LEN];
            ph[..4].copy_from_slice(&p_type.to_le_bytes());
            b.extend_from_slice(&ph);
        }
        b
    }

    fn check(bytes: &[u8]) -> Result<Elf, ElfProblem> {
        let len = prefix_len(&bytes[..HEADER_LEN.min(bytes.len())])?;
        inspect(&bytes[..len.min(bytes.len())])
    }

    #[test]
    fn dynamic_pie_has_interp() {
        let b = elf64(elf::ET_DYN, elf::EM_X86_64, &[elf::PT_PHDR, elf::PT_INTERP, elf::PT_LOAD]);
        assert_eq!(prefix_len(&b[..HEADER_LEN]), Ok(HEADER_LEN + 3 * PHDR64_LEN));
        let e = check(&b).unwrap();
        assert_eq!(e, Elf { e_type: elf::ET_DYN, has_interp: true });
        assert!(e.check_executable().is_ok());
        assert!(e.check_shared_object().is_ok());
    }

    #[test]
    fn static_executable_has_no_interp() {
        let b = elf64(elf::ET_EXEC, elf::EM_X86_64, &[elf::PT_LOAD, elf::PT_NOTE]);
        let e = check(&b).unwrap();
        assert!(!e.has_interp);
        assert!(e.check_executable().is_ok());
        assert_eq!(
            e.check_shared_object().unwrap_err().to_string(),
            "ELF type ET_EXEC (executable), not a shared object (ET_DYN)"
        );
    }

    #[test]
    fn no_program_headers() {
        let b = elf64(elf::ET_REL, elf::EM_X86_64, &[]);
        let e = check(&b).unwrap();
        assert!(!e.has_interp);
        assert_eq!(
            e.check_executable().unwrap_err().to_string(),
            "ELF type ET_REL (relocatable object), not an executable"
        );
    }

    #[test]
    fn refuses_other_classes_orders_and_machines() {
        let mut b32 = elf64(elf::ET_EXEC, elf::EM_386, &[]);
        b32[EI_CLASS] = elf::ELFCLASS32;
        assert_eq!(check(&b32), Err(ElfProblem::Class32));

        let mut big = elf64(elf::ET_EXEC, elf::EM_X86_64, &[]);
        big[EI_DATA] = elf::ELFDATA2MSB;
        assert_eq!(check(&big), Err(ElfProblem::BigEndian));

        let arm = elf64(elf::ET_DYN, elf::EM_AARCH64, &[elf::PT_INTERP]);
        assert_eq!(check(&arm), Err(ElfProblem::Machine(elf::EM_AARCH64)));
        assert_eq!(ElfProblem::Machine(elf::EM_AARCH64).to_string(), "ELF for AArch64 (e_machine 183), not x86-64");

        let mut odd = elf64(elf::ET_EXEC, elf::EM_X86_64, &[]);
        odd[EI_CLASS] = 7;
        assert_eq!(check(&odd), Err(ElfProblem::UnknownClass(7)));
    }

    #[test]
    fn refuses_non_elf_and_scripts() {
        assert_eq!(check(b""), Err(ElfProblem::NotElf));
        assert_eq!(check(b"hello world\n"), Err(ElfProblem::NotElf));
        assert_eq!(check(b"\x7fEL"), Err(ElfProblem::NotElf));
        assert_eq!(check(b"#!/bin/sh -e\necho hi\n"), Err(ElfProblem::Script("#!/bin/sh -e".to_owned())));
    }

    #[test]
    fn refuses_truncated_files() {
        let b = elf64(elf::ET_DYN, elf::EM_X86_64, &[elf::PT_INTERP]);
        assert_eq!(check(&b[..40]), Err(ElfProblem::Truncated));
        // Header complete, program headers cut short.
        assert_eq!(inspect(&b[..HEADER_LEN + 10]), Err(ElfProblem::Truncated));

        let mut huge = b.clone();
        huge[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(prefix_len(&huge), Err(ElfProblem::Truncated));

        let mut small_entries = b;
        small_entries[54..56].copy_from_slice(&8u16.to_le_bytes());
        assert_eq!(prefix_len(&small_entries), Err(ElfProblem::Truncated));
    }
}
