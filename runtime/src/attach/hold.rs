//! Holding the target's other threads for a batch's writes: the agent asks the `uprobe-run`
//! that attached, which stops them with ptrace (see `probe::world`).
//!
//! Normal context, on the agent thread, while it writes a batch (registry lock held). From
//! the stop to the resume a held thread may hold the runtime's allocator lock: these
//! exchanges allocate nothing (fixed messages, a buffer on the stack, the caller's room for
//! the addresses).

use core::sync::atomic::{AtomicI32, Ordering};

use crate::attach::wire::{self, MAX_MESSAGE};
use crate::base::{socket, sys};
use crate::probe::world::World;

/// The session socket the requests go through (-1: none).
static SOCKET: AtomicI32 = AtomicI32::new(-1);

/// Stops threads through `uprobe-run`.
pub struct ByTracer;

pub static TRACER: ByTracer = ByTracer;

/// Routes the requests through `fd` from now on (-1: the session is over).
pub fn set_socket(fd: i32) {
    SOCKET.store(fd, Ordering::SeqCst);
}

/// Sends `request` and reads the answer into `buf`; its length.
fn ask(request: &str, buf: &mut [u8]) -> Option<usize> {
    let fd = SOCKET.load(Ordering::SeqCst);
    if fd < 0 || socket::send_nosignal(fd, request.as_bytes()).is_err() {
        return None;
    }
    let (n, passed) = socket::recv_with_fd(fd, buf).ok()?;
    if let Some(passed) = passed {
        sys::close(passed);
    }
    (n > 0).then_some(n)
}

/// A stop or restop: the held threads' resume addresses in `rips`.
fn stop(request: &str, rips: &mut Vec<usize>) -> bool {
    let mut buf = [0u8; MAX_MESSAGE];
    let Some(n) = ask(request, &mut buf) else { return false };
    // A full buffer may have cut the answer short (thousands of threads).
    let parsed = if n < buf.len() { wire::parse_stopped(&buf[..n], rips) } else { Some(false) };
    match parsed {
        Some(true) => true,
        // Held, but more of them than there is room for: let them go again.
        Some(false) => {
            ByTracer.resume();
            false
        }
        None => false,
    }
}

impl World for ByTracer {
    fn stop(&self, rips: &mut Vec<usize>) -> bool {
        stop(wire::STOP, rips)
    }

    fn restop(&self, rips: &mut Vec<usize>) -> bool {
        stop(wire::RESTOP, rips)
    }

    fn resume(&self) {
        let mut buf = [0u8; 64];
        ask(wire::RESUME, &mut buf);
    }
}
