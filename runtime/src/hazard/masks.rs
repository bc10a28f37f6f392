//! The program's signal masks: `sigprocmask`, `pthread_sigmask` and `sigsuspend` are
//! interposed so that SIGTRAP stays deliverable (a probe hit must never meet a blocked
//! SIGTRAP); the thread remembers that the program blocked it and reports it blocked. A
//! SIGTRAP the program sends itself (`raise`, `kill`) while it believes SIGTRAP blocked is
//! held and delivered when the program unblocks it; a trap the CPU raises then (its own
//! `int3`) ends the process with SIGTRAP, as the kernel would for a blocked synchronous trap.
//!
//! Context: the interposers run as the program's calls (normal context or its signal
//! handlers); [`trap_blocked`] and [`hold_trap`] in the SIGTRAP handler.

use core::cell::Cell;
use core::ffi::c_int;

use crate::hazard::interpose::{next, Next};
use crate::hazard::sigset::{self, bits, set_of, TRAP_BIT};

type MaskFn = unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;
type SuspendFn = unsafe extern "C" fn(*const libc::sigset_t) -> c_int;

static SIGPROCMASK: Next = Next::new(c"sigprocmask");
static PTHREAD_SIGMASK: Next = Next::new(c"pthread_sigmask");
static SIGSUSPEND: Next = Next::new(c"sigsuspend");

thread_local! {
    /// The program believes SIGTRAP blocked on this thread.
    static TRAP_BLOCKED: Cell<bool> = const { Cell::new(false) };
    /// A SIGTRAP the program sent while it believed it blocked, to deliver at unblocking.
    static TRAP_PENDING: Cell<bool> = const { Cell::new(false) };
}

/// Start-up: looks the real functions up, and unblocks SIGTRAP: blocked since before exec,
/// it would turn the first probe hit into death.
pub fn init() {
    for next in [&SIGPROCMASK, &PTHREAD_SIGMASK, &SIGSUSPEND] {
        next.resolve();
    }
    let unblock = set_of(TRAP_BIT);
    // SAFETY: a zeroed sigset_t is valid output space.
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    if sigset::real_pthread_sigmask(libc::SIG_UNBLOCK, Some(&unblock), Some(&mut old)) == 0
        && bits(&old) & TRAP_BIT != 0
    {
        TRAP_BLOCKED.with(|b| b.set(true));
    }
}

/// Whether the program believes SIGTRAP blocked on the calling thread (signal-safe).
pub fn trap_blocked() -> bool {
    // A runtime loaded by attach interposes nothing, and its thread-local storage is out of
    // reach in signal context (see `probe::thread`): the program's masks are its own.
    !crate::probe::thread::pooled_states() && TRAP_BLOCKED.with(Cell::get)
}

/// Holds a SIGTRAP the program sent while it believes it blocked (signal-safe).
pub fn hold_trap() {
    TRAP_PENDING.with(|p| p.set(true));
}

/// A mask change of the program: SIGTRAP stays deliverable, the program's view is kept.
fn mask_change(real: &Next, how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int {
    let call = |set: *const libc::sigset_t| {
        // SAFETY: forwarding null or valid sets to the libc function of the same signature.
        unsafe { next!(real, MaskFn)(how, set, old) }
    };
    if !sigset::active() {
        return call(set);
    }
    let was = TRAP_BLOCKED.with(Cell::get);
    let mut copy;
    let mut now = was;
    let set = if set.is_null() {
        set
    } else {
        // SAFETY: `set` is valid (libc contract).
        copy = unsafe { *set };
        let has = bits(&copy) & TRAP_BIT != 0;
        // SAFETY: a valid set and signal number.
        unsafe { libc::sigdelset(&mut copy, libc::SIGTRAP) };
        now = match how {
            libc::SIG_BLOCK => was || has,
            libc::SIG_UNBLOCK => was && !has,
            libc::SIG_SETMASK => has,
            _ => was,
        };
        &copy
    };
    let rc = call(set);
    if rc != 0 {
        return rc;
    }
    if was && !old.is_null() {
        // SAFETY: `old` is valid and was filled in.
        unsafe { libc::sigaddset(old, libc::SIGTRAP) };
    }
    TRAP_BLOCKED.with(|b| b.set(now));
    if was && !now && TRAP_PENDING.with(|p| p.replace(false)) {
        // SAFETY: raise is async-signal-safe; the program's handler now gets its signal.
        unsafe { libc::raise(libc::SIGTRAP) };
    }
    rc
}

/// `sigprocmask(2)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int {
    mask_change(&SIGPROCMASK, how, set, old)
}

/// `pthread_sigmask(3)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int {
    mask_change(&PTHREAD_SIGMASK, how, set, old)
}

/// `sigsuspend(2)`, interposed: a probe hit in a handler that runs while the thread waits
/// must not meet a blocked SIGTRAP.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn sigsuspend(set: *const libc::sigset_t) -> c_int {
    let mut copy;
    let set = if sigset::active() && !set.is_null() {
        // SAFETY: `set` is valid (libc contract); a valid signal number.
        unsafe {
            copy = *set;
            libc::sigdelset(&mut copy, libc::SIGTRAP);
        }
        &copy as *const libc::sigset_t
    } else {
        set
    };
    // SAFETY: forwarding a null or valid set.
    unsafe { next!(SIGSUSPEND, SuspendFn)(set) }
}
