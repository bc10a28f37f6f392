//! The checks made on files before the program starts, each ending in a precise refusal.

use crate::base::elf::{self, Elf};
use crate::base::error::Error;
use crate::base::{bundled, spec, sys};
use std::fs::{self, File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The program: an executable, dynamically linked ELF64 x86-64 file that the dynamic loader
/// will start with LD_PRELOAD honoured.
pub fn program(path: &Path) -> Result<(), Error> {
    let meta = regular_file(path)?;
    if !sys::may_execute(path) {
        return Err(Error::NotExecutable(path.into()));
    }
    let mode = meta.permissions().mode();
    for (bit, kind) in [(libc::S_ISUID, "setuid"), (libc::S_ISGID, "setgid")] {
        if mode & bit != 0 {
            return Err(Error::SetId { path: path.into(), kind });
        }
    }
    let elf = match read_elf(path) {
        // Execute-only files run, but cannot be looked into; let the kernel judge.
        Err(Error::Read { source, .. }) if source.kind() == io::ErrorKind::PermissionDenied => return Ok(()),
        other => other?,
    };
    let elf = elf.check_executable().map_err(|problem| Error::Elf { path: path.into(), problem })?;
    if !elf.has_interp {
        return Err(Error::Static(path.into()));
    }
    Ok(())
}

/// A handler library, or the runtime: an ELF64 x86-64 shared object.
pub fn library(path: &Path) -> Result<(), Error> {
    regular_file(path)?;
    read_elf(path)?.check_shared_object().map(drop).map_err(|problem| Error::Elf { path: path.into(), problem })
}

/// A handler library: a shared object that exports `uprobe_init` or `uprobe_exit` (a library
/// with neither could neither place a probe nor report).
pub fn handler_library(path: &Path) -> Result<(), Error> {
    library(path)?;
    let data = fs::read(path).map_err(|source| Error::Read { path: path.into(), source })?;
    match elf::exports_any(&data, &["uprobe_init", "uprobe_exit"]) {
        // Unreadable symbol tables are left to the dynamic loader to judge.
        Some(false) => Err(Error::NoEntryPoints(path.into())),
        Some(true) | None => Ok(()),
    }
}

/// Whether the program itself imports the runtime's C API (`register_uprobe` and the rest,
/// weak or not): it then probes itself, with or without handler libraries.
pub fn calls_the_api(program: &Path) -> bool {
    const API: [&str; 5] =
        ["register_uprobe", "register_uretprobe", "unregister_uprobe", "unregister_uretprobe", "uprobe_lookup"];
    fs::read(program).is_ok_and(|data| elf::imports_any(&data, &API))
}

fn regular_file(path: &Path) -> Result<Metadata, Error> {
    let meta = fs::metadata(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => Error::NoSuchFile(path.into()),
        _ => Error::Read { path: path.into(), source },
    })?;
    if meta.is_dir() {
        Err(Error::IsDirectory(path.into()))
    } else if !meta.is_file() {
        Err(Error::NotRegularFile(path.into()))
    } else {
        Ok(meta)
    }
}

/// Reads the ELF header and program header table, nothing more.
fn read_elf(path: &Path) -> Result<Elf, Error> {
    let read_error = |source| Error::Read { path: path.into(), source };
    let elf_error = |problem| Error::Elf { path: path.into(), problem };
    let mut file = File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    read_up_to(&mut file, &mut bytes, elf::HEADER_LEN).map_err(read_error)?;
    let needed = elf::prefix_len(&bytes).map_err(elf_error)?;
    read_up_to(&mut file, &mut bytes, needed).map_err(read_error)?;
    elf::inspect(&bytes).map_err(elf_error)
}

/// Fills `bytes` to `len`, or to the end of the file if it is shorter.
fn read_up_to(file: &mut File, bytes: &mut Vec<u8>, len: usize) -> io::Result<()> {
    let more = len.saturating_sub(bytes.len()) as u64;
    file.take(more).read_to_end(bytes).map(drop)
}

/// The handler libraries to load, as the run specification names them: each resolved (a
/// bundled library's short name, see [`bundled`]), checked, and made absolute.
pub fn handlers(given: &[PathBuf]) -> Result<Vec<PathBuf>, Error> {
    let mut paths = Vec::with_capacity(given.len());
    for handler in given {
        let handler = bundled::resolve(handler)?;
        handler_library(&handler)?;
        paths.push(spec::path(&handler)?);
    }
    Ok(paths)
}
