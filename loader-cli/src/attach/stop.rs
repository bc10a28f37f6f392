//! Stopping every thread of the target (but one, the agent) with ptrace and letting them go:
//! the pause the target sees while probes are placed or removed. Threads are seized, not
//! attached, so they stop only when asked (PTRACE_INTERRUPT) and a blocking system call they
//! were in restarts when they go on, as after SIGSTOP/SIGCONT; threads created meanwhile are
//! found by scanning /proc/PID/task again until it holds no new thread; a signal that arrived
//! while a thread was held is delivered when it is let go.

use std::time::{Duration, Instant};

use crate::attach::error::AttachError;
use crate::attach::ptrace::{self, Event, Regs};
use crate::attach::target::Target;

/// How long one thread may take to stop.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// The restart codes a blocking system call interrupted by a stop returns with (the kernel
/// restarts it when the thread goes on without a signal).
pub const RESTART_CODES: [i64; 4] = [-512, -513, -514, -516];

/// One stopped thread.
pub struct Held {
    pub tid: i32,
    pub regs: Regs,
    /// A signal it stopped for, delivered when it is let go.
    pub signal: i32,
}

impl Held {
    /// Whether it stopped inside a blocking system call that will restart.
    pub fn in_syscall(&self) -> bool {
        (self.regs.orig_rax as i64) >= 0 && RESTART_CODES.contains(&(self.regs.rax as i64))
    }

    /// Where it resumes: its instruction pointer, and the `syscall` instruction before it when
    /// that call restarts.
    pub fn resume_addresses(&self) -> Vec<usize> {
        let rip = self.regs.rip as usize;
        if self.in_syscall() {
            vec![rip, rip - 2]
        } else {
            vec![rip]
        }
    }
}

/// The threads of a process, held stopped.
pub struct Stopped {
    pub threads: Vec<Held>,
    since: Instant,
}

/// How a stop went wrong.
pub enum StopError {
    /// The process exited (every thread went away), or exec'd.
    Gone(AttachError),
    /// A thread could not be seized or stopped; everything was let go again.
    Failed(AttachError),
}

fn ptrace_error(pid: i32, tid: i32, request: &'static str, source: std::io::Error) -> AttachError {
    AttachError::Ptrace { pid, tid, request, source }
}

/// Stops every thread of `target` except `except`, and (with `unblock_trap`) takes SIGTRAP out
/// of the blocked signals of each that blocks it: a probe's `int3` meeting a blocked SIGTRAP
/// would kill the process.
pub fn stop_all(target: &Target, except: Option<i32>, unblock_trap: bool) -> Result<Stopped, StopError> {
    let pid = target.pid;
    let since = Instant::now();
    let mut held: Vec<Held> = Vec::new();
    let mut gone: Vec<i32> = Vec::new();
    let fail = |held: Vec<Held>, e: AttachError| {
        Stopped { threads: held, since }.resume();
        e
    };
    loop {
        let new: Vec<i32> = target
            .threads()
            .into_iter()
            .filter(|&t| Some(t) != except && !gone.contains(&t) && !held.iter().any(|h| h.tid == t))
            .collect();
        if new.is_empty() {
            break;
        }
        let mut pending = Vec::new();
        for tid in new {
            if let Err(e) = ptrace::seize(tid) {
                match e.raw_os_error() {
                    // Exited meanwhile, or a leader that ended before its threads: nothing
                    // left to stop.
                    Some(libc::ESRCH) => gone.push(tid),
                    Some(libc::EPERM) if matches!(target.thread_state(tid), 'Z' | 'X' | '?') => gone.push(tid),
                    Some(libc::EPERM) => {
                        let e = target.changed().unwrap_or_else(|| match Target::open(pid) {
                            Err(refusal) => refusal,
                            Ok(_) => ptrace_error(pid, tid, "PTRACE_SEIZE", e),
                        });
                        return Err(StopError::Failed(fail(held, e)));
                    }
                    _ => return Err(StopError::Failed(fail(held, ptrace_error(pid, tid, "PTRACE_SEIZE", e)))),
                }
                continue;
            }
            match ptrace::interrupt(tid) {
                Ok(()) => pending.push(tid),
                Err(_) => {
                    let _ = ptrace::detach(tid, 0);
                    gone.push(tid);
                }
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while !pending.is_empty() {
            let mut still = Vec::new();
            for tid in pending {
                match ptrace::poll_event(tid) {
                    Ok(None) => still.push(tid),
                    Ok(Some(Event::Stopped | Event::Syscall)) => {
                        held.push(Held { tid, regs: ptrace::zeroed_regs(), signal: 0 })
                    }
                    Ok(Some(Event::Signal(signal))) => held.push(Held { tid, regs: ptrace::zeroed_regs(), signal }),
                    Ok(Some(Event::Exec)) => {
                        let _ = ptrace::detach(tid, 0);
                        let now = target.exe.display().to_string();
                        let e = target.changed().unwrap_or(AttachError::ExecdDuringAttach { pid, now });
                        return Err(StopError::Gone(fail(held, e)));
                    }
                    Ok(Some(Event::Exited(_) | Event::Killed(_))) | Err(_) => gone.push(tid),
                }
            }
            pending = still;
            if !pending.is_empty() {
                if Instant::now() > deadline {
                    let tid = pending[0];
                    let state = target.thread_state(tid).to_string();
                    for tid in &pending {
                        let _ = ptrace::detach(*tid, 0);
                    }
                    let e = AttachError::WouldNotStop { pid, tid, secs: STOP_TIMEOUT.as_secs(), state };
                    return Err(StopError::Failed(fail(held, e)));
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
    if held.is_empty() && except.is_none() {
        return Err(StopError::Gone(target.changed().unwrap_or(AttachError::ExitedDuringAttach { pid })));
    }
    for i in 0..held.len() {
        let h = &mut held[i];
        match ptrace::get_regs(h.tid) {
            Ok(regs) => h.regs = regs,
            Err(e) => {
                let tid = h.tid;
                return Err(StopError::Failed(fail(held, ptrace_error(pid, tid, "PTRACE_GETREGS", e))));
            }
        }
        if unblock_trap {
            let trap = 1u64 << (libc::SIGTRAP - 1);
            if let Some(mask) = ptrace::get_sigmask(h.tid).ok().filter(|m| m & trap != 0) {
                let _ = ptrace::set_sigmask(h.tid, mask & !trap);
            }
        }
    }
    Ok(Stopped { threads: held, since })
}

impl Stopped {
    /// Where the held threads resume (see [`Held::resume_addresses`]).
    pub fn resume_addresses(&self) -> Vec<usize> {
        self.threads.iter().flat_map(Held::resume_addresses).collect()
    }

    /// Lets every held thread go (with the signal it stopped for); returns how long they were
    /// held.
    pub fn resume(self) -> Duration {
        for h in &self.threads {
            let _ = ptrace::detach(h.tid, h.signal);
        }
        self.since.elapsed()
    }

    /// Lets every held thread go but `tid`, which stays held (and is returned).
    pub fn keep_only(self, tid: i32) -> (Option<Held>, Duration) {
        let mut kept = None;
        for h in self.threads {
            if h.tid == tid {
                kept = Some(h);
            } else {
                let _ = ptrace::detach(h.tid, h.signal);
            }
        }
        (kept, self.since.elapsed())
    }
}
