//! Per-thread blocks of counters: one reservation made at start-up, before any probe arms,
//! of [`THREADS`] blocks laid out as `plan` says, touched only where counted.
//!
//! A thread claims a block with one compare-and-swap at its first hit (two system calls for
//! its ids, no call into libc: that hit may come while glibc runs the new thread with every
//! signal blocked). From then on only that thread writes the block, with plain loads and
//! stores (relaxed atomics: no locked instruction); reports read every block and add them up.
//! A block whose thread is gone is taken over by the next thread that finds none free, and
//! keeps counting from where it was: sums do not care which thread counted.
//!
//! The reservation is shared with the children the process forks, as the kernel counts a
//! child's hits with its parent's: a child's threads claim blocks of their own (the forking
//! thread gives up its parent's in the child), and the process that made the blocks reports
//! for all. Owners are named by process and thread id.
//!
//! Context: [`mine`] and [`Block`]'s writers run on the hit path; [`after_fork`] in a child;
//! the rest at start-up and in reports.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::aggregate::plan::Layout;
use crate::base::sys;
use crate::insn::vector;
use crate::probe::thread;

/// Threads with a block at once; more count only their events' totals.
pub const THREADS: usize = 256;
/// Header words: the owner (pid << 32 | tid), how many claims the block has seen, and the
/// last NAMES owners with their thread names (for `--by comm` after they are gone).
const OWNER: usize = 0;
const CLAIMS: usize = 1;
const NAMES_AT: usize = 2;
pub const NAMES: usize = 8;

/// Marks in the thread state's `block` besides a block's address.
const NONE_YET: usize = 0;
const NONE_TO_BE_HAD: usize = 1;

pub struct Pool {
    base: usize,
    /// Bytes of a block (whole pages).
    pub stride: usize,
    /// Whether a claim records the thread's name (`--by comm`).
    names: bool,
}

static POOL: AtomicPtr<Pool> = AtomicPtr::new(core::ptr::null_mut());

/// The pool's generation: a new one for each run of aggregations (an attach session's
/// starts afresh).
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// The calling thread's block, or NONE_YET / NONE_TO_BE_HAD: kept in the thread's state
/// (`probe::thread`), which a hit reaches without allocating even in a runtime loaded into
/// a running process.
#[inline(always)]
fn mine_word() -> usize {
    let (generation, b) = thread::current().block.get();
    if generation == GENERATION.load(Ordering::Relaxed) {
        b
    } else {
        NONE_YET
    }
}

fn set_mine(b: usize) {
    let generation = GENERATION.load(Ordering::Relaxed);
    let t = thread::current();
    t.block.set((generation, b));
    // The stubs' copy: a block, of the first pool only (see `counts_in_stubs`).
    let stubs = if generation == 1 && b != NONE_YET && b != NONE_TO_BE_HAD { b } else { 0 };
    t.change_marks(|t| t.count_block.set(stubs));
}

/// Whether a stub may count in the calling thread's block itself (`insn::stub`): the blocks
/// are the first pool the process made. A thread's stub word is not tied to a pool, so once
/// a later session's pool replaces the first (an attach session aggregating again), every
/// count goes through the handler, which checks the pool's generation.
pub fn counts_in_stubs() -> bool {
    let first = GENERATION.load(Ordering::Relaxed) == 1;
    if first {
        STUBS_COUNTED.store(true, Ordering::SeqCst);
    }
    first
}

/// Whether a stub may have counted in the first pool (see [`init`]).
static STUBS_COUNTED: AtomicBool = AtomicBool::new(false);

/// Reserves the blocks (start-up, before any probe is placed).
pub fn init(layout: &Layout, names: bool) -> Result<(), sys::Errno> {
    let stride = sys::page_ceil(layout.words * 8);
    let base = sys::mmap_shared_reserve(THREADS * stride)?;
    // An earlier run's blocks (an attach session that ended: its probes are gone, a grace
    // period passed, its reports are written) are given back.
    let old = POOL.swap(core::ptr::null_mut(), Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: made by Box::into_raw below; no hit or report reads it any more (above).
        let old = unsafe { Box::from_raw(old) };
        // A stub's counting entry is in no read-side section: a thread preempted between its
        // reads and its store may still write to the first pool, which then stays mapped.
        if !STUBS_COUNTED.load(Ordering::SeqCst) {
            // SAFETY: the blocks' reservation, which nothing references any more.
            unsafe { sys::munmap(old.base, THREADS * old.stride) };
        }
    }
    GENERATION.fetch_add(1, Ordering::SeqCst);
    POOL.store(Box::into_raw(Box::new(Pool { base, stride, names })), Ordering::Release);
    Ok(())
}

