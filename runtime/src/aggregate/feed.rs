//! The metrics feed (`uprobe-run --serve`): uprobe-run, which serves the metrics, asks on an
//! inherited socket (`base::feed`) and this thread answers with the whole run's numbers, the
//! JSON report lines of `json` read as the reports read them (`report::whole_run_json`): no
//! lock a hit takes, no counter reset. The run's end sends one last answer unasked
//! ([`end`]). The probed process opens no port: uprobe-run parses and serves.
//!
//! The wire: uprobe-run writes any byte to ask (bytes that arrive together are one
//! question); each answer is its length (8 bytes, little-endian) and that many bytes of JSON
//! lines, the first `{"kind":"feed","pid":P,"end":B,"events":N,"placed":M}` (events defined,
//! and those whose probe is placed).
//!
//! Context: the feed thread (normal context, its signals blocked, inside the runtime); the
//! end of the run (normal or fatal-signal context: the answer is skipped when the feed
//! thread is in the middle of one and does not finish it within a bound).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::aggregate::report;
use crate::base::{feed, output, sys};
use crate::probe::{deferred, world};
use crate::trace::{clock, events};

/// The process that made the blocks, which alone answers.
static OWNER: AtomicI32 = AtomicI32::new(0);
/// An answer is being written (answers must not interleave on the stream).
static SENDING: AtomicBool = AtomicBool::new(false);
static ENDED: AtomicBool = AtomicBool::new(false);
/// Whether the feed thread runs (in this process).
static THREAD: AtomicBool = AtomicBool::new(false);
/// How long the end of the run waits for an answer in progress.
const PATIENCE_NS: u64 = 200_000_000;

/// One answer: the header line and the report lines, with the length in front.
fn answer(end: bool) -> Vec<u8> {
    let all = events::all();
    let placed = all.iter().filter(|e| e.address() != 0).count();
    let mut text = format!(
        "{{\"kind\":\"feed\",\"pid\":{},\"end\":{end},\"events\":{},\"placed\":{placed}}}\n",
        sys::getpid(),
        all.len()
    );
    report::whole_run_json(&mut text);
    let mut out = Vec::with_capacity(8 + text.len());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// Sends `bytes` unless another answer is on its way and does not finish by `deadline`.
fn send(bytes: &[u8], deadline: u64) -> bool {
    while SENDING.swap(true, Ordering::Acquire) {
        if clock::monotonic_ns() > deadline {
            return false;
        }
        sys::sleep_ns(1_000_000);
    }
    let sent = feed::send_all(bytes).is_ok();
    SENDING.store(false, Ordering::Release);
    sent
}

/// Starts the feed thread (start-up, after the reports), when uprobe-run gave a feed.
pub fn start(fd: i32) {
    if let Err(e) = feed::adopt(fd) {
        output::message(format_args!(
            "the metrics feed (descriptor {fd}) cannot be used: {}",
            std::io::Error::from_raw_os_error(e)
        ));
        return;
    }
    OWNER.store(sys::getpid(), Ordering::Relaxed);
    ENDED.store(false, Ordering::SeqCst);
    extern "C" fn main(_: *mut libc::c_void) -> *mut libc::c_void {
        core::mem::forget(deferred::Inside::enter());
        let Some(fd) = feed::fd() else { return core::ptr::null_mut() };
        let mut asked = [0u8; 64];
        // Gone uprobe-run (end of file or an error): the thread ends, the program goes on.
        while let Ok(1..) = sys::read(fd, &mut asked) {
            if ENDED.load(Ordering::Acquire) {
                break;
            }
            if !send(&answer(false), u64::MAX) {
                break;
            }
        }
        // An attach session's feed ended (see `close`): the descriptor is this thread's to
        // close, once it reads it no more.
        if ENDED.load(Ordering::Acquire) && feed::release(fd) && THREAD.swap(false, Ordering::SeqCst) {
            world::RUNTIME_THREADS.fetch_sub(1, Ordering::SeqCst);
        }
        core::ptr::null_mut()
    }
    match world::spawn(main, 0) {
        Ok(()) => THREAD.store(true, Ordering::SeqCst),
        Err(rc) => output::message(format_args!("cannot start the metrics feed (error {rc}): nothing is served")),
    }
}

/// In the child of `fork`: the feed thread stayed in the parent (which answers for the
/// child's hits too).
pub fn after_fork() {
    if THREAD.swap(false, Ordering::SeqCst) {
        world::RUNTIME_THREADS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The run's end: the last numbers, sent unasked (once, by the process that made them).
pub fn end() {
    if feed::fd().is_none() || sys::getpid() != OWNER.load(Ordering::Relaxed) || ENDED.swap(true, Ordering::AcqRel) {
        return;
    }
    deferred::inside(|| {
        send(&answer(true), clock::monotonic_ns() + PATIENCE_NS);
    });
}

/// The end of an attach session's aggregations: the last numbers sent ([`end`]), then the
/// feed shut down, so that its thread wakes, closes it and ends (a later session brings a
/// feed of its own).
pub fn close() {
    end();
    if let Some(fd) = feed::fd() {
        feed::shutdown(fd);
    }
}
