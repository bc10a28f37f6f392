//! Writing live code.
//!
//! Pages keep PROT_EXEC throughout: write permission is added for the time of the store and
//! the original protection put back, so a thread running on the page never faults. A probe
//! changes one byte (the `int3`), which x86 allows to be modified while other cores execute
//! it; a core-serialising membarrier afterwards makes every thread see the new byte before the
//! call returns.

use std::sync::atomic::{AtomicBool, Ordering};

use thiserror::Error;

use crate::sys::{self, Errno, PAGE_SIZE};

static SYNC_CORE: AtomicBool = AtomicBool::new(false);

/// Enables core-serialising membarriers, where the kernel has them.
pub fn init() {
    SYNC_CORE.store(sys::membarrier_register_sync_core(), Ordering::Relaxed);
}

#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("mprotect({page:#x}) failed: {}", std::io::Error::from_raw_os_error(*errno))]
pub struct PatchError {
    pub page: usize,
    pub errno: Errno,
}

/// Stores `bytes` at `addr`, in pages whose protection is `prot`.
pub fn write_code(addr: usize, bytes: &[u8], prot: i32) -> Result<(), PatchError> {
    let first = sys::page_floor(addr);
    let len = sys::page_floor(addr + bytes.len() - 1) + PAGE_SIZE - first;
    let writable = prot & libc::PROT_WRITE != 0;
    if !writable {
        sys::mprotect(first, len, prot | libc::PROT_WRITE | libc::PROT_EXEC)
            .map_err(|errno| PatchError { page: first, errno })?;
    }
    for (i, &b) in bytes.iter().enumerate() {
        // SAFETY: the range lies in mapped pages that are writable now; byte stores are atomic
        // on x86, and a concurrently executing thread sees either the old or the new byte.
        unsafe { core::ptr::write_volatile((addr + i) as *mut u8, b) };
    }
    if !writable {
        // Putting the protection back can only fail if the mapping vanished under us.
        let _ = sys::mprotect(first, len, prot);
    }
    sync_cores();
    Ok(())
}

/// Makes every thread serialise its instruction stream before it next runs user code.
pub fn sync_cores() {
    if SYNC_CORE.load(Ordering::Relaxed) {
        sys::membarrier_sync_core();
    }
}

/// Reads `len` bytes of code at `addr`.
///
/// # Safety
/// The range must be mapped readable.
pub unsafe fn read_code(addr: usize, len: usize) -> Vec<u8> {
    // SAFETY: the caller guarantees the range is readable.
    unsafe { core::slice::from_raw_parts(addr as *const u8, len).to_vec() }
}
