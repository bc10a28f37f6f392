//! The gate before a hit is recorded or counted: whether its event is switched on
//! (`--trigger`), and its filter (`if EXPR`, `--filter`, run by `read::passes`); what the
//! filters let through in the stream (hits and passes per event, told at the end of the run;
//! aggregations count them in their blocks); and `--max-events`, the records the stream
//! keeps at most.
//!
//! Context: [`passes_counted`] and [`take_record`] run on the hit path (signal, stub or
//! trampoline context, thread busy: no allocation, no lock, no libc); the rest at start-up,
//! in a fork's child and at the end of the run.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::base::abi::PtRegs;
use crate::base::output;
use crate::probe::thread;
use crate::trace::events::{self, Event};
use crate::trace::names::glob;
use crate::trace::read::passes;

/// `read::passes`, for the stream: a filtered event's passes and fails counted in the event.
#[inline(always)]
pub fn passes_counted(ev: &Event, regs: &PtRegs) -> bool {
    if ev.filter.is_none() {
        return true;
    }
    let pass = passes(ev, regs);
    let counter = if pass { &ev.filter_passed } else { &ev.filter_failed };
    counter.fetch_add(1, Ordering::Relaxed);
    pass
}

/// Whether a hit of `ev` is to be recorded or counted: its event is on (`--trigger`) and
/// its filter passes (counted in the event for the stream, `count` false for aggregations,
/// which count in their blocks); a hit that passes fires the event's triggers. None: the
/// event is off, and the hit is not a hit at all. Hit path.
#[inline(always)]
pub fn admit(ev: &Event, regs: &PtRegs, count: bool) -> Option<bool> {
    if !ev.on.load(Ordering::Relaxed) {
        return None;
    }
    let pass = if count { passes_counted(ev, regs) } else { passes(ev, regs) };
    if pass {
        for &(target, on) in &ev.triggers {
            if let Some(t) = events::get(target) {
                t.on.store(on, Ordering::Relaxed);
            }
        }
    }
    Some(pass)
}

/// Applies `--trigger EVENT:enable=E[,disable=F...]` to the events being made (start-up): an
/// event some trigger enables starts off. The line refusing an unknown name or action.
pub fn triggers(events: &mut [Event], texts: &[String]) -> Result<(), String> {
    let find = |events: &[Event], name: &str, text: &str| -> Result<Vec<u32>, String> {
        let found: Vec<u32> = (0..events.len() as u32)
            .filter(|&i| {
                let e = &events[i as usize];
                glob(name, &e.name) || glob(name, &format!("{}/{}", e.group, e.name))
            })
            .collect();
        if found.is_empty() {
            let known: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
            return Err(format!("--trigger '{text}': no event named {name} (events: {})", known.join(", ")));
        }
        Ok(found)
    };
    let mut started_off = Vec::new();
    // (enabled event, the event whose hit enables it, the option that says so)
    let mut enablers: Vec<(u32, u32, &String)> = Vec::new();
    for text in texts {
        let Some((source, actions)) = text.split_once(':') else {
            return Err(format!("--trigger '{text}': expected EVENT:enable=EVENT or EVENT:disable=EVENT"));
        };
        let sources = find(events, source.trim(), text)?;
        for action in actions.split(',') {
            let (on, target) = match action.trim().split_once('=') {
                Some(("enable", t)) => (true, t.trim()),
                Some(("disable", t)) => (false, t.trim()),
                _ => return Err(format!("--trigger '{text}': expected enable=EVENT or disable=EVENT, not {action:?}")),
            };
            if target.is_empty() {
                return Err(format!(
                    "--trigger '{text}': expected an event name after {}=",
                    action.trim().trim_end_matches('=')
                ));
            }
            for t in find(events, target, text)? {
                if on {
                    started_off.push(t);
                    enablers.extend(sources.iter().map(|&s| (t, s, text)));
                }
                events[t as usize].gated = true;
                for &s in &sources {
                    events[s as usize].triggers.push((t, on));
                    events[s as usize].gated = true;
                }
            }
        }
    }
    // An event enabled only by its own hits starts off and would never be hit.
    for &(t, _, text) in &enablers {
        if enablers.iter().all(|&(u, s, _)| u != t || s == t) {
            let name = &events[t as usize].name;
            return Err(format!(
                "--trigger '{text}': only {name} itself enables {name}, which then starts off and is never hit \
                 (an event some trigger enables waits for another event to enable it)"
            ));
        }
    }
    for t in started_off {
        events[t as usize].on.store(false, Ordering::Relaxed);
    }
    Ok(())
}

/// `--max-events`: records the stream keeps at most (`u64::MAX`: no limit), and the
/// records asked for so far.
static MAX_RECORDS: AtomicU64 = AtomicU64::new(u64::MAX);
static RECORDS: AtomicU64 = AtomicU64::new(0);

/// Whether the stream counts the filtered hits here (aggregations count them in blocks).
static STREAM: AtomicBool = AtomicBool::new(false);

/// Start-up, once the events are made: `--max-events`, and what a fork's child forgets.
pub fn init(stream: bool, max_records: Option<u64>) {
    STREAM.store(stream, Ordering::Relaxed);
    MAX_RECORDS.store(max_records.unwrap_or(u64::MAX), Ordering::Relaxed);
    RECORDS.store(0, Ordering::Relaxed);
    extern "C" fn child() {
        after_fork();
    }
    // Once per process (attach sessions make streams again).
    static ONCE: AtomicBool = AtomicBool::new(false);
    if !ONCE.swap(true, Ordering::SeqCst) {
        // SAFETY: a plain function that stays loaded for the life of the process.
        unsafe { libc::pthread_atfork(None, None, Some(child)) };
    }
}

/// Whether one more record may be kept (hit path; one shared add, with `--max-events`
/// only).
#[inline(always)]
pub fn take_record() -> bool {
    let max = MAX_RECORDS.load(Ordering::Relaxed);
    max == u64::MAX || RECORDS.fetch_add(1, Ordering::Relaxed) < max
}

/// In a fork's child (pthread_atfork): the thread's id and name are the child's own, and its records count
/// from zero as its hits do.
fn after_fork() {
    let state = thread::current();
    state.filter_tid.set(0);
    state.filter_comm.set([0; 16]);
    RECORDS.store(0, Ordering::Relaxed);
    for ev in events::all() {
        ev.filter_failed.store(0, Ordering::Relaxed);
        ev.filter_passed.store(0, Ordering::Relaxed);
    }
}

/// The end of the stream's lines: each filtered event's hits and passes, and whether
/// `--max-events` stopped the stream.
pub fn report() {
    if !STREAM.load(Ordering::Relaxed) {
        return;
    }
    for ev in events::all().iter().filter(|e| e.filter.is_some()) {
        let (failed, passed) = (ev.filter_failed.load(Ordering::Relaxed), ev.filter_passed.load(Ordering::Relaxed));
        output::message(format_args!("event {}: {} hits, {passed} passed its filter", ev.name, failed + passed));
    }
    let (max, asked) = (MAX_RECORDS.load(Ordering::Relaxed), RECORDS.load(Ordering::Relaxed));
    if max != u64::MAX && asked > max {
        output::message(format_args!(
            "--max-events {max}: recording stopped after {max} records; {} later hits not recorded",
            asked - max
        ));
    }
}
