//! The runtime's per-thread state, in one thread-local block: the hit paths reach all of it
//! with a single TLS lookup (in a shared library, every thread-local access is a call into
//! the dynamic loader, which is never probed).
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

use std::cell::{Cell, UnsafeCell};

use crate::probe::returns::ReturnStack;

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
    /// Pending returns of return probes.
    pub returns: UnsafeCell<ReturnStack>,
    /// The thread's reader slot in `rcu`, plus one; 0: none claimed yet; `u32::MAX`: none to
    /// be had (the thread uses the shared counters).
    pub reader: Cell<u32>,
}

thread_local! {
    static STATE: ThreadState = const {
        ThreadState {
            busy: Cell::new(false),
            in_signal: Cell::new(false),
            depth: Cell::new(0),
            entry: Cell::new(0),
            entry_what: Cell::new((0, 0)),
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

impl ThreadState {
    /// Reads errno (no call into libc: see `base::sys::errno_location`).
    pub fn errno(&self) -> i32 {
        crate::base::sys::errno()
    }

    /// Writes errno.
    pub fn set_errno(&self, value: i32) {
        // SAFETY: the slot is this thread's errno, valid for the thread's life.
        unsafe { *crate::base::sys::errno_location() = value }
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

    /// Whether a hit now is the runtime's own, or comes from inside a handler or a handler
    /// library's entry point: it then runs no handler.
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
