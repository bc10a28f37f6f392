//! Every reason an attach is refused or ends early. Display is the one line printed after
//! `uprobe-run: `; each names the process and the cause.

use std::io;
use std::path::PathBuf;
use thiserror::Error;

use crate::base::elf::ElfProblem;
use crate::base::error::describe;

#[derive(Debug, Error)]
pub enum AttachError {
    #[error("{}: cannot copy it to {} for the session (the process has loaded it already): {}", .path.display(), .copy.display(), crate::base::error::describe(.source))]
    Copy { path: std::path::PathBuf, copy: std::path::PathBuf, source: std::io::Error },
    #[error("nothing to do: give a handler library (--handlers LIB.so) to run in process {pid}")]
    NothingToDo { pid: i32 },
    #[error("process {0}: no such process")]
    NoSuchProcess(i32),
    #[error("process {pid} ({name}) is a kernel thread: it runs no user-space code to probe")]
    KernelThread { pid: i32, name: String },
    #[error("process {0} is uprobe-run itself")]
    Itself(i32),
    #[error("process {0} is a zombie (it has exited; its parent has not reaped it)")]
    Zombie(i32),
    #[error("process {0} is stopped (SIGSTOP or Ctrl-Z): continue it first (kill -CONT {0})")]
    Stopped(i32),
    #[error("process {pid}: not permitted to trace it ({why}; {yama})")]
    NotPermitted { pid: i32, why: String, yama: Yama },
    #[error("process {pid} is already traced by {tracer} (pid {tracer_pid}): detach it first")]
    AlreadyTraced { pid: i32, tracer_pid: i32, tracer: String },
    #[error("process {pid} already has an attach session (its agent is thread {agent}): end that one first")]
    AlreadyAttached { pid: i32, agent: String },
    #[error("process {pid} ({}): {problem}", .exe.display())]
    Elf { pid: i32, exe: PathBuf, problem: ElfProblem },
    #[error(
        "process {pid} ({}): static executable: the runtime is loaded with the C library's dlopen, which it lacks",
        .exe.display()
    )]
    Static { pid: i32, exe: PathBuf },
    #[error("process {pid} ({}): {what}: only programs using glibc can be attached to", .exe.display())]
    NotGlibc { pid: i32, exe: PathBuf, what: String },
    #[error("process {pid}: its C library {} has no {symbol} (glibc 2.34 or later is needed)", .libc.display())]
    OldGlibc { pid: i32, libc: PathBuf, symbol: &'static str },
    #[error("{}: cannot read: {}", .path.display(), describe(.source))]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: no symbol {symbol}: not a runtime that can be attached (rebuild it)", .path.display())]
    NoEntry { path: PathBuf, symbol: &'static str },
    #[error("process {pid} exited during the attach")]
    ExitedDuringAttach { pid: i32 },
    #[error("process {pid} exec'd during the attach (now {now})")]
    ExecdDuringAttach { pid: i32, now: String },
    #[error("process {pid}: thread {tid}: {request} failed: {}", describe(.source))]
    Ptrace { pid: i32, tid: i32, request: &'static str, source: io::Error },
    #[error(
        "process {pid}: no thread stopped at a place where the runtime can be loaded (each was \
         inside the C library or the dynamic loader, which may hold their locks); try again"
    )]
    NoSafeThread { pid: i32 },
    #[error("process {pid}: thread {tid} did not stop within {secs} s (state {state})")]
    WouldNotStop { pid: i32, tid: i32, secs: u64, state: String },
    #[error(
        "process {pid}: {call} in thread {tid} has not returned after {secs} s; the thread is left \
         to finish it, and then goes on as before"
    )]
    CallTimeout { pid: i32, tid: i32, call: &'static str, secs: u64 },
    #[error(
        "process {pid}: thread {tid} runs with a shadow stack (x86 CET), which the calls the attach makes \
         in it would break; not attached"
    )]
    ShadowStack { pid: i32, tid: i32 },
    #[error("process {pid}: interrupted during the attach; the process runs on as before")]
    Interrupted { pid: i32 },
    #[error("process {pid}: {call} in thread {tid} was ended by {signal}")]
    CallKilled { pid: i32, tid: i32, call: &'static str, signal: String },
    #[error("process {pid}: cannot load {}: {reason}", .runtime.display())]
    LoadFailed { pid: i32, runtime: PathBuf, reason: String },
    #[error("process {pid}: the runtime could not start its agent: {}", describe(.source))]
    StartFailed { pid: i32, source: io::Error },
    #[error("process {pid}: the runtime refused to start ({reason})")]
    RuntimeOff { pid: i32, reason: String },
    #[error("process {pid}: the runtime's agent did not answer within {secs} s")]
    NoAgent { pid: i32, secs: u64 },
    #[error("the session socket: {}", describe(.0))]
    Socket(io::Error),
    #[error("process {pid}: the runtime's agent broke the session: {what}")]
    Protocol { pid: i32, what: String },
    #[error("{}: cannot create output file: {}", .path.display(), describe(.source))]
    Output { path: PathBuf, source: io::Error },
}

/// `kernel.yama.ptrace_scope`, as the kernel has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Yama(pub Option<u32>);

impl std::fmt::Display for Yama {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self.0 {
            None => write!(f, "kernel.yama.ptrace_scope: not present on this kernel"),
            Some(0) => write!(f, "kernel.yama.ptrace_scope = 0: same-user tracing allowed"),
            Some(1) => {
                write!(f, "kernel.yama.ptrace_scope = 1: only a parent may trace (run as root, or set it to 0)")
            }
            Some(2) => write!(f, "kernel.yama.ptrace_scope = 2: only CAP_SYS_PTRACE may trace (run as root)"),
            Some(n) => write!(f, "kernel.yama.ptrace_scope = {n}: tracing is disabled until reboot"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_one_line_naming_the_cause() {
        let cases = [
            (AttachError::NoSuchProcess(4242), "process 4242: no such process"),
            (
                AttachError::NotPermitted {
                    pid: 1,
                    why: "it runs as uid 0, uprobe-run as uid 65534".into(),
                    yama: Yama(Some(1)),
                },
                "process 1: not permitted to trace it (it runs as uid 0, uprobe-run as uid 65534; \
                 kernel.yama.ptrace_scope = 1: only a parent may trace (run as root, or set it to 0))",
            ),
            (
                AttachError::AlreadyTraced { pid: 7, tracer_pid: 8, tracer: "strace".into() },
                "process 7 is already traced by strace (pid 8): detach it first",
            ),
            (AttachError::ExitedDuringAttach { pid: 9 }, "process 9 exited during the attach"),
        ];
        for (error, line) in cases {
            assert_eq!(error.to_string(), line);
        }
        assert_eq!(Yama(None).to_string(), "kernel.yama.ptrace_scope: not present on this kernel");
    }
}
