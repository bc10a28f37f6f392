//! The session's descriptors on uprobe-run's side: seqpacket messages with a descriptor
//! attached, the output socket pair, signals as a descriptor, the target's pidfd (readable
//! when it exits) and the descriptors taken from the target with it, memory file seals.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Waits up to `timeout` for a readable (or hung-up) descriptor among `fds`; their revents.
pub fn poll(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut polled: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    loop {
        // SAFETY: `polled` is a writable array of pollfd of the length passed.
        match check(unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(polled.iter().map(|p| p.revents != 0).collect()),
        }
    }
}

/// Sends one message, with `fd` attached when given.
pub fn send(socket: &OwnedFd, bytes: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    let mut control = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call, and the
    // control buffer has room for one descriptor's cmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is arithmetic.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        // SAFETY: the control buffer holds one cmsg header and its descriptor.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut RawFd, fd);
        }
    }
    // SAFETY: `msg` describes readable buffers of the lengths given.
    let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one message (empty: the other end closed).
pub fn recv(socket: RawFd, max: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; max];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(socket, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf.truncate(n as usize);
        return Ok(buf);
    }
}

/// Receives one message if one is waiting (None: none is).
pub fn try_recv(socket: RawFd, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; max];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { libc::recv(socket, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e) };
    }
    buf.truncate(n as usize);
    Ok(Some(buf))
}

/// A connected pair of seqpacket sockets: (ours, theirs).
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    check(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })?;
    Ok((owned(fds[0]), owned(fds[1])))
}

/// Blocks `signals` and returns a descriptor that reads them.
pub fn signalfd(signals: &[i32]) -> io::Result<OwnedFd> {
    // SAFETY: a zeroed sigset_t is the empty set; the set functions get valid pointers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        check(libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()))?;
        check(libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)).map(owned)
    }
}

/// Reads one signal from a signalfd: its number.
pub fn read_signal(fd: &OwnedFd) -> io::Result<i32> {
    // SAFETY: a zeroed signalfd_siginfo is valid output space.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: `info` is writable for `size` bytes.
    let n = unsafe { libc::read(fd.as_raw_fd(), &mut info as *mut _ as *mut libc::c_void, size) };
    if n as usize != size {
        return Err(io::Error::last_os_error());
    }
    Ok(info.ssi_signo as i32)
}

/// A duplicate of descriptor `fd` of the process of `pidfd` (`pidfd_getfd`: the caller must
/// be allowed to ptrace it), close-on-exec.
pub fn take_fd(pidfd: &OwnedFd, fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes plain integers.
    let ours = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if ours < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned(ours as libc::c_int))
}

/// Seals memory file `file` (`F_ADD_SEALS`) with `seals`; the seals it then has.
pub fn seal(file: &impl AsRawFd, seals: libc::c_int) -> io::Result<libc::c_int> {
    // SAFETY: fcntl on a descriptor the caller owns, with integer arguments.
    check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) })
}

/// Whether `fd` is readable (or hung up) now, without waiting.
pub fn ready(fd: RawFd) -> bool {
    poll(&[fd], Some(Duration::ZERO)).is_ok_and(|r| r[0])
}

/// A pidfd of process `pid`: readable once it exits.
pub fn pidfd(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes plain integers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned(fd as libc::c_int))
}

/// Sets a socket's send buffer (best effort: the kernel caps it).
pub fn set_send_buffer(socket: &OwnedFd, bytes: libc::c_int) {
    // SAFETY: SO_SNDBUF reads one int.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            &bytes as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}
