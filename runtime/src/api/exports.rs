//! The exported C functions of `include/uprobe.h`: registration (carried out by the core,
//! queued when called from a handler: see `probe::deferred`), parameters and symbol lookup.
//!
//! Context: normal, or a handler (signal or stub context) for the registration calls.

use core::ffi::{c_char, c_int, c_ulong, CStr};

use crate::base::abi::{Uprobe, Uretprobe};
use crate::base::{output, params};
use crate::probe::deferred::{self, Request};
use crate::probe::registry;
use crate::probe::retprobe;
use crate::probe::table::Consumer;
use crate::probe::thread;

/// `int register_uprobe(struct uprobe *u)`.
///
/// # Safety
/// `u` must point to a `struct uprobe` that stays valid until it is unregistered.
#[no_mangle]
pub unsafe extern "C" fn register_uprobe(u: *mut Uprobe) -> c_int {
    if u.is_null() {
        return -libc::EINVAL;
    }
    deferred::request(Request::Register(Consumer::Uprobe(u)))
}

/// `void unregister_uprobe(struct uprobe *u)`.
///
/// # Safety
/// `u` must be null, unregistered, or a registered probe object.
#[no_mangle]
pub unsafe extern "C" fn unregister_uprobe(u: *mut Uprobe) {
    if !u.is_null() {
        deferred::request(Request::Unregister(Consumer::Uprobe(u)));
    }
}

/// `void unregister_uprobes(struct uprobe **us, int num)`: the `num` probes at once (as the
/// kernel's `unregister_kprobes`): one grace period, and probes at one address stop together.
///
/// # Safety
/// `us` must point to `num` pointers, each null, unregistered, or a registered probe object.
#[no_mangle]
pub unsafe extern "C" fn unregister_uprobes(us: *mut *mut Uprobe, num: c_int) {
    if us.is_null() || num <= 0 {
        return;
    }
    // SAFETY: `num` readable pointers (caller).
    let all = unsafe { core::slice::from_raw_parts(us, num as usize) };
    let consumers: Vec<Consumer> = all.iter().filter(|u| !u.is_null()).map(|&u| Consumer::Uprobe(u)).collect();
    deferred::unregister_all(&consumers);
}

/// `int register_uretprobe(struct uretprobe *rp)`.
///
/// # Safety
/// `rp` must point to a `struct uretprobe` that stays valid until it is unregistered.
#[no_mangle]
pub unsafe extern "C" fn register_uretprobe(rp: *mut Uretprobe) -> c_int {
    if rp.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: non-null, and valid per the contract.
    let data_size = unsafe { (*rp).data_size };
    if data_size > retprobe::MAX_DATA_SIZE {
        output::message(format_args!(
            "register_uretprobe: data_size {data_size} is more than the {} bytes an instance may hold",
            retprobe::MAX_DATA_SIZE
        ));
        return -libc::EINVAL;
    }
    deferred::request(Request::Register(Consumer::Uretprobe(rp)))
}

/// `void unregister_uretprobe(struct uretprobe *rp)`. Returns pending on other threads keep
/// returning correctly but run no handler once this returns.
///
/// # Safety
/// `rp` must be null, unregistered, or a registered return probe.
#[no_mangle]
pub unsafe extern "C" fn unregister_uretprobe(rp: *mut Uretprobe) {
    if !rp.is_null() {
        deferred::request(Request::Unregister(Consumer::Uretprobe(rp)));
    }
}

/// The process's `--param` values, set once before any handler library is loaded.
pub fn set_params(params: &[(String, String)]) {
    params::set_process(params);
}

/// `const char *uprobe_param(const char *name)`: the process's parameters, or, for an attach
/// session's libraries, the session's (see `base::params`).
///
/// # Safety
/// `name` must be null or a C string.
#[no_mangle]
pub unsafe extern "C" fn uprobe_param(name: *const c_char) -> *const c_char {
    if name.is_null() {
        return core::ptr::null();
    }
    // A handler of an attach session's library reads the session's parameters.
    let code = thread::current().code.get();
    // SAFETY: `name` is a C string (caller).
    params::lookup(unsafe { CStr::from_ptr(name) }, code)
}

/// `unsigned long uprobe_lookup(const char *spec)`.
///
/// # Safety
/// `spec` must be null or a C string.
#[no_mangle]
pub unsafe extern "C" fn uprobe_lookup(spec: *const c_char) -> c_ulong {
    if spec.is_null() {
        return 0;
    }
    // SAFETY: `spec` is a C string (caller).
    let spec = unsafe { CStr::from_ptr(spec) }.to_string_lossy();
    deferred::inside(|| registry::lookup_spec(&spec)).map_or(0, |a| a as c_ulong)
}
