//! Predicates at the hit: an event's filter (`if EXPR`, `--filter`), compiled by `uprobe-run`
//! (`uprobe_contracts::filter`), run before anything is recorded or counted, reading the
//! event's fetchargs as a record would (through `base::usercopy`: a bad pointer fails the
//! predicate and costs the program nothing). The stream and the aggregations call
//! [`passes`] alike.
//!
//! Also what the hits of filtered events came to in the stream: hits, and hits that passed,
//! per event, told at the end of the run (aggregations count them in their blocks); and `--max-events`, the records the stream keeps at most.
//!
//! Context: [`passes`] and [`take_record`] run on the hit path (signal, stub or trampoline
//! context, thread busy: no allocation, no lock, no libc; a system call only at a thread's
//! first hit that reads `tid` or `comm`); the rest at start-up and at the end of the run.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use uprobe_contracts::filter::{Field, Fields};

use crate::base::abi::PtRegs;
use crate::base::{output, sys};
use crate::probe::thread;
use crate::trace::events::{self, Event};
use crate::trace::fetch::{Base, Fetch};
use crate::trace::{clock, format, record};

/// A hit's values, read on demand.
struct Hit<'a> {
    ev: &'a Event,
    regs: &'a PtRegs,
    file_base: u64,
}

impl Fields for Hit<'_> {
    #[inline]
    fn number(&mut self, field: Field) -> Option<u64> {
        match field {
            Field::Arg(i) => {
                let arg = self.ev.args.get(usize::from(i))?;
                let v = format::bits_of(&arg.ty, record::fetch_number(arg, self.regs, self.file_base)?);
                Some(match arg.ty.base {
                    Base::Signed if arg.ty.bitfield.is_none() => format::signed(&arg.ty, v) as u64,
                    _ => v,
                })
            }
            Field::Retval => Some(self.regs.rax),
            Field::Tid => Some(tid() as i64 as u64),
            Field::Cpu => Some(u64::from(clock::now().1)),
            Field::Comm => None,
        }
    }

    #[inline]
    fn string(&mut self, field: Field, buf: &mut [u8]) -> Option<usize> {
        match field {
            Field::Arg(i) => {
                let arg = self.ev.args.get(usize::from(i))?;
                if arg.fetch == Fetch::Comm {
                    return Some(comm(buf));
                }
                record::fetch_string(arg, self.regs, self.file_base, buf)
            }
            Field::Comm => Some(comm(buf)),
            _ => None,
        }
    }
}

/// The calling thread's id (a system call at its first use on the thread).
fn tid() -> i32 {
    let state = thread::current();
    match state.filter_tid.get() {
        0 => {
            let t = sys::gettid();
            state.filter_tid.set(t);
            t
        }
        t => t,
    }
}

/// The calling thread's name into `buf`: its length. Read at the thread's first use, so a
/// name it takes after its first filtered hit is not seen.
fn comm(buf: &mut [u8]) -> usize {
    let state = thread::current();
    let mut name = state.filter_comm.get();
    if name[0] == 0 {
        name = sys::thread_name();
        state.filter_comm.set(name);
    }
    let n = name.iter().position(|&b| b == 0).unwrap_or(16).min(buf.len());
    buf[..n].copy_from_slice(&name[..n]);
    n
}

/// Whether the hit of `ev` passes its filter (always, without one). Hit path; the caller
/// counts (the stream in the event, aggregations in the thread's block).
#[inline(always)]
pub fn passes(ev: &Event, regs: &PtRegs) -> bool {
    match &ev.filter {
        None => true,
        Some(program) => program.passes(&mut Hit { ev, regs, file_base: ev.file_base.load(Ordering::Relaxed) }),
    }
}

/// [`passes`], for the stream: a filtered event's passes and fails counted in the event.
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

/// `--max-events`: records the stream keeps at most (`u64::MAX`: no limit), and the
/// records asked for so far.
static MAX_RECORDS: AtomicU64 = AtomicU64::new(u64::MAX);
static RECORDS: AtomicU64 = AtomicU64::new(0);

/// Whether the stream counts the filtered hits here (aggregations count them in blocks).
static STREAM: AtomicBool = AtomicBool::new(false);

/// Start-up, once the events are made: `--max-events`, and what a fork's child forgets.
pub fn init(stream: bool, max_records: Option<u64>) {
    STREAM.store(stream, Ordering::Relaxed);
    if let Some(n) = max_records {
        MAX_RECORDS.store(n, Ordering::Relaxed);
    }
    extern "C" fn child() {
        after_fork();
    }
    // SAFETY: a plain function that stays loaded for the life of the process.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
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
