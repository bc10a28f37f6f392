//! The hit path: the SIGTRAP handler.
//!
//! SIGNAL CONTEXT. Everything reachable from [`on_sigtrap`] runs inside a signal handler that
//! may have interrupted any code of the program, including `malloc` or a lock holder. It
//! therefore never allocates, never takes a lock, and touches only memory prepared before the
//! probe was armed: the probe table, the probe point, its consumer list, and constant-initialised
//! thread-local cells. The displaced instruction is emulated on the saved context or resumed in
//! its out-of-line slot: the thread never single-steps.

use core::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use iced_x86::Register;

use crate::abi::PtRegs;
use crate::decode::Plan;
use crate::emulate::{self, Cpu};
use crate::registry::{self, Consumer, ProbePoint};
use crate::thread::{self, ThreadState};
use crate::{api, jump, retprobe, sys};

const SI_KERNEL: c_int = 0x80;

// A thread handling a probe hit is marked busy (`thread::ThreadState::busy`), handlers
// included. A hit on a thread that is already handling one (a handler, or a libc function the
// hit path itself calls, is probed) runs no handler and calls nothing: it only executes the
// displaced instruction.

/// Whether the calling thread runs the SIGTRAP handler (it then interrupted arbitrary code).
pub fn in_signal() -> bool {
    thread::current().in_signal.get()
}

/// Whether the calling thread is handling a probe hit, i.e. running handlers (signal-safe).
pub fn in_handler() -> bool {
    thread::current().busy.get()
}

/// Installs the SIGTRAP handler.
pub fn install() -> Result<(), sys::Errno> {
    // SAFETY: a zeroed sigaction is a valid starting point; we fill in handler, flags and an
    // empty mask before passing it to the kernel.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_sigtrap as *const () as usize;
        // NODEFER: a probe hit inside a handler (or inside the runtime) traps again.
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        // The libc function itself: `sigaction` calls reach the program's view (`signals`).
        if crate::signals::real_sigaction(libc::SIGTRAP, Some(&sa), None) != 0 {
            return Err(sys::errno());
        }
    }
    Ok(())
}

type Gregs = [libc::greg_t; 23];

const fn greg(reg: Register) -> usize {
    (match reg {
        Register::R8 => libc::REG_R8,
        Register::R9 => libc::REG_R9,
        Register::R10 => libc::REG_R10,
        Register::R11 => libc::REG_R11,
        Register::R12 => libc::REG_R12,
        Register::R13 => libc::REG_R13,
        Register::R14 => libc::REG_R14,
        Register::R15 => libc::REG_R15,
        Register::RDI => libc::REG_RDI,
        Register::RSI => libc::REG_RSI,
        Register::RBP => libc::REG_RBP,
        Register::RBX => libc::REG_RBX,
        Register::RDX => libc::REG_RDX,
        Register::RAX => libc::REG_RAX,
        Register::RCX => libc::REG_RCX,
        Register::RSP => libc::REG_RSP,
        _ => libc::REG_RIP,
    }) as usize
}

/// The interrupted thread's registers, as the signal frame holds them.
struct SignalCpu<'a> {
    gregs: &'a mut Gregs,
}

impl Cpu for SignalCpu<'_> {
    fn reg(&self, reg: Register) -> u64 {
        self.gregs[greg(reg)] as u64
    }
    fn set_reg(&mut self, reg: Register, value: u64) {
        self.gregs[greg(reg)] = value as i64;
    }
    fn flags(&self) -> u64 {
        self.gregs[libc::REG_EFL as usize] as u64
    }
    fn set_flags(&mut self, value: u64) {
        self.gregs[libc::REG_EFL as usize] = value as i64;
    }
    fn set_rip(&mut self, value: u64) {
        self.gregs[libc::REG_RIP as usize] = value as i64;
    }
    fn segment_base(&self, seg: Register) -> u64 {
        // The handler runs on the interrupted thread, whose segment bases are still loaded.
        if seg == Register::FS {
            sys::fs_base()
        } else {
            sys::gs_base()
        }
    }
    fn read_u64(&self, addr: u64) -> u64 {
        // SAFETY: the emulated instruction reads this address itself (its stack or its
        // operand); had it been invalid, the instruction would have faulted the same way.
        unsafe { core::ptr::read_unaligned(addr as *const u64) }
    }
    fn write_u64(&mut self, addr: u64, value: u64) {
        // SAFETY: only pushes write, just below the interrupted stack pointer; the kernel put
        // the signal frame below the red zone, so this does not touch it.
        unsafe { core::ptr::write_unaligned(addr as *mut u64, value) }
    }
}

