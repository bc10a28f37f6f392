//! A ring's pages, faulted in ahead of its owner: a page fault on the hit path costs about a
//! microsecond, 15-20 ns a record at the rates a fast program records. The drain thread
//! faults them in ahead of each owner, a piece at a time; an owner that comes close to the
//! end of them all the same wakes it, and faults the next piece in itself.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{offset, pool, ring_size, wake_drain, Ring, FREE};
use crate::base::sys;

/// How far past the owner's head the drain thread faults pages in, at least (bytes), or a
/// quarter of the ring where that is less: a thread that records a few events commits 1 MB
/// of the default 4 MB ring, as much as a program asks for when it records fast (4 MB ahead
/// of the head, rather than 1 MB, takes the benchmark's event from about 45 to 41 ns).
const FAULT_AHEAD: usize = 4 << 20;
/// How close to the end of the pages in the owner may come before it wakes the drain thread.
pub(super) const FAULT_MARGIN: usize = 512 << 10;
/// How close to it the owner comes before it faults pages in itself, and how many.
const OWN_MARGIN: usize = 64 << 10;
const OWN_CHUNK: usize = 256 << 10;

#[derive(Default)]
pub(super) struct Paging {
    /// How many bytes from the ring's start have their pages in (raised by the drain
    /// thread, and by the owner when the drain thread lags).
    pub(super) faulted: AtomicUsize,
    /// The head at the drain thread's last look, and the most the owner wrote between two
    /// looks (drain thread).
    looked: AtomicU64,
    stride: AtomicUsize,
}

impl Paging {
    pub(super) fn reset(&self) {
        self.faulted.store(0, Ordering::Relaxed);
        self.looked.store(0, Ordering::Relaxed);
        self.stride.store(0, Ordering::Relaxed);
    }
}

/// Faults in the next pages of every ring in use that is short of them (drain thread).
pub fn prefault_in_use() {
    let Some(pool) = pool() else { return };
    for ring in pool.rings.iter().filter(|r| r.state.load(Ordering::Acquire) != FREE) {
        ring.prefault();
    }
}

impl Ring {
    /// After a record that took the ring past its high-water mark, or its owner, writing at
    /// `at` of a ring of `size`, within [`FAULT_MARGIN`] of the pages faulted in, `faulted`
    /// (hit path): wakes the drain thread, which empties the ring and faults pages in ahead;
    /// a drain thread too busy to do so in time leaves the owner to fault in the next
    /// [`OWN_CHUNK`] itself, one system call where each page would have faulted.
    ///
    /// Not in the first [`OWN_MARGIN`] bytes: a thread's first records do not wait for a
    /// whole chunk (about 130 us here, inside the call an entry record begins to time) while
    /// the drain thread, woken when the ring was claimed, is faulting them in.
    #[cold]
    pub(super) fn after_commit(&self, at: usize, faulted: usize, size: usize) {
        wake_drain();
        if faulted < size && at + OWN_MARGIN > faulted && at >= OWN_MARGIN {
            let from = faulted.max(sys::page_floor(at));
            let until = (sys::page_ceil(at) + OWN_CHUNK).min(size);
            sys::populate_write(self.data + from, until - from);
            self.paging.0.faulted.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Faults in the ring's first page, if no page is in (its owner, at the claim).
    pub(super) fn fault_first_page(&self) {
        let page = sys::PAGE_SIZE.min(ring_size());
        if self.paging.0.faulted.load(Ordering::Relaxed) == 0 {
            sys::populate_write(self.data, page);
            self.paging.0.faulted.fetch_max(page, Ordering::Relaxed);
        }
    }

    /// Faults in the pages the owner will write next (drain thread): a page fault on the hit
    /// path costs about a microsecond, 15-20 ns a record. As far ahead as four times the
    /// most the owner wrote between two looks, at least `FAULT_AHEAD` (or a quarter of the
    /// ring): a drain thread busy for a while (a long copy or sort) still finds the owner in
    /// pages faulted in. The ring is written from its start and its pages stay, so the pages
    /// in are a prefix of it, and once it is whole nothing is left to do.
    pub fn prefault(&self) {
        let size = ring_size();
        let paging = &self.paging.0;
        let faulted = paging.faulted.load(Ordering::Relaxed);
        if faulted >= size {
            return;
        }
        let head = self.producer.0.head.load(Ordering::Acquire);
        let wrote = head.saturating_sub(paging.looked.swap(head, Ordering::Relaxed)) as usize;
        let stride = paging.stride.fetch_max(wrote, Ordering::Relaxed).max(wrote);
        let until = sys::page_ceil(offset(head, size) + (FAULT_AHEAD.min(size / 4)).max(4 * stride)).min(size);
        // A piece at a time, each published as it is in: the owner, which faults pages in
        // itself when it comes close to the published end, sees the drain thread ahead of it
        // instead of faulting in the same pages while one long call runs.
        let mut from = faulted;
        while from < until {
            from = from.max(paging.faulted.load(Ordering::Relaxed));
            let to = (from + OWN_CHUNK).min(until);
            if to <= from {
                break;
            }
            sys::populate_write(self.data + from, to - from);
            paging.faulted.fetch_max(to, Ordering::Relaxed);
            from = to;
        }
    }
}
