//! The kernel, for the benches: starting the fixture in one of three ways (fork and exec,
//! raw: the child may only make async-signal-safe calls), perf_event_open (which no library
//! wraps), and through nix: waiting, signals, ptrace requests and CPU affinity. Every
//! `unsafe` block of the crate is here.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid as NixPid;

pub type Pid = libc::pid_t;
/// The tracee's registers as PTRACE_GETREGS returns them.
pub type Regs = libc::user_regs_struct;

/// How a child starts its program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartMode {
    /// exec at once.
    Plain,
    /// PTRACE_TRACEME, then exec: the child stops with SIGTRAP right after the exec.
    Traced,
    /// Wait until the parent calls [`Child::release`], then exec.
    Gated,
}

/// A forked child running (or about to run) a program.
#[derive(Debug)]
pub struct Child {
    pub pid: Pid,
    gate: Option<File>,
}

impl Child {
    /// Lets a [`StartMode::Gated`] child go on to its exec.
    pub fn release(&mut self) -> io::Result<()> {
        match self.gate.take() {
            Some(mut gate) => gate.write_all(b"x"),
            None => Ok(()),
        }
    }

    /// Sends SIGKILL and reaps the child.
    pub fn kill_and_reap(&mut self) {
        self.gate = None;
        let _ = kill(NixPid::from_raw(self.pid), Signal::SIGKILL);
        let _ = wait(self.pid);
    }
}

/// nix's signal for a number (0: none).
fn nix_signal(signal: i32) -> io::Result<Option<Signal>> {
    match signal {
        0 => Ok(None),
        n => Signal::try_from(n).map(Some).map_err(io::Error::from),
    }
}

/// Sends `signal` to process `pid`.
pub fn signal(pid: Pid, signal: i32) -> io::Result<()> {
    kill(NixPid::from_raw(pid), nix_signal(signal)?).map_err(io::Error::from)
}

/// How a waited-for child changed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Exited(i32),
    Signaled(i32),
    Stopped(i32),
}

fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Forks and executes `argv[0]` (a path) with `argv`, standard output going to `stdout`.
/// The environment is inherited.
pub fn spawn(argv: &[CString], stdout: &File, mode: StartMode) -> io::Result<Child> {
    if argv.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty argv"));
    }
    // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
    let mut ptrs: Vec<*const c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(ptr::null());
    let out_fd = stdout.as_raw_fd();
    let (gate_read, gate_write) = if mode == StartMode::Gated {
        let (r, w) = pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let gate_read_fd = gate_read.as_ref().map_or(-1, |fd| fd.as_raw_fd());
    let gate_write_fd = gate_write.as_ref().map_or(-1, |fd| fd.as_raw_fd());

    // SAFETY: fork(2) has no memory-safety preconditions; the child below touches only
    // memory prepared before the fork and makes only async-signal-safe calls until exec/_exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: child side of fork: dup2, read, ptrace, execv and _exit are async-signal-safe;
        // `ptrs` is a NULL-terminated array of pointers into `argv`, alive until exec.
        unsafe {
            if libc::dup2(out_fd, 1) < 0 {
                libc::_exit(126);
            }
            match mode {
                StartMode::Plain => {}
                StartMode::Traced => {
                    if libc::ptrace(libc::PTRACE_TRACEME, 0, ptr::null_mut::<c_void>(), 0) < 0 {
                        libc::_exit(126);
                    }
                }
                StartMode::Gated => {
                    let mut byte = 0u8;
                    // Close our copy of the write end so that a parent that dies gives EOF.
                    libc::close(gate_write_fd);
                    if libc::read(gate_read_fd, (&raw mut byte).cast(), 1) != 1 {
                        libc::_exit(126);
                    }
                }
            }
            libc::execv(ptrs[0], ptrs.as_ptr());
            libc::_exit(127);
        }
    }
    drop(gate_read);
    Ok(Child { pid, gate: gate_write.map(File::from) })
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// waitpid(pid, __WALL), retried on EINTR.
pub fn wait(pid: Pid) -> io::Result<Status> {
    loop {
        return Ok(match waitpid(NixPid::from_raw(pid), Some(WaitPidFlag::__WALL)) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(WaitStatus::Exited(_, code)) => Status::Exited(code),
            Ok(WaitStatus::Signaled(_, signal, _)) => Status::Signaled(signal as i32),
            Ok(WaitStatus::Stopped(_, signal)) | Ok(WaitStatus::PtraceEvent(_, signal, _)) => {
                Status::Stopped(signal as i32)
            }
            Ok(WaitStatus::PtraceSyscall(_)) => Status::Stopped(libc::SIGTRAP | 0x80),
            Ok(other) => return Err(io::Error::other(format!("unexpected wait status {other:?}"))),
        });
    }
}

