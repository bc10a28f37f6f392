//! Putting the runtime into the target without a path anyone else could have made or could
//! change: the hijacked thread makes a memory file of its own (`memfd_create`), uprobe-run
//! takes a copy of that descriptor (`pidfd_getfd`), writes the runtime into it, seals it
//! (no more writes, no resizing) and reads it back through the very descriptor; the thread
//! then `dlopen`s `/proc/self/fd/N` and closes it, and uprobe-run checks that what the
//! process mapped is that file (device and inode). No directory is involved, so no other
//! user can plant, swap or read anything; the process ends up with no descriptor of it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::error::AttachError;
use super::inject::{Arg, Hijacked};
use super::target::{Mapping, Target, MEMFD_PREFIX};
use super::{function_in, net};

const MFD_CLOEXEC: u64 = 1;
const MFD_ALLOW_SEALING: u64 = 2;
/// Executable even where `vm.memfd_noexec` makes memory files non-executable by default
/// (Linux 6.3 and later; older kernels refuse the flag, and are asked again without it).
const MFD_EXEC: u64 = 0x10;
const SEALS: libc::c_int = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

/// Loads `bytes` (the runtime named `name` in messages) into the process with the thread
/// held; its first mapping.
pub fn runtime(
    target: &Target,
    thread: &mut Hijacked,
    libc: &Mapping,
    pidfd: &OwnedFd,
    name: &Path,
    bytes: &[u8],
) -> Result<Mapping, AttachError> {
    let pid = target.pid;
    let failed = |reason: String| AttachError::LoadFailed { pid, runtime: name.to_path_buf(), reason };
    let old_glibc = |symbol| AttachError::OldGlibc { pid, libc: PathBuf::from(&libc.path), symbol };
    let memfd_create = function_in(target, libc, "memfd_create")?.ok_or_else(|| old_glibc("memfd_create"))?;
    let dlopen = function_in(target, libc, "dlopen")?.ok_or_else(|| old_glibc("dlopen"))?;
    let close = function_in(target, libc, "close")?.ok_or_else(|| old_glibc("close"))?;

    // Ours is the one that was not there before the call.
    let file_name = &MEMFD_PREFIX["/memfd:".len()..];
    let link = format!("{MEMFD_PREFIX} (deleted)");
    let mut fd = None;
    for flags in [MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC, MFD_CLOEXEC | MFD_ALLOW_SEALING] {
        let before = target.fds_linked_to(&link);
        thread.call("memfd_create", memfd_create, &[Arg::Str(file_name.as_bytes()), Arg::Int(flags)])?;
        fd = target.fds_linked_to(&link).into_iter().find(|fd| !before.contains(fd));
        if fd.is_some() {
            break;
        }
    }
    let Some(fd) = fd else {
        return Err(target.changed().unwrap_or_else(|| failed("memfd_create failed in the process".into())));
    };
    let closed = |thread: &mut Hijacked| thread.call("close", close, &[Arg::Int(fd as u64)]).map(drop);
    let file = match fill(pidfd, fd, loadable_part(bytes)) {
        Ok(file) => file,
        Err(reason) => {
            closed(thread)?;
            return Err(target.changed().unwrap_or_else(|| failed(reason)));
        }
    };
    if thread.interrupted() {
        closed(thread)?;
        return Err(AttachError::Interrupted { pid });
    }
    let path = format!("/proc/self/fd/{fd}");
    let flags = (libc::RTLD_NOW | libc::RTLD_GLOBAL) as u64;
    thread.call("dlopen", dlopen, &[Arg::Str(path.as_bytes()), Arg::Int(flags)])?;
    closed(thread)?;
    let meta = file.metadata().map_err(|e| failed(format!("fstat of its memory file: {e}")))?;
    let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
    let maps = target.maps()?;
    let first = maps.iter().find(|m| m.offset == 0 && m.inode == meta.ino() && m.dev == dev).cloned();
    first.ok_or_else(|| {
        target.changed().unwrap_or_else(|| {
            failed(
                "dlopen failed in the process (a library the runtime needs, libgcc_s.so.1, missing from its file \
                 system, or /proc not mounted there?)"
                    .into(),
            )
        })
    })
}

