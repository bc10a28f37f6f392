//! The program's signal masks: `sigprocmask`, `pthread_sigmask` and `sigsuspend` are
//! interposed so that SIGTRAP stays deliverable (a probe hit must never meet a blocked
//! SIGTRAP); the thread remembers that the program blocked it and reports it blocked. A
//! SIGTRAP the program sends itself (`raise`, `kill`) while it believes SIGTRAP blocked is
//! held and delivered when the program unblocks it; a trap the CPU raises then (its own
//! `int3`) ends the process with SIGTRAP, as the kernel would for a blocked synchronous trap.
//!
//! Context: the interposers run as the program's calls (normal context or its signal
//! handlers); [`trap_blocked`] and [`hold_trap`] in the SIGTRAP handler.

use core::ffi::c_int;

use crate::base::stats::Call;
use crate::base::sys;
use crate::hazard::interpose::{next, Next};
use crate::hazard::sigset::{self, bits, set_of, TRAP_BIT};
use crate::probe::thread;

type MaskFn = unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;
type SuspendFn = unsafe extern "C" fn(*const libc::sigset_t) -> c_int;

static SIGPROCMASK: Next = Next::new(c"sigprocmask");
static PTHREAD_SIGMASK: Next = Next::new(c"pthread_sigmask");
static SIGSUSPEND: Next = Next::new(c"sigsuspend");

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
        thread::current().trap_blocked.set(true);
    }
}

/// Whether the program believes SIGTRAP blocked on the calling thread (signal-safe).
pub fn trap_blocked() -> bool {
    thread::current().trap_blocked.get()
}

/// Holds a SIGTRAP the program sent while it believes it blocked (signal-safe).
pub fn hold_trap() {
    thread::current().trap_pending.set(true);
}

/// A mask change of the program: SIGTRAP stays deliverable, the program's view is kept.
fn mask_change(real: &Next, how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int {
    let call = |set: *const libc::sigset_t| {
        if thread::pooled_states() {
            return raw_sigmask(how, set, old);
        }
        // SAFETY: forwarding null or valid sets to the libc function of the same signature.
        unsafe { next!(real, MaskFn)(how, set, old) }
    };
    if !sigset::active() {
        return call(set);
    }
    let t = thread::current();
    let was = t.trap_blocked.get();
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
    t.trap_blocked.set(now);
    if was && !now && t.trap_pending.replace(false) {
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
    if thread::pooled_states() && !set.is_null() {
        return raw_sigsuspend(set);
    }
    // SAFETY: forwarding a null or valid set.
    unsafe { next!(SIGSUSPEND, SuspendFn)(set) }
}

// A runtime loaded into a running process reaches these interposers through internal probes
// on libc's own functions (see `late`): calling those functions from here would meet the
// probes again, so it makes the system calls glibc makes, as glibc makes them.

/// glibc's `pthread_sigmask`: its two internal signals (SIGCANCEL, SIGSETXID) never blocked,
/// the errno returned.
fn raw_sigmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int {
    let internal = sigset::bit(32) | sigset::bit(33);
    // SAFETY: `set` is null or valid (libc contract).
    let copy = unsafe { set.as_ref() }.map(|s| bits(s) & !internal);
    let set = copy.as_ref().map_or(0, |c| c as *const u64 as usize);
    let args = [how as usize, set, old as usize, 8, 0, 0];
    // SAFETY: rt_sigprocmask reads one 8-byte set (a live local, or none) and writes the
    // caller's sigset_t (valid or null, libc contract), whose first 8 bytes are the kernel's.
    match unsafe { sys::call(Call::Other, libc::SYS_rt_sigprocmask, args) } {
        Ok(_) => 0,
        Err(e) => e,
    }
}

/// glibc's `sigsuspend`: -1 with errno set (EINTR once a handler ran).
fn raw_sigsuspend(set: *const libc::sigset_t) -> c_int {
    // SAFETY: `set` is valid (libc contract).
    let mask = bits(unsafe { &*set });
    let args = [&mask as *const u64 as usize, 8, 0, 0, 0, 0];
    // SAFETY: rt_sigsuspend reads one 8-byte set, a live local.
    let e = unsafe { sys::call(Call::Other, libc::SYS_rt_sigsuspend, args) }.err().unwrap_or(libc::EINTR);
    thread::current().set_errno(e);
    -1
}
