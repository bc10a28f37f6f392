//! `ptrace` and `ptrace-ool`: breakpoint engines in a tracer process, built the way debuggers
//! and ptrace-based tracers build them.
//!
//! Both start the fixture with PTRACE_TRACEME, take its exec stop, find the function from its
//! symbol and the load base in /proc/PID/maps, and write an int3 over its first byte through
//! /proc/PID/mem. On every stop the tracer reads the registers (PTRACE_GETREGS) and runs the
//! counting handler, then gets the tracee past the displaced instruction:
//!
//! - `ptrace`: restore the original byte, set rip back to the function, PTRACE_SINGLESTEP,
//!   wait, re-insert the int3, PTRACE_CONT. Return probes read the return address at `[rsp]` on
//!   entry and plant a temporary int3 there; when it is hit the tracer counts, removes it and
//!   resumes at the return address (as a debugger's `finish`).
//! - `ptrace-ool`: no single-step. At the exec stop the tracer makes the tracee call mmap (an
//!   injected `syscall` instruction) for a page near the program, writes there a copy of the
//!   displaced instruction, relocated if it is RIP-relative, followed by a jump back, and on
//!   each hit just sets rip to that copy and continues: the int3 stays in place. Return probes
//!   replace the return address at `[rsp]` with a trampoline int3 in the same page (as kernel
//!   uretprobes do); its hit counts and resumes at the real return address.
//!
//! Where tracer and tracee run decides much of the cost: every stop wakes the other process.
//! Left to the scheduler, runs alternate between both on one CPU (a plain context switch per
//! stop) and each on its own CPU (a cross-CPU wake-up per stop, several times slower on a
//! VM), and medians jump between the two. So `ptrace` and `ptrace-ool` pin tracer and tracee
//! to one CPU, ptrace's best case, and `ptrace-xcpu` pins them to two different CPUs.

use super::{check_hits, fixture_args, parse_report, Engine, Failure, Job, Measurement};
use crate::decode;
use crate::fixture::Fixture;
use crate::sys::{self, CpuSet, Pid, Regs, StartMode, Status};
use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use uprobe_contracts::maps;

const INT3: u8 = 0xcc;
const SIGTRAP: i32 = libc::SIGTRAP;

/// The counting handler run by the tracer on each hit: the same work as the in-process
/// handler (one increment), with the registers it was given.
#[derive(Debug, Default)]
struct Counter {
    entries: u64,
    returns: u64,
}

impl Counter {
    fn on_entry(&mut self, _regs: &Regs) {
        self.entries += 1;
    }

    fn on_return(&mut self, _regs: &Regs) {
        self.returns += 1;
    }
}

/// A stopped tracee and its memory.
struct Tracee {
    pid: Pid,
    mem: File,
}

fn invalid(e: impl std::fmt::Display) -> Failure {
    Failure::Invalid(e.to_string())
}

impl Tracee {
    fn new(pid: Pid) -> Result<Tracee, Failure> {
        let mem = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|e| Failure::Unavailable(format!("/proc/{pid}/mem: {e}")))?;
        Ok(Tracee { pid, mem })
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Failure> {
        self.mem.read_exact_at(buf, addr).map_err(|e| invalid(format!("reading tracee memory at {addr:#x}: {e}")))
    }

    fn read_u64(&self, addr: u64) -> Result<u64, Failure> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), Failure> {
        self.mem.write_all_at(bytes, addr).map_err(|e| invalid(format!("writing tracee memory at {addr:#x}: {e}")))
    }

    fn regs(&self) -> Result<Regs, Failure> {
        sys::ptrace_get_regs(self.pid).map_err(|e| invalid(format!("PTRACE_GETREGS: {e}")))
    }

    fn set_regs(&self, regs: &Regs) -> Result<(), Failure> {
        sys::ptrace_set_regs(self.pid, regs).map_err(|e| invalid(format!("PTRACE_SETREGS: {e}")))
    }

    fn cont(&self, signal: i32) -> Result<(), Failure> {
        sys::ptrace_cont(self.pid, signal).map_err(|e| invalid(format!("PTRACE_CONT: {e}")))
    }

    /// Single-steps one instruction and waits for the step's SIGTRAP.
    fn step(&self) -> Result<(), Failure> {
        sys::ptrace_single_step(self.pid).map_err(|e| invalid(format!("PTRACE_SINGLESTEP: {e}")))?;
        match self.wait()? {
            Status::Stopped(SIGTRAP) => Ok(()),
            other => Err(invalid(format!("single-step ended with {other:?}"))),
        }
    }

    fn wait(&self) -> Result<Status, Failure> {
        sys::wait(self.pid).map_err(|e| invalid(format!("waitpid: {e}")))
    }

    /// Makes the tracee call mmap(hint, 4096, PROT_READ|PROT_EXEC, private anonymous, fixed
    /// without replacing) by placing a `syscall` instruction at its rip and single-stepping it
    /// (set-up only, not per hit). Registers and bytes are put back afterwards.
    fn inject_mmap(&self, hint: u64) -> Result<u64, Failure> {
        let saved = self.regs()?;
        let mut old = [0u8; 2];
        self.read(saved.rip, &mut old)?;
        self.write(saved.rip, &[0x0f, 0x05])?;
        let mut r = saved;
        r.rax = libc::SYS_mmap as u64;
        r.orig_rax = u64::MAX;
        r.rdi = hint;
        r.rsi = 4096;
        r.rdx = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        r.r10 = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
        r.r8 = u64::MAX;
        r.r9 = 0;
        self.set_regs(&r)?;
        let stepped = self.step();
        let result = self.regs().map(|r| r.rax);
        self.write(saved.rip, &old)?;
        self.set_regs(&saved)?;
        stepped?;
        let result = result?;
        if (result as i64) < 0 {
            return Err(invalid(format!(
                "injected mmap({hint:#x}) failed: {}",
                std::io::Error::from_raw_os_error(-(result as i64) as i32)
            )));
        }
        Ok(result)
    }
}

