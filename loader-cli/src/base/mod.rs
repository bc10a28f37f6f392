//! The bottom layer: what every mode stands on and none of it knows the command line.
//! The refusals and their one line ([`error`]), the system calls std lacks ([`sys`]), the
//! facts of an ELF file ([`elf`]) and the checks made on files before anything starts
//! ([`check`]), where the runtime library ([`runtime`]) and the bundled handler libraries
//! ([`bundled`]) come from, and the run specification's records ([`spec`]).
//!
//! Context: uprobe-run's own process, before the program starts or an attach begins.

pub mod bundled;
pub mod check;
pub mod elf;
pub mod error;
pub mod runtime;
pub mod spec;
pub mod sys;
