//! Per-thread record buffers: a pool of single-producer, single-consumer byte rings, made
//! before any probe arms (one reservation of address space, touched only where written). A
//! thread claims a ring with one compare-and-swap at its first hit (no call into libc: that
//! hit may come while glibc runs the new thread with every signal blocked, where a probe on
//! the call would be fatal); the drain thread gives the ring back once its thread is gone.
//! The owner's hits write records with plain stores and one release store of the head. The drain thread reads from the tail. A record never wraps: where it
//! does not fit before the end, a padding record fills the end and it starts again at 0.
//!
//! Context: [`Writer`] and [`mine`] run on the hit path (no lock, no allocation, no call into
//! libc, one `gettid` system call at a thread's first hit); the rest runs on the drain thread
//! or at start-up and fork.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::base::stats::Call;
use crate::base::sys;
use crate::probe::thread;

mod paging;
pub use paging::prefault_in_use;
use paging::{Paging, FAULT_MARGIN};

const FREE: u32 = 0;
const OWNED: u32 = 1;
/// Its thread is gone: drained one last time, then free again.
const RELEASED: u32 = 2;

/// The event number of a padding record.
pub const PADDING: u32 = u32::MAX;
/// Records are 8-byte aligned.
pub const ALIGN: usize = 8;

/// One thread's ring and what the drain thread needs to know of its owner.
#[repr(C, align(64))]
pub struct Ring {
    state: AtomicU32,
    /// Bumped at each claim, so the drain thread knows the owner changed.
    pub generation: AtomicU32,
    pub tid: AtomicI32,
    pub pid: AtomicI32,
    data: usize,
    /// Written by the producer only (its own cache line).
    producer: Pad<Producer>,
    /// Written by the drain thread only.
    tail: Pad<AtomicU64>,
    /// Its pages, faulted in ahead of the owner (see [`Ring::prefault`]).
    paging: Pad<Paging>,
}

/// The owner's line: the head, and the tail as the owner last read it.
struct Producer {
    head: AtomicU64,
    /// Never past the real tail, so the room it leaves is never room the drain thread has
    /// yet to read. Read again only when it puts the ring past its high-water mark
    /// ([`Ring::writer`]): a hit does not wait for the line the drain thread writes as it
    /// reads, which is most of the time while a program records fast.
    tail_seen: AtomicU64,
}

#[repr(align(64))]
struct Pad<T>(T);

pub struct Pool {
    rings: Box<[Ring]>,
    /// Bytes of each ring (a power of two, so that a position is a mask away, not a
    /// division: the hit path computes one per record).
    pub size: usize,
}

/// The ring size in use: a power of two.
#[inline]
fn ring_size() -> usize {
    pool().map_or(0, |p| p.size)
}

/// Where position `pos` (a byte count since the ring was claimed) lies in a ring of `size`.
#[inline]
fn offset(pos: u64, size: usize) -> usize {
    (pos as usize) & (size.wrapping_sub(1))
}

static POOL: AtomicPtr<Pool> = AtomicPtr::new(core::ptr::null_mut());
/// Hits of threads that found no free ring (also counted per event).
pub static NO_RING: AtomicU64 = AtomicU64::new(0);
static PID: AtomicI32 = AtomicI32::new(0);
/// Set when the stream ends (process exit): hits after it record nothing.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Bumped by a hit that wakes the drain thread; the drain thread sleeps on it.
pub static WAKE: AtomicU32 = AtomicU32::new(0);
/// Set while the drain thread sleeps between passes.
pub static SLEEPING: AtomicBool = AtomicBool::new(false);

/// Past this fill (half the ring) a hit wakes the drain thread, if it sleeps: the ring is
/// emptied before it is full, however fast the program records, while a burst that fits in
/// it does not have the drain thread running beside it.
#[inline]
fn high_water(size: usize) -> usize {
    size / 2
}

