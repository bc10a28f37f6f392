//! The hitcost benchmark: what one probe hit costs under uprobe-run, under ptrace-based
//! breakpoint engines, under kernel uprobes, and with no probe at all, on the same fixture.
//!
//! The bench entry point (`benches/hitcost.rs`) plans the rows, runs them and reports.
//! Module map:
//! - [`attach`]: attach and detach times and pauses of `uprobe-run --pid`;
//! - [`fixture`]: building the C fixture and handler library with gcc, and where things live;
//! - `uprobe_contracts::elf`: symbol addresses and file offsets read from ELF files (pure);
//! - [`decode`]: the out-of-line copy the ptrace engine runs, relocated with iced-x86 (pure);
//! - [`engines`]: one module per way of running the fixture (none and sigtrap, uprobe-run,
//!   ptrace, kernel);
//! - [`stats`]: medians and run sizes; [`report`]: derived figures and JSON (written by
//!   serde_json, [`json`] has its number rounding); [`table`]: the
//!   table on stdout; [`svg`]: the chart;
//!   [`machine`]: what the numbers were measured on;
//! - [`sys`]: the only module that calls the kernel directly (fork/exec, wait, ptrace,
//!   perf_event_open, CPU affinity); everything else is safe code.
#![deny(unsafe_code)]

pub mod attach;
pub mod decode;
pub mod engines;
pub mod fixture;
pub mod json;
pub mod machine;
pub mod report;
pub mod stats;
pub mod svg;
pub mod sys;
pub mod table;
