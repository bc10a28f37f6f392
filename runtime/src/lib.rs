//! libuprobe.so: in-process user-space probes for x86_64 Linux.
//!
//! `uprobe-run` preloads this library into the probed program. Its constructor reads the run's
//! specification, loads the handler libraries and calls their `uprobe_init`; they register
//! probes through the C ABI in `include/uprobe.h`. A probe replaces the first instruction(s)
//! of its site by a jump to a per-probe stub (trap-free, at function entries where the code
//! allows it) or by `int3`; either way the handlers run with the registers as a
//! `struct pt_regs`, and the displaced instruction runs emulated or out of line. Nothing
//! single-steps.
//!
//! The crate is layered; each folder imports only from the ones listed after it:
//! - [`api`]: the face: the exported C API, handler libraries, start-up, the attach entry;
//! - [`aggregate`]: those events counted, histograms and function latency, reported;
//! - [`trace`]: events from `uprobe_events` definitions, their records and the stream;
//! - [`attach`]: attach sessions in a running process: the agent thread and its session;
//! - [`hazard`]: the process around us: signals, fork, dlopen, descriptors, unwinders;
//! - [`probe`]: the probe core: table, placement batches, hit dispatch, return probes;
//! - [`insn`]: instruction work: decoding, emulation, jumps and stubs, the patch protocol;
//! - [`base`]: system calls, the allocator, the output, ELF symbols, the run's spec.
#![deny(unsafe_code)]

pub mod aggregate;
pub mod api;
pub mod attach;
pub mod base;
pub mod hazard;
pub mod insn;
pub mod probe;
pub mod trace;

#[global_allocator]
static ALLOCATOR: base::alloc::RuntimeAlloc = base::alloc::RuntimeAlloc;
