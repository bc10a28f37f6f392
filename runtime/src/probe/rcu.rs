//! Read-side sections and grace periods (as in SRCU), which let a consumer list be replaced
//! while hits read it, and let `unregister_uprobe` promise that none of its handlers still
//! runs.
//!
//! Read-side sections are entered on the hit paths (signal context or stub context, thread
//! marked busy): no lock, no locked instruction, no allocation. [`synchronize`] runs in normal
//! context and may wait.

use std::sync::atomic::{compiler_fence, AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::base::sys;
use crate::probe::thread::ThreadState;

// Grace periods. A hit reads a consumer list inside a read-side section; a writer that
// unpublished a list waits until every section that might have read it has ended.
//
// Each thread owns a reader slot, a sequence number that is odd while the thread is in a
// section. The owner updates it with plain stores, no locked instruction: the writer, after
// unpublishing, makes every thread of the process execute a full barrier with
// membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), so that a reader either had its odd
// sequence visible before the writer scans, or loads the new list. A slot is claimed on a
// thread's first hit (one CAS, no call into libc: that first hit may come while glibc runs
// the new thread with every signal blocked) and belongs to the thread id that claimed it;
// when none is free, the slots of threads that no longer exist are taken over. Threads
// without a slot (none to be had, or no membarrier) count themselves in two shared counters
// instead, which the writer drains by flipping an epoch, as SRCU does.

const READER_SLOTS: usize = 1024;
const NO_SLOT: u32 = u32::MAX;
/// A reader slot's sequence, alone in its cache line: threads on other cores must not share
/// the line they write at every hit.
#[repr(align(64))]
struct Seq(AtomicU64);

impl core::ops::Deref for Seq {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        &self.0
    }
}

static SLOT_SEQ: [Seq; READER_SLOTS] = [const { Seq(AtomicU64::new(0)) }; READER_SLOTS];
/// The thread id owning each slot, 0 for a free one.
static SLOT_OWNER: [AtomicI32; READER_SLOTS] = [const { AtomicI32::new(0) }; READER_SLOTS];
/// Whether private expedited membarriers work here (set at start-up).
static FAST_READERS: AtomicBool = AtomicBool::new(false);

static EPOCH: AtomicUsize = AtomicUsize::new(0);
static READERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Enables per-thread reader slots where the kernel has private expedited membarriers
/// (start-up).
pub fn init_readers() {
    FAST_READERS.store(sys::membarrier_register_private_expedited(), Ordering::Relaxed);
}

/// In a child after fork: only the forking thread exists, so the other threads' reader
/// slots and shared counts are stale (one may have been mid-section) and are cleared; the
/// forking thread's slot now belongs to its new thread id.
pub fn readers_after_fork() {
    let own = crate::probe::thread::current().reader.get();
    let me = sys::gettid();
    for i in 0..READER_SLOTS {
        if own == 0 || own == NO_SLOT || i != own as usize - 1 {
            SLOT_SEQ[i].store(0, Ordering::Relaxed);
            SLOT_OWNER[i].store(0, Ordering::Relaxed);
        } else {
            SLOT_OWNER[i].store(me, Ordering::Relaxed);
        }
    }
    READERS[0].store(0, Ordering::Relaxed);
    READERS[1].store(0, Ordering::Relaxed);
}

/// Claims a reader slot for the calling thread (its first hit; signal-safe).
fn claim_slot() -> u32 {
    if !FAST_READERS.load(Ordering::Relaxed) {
        return NO_SLOT;
    }
    let me = sys::gettid();
    let start = me as usize % READER_SLOTS;
    let free = (0..READER_SLOTS)
        .map(|k| (start + k) % READER_SLOTS)
        .find(|&i| SLOT_OWNER[i].compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed).is_ok());
    if let Some(i) = free {
        return i as u32;
    }
    // Every slot taken: take over one whose thread is gone (its sequence is even: threads
    // leave only between sections). Not with pooled thread states (a runtime loaded by
    // attach): a state, and its slot, pass to the next thread that gets the dead thread's
    // TCB, so a dead owner does not mean a free slot.
    if crate::probe::thread::pooled_states() {
        return NO_SLOT;
    }
    for i in 0..READER_SLOTS {
        let owner = SLOT_OWNER[i].load(Ordering::Acquire);
        if owner != 0
            && !sys::thread_exists(owner)
            && SLOT_SEQ[i].load(Ordering::Acquire).is_multiple_of(2)
            && SLOT_OWNER[i].compare_exchange(owner, me, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            return i as u32;
        }
    }
    NO_SLOT
}

