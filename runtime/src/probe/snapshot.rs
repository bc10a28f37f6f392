//! A thread's runtime state saved and put back around code that may change it from outside
//! the thread's own flow: a child that shares the thread's memory and thread pointer
//! (`hazard::spawn`).
//!
//! Normal context, on the thread itself, between hits.

use crate::probe::returns::Left;
use crate::probe::thread::ThreadState;
use crate::probe::{rcu, retprobe};

/// A thread's runtime state as it was at one moment, to put back after code that may have
/// changed it from outside the thread's own flow (a child sharing its memory: see
/// `hazard::spawn`).
pub struct Snapshot {
    busy: bool,
    in_signal: bool,
    depth: u32,
    entry: u32,
    queued: usize,
    handling: usize,
    sequence: Option<u64>,
    returns: (usize, usize, usize),
}

impl Snapshot {
    pub fn take(t: &ThreadState) -> Snapshot {
        // SAFETY: the thread's own records, read between hits (the caller is program code).
        let st = unsafe { &*t.returns.get() };
        Snapshot {
            busy: t.busy.get(),
            in_signal: t.in_signal.get(),
            depth: t.depth.get(),
            entry: t.entry.get(),
            queued: t.queued.get(),
            handling: t.handling.get(),
            sequence: rcu::sequence(t),
            returns: (st.depth, st.arena_top, st.thrown_at),
        }
    }

    /// Puts the state back; records pushed meanwhile (by a child, on its own stack) go.
    pub fn restore(self, t: &ThreadState) {
        t.change_marks(|t| {
            t.busy.set(self.busy);
            t.depth.set(self.depth);
            t.entry.set(self.entry);
        });
        t.in_signal.set(self.in_signal);
        t.queued.set(self.queued);
        t.handling.set(self.handling);
        if let Some(sequence) = self.sequence {
            rcu::set_sequence(t, sequence);
        }
        // SAFETY: as in `take`.
        let st = unsafe { &mut *t.returns.get() };
        st.truncate(self.returns.0, self.returns.1, Left::Child, &mut |f, why| retprobe::count_left(f, why));
        st.thrown_at = self.returns.2;
    }
}
