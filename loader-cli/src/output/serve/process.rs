//! The program as a child of uprobe-run (which must outlive it to serve): started with the
//! feed's end of the socket inherited, waited for, its ending passed on as uprobe-run's own.
//!
//! Signals, as a shell that waits for a foreground job: the program stays in uprobe-run's
//! process group, so Ctrl-C and Ctrl-\ from the terminal reach it directly; uprobe-run
//! itself does not die of SIGINT or SIGQUIT. SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to
//! uprobe-run are passed on to the program. A program killed by a signal makes uprobe-run
//! die of the same signal (without a second core dump), so the caller sees the same ending.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;
use std::process::{Child, Command};

/// Signals handled by the waiting thread: the first two are swallowed, the others passed on.
const SWALLOWED: [i32; 2] = [libc::SIGINT, libc::SIGQUIT];
const PASSED_ON: [i32; 4] = [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2];

fn signal_set(signals: &[i32]) -> libc::sigset_t {
    // SAFETY: sigemptyset initializes the set it is given; sigaddset takes valid numbers.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

fn handled() -> libc::sigset_t {
    signal_set(&[&SWALLOWED[..], &PASSED_ON[..]].concat())
}

/// A socket pair: uprobe-run's end (close-on-exec) and the program's (inherited).
pub fn socket_pair() -> io::Result<(RawFd, RawFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: clearing FD_CLOEXEC on a descriptor just made.
    if unsafe { libc::fcntl(fds[1], libc::F_SETFD, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fds[0], fds[1]))
}

/// Blocks the handled signals in this thread and every thread it starts from now on (the
/// HTTP server's included), so that none kills uprobe-run or is lost before the signal
/// thread takes them. Called before anything starts a thread.
pub fn block_handled() {
    let set = handled();
    // SAFETY: blocking signals in this thread, with a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, core::ptr::null_mut()) };
}

/// Starts `command` with the signals uprobe-run blocks unblocked again (the mask is
/// inherited across fork and exec; dispositions are not touched, so they are the defaults).
pub fn spawn(mut command: Command, program_end: RawFd) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let set = handled();
    // SAFETY: between fork and exec the closure makes one async-signal-safe call, on a set
    // made before the fork.
    unsafe {
        command.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, core::ptr::null_mut());
            Ok(())
        })
    };
    let child = command.spawn();
    // SAFETY: the child has its copy; uprobe-run's copy of its end is of no use.
    unsafe { libc::close(program_end) };
    child
}

/// Where the program is, for the signal thread.
#[derive(Clone, Copy)]
pub enum Phase {
    Running(i32),
    /// Ended (and reaped: its pid may be another process's now).
    Ended(std::process::ExitStatus),
}

pub type Shared = std::sync::Arc<std::sync::Mutex<Phase>>;

/// A signal asked uprobe-run to end (SIGINT, SIGQUIT, SIGTERM, SIGHUP) while the program
/// ran: once it ends, uprobe-run ends too, without lingering. Set under the phase's lock.
static ASKED_TO_END: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a signal asked uprobe-run to end (read after the phase turned Ended).
pub fn asked_to_end() -> bool {
    ASKED_TO_END.load(std::sync::atomic::Ordering::SeqCst)
}

/// Takes the handled signals until the process ends (a thread of its own): while the
/// program runs, passes on those to be passed on (and notes that uprobe-run is to end with
/// the program, see [`asked_to_end`]); once it ended (while the last numbers are served),
/// any of them ends uprobe-run at once, as the program ended.
pub fn forward_signals(phase: Shared) {
    let set = handled();
    std::thread::spawn(move || loop {
        let mut sig = 0;
        // SAFETY: sigwait on a valid set, blocked in every thread (inherited from main).
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        let guard = phase.lock().unwrap_or_else(|e| e.into_inner());
        if !matches!(sig, libc::SIGUSR1 | libc::SIGUSR2) {
            ASKED_TO_END.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        match *guard {
            Phase::Running(pid) if PASSED_ON.contains(&sig) => {
                // SAFETY: kill takes plain numbers; `pid` is not reaped while the phase is
                // Running (see `wait`), so it is still the program's.
                unsafe { libc::kill(pid, sig) };
            }
            Phase::Running(_) => {}
            Phase::Ended(status) => end_as(status),
        }
    });
}

/// Waits for the program's end; the phase turns Ended before the child is reaped.
pub fn wait(child: &mut Child, phase: &Shared) -> io::Result<std::process::ExitStatus> {
    loop {
        // SAFETY: a zeroed siginfo_t is valid output; WNOWAIT leaves the child unreaped.
        let mut info: libc::siginfo_t = unsafe { core::mem::zeroed() };
        // SAFETY: waitid with a valid siginfo_t pointer.
        let rc = unsafe { libc::waitid(libc::P_PID, child.id(), &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let mut guard = phase.lock().unwrap_or_else(|e| e.into_inner());
    let status = child.wait()?;
    *guard = Phase::Ended(status);
    Ok(status)
}

/// The unix socket file to remove when uprobe-run ends (it made it).
pub static SOCKET_FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Ends uprobe-run as the program ended: its exit status, or its fatal signal.
pub fn end_as(status: std::process::ExitStatus) -> ! {
    use std::os::unix::process::ExitStatusExt;
    if let Some(path) = SOCKET_FILE.get() {
        let _ = std::fs::remove_file(path);
    }
    if let Some(code) = status.code() {
        std::process::exit(code);
    }
    let sig = status.signal().unwrap_or(libc::SIGKILL);
    // SAFETY: no core file of uprobe-run's own; the default action of the program's signal,
    // unblocked, then raised on this thread.
    unsafe {
        let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        libc::signal(sig, libc::SIG_DFL);
        let one = signal_set(&[sig]);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, core::ptr::null_mut());
        libc::raise(sig);
    }
    std::process::exit(128 + sig);
}
