//! The process around the runtime: what a program does that an in-process runtime must
//! survive, and the interposed libc functions that let it.
//!
//! - [`sigtrap`]: the SIGTRAP entry point (probe hits go to `probe::dispatch`, the program's
//!   own traps to what it installed);
//! - [`signals`], [`masks`], [`sigset`], [`faults`]: the program's signal actions and masks
//!   (interposed), and a handler that faults; [`guard`]: an attach session's `uprobe_init`,
//!   ended instead of the process when it faults, aborts or runs too long;
//! - [`endings`]: every way the process ends (exit, `_exit`, exec, fatal signals), each
//!   running the end-of-run report; [`exec`]: the exec family, interposed;
//! - [`fork`]: the runtime's locks and counters across `fork`, and `--no-follow-fork`;
//! - [`spawn`]: children that share the parent's memory (`posix_spawn`, `system`, `popen`);
//! - [`dl`]: `dlopen`/`dlclose`, arming probes of libraries loaded later;
//! - [`fds`]: keeping the output's descriptor in programs that close every descriptor;
//! - [`environ`]: the environment, edited in place (a program may define `unsetenv` itself);
//! - [`unwind`]: the unwinder, `backtrace` and `pthread_exit` meeting return-probed frames;
//! - [`interpose`]: finding the functions the interposers stand in for;
//! - [`late`]: a runtime loaded into a running process, whose internal probes on libc's
//!   functions send the program's calls to the same interposers during an attach session.
//!
//! Context: the interposers run as the program's own calls (normal context, or the program's
//! signal handlers); `sigtrap`, `signals::foreign_trap` and the fault handler run in signal
//! context and keep to the async-signal-safe subset.

#[allow(unsafe_code)]
pub mod dl;
#[allow(unsafe_code)]
pub mod endings;
#[allow(unsafe_code)]
pub mod environ;
#[allow(unsafe_code)]
pub mod exec;
pub mod faults;
#[allow(unsafe_code)]
pub mod fds;
#[allow(unsafe_code)]
pub mod fork;
#[allow(unsafe_code)]
pub mod guard;
#[allow(unsafe_code)]
pub mod interpose;
#[allow(unsafe_code)]
pub mod late;
#[allow(unsafe_code)]
pub mod masks;
#[allow(unsafe_code)]
pub mod signals;
#[allow(unsafe_code)]
pub mod sigset;
#[allow(unsafe_code)]
pub mod sigtrap;
#[allow(unsafe_code)]
pub mod spawn;
#[allow(unsafe_code)]
pub mod unwind;
