//! The one place that calls into the runtime. Unit tests swap it for a fake that records
//! what would have been called, so the safe layer is tested without libuprobe.so loaded.

#[cfg(test)]
pub(crate) use fake::*;
#[cfg(not(test))]
pub(crate) use real::*;

#[cfg(not(test))]
mod real {
    use crate::abi::{self, Uprobe};
    use core::ffi::{c_int, CStr};

    /// Signal context: yes (uprobe_printf is async-signal-safe).
    pub(crate) fn print(line: &CStr) {
        // SAFETY: both arguments are NUL-terminated strings that outlive the call, and "%s"
        // consumes exactly the one `const char *` passed after it.
        unsafe {
            abi::uprobe_printf(c"%s".as_ptr(), line.as_ptr());
        }
    }

    pub(crate) fn param(name: &CStr) -> Option<String> {
        // SAFETY: `name` is NUL-terminated; the runtime returns NULL or a NUL-terminated
        // string it keeps for the whole run, copied out here before anything else happens.
        unsafe {
            let value = abi::uprobe_param(name.as_ptr());
            (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
        }
    }

    pub(crate) fn lookup(spec: &CStr) -> u64 {
        // SAFETY: `spec` is NUL-terminated and only read during the call.
        unsafe { abi::uprobe_lookup(spec.as_ptr()) }
    }

    /// # Safety
    /// `u` points to a probe that stays valid and in place until it is unregistered.
    pub(crate) unsafe fn register(u: *mut Uprobe) -> c_int {
        // SAFETY: forwarded from the caller.
        unsafe { abi::register_uprobe(u) }
    }

    /// # Safety
    /// `u` points to a probe registered with [`register`], or to one the runtime never saw.
    pub(crate) unsafe fn unregister(u: *mut Uprobe) {
        // SAFETY: forwarded from the caller.
        unsafe { abi::unregister_uprobe(u) }
    }

    /// # Safety
    /// As [`unregister`], for each.
    pub(crate) unsafe fn unregister_all(us: &[*mut Uprobe]) {
        // SAFETY: forwarded from the caller; `us` holds `us.len()` pointers, only read.
        unsafe { abi::unregister_uprobes(us.as_ptr().cast_mut(), us.len() as c_int) }
    }
}

#[cfg(test)]
pub(crate) mod fake {
    use crate::abi::Uprobe;
    use core::ffi::{c_int, CStr};
    use std::cell::RefCell;

    thread_local! {
        /// Lines passed to `uprobe_printf("%s", ...)`.
        pub(crate) static PRINTED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
        /// What `register_uprobe` returns next.
        pub(crate) static REGISTER_RESULT: RefCell<c_int> = const { RefCell::new(0) };
        /// Every `register_uprobe` (true) and `unregister_uprobe` (false) call.
        pub(crate) static CALLS: RefCell<Vec<(bool, usize)>> = const { RefCell::new(Vec::new()) };
    }

    pub(crate) fn print(line: &CStr) {
        PRINTED.with(|p| p.borrow_mut().push(line.to_string_lossy().into_owned()));
    }

    pub(crate) fn param(name: &CStr) -> Option<String> {
        (name == c"present").then(|| "value".to_owned())
    }

    pub(crate) fn lookup(spec: &CStr) -> u64 {
        if spec == c"main" {
            0x1139
        } else {
            0
        }
    }

    pub(crate) unsafe fn register(u: *mut Uprobe) -> c_int {
        CALLS.with(|c| c.borrow_mut().push((true, u as usize)));
        REGISTER_RESULT.with(|r| *r.borrow())
    }

    pub(crate) unsafe fn unregister(u: *mut Uprobe) {
        CALLS.with(|c| c.borrow_mut().push((false, u as usize)));
    }

    pub(crate) unsafe fn unregister_all(us: &[*mut Uprobe]) {
        CALLS.with(|c| c.borrow_mut().extend(us.iter().map(|&u| (false, u as usize))));
    }

    pub(crate) fn take_printed() -> Vec<String> {
        PRINTED.with(|p| std::mem::take(&mut *p.borrow_mut()))
    }
}
