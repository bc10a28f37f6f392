//! Writing `uprobe-run` handler libraries in Rust.
//!
//! A handler library is a `cdylib` that `uprobe-run --handlers` loads into the probed program.
//! It may export `uprobe_init` (called after loading; non-zero aborts the run) and
//! `uprobe_exit` (called at process exit), and registers probes from `uprobe_init`:
//!
//! - [`abi`]: the C ABI of `uprobe.h`, field for field ([`PtRegs`], [`Uprobe`], ...) and the
//!   runtime's functions. They resolve against the preloaded `libuprobe.so` when the library
//!   is loaded; do not link against it.
//! - [`Probe`]: a `struct uprobe` plus your own state, handed back to your handler.
//! - [`Line`] and [`uprobe_println!`]: output built on the stack, written with
//!   `uprobe_printf` to the run's output (`uprobe-run -o`, default stderr).
//! - [`param`] and [`lookup`]: `--param NAME=VALUE` values and symbol addresses, for set-up.
//!
//! # Handlers run in signal context
//!
//! A probe hit interrupts the program wherever it is: possibly inside `malloc`, holding a lock,
//! or in another handler. Code that runs on a hit therefore must not allocate (no `String`,
//! `Vec`, `Box`, `format!`), take locks (no `Mutex`, no `println!`, which locks stdout),
//! panic, or call anything that is not async-signal-safe. Use atomics for shared state,
//! [`Line`] / [`uprobe_println!`] for output, and do set-up work (allocation, [`param`],
//! [`lookup`]) in `uprobe_init`. Items usable from a handler say "Signal context: yes".
//!
//! ```no_run
//! use core::sync::atomic::{AtomicU64, Ordering};
//! use uprobe_sdk::{uprobe_println, Probe, PtRegs};
//!
//! fn on_malloc(probe: &Probe<AtomicU64>, regs: &mut PtRegs) {
//!     // Signal context: atomics and fixed-buffer output only.
//!     let n = probe.state.fetch_add(1, Ordering::Relaxed);
//!     if n < 3 {
//!         uprobe_println!("malloc({}) #{}", regs.rdi, n + 1);
//!     }
//! }
//!
//! static MALLOC: Probe<AtomicU64> =
//!     Probe::at_symbol(c"libc.so.6:malloc", 0, AtomicU64::new(0), on_malloc);
//!
//! #[no_mangle]
//! pub extern "C" fn uprobe_init() -> i32 {
//!     match MALLOC.register() {
//!         Ok(()) => 0,
//!         Err(e) => {
//!             uprobe_println!("malloc probe: {e}");
//!             1
//!         }
//!     }
//! }
//!
//! #[no_mangle]
//! pub extern "C" fn uprobe_exit() {
//!     MALLOC.unregister();
//!     uprobe_println!("malloc calls: {}", MALLOC.state.load(Ordering::Relaxed));
//! }
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
mod line;
mod probe;
mod sys;

pub use abi::{PtRegs, Uprobe, Uretprobe, UretprobeInstance};
pub use line::Line;
pub use probe::{OnHit, Probe, ProbeList};
pub use uprobe_contracts::errno::Errno;

// The runtime's own `memcpy`, `memmove`, `memset`, `memcmp`, `bcmp` and `strlen`, hidden: a
// handler library built with the SDK binds the calls the compiler emits to them, not to
// libc's, which may carry probes (libc-wide probes would otherwise trap on every copy its
// set-up and report code makes). The program keeps calling libc's.
uprobe_memfns::define!();

use std::ffi::CString;

/// The value of `--param NAME=VALUE` (the last one given), or `None`.
/// Not for signal context: it allocates.
pub fn param(name: &str) -> Option<String> {
    let name = CString::new(name).ok()?;
    sys::param(&name)
}

/// The run-time address of `"sym"`, `"module:sym"` or either with `+off`, or `None`.
/// Not for signal context: it allocates.
pub fn lookup(spec: &str) -> Option<u64> {
    let spec = CString::new(spec).ok()?;
    Some(sys::lookup(&spec)).filter(|&addr| addr != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_and_lookup_go_through_the_runtime() {
        assert_eq!(param("present").as_deref(), Some("value"));
        assert_eq!(param("absent"), None);
        assert_eq!(param("bad\0name"), None);
        assert_eq!(lookup("main"), Some(0x1139));
        assert_eq!(lookup("nothere"), None);
    }
}
