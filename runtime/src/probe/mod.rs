//! The probe core: the probe table, placement, and what a hit does. Generic over what the
//! probes are for: the C API, and any other front-end, registers consumers here.
//!
//! - [`table`]: probe points and their consumer lists (lock-free lookups);
//! - [`rcu`]: read-side sections and grace periods around those lists;
//! - [`thread`]: the runtime's per-thread state (busy, inside the runtime, return records);
//! - [`snapshot`]: that state saved and put back around a child sharing the thread's memory;
//! - [`registry`]: registration, placement batches, removal;
//! - [`lifecycle`]: the registry across dlopen/dlclose, fork, exec and the end of the run;
//! - [`place`]: checking and preparing a probe point, writing a batch of patches;
//! - [`semaphore`]: USDT semaphores, raised while their probe is placed;
//! - [`symbols`]: the address space and the symbols of the loaded modules;
//! - [`traps`]: where an `int3` must not go (glibc runs the code with every signal blocked);
//! - [`ssol`]: out-of-line slots and stub memory;
//! - [`dispatch`]: the hit paths, for a trap and for a jump probe's stub;
//! - [`stacks`]: the unwind tables of the loaded modules, and the stack walk of a hit;
//! - [`retprobe`]: return probes: entry and return hits, the trampoline;
//! - [`returns`]: a thread's pending returns (records and instances);
//! - [`returnable`]: where a return probe may go; [`extent`]: where any probe may go;
//! - [`deferred`]: registration requests, queued when made from a handler;
//! - [`owners`]: which handler library owns a probe (for fault messages);
//! - [`report`]: what the runtime says of its probes at the end of the run;
//! - [`world`]: holding the other threads stopped around a batch's writes (attach);
//! - [`vectors`]: which probes' handlers are read free of vector instructions;
//! - [`error`]: why a registration failed.
//!
//! Context: `dispatch`, `retprobe`'s entry and return paths and `rcu`'s read side run on the
//! hit paths (signal or stub context, no allocation, no lock); the rest runs in normal
//! context under the registry lock.

#[allow(unsafe_code)]
pub mod deferred;
#[allow(unsafe_code)]
pub mod dispatch;
pub mod error;
pub mod extent;
#[allow(unsafe_code)]
pub mod lifecycle;
pub mod nosymbol;
#[allow(unsafe_code)]
pub mod owners;
#[allow(unsafe_code)]
pub mod place;
#[allow(unsafe_code)]
pub mod rcu;
#[allow(unsafe_code)]
pub mod registry;
#[allow(unsafe_code)]
pub mod report;
#[allow(unsafe_code)]
pub mod retprobe;
pub mod returnable;
#[allow(unsafe_code)]
pub mod returns;
#[allow(unsafe_code)]
pub mod semaphore;
#[allow(unsafe_code)]
pub mod snapshot;
#[allow(unsafe_code)]
pub mod ssol;
#[allow(unsafe_code)]
pub mod stacks;
#[allow(unsafe_code)]
pub mod symbols;
#[allow(unsafe_code)]
pub mod table;
#[allow(unsafe_code)]
pub mod thread;
pub mod traps;
#[allow(unsafe_code)]
pub mod vectors;
pub mod world;