pub fn pool() -> Option<&'static Pool> {
    // SAFETY: made once at start-up, never freed.
    unsafe { POOL.load(Ordering::Acquire).as_ref() }
}

/// A thread's block: word-addressed counters.
#[derive(Clone, Copy)]
pub struct Block(usize);

impl Block {
    #[inline(always)]
    fn word(self, i: usize) -> &'static AtomicU64 {
        // SAFETY: blocks are mapped for the life of the process and `i` is below the layout's
        // words (the plans' offsets); the word is 8-aligned and only used atomically.
        unsafe { AtomicU64::from_ptr((self.0 + 8 * i) as *mut u64) }
    }

    #[inline(always)]
    pub fn get(self, i: usize) -> u64 {
        self.word(i).load(Ordering::Relaxed)
    }

    /// Sets word `i` (its owner only).
    #[inline(always)]
    pub fn set(self, i: usize, v: u64) {
        self.word(i).store(v, Ordering::Relaxed);
    }

    /// Sets word `i` after the words written before it (its owner only): a reader that sees
    /// this value sees them.
    #[inline(always)]
    pub fn publish(self, i: usize, v: u64) {
        self.word(i).store(v, Ordering::Release);
    }

    /// Reads word `i` and what was written before it was published.
    pub fn get_published(self, i: usize) -> u64 {
        self.word(i).load(Ordering::Acquire)
    }

    /// The address of word `i`, to find it again with [`Block::from_word`].
    #[inline(always)]
    pub fn address_of(self, i: usize) -> usize {
        self.0 + 8 * i
    }

    /// The words of a block from the one at `address` on (an address from
    /// [`Block::address_of`]), numbered from 0 there: a part of the block (a timed
    /// function's words) addressed on its own.
    #[inline(always)]
    pub fn from_word(address: usize) -> Block {
        Block(address)
    }

    /// The thread that owns the block now (on the hit path: the calling thread).
    #[inline(always)]
    pub fn owner_tid(self) -> i32 {
        self.get(OWNER) as u32 as i32
    }

    /// Adds to word `i` (its owner only): a load and a store, no locked instruction.
    #[inline(always)]
    pub fn add(self, i: usize, n: u64) {
        self.set(i, self.get(i).wrapping_add(n));
    }

    /// Counts one hit under `tag` and `key` in the block's table (its owner only); false when
    /// the key found no room.
    #[inline]
    pub fn count_key(self, layout: &Layout, tag: u64, key: &[u64]) -> bool {
        match self.slot(layout, tag, key) {
            Some(at) => {
                self.add(at + 1, 1);
                true
            }
            None => false,
        }
    }

    /// The first word of the slot of `tag` and `key` in the block's table, taken for them if
    /// they have none yet (its owner only); None when the key found no room. A slot is
    /// `[tag, count, key words, values]`, tag 0 for a free one; a new key's words are written
    /// before its tag, so a reader that sees the tag sees the key. Its count and values start
    /// at 0 (the block's fresh words).
    #[inline]
    pub fn slot(self, layout: &Layout, tag: u64, key: &[u64]) -> Option<usize> {
        let mut h = tag.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for &w in key {
            h = (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
        let mask = layout.key_slots - 1;
        let mut slot = (h >> 40) as usize & mask;
        // Bounded probing: a full table costs a hit no more than this.
        for _ in 0..64 {
            let at = layout.keys + slot * layout.slot_words;
            let t = self.get(at);
            if t == 0 {
                for (i, &w) in key.iter().enumerate() {
                    self.set(at + 2 + i, w);
                }
                self.word(at).store(tag, Ordering::Release);
                return Some(at);
            }
            if t == tag && (0..key.len()).all(|i| self.get(at + 2 + i) == key[i]) {
                return Some(at);
            }
            slot = (slot + 1) & mask;
        }
        None
    }

    /// The slots in use: (first word, tag, count, key words) of each (reports).
    pub fn keys(self, layout: &Layout) -> impl Iterator<Item = (usize, u64, u64, &'static [AtomicU64])> {
        let b = self;
        let layout = *layout;
        (0..layout.key_slots).filter_map(move |slot| {
            let at = layout.keys + slot * layout.slot_words;
            let tag = b.word(at).load(Ordering::Acquire);
            if tag == 0 {
                return None;
            }
            // SAFETY: the key words of this slot, inside the block (see `word`).
            let key =
                unsafe { core::slice::from_raw_parts((b.0 + 8 * (at + 2)) as *const AtomicU64, layout.key_words) };
            Some((at, tag, b.get(at + 1), key))
        })
    }

    /// The last owners of the block: (tid, name) each, newest first (reports).
    pub fn owners(self) -> Vec<(i32, [u8; 16])> {
        let claims = self.get(CLAIMS) as usize;
        (0..claims.min(NAMES))
            .map(|k| {
                let at = NAMES_AT + 3 * ((claims - 1 - k) % NAMES);
                let mut name = [0u8; 16];
                name[..8].copy_from_slice(&self.get(at + 1).to_le_bytes());
                name[8..].copy_from_slice(&self.get(at + 2).to_le_bytes());
                (self.get(at) as u32 as i32, name)
            })
            .collect()
    }
}

/// The calling thread's block, claimed at its first hit (hit path).
#[inline(always)]
pub fn mine() -> Option<Block> {
    match mine_word() {
        NONE_YET => {
            // Claiming is no hit-path code: it may use the vector registers.
            let mut claimed = None;
            vector::saving_vectors(|| claimed = claim());
            claimed
        }
        NONE_TO_BE_HAD => None,
        b => Some(Block(b)),
    }
}

/// The calling thread's block if it claimed one already (hit path: never claims).
#[inline(always)]
pub fn claimed() -> Option<Block> {
    match mine_word() {
        NONE_YET | NONE_TO_BE_HAD => None,
        b => Some(Block(b)),
    }
}

fn owner_word(pid: i32, tid: i32) -> u64 {
    (u64::from(pid as u32) << 32) | u64::from(tid as u32)
}

#[cold]
fn claim() -> Option<Block> {
    let pool = pool()?;
    let me = owner_word(sys::getpid(), sys::gettid());
    let block = |i: usize| Block(pool.base + i * pool.stride);
    let free = (0..THREADS)
        .find(|&i| block(i).word(OWNER).compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed).is_ok());
    // None free: take over one whose thread is gone.
    let found = free.or_else(|| {
        (0..THREADS).find(|&i| {
            let owner = block(i).word(OWNER).load(Ordering::Acquire);
            owner != 0
                && !sys::thread_alive((owner >> 32) as i32, owner as u32 as i32)
                && block(i).word(OWNER).compare_exchange(owner, me, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        })
    });
    let Some(i) = found else {
        set_mine(NONE_TO_BE_HAD);
        return None;
    };
    let b = block(i);
    let claims = b.get(CLAIMS);
    let at = NAMES_AT + 3 * (claims as usize % NAMES);
    let name = if pool.names { sys::thread_name() } else { [0; 16] };
    b.set(at, me & 0xffff_ffff);
    b.set(at + 1, u64::from_le_bytes(name[..8].try_into().unwrap_or_default()));
    b.set(at + 2, u64::from_le_bytes(name[8..].try_into().unwrap_or_default()));
    b.word(CLAIMS).store(claims + 1, Ordering::Release);
    set_mine(b.0);
    Some(b)
}

/// Every block a thread ever claimed (reports).
pub fn used() -> Vec<Block> {
    let Some(pool) = pool() else { return Vec::new() };
    (0..THREADS)
        .map(|i| Block(pool.base + i * pool.stride))
        .filter(|b| b.word(CLAIMS).load(Ordering::Acquire) != 0)
        .collect()
}

/// In the child of `fork`: the forking thread's block is its parent thread's, which goes on
/// counting there; the child's thread claims its own at its next hit.
pub fn after_fork() {
    set_mine(NONE_YET);
}
