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
