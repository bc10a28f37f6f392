//! Answers instead of streams: the run's events counted (per key with `--by`), histograms of
//! a fetched value (`--hist`, `--lhist`), and the time functions take (`--latency`), kept per
//! thread in plain memory on the hit path and added up only when a report is printed: at the
//! end of the run, and every `--interval`. A front-end of the trace layer
//! (`trace::setup::Frontend`): the same definitions, fetchargs and registration, other
//! handlers.
//!
//! - [`request`]: what the run asks, parsed; [`plan`]: what each event's hit does and where
//!   it counts, checked against the events (pure); [`key`]: the parts of a `--by` key;
//! - [`buckets`]: log2 and linear histogram buckets and their labels (pure);
//! - [`blocks`]: the per-thread blocks of counters;
//! - [`hit`]: the handlers (the hit path); [`timed`]: timed calls without a register frame;
//!   [`stacks`]: stacks as keys, kept per thread;
//! - [`merge`]: the blocks added up, and one interval's share;
//! - [`tables`], [`text`], [`json`]: what a report shows, as text or JSON lines (pure);
//!   [`folded`]: stacks as folded lines and flame graphs; [`pprof`]: as a pprof profile;
//! - [`report`]: printing reports: the interval thread, the end of the run (also from a
//!   fatal signal), the end of an attach session;
//! - [`feed`]: the whole run's numbers for the metrics uprobe-run serves (`--serve`);
//! - [`setup`]: start-up: the events planned, the reports started.
//!
//! Context: `hit` and `blocks::mine` run on the hit path (signal, stub or trampoline
//! context, thread busy: no allocation, no lock, no libc, no atomic read-modify-write, no
//! system call but at a thread's first hit); `report` on its own thread and at the end of
//! the run, possibly in a fatal signal's handler (no lock a hit could hold, no unbounded
//! wait); `setup` at start-up; the pure modules anywhere.

#[allow(unsafe_code)]
pub mod blocks;
pub mod buckets;
#[allow(unsafe_code)]
pub mod feed;
pub mod folded;
#[allow(unsafe_code)]
pub mod hit;
pub mod json;
pub mod key;
pub mod merge;
#[allow(unsafe_code)]
pub mod plan;
pub mod pprof;
#[allow(unsafe_code)]
pub mod report;
pub mod request;
#[allow(unsafe_code)]
pub mod setup;
pub mod split;
pub mod stacks;
pub mod tables;
pub mod text;
#[allow(unsafe_code)]
pub mod timed;