/// Wakes the drain thread if it sleeps (hit path: a system call only when it does, once per
/// sleep).
#[cold]
fn wake_drain() {
    if SLEEPING.load(Ordering::Relaxed) && SLEEPING.swap(false, Ordering::AcqRel) {
        WAKE.fetch_add(1, Ordering::Release);
        sys::futex_wake(&WAKE, 1);
    }
}

/// Whether some ring in use is filled past its high-water mark (drain thread).
pub fn any_past_high_water() -> bool {
    let Some(pool) = pool() else { return false };
    pool.rings.iter().any(|r| {
        r.state.load(Ordering::Relaxed) != FREE
            && (r.producer.0.head.load(Ordering::Relaxed) - r.tail.0.load(Ordering::Relaxed)) as usize
                > high_water(pool.size)
    })
}

/// Whether the stream has ended (hit path).
#[inline]
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// Ends the stream: later hits record nothing.
pub fn close() {
    CLOSED.store(true, Ordering::SeqCst);
}

/// The pool's generation: a new one for each stream (an attach session's starts afresh).
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// The calling thread's ring plus one; 0: none yet; `u32::MAX`: none to be had. Kept in the
/// thread's state (`probe::thread`), which a hit reaches without allocating even in a
/// runtime loaded into a running process.
#[inline]
fn mine_index() -> u32 {
    let (generation, i) = thread::current().ring.get();
    if generation == GENERATION.load(Ordering::Relaxed) {
        i
    } else {
        0
    }
}

fn set_mine(i: u32) {
    thread::current().ring.set((GENERATION.load(Ordering::Relaxed), i));
}

/// Makes the pool: `threads` rings of `size` bytes, rounded up to a power of two
/// (start-up). The memory is reserved, not committed: a ring costs only the pages its records
/// reach.
pub fn init(threads: usize, size: usize) -> Result<(), sys::Errno> {
    let size = size.max(4096).next_power_of_two();
    CLOSED.store(false, Ordering::SeqCst);
    GENERATION.fetch_add(1, Ordering::SeqCst);
    // A later stream (another attach session) reuses the pool of the same size, emptied: no
    // hit of the last stream's can still write (its probes are gone, a grace period passed).
    if let Some(pool) = pool().filter(|p| p.size == size && p.rings.len() == threads) {
        for ring in pool.rings.iter() {
            ring.empty();
            ring.state.store(FREE, Ordering::Release);
        }
        NO_RING.store(0, Ordering::Relaxed);
        return Ok(());
    }
    let total = sys::page_ceil(threads * size);
    let base = sys::mmap_reserve(total)?;
    let rings: Box<[Ring]> = (0..threads)
        .map(|i| Ring {
            state: AtomicU32::new(FREE),
            generation: AtomicU32::new(0),
            tid: AtomicI32::new(0),
            pid: AtomicI32::new(0),
            data: base + i * size,
            producer: Pad(Producer { head: AtomicU64::new(0), tail_seen: AtomicU64::new(0) }),
            tail: Pad(AtomicU64::new(0)),
            paging: Pad(Paging::default()),
        })
        .collect();
    PID.store(sys::getpid(), Ordering::Relaxed);
    POOL.store(Box::into_raw(Box::new(Pool { rings, size })), Ordering::Release);
    Ok(())
}

pub fn pool() -> Option<&'static Pool> {
    // SAFETY: made once at start-up, never freed.
    unsafe { POOL.load(Ordering::Acquire).as_ref() }
}

/// The calling thread's ring, claimed at its first hit (hit path).
#[inline]
pub fn mine() -> Option<&'static Ring> {
    let pool = pool()?;
    let i = mine_index();
    if i != 0 && i != u32::MAX {
        return pool.rings.get(i as usize - 1);
    }
    if i == u32::MAX {
        return None;
    }
    claim(pool)
}