fn regs_from(g: &Gregs, probe_addr: usize) -> PtRegs {
    let r = |i: i32| g[i as usize] as u64;
    let csgsfs = r(libc::REG_CSGSFS);
    PtRegs {
        r15: r(libc::REG_R15),
        r14: r(libc::REG_R14),
        r13: r(libc::REG_R13),
        r12: r(libc::REG_R12),
        rbp: r(libc::REG_RBP),
        rbx: r(libc::REG_RBX),
        r11: r(libc::REG_R11),
        r10: r(libc::REG_R10),
        r9: r(libc::REG_R9),
        r8: r(libc::REG_R8),
        rax: r(libc::REG_RAX),
        rcx: r(libc::REG_RCX),
        rdx: r(libc::REG_RDX),
        rsi: r(libc::REG_RSI),
        rdi: r(libc::REG_RDI),
        orig_rax: u64::MAX,
        rip: probe_addr as u64,
        cs: csgsfs & 0xffff,
        eflags: r(libc::REG_EFL),
        rsp: r(libc::REG_RSP),
        ss: (csgsfs >> 48) & 0xffff,
    }
}

fn regs_into(regs: &PtRegs, g: &mut Gregs) {
    let mut w = |i: i32, v: u64| g[i as usize] = v as i64;
    w(libc::REG_R15, regs.r15);
    w(libc::REG_R14, regs.r14);
    w(libc::REG_R13, regs.r13);
    w(libc::REG_R12, regs.r12);
    w(libc::REG_RBP, regs.rbp);
    w(libc::REG_RBX, regs.rbx);
    w(libc::REG_R11, regs.r11);
    w(libc::REG_R10, regs.r10);
    w(libc::REG_R9, regs.r9);
    w(libc::REG_R8, regs.r8);
    w(libc::REG_RAX, regs.rax);
    w(libc::REG_RCX, regs.rcx);
    w(libc::REG_RDX, regs.rdx);
    w(libc::REG_RSI, regs.rsi);
    w(libc::REG_RDI, regs.rdi);
    w(libc::REG_EFL, regs.eflags);
    w(libc::REG_RSP, regs.rsp);
}

/// Executes the instruction displaced by the probe at `pp`: on the context, or out of line;
/// while a jump is being written or taken out there, the whole patched range runs from the
/// jump's stub instead.
fn run_displaced(pp: &ProbePoint, gregs: &mut Gregs) {
    if pp.tail_patched.load(Ordering::SeqCst) {
        if let Ok(prep) = &pp.jump {
            gregs[libc::REG_RIP as usize] = (prep.stub + jump::BODY_OFFSET) as i64;
            return;
        }
    }
    match pp.plan {
        Plan::Emulate(e) => emulate::execute(&e, &mut SignalCpu { gregs }, (pp.addr + pp.len) as u64),
        Plan::OutOfLine => gregs[libc::REG_RIP as usize] = pp.slot as i64,
    }
}

