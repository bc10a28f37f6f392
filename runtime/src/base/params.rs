//! The `--param` values that handlers read with `uprobe_param`: the process's, given at
//! start-up, and an attach session's, which the thread carrying out the session's work (its
//! libraries' `uprobe_init` and `uprobe_exit`) and the session's handlers (known by the
//! session's output route, see `route`) see instead.
//!
//! Normal context: lookups read published lists; the process's list is never freed, a
//! session's only when the session ends.

use core::ffi::{c_char, CStr};
use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

use crate::base::{route, sys};

type List = Vec<(CString, CString)>;

static PROCESS: AtomicPtr<List> = AtomicPtr::new(core::ptr::null_mut());
static SESSION: AtomicPtr<List> = AtomicPtr::new(core::ptr::null_mut());
/// The thread that sees the session's list, or 0.
static SESSION_TID: AtomicI32 = AtomicI32::new(0);
/// The session's output: code routed there sees the session's list too.
static SESSION_FD: AtomicI32 = AtomicI32::new(-1);

fn list(params: &[(String, String)]) -> *mut List {
    let list: List = params
        .iter()
        .filter_map(|(n, v)| Some((CString::new(n.as_str()).ok()?, CString::new(v.as_str()).ok()?)))
        .collect();
    Box::into_raw(Box::new(list))
}

/// Sets the process's parameters, once, before any handler library is loaded.
pub fn set_process(params: &[(String, String)]) {
    PROCESS.store(list(params), Ordering::Release);
}

/// Gives thread `tid`, and code whose output goes to `fd`, the session's parameters instead of
/// the process's.
pub fn set_session(tid: i32, fd: i32, params: &[(String, String)]) {
    let old = SESSION.swap(list(params), Ordering::AcqRel);
    SESSION_TID.store(tid, Ordering::Release);
    SESSION_FD.store(fd, Ordering::Release);
    free(old);
}

/// Ends the session's parameters (the session is over: nothing of it reads them anymore).
pub fn clear_session() {
    SESSION_TID.store(0, Ordering::Release);
    SESSION_FD.store(-1, Ordering::Release);
    free(SESSION.swap(core::ptr::null_mut(), Ordering::AcqRel));
}

fn free(list: *mut List) {
    if !list.is_null() {
        // SAFETY: lists come from Box::into_raw in `list` and were unpublished by the caller.
        drop(unsafe { Box::from_raw(list) });
    }
}

/// The value of parameter `name` for the calling thread, running code at `code` (0: not a
/// handler), or null.
pub fn lookup(name: &CStr, code: usize) -> *const c_char {
    let tid = SESSION_TID.load(Ordering::Acquire);
    let session = tid != 0
        && (tid == sys::gettid() || (code != 0 && route::fd_for(code) == Some(SESSION_FD.load(Ordering::Acquire))));
    let params = if session { &SESSION } else { &PROCESS };
    let params = params.load(Ordering::Acquire);
    if params.is_null() {
        return core::ptr::null();
    }
    // SAFETY: published lists stay allocated while a thread may read them (module doc).
    let params = unsafe { &*params };
    params.iter().find(|(n, _)| n.as_c_str() == name).map_or(core::ptr::null(), |(_, v)| v.as_ptr())
}
