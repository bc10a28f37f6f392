//! The end of a run, whichever way the process ends (`hazard::endings` calls [`finish`]):
//! once per process, in this order:
//! 0. an attach session's own report, to its session (`attach::agent::process_ends`);
//! 1. probe sites whose code something else changed, and probes whose module never loaded
//!    (before the handlers' exits, which may unregister them);
//! 2. the program's stdio, for `exit` only (`_exit` and a fatal signal do not flush it, as
//!    without the runtime): a handler library that crashes in `uprobe_exit` then cannot lose
//!    the program's output;
//! 3. every handler library's `uprobe_exit`, last loaded first;
//! 4. the end of the event stream, and the aggregations' reports;
//! 5. the runtime's own lines: hits that ran no handler, and `--stats`;
//! 6. if writes of the output failed, one line on stderr saying so and what was lost
//!    (`hazard::endings` then turns an exit status of 0 into 74, EX_IOERR).
//!
//! Asynchronous signals are blocked while it runs: one that arrives then neither cuts it short
//! nor changes how the process ends (the program had already chosen). Before an `exec`, the
//! probes still armed are then removed and the mask put back: if the exec fails all the same
//! (`hazard::exec` lets through only those the kernel may accept), the program goes on
//! unprobed, and its report is not printed again. Another thread that ends the
//! process meanwhile waits (two seconds at most) for the report to finish.
//!
//! Context: normal (exit, `_exit`, exec) or a fatal signal's handler (then under the
//! watchdog of `hazard::endings`).

use core::sync::atomic::{AtomicI32, Ordering};

use crate::api::handlers;
use crate::attach;
use crate::base::{output, stats, sys};
use crate::hazard::endings::Ending;
use crate::probe::{lifecycle, report};
use crate::{aggregate, trace};

/// The process, and the thread, that started the report; and the process that finished it.
static STARTED_PID: AtomicI32 = AtomicI32::new(0);
static STARTED_TID: AtomicI32 = AtomicI32::new(0);
static DONE_PID: AtomicI32 = AtomicI32::new(0);

/// How long another thread waits for the report before ending the process anyway.
const WAIT_NS: u64 = 2_000_000_000;

/// Runs the end-of-run report (see the module doc), once per process.
pub fn finish(how: Ending) {
    let (pid, tid) = (sys::getpid(), sys::gettid());
    if STARTED_PID.swap(pid, Ordering::SeqCst) == pid {
        // Already reporting: this thread again (a crash in the report itself), or another
        // one, which waits for the report before it ends the process.
        if STARTED_TID.load(Ordering::SeqCst) != tid {
            let start = sys::monotonic_ns();
            while DONE_PID.load(Ordering::SeqCst) != pid && sys::monotonic_ns() - start < WAIT_NS {
                sys::sched_yield();
            }
        }
        return;
    }
    STARTED_TID.store(tid, Ordering::SeqCst);
    // The program has decided how it ends: a signal sent meanwhile must neither cut the
    // report short nor change that ending (without the runtime, the process would already be
    // gone). Only the signals a fault raises, glibc's own two, and, for a fatal signal's
    // report, the watchdog's, stay open.
    let old_mask = sys::block_signals(!kept_open(how));
    // An attach session's libraries report to their session first.
    attach::agent::process_ends();
    report::report_changed_sites();
    lifecycle::report_pending();
    if how == Ending::Exit {
        // SAFETY: fflush(NULL) flushes every stdio stream; exit() is about to do the same.
        unsafe { libc::fflush(core::ptr::null_mut()) };
    }
    handlers::call_exits(matches!(how, Ending::Signal(_)));
    output::flush();
    trace::drain::finish();
    trace::filter::report();
    aggregate::report::finish();
    aggregate::feed::end();
    report::report_missed();
    if stats::PRINT.load(Ordering::Relaxed) {
        report::report_returns();
        output::message(format_args!("{}", stats::summary()));
    }
    // Output that could not be written is said once, on the process's own stderr.
    output::report_failure();
    if how == Ending::Exec {
        lifecycle::unregister_everything();
        // The exec'd program inherits the mask (and gets what arrived meanwhile, as it
        // would have); an exit keeps the signals blocked to its end.
        sys::set_signal_mask(old_mask);
    }
    DONE_PID.store(pid, Ordering::SeqCst);
}

/// The signals the report leaves deliverable: those a fault raises (a handler's fault is
/// still named, a probe still hits), glibc's internal ones (another thread's `setuid` waits
/// for every thread), and SIGALRM for a fatal signal's watchdog.
fn kept_open(how: Ending) -> u64 {
    let bit = |sig: i32| 1u64 << (sig - 1);
    let mut open = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGABRT, 32, 33]
        .into_iter()
        .fold(0, |m, s| m | bit(s));
    if matches!(how, Ending::Signal(_)) {
        open |= bit(libc::SIGALRM);
    }
    open
}
