//! Children that share the parent's memory: glibc's `posix_spawn` (behind `system` and
//! `popen` too) runs the child on the parent's memory, with the parent's thread pointer,
//! until it execs. A jump probe hit in that child runs in the parent's thread state: if the
//! child dies or execs half-way through a hit (its stack is small: 36 KiB), it could leave
//! the parent's thread marked busy, its read-side section open, or return records on a stack
//! that is gone. `posix_spawn`, `posix_spawnp`, `system` and `popen` are interposed: the
//! calling thread's runtime state is saved before and put back after.
//!
//! Normal context: these run as the program's own calls (the parent is suspended while the
//! child runs, so nothing else changes the saved state meanwhile).

use core::ffi::{c_char, c_int, c_void};

use crate::hazard::interpose::{next, Next};
use crate::probe::snapshot::Snapshot;
use crate::probe::thread;

static POSIX_SPAWN: Next = Next::new(c"posix_spawn");
static POSIX_SPAWNP: Next = Next::new(c"posix_spawnp");
static SYSTEM: Next = Next::new(c"system");
static POPEN: Next = Next::new(c"popen");

type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const c_void,
    *const c_void,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;
type SystemFn = unsafe extern "C" fn(*const c_char) -> c_int;
type PopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;

/// Runs `f`, then puts the calling thread's runtime state back as it was.
fn guarded<R>(f: impl FnOnce() -> R) -> R {
    let saved = Snapshot::take(thread::current());
    let result = f();
    saved.restore(thread::current());
    result
}

/// `posix_spawn(3)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: forwarding the caller's arguments to libc's function of the same signature.
    guarded(|| unsafe { next!(POSIX_SPAWN, SpawnFn)(pid, path, actions, attr, argv, envp) })
}

/// `posix_spawnp(3)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: forwarding the caller's arguments to libc's function of the same signature.
    guarded(|| unsafe { next!(POSIX_SPAWNP, SpawnFn)(pid, file, actions, attr, argv, envp) })
}

/// `system(3)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    // SAFETY: forwarding the caller's argument to libc's function of the same signature.
    guarded(|| unsafe { next!(SYSTEM, SystemFn)(command) })
}

/// `popen(3)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: forwarding the caller's arguments to libc's function of the same signature.
    guarded(|| unsafe { next!(POPEN, PopenFn)(command, mode) })
}

/// Start-up: looks the functions up while that is still allowed.
pub fn init() {
    for next in [&POSIX_SPAWN, &POSIX_SPAWNP, &SYSTEM, &POPEN] {
        next.resolve();
    }
}