pub fn ptrace_set_options(pid: Pid, options: libc::c_int) -> io::Result<()> {
    let options = ptrace::Options::from_bits(options).ok_or_else(|| io::Error::other("unknown ptrace options"))?;
    ptrace::setoptions(NixPid::from_raw(pid), options).map_err(io::Error::from)
}

pub fn ptrace_cont(pid: Pid, signal: i32) -> io::Result<()> {
    ptrace::cont(NixPid::from_raw(pid), nix_signal(signal)?).map_err(io::Error::from)
}

pub fn ptrace_single_step(pid: Pid) -> io::Result<()> {
    ptrace::step(NixPid::from_raw(pid), None).map_err(io::Error::from)
}

pub fn ptrace_get_regs(pid: Pid) -> io::Result<Regs> {
    ptrace::getregs(NixPid::from_raw(pid)).map_err(io::Error::from)
}

pub fn ptrace_set_regs(pid: Pid, regs: &Regs) -> io::Result<()> {
    ptrace::setregs(NixPid::from_raw(pid), *regs).map_err(io::Error::from)
}

/// A set of CPUs, as sched_setaffinity takes it.
#[derive(Clone, Copy)]
pub struct CpuSet(nix::sched::CpuSet);

impl CpuSet {
    /// The set holding only `cpu` (a cpu beyond the set's size is an error, refused).
    pub fn single(cpu: usize) -> CpuSet {
        let mut set = nix::sched::CpuSet::new();
        set.set(cpu).expect("a CPU within CPU_SETSIZE");
        CpuSet(set)
    }

    /// The CPUs in the set, ascending.
    pub fn cpus(&self) -> Vec<usize> {
        (0..nix::sched::CpuSet::count()).filter(|&i| self.0.is_set(i).unwrap_or(false)).collect()
    }
}

/// The CPUs the calling thread may run on.
pub fn affinity() -> io::Result<CpuSet> {
    nix::sched::sched_getaffinity(NixPid::from_raw(0)).map(CpuSet).map_err(io::Error::from)
}

/// Restricts the calling thread (and children it forks afterwards) to `set`.
pub fn set_affinity(set: &CpuSet) -> io::Result<()> {
    nix::sched::sched_setaffinity(NixPid::from_raw(0), &set.0).map_err(io::Error::from)
}

/// `struct perf_event_attr` up to `config3` (PERF_ATTR_SIZE_VER8, 136 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PerfEventAttr {
    pub type_: u32,
    pub size: u32,
    pub config: u64,
    pub sample_period: u64,
    pub sample_type: u64,
    pub read_format: u64,
    pub flags: u64,
    pub wakeup_events: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub config2: u64,
    pub branch_sample_type: u64,
    pub sample_regs_user: u64,
    pub sample_stack_user: u32,
    pub clockid: i32,
    pub sample_regs_intr: u64,
    pub aux_watermark: u32,
    pub sample_max_stack: u16,
    pub reserved_2: u16,
    pub aux_sample_size: u32,
    pub reserved_3: u32,
    pub sig_data: u64,
    pub config3: u64,
}

