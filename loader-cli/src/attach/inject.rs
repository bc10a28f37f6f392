//! Calling functions in the target on one of its threads, held stopped, so that the thread
//! gets its state back by itself whatever becomes of uprobe-run.
//!
//! Below the thread's stack pointer (past the red zone) goes what the kernel would write to
//! deliver a signal: an `rt_sigframe` whose context holds the thread's registers (adjusted as
//! signal delivery adjusts them for a system call it interrupted, so the call is made again),
//! its blocked-signal mask and its whole FPU and vector state. A called function returns into
//! the C library's `__restore_rt` (`mov $15,%rax; syscall`), the signal return: the kernel
//! restores the thread from the frame and it goes on as if it had never been touched. So if
//! uprobe-run dies at any instant (killed, out of memory), the thread finishes the call it is
//! in and resumes: no return to a bad address, no thread left stopped.
//!
//! While uprobe-run lives it follows the thread from system call to system call and sees
//! that signal return's entry at the frame: the call is done (its result in %rax is gone by
//! then; results come back through memory in the frame, [`Arg::Buf`]). The next call starts
//! from that very stop (the `rt_sigreturn` skipped); the last one is let go into it.
//!
//! Nothing is written into the target's code, and nothing stays in its memory.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::attach::error::AttachError;
use crate::attach::net;
use crate::attach::ptrace::{self, Event, Regs};
use crate::attach::stop::RESTART_CODES;

/// How long a call may take before uprobe-run gives up waiting for it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// After this long in a call, Ctrl-C lets the thread finish it alone.
const INTERRUPT_AFTER: Duration = Duration::from_secs(1);
/// After this long, say what we are waiting for.
const CALL_NOTICE: Duration = Duration::from_secs(3);
/// Stack below the thread's stack pointer left alone: the red zone and some margin.
const STACK_GAP: u64 = 512;
/// Room for the calls' arguments (strings, buffers), between the frame and the FPU state.
const ARGS_ROOM: u64 = 4096;
/// `struct rt_sigframe` on x86-64: the return address, `struct ucontext` (304 bytes), and
/// `struct siginfo` (128).
const FRAME_LEN: usize = 8 + 304 + 128;
/// `rt_sigreturn`.
const SYS_RT_SIGRETURN: u64 = 15;
/// `__restore_rt` as glibc writes it: `mov $15,%rax; syscall`.
pub const RESTORER_BYTES: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

const UC_FP_XSTATE: u64 = 1;
const UC_SIGCONTEXT_SS: u64 = 2;
const UC_STRICT_RESTORE_SS: u64 = 4;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;