/// The part of the ELF file `bytes` that the dynamic loader reads: up to the end of its last
/// loaded segment. What follows (debug information, the non-loaded symbol table, section
/// headers: most of a build with debug info) would only fill the process's memory and
/// lengthen the attach. The header is left as it is, so the first mapping stays byte for byte
/// the carried file's (`loaded_runtime` compares them); the loader never reads section
/// headers. Anything that does not parse as ELF64 is taken whole.
pub fn loadable_part(bytes: &[u8]) -> &[u8] {
    let field = |at: usize, len: usize| -> Option<u64> {
        let b = bytes.get(at..at.checked_add(len)?)?;
        Some(b.iter().rev().fold(0u64, |v, &byte| v << 8 | u64::from(byte)))
    };
    if !bytes.starts_with(b"\x7fELF\x02\x01") {
        return bytes;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (field(0x20, 8), field(0x36, 2), field(0x38, 2)) else {
        return bytes;
    };
    let mut end = 0u64;
    for i in 0..phnum {
        let Some(at) = phentsize.checked_mul(i).and_then(|o| o.checked_add(phoff)) else {
            return bytes;
        };
        let at = at as usize;
        match (field(at, 4), field(at.saturating_add(8), 8), field(at.saturating_add(32), 8)) {
            (Some(1), Some(offset), Some(filesz)) => end = end.max(offset.saturating_add(filesz)),
            (Some(_), Some(_), Some(_)) => {}
            _ => return bytes,
        }
    }
    let headers_end = phoff.saturating_add(phentsize * phnum);
    match usize::try_from(end.max(headers_end)) {
        Ok(end) if end > 0 && end <= bytes.len() => &bytes[..end],
        _ => bytes,
    }
}

/// Writes `bytes` into the process's memory file `fd` through a copy of the descriptor,
/// seals it and reads it back through that copy; the copy.
fn fill(pidfd: &OwnedFd, fd: i32, bytes: &[u8]) -> Result<File, String> {
    let mut file = File::from(net::take_fd(pidfd, fd).map_err(|e| format!("pidfd_getfd of its memory file: {e}"))?);
    file.write_all(bytes).map_err(|e| format!("writing its memory file: {e}"))?;
    match net::seal(&file, SEALS) {
        Ok(seals) if seals & SEALS == SEALS => {}
        Ok(seals) => return Err(format!("sealing its memory file: seals {seals:#x} only")),
        Err(e) => return Err(format!("sealing its memory file: {e}")),
    }
    let mut back = Vec::with_capacity(bytes.len());
    file.seek(SeekFrom::Start(0)).and_then(|_| file.read_to_end(&mut back)).map_err(|e| e.to_string())?;
    if back != bytes {
        return Err("its memory file does not hold what was written".into());
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loadable_part_ends_with_the_last_loaded_segment() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let part = loadable_part(&exe);
        let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&exe[..]).unwrap();
        // Built with debug information: most of the file is not loaded.
        assert!(part.len() < exe.len());
        for ph in elf.elf_program_headers() {
            use object::read::elf::ProgramHeader as _;
            if ph.p_type(elf.endian()) == object::elf::PT_LOAD {
                assert!(ph.p_offset(elf.endian()) + ph.p_filesz(elf.endian()) <= part.len() as u64);
            }
        }
        assert_eq!(&exe[..part.len()], part);
        assert_eq!(loadable_part(b"not an ELF file"), b"not an ELF file");
        // A header whose program headers lie past the end is taken whole.
        let mut short = exe[..64].to_vec();
        short[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(loadable_part(&short), &short[..]);
    }
}
