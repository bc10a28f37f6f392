//! USDT semaphores: a marker built with a semaphore (`<sys/sdt.h>` with
//! `_SDT_HAS_SEMAPHORES`) computes its arguments only while the `unsigned short` named in its
//! note is non-zero. As the kernel does for a uprobe with a reference counter
//! (`uprobe_register_refctr`), a probe object given one here raises it by one each time it
//! is placed (at registration, and again at each `dlopen` of its module) and lowers it when
//! it is removed, so the program goes back to skipping the arguments once nobody listens.
//!
//! The counter is named by a file offset of the probed file (`PATH:OFFSET(REF_CTR_OFFSET)`,
//! as tracefs takes it): it is found in the process as the writable mapping of the same file
//! (same inode) that covers that offset. A fork copies the counter raised with the rest of
//! the memory, and the probes with it: the child's count is right as it is. A module
//! unloaded takes its counter away (`forget`); the probe then waits to be placed again.
//!
//! Context: normal context, under the registry lock (this module's own lock is taken inside
//! it, never the other way round).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, Ordering};

use crate::base::lock::Mutex;
use crate::base::maps::{self, Mapping};
use crate::probe::error::RegisterError;

struct Counters {
    /// Probe object key -> the counter's file offset in the probed file.
    wanted: BTreeMap<usize, u64>,
    /// Probe object key -> the address of the counter it raised.
    raised: BTreeMap<usize, usize>,
}

static COUNTERS: Mutex<Counters> = Mutex::new(Counters { wanted: BTreeMap::new(), raised: BTreeMap::new() });

/// Says that the probe object `key` comes with a semaphore at `file_offset` of the file it is
/// placed in (before registering it).
pub fn want(key: usize, file_offset: u64) {
    COUNTERS.lock().wanted.insert(key, file_offset);
}

/// The address of the semaphore of probe object `key` placed at `addr`, if it has one: in
/// the writable mapping of the same file that covers its offset.
pub(super) fn locate(key: usize, addr: usize, maps: &[Mapping]) -> Result<Option<usize>, RegisterError> {
    let Some(&offset) = COUNTERS.lock().wanted.get(&key) else { return Ok(None) };
    let refuse = |why: &'static str| Err(RegisterError::Semaphore { addr, offset, why });
    let Some(code) = maps::find(maps, addr).filter(|m| m.inode != 0) else {
        return refuse("the probe is not in a mapped file");
    };
    let covering = maps.iter().find(|m| {
        m.inode == code.inode
            && m.dev == code.dev
            && m.path == code.path
            && m.offset <= offset
            && offset + 2 <= m.offset + (m.end - m.start)
    });
    match covering {
        None => refuse("no mapping of the probed file covers it"),
        Some(m) if !m.write || !m.read => refuse("it is not in writable data"),
        Some(_) if offset & 1 != 0 => refuse("it is not 2-byte aligned"),
        Some(m) => Ok(Some((m.start + (offset - m.offset)) as usize)),
    }
}

/// Raises the semaphore of probe object `key` at `at` (found by [`locate`]).
pub(super) fn raise(key: usize, at: usize) {
    let mut c = COUNTERS.lock();
    if c.raised.insert(key, at).is_none() {
        add(at, 1);
    }
}

/// Lowers the semaphore probe object `key` raised, if its memory is still there.
pub(super) fn lower(key: usize) {
    let mut c = COUNTERS.lock();
    let Some(at) = c.raised.remove(&key) else { return };
    let maps = maps::current();
    if maps::find(&maps, at).is_some_and(|m| m.write && m.read) {
        add(at, -1);
    }
}

/// The memory of probe object `key`'s semaphore is gone (its module was unloaded).
pub(super) fn forget(key: usize) {
    COUNTERS.lock().raised.remove(&key);
}

/// The probe object is no longer registered at all: it no longer asks for a semaphore.
pub(super) fn release(key: usize) {
    let mut c = COUNTERS.lock();
    c.wanted.remove(&key);
}

/// Adds `by` to the counter at `at`, never below 0 nor past 65535.
fn add(at: usize, by: i32) {
    // SAFETY: `at` is 2-byte aligned in a writable mapping of the probed file (`locate` and
    // `lower` check it); the program only reads it, other raisers add atomically too.
    let counter = unsafe { AtomicU16::from_ptr(at as *mut u16) };
    let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
        let next = i32::from(v) + by;
        (0..=i32::from(u16::MAX)).contains(&next).then_some(next as u16)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: usize, len: usize, offset: usize, write: bool, exec: bool) -> Mapping {
        let (start, len, offset) = (start as u64, len as u64, offset as u64);
        Mapping {
            start,
            end: start + len,
            read: true,
            write,
            exec,
            shared: false,
            offset,
            dev: (8, 1),
            inode: 7,
            path: "/bin/app".into(),
        }
    }

    #[test]
    fn the_counter_is_in_the_writable_mapping_of_the_probed_file() {
        let maps = [
            mapping(0x1000, 0x1000, 0, false, false),
            mapping(0x2000, 0x1000, 0x1000, false, true),
            mapping(0x3000, 0x1000, 0x2000, true, false),
        ];
        want(1, 0x2068);
        assert_eq!(locate(1, 0x2430, &maps), Ok(Some(0x3068)));
        // In read-only memory, unaligned, or outside the file: refused, never written.
        want(2, 0x0068);
        assert!(matches!(
            locate(2, 0x2430, &maps),
            Err(RegisterError::Semaphore { why: "it is not in writable data", .. })
        ));
        want(3, 0x2069);
        assert!(locate(3, 0x2430, &maps).is_err());
        want(4, 0x9000);
        assert!(locate(4, 0x2430, &maps).is_err());
        // A probe without one.
        assert_eq!(locate(5, 0x2430, &maps), Ok(None));
        for key in 1..5 {
            release(key);
        }
    }

    #[test]
    fn raised_and_lowered_within_bounds() {
        let counter = AtomicU16::new(0);
        let at = counter.as_ptr() as usize;
        add(at, 1);
        add(at, 1);
        assert_eq!(counter.load(Ordering::SeqCst), 2);
        add(at, -1);
        add(at, -1);
        add(at, -1);
        assert_eq!(counter.load(Ordering::SeqCst), 0, "never below 0");
        counter.store(u16::MAX, Ordering::SeqCst);
        add(at, 1);
        assert_eq!(counter.load(Ordering::SeqCst), u16::MAX, "never past 65535");
    }
}
