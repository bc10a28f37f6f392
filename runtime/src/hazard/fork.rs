//! fork: the child is a copy of the parent, probes and handler state included, which is what
//! kernel uprobes do too. What needs care is the runtime's own locks and counters, copied in
//! whatever state the parent's other threads left them: the `pthread_atfork` handlers hold the
//! registry and allocator locks across the fork and reset the grace-period counters in the
//! child. With `--no-follow-fork` the child also gets its code back without probes and may
//! register no more.
//!
//! `vfork` and `posix_spawn` run no atfork handlers: their child shares the parent's memory
//! until it execs, so nothing may be changed there, and nothing is.

use core::sync::atomic::{AtomicBool, Ordering};

use crate::base::{alloc, disable, output};
use crate::hazard::{endings, late};
use crate::probe::{lifecycle, rcu, thread};

static NO_FOLLOW: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Whether this thread took the locks in the prepare step (not when it forked from
    /// inside the runtime, where it may hold them already).
    static LOCKED: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

extern "C" fn prepare() {
    let locked = !thread::inside_runtime();
    if locked {
        lifecycle::fork_prepare();
        alloc::fork_lock();
    }
    LOCKED.with(|l| l.set(locked));
}

extern "C" fn parent() {
    if LOCKED.with(|l| l.replace(false)) {
        alloc::fork_unlock();
        lifecycle::fork_parent();
    }
}

extern "C" fn child() {
    // A process of its own now: its endings report (a vfork child's do not), and say what
    // its own output lost.
    endings::note_pid();
    output::after_fork();
    if LOCKED.with(|l| l.replace(false)) {
        alloc::fork_unlock();
        let no_follow = NO_FOLLOW.load(Ordering::Relaxed);
        if no_follow {
            disable::disable(disable::Reason::ForkedChild);
        }
        // A child forked during an attach session of a runtime loaded into the running
        // process has no session: its probes go at once (`late`).
        let disarm = late::forked_child() || no_follow;
        // Read-side sections of the parent's other threads were copied half-done and will
        // never end here: forget them, or the child's first unregister would wait for them
        // forever. (A fork from inside a handler keeps its own section, which is still open.)
        if !thread::in_handler() {
            thread::pool_after_fork();
            rcu::readers_after_fork();
        }
        lifecycle::fork_child(disarm);
    }
}

/// Installs the fork handlers (start-up). `no_follow`: children get their code back.
pub fn init(no_follow: bool) {
    NO_FOLLOW.store(no_follow, Ordering::Relaxed);
    // SAFETY: the three handlers are plain functions that stay loaded for the process's life.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}
