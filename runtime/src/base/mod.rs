//! The bottom layer: what every other part stands on, knowing nothing of probes.
//!
//! - [`sys`]: every system call the runtime makes, raw and counted; [`lock`]: its mutex;
//! - [`alloc`]: the runtime's own allocator, usable in signal context;
//! - [`memfns`]: `memcpy` and friends for the runtime's own code, so it never calls libc's;
//! - [`output`]: the run's output (whole lines, one `write` each); [`route`]: attach
//!   sessions' own outputs;
//! - [`maps`], [`elf`]: the address space and ELF symbol tables (parsing is pure);
//! - [`spec`]: what `uprobe-run` passes in the environment; [`params`]: the `--param` values;
//!   [`abi`]: the `repr(C)` types of `include/uprobe.h` (both from `uprobe_contracts`);
//! - [`disable`]: whether the runtime is off in this process; [`stats`]: its counters;
//! - [`usercopy`]: reads of memory that may not be there (fetchargs through bad pointers);
//! - [`socket`]: unix sockets, poll and eventfd, for attach sessions.
//!
//! Context: each function says whether it is signal-safe; parsing code is pure.

// The contracts shared with uprobe-run and handler libraries, where the runtime's code names them.
pub use uprobe_contracts::{abi, spec};

#[allow(unsafe_code)]
pub mod alloc;
pub mod cfi;
pub mod disable;
pub mod elf;
pub mod feed;
#[allow(unsafe_code)]
pub mod lock;
pub mod maps;
#[allow(unsafe_code)]
pub mod memfns;
#[allow(unsafe_code)]
pub mod output;
#[allow(unsafe_code)]
pub mod params;
pub mod route;
#[allow(unsafe_code)]
pub mod socket;
pub mod stats;
#[allow(unsafe_code)]
pub mod sys;
#[allow(unsafe_code)]
pub mod usercopy;
