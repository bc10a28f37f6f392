//! What `uprobe-run`, the runtime it preloads, handler libraries, the tests and the benches
//! all read, defined once:
//!
//! - [`abi`]: the C ABI of `include/uprobe.h` (`struct pt_regs`, `struct uprobe`, ...), its
//!   layout checked against the header; [`errno`]: the negative errno values the C API
//!   returns, and their names;
//! - [`spec`]: the run's spec, encoded by `uprobe-run` and decoded by the runtime;
//! - [`wire`]: the messages of an attach session's socket;
//! - [`maps`]: lines of `/proc/PID/maps`; `elf` (feature `elf`): symbols of ELF files;
//! - [`def`]: event definitions in the kernel's `uprobe_events` grammar, their fetchargs
//!   ([`fetch`]), and predicates in the kernel's event-filter grammar, compiled by
//!   `uprobe-run` into a small program that travels in the run spec and that the runtime runs
//!   at each hit ([`filter`]);
//! - [`pprof`]: profiles in pprof's `profile.proto`, encoded and decoded;
//! - [`sdt`]: USDT markers: the `.note.stapsdt` notes and their argument specs, which
//!   `uprobe-run` turns into fetchargs and the runtime lists.
//!
//! Pure: text in, values out; no system calls, no globals, no process state, nothing that
//! allocates at evaluation. Decoders refuse what they cannot read exactly; none panics.
#![deny(unsafe_code)]

pub mod abi;
pub mod def;
#[cfg(feature = "elf")]
pub mod elf;
pub mod errno;
pub mod fetch;
pub mod filter;
#[cfg(feature = "lines")]
pub mod lines;
pub mod maps;
pub mod pprof;
pub mod sdt;
pub mod spec;
#[cfg(test)]
mod testgen;
pub mod wire;
