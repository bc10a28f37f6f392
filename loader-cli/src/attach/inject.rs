//! Calling a function in the target on one of its threads, held stopped: its registers are
//! saved, a call frame is built below its stack pointer (past the red zone) with the string
//! argument and a return address of 0, the thread runs the function while the others run
//! freely, and the fault at address 0 when it returns hands it back with the result in %rax.
//! Signals that arrive meanwhile are passed on. Afterwards the thread gets its registers back
//! exactly, `orig_rax` included, so a blocking system call it was stopped in restarts as it
//! would after SIGSTOP/SIGCONT.
//!
//! Nothing is written into the target's code, and nothing stays in its memory.

use std::time::{Duration, Instant};

use crate::attach::error::AttachError;
use crate::attach::ptrace::{self, Event, Regs};

/// How long a call may take before uprobe-run gives up waiting for it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// After this long, say what we are waiting for.
const CALL_NOTICE: Duration = Duration::from_secs(3);
/// Stack below the thread's stack pointer left alone: the red zone and some margin.
const STACK_GAP: u64 = 512;

/// A thread held for calls, with the registers it stopped with.
pub struct Hijacked {
    pub pid: i32,
    pub tid: i32,
    pub saved: Regs,
    /// A signal the thread stopped for, delivered when it is let go.
    pub signal: i32,
}

/// An argument of a remote call.
pub enum Arg<'a> {
    Int(u64),
    /// A string, copied into the call's frame (NUL added); the function gets its address.
    Str(&'a [u8]),
}

impl Hijacked {
    /// Calls `function(args...)` (at most 6 arguments) in the thread; returns its result
    /// (%rax). `name` names the function in messages.
    pub fn call(&self, name: &'static str, function: u64, args: &[Arg]) -> Result<u64, AttachError> {
        let (pid, tid) = (self.pid, self.tid);
        let ptrace_error = |request, source| AttachError::Ptrace { pid, tid, request, source };
        // The strings, then the return address below them at a stack pointer the ABI expects
        // on entry (16n + 8).
        let strings: usize = args.iter().map(|a| if let Arg::Str(s) = a { (s.len() + 16) & !15 } else { 0 }).sum();
        let top = (self.saved.rsp - STACK_GAP) & !15;
        let strings_at = top - strings as u64;
        let sp = strings_at - 16 - 8;
        let mut frame = vec![0u8; (top - sp) as usize];
        let mut values = Vec::new();
        let mut at = (strings_at - sp) as usize;
        for arg in args {
            match arg {
                Arg::Int(v) => values.push(*v),
                Arg::Str(s) => {
                    frame[at..at + s.len()].copy_from_slice(s);
                    values.push(sp + at as u64);
                    at += (s.len() + 16) & !15;
                }
            }
        }
        ptrace::write_memory(pid, sp, &frame).map_err(|e| ptrace_error("writing the call frame", e))?;
        let mut regs = self.saved;
        regs.rip = function;
        let registers = [&mut regs.rdi, &mut regs.rsi, &mut regs.rdx, &mut regs.rcx, &mut regs.r8, &mut regs.r9];
        for (reg, value) in registers.into_iter().zip(values) {
            *reg = value;
        }
        regs.rax = 0;
        regs.rsp = sp;
        // Not in a system call any more: no restart may redirect the call.
        regs.orig_rax = u64::MAX;
        ptrace::set_regs(tid, &regs).map_err(|e| ptrace_error("PTRACE_SETREGS", e))?;
        ptrace::cont(tid, 0).map_err(|e| ptrace_error("PTRACE_CONT", e))?;
        let start = Instant::now();
        let mut noticed = false;
        loop {
            match ptrace::poll_event(tid).map_err(|e| ptrace_error("waitpid", e))? {
                None => {
                    if start.elapsed() > CALL_TIMEOUT {
                        return Err(AttachError::CallTimeout { pid, tid, call: name, secs: CALL_TIMEOUT.as_secs() });
                    }
                    if !noticed && start.elapsed() > CALL_NOTICE {
                        eprintln!("uprobe-run: waiting for {name} in thread {tid} of process {pid} to return");
                        noticed = true;
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
                Some(Event::Signal(libc::SIGSEGV)) => {
                    let now = ptrace::get_regs(tid).map_err(|e| ptrace_error("PTRACE_GETREGS", e))?;
                    if now.rip == 0 {
                        return Ok(now.rax);
                    }
                    // A real fault in the function: the process meets it as it would.
                    let _ = ptrace::detach(tid, libc::SIGSEGV);
                    return Err(AttachError::CallKilled { pid, tid, call: name, signal: "SIGSEGV".into() });
                }
                Some(Event::Signal(signal)) => {
                    ptrace::cont(tid, signal).map_err(|e| ptrace_error("PTRACE_CONT", e))?;
                }
                Some(Event::Stopped) => ptrace::cont(tid, 0).map_err(|e| ptrace_error("PTRACE_CONT", e))?,
                Some(Event::Exec) => {
                    let _ = ptrace::detach(tid, 0);
                    return Err(AttachError::ExecdDuringAttach { pid, now: "another program".into() });
                }
                Some(Event::Exited(_) | Event::Killed(_)) => return Err(AttachError::ExitedDuringAttach { pid }),
            }
        }
    }

    /// Reads the C string at `addr` in the target (up to 4 KiB).
    pub fn read_string(&self, addr: u64) -> String {
        let bytes = ptrace::read_memory(self.pid, addr, 4096).unwrap_or_default();
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    /// Gives the thread its registers back and lets it go.
    pub fn release(self) -> Result<(), AttachError> {
        let (pid, tid) = (self.pid, self.tid);
        ptrace::set_regs(tid, &self.saved).map_err(|source| AttachError::Ptrace {
            pid,
            tid,
            request: "PTRACE_SETREGS",
            source,
        })?;
        ptrace::detach(tid, self.signal).map_err(|source| AttachError::Ptrace {
            pid,
            tid,
            request: "PTRACE_DETACH",
            source,
        })
    }
}
