//! The run's events: one [`Event`] per definition (per match of a glob), fixed once start-up
//! has made them, and the probe objects through which the core calls the recording handlers.
//!
//! Each probe object is a `struct uprobe` (or `struct uretprobe`) followed by the event's
//! index, so a handler finds its event from the pointer the core passes it, with no lookup.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use uprobe_contracts::filter::Program;

use crate::base::abi::{Uprobe, Uretprobe};
use crate::trace::def::Kind;
use crate::trace::fetch::FetchArg;

/// An entry probe that records event `event`.
#[repr(C)]
pub struct EntryProbe {
    pub u: Uprobe,
    pub event: u32,
}

/// A return probe that records event `event`.
#[repr(C)]
pub struct ReturnProbe {
    pub rp: Uretprobe,
    pub event: u32,
}

/// The probe object of an event (leaked: registered for the life of the process).
#[derive(Clone, Copy)]
pub enum Probe {
    Entry(*mut EntryProbe),
    Return(*mut ReturnProbe),
}

pub struct Event {
    pub name: String,
    pub group: String,
    /// The definition as written (for messages).
    pub definition: String,
    pub kind: Kind,
    pub args: Vec<FetchArg>,
    pub probe: Probe,
    /// Where the probe's file is mapped relative to its file offsets (`@+OFFSET`: the probe's
    /// address minus its file offset, as the kernel computes it); 0 while unknown.
    pub file_base: AtomicU64,
    /// Records that found no room (a full buffer, or no buffer for the thread).
    pub dropped: AtomicU64,
    /// The predicate its hits must pass (`if`, `--filter`; see `filter`).
    pub filter: Option<Program>,
    /// Hits of a filtered event that failed and that passed its filter (the stream's; see
    /// `filter::passes_counted`).
    pub filter_failed: AtomicU64,
    pub filter_passed: AtomicU64,
    /// Whether its hits count now (`--trigger`: an event another one enables starts off).
    pub on: AtomicBool,
    /// What a passing hit switches (`--trigger EVENT:enable=E,disable=F`): (event, on).
    pub triggers: Vec<(u32, bool)>,
    /// Its hits go through `filter::admit` (a filter, a trigger, or switched by one).
    pub gated: bool,
    /// Its probe could not be placed and `--lenient` skipped it: reports say so instead of
    /// counting it.
    pub skipped: AtomicBool,
    /// The size of its records without the caller word, where every fetcharg is one number
    /// (see `record::numbers_only`); 0 otherwise.
    pub fixed_len: usize,
}

// SAFETY: the probe objects are leaked and only their `vaddr` changes (by placement, under the
// registry lock); everything else is immutable or atomic.
unsafe impl Sync for Event {}
// SAFETY: as above.
unsafe impl Send for Event {}

impl Event {
    /// The run-time address of the probe (0 while its module is not loaded).
    pub fn address(&self) -> usize {
        // SAFETY: the probe object is leaked and valid; placement writes `vaddr` once per arm.
        unsafe {
            match self.probe {
                Probe::Entry(p) => core::ptr::read_volatile(&(*p).u.vaddr) as usize,
                Probe::Return(p) => core::ptr::read_volatile(&(*p).rp.u.vaddr) as usize,
            }
        }
    }

    /// The probe object's identity, as the core knows it (`Consumer::key`).
    pub fn key(&self) -> usize {
        match self.probe {
            Probe::Entry(p) => p as usize,
            Probe::Return(p) => p as usize,
        }
    }
}

static EVENTS: AtomicPtr<Vec<Event>> = AtomicPtr::new(core::ptr::null_mut());

/// Publishes the run's events (start-up, before any of their probes is registered). A
/// later attach session's replace those of the session before, which are freed: their
/// probes were removed and a grace period passed, and that session's drain, report and feed
/// threads ended long before another session starts.
pub fn publish(events: Vec<Event>) {
    let old = EVENTS.swap(Box::into_raw(Box::new(events)), Ordering::AcqRel);
    if old.is_null() {
        return;
    }
    // SAFETY: made by Box::into_raw above; nothing reads the old events any more (see above).
    let old = unsafe { Box::from_raw(old) };
    for ev in old.iter() {
        // SAFETY: each probe object and its symbol name were made by Box::into_raw and
        // CString::into_raw (`setup::make_event`), and are referenced by nothing else now.
        unsafe {
            let name = match ev.probe {
                Probe::Entry(p) => Box::from_raw(p).u.symbol_name,
                Probe::Return(p) => Box::from_raw(p).rp.u.symbol_name,
            };
            if !name.is_null() {
                drop(std::ffi::CString::from_raw(name as *mut core::ffi::c_char));
            }
        }
    }
}

/// The run's events (empty before start-up made them; signal-safe).
pub fn all() -> &'static [Event] {
    // SAFETY: published before any probe of theirs is placed, never changed, and freed only
    // when a later attach session replaces them, once nothing reaches them (see `publish`).
    unsafe { EVENTS.load(Ordering::Acquire).as_ref() }.map_or(&[], |v| v.as_slice())
}

/// Event `i` (signal-safe).
#[inline]
pub fn get(i: u32) -> Option<&'static Event> {
    all().get(i as usize)
}