/// The sequence of the calling thread's reader slot, if it has one.
pub fn sequence(t: &ThreadState) -> Option<u64> {
    let slot = t.reader.get();
    (slot != 0 && slot != NO_SLOT).then(|| SLOT_SEQ[slot as usize - 1].load(Ordering::Relaxed))
}

/// Puts back the sequence of the calling thread's reader slot (a child sharing its memory
/// may have left a section open: see `thread::Snapshot`).
pub fn set_sequence(t: &ThreadState, sequence: u64) {
    let slot = t.reader.get();
    if slot != 0 && slot != NO_SLOT {
        SLOT_SEQ[slot as usize - 1].store(sequence, Ordering::Release);
    }
}

/// A read-side section in progress.
pub enum ReadSection {
    Slot(&'static AtomicU64),
    Shared(usize),
}

/// Starts a read-side section (signal-safe; never nested on a thread: the hit paths hold the
/// thread's busy mark). End it with [`read_unlock`].
#[inline(always)]
pub fn read_lock(t: &ThreadState) -> ReadSection {
    let seq = t.reader_seq.get();
    if seq == 0 {
        return read_lock_slow(t);
    }
    // SAFETY: set only to the address of an element of `SLOT_SEQ` (`read_lock_slow`).
    let seq = unsafe { &*(seq as *const AtomicU64) };
    enter(seq)
}

#[inline(always)]
fn enter(seq: &'static AtomicU64) -> ReadSection {
    seq.store(seq.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    // The writer's membarrier orders this store before our loads of the list.
    compiler_fence(Ordering::SeqCst);
    ReadSection::Slot(seq)
}

/// [`read_lock`] of a thread that has no slot's address yet: its first section, or one of a
/// thread with no slot to be had.
#[cold]
#[inline(never)]
fn read_lock_slow(t: &ThreadState) -> ReadSection {
    let mut slot = t.reader.get();
    if slot == 0 {
        slot = match claim_slot() {
            NO_SLOT => NO_SLOT,
            i => i + 1,
        };
        t.reader.set(slot);
    }
    if slot != NO_SLOT {
        let seq = &SLOT_SEQ[slot as usize - 1].0;
        t.reader_seq.set(seq as *const AtomicU64 as usize);
        return enter(seq);
    }
    let i = EPOCH.load(Ordering::SeqCst) & 1;
    READERS[i].fetch_add(1, Ordering::SeqCst);
    ReadSection::Shared(i)
}

#[inline(always)]
pub fn read_unlock(section: ReadSection) {
    match section {
        ReadSection::Slot(seq) => {
            compiler_fence(Ordering::SeqCst);
            seq.store(seq.load(Ordering::Relaxed) + 1, Ordering::Release);
        }
        ReadSection::Shared(i) => {
            READERS[i].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Waits until every read-side section that started before the call has ended.
pub fn synchronize() {
    if FAST_READERS.load(Ordering::Relaxed) {
        sys::membarrier_private_expedited();
        for i in 0..READER_SLOTS {
            if SLOT_OWNER[i].load(Ordering::Acquire) == 0 {
                continue;
            }
            let seq = SLOT_SEQ[i].load(Ordering::Acquire);
            if seq % 2 == 1 {
                while SLOT_SEQ[i].load(Ordering::Acquire) == seq {
                    sys::sched_yield();
                }
            }
        }
    }
    for _ in 0..2 {
        let old = EPOCH.fetch_add(1, Ordering::SeqCst) & 1;
        while READERS[old].load(Ordering::SeqCst) != 0 {
            sys::sched_yield();
        }
    }
}
