//! Where a line of output goes while attach sessions run. Each session has its own descriptor
//! (a socket to the `uprobe-run` that attached), used by the code of its handler libraries
//! (routed by the caller's address, so handlers running on any thread reach it) and by the
//! thread that carries out the session's work (routed by thread id). Everything else goes to
//! the run's output.
//!
//! Signal-safe: a fixed table of atomics, read without locks; routes are added and removed by
//! the sessions in normal context, and removed only once no handler of theirs can run.

use core::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use crate::base::sys;

/// Routes at once: a few per session (its libraries and its thread).
const ROUTES: usize = 32;

struct Route {
    /// A code range `lo..hi`, or 0..0 for a thread route.
    lo: AtomicUsize,
    hi: AtomicUsize,
    /// The thread of a thread route, or 0.
    tid: AtomicI32,
    /// The descriptor, or -1 while the entry is free.
    fd: AtomicI32,
}

static TABLE: [Route; ROUTES] = [const {
    Route { lo: AtomicUsize::new(0), hi: AtomicUsize::new(0), tid: AtomicI32::new(0), fd: AtomicI32::new(-1) }
}; ROUTES];
/// Routes in use: lookups cost nothing while no session runs.
static IN_USE: AtomicUsize = AtomicUsize::new(0);

/// The route table is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

fn add(lo: usize, hi: usize, tid: i32, fd: i32) -> Result<(), Full> {
    for r in &TABLE {
        if r.fd.compare_exchange(-1, i32::MIN, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            r.lo.store(lo, Ordering::Relaxed);
            r.hi.store(hi, Ordering::Relaxed);
            r.tid.store(tid, Ordering::Relaxed);
            r.fd.store(fd, Ordering::Release);
            IN_USE.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
    }
    Err(Full)
}

/// Sends what code in `lo..hi` writes to `fd` (normal context).
pub fn add_code(lo: usize, hi: usize, fd: i32) -> Result<(), Full> {
    add(lo, hi, 0, fd)
}

/// Sends what thread `tid` writes, wherever the code is, to `fd` (normal context).
pub fn add_thread(tid: i32, fd: i32) -> Result<(), Full> {
    add(0, 0, tid, fd)
}

/// Removes every route to `fd` (normal context, once nothing routed there can run).
pub fn remove_fd(fd: i32) {
    for r in &TABLE {
        if r.fd.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            IN_USE.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Removes the route of the code range `lo..hi` (its library is about to go).
pub fn remove_code(lo: usize, hi: usize) {
    for r in &TABLE {
        let fd = r.fd.load(Ordering::Acquire);
        if fd >= 0
            && r.lo.load(Ordering::Relaxed) == lo
            && r.hi.load(Ordering::Relaxed) == hi
            && r.tid.load(Ordering::Relaxed) == 0
            && r.fd.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            IN_USE.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The descriptor for output written by code at `caller` (0: unknown) on this thread, if a
/// route says so (signal-safe).
pub fn fd_for(caller: usize) -> Option<i32> {
    if IN_USE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let live = |r: &Route| Some(r.fd.load(Ordering::Acquire)).filter(|&fd| fd >= 0);
    for r in &TABLE {
        let (lo, hi) = (r.lo.load(Ordering::Relaxed), r.hi.load(Ordering::Relaxed));
        if lo <= caller && caller < hi {
            if let Some(fd) = live(r) {
                return Some(fd);
            }
        }
    }
    let me = sys::gettid();
    TABLE.iter().filter(|r| r.tid.load(Ordering::Relaxed) == me).find_map(live)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_routes_win_over_thread_routes_and_go_away() {
        assert_eq!(fd_for(0x1000), None);
        add_thread(sys::gettid(), 41).unwrap();
        add_code(0x1000, 0x2000, 42).unwrap();
        assert_eq!(fd_for(0x1800), Some(42));
        assert_eq!(fd_for(0x2000), Some(41));
        remove_fd(42);
        assert_eq!(fd_for(0x1800), Some(41));
        remove_fd(41);
        assert_eq!(fd_for(0x1800), None);
    }
}
