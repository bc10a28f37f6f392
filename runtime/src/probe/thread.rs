//! The runtime's per-thread state, in one thread-local block. In a shared library every
//! thread-local access is a call into the dynamic loader (`__tls_get_addr`); the hit paths
//! make none: a runtime preloaded with the program has its thread-local storage in the
//! static TLS block, at the same offset from every thread's thread pointer (`%fs:0`), which
//! start-up measures once ([`init_static`]); from then on the state is one load of `%fs:0`
//! and an add. A runtime loaded into a running process (attach) keeps the states in a pool
//! found by the thread pointer instead (see below).
//!
//! Signal-safe: the block is constant-initialised, has no destructor, and lives in the static
//! TLS of a preloaded library, so no access allocates or registers anything.
//!
//! Two marks decide what a probe hit on this thread does:
//! - `busy`: the thread is handling a hit (handlers included). A hit meanwhile runs no
//!   handler and calls nothing: it only executes the displaced instruction. Every hit path
//!   sets it before it calls anything that may be probed (libc's `__errno_location`
//!   included).
//! - `depth`: the thread is inside one of the runtime's entry points (registration, lookups):
//!   its hits are the runtime's own, not the program's, and run no handler either.
//! - `entry`: the thread runs a handler library's `uprobe_init` or `uprobe_exit`: its hits
//!   are the handler library's own and run no handler (as the kernel counts none of a
//!   module's init).
//!
//! A jump probe's stub may count a hit itself (`insn::stub`): it reads one word of the state,
//! `counting`, at a fixed offset from the thread pointer ([`counting_offset`]). The word is
//! the thread's counter block while the thread is not quiet, and 0 otherwise, so that a
//! stub counts exactly the hits the common path would: every change of the three marks goes
//! through [`ThreadState::change_marks`].

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicPtr, AtomicUsize, Ordering};

use crate::base::sys;
use crate::base::sys::thread_pointer;
use crate::probe::returns::ReturnStack;

/// Registration requests a thread's handlers may queue (see `deferred`).
pub const QUEUE_LEN: usize = 32;

pub struct ThreadState {
    /// Handling a probe hit (handlers included): hits meanwhile run no handler.
    pub busy: Cell<bool>,
    /// Running the SIGTRAP handler, which interrupted arbitrary code.
    pub in_signal: Cell<bool>,
    /// How deep the thread is inside the runtime's entry points.
    pub depth: Cell<u32>,
    /// How deep the thread is inside a handler library's `uprobe_init`/`uprobe_exit`.
    pub entry: Cell<u32>,
    /// Which one ("LIB: uprobe_exit()"), for a fault there: a `&'static str`, or (0, 0).
    entry_what: Cell<(usize, usize)>,
    /// Registration requests queued by handlers (see `deferred`).
    pub queued: Cell<usize>,
    /// The probe object whose handler the thread runs, or 0 (see `owners`).
    pub handling: Cell<usize>,
    /// The address of that handler's code, or 0: whose output the thread writes (an attach
    /// session's libraries have their own, see `base::route`).
    pub code: Cell<usize>,
    /// Pending returns of return probes.
    pub returns: UnsafeCell<ReturnStack>,
    /// The thread's reader slot in `rcu`, plus one; 0: none claimed yet; `u32::MAX`: none to
    /// be had (the thread uses the shared counters).
    pub reader: Cell<u32>,
    /// The address of that slot's sequence (0: none claimed, or none to be had), so that a
    /// read-side section is one load and one add.
    pub reader_seq: Cell<usize>,
    /// The queued requests themselves, in `deferred`'s encoding (two words each).
    pub requests: [Cell<[usize; 2]>; QUEUE_LEN],
    /// A thread of the runtime's own (an attach session's agent) while it is idle, running
    /// none of the program's or the handler libraries' code (see `world`).
    pub own: Cell<bool>,
    /// The thread's id and name as a predicate last read them (0 and empty: not yet), so
    /// that a filter on `tid` or `comm` makes a system call at the thread's first such hit
    /// only (`trace::filter`; a fork's child forgets them).
    pub filter_tid: Cell<i32>,
    pub filter_comm: Cell<[u8; 16]>,
    /// The thread's event ring and counter block (`trace::buffers`, `aggregate::blocks`):
    /// (the generation of the pool it is of, its index or address); a generation other than
    /// the pool's means none claimed yet (zero: never).
    pub ring: Cell<(u32, u32)>,
    pub block: Cell<(u32, usize)>,
    /// Where the hit being handled saved xmm0 (the others follow, 16 bytes apart), for
    /// fetchargs that read `%xmmN`; 0: not saved (see `insn::vector::saved_xmm`).
    pub vectors: Cell<usize>,
    /// The thread's counter block for counts made in a stub, or 0 (`aggregate::blocks`).
    pub count_block: Cell<usize>,
    /// What stubs read: `count_block` while the thread is not quiet, otherwise 0.
    pub counting: Cell<usize>,
    /// The program believes SIGTRAP blocked on this thread, and a SIGTRAP it sent itself
    /// meanwhile waits for it to unblock (see `hazard::masks`).
    pub trap_blocked: Cell<bool>,
    pub trap_pending: Cell<bool>,
}

