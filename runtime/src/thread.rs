//! The runtime's per-thread state, in one thread-local block: the hit paths reach all of it
//! with a single TLS lookup (in a shared library, every thread-local access is a call).
//!
//! Signal-safe: the block is constant-initialised, has no destructor, and lives in the static
//! TLS of a preloaded library, so no access allocates or registers anything.

use std::cell::{Cell, UnsafeCell};

use crate::retprobe::ReturnStack;

pub struct ThreadState {
    /// Handling a probe hit (handlers included): hits meanwhile run no handler.
    pub busy: Cell<bool>,
    /// Running the SIGTRAP handler, which interrupted arbitrary code.
    pub in_signal: Cell<bool>,
    /// How deep the thread is inside the runtime's entry points.
    pub depth: Cell<u32>,
    /// Registration requests queued by handlers (see `api`).
    pub queued: Cell<usize>,
    /// The probe object whose handler the thread runs, or 0 (see `faults`).
    pub handling: Cell<usize>,
    /// Pending returns of return probes.
    pub returns: UnsafeCell<ReturnStack>,
    /// The thread's reader slot in the registry, plus one; 0: none claimed yet; `u32::MAX`:
    /// none to be had (the thread uses the shared counters).
    pub reader: Cell<u32>,
}

thread_local! {
    static STATE: ThreadState = const {
        ThreadState {
            busy: Cell::new(false),
            in_signal: Cell::new(false),
            depth: Cell::new(0),
            queued: Cell::new(0),
            reader: Cell::new(0),
            handling: Cell::new(0),
            returns: UnsafeCell::new(ReturnStack::EMPTY),
        }
    };
}

/// The calling thread's state. The reference cannot leave the thread (`ThreadState` is not
/// `Sync`), and the thread outlives every use of it.
pub fn current() -> &'static ThreadState {
    // SAFETY: the block lives as long as the thread; the `'static` reference is confined to
    // this thread because `&ThreadState` is not `Send`.
    STATE.with(|s| unsafe { &*(s as *const ThreadState) })
}
