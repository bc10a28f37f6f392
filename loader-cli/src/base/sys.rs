//! The system calls std does not offer.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Whether this process may execute `path`, by access(2) with our real ids, as execvp does
/// before trying a PATH entry.
pub fn may_execute(path: &Path) -> bool {
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) only reads the NUL-terminated path, which outlives the call.
    unsafe { libc::access(path.as_ptr(), libc::X_OK) == 0 }
}

/// Whether this process may write `path` (an existing file), or create it (its directory),
/// by access(2) with our real ids: the error to tell if not.
pub fn may_write(path: &Path) -> std::io::Result<()> {
    let exists = path.symlink_metadata().is_ok();
    let target = match (exists, path.parent()) {
        (true, _) => path,
        (false, Some(dir)) if !dir.as_os_str().is_empty() => dir,
        (false, _) => Path::new("."),
    };
    if !exists && !target.is_dir() {
        return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
    }
    let c = CString::new(target.as_os_str().as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: access(2) only reads the NUL-terminated path, which outlives the call.
    match unsafe { libc::access(c.as_ptr(), libc::W_OK) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// What the kernel lets an exec pass in arguments and environment together: a quarter of
/// the stack size limit, at least 32 pages and at most three quarters of 8 MiB (fs/exec.c).
pub fn exec_size_limit() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct passed.
    let stack = match unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut limit) } {
        0 if limit.rlim_cur != libc::RLIM_INFINITY => limit.rlim_cur as usize,
        _ => usize::MAX,
    };
    (stack / 4).clamp(32 * 4096, 6 << 20)
}

/// This process's real user id.
pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Closes `fd`, a descriptor this process made and owns alone.
pub fn close(fd: i32) {
    // SAFETY: close(2) on a descriptor nothing else refers to.
    unsafe { libc::close(fd) };
}
