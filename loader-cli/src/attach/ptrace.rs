//! The ptrace requests, waits and remote memory accesses attach needs. Every `unsafe` block
//! of the attach code is here or in `net`.
#![allow(unsafe_code)]

use std::io;

pub type Regs = libc::user_regs_struct;

const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn ptrace(request: libc::c_uint, tid: i32, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: every request made here passes integers, or pointers to live locals of the size
    // the request reads or writes.
    check(unsafe { libc::ptrace(request, tid, addr, data) })
}

/// Starts tracing thread `tid` without stopping it; exec stops are reported.
pub fn seize(tid: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_SEIZE, tid, 0, libc::PTRACE_O_TRACEEXEC as usize).map(drop)
}

pub fn interrupt(tid: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0).map(drop)
}

/// Stops tracing `tid`, delivering `signal` (0: none) as it goes.
pub fn detach(tid: i32, signal: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_DETACH, tid, 0, signal as usize).map(drop)
}

pub fn cont(tid: i32, signal: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_CONT, tid, 0, signal as usize).map(drop)
}

/// An all-zero register set.
pub fn zeroed_regs() -> Regs {
    // SAFETY: user_regs_struct is plain integers; all zero is a valid value.
    unsafe { std::mem::zeroed() }
}

pub fn get_regs(tid: i32) -> io::Result<Regs> {
    let mut regs = zeroed_regs();
    ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut Regs as usize)?;
    Ok(regs)
}

pub fn set_regs(tid: i32, regs: &Regs) -> io::Result<()> {
    ptrace(libc::PTRACE_SETREGS, tid, 0, regs as *const Regs as usize).map(drop)
}

/// The blocked-signal mask of stopped thread `tid` (bit n-1 for signal n).
pub fn get_sigmask(tid: i32) -> io::Result<u64> {
    let mut mask: u64 = 0;
    ptrace(PTRACE_GETSIGMASK, tid, 8, &mut mask as *mut u64 as usize)?;
    Ok(mask)
}

pub fn set_sigmask(tid: i32, mask: u64) -> io::Result<()> {
    ptrace(PTRACE_SETSIGMASK, tid, 8, &mask as *const u64 as usize).map(drop)
}

/// How a traced thread changed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Stopped by PTRACE_INTERRUPT or in a group stop.
    Stopped,
    /// Stopped on its way to receive `signal`.
    Signal(i32),
    /// Stopped after an exec.
    Exec,
    /// Gone: exited (status) or killed (signal).
    Exited(i32),
    Killed(i32),
}

/// The next state change of traced thread `tid`, if there is one (without waiting).
pub fn poll_event(tid: i32) -> io::Result<Option<Event>> {
    let mut status = 0;
    // SAFETY: waitpid writes one int; __WALL also waits for threads (clone children).
    let got = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    if got == 0 {
        return Ok(None);
    }
    Ok(Some(if libc::WIFEXITED(status) {
        Event::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Event::Killed(libc::WTERMSIG(status))
    } else {
        match (status >> 16, libc::WSTOPSIG(status)) {
            (libc::PTRACE_EVENT_EXEC, _) => Event::Exec,
            (libc::PTRACE_EVENT_STOP, _) => Event::Stopped,
            (_, signal) => Event::Signal(signal),
        }
    }))
}

/// Writes `bytes` into process `pid`'s memory at `addr`.
pub fn write_memory(pid: i32, addr: u64, bytes: &[u8]) -> io::Result<()> {
    let local = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: the local iovec describes `bytes`; the kernel checks the remote range.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        n if n as usize != bytes.len() => Err(io::Error::from_raw_os_error(libc::EFAULT)),
        _ => Ok(()),
    }
}

/// Reads up to `len` bytes of process `pid`'s memory at `addr` (fewer at the end of a mapping).
pub fn read_memory(pid: i32, addr: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
    // SAFETY: the local iovec describes `buf`; the kernel checks the remote range.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// uprobe-run's effective uid.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}
