//! Holding the target's other threads for a batch's writes: the agent asks the `uprobe-run`
//! that attached, which stops them with ptrace (see `probe::world`).
//!
//! Normal context, on the agent thread, while it writes a batch (registry lock held).

use core::sync::atomic::{AtomicI32, Ordering};

use crate::attach::channel::Channel;
use crate::attach::wire::{FromAgent, ToAgent};
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

fn ask(message: FromAgent) -> Option<ToAgent> {
    let fd = SOCKET.load(Ordering::SeqCst);
    if fd < 0 {
        return None;
    }
    let channel = Channel { fd };
    let answer = channel.ask(&message).ok();
    // Borrowed: the agent owns the descriptor.
    core::mem::forget(channel);
    answer
}

fn stopped(answer: Option<ToAgent>) -> Option<Vec<usize>> {
    match answer {
        Some(ToAgent::Stopped(rips)) => Some(rips),
        _ => None,
    }
}

impl World for ByTracer {
    fn stop(&self) -> Option<Vec<usize>> {
        stopped(ask(FromAgent::Stop))
    }

    fn restop(&self) -> Option<Vec<usize>> {
        stopped(ask(FromAgent::Restop))
    }

    fn resume(&self) {
        ask(FromAgent::Resume);
    }
}
