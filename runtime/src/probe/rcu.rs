//! Read-side sections and grace periods (as in SRCU), which let a consumer list be replaced
//! while hits read it, and let `unregister_uprobe` promise that none of its handlers still
//! runs.
//!
//! Read-side sections are entered on the hit paths (signal context or stub context, thread
//! marked busy): no lock, no locked instruction, no allocation. [`synchronize`] runs in normal
//! context and may wait.

use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::base::sys;
use crate::probe::thread::ThreadState;

// Grace periods. A hit reads a consumer list inside a read-side section; a writer that
// unpublished a list waits until every section that might have read it has ended.
//
// Each thread owns a reader slot, a sequence number that is odd while the thread is in a
// section. The owner updates it with plain stores, no locked instruction: the writer, after
// unpublishing, makes every thread of the process execute a full barrier with
// membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), so that a reader either had its odd
// sequence visible before the writer scans, or loads the new list. Slots are claimed on a
// thread's first hit and given back by a thread-exit destructor. Threads without a slot
// (more than `READER_SLOTS` at once, or no membarrier) count themselves in two shared
// counters instead, which the writer drains by flipping an epoch, as SRCU does.

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
static SLOT_TAKEN: [AtomicBool; READER_SLOTS] = [const { AtomicBool::new(false) }; READER_SLOTS];
/// Whether private expedited membarriers work here (set at start-up).
static FAST_READERS: AtomicBool = AtomicBool::new(false);
static SLOT_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);

static EPOCH: AtomicUsize = AtomicUsize::new(0);
static READERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Enables per-thread reader slots where the kernel has private expedited membarriers and a
/// thread-exit destructor can be had (start-up).
pub fn init_readers() {
    extern "C" fn release(value: *mut libc::c_void) {
        let slot = value as usize - 1;
        SLOT_SEQ[slot].store(0, Ordering::Release);
        SLOT_TAKEN[slot].store(false, Ordering::Release);
    }
    let mut key: libc::pthread_key_t = 0;
    // The key is made first thing at start-up, so it is one of the few a thread descriptor
    // holds inline, and setting it never allocates.
    // SAFETY: pthread_key_create writes the key; `release` has the destructor's signature.
    if unsafe { libc::pthread_key_create(&mut key, Some(release)) } != 0 {
        return;
    }
    SLOT_KEY.store(key as usize, Ordering::Relaxed);
    FAST_READERS.store(sys::membarrier_register_private_expedited(), Ordering::Relaxed);
}

/// In a child after fork: only the forking thread exists, so the other threads' reader
/// slots and shared counts are stale (one may have been mid-section) and are cleared.
pub fn readers_after_fork() {
    let own = crate::probe::thread::current().reader.get();
    for i in 0..READER_SLOTS {
        if own == 0 || own == NO_SLOT || i != own as usize - 1 {
            SLOT_SEQ[i].store(0, Ordering::Relaxed);
            SLOT_TAKEN[i].store(false, Ordering::Relaxed);
        }
    }
    READERS[0].store(0, Ordering::Relaxed);
    READERS[1].store(0, Ordering::Relaxed);
}

/// Claims a reader slot for the calling thread (its first hit; signal-safe).
fn claim_slot() -> u32 {
    let key = SLOT_KEY.load(Ordering::Relaxed);
    if !FAST_READERS.load(Ordering::Relaxed) || key == usize::MAX {
        return NO_SLOT;
    }
    let start = sys::gettid() as usize % READER_SLOTS;
    for k in 0..READER_SLOTS {
        let i = (start + k) % READER_SLOTS;
        if SLOT_TAKEN[i].compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // A runtime loaded by attach made its key late, maybe past the ones a thread holds
            // inline (setting it could then allocate): its pooled thread states keep their
            // slot instead, for the next thread that takes the state over.
            if !crate::probe::thread::pooled_states() {
                // SAFETY: a key made at start-up; the value is the slot plus one, never null.
                unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, (i + 1) as *const libc::c_void) };
            }
            return i as u32;
        }
    }
    NO_SLOT
}

/// A read-side section in progress.
pub enum ReadSection {
    Slot(usize),
    Shared(usize),
}

/// Starts a read-side section (signal-safe; never nested on a thread: the hit paths hold the
/// thread's busy mark). End it with [`read_unlock`].
#[inline]
pub fn read_lock(t: &ThreadState) -> ReadSection {
    let mut slot = t.reader.get();
    if slot == 0 {
        slot = match claim_slot() {
            NO_SLOT => NO_SLOT,
            i => i + 1,
        };
        t.reader.set(slot);
    }
    if slot != NO_SLOT {
        let i = slot as usize - 1;
        let seq = SLOT_SEQ[i].load(Ordering::Relaxed);
        SLOT_SEQ[i].store(seq + 1, Ordering::Relaxed);
        // The writer's membarrier orders this store before our loads of the list.
        compiler_fence(Ordering::SeqCst);
        return ReadSection::Slot(i);
    }
    let i = EPOCH.load(Ordering::SeqCst) & 1;
    READERS[i].fetch_add(1, Ordering::SeqCst);
    ReadSection::Shared(i)
}

#[inline]
pub fn read_unlock(section: ReadSection) {
    match section {
        ReadSection::Slot(i) => {
            compiler_fence(Ordering::SeqCst);
            let seq = SLOT_SEQ[i].load(Ordering::Relaxed);
            SLOT_SEQ[i].store(seq + 1, Ordering::Release);
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
            if !SLOT_TAKEN[i].load(Ordering::Acquire) {
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