/// One probe hit on a thread that was not handling one already (signal context).
fn hit(pp: &ProbePoint, gregs: &mut Gregs, t: &ThreadState) {
    let epoch = registry::read_lock(t);
    let consumers = pp.consumers.load(Ordering::SeqCst);
    if consumers.is_null() {
        registry::read_unlock(epoch);
        run_displaced(pp, gregs);
        return;
    }
    let mut regs = regs_from(gregs, pp.addr);
    // SAFETY: the list stays allocated until our read-side section ends.
    run_consumers(pp, unsafe { &*consumers }, &mut regs, t);
    registry::read_unlock(epoch);
    regs_into(&regs, gregs);
    if regs.rip as usize == pp.addr {
        run_displaced(pp, gregs);
    } else {
        gregs[libc::REG_RIP as usize] = regs.rip as i64;
    }
}

/// The SIGTRAP handler (signal context).
extern "C" fn on_sigtrap(_sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler; the
    // register array is ours to edit until the handler returns.
    let (code, gregs) = unsafe { ((*info).si_code, &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs) };
    let addr = (gregs[libc::REG_RIP as usize] as usize).wrapping_sub(1);
    let Some(pp) = registry::lookup(addr).filter(|_| code == SI_KERNEL) else {
        // SAFETY: the kernel's arguments to this handler, passed on.
        unsafe { crate::signals::foreign_trap(addr, info, ctx) };
        return;
    };
    // Decided before anything else runs: everything below may call probed libc code.
    // A hit from the runtime's own work (registering probes calls libc) is not the program's.
    let t = thread::current();
    let nested = t.busy.replace(true);
    if nested || t.depth.get() != 0 {
        t.busy.set(nested);
        pp.missed.fetch_add(1, Ordering::Relaxed);
        run_displaced(pp, gregs);
        return;
    }
    let saved_errno = sys::errno();
    let was_in_signal = t.in_signal.replace(true);
    hit(pp, gregs, t);
    t.busy.set(false);
    if t.queued.get() != 0 {
        api::run_deferred();
    }
    t.in_signal.set(was_in_signal);
    sys::set_errno(saved_errno);
}

/// A hit through a jump probe's stub (normal context): runs the handlers on `regs` and gives
/// the address to resume at: `resume` (the relocated instructions), or where a handler sent
/// the thread.
pub fn direct_hit(pp: &ProbePoint, regs: &mut PtRegs, resume: usize) -> usize {
    regs.rip = pp.addr as u64;
    let t = thread::current();
    let nested = t.busy.replace(true);
    if nested || t.depth.get() != 0 {
        t.busy.set(nested);
        pp.missed.fetch_add(1, Ordering::Relaxed);
        return resume;
    }
    let saved_errno = sys::errno();
    let epoch = registry::read_lock(t);
    let consumers = pp.consumers.load(Ordering::SeqCst);
    if !consumers.is_null() {
        // SAFETY: as in `hit`.
        run_consumers(pp, unsafe { &*consumers }, regs, t);
    }
    registry::read_unlock(epoch);
    t.busy.set(false);
    if t.queued.get() != 0 {
        api::run_deferred();
    }
    sys::set_errno(saved_errno);
    if regs.rip as usize == pp.addr {
        resume
    } else {
        regs.rip as usize
    }
}

/// Calls the handlers of `consumers` in registration order (busy, in a read-side section),
/// each with the thread marked as running that probe's handler (see `faults`).
fn run_consumers(pp: &ProbePoint, consumers: &registry::Consumers, regs: &mut PtRegs, t: &ThreadState) {
    for &consumer in &consumers.probes {
        let outer = t.handling.replace(consumer.key());
        // Each entry is a registered probe object, which the C ABI keeps valid until unregister
        // returns, and unregister waits for the caller's read-side section.
        // SAFETY: valid objects (above); handlers have the documented signatures.
        unsafe {
            match consumer {
                Consumer::Uprobe(u) => {
                    if let Some(handler) = (*u).handler {
                        handler(u, regs);
                    }
                }
                Consumer::Uretprobe(rp) => retprobe::on_entry(rp, pp, regs),
            }
        }
        t.handling.set(outer);
    }
}
