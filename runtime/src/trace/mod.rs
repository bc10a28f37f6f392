//! Events without writing code: probes given as the kernel's `uprobe_events` definitions
//! (`-e`, `--events`), their fetchargs recorded on the hit path into per-thread buffers, and a
//! stream of records in time order (text as the kernel's trace shows it, JSON lines, or
//! Chrome trace events). A front-end beside the C API, as the kernel's `trace_uprobe.c` sits
//! beside `events/uprobes.c`: it registers `struct uprobe`/`struct uretprobe` objects whose
//! handlers record.
//!
//! - [`def`], [`fetch`] (from the contracts crate, which `uprobe-run` reads too), [`names`]:
//!   definitions, fetchargs and types, function names and globs (pure);
//! - [`read`]: fetchargs read at the hit, and predicates (`if EXPR`, `--filter`) run on
//!   them before anything is recorded or counted; [`filter`]: what the predicates let
//!   through, and `--max-events`;
//! - [`mod@format`]: records as text, JSON and Chrome events (pure; [`digits`]: numbers
//!   written by hand); [`chain`]: stacks
//!   (`$ustack`) in records, as call chains and arrays; [`chrome`]: one Chrome trace event;
//! - [`events`]: the run's events and their probe objects;
//! - [`record`]: the recording handlers (the hit path); [`clock`]: their timestamps;
//!   [`quick`]: the hits of an event recorded without the dispatcher;
//! - [`buffers`]: the per-thread rings;
//! - [`drain`]: the thread that writes the records out, and the end of the stream;
//! - [`setup`]: start-up: resolving and registering the definitions ([`resolve`]: where
//!   each definition's probes go);
//! - [`list`]: `--list`, the functions that can be probed and how.
//!
//! Context: `record`, `clock::now` and `buffers`' writer run on the hit path (signal, stub or
//! trampoline context, thread busy: no allocation, no lock, no system call, no libc);
//! `drain` runs on its own thread and at process exit; `setup` and `list` at start-up; the
//! pure modules anywhere.

#[allow(unsafe_code)]
pub mod buffers;
pub mod chain;
pub mod chrome;
#[allow(unsafe_code)]
pub mod clock;
pub mod digits;
#[allow(unsafe_code)]
pub mod drain;
#[allow(unsafe_code)]
pub mod events;
#[allow(unsafe_code)]
pub mod filter;
pub mod format;
pub mod libpath;
pub mod list;
pub mod names;
#[allow(unsafe_code)]
pub mod quick;
#[allow(unsafe_code)]
pub mod read;
#[allow(unsafe_code)]
pub mod record;
pub mod resolve;
#[allow(unsafe_code)]
pub mod setup;

// Definitions and fetchargs are read by uprobe-run too: one parser, in the contracts crate.
pub use uprobe_contracts::{def, fetch};
