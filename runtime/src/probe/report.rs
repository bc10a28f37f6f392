//! What the runtime says about its probes when the process ends: hits that ran no handler,
//! probe sites someone else changed, and (with `--stats`) calls of return probes that did not
//! return.
//!
//! Normal context, at the end of the run.

use std::sync::atomic::Ordering;

use crate::base::output;
use crate::probe::registry::{self, name_of};
use crate::probe::retprobe;
use crate::probe::table;

/// Says which probe sites hold other bytes than the runtime wrote (at the end of the run,
/// before the handlers' exits take their probes out): something else changed the code while
/// it was probed, a kernel uprobe (perf, bpftrace, ftrace) or a debugger, and hits through it
/// were not seen (a kernel uprobe on a jump site makes the program crash when the function
/// runs, which cannot be prevented from here).
pub fn report_changed_sites() {
    for pp in table::points().filter(|pp| pp.is_armed() && !pp.queued.load(Ordering::SeqCst)) {
        if let Some(line) = pp.changed_message(|| name_of(pp.addr)) {
            output::message(format_args!("{line}"));
        }
    }
}

/// Says, for every probe point, how many hits ran no handler because the thread was already
/// running one (process exit).
pub fn report_missed() {
    for pp in table::points() {
        let missed = pp.missed.load(Ordering::Relaxed);
        if missed > 0 {
            let name = name_of(pp.addr);
            output::message(format_args!(
                "probe at {:#x} ({name}): {missed} hits ran no handler (they came from a handler or from the runtime itself)",
                pp.addr
            ));
        }
    }
}

/// Says, for every return probe, how many of its hooked calls did not come back through
/// it, and why: each hooked call returns, or is counted here (the soak test checks that the
/// two add up).
pub fn report_returns() {
    for (addr, rp) in registry::return_probes() {
        // SAFETY: `return_probes` gives the probes registered a moment ago, under the registry
        // lock; the handler libraries' exits, which unregister theirs, have run already.
        let [gone, child, thread] = unsafe { retprobe::left_counts(rp) };
        let pending = retprobe::pending_here(rp);
        let total = gone + child + thread + pending;
        if total > 0 {
            let name = name_of(addr);
            output::message(format_args!(
                "stats: return probe at {addr:#x} ({name}) in pid {}: {total} calls did not return ({pending} pending at exit, {gone} left by longjmp or an exception or on a stack that is gone, {child} in children that exec'd, {thread} at thread exit)",
                crate::base::sys::getpid()
            ));
        }
    }
}