/// An argument of a remote call.
pub enum Arg<'a> {
    Int(u64),
    /// A string, copied into the call's frame (NUL added); the function gets its address.
    Str(&'a [u8]),
    /// Bytes copied into the frame; the function gets their address, and the call returns
    /// them as the function left them.
    Buf(&'a [u8]),
}

/// A thread held for calls.
pub struct Hijacked {
    pub pid: i32,
    pub tid: i32,
    /// The registers it stopped with.
    saved: Regs,
    /// The signal frame (the called functions' stack pointer on entry).
    frame: Vec<u8>,
    frame_at: u64,
    /// The arguments' room, above the frame.
    args_at: u64,
    /// `__restore_rt` in the process.
    restorer: u64,
    /// Ctrl-C, SIGTERM, SIGHUP: readable when one came (it is left there to read).
    signals: i32,
    /// SIGCHLD: readable when the thread changed state (its stops wake uprobe-run at once).
    child: OwnedFd,
    /// Let go already.
    released: bool,
}

/// The `_fpx_sw_bytes` of this machine's signal frames (see `ptrace::signal_frame_fp_sw_bytes`).
fn fp_sw_bytes() -> Option<[u8; 48]> {
    static BYTES: OnceLock<Option<[u8; 48]>> = OnceLock::new();
    *BYTES.get_or_init(ptrace::signal_frame_fp_sw_bytes)
}

/// The registers the thread resumes with: those it stopped with, and, stopped in a system
/// call that restarts, back at its `syscall` instruction with the call's number, as signal
/// delivery does (a wait with a timeout starts again with its whole timeout).
pub fn resumed_regs(saved: &Regs) -> Regs {
    let mut regs = *saved;
    if (saved.orig_rax as i64) >= 0 && RESTART_CODES.contains(&(saved.rax as i64)) {
        regs.rip -= 2;
        regs.rax = saved.orig_rax;
    }
    regs
}

/// The bytes of an `rt_sigframe` at `at` that restores `regs` with blocked signals `mask`
/// and the FPU state at `fpstate` (an XSAVE area when `xstate`, else FXSAVE); its return
/// address `restorer`.
pub fn signal_frame(regs: &Regs, mask: u64, fpstate: u64, xstate: bool, restorer: u64) -> Vec<u8> {
    let mut frame = vec![0u8; FRAME_LEN];
    let mut put = |at: usize, bytes: &[u8]| frame[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, &restorer.to_ne_bytes());
    let flags = UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS | if xstate { UC_FP_XSTATE } else { 0 };
    put(8, &flags.to_ne_bytes());
    // uc_link (16) and uc_stack (24..48) stay zero: a stack of size 0 leaves the thread's
    // alternate signal stack as it is.
    let gprs = [
        regs.r8,
        regs.r9,
        regs.r10,
        regs.r11,
        regs.r12,
        regs.r13,
        regs.r14,
        regs.r15,
        regs.rdi,
        regs.rsi,
        regs.rbp,
        regs.rbx,
        regs.rdx,
        regs.rax,
        regs.rcx,
        regs.rsp,
        regs.rip,
        regs.eflags,
    ];
    let mcontext = 48;
    for (i, value) in gprs.iter().enumerate() {
        put(mcontext + 8 * i, &value.to_ne_bytes());
    }
    let segments = [regs.cs as u16, regs.gs as u16, regs.fs as u16, regs.ss as u16];
    for (i, value) in segments.iter().enumerate() {
        put(mcontext + 144 + 2 * i, &value.to_ne_bytes());
    }
    // err, trapno, oldmask, cr2 (152..184) stay zero.
    put(mcontext + 184, &fpstate.to_ne_bytes());
    put(mcontext + 256, &mask.to_ne_bytes());
    frame
}

/// The FPU state area for the frame: the thread's XSAVE area with the signal frame's
/// software bytes and the closing magic, or its FXSAVE area where there is no XSAVE.
fn fp_area(tid: i32) -> std::io::Result<(Vec<u8>, bool)> {
    match fp_sw_bytes() {
        Some(sw) => {
            let xstate_size = u32::from_ne_bytes(sw[16..20].try_into().unwrap()) as usize;
            let extended = u32::from_ne_bytes(sw[4..8].try_into().unwrap()) as usize;
            let mut area = ptrace::get_xstate(tid)?;
            area.resize(xstate_size, 0);
            area[464..512].copy_from_slice(&sw);
            // The header names only components the frame holds (a component the process
            // enabled beyond those, AMX tiles, is then reset, not read past the area).
            let features = u64::from_ne_bytes(sw[8..16].try_into().unwrap());
            let present = u64::from_ne_bytes(area[512..520].try_into().unwrap()) & features;
            area[512..520].copy_from_slice(&present.to_ne_bytes());
            area.extend_from_slice(&FP_XSTATE_MAGIC2.to_ne_bytes());
            area.resize(extended.max(area.len()), 0);
            Ok((area, true))
        }
        None => Ok((ptrace::get_fxsave(tid)?, false)),
    }
}

impl Hijacked {
    /// Prepares thread `tid` of `pid`, held stopped with registers `saved` (and no signal
    /// pending delivery), for calls: writes its signal frame below its stack. `restorer`:
    /// `__restore_rt` of its C library; `signals`: interrupts the calls when readable.
    pub fn new(pid: i32, tid: i32, saved: Regs, restorer: u64, signals: &OwnedFd) -> Result<Hijacked, AttachError> {
        let ptrace_error = |request, source| AttachError::Ptrace { pid, tid, request, source };
        let child = net::signalfd(&[libc::SIGCHLD]).map_err(|e| ptrace_error("signalfd(SIGCHLD)", e))?;
        let mut thread = Hijacked {
            pid,
            tid,
            child,
            saved,
            frame: Vec::new(),
            frame_at: 0,
            args_at: 0,
            restorer,
            signals: signals.as_raw_fd(),
            released: false,
        };
        let (area, xsave) = fp_area(tid).map_err(|e| ptrace_error("PTRACE_GETREGSET (FPU state)", e))?;
        let mask = ptrace::get_sigmask(tid).map_err(|e| ptrace_error("PTRACE_GETSIGMASK", e))?;
        let top = saved.rsp - 128 - STACK_GAP;
        let fp_at = (top - area.len() as u64) & !63;
        thread.args_at = (fp_at - ARGS_ROOM) & !15;
        thread.frame_at = ((thread.args_at - FRAME_LEN as u64) & !15) - 8;
        thread.frame = signal_frame(&resumed_regs(&saved), mask, fp_at, xsave, restorer);
        ptrace::write_memory(pid, fp_at, &area).map_err(|e| ptrace_error("writing the FPU state", e))?;
        ptrace::report_syscalls(tid).map_err(|e| ptrace_error("PTRACE_SETOPTIONS", e))?;
        Ok(thread)
    }

    fn ptrace_error(&self, request: &'static str, source: std::io::Error) -> AttachError {
        AttachError::Ptrace { pid: self.pid, tid: self.tid, request, source }
    }

    /// Lets the thread go on its own: it finishes what it runs and restores itself.
    fn let_go(&mut self) {
        if !self.released {
            self.released = true;
            let _ = ptrace::detach(self.tid, 0);
        }
    }

    /// Whether Ctrl-C (SIGTERM, SIGHUP) came; the caller stops at the next step where
    /// stopping leaves nothing behind.
    pub fn interrupted(&self) -> bool {
        net::ready(self.signals)
    }

    /// Calls `function(args...)` (at most 6 arguments) in the thread and waits until it
    /// returned; the [`Arg::Buf`] arguments as it left them. `name` names the function in
    /// messages. On an error the thread is let go (it restores itself when the call returns).
    pub fn call(&mut self, name: &'static str, function: u64, args: &[Arg]) -> Result<Vec<Vec<u8>>, AttachError> {
        let mut room = Vec::new();
        let mut values = Vec::new();
        let mut bufs = Vec::new();
        for arg in args {
            let at = self.args_at + room.len() as u64;
            match arg {
                Arg::Int(v) => values.push(*v),
                Arg::Str(s) | Arg::Buf(s) => {
                    room.extend_from_slice(s);
                    room.resize((room.len() + 16) & !15, 0);
                    values.push(at);
                    if let Arg::Buf(s) = arg {
                        bufs.push((at, s.len()));
                    }
                }
            }
        }
        assert!(room.len() as u64 <= ARGS_ROOM, "remote call arguments too long");
        let written = ptrace::write_memory(self.pid, self.args_at, &room)
            .and_then(|()| ptrace::write_memory(self.pid, self.frame_at, &self.frame));
        if let Err(e) = written {
            self.let_go();
            return Err(self.ptrace_error("writing the call frame", e));
        }
        let mut regs = self.saved;
        regs.rip = function;
        let registers = [&mut regs.rdi, &mut regs.rsi, &mut regs.rdx, &mut regs.rcx, &mut regs.r8, &mut regs.r9];
        for (reg, value) in registers.into_iter().zip(values) {
            *reg = value;
        }
        regs.rax = 0;
        regs.rsp = self.frame_at;
        // No system call to restart (where it was stopped) or to make (the signal return a
        // previous call ended with).
        regs.orig_rax = u64::MAX;
        let started = ptrace::set_regs(self.tid, &regs).and_then(|()| ptrace::syscall(self.tid, 0));
        if let Err(e) = started {
            self.let_go();
            return Err(self.ptrace_error("PTRACE_SETREGS", e));
        }
        match self.wait_return(name) {
            Ok(()) => Ok(bufs
                .into_iter()
                .map(|(at, len)| ptrace::read_memory(self.pid, at, len).unwrap_or_default())
                .collect()),
            Err(e) => {
                self.let_go();
                Err(e)
            }
        }
    }

    /// Follows the thread until the call returned (the signal return's entry at the frame).
    fn wait_return(&mut self, name: &'static str) -> Result<(), AttachError> {
        let (pid, tid) = (self.pid, self.tid);
        let start = Instant::now();
        let mut noticed = false;
        loop {
            let event = ptrace::poll_event(tid).map_err(|e| self.ptrace_error("waitpid", e))?;
            let resumed = match event {
                None => {
                    if start.elapsed() > CALL_TIMEOUT {
                        return Err(AttachError::CallTimeout { pid, tid, call: name, secs: CALL_TIMEOUT.as_secs() });
                    }
                    // A call is short: a Ctrl-C waits for it, unless it hangs.
                    if start.elapsed() > INTERRUPT_AFTER && self.interrupted() {
                        return Err(AttachError::Interrupted { pid });
                    }
                    if !noticed && start.elapsed() > CALL_NOTICE {
                        eprintln!("uprobe-run: waiting for {name} in thread {tid} of process {pid} to return");
                        noticed = true;
                    }
                    let woken = net::poll(&[self.child.as_raw_fd(), self.signals], Some(Duration::from_millis(50)));
                    if woken.is_ok_and(|w| w[0]) {
                        let _ = net::read_signal(&self.child);
                    }
                    continue;
                }
                Some(Event::Syscall) => {
                    let now = ptrace::get_regs(tid).map_err(|e| self.ptrace_error("PTRACE_GETREGS", e))?;
                    let ours = now.orig_rax == SYS_RT_SIGRETURN
                        && now.rsp == self.frame_at + 8
                        && now.rip == self.restorer + RESTORER_BYTES.len() as u64;
                    if ours {
                        return Ok(());
                    }
                    ptrace::syscall(tid, 0)
                }
                // A fault in the function: the process meets it as it would.
                Some(Event::Signal(signal @ (libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE))) => {
                    self.released = true;
                    let _ = ptrace::detach(tid, signal);
                    let signal = format!("signal {signal}");
                    return Err(AttachError::CallKilled { pid, tid, call: name, signal });
                }
                Some(Event::Signal(signal)) => ptrace::syscall(tid, signal),
                Some(Event::Stopped) => ptrace::syscall(tid, 0),
                Some(Event::Exec) => {
                    return Err(AttachError::ExecdDuringAttach { pid, now: "another program".into() });
                }
                Some(Event::Exited(_) | Event::Killed(_)) => {
                    self.released = true;
                    return Err(AttachError::ExitedDuringAttach { pid });
                }
            };
            resumed.map_err(|e| self.ptrace_error("PTRACE_SYSCALL", e))?;
        }
    }

    /// Lets the thread go: after a call it makes the signal return, which gives it back its
    /// registers, signal mask and FPU state; a system call it was stopped in is made again.
    pub fn release(mut self) {
        self.let_go();
    }
}

impl Drop for Hijacked {
    fn drop(&mut self) {
        self.let_go();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_stopped_in_a_restartable_call_resumes_at_the_syscall_instruction() {
        let mut regs = ptrace::zeroed_regs();
        regs.rip = 0x1002;
        regs.orig_rax = libc::SYS_read as u64;
        regs.rax = (-512i64) as u64;
        let resumed = resumed_regs(&regs);
        assert_eq!((resumed.rip, resumed.rax), (0x1000, libc::SYS_read as u64));
        regs.rax = (-516i64) as u64;
        assert_eq!(resumed_regs(&regs).rax, libc::SYS_read as u64, "the call itself, not restart_syscall");
        // A call that returned (a result in rax) and code outside any call are left alone.
        regs.rax = 5;
        assert_eq!((resumed_regs(&regs).rip, resumed_regs(&regs).rax), (0x1002, 5));
        regs.orig_rax = u64::MAX;
        regs.rax = (-512i64) as u64;
        assert_eq!(resumed_regs(&regs).rip, 0x1002);
    }

    #[test]
    fn the_frame_is_laid_out_as_the_kernel_reads_it() {
        let mut regs = ptrace::zeroed_regs();
        regs.r8 = 8;
        regs.rax = 0xaa;
        regs.rsp = 0x7ff0;
        regs.rip = 0x401000;
        regs.eflags = 0x246;
        regs.cs = 0x33;
        regs.ss = 0x2b;
        let frame = signal_frame(&regs, 1 << 4, 0x9000, true, 0x7f00_0000_0050);
        let word = |at: usize| u64::from_ne_bytes(frame[at..at + 8].try_into().unwrap());
        let half = |at: usize| u16::from_ne_bytes(frame[at..at + 2].try_into().unwrap());
        assert_eq!(frame.len(), 440);
        assert_eq!(word(0), 0x7f00_0000_0050, "return address: the restorer");
        assert_eq!(word(8), UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS);
        assert_eq!(word(48), 8, "r8 first");
        assert_eq!(word(48 + 13 * 8), 0xaa, "rax");
        assert_eq!(word(48 + 15 * 8), 0x7ff0, "rsp");
        assert_eq!(word(48 + 16 * 8), 0x401000, "rip");
        assert_eq!(word(48 + 17 * 8), 0x246, "eflags");
        assert_eq!((half(48 + 144), half(48 + 150)), (0x33, 0x2b), "cs, ss");
        assert_eq!(word(48 + 184), 0x9000, "fpstate");
        assert_eq!(word(48 + 256), 1 << 4, "the signal mask");
    }
}