thread_local! {
    static STATE: ThreadState = const { ThreadState::fresh() };
}

/// Where `STATE` lies from the thread pointer, the same in every thread (measured by
/// [`init_static`]), or `NOT_STATIC` before, and where the runtime was not preloaded.
static STATE_OFFSET: AtomicIsize = AtomicIsize::new(NOT_STATIC);
const NOT_STATIC: isize = isize::MIN;

/// Measures where the thread state lies from the thread pointer (start-up of a runtime
/// preloaded with the program, before any probe is placed and before the program's threads
/// exist). The dynamic loader gives the thread-local storage of every library loaded with
/// the program a fixed place in the static TLS block, below the thread pointer (the x86-64
/// TLS ABI, variant II), and copies it for each new thread at that same place.
pub fn init_static() {
    let at = STATE.with(|s| s as *const ThreadState as usize);
    let offset = at.wrapping_sub(thread_pointer()) as isize;
    // The static block lies below the thread pointer and is small; anything else would be
    // storage the loader allocated for this thread alone: keep the loader's lookup then.
    if (-(1 << 24)..0).contains(&offset) {
        STATE_OFFSET.store(offset, Ordering::Relaxed);
    }
}

/// Where the calling thread's `counting` word lies from its thread pointer, the same for every
/// thread: known where thread states are static (a runtime preloaded with the program).
pub fn counting_offset() -> Option<i32> {
    let offset = STATE_OFFSET.load(Ordering::Relaxed);
    if offset == NOT_STATIC || pooled_states() {
        return None;
    }
    i32::try_from(offset + core::mem::offset_of!(ThreadState, counting) as isize).ok()
}

/// The calling thread's state. The reference cannot leave the thread (`ThreadState` is not
/// `Sync`), and the thread outlives every use of it.
#[inline]
pub fn current() -> &'static ThreadState {
    let offset = STATE_OFFSET.load(Ordering::Relaxed);
    if offset != NOT_STATIC {
        // SAFETY: the thread's own copy of `STATE`, at the offset every thread has it (see
        // `init_static`), as long-lived and confined as below.
        return unsafe { &*(thread_pointer().wrapping_add(offset as usize) as *const ThreadState) };
    }
    current_slow()
}

/// [`current`] before start-up, or for a runtime not preloaded: through the pool, or the
/// dynamic loader's lookup, which is no hit-path code (it may use the vector registers).
#[cold]
fn current_slow() -> &'static ThreadState {
    if POOLED.load(Ordering::Relaxed) {
        return pooled();
    }
    let mut state = core::ptr::null::<ThreadState>();
    crate::insn::vector::saving_vectors(|| state = STATE.with(|s| s as *const ThreadState));
    // SAFETY: the block lives as long as the thread; the `'static` reference is confined to
    // this thread because `&ThreadState` is not `Send`.
    unsafe { &*state }
}

// The states of a runtime loaded into a running process (attach). Its thread-local storage
// is then not static: glibc allocates a thread's block on its first access, with malloc and
// under the loader's lock, which a hit may have interrupted (a probe on malloc itself would
// recurse). So the states are found by the thread pointer instead (`%fs:0`, the TCB), in a
// lock-free table, and mapped on a thread's first hit with a raw mmap. A thread that ends
// leaves its state to the next thread whose TCB takes the same place (glibc reuses them): the
// state is then idle (not busy, no depth) and its return records are dropped by stack
// position like those of any frame left without returning.

/// Whether thread states come from the pool (set once, before any probe is placed).
static POOLED: AtomicBool = AtomicBool::new(false);
const POOL_BITS: u32 = 14;
const POOL: usize = 1 << POOL_BITS;
static KEYS: [AtomicUsize; POOL] = [const { AtomicUsize::new(0) }; POOL];
static STATES: [AtomicPtr<ThreadState>; POOL] = [const { AtomicPtr::new(core::ptr::null_mut()) }; POOL];

/// A state for threads that cannot get their own (the pool is full, or memory is out): quiet
/// forever, so its hits run no handler and only execute the displaced instruction, which
/// touches nothing of it.
struct Fallback(ThreadState);
// SAFETY: see above: no path writes a quiet state's fields on a hit; only a program thread
// calling the runtime's API could, and then only the entry depth, which stays non-zero, and
// the `counting` word, which a quiet state's is always (0).
unsafe impl Sync for Fallback {}
static FALLBACK: Fallback = Fallback(ThreadState {
    busy: Cell::new(true),
    depth: Cell::new(1),
    reader: Cell::new(u32::MAX),
    ..ThreadState::fresh()
});

