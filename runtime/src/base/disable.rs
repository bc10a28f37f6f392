//! The runtime switched off in a process that must run unprobed: a child of `fork` under
//! `--no-follow-fork`, or a process that refuses writable code (W^X). Registration then fails
//! with `-EPERM`; the program runs on.

use core::sync::atomic::{AtomicU8, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reason {
    /// A forked child under `--no-follow-fork`.
    ForkedChild = 1,
    /// The process refuses to make its code writable (`PR_SET_MDWE`, an LSM).
    WriteXorExecute = 2,
}

static REASON: AtomicU8 = AtomicU8::new(0);

/// Switches the runtime off; returns whether this call did (the first one).
pub fn disable(reason: Reason) -> bool {
    REASON.compare_exchange(0, reason as u8, Ordering::SeqCst, Ordering::SeqCst).is_ok()
}

/// Why the runtime is off, if it is (signal-safe).
pub fn reason() -> Option<Reason> {
    match REASON.load(Ordering::Relaxed) {
        1 => Some(Reason::ForkedChild),
        2 => Some(Reason::WriteXorExecute),
        _ => None,
    }
}
