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

/// Resumes `tid` (delivering `signal`, 0: none) until its next system call entry or exit.
pub fn syscall(tid: i32, signal: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_SYSCALL, tid, 0, signal as usize).map(drop)
}

/// Has system call stops of `tid` reported as [`Event::Syscall`] (exec stops still reported).
pub fn report_syscalls(tid: i32) -> io::Result<()> {
    let options = libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_TRACESYSGOOD;
    ptrace(libc::PTRACE_SETOPTIONS, tid, 0, options as usize).map(drop)
}

/// `NT_X86_XSTATE`: the FPU and vector registers in the standard XSAVE layout.
const NT_X86_XSTATE: usize = 0x202;

/// The XSAVE area of stopped thread `tid` (standard, uncompacted layout), as long as the
/// kernel gives it.
pub fn get_xstate(tid: i32) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    ptrace(libc::PTRACE_GETREGSET, tid, NT_X86_XSTATE, &mut iov as *mut libc::iovec as usize)?;
    buf.truncate(iov.iov_len);
    Ok(buf)
}

/// The FXSAVE area (512 bytes) of stopped thread `tid`.
pub fn get_fxsave(tid: i32) -> io::Result<Vec<u8>> {
    const NT_PRFPREG: usize = 2;
    let mut buf = vec![0u8; 512];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    ptrace(libc::PTRACE_GETREGSET, tid, NT_PRFPREG, &mut iov as *mut libc::iovec as usize)?;
    Ok(buf)
}

/// The `_fpx_sw_bytes` (48 bytes) the kernel writes into the FPU state of a signal frame on
/// this machine, as seen in a signal this process sends itself: what `rt_sigreturn` checks
/// before it restores a frame's XSAVE area (magic, sizes, the features present). None when
/// the frame has no XSAVE area (no XSAVE on this processor).
pub fn signal_frame_fp_sw_bytes() -> Option<[u8; 48]> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SEEN: AtomicBool = AtomicBool::new(false);
    static mut BYTES: [u8; 48] = [0; 48];
    extern "C" fn handler(_: libc::c_int, _: *mut libc::siginfo_t, context: *mut libc::c_void) {
        // The kernel passes a valid ucontext; only this handler writes BYTES, during the raise().
        // SAFETY: fpregs point into the signal frame: 512 bytes of FXSAVE area at least.
        unsafe {
            let fpregs = (*(context as *mut libc::ucontext_t)).uc_mcontext.fpregs as *const u8;
            if !fpregs.is_null() {
                std::ptr::copy_nonoverlapping(fpregs.add(464), std::ptr::addr_of_mut!(BYTES).cast::<u8>(), 48);
                SEEN.store(true, Ordering::SeqCst);
            }
        }
    }
    // SIGURG is ignored by default: borrowing it for one raise() changes nothing else.
    // SAFETY: a zeroed sigaction is valid; the old action is put back; the handler copies bytes.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGURG, &action, &mut old) != 0 {
            return None;
        }
        libc::raise(libc::SIGURG);
        libc::sigaction(libc::SIGURG, &old, std::ptr::null_mut());
    }
    const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
    // SAFETY: the handler has run (raise returns after it) and nothing writes BYTES now.
    let bytes = unsafe { std::ptr::addr_of!(BYTES).read() };
    let magic = u32::from_ne_bytes(bytes[..4].try_into().unwrap());
    (SEEN.load(Ordering::SeqCst) && magic == FP_XSTATE_MAGIC1).then_some(bytes)
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
    /// Stopped at a system call's entry or exit (see [`report_syscalls`]).
    Syscall,
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
            (_, signal) if signal == libc::SIGTRAP | 0x80 => Event::Syscall,
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
