//! Every way the process ends, so that the end-of-run report (handlers' `uprobe_exit`, the
//! event stream's end, the runtime's own lines) is never lost:
//!
//! - returning from `main` or calling `exit`: an `atexit` handler ([`at_exit`]);
//! - `_exit` and `_Exit`: interposed;
//! - `exec`: interposed (`hazard::exec`); the report comes before the new program starts;
//! - a signal whose default action ends the process ([`FATAL`], SIGSEGV, SIGBUS, SIGTRAP):
//!   the runtime's handler stands in for the default action while the program leaves it
//!   (`on_fatal`): it reports, then the process dies of the same signal, with the same
//!   status and core dump. A watchdog ends the process by that signal if the report does not
//!   finish within two seconds (a handler's `uprobe_exit` may block when the program died
//!   holding a lock, inside `malloc` say).
//!
//! SIGKILL, an `exit_group` system call made without libc, and a fault while SIGSEGV is
//! blocked end the process with no chance to report.
//!
//! A child that shares the process's memory (`vfork`) reports nothing: its `_exit` and `exec`
//! end the child, not the process. The report itself belongs to the face (`api::ending`),
//! given here as a hook at start-up.
//!
//! Context: the program's calls, and signal handlers for the fatal signals.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use crate::base::abi::PtRegs;
use crate::base::{output, sys};
use crate::hazard::interpose::Next;
use crate::hazard::sigset;
use crate::probe::dispatch;

/// How the process ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// `exit`, or a return from `main`.
    Exit,
    /// `_exit`/`_Exit`: no stdio flush, as the program asked.
    QuickExit,
    /// An `exec` replaces the program.
    Exec,
    /// A signal's default action.
    Signal(c_int),
}

/// The signals whose default action ends the process, besides SIGSEGV, SIGBUS and SIGTRAP
/// (which have handlers of their own). glibc's internal signals (32, 33) are left alone.
pub const FATAL: [c_int; 19] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGILL,
    libc::SIGABRT,
    libc::SIGFPE,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGPIPE,
    libc::SIGALRM,
    libc::SIGTERM,
    libc::SIGSTKFLT,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGIO,
    libc::SIGPWR,
    libc::SIGSYS,
];

/// The report (`fn(Ending)`), installed at start-up; 0 before.
static REPORT: AtomicUsize = AtomicUsize::new(0);
/// This process's id, to tell a `vfork` child (same memory, another id) from the process.
static PID: AtomicI32 = AtomicI32::new(0);
/// The signal the process is dying of, while its report runs (for the watchdog).
static DYING: AtomicI32 = AtomicI32::new(0);

/// Seconds a report may take in a signal handler before the process dies anyway.
const WATCHDOG_SECONDS: u32 = 2;

/// Start-up: the report to run, and the process's id.
pub fn init(report: fn(Ending)) {
    REPORT.store(report as usize, Ordering::Release);
    note_pid();
    for next in [&EXIT, &EXIT_UPPER, &EXIT_LIBC] {
        next.resolve();
    }
    super::exec::resolve_all();
}

/// Remembers the process's id (start-up, and the child of `fork`).
pub fn note_pid() {
    PID.store(sys::getpid(), Ordering::Relaxed);
}

/// Whether the caller is a child sharing the process's memory (`vfork`, before it execs).
pub fn in_vfork_child() -> bool {
    sys::getpid() != PID.load(Ordering::Relaxed)
}

/// The process ends as `how` says: runs the report (once; see `api::ending`).
pub fn end(how: Ending) {
    let report = REPORT.load(Ordering::Acquire);
    if report == 0 || in_vfork_child() {
        return;
    }
    // SAFETY: set only to a `fn(Ending)` by `init`.
    let report: fn(Ending) = unsafe { core::mem::transmute::<usize, fn(Ending)>(report) };
    if let Ending::Signal(sig) = how {
        start_watchdog(sig);
        report(how);
        sys::alarm(0);
    } else {
        report(how);
    }
}

