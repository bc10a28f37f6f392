//! The run's output descriptor (and the metrics feed's, `base::feed`) in a program that closes descriptors it did not open (daemons
//! closing everything, `closefrom(3)`, `close_range(2)`) or `dup2`s onto them. `close`,
//! `close_range`, `closefrom`, `dup2` and `dup3` are interposed: closing the output's
//! descriptor reports success and keeps it open (the program cannot tell, and its next
//! `open` cannot get that number, so nothing of its own is ever written to the runtime's
//! file or the other way round); a `dup2` onto it first moves the output to another number.
//! A descriptor closed by a raw system call is not seen: the output's writes then fail and
//! it falls silent.

use core::ffi::{c_int, c_uint};

use crate::base::{feed, output};
use crate::hazard::interpose::{next, Next};

static CLOSE: Next = Next::new(c"close");
static CLOSE_RANGE: Next = Next::new(c"close_range");
static DUP2: Next = Next::new(c"dup2");
static DUP3: Next = Next::new(c"dup3");

type CloseFn = unsafe extern "C" fn(c_int) -> c_int;
type CloseRangeFn = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;
type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;

/// Start-up: looks the functions up while that is still allowed (close may be called in
/// signal handlers).
pub fn init() {
    for next in [&CLOSE, &CLOSE_RANGE, &DUP2, &DUP3] {
        next.resolve();
    }
}

/// The output's descriptor, unless it is stderr itself (the runtime always works on a copy).
fn ours() -> Option<c_int> {
    Some(output::fd()).filter(|&fd| fd > 2)
}

/// The runtime's descriptors the program may not close: the output's and the feed's.
fn kept() -> [Option<c_int>; 2] {
    [ours(), feed::fd()]
}

fn is_kept(fd: c_int) -> bool {
    kept().contains(&Some(fd))
}

/// Before a `dup2` onto `new`: the runtime's descriptor there moves first.
fn make_way(new: c_int) {
    if ours() == Some(new) {
        output::move_fd();
    }
    if feed::fd() == Some(new) {
        feed::move_fd();
    }
}

/// `close(2)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if is_kept(fd) {
        return 0;
    }
    // SAFETY: forwarding the caller's argument to libc's close.
    unsafe { next!(CLOSE, CloseFn)(fd) }
}

/// `close_range(2)`, interposed: the range is closed around the runtime's descriptors.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let real = |a: c_uint, b: c_uint| {
        // SAFETY: forwarding a sub-range of the caller's range to libc's close_range.
        unsafe { next!(CLOSE_RANGE, CloseRangeFn)(a, b, flags) }
    };
    // CLOSE_RANGE_CLOEXEC only marks: the runtime's descriptors are close-on-exec already.
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 {
        return real(first, last);
    }
    // No allocation: close may be called from a signal handler.
    let mut holes = kept().map(|fd| fd.map(|fd| fd as c_uint).filter(|&fd| first <= fd && fd <= last));
    holes.sort_unstable();
    // The range closed around the holes; the first failure is the answer.
    let mut result = 0;
    let mut from = first;
    for hole in holes.into_iter().flatten() {
        if hole > from {
            let rc = real(from, hole - 1);
            if result == 0 {
                result = rc;
            }
        }
        from = from.max(hole + 1);
    }
    if from <= last {
        let rc = real(from, last);
        if result == 0 {
            result = rc;
        }
    }
    result
}

/// `closefrom(3)`, interposed: closes everything from `low` but the runtime's descriptors.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    // SAFETY: close_range is this module's interposer, with the libc contract.
    unsafe { close_range(low.max(0) as c_uint, c_uint::MAX, 0) };
}

/// `dup2(2)`, interposed: a copy onto the output's descriptor moves the output first.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old != new {
        make_way(new);
    }
    // SAFETY: forwarding the caller's arguments to libc's dup2.
    unsafe { next!(DUP2, Dup2Fn)(old, new) }
}

/// `dup3(2)`, interposed: as `dup2`.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old != new {
        make_way(new);
    }
    // SAFETY: forwarding the caller's arguments to libc's dup3.
    unsafe { next!(DUP3, Dup3Fn)(old, new, flags) }
}