/// Takes thread states from the pool from now on (a runtime loaded by attach, before it
/// places any probe).
pub fn use_pool() {
    POOLED.store(true, Ordering::SeqCst);
}

/// Whether thread states come from the pool (the runtime was loaded into a running process).
pub fn pooled_states() -> bool {
    POOLED.load(Ordering::Relaxed)
}

fn slot_of(tp: usize) -> usize {
    (tp as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) as usize >> (usize::BITS - POOL_BITS)
}

fn find(tp: usize) -> Option<&'static ThreadState> {
    let mut i = slot_of(tp);
    for _ in 0..POOL {
        match KEYS[i].load(Ordering::Acquire) {
            0 => return None,
            // SAFETY: a key is published with its state stored; states are never unmapped.
            k if k == tp => return unsafe { STATES[i].load(Ordering::Acquire).as_ref() },
            _ => i = (i + 1) & (POOL - 1),
        }
    }
    None
}

/// The calling thread's pooled state (signal-safe).
fn pooled() -> &'static ThreadState {
    let tp = thread_pointer();
    if let Some(state) = find(tp) {
        return state;
    }
    // Only this thread looks its own state up: with its signals blocked, no handler of it can
    // claim a second one meanwhile.
    let old = sys::block_signals(!0);
    let state = find(tp).or_else(|| claim(tp)).unwrap_or(&FALLBACK.0);
    sys::set_signal_mask(old);
    state
}

fn claim(tp: usize) -> Option<&'static ThreadState> {
    let size = sys::page_ceil(core::mem::size_of::<ThreadState>());
    // Fresh anonymous memory is all zero bytes, which is a valid idle state: every field is
    // a flag, a counter, a null pointer or an empty record stack.
    let state = sys::mmap_anon(size).ok()? as *mut ThreadState;
    let mut i = slot_of(tp);
    for _ in 0..POOL {
        if KEYS[i].compare_exchange(0, tp, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            STATES[i].store(state, Ordering::Release);
            // SAFETY: a zeroed, mapped state that only this thread uses (see above).
            return Some(unsafe { &*state });
        }
        i = (i + 1) & (POOL - 1);
    }
    // SAFETY: our own fresh mapping, referenced by nobody.
    unsafe { sys::munmap(state as usize, size) };
    None
}

/// In a child after fork, where only the forking thread exists: the pooled states of the
/// other threads go back to idle (one may have been mid-hit), since a thread the child starts
/// may get one of their TCBs, and with it the state.
pub fn pool_after_fork() {
    if !pooled_states() {
        return;
    }
    let own = current() as *const ThreadState;
    for state in &STATES {
        let p = state.load(Ordering::Acquire);
        if !p.is_null() && !core::ptr::eq(p, own) {
            // SAFETY: a mapped pooled state whose thread does not exist in this process; zero
            // bytes are a valid idle state (see `claim`).
            unsafe { core::ptr::write_bytes(p, 0, 1) };
        }
    }
}

impl ThreadState {
    /// A thread's state before its first hit.
    const fn fresh() -> ThreadState {
        ThreadState {
            busy: Cell::new(false),
            in_signal: Cell::new(false),
            depth: Cell::new(0),
            entry: Cell::new(0),
            entry_what: Cell::new((0, 0)),
            queued: Cell::new(0),
            reader: Cell::new(0),
            reader_seq: Cell::new(0),
            handling: Cell::new(0),
            code: Cell::new(0),
            returns: UnsafeCell::new(ReturnStack::EMPTY),
            requests: [const { Cell::new([0; 2]) }; QUEUE_LEN],
            own: Cell::new(false),
            filter_tid: Cell::new(0),
            filter_comm: Cell::new([0; 16]),
            ring: Cell::new((0, 0)),
            block: Cell::new((0, 0)),
            count_block: Cell::new(0),
            counting: Cell::new(0),
            trap_blocked: Cell::new(false),
            trap_pending: Cell::new(false),
            vectors: Cell::new(0),
        }
    }

    /// Reads errno (no call into libc: see `base::sys::errno_location`).
    #[inline(always)]
    pub fn errno(&self) -> i32 {
        crate::base::sys::errno()
    }

    /// Writes errno.
    #[inline(always)]
    pub fn set_errno(&self, value: i32) {
        // SAFETY: the slot is this thread's errno, valid for the thread's life.
        unsafe { *crate::base::sys::errno_location() = value }
    }