/// Arms the watchdog: SIGALRM in `WATCHDOG_SECONDS` ends the process by `sig`.
fn start_watchdog(sig: c_int) {
    DYING.store(sig, Ordering::SeqCst);
    // SAFETY: a zeroed sigaction is valid; handler and flags are set below.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = on_watchdog as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO;
    sigset::real_sigaction(libc::SIGALRM, Some(&sa), None);
    let unblock = sigset::set_of(sigset::bit(libc::SIGALRM));
    sigset::real_pthread_sigmask(libc::SIG_UNBLOCK, Some(&unblock), None);
    sys::alarm(WATCHDOG_SECONDS);
}

extern "C" fn on_watchdog(_sig: c_int, _info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    sigset::die_by(DYING.load(Ordering::SeqCst));
}

/// The runtime's handler for a [`FATAL`] signal the program leaves at its default (signal
/// context): reports, then dies of it as the default action would have.
pub(crate) extern "C" fn on_fatal(sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    end(Ending::Signal(sig));
    if code > 0 && matches!(sig, libc::SIGILL | libc::SIGFPE) {
        // The faulting instruction runs again and meets the default action: the same death.
        sigset::default_action(sig);
    } else {
        sigset::die_by(sig);
    }
}

/// The `atexit` handler: the program returned from `main` or called `exit`. `exit` ends in
/// `_exit`, whose probes hit now, before the report (see `probe::dispatch::hit_ahead`),
/// with the status given to `exit` when the program called it itself (0 after a return from
/// `main`, which glibc's start code passes to `exit` directly).
pub extern "C" fn at_exit() {
    if in_vfork_child() {
        end(Ending::Exit);
        return;
    }
    let status = EXIT_STATUS.load(Ordering::Relaxed);
    exit_hit_ahead(status);
    end(Ending::Exit);
    if output::failed() {
        // The run lost output: the status says so. The report flushed stdio already; what
        // is left of `exit` (later atexit handlers, destructors) is skipped.
        // SAFETY: libc's _exit, which takes the status and does not return.
        unsafe { core::mem::transmute::<*mut c_void, extern "C" fn(c_int) -> !>(EXIT.get())(failed_status(status)) }
    }
}

/// The exit status of a process whose output could not all be written: EX_IOERR (74), the
/// status of sysexits.h for an output error, unless the program chose a non-zero one.
pub const OUTPUT_FAILED: c_int = 74;

fn failed_status(status: c_int) -> c_int {
    match status & 0xff {
        0 if output::failed() => OUTPUT_FAILED,
        _ => status,
    }
}

/// The status the program gave `exit`.
static EXIT_STATUS: AtomicI32 = AtomicI32::new(0);

static EXIT: Next = Next::new(c"_exit");
static EXIT_UPPER: Next = Next::new(c"_Exit");
static EXIT_LIBC: Next = Next::new(c"exit");

/// The probes of libc's `_exit`, hit before the report that precedes it.
fn exit_hit_ahead(status: c_int) {
    let mut regs = PtRegs { rdi: status as u64, ..PtRegs::default() };
    regs.rsp = &regs as *const PtRegs as u64;
    dispatch::hit_ahead(EXIT.get() as usize, &mut regs);
}

/// `exit(3)`, interposed only to know the status (see [`at_exit`]).
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn exit(status: c_int) -> ! {
    EXIT_STATUS.store(status, Ordering::Relaxed);
    // SAFETY: libc's exit, which takes the status and does not return.
    unsafe { core::mem::transmute::<*mut c_void, extern "C" fn(c_int) -> !>(EXIT_LIBC.get())(status) }
}

/// `_exit(2)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    if !in_vfork_child() {
        exit_hit_ahead(status);
    }
    end(Ending::QuickExit);
    let status = if in_vfork_child() { status } else { failed_status(status) };
    // SAFETY: libc's _exit, which takes the status and does not return.
    unsafe { core::mem::transmute::<*mut c_void, extern "C" fn(c_int) -> !>(EXIT.get())(status) }
}

/// `_Exit(3)`, interposed: as `_exit`.
///
/// # Safety
/// The libc contract.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    if !in_vfork_child() {
        exit_hit_ahead(status);
    }
    end(Ending::QuickExit);
    let status = if in_vfork_child() { status } else { failed_status(status) };
    // SAFETY: libc's _Exit, which takes the status and does not return.
    unsafe { core::mem::transmute::<*mut c_void, extern "C" fn(c_int) -> !>(EXIT_UPPER.get())(status) }
}
