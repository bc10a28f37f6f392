//! The entry point `uprobe-run --pid` calls in the target process, on a thread it hijacked
//! with ptrace: sets the runtime up if it is not yet, and starts an attach session's agent
//! (see `attach::agent`).
//!
//! Normal context, on the hijacked thread (interrupted in a system call or in the program's
//! own code, so it holds neither the loader's nor malloc's locks); it returns at once.

use core::ffi::{c_char, c_int, CStr};

use crate::api::init;
use crate::attach::agent::{self, StartError};
use crate::base::output;

/// `int uprobe_attach_start(const char *socket)`: connects to `uprobe-run` on the abstract
/// unix socket named `socket` and starts the agent there. Returns 0, `-EBUSY` when a session
/// runs already, `-EPERM` when the runtime cannot work in this process, or the errno of what
/// failed (connecting, starting the thread).
///
/// # Safety
/// `socket` must be a C string.
#[no_mangle]
pub unsafe extern "C" fn uprobe_attach_start(socket: *const c_char) -> c_int {
    if socket.is_null() {
        return -libc::EINVAL;
    }
    // Connected first: if uprobe-run cannot be reached, nothing of the runtime was set up
    // and it may be unloaded again.
    // SAFETY: a C string (caller).
    let channel = match agent::connect(unsafe { CStr::from_ptr(socket) }) {
        Ok(channel) => channel,
        Err(e) => return errno(e),
    };
    let preloaded = match init::for_attach() {
        Ok(preloaded) => preloaded,
        Err(line) => {
            output::message(format_args!("{line}"));
            agent::abandon(channel);
            return -libc::EPERM;
        }
    };
    agent::start(channel, preloaded).map_or_else(errno, |()| 0)
}

fn errno(e: StartError) -> c_int {
    match e {
        StartError::Busy => -libc::EBUSY,
        StartError::Sys(errno) => -errno,
    }
}