/// Where the mapping of `program` at file offset 0 starts in /proc/PID/maps text.
pub fn load_base(maps: &str, program: &Path) -> Option<u64> {
    maps::parse(maps).into_iter().find(|m| Path::new(&m.path) == program && m.offset == 0).map(|m| m.start)
}

/// The out-of-line page of `ptrace-ool`.
struct OutOfLine {
    /// The relocated copy of the displaced instruction, ending in a jump back.
    slot: u64,
    /// An int3 that hijacked return addresses point at.
    trampoline: u64,
}

impl OutOfLine {
    fn prepare(t: &Tracee, addr: u64, load_base: u64) -> Result<OutOfLine, Failure> {
        let mut code = [0u8; 16];
        t.read(addr, &mut code)?;
        // Below the program, so that RIP-relative operands stay within reach.
        let mut last_err = None;
        for step in 1..=16u64 {
            let hint = load_base.saturating_sub(step * 0x10_0000);
            match t.inject_mmap(hint) {
                Ok(page) => {
                    let (bytes, _) = decode::relocate(&code, addr, page)
                        .map_err(|e| Failure::Unavailable(format!("ptrace-ool cannot relocate: {e}")))?;
                    let trampoline = page + 64;
                    t.write(page, &bytes)?;
                    t.write(trampoline, &[INT3])?;
                    return Ok(OutOfLine { slot: page, trampoline });
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| invalid("no page for the out-of-line copy")))
    }
}

/// A return still to come: where it returns to and the stack pointer it will have there.
#[derive(Clone, Copy, Debug)]
struct PendingReturn {
    ret_addr: u64,
    rsp: u64,
}

/// Restores the tracer's CPU affinity when dropped.
struct AffinityGuard(CpuSet);

impl Drop for AffinityGuard {
    fn drop(&mut self) {
        let _ = sys::set_affinity(&self.0);
    }
}

fn pin(cpu: usize) -> Result<(), Failure> {
    sys::set_affinity(&CpuSet::single(cpu)).map_err(|e| invalid(format!("sched_setaffinity(CPU {cpu}): {e}")))
}

pub fn run(fixture: &Fixture, job: &Job, stdout: &Path) -> Result<Measurement, Failure> {
    if job.threads != 1 {
        return Err(Failure::Unavailable("the ptrace engines trace a single thread".into()));
    }
    let saved = sys::affinity().map_err(|e| invalid(format!("sched_getaffinity: {e}")))?;
    let cpus = saved.cpus();
    let _restore = AffinityGuard(saved);
    let cross_cpu = job.engine == Engine::PtraceXcpu;
    if cross_cpu && cpus.len() < 2 {
        return Err(Failure::Unavailable("needs two CPUs".into()));
    }
    // The child inherits the affinity it is forked with.
    pin(if cross_cpu { cpus[1] } else { cpus[0] })?;
    let mut argv = vec![CString::new(fixture.program.as_os_str().as_bytes()).map_err(invalid)?];
    for arg in fixture_args(job) {
        argv.push(CString::new(arg).map_err(invalid)?);
    }
    let out = File::create(stdout).map_err(|e| invalid(format!("{}: {e}", stdout.display())))?;
    let mut child =
        sys::spawn(&argv, &out, StartMode::Traced).map_err(|e| invalid(format!("cannot start the fixture: {e}")))?;
    if cross_cpu {
        if let Err(e) = pin(cpus[0]) {
            child.kill_and_reap();
            return Err(e);
        }
    }
    match trace(fixture, job, child.pid) {
        Ok(counter) => {
            let m = parse_report(&fs::read_to_string(stdout).unwrap_or_default()).map_err(invalid)?;
            if job.kind.has_entry() {
                check_hits("tracer entry handler", counter.entries, job.hits)?;
            }
            if job.kind.has_return() {
                check_hits("tracer return handler", counter.returns, job.hits)?;
            }
            Ok(m)
        }
        Err(e) => {
            child.kill_and_reap();
            Err(e)
        }
    }
}

/// Traces the child from its exec stop to its exit; returns what the handler counted.
fn trace(fixture: &Fixture, job: &Job, pid: Pid) -> Result<Counter, Failure> {
    match sys::wait(pid).map_err(|e| invalid(format!("waitpid: {e}")))? {
        Status::Stopped(SIGTRAP) => {}
        other => return Err(invalid(format!("expected the exec stop, got {other:?}"))),
    }
    sys::ptrace_set_options(pid, libc::PTRACE_O_EXITKILL).map_err(|e| invalid(format!("PTRACE_SETOPTIONS: {e}")))?;
    let t = Tracee::new(pid)?;
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).map_err(invalid)?;
    let base = load_base(&maps, &fixture.program)
        .ok_or_else(|| invalid(format!("{} not in /proc/{pid}/maps", fixture.program.display())))?;
    let addr = fixture.function(job.function).runtime_address(base);