    /// Notes that the thread runs the handler at `code` of the probe object `probe` (see
    /// `handling` and `code`); returns what it ran, for [`ThreadState::leave_handler`]. Word
    /// by word: the compiler would move the two neighbours in one vector register, which a
    /// hit path that did not save them may not touch.
    #[inline(always)]
    pub fn enter_handler(&self, probe: usize, code: usize) -> (usize, usize) {
        // SAFETY: the thread's own cells, not borrowed across this call.
        unsafe {
            let outer = (self.handling.as_ptr().read_volatile(), self.code.as_ptr().read_volatile());
            self.handling.as_ptr().write_volatile(probe);
            self.code.as_ptr().write_volatile(code);
            outer
        }
    }

    /// Puts back what [`ThreadState::enter_handler`] returned.
    #[inline(always)]
    pub fn leave_handler(&self, (probe, code): (usize, usize)) {
        // SAFETY: as in `enter_handler`.
        unsafe {
            self.code.as_ptr().write_volatile(code);
            self.handling.as_ptr().write_volatile(probe);
        }
    }

    /// Notes the handler library entry point the thread runs now; returns the one it ran.
    pub fn enter_entry_point(&self, what: &'static str) -> (usize, usize) {
        self.entry_what.replace((what.as_ptr() as usize, what.len()))
    }

    pub fn leave_entry_point(&self, previous: (usize, usize)) {
        self.entry_what.set(previous);
    }

    /// The handler library entry point the thread runs, if any (signal-safe).
    pub fn entry_point(&self) -> Option<&'static str> {
        let (ptr, len) = self.entry_what.get();
        // SAFETY: set only from a `&'static str` by `enter_entry_point`.
        (ptr != 0)
            .then(|| unsafe { core::str::from_utf8_unchecked(core::slice::from_raw_parts(ptr as *const u8, len)) })
    }

    /// Changes the marks that make the thread quiet (`busy`, `depth`, `entry`) with `f`,
    /// keeping the `counting` word stubs read in step: 0 while `f` runs, then the block if the
    /// thread is not quiet. A signal handler that hits a probe in between finds the word 0
    /// and takes the common path, which decides from the marks themselves; one that runs a
    /// whole hit meanwhile leaves the word as the marks were, and the last step sets it again.
    #[inline(always)]
    pub fn change_marks(&self, f: impl FnOnce(&ThreadState)) {
        use core::sync::atomic::compiler_fence;
        // A thread with no block for stubs has its word 0 whatever the marks: nothing to keep
        // in step, unless `f` gives it a block.
        if self.count_block.get() == 0 {
            f(self);
            if self.count_block.get() != 0 {
                compiler_fence(Ordering::SeqCst);
                self.refresh_counting();
            }
            return;
        }
        self.counting.set(0);
        compiler_fence(Ordering::SeqCst);
        f(self);
        compiler_fence(Ordering::SeqCst);
        self.refresh_counting();
    }

    /// Sets or clears the `busy` mark (see [`Self::change_marks`]), in one store for a thread
    /// with no block for stubs.
    #[inline(always)]
    pub fn set_busy(&self, busy: bool) {
        if self.count_block.get() == 0 {
            self.busy.set(busy);
        } else {
            self.change_marks(|t| t.busy.set(busy));
        }
    }

    /// Sets or clears the `busy` mark of a thread that is otherwise not quiet (no `depth`, no
    /// `entry`): [`Self::set_busy`] without looking at the other marks again.
    #[inline(always)]
    pub fn set_busy_alone(&self, busy: bool) {
        use core::sync::atomic::compiler_fence;
        if busy {
            self.counting.set(0);
            compiler_fence(Ordering::SeqCst);
            self.busy.set(true);
        } else {
            self.busy.set(false);
            compiler_fence(Ordering::SeqCst);
            self.counting.set(self.count_block.get());
        }
    }

    /// Sets the `counting` word from the marks and `count_block` (see [`Self::change_marks`]).
    #[inline(always)]
    pub fn refresh_counting(&self) {
        self.counting.set(if self.quiet() { 0 } else { self.count_block.get() });
    }

    /// Whether a hit now is the runtime's own, or comes from inside a handler or a handler
    /// library's entry point: it then runs no handler.
    #[inline(always)]
    pub fn quiet(&self) -> bool {
        self.busy.get() || self.depth.get() != 0 || self.entry.get() != 0
    }
}

/// Whether the calling thread runs the SIGTRAP handler (it then interrupted arbitrary code).
pub fn in_signal() -> bool {
    current().in_signal.get()
}

/// Whether the calling thread is handling a probe hit, i.e. running handlers (signal-safe).
pub fn in_handler() -> bool {
    current().busy.get()
}

/// Whether the calling thread is inside a runtime entry point (signal-safe).
pub fn inside_runtime() -> bool {
    current().depth.get() != 0
}
