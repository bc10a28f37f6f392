//! The C ABI of `runtime/include/uprobe.h`: its types (from `uprobe_contracts::abi`, checked
//! against the header there) and the runtime's functions.
//!
//! The functions are resolved when the handler library is loaded, against the `libuprobe.so`
//! that `uprobe-run` preloads; a handler library must not link against it.

use core::ffi::{c_char, c_int, c_ulong};

pub use uprobe_contracts::abi::*;

extern "C" {
    /// 0 on success, a negative errno otherwise.
    pub fn register_uprobe(u: *mut Uprobe) -> c_int;
    pub fn unregister_uprobe(u: *mut Uprobe);
    /// `num` probes at once: probes at one address stop together.
    pub fn unregister_uprobes(us: *mut *mut Uprobe, num: c_int);
    /// 0 on success, a negative errno otherwise.
    pub fn register_uretprobe(rp: *mut Uretprobe) -> c_int;
    pub fn unregister_uretprobe(rp: *mut Uretprobe);
    /// The value of `--param name=value`, or NULL. Not for signal context.
    pub fn uprobe_param(name: *const c_char) -> *const c_char;
    /// Async-signal-safe formatted output to the run's output (`-o`, default stderr).
    pub fn uprobe_printf(fmt: *const c_char, ...) -> c_int;
    /// `"sym"`, `"module:sym+off"` -> run-time address, 0 if none.
    pub fn uprobe_lookup(spec: *const c_char) -> c_ulong;
}