/// perf_event_open flag: the descriptor is close-on-exec.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

pub const PERF_ATTR_DISABLED: u64 = 1 << 0;
pub const PERF_ATTR_INHERIT: u64 = 1 << 1;
pub const PERF_ATTR_ENABLE_ON_EXEC: u64 = 1 << 12;

/// perf_event_open(attr, pid, cpu = -1, group = -1, PERF_FLAG_FD_CLOEXEC).
///
/// `attr.config1` may hold the address of a NUL-terminated path (uprobe PMU): the caller
/// keeps it alive across this call; the kernel copies it.
pub fn perf_event_open(attr: &PerfEventAttr, pid: Pid) -> io::Result<File> {
    let mut attr = *attr;
    attr.size = std::mem::size_of::<PerfEventAttr>() as u32;
    // SAFETY: attr points to a fully initialised perf_event_attr of the size it declares;
    // any pointer it carries (config1) is kept alive by the caller for this call.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const attr,
            pid,
            -1 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    })?;
    // SAFETY: the kernel just returned this descriptor to us; nobody else owns it.
    Ok(unsafe { File::from_raw_fd(fd as libc::c_int) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_event_attr_has_the_ver8_size() {
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 136);
    }

    #[test]
    fn spawn_plain_captures_stdout_and_status() {
        let out = tempfile_in_target("sys-spawn");
        let file = File::create(&out).unwrap();
        let argv =
            [CString::new("/bin/sh").unwrap(), CString::new("-c").unwrap(), CString::new("echo hi; exit 3").unwrap()];
        let child = spawn(&argv, &file, StartMode::Plain).unwrap();
        assert_eq!(wait(child.pid).unwrap(), Status::Exited(3));
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "hi\n");
        let _ = std::fs::remove_file(out);
    }

    #[test]
    fn a_traced_child_stops_at_its_exec_and_runs_on_when_continued() {
        let file = File::create("/dev/null").unwrap();
        let argv = [CString::new("/bin/sh").unwrap(), CString::new("-c").unwrap(), CString::new("exit 5").unwrap()];
        let child = spawn(&argv, &file, StartMode::Traced).unwrap();
        assert_eq!(wait(child.pid).unwrap(), Status::Stopped(libc::SIGTRAP));
        ptrace_set_options(child.pid, libc::PTRACE_O_EXITKILL).unwrap();
        let regs = ptrace_get_regs(child.pid).unwrap();
        assert!(regs.rip != 0 && regs.rsp != 0);
        ptrace_set_regs(child.pid, &regs).unwrap();
        ptrace_single_step(child.pid).unwrap();
        assert_eq!(wait(child.pid).unwrap(), Status::Stopped(libc::SIGTRAP));
        assert_ne!(ptrace_get_regs(child.pid).unwrap().rip, regs.rip, "one instruction on");
        ptrace_cont(child.pid, 0).unwrap();
        assert_eq!(wait(child.pid).unwrap(), Status::Exited(5));
    }

    #[test]
    fn signals_and_affinity_go_through() {
        let file = File::create("/dev/null").unwrap();
        let argv = [CString::new("/bin/sleep").unwrap(), CString::new("10").unwrap()];
        let child = spawn(&argv, &file, StartMode::Plain).unwrap();
        signal(child.pid, libc::SIGTERM).unwrap();
        assert_eq!(wait(child.pid).unwrap(), Status::Signaled(libc::SIGTERM));
        let saved = affinity().unwrap();
        let first = saved.cpus()[0];
        set_affinity(&CpuSet::single(first)).unwrap();
        assert_eq!(affinity().unwrap().cpus(), [first]);
        set_affinity(&saved).unwrap();
        assert_eq!(affinity().unwrap().cpus(), saved.cpus());
    }

    fn tempfile_in_target(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("{name}-{}", std::process::id()))
    }
}