#[cold]
fn claim(pool: &'static Pool) -> Option<&'static Ring> {
    let found = pool
        .rings
        .iter()
        .position(|r| r.state.compare_exchange(FREE, OWNED, Ordering::AcqRel, Ordering::Relaxed).is_ok());
    let Some(i) = found else {
        set_mine(u32::MAX);
        return None;
    };
    let ring = &pool.rings[i];
    ring.tid.store(sys::gettid(), Ordering::Relaxed);
    ring.pid.store(PID.load(Ordering::Relaxed), Ordering::Relaxed);
    ring.generation.fetch_add(1, Ordering::Release);
    set_mine(i as u32 + 1);
    // The drain thread faults the next pages in while this thread writes its first records;
    // the first page is in before the first record (an entry's time is read after this).
    ring.fault_first_page();
    wake_drain();
    Some(ring)
}

/// A record being written at the head of a ring (hit path).
/// Its fields are in an order where no two neighbours start at zero: the compiler would
/// clear such a pair with a vector register, which the hit path may not touch.
pub struct Writer<'a> {
    ring: &'a Ring,
    buf: &'a mut [u8],
    pub len: usize,
    head: u64,
    /// Padding written before the record (it wrapped to the start).
    skipped: usize,
    /// The tail as the writer found it.
    tail: u64,
    /// The ring's size.
    size: usize,
}

impl Ring {
    #[allow(clippy::mut_from_ref)]
    fn bytes(&self, size: usize) -> &mut [u8] {
        // SAFETY: the ring's `size` bytes are reserved for it alone; only its owner writes,
        // and only past the tail (the drain thread reads only up to the head).
        unsafe { core::slice::from_raw_parts_mut(self.data as *mut u8, size) }
    }

    fn free(&self) -> usize {
        let size = ring_size();
        size - (self.producer.0.head.load(Ordering::Relaxed) - self.tail.0.load(Ordering::Acquire)) as usize
    }

    /// Its head and tail back to the start (no writer or reader at work on it).
    fn empty(&self) {
        self.producer.0.head.store(0, Ordering::Relaxed);
        self.producer.0.tail_seen.store(0, Ordering::Relaxed);
        self.tail.0.store(0, Ordering::Relaxed);
    }

    /// Reads the tail again, after a record found no room by the one last read: whether it
    /// moved since.
    #[cold]
    pub fn catch_up(&self) -> bool {
        let tail = self.tail.0.load(Ordering::Acquire);
        self.producer.0.tail_seen.swap(tail, Ordering::Relaxed) != tail
    }

    /// A writer for a record at the head; `wrap`: start over at the ring's start.
    #[inline]
    pub fn writer(&self, wrap: bool) -> Writer<'_> {
        let size = ring_size();
        let head = self.producer.0.head.load(Ordering::Relaxed);
        let mut tail = self.producer.0.tail_seen.load(Ordering::Relaxed);
        if wrap || (head - tail) as usize > high_water(size) {
            tail = self.tail.0.load(Ordering::Acquire);
            self.producer.0.tail_seen.store(tail, Ordering::Relaxed);
        }
        let free = size - (head - tail) as usize;
        let at = offset(head, size);
        let to_end = size - at;
        let all = self.bytes(size);
        if wrap && to_end < free {
            Writer { ring: self, buf: &mut all[..free - to_end], len: 0, head, skipped: to_end, tail, size }
        } else {
            let room = to_end.min(free);
            Writer { ring: self, buf: &mut all[at..at + room], len: 0, head, skipped: 0, tail, size }
        }
    }
}

/// How far ahead of the head a record prefetches (bytes).
const PREFETCH: usize = 1024;

/// The record did not fit.
pub struct Full;

