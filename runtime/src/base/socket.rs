//! Unix sockets, poll and eventfd by raw system calls (counted like the rest of
//! `base::sys`): the channel between an attach session's agent and the `uprobe-run` that
//! attached.
//!
//! Context: normal (the agent thread).

use crate::base::stats::Call;
use crate::base::sys::{call, Errno};

/// A connected pair of unix seqpacket sockets, close-on-exec: an attach session's channel,
/// one end of which `uprobe-run` takes from this process (`pidfd_getfd`), so no name another
/// process could bind or connect to exists.
pub fn socketpair_seqpacket() -> Result<(i32, i32), Errno> {
    let kind = (libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC) as usize;
    let mut fds = [-1i32; 2];
    let args = [libc::AF_UNIX as usize, kind, 0, fds.as_mut_ptr() as usize, 0, 0];
    // SAFETY: socketpair writes two descriptors into `fds`.
    unsafe { call(Call::Other, libc::SYS_socketpair, args) }?;
    Ok((fds[0], fds[1]))
}

/// Sends `buf` as one message on a socket, without SIGPIPE when the peer is gone (EPIPE then).
pub fn send_nosignal(fd: i32, buf: &[u8]) -> Result<usize, Errno> {
    loop {
        let args = [fd as usize, buf.as_ptr() as usize, buf.len(), libc::MSG_NOSIGNAL as usize, 0, 0];
        // SAFETY: `buf` is readable for its length; no address is passed.
        match unsafe { call(Call::Write, libc::SYS_sendto, args) } {
            Err(libc::EINTR) => continue,
            other => return other,
        }
    }
}

/// Sends `buf` as one message without waiting for room (EAGAIN when the peer's side is full)
/// and without SIGPIPE (signal-safe).
pub fn send_nowait(fd: i32, buf: &[u8]) -> Result<usize, Errno> {
    let flags = (libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) as usize;
    loop {
        let args = [fd as usize, buf.as_ptr() as usize, buf.len(), flags, 0, 0];
        // SAFETY: `buf` is readable for its length; no address is passed.
        match unsafe { call(Call::Write, libc::SYS_sendto, args) } {
            Err(libc::EINTR) => continue,
            other => return other,
        }
    }
}

/// Receives one message into `buf`, and the descriptor it carries (SCM_RIGHTS), if any, made
/// close-on-exec. Ok(0): the peer closed the socket.
pub fn recv_with_fd(fd: i32, buf: &mut [u8]) -> Result<(usize, Option<i32>), Errno> {
    let mut control = [0u64; 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = core::mem::size_of_val(&control);
    let n = loop {
        let args = [fd as usize, &mut msg as *mut libc::msghdr as usize, libc::MSG_CMSG_CLOEXEC as usize, 0, 0, 0];
        // SAFETY: `msg` describes writable buffers of the lengths given.
        match unsafe { call(Call::Read, libc::SYS_recvmsg, args) } {
            Err(libc::EINTR) => continue,
            other => break other?,
        }
    };
    // SAFETY: the kernel filled the control buffer, which CMSG_FIRSTHDR/DATA walk within
    // msg_controllen.
    let passed = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if !cmsg.is_null() && (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
            Some(core::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const i32))
        } else {
            None
        }
    };
    Ok((n, passed))
}

/// Waits until one of `fds` is ready or `timeout_ms` passed (-1: no limit); the number ready.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<usize, Errno> {
    let args = [fds.as_mut_ptr() as usize, fds.len(), timeout_ms as isize as usize, 0, 0, 0];
    // SAFETY: `fds` is a writable array of pollfd of the length passed.
    unsafe { call(Call::Other, libc::SYS_poll, args) }
}

/// An eventfd counter, close-on-exec: one thread wakes another's `poll`.
pub fn eventfd() -> Result<i32, Errno> {
    // SAFETY: eventfd2 takes plain integers.
    unsafe { call(Call::Other, libc::SYS_eventfd2, [0, libc::EFD_CLOEXEC as usize, 0, 0, 0, 0]) }.map(|fd| fd as i32)
}

/// Shuts a socket down both ways (a read waiting on it returns end of file); errors are of
/// no use to the caller.
pub fn shutdown(fd: i32) {
    // SAFETY: shutdown takes plain integers.
    let _ = unsafe { call(Call::Other, libc::SYS_shutdown, [fd as usize, libc::SHUT_RDWR as usize, 0, 0, 0, 0]) };
}
