//! Writing live code, a batch at a time.
//!
//! Pages keep PROT_EXEC throughout: write permission is added for the time of a batch and the
//! original protection put back, so a thread running on a page never faults. A [`Session`]
//! makes each range writable once, however many sites it holds; the caller writes in steps
//! (the `int3`s, then the tails of jumps, then their first bytes) with one core-serialising
//! membarrier after each step, so every thread sees the new bytes before the next step.
//! Single bytes may be changed while other cores execute them (x86 allows it); longer
//! patches rely on the `int3`-first protocol of the caller.
//!
//! Between [`Session::open`] and [`Session::close`] nothing here calls into libc or
//! allocates (the caller reserves room up front): the sites being written may be libc's.

use core::sync::atomic::{AtomicBool, Ordering};

use thiserror::Error;

use crate::base::lock::Mutex;
use crate::base::maps::Mapping;
use crate::base::sys::{self, Errno};

static SYNC_CORE: AtomicBool = AtomicBool::new(false);

/// Every range some session holds writable now, with its own protection: the address space
/// read meanwhile shows the session's, not the mapping's ([`true_protections`]).
static OPEN: Mutex<Vec<(usize, usize, i32)>> = Mutex::new(Vec::new());

/// Corrects mappings read while sessions hold ranges writable to their own protections.
pub fn true_protections(maps: &mut [Mapping]) {
    let open = OPEN.lock();
    for m in maps.iter_mut() {
        if let Some(&(_, _, prot)) =
            open.iter().find(|(start, len, _)| *start <= m.start as usize && m.end as usize <= start + len)
        {
            m.read = prot & libc::PROT_READ != 0;
            m.write = prot & libc::PROT_WRITE != 0;
            m.exec = prot & libc::PROT_EXEC != 0;
        }
    }
}

/// Enables core-serialising membarriers, where the kernel has them (start-up).
pub fn init() {
    SYNC_CORE.store(sys::membarrier_register_sync_core(), Ordering::Relaxed);
}

#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("mprotect({page:#x}) failed: {}", std::io::Error::from_raw_os_error(*errno))]
pub struct PatchError {
    pub page: usize,
    pub errno: Errno,
}

/// A range made writable by a session, and the protection to put back.
struct Region {
    start: usize,
    len: usize,
    prot: i32,
}

/// The ranges one batch writes into. Ranges are opened while the batch is prepared (which may
/// allocate); writing and closing allocate nothing.
#[derive(Default)]
pub struct Session {
    regions: Vec<Region>,
}

impl Session {
    pub const fn new() -> Session {
        Session { regions: Vec::new() }
    }

    /// Makes the pages covering `start..end`, whose protection is `prot`, writable (and
    /// executable) until [`Session::close`], unless the session has them already. `at` is
    /// the address the caller needs, named in the error.
    pub fn open(&mut self, start: usize, end: usize, prot: i32, at: usize) -> Result<(), PatchError> {
        if self.covers(start, end - start) {
            return Ok(());
        }
        let first = sys::page_floor(start);
        let len = sys::page_ceil(end) - first;
        if prot & libc::PROT_WRITE == 0 {
            sys::mprotect(first, len, prot | libc::PROT_WRITE | libc::PROT_EXEC)
                .map_err(|errno| PatchError { page: sys::page_floor(at), errno })?;
            OPEN.lock().push((first, len, prot));
        }
        self.regions.push(Region { start: first, len, prot });
        Ok(())
    }

    /// Whether `addr..addr + len` lies in a range this session opened.
    pub fn covers(&self, addr: usize, len: usize) -> bool {
        self.regions.iter().any(|r| r.start <= addr && addr + len <= r.start + r.len)
    }

    /// Stores `bytes` at `addr`, which lies in an opened range.
    pub fn write(&self, addr: usize, bytes: &[u8]) {
        debug_assert!(self.covers(addr, bytes.len()));
        for (i, &b) in bytes.iter().enumerate() {
            // SAFETY: the range is mapped and writable for the session; byte stores are atomic
            // on x86, and a concurrently executing thread sees either the old or the new byte.
            unsafe { core::ptr::write_volatile((addr + i) as *mut u8, b) };
        }
    }

    /// Puts the original protections back.
    pub fn close(&mut self) {
        for r in &self.regions {
            if r.prot & libc::PROT_WRITE == 0 {
                // Can only fail if the mapping vanished under us.
                let _ = sys::mprotect(r.start, r.len, r.prot);
            }
        }
        if !self.regions.is_empty() {
            OPEN.lock().retain(|o| !self.regions.iter().any(|r| r.start == o.0 && r.len == o.1));
        }
        self.regions.clear();
    }
}

/// Makes every thread serialise its instruction stream before it next runs user code.
pub fn sync_cores() {
    if SYNC_CORE.load(Ordering::Relaxed) {
        sys::membarrier_sync_core();
    }
}

/// Stores `bytes` at `addr`, in pages whose protection is `prot`, and syncs: a batch of one.
pub fn write_code(addr: usize, bytes: &[u8], prot: i32) -> Result<(), PatchError> {
    let mut session = Session::new();
    session.open(addr, addr + bytes.len(), prot, addr)?;
    session.write(addr, bytes);
    session.close();
    sync_cores();
    Ok(())
}

/// Reads `len` bytes of code at `addr`.
///
/// # Safety
/// The range must be mapped readable.
pub unsafe fn read_code(addr: usize, len: usize) -> Vec<u8> {
    // SAFETY: the caller guarantees the range is readable.
    unsafe { core::slice::from_raw_parts(addr as *const u8, len).to_vec() }
}