impl Writer<'_> {
    /// Whether starting over at the ring's start may give more room: the free space does
    /// not all lie before the ring's end.
    pub fn may_wrap(&self) -> bool {
        let at = offset(self.head, self.size);
        self.skipped == 0 && self.buf.len() == self.size - at && self.ring.free() > self.buf.len()
    }

    #[inline]
    pub fn put(&mut self, bytes: &[u8]) -> Result<(), Full> {
        let end = self.len + bytes.len();
        if end > self.buf.len() {
            return Err(Full);
        }
        self.buf[self.len..end].copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }

    #[inline]
    pub fn put_u64(&mut self, v: u64) -> Result<(), Full> {
        self.put_word(v.to_le_bytes())
    }

    #[inline]
    pub fn put_u32(&mut self, v: u32) -> Result<(), Full> {
        self.put_word(v.to_le_bytes())
    }

    /// A fixed-size value: one store, where `put`'s copy of a slice would be a call.
    #[inline(always)]
    fn put_word<const N: usize>(&mut self, bytes: [u8; N]) -> Result<(), Full> {
        let end = self.len + N;
        if end > self.buf.len() {
            return Err(Full);
        }
        // SAFETY: `len..end` lies inside the writer's buffer (checked above); the store is
        // unaligned-safe.
        unsafe { core::ptr::write_unaligned(self.buf.as_mut_ptr().add(self.len) as *mut [u8; N], bytes) };
        self.len = end;
        Ok(())
    }

    /// The next `n` bytes (a multiple of 8) as words, written in place, where the writer is
    /// at a record's start: one check of the room for a record whose size is known before.
    #[inline(always)]
    pub fn words(&mut self, n: usize) -> Result<&mut [u64], Full> {
        let end = self.len + n;
        if end > self.buf.len() || self.len != 0 || !n.is_multiple_of(ALIGN) {
            return Err(Full);
        }
        self.len = end;
        // SAFETY: the buffer starts at a record's start, 8-aligned (the ring lies on a page and
        // its records are multiples of 8 bytes); its first `n` bytes are the writer's (above).
        Ok(unsafe { core::slice::from_raw_parts_mut(self.buf.as_mut_ptr() as *mut u64, n / 8) })
    }

    /// The unwritten room, to copy into directly; [`Writer::advance`] then.
    pub fn room(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..]
    }

    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// The padding at the old head of a record that wrapped, so the reader skips to the start.
    #[cold]
    fn pad_skipped(&self) {
        let at = offset(self.head, self.size);
        let all = self.ring.bytes(self.size);
        all[at..at + 4].copy_from_slice(&(self.skipped as u32).to_le_bytes());
        all[at + 4..at + 8].copy_from_slice(&PADDING.to_le_bytes());
    }

    /// Overwrites 8 bytes at `at`, written before (a word known only later).
    #[inline]
    pub fn patch_u64(&mut self, at: usize, v: u64) {
        self.patch_word(at, v.to_le_bytes());
    }

    /// Overwrites 4 bytes at `at`, written before.
    #[inline]
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        self.patch_word(at, v.to_le_bytes());
    }

    #[inline(always)]
    fn patch_word<const N: usize>(&mut self, at: usize, bytes: [u8; N]) {
        assert!(at + N <= self.len, "a patch lies in what was written");
        // SAFETY: checked above: the bytes lie in the written part of the buffer.
        unsafe { core::ptr::write_unaligned(self.buf.as_mut_ptr().add(at) as *mut [u8; N], bytes) };
    }

    /// Pads to 8 bytes, writes the size into the first 4 and publishes the record.
    /// By reference: moving the writer would copy it through a vector register.
    #[inline(always)]
    pub fn commit(&mut self) -> Result<(), Full> {
        let padded = (self.len + ALIGN - 1) & !(ALIGN - 1);
        if padded > self.buf.len() {
            return Err(Full);
        }
        self.len = padded;
        self.patch_u32(0, padded as u32);
        if self.skipped != 0 {
            self.pad_skipped();
        }
        let head = self.head + (self.skipped + padded) as u64;
        self.ring.producer.0.head.store(head, Ordering::Release);
        let size = self.size;
        let (at, faulted) = (offset(head, size), self.ring.paging.0.faulted.load(Ordering::Relaxed));
        if (head - self.tail) as usize > high_water(size) || (faulted < size && at + FAULT_MARGIN > faulted) {
            self.ring.after_commit(at, faulted, size);
        }
        // Asks for the lines a few records ahead now, for writing: the next records find
        // them in this core's cache instead of waiting for each one.
        let ahead = offset(head + PREFETCH as u64, size);
        // SAFETY: prefetching has no effect on memory; the address lies in the ring.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_ET0 }>(
                (self.ring.data + ahead) as *const i8,
            )
        };
        Ok(())
    }
}

