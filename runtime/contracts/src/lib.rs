//! What `uprobe-run` and the runtime it preloads both read, defined once: event definitions
//! in the kernel's `uprobe_events` grammar ([`def`]), their fetchargs ([`fetch`]), and
//! USDT notes and argument specs ([`sdt`]), and
//! predicates in the kernel's event-filter grammar, compiled by `uprobe-run` into a small
//! program that travels in the run spec and that the runtime runs at each hit ([`filter`]).
//!
//! Pure: text in, values out; no process state, nothing that allocates at evaluation.
#![deny(unsafe_code)]

pub mod def;
pub mod fetch;
pub mod filter;
pub mod sdt;
