//! The entry point `uprobe-run --pid` calls in the target process, on a thread it hijacked
//! with ptrace: sets the runtime up if it is not yet, and starts an attach session's agent
//! (see `attach::agent`).
//!
//! Normal context, on the hijacked thread (interrupted in a system call or in the program's
//! own code, so it holds neither the loader's nor malloc's locks); it returns at once.

use core::ffi::c_int;

use crate::api::{attached, init};
use crate::attach::agent::{self, StartError};
use crate::base::output;

/// `void uprobe_attach_begin(int result[2])`: claims the process's one session, sets the
/// runtime up if it is not yet, makes the session's channel (a socket pair) and starts the
/// agent on one end. Leaves in `result[1]` the other end's descriptor, which `uprobe-run`
/// takes from this process (`pidfd_getfd`), and then in `result[0]` 0, `-EBUSY` when a
/// session runs already, `-EPERM` when the runtime cannot work in this process, or the errno
/// of what failed. The result is left in memory because `uprobe-run` makes this call return
/// through a signal return, which gives the thread its registers back (see `uprobe-run`'s
/// `attach::inject`).
///
/// # Safety
/// `result` must point to two writable ints.
#[no_mangle]
pub unsafe extern "C" fn uprobe_attach_begin(result: *mut c_int) {
    if result.is_null() {
        return;
    }
    let (status, fd) = match begin() {
        Ok(fd) => (0, fd),
        Err(e) => (e, -1),
    };
    // SAFETY: two writable ints (caller); the descriptor first, the status says it is there.
    unsafe {
        result.add(1).write_volatile(fd);
        result.write_volatile(status);
    }
}

fn begin() -> Result<c_int, c_int> {
    let (channel, theirs) = agent::open().map_err(errno)?;
    let preloaded = match init::for_attach() {
        Ok(preloaded) => preloaded,
        Err(line) => {
            output::message(format_args!("{line}"));
            agent::abandon(channel, theirs);
            return Err(-libc::EPERM);
        }
    };
    attached::install();
    agent::start(channel, theirs, preloaded).map_err(errno)?;
    Ok(theirs)
}

fn errno(e: StartError) -> c_int {
    match e {
        StartError::Busy => -libc::EBUSY,
        StartError::Sys(errno) => -errno,
    }
}