/// What the drain thread sees of a ring in use.
pub struct InUse {
    pub ring: &'static Ring,
    pub released: bool,
}

/// The rings in use (drain thread); a ring whose thread is gone is released.
pub fn in_use() -> Vec<InUse> {
    let Some(pool) = pool() else { return Vec::new() };
    pool.rings
        .iter()
        .filter_map(|ring| match ring.state.load(Ordering::Acquire) {
            OWNED => {
                let tid = ring.tid.load(Ordering::Relaxed);
                if tid != 0 && !sys::thread_exists(tid) {
                    ring.state.store(RELEASED, Ordering::Release);
                    return Some(InUse { ring, released: true });
                }
                Some(InUse { ring, released: false })
            }
            RELEASED => Some(InUse { ring, released: true }),
            _ => None,
        })
        .collect()
}

impl Ring {
    /// Hands every complete record between the tail and the head to `f`, then frees their
    /// room (drain thread). Padding records are skipped.
    pub fn drain(&self, mut f: impl FnMut(&[u8])) {
        let size = ring_size();
        let head = self.producer.0.head.load(Ordering::Acquire);
        let mut tail = self.tail.0.load(Ordering::Relaxed);
        let all = self.bytes(size);
        while tail < head {
            let at = offset(tail, size);
            let len = u32::from_le_bytes(all[at..at + 4].try_into().unwrap()) as usize;
            let event = u32::from_le_bytes(all[at + 4..at + 8].try_into().unwrap());
            if len == 0 || at + len > size {
                break; // cannot happen with a well-behaved writer; never read past the ring
            }
            if event != PADDING {
                f(&all[at..at + len]);
            }
            tail += len as u64;
        }
        self.tail.0.store(head.max(tail), Ordering::Release);
    }

    /// Makes a released ring free again once drained (drain thread).
    pub fn recycle(&self) {
        if self.producer.0.head.load(Ordering::Acquire) == self.tail.0.load(Ordering::Relaxed) {
            self.empty();
            self.state.store(FREE, Ordering::Release);
        }
    }
}

/// In the child of `fork` (one thread): the other threads' rings and every pending record are
/// the parent's, which drains its own copies. The forking thread keeps its ring, empty.
pub fn after_fork() {
    PID.store(sys::getpid(), Ordering::Relaxed);
    let Some(pool) = pool() else { return };
    let mine = mine_index();
    for (i, ring) in pool.rings.iter().enumerate() {
        ring.empty();
        // Shared with the parent until written: each page would fault again.
        ring.paging.0.reset();
        if mine != 0 && mine != u32::MAX && i == mine as usize - 1 {
            ring.tid.store(sys::gettid(), Ordering::Relaxed);
            ring.pid.store(PID.load(Ordering::Relaxed), Ordering::Relaxed);
            ring.generation.fetch_add(1, Ordering::Release);
        } else {
            ring.state.store(FREE, Ordering::Release);
        }
    }
}

/// Gives the rings' pages back once an attach session's stream ended (its probes gone, its
/// records all written, its drain thread ending): a later stream starts from empty rings.
pub fn release_pages() {
    let Some(pool) = pool() else { return };
    let Some(first) = pool.rings.first() else { return };
    for ring in pool.rings.iter() {
        ring.empty();
        ring.paging.0.reset();
    }
    let (at, len) = (first.data, sys::page_ceil(pool.rings.len() * pool.size));
    // SAFETY: MADV_DONTNEED on the rings' own reservation (private, anonymous: it reads as
    // zeros after); they are empty and nothing writes them until a later `init`.
    let _ = unsafe { sys::call(Call::Other, libc::SYS_madvise, [at, len, libc::MADV_DONTNEED as usize, 0, 0, 0]) };
}