    let mut original = [0u8; 1];
    t.read(addr, &mut original)?;
    let original = original[0];
    let ool = match job.engine {
        Engine::PtraceOol => Some(OutOfLine::prepare(&t, addr, base)?),
        _ => None,
    };
    t.write(addr, &[INT3])?;

    let mut counter = Counter::default();
    let mut pending: Vec<PendingReturn> = Vec::new();
    // Temporary return breakpoints of the single-step engine: address -> original byte.
    let mut return_bps: HashMap<u64, u8> = HashMap::new();
    let mut signal = 0;
    loop {
        t.cont(signal)?;
        signal = 0;
        let mut regs = match t.wait()? {
            Status::Exited(0) => return Ok(counter),
            Status::Stopped(SIGTRAP) => t.regs()?,
            Status::Stopped(sig) => {
                signal = sig;
                continue;
            }
            other => return Err(invalid(format!("fixture ended with {other:?}"))),
        };
        let hit = regs.rip - 1;
        if hit == addr {
            if job.kind.has_entry() {
                counter.on_entry(&regs);
            }
            if job.kind.has_return() {
                let ret_addr = t.read_u64(regs.rsp)?;
                pending.push(PendingReturn { ret_addr, rsp: regs.rsp + 8 });
                match &ool {
                    Some(ool) => t.write(regs.rsp, &ool.trampoline.to_le_bytes())?,
                    None => {
                        if let std::collections::hash_map::Entry::Vacant(v) = return_bps.entry(ret_addr) {
                            let mut b = [0u8; 1];
                            t.read(ret_addr, &mut b)?;
                            t.write(ret_addr, &[INT3])?;
                            v.insert(b[0]);
                        }
                    }
                }
            }
            match &ool {
                Some(ool) => {
                    regs.rip = ool.slot;
                    t.set_regs(&regs)?;
                }
                None => {
                    t.write(addr, &[original])?;
                    regs.rip = addr;
                    t.set_regs(&regs)?;
                    t.step()?;
                    t.write(addr, &[INT3])?;
                }
            }
        } else if ool.as_ref().is_some_and(|o| hit == o.trampoline) || return_bps.contains_key(&hit) {
            let ret = pending
                .pop()
                .filter(|p| p.rsp == regs.rsp && (ool.is_some() || p.ret_addr == hit))
                .ok_or_else(|| invalid(format!("return breakpoint at {hit:#x} out of order")))?;
            counter.on_return(&regs);
            regs.rip = ret.ret_addr;
            if ool.is_none() {
                let still_pending = pending.iter().any(|p| p.ret_addr == hit);
                let byte = return_bps[&hit];
                t.write(hit, &[byte])?;
                if still_pending {
                    t.set_regs(&regs)?;
                    t.step()?;
                    t.write(hit, &[INT3])?;
                    continue;
                }
                return_bps.remove(&hit);
            }
            t.set_regs(&regs)?;
        } else {
            return Err(invalid(format!("unexpected SIGTRAP at {:#x}", regs.rip)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_base_is_the_offset_zero_mapping_of_the_program() {
        let maps = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 123 /work/t/hitloop
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:01 123 /work/t/hitloop
7f0000000000-7f0000001000 r--p 00000000 fe:01 456 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";
        assert_eq!(load_base(maps, Path::new("/work/t/hitloop")), Some(0x55d0c0a00000));
        assert_eq!(load_base(maps, Path::new("/work/t/other")), None);
    }
}
