//! Signal sets, and the real signal calls the interposers stand in front of: what the signal
//! modules share. Signal-safe.

use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::hazard::interpose::{next, Next};
use crate::probe::{deferred, thread};

type SigactionFn = unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
type MaskFn = unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;

static SIGACTION: Next = Next::new(c"sigaction");
static PTHREAD_SIGMASK: Next = Next::new(c"pthread_sigmask");

/// Set once the interposers have what they need (start-up).
static ACTIVE: AtomicBool = AtomicBool::new(false);

pub const fn bit(sig: c_int) -> u64 {
    1 << (sig - 1)
}

pub const TRAP_BIT: u64 = bit(libc::SIGTRAP);

/// The first 64 signals of a set (all that Linux has), as bits.
pub fn bits(set: &libc::sigset_t) -> u64 {
    // SAFETY: glibc's sigset_t is an array of unsigned longs whose first word holds signals
    // 1..=64 as bits 0..=63, the layout the kernel uses.
    unsafe { *(set as *const libc::sigset_t as *const u64) }
}

pub fn set_of(bits: u64) -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is the empty set; the first word is signals 1..=64.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        *(&mut set as *mut libc::sigset_t as *mut u64) = bits;
        set
    }
}

/// Looks the real functions up (start-up).
pub fn init() {
    SIGACTION.resolve();
    PTHREAD_SIGMASK.resolve();
}

/// Marks the interposers ready.
pub fn activate() {
    ACTIVE.store(true, Ordering::Release);
}

/// Whether the interposers act (before start-up they pass everything through).
pub fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// The libc `sigaction` the program would have called.
pub fn real_sigaction(sig: c_int, act: Option<&libc::sigaction>, old: Option<&mut libc::sigaction>) -> c_int {
    let act = act.map_or(core::ptr::null(), |a| a as *const libc::sigaction);
    let old = old.map_or(core::ptr::null_mut(), |o| o as *mut libc::sigaction);
    // SAFETY: forwarding pointers that are null or valid sigaction structs.
    own_call(|| unsafe { next!(SIGACTION, SigactionFn)(sig, act, old) })
}

/// The libc `pthread_sigmask` the program would have called.
pub fn real_pthread_sigmask(how: c_int, set: Option<&libc::sigset_t>, old: Option<&mut libc::sigset_t>) -> c_int {
    let set = set.map_or(core::ptr::null(), |s| s as *const libc::sigset_t);
    let old = old.map_or(core::ptr::null_mut(), |o| o as *mut libc::sigset_t);
    // SAFETY: as above, for sigset_t.
    own_call(|| unsafe { next!(PTHREAD_SIGMASK, MaskFn)(how, set, old) })
}

/// Runs `f`, a call of the runtime's own into libc: in a runtime loaded into a running
/// process, libc's signal functions carry internal probes that send the program's calls to
/// the interposers (see `late`); the runtime's own calls must pass them unseen.
fn own_call<R>(f: impl FnOnce() -> R) -> R {
    if thread::pooled_states() {
        deferred::inside(f)
    } else {
        f()
    }
}

/// Gives `sig` its default action in the kernel.
pub fn default_action(sig: c_int) {
    // SAFETY: a zeroed sigaction with SIG_DFL is the default action.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = libc::SIG_DFL;
    real_sigaction(sig, Some(&sa), None);
}

/// Ends the process the way `sig`'s default action does (signal context): same signal, same
/// status, a core dump where the signal makes one.
pub fn die_by(sig: c_int) {
    default_action(sig);
    let unblock = set_of(bit(sig));
    real_pthread_sigmask(libc::SIG_UNBLOCK, Some(&unblock), None);
    // SAFETY: raise is async-signal-safe; with the default action the process ends here.
    unsafe { libc::raise(sig) };
}
