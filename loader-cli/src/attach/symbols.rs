//! Addresses of functions in the target: a symbol's value in the ELF file, plus where that
//! file is loaded in the process.

use std::path::Path;

use object::{Object, ObjectSegment};
use uprobe_contracts::elf;

use crate::attach::error::AttachError;
use crate::attach::target::{Mapping, Target};

/// The value of the defined function symbol `name` in the ELF file at `path` (its dynamic
/// symbols first, then its symbol table), and the lowest address its segments load at.
pub fn lookup(path: &Path, name: &str) -> Result<Option<(u64, u64)>, AttachError> {
    let bytes = std::fs::read(path).map_err(|source| AttachError::Read { path: path.into(), source })?;
    lookup_in(&bytes, path, name)
}

/// [`lookup`] in the bytes of the file `path` names.
pub fn lookup_in(bytes: &[u8], path: &Path, name: &str) -> Result<Option<(u64, u64)>, AttachError> {
    let found = elf::find(bytes, name, true).map_err(|e| AttachError::Read {
        path: path.into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    Ok(found.map(|s| (s.vaddr, s.image_start)))
}

/// Where `needle` first appears in the executable segments of the ELF file at `path`: its
/// address in the file's terms, and the lowest address its segments load at.
pub fn find_code(path: &Path, needle: &[u8]) -> Result<Option<(u64, u64)>, AttachError> {
    let bytes = std::fs::read(path).map_err(|source| AttachError::Read { path: path.into(), source })?;
    let file = object::File::parse(&*bytes).map_err(|e| AttachError::Read {
        path: path.into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
    })?;
    let base = file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    for segment in file.segments() {
        let executable =
            matches!(segment.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
        let Ok(data) = segment.data() else { continue };
        if !executable || data.len() < needle.len() {
            continue;
        }
        if let Some(at) = data.windows(needle.len()).position(|w| w == needle) {
            return Ok(Some((segment.address() + at as u64, base)));
        }
    }
    Ok(None)
}

/// The run-time address of `value` (a symbol's value in the file whose lowest segment is at
/// `base`), given the file's mapping at offset 0.
pub fn runtime_address(first: &Mapping, value: u64, base: u64) -> u64 {
    first.start + (value - base)
}

/// The run-time address of function `name` of the file mapped at `first`.
pub fn function_in(target: &Target, first: &Mapping, name: &'static str) -> Result<Option<u64>, AttachError> {
    let file = target.file(first);
    let found = lookup(&file, name).map_err(|e| target.changed().unwrap_or(e))?;
    Ok(found.map(|(value, base)| runtime_address(first, value, base)))
}
