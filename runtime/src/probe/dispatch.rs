//! Hit dispatch: what a probe hit does, for both ways a hit arrives.
//!
//! - Through a trap ([`on_trap`], SIGNAL CONTEXT): the `int3` of a probe point raised SIGTRAP;
//!   the hazards layer's SIGTRAP handler hands the interrupted registers here. Everything
//!   reachable from it may have interrupted any code of the program, including `malloc` or a
//!   lock holder: it never allocates, never takes a lock, and touches only memory prepared
//!   before the probe was armed. The displaced instruction is then emulated on the saved
//!   context or resumed in its out-of-line slot: the thread never single-steps.
//! - Through a jump probe's stub (`uprobe_jump_common`, normal thread context): the stub
//!   saved the registers into a `struct pt_regs` and calls `jump_hit`.
//!
//! Either way the thread is marked busy before anything that may be probed runs (see
//! `thread`); a hit on a busy thread, or on a thread inside the runtime, runs no handler and
//! counts as missed.

use std::sync::atomic::Ordering;

use iced_x86::Register;

use crate::base::abi::{PtRegs, Uprobe};
use crate::base::{stats, sys};
use crate::insn::decode::Plan;
use crate::insn::emulate::{self, Cpu};
use crate::insn::{frame, stub, vector};
use crate::probe::table::{self, Consumer, Consumers, ProbePoint};
use crate::probe::thread::{self, ThreadState};
use crate::probe::{deferred, rcu, retprobe};

/// The general registers of a signal frame.
pub type Gregs = [libc::greg_t; 23];

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
            gregs[libc::REG_RIP as usize] = (prep.stub + stub::BODY_OFFSET) as i64;
            return;
        }
    }
    match pp.plan {
        Plan::Emulate(e) => emulate::execute(&e, &mut SignalCpu { gregs }, (pp.addr + pp.len) as u64),
        Plan::OutOfLine => gregs[libc::REG_RIP as usize] = pp.slot as i64,
    }
}

/// The hit of a thread that is not quiet, on probe point `pp`: marks the thread busy
/// (before anything that may be probed runs, errno's location included), keeps errno, and
/// runs `f` on the point's consumer list (None: none left) inside a read-side section; then
/// runs the registrations the handlers queued and puts errno back. The one enter/leave
/// sequence of every hit path but the quick ones (`trace::quick`, `aggregate::timed`), which
/// check up front that the thread is not quiet and has nothing queued and then keep a
/// leaner copy of it (`ThreadState::set_busy_alone`, no queue to run): built on this one,
/// the quick event path ran 12 instructions and about 1 ns more a hit.
#[inline(always)]
fn hit_section<R>(t: &ThreadState, pp: &ProbePoint, f: impl FnOnce(Option<&Consumers>) -> R) -> R {
    t.set_busy(true);
    // Found once: the same thread's errno at the end.
    let errno_at = sys::errno_location();
    // SAFETY: the calling thread's errno, valid for the thread's life.
    let saved_errno = unsafe { *errno_at };
    let section = rcu::read_lock(t);
    let consumers = pp.consumers.load(Ordering::SeqCst);
    // SAFETY: the list stays allocated until our read-side section ends.
    let result = f(unsafe { consumers.as_ref() });
    rcu::read_unlock(section);
    t.set_busy(false);
    if t.queued.get() != 0 {
        // Registration is no hit-path code: it may use the vector registers.
        vector::saving_vectors(deferred::run_deferred);
    }
    // SAFETY: as above.
    unsafe { *errno_at = saved_errno };
    result
}

/// A trap at `addr` (the `int3` just executed), with the interrupted registers `gregs`:
/// handles it and returns true when `addr` is a probe point (signal context).
pub fn on_trap(addr: usize, gregs: &mut Gregs, vectors: usize) -> bool {
    let Some(pp) = table::lookup(addr) else {
        return false;
    };
    // Decided before anything else runs: everything below may call probed libc code.
    let t = thread::current();
    if t.quiet() {
        if t.depth.get() != 0 {
            stats::TRAPS_IN_RUNTIME.add(1);
        }
        pp.missed.fetch_add(1, Ordering::Relaxed);
        run_displaced(pp, gregs);
        return true;
    }
    let was_in_signal = t.in_signal.replace(true);
    hit_section(t, pp, |consumers| match consumers {
        None => run_displaced(pp, gregs),
        Some(consumers) => {
            let mut regs = regs_from(gregs, pp.addr);
            // Only for the consumers that read them (the flag is read after the list).
            if pp.reads_xmm.load(Ordering::SeqCst) {
                let outer = t.vectors.replace(vectors);
                run_consumers(pp, consumers, &mut regs, t, true);
                t.vectors.set(outer);
            } else {
                run_consumers(pp, consumers, &mut regs, t, true);
            }
            regs_into(&regs, gregs);
            if regs.rip as usize == pp.addr {
                run_displaced(pp, gregs);
            } else {
                gregs[libc::REG_RIP as usize] = regs.rip as i64;
            }
        }
    });
    t.in_signal.set(was_in_signal);
    true
}

/// A hit through a jump probe's stub (normal context), of thread `t`: runs the handlers on
/// `regs` and gives the address to resume at: `resume` (the relocated instructions), or
/// where a handler sent the thread. `vectors_saved`: whether the stub saved the vector
/// registers (below `regs`, see `insn::frame`).
#[inline(always)]
fn direct_hit(t: &ThreadState, pp: &ProbePoint, regs: &mut PtRegs, resume: usize, vectors_saved: bool) -> usize {
    regs.rip = pp.addr as u64;
    if t.quiet() {
        pp.missed.fetch_add(1, Ordering::Relaxed);
        return resume;
    }
    hit_section(t, pp, |consumers| {
        if let Some(consumers) = consumers {
            // The thread says where the vectors were saved only to the consumers that read
            // them (the flag is read after the list, which it is raised before).
            if vectors_saved && pp.reads_xmm.load(Ordering::SeqCst) {
                let outer = t.vectors.replace(vector::saved_xmm(regs as *mut PtRegs as usize));
                run_consumers(pp, consumers, regs, t, vectors_saved);
                t.vectors.set(outer);
            } else {
                run_consumers(pp, consumers, regs, t, vectors_saved);
            }
        }
    });
    if regs.rip as usize == pp.addr {
        resume
    } else {
        regs.rip as usize
    }
}

/// The entry hit of a call that the end of the process will overtake: `_exit` and the
/// `exec` functions end the process (or its program) right after the end-of-run report, so
/// their own probes, hit only then, would run after it. Their entry probes' handlers run
/// here instead, before the report, as a hit at `addr` with `regs` would run them; return
/// probes are left out (the call does not come back). Normal context.
pub fn hit_ahead(addr: usize, regs: &mut PtRegs) {
    let Some(pp) = table::lookup(addr) else { return };
    let t = thread::current();
    if t.quiet() {
        return;
    }
    regs.rip = addr as u64;
    hit_section(t, pp, |consumers| {
        for &consumer in consumers.map_or(&[][..], |c| &c.probes[..]) {
            if let Consumer::Uprobe(u) = consumer {
                run_uprobe_handler(u, consumer, regs, t);
            }
        }
    });
}

/// Calls the handler of entry probe `u` (the consumer `consumer`), with the thread marked as
/// running that probe's handler (see `owners`) and writing to that handler's output.
#[inline(always)]
fn run_uprobe_handler(u: *mut Uprobe, consumer: Consumer, regs: &mut PtRegs, t: &ThreadState) {
    let outer = t.handling.replace(consumer.key());
    // A registered probe object, which the C ABI keeps valid until unregister returns, and
    // unregister waits for the caller's read-side section.
    // SAFETY: a valid object (above); handlers have the documented signature.
    unsafe {
        if let Some(handler) = (*u).handler {
            let outer_code = t.code.replace(handler as usize);
            handler(u, regs);
            t.code.set(outer_code);
        }
    }
    t.handling.set(outer);
}

/// Calls the handlers of `consumers` in registration order (busy, in a read-side section).
/// Without `vectors_saved` (a jump probe whose consumers were all vector-free when the hit
/// began), a consumer that needs them (registered since) is called with them saved here.
#[inline(always)]
fn run_consumers(pp: &ProbePoint, consumers: &Consumers, regs: &mut PtRegs, t: &ThreadState, vectors_saved: bool) {
    let list = consumers.generation;
    for &consumer in &consumers.probes {
        if !vectors_saved && consumer.needs_vectors() {
            run_consumer_saving_vectors(pp, list, consumer, regs, t);
        } else {
            run_consumer(pp, list, consumer, regs, t);
        }
    }
}

/// [`run_consumer`] with the vector registers saved around it; out of line, so that the
/// usual path keeps the consumer in registers.
#[inline(never)]
fn run_consumer_saving_vectors(pp: &ProbePoint, list: u64, consumer: Consumer, regs: &mut PtRegs, t: &ThreadState) {
    vector::saving_vectors(|| run_consumer(pp, list, consumer, regs, t));
}

/// Runs one consumer of the list numbered `list`.
#[inline(always)]
fn run_consumer(pp: &ProbePoint, list: u64, consumer: Consumer, regs: &mut PtRegs, t: &ThreadState) {
    match consumer {
        Consumer::Uprobe(u) => run_uprobe_handler(u, consumer, regs, t),
        Consumer::Uretprobe(rp) => {
            let outer = t.handling.replace(consumer.key());
            // SAFETY: a registered return probe of list `list`, valid in this read-side
            // section.
            unsafe { retprobe::on_entry(rp, pp, list, regs, t) };
            t.handling.set(outer);
        }
    }
}

/// Called by the common stub code with the registers it saved (the vector registers too if
/// `vectors_saved`); runs the handlers of the probe point and gives the address to resume at
/// (normal context). Nothing this reaches touches a vector register unless they were saved,
/// or through `vector::saving_vectors` (the `hit_code` test reads the built code). A
/// front-end's quick code (`trace::quick`) calls it too, on the same frame.
pub(crate) extern "C" fn jump_hit(regs: &mut PtRegs, vectors_saved: bool) -> usize {
    let (resume, pp) = stub_frame(regs);
    direct_hit(thread::current(), pp, regs, resume, vectors_saved)
}

/// What a stub's head left above the registers of a hit (see `insn::frame`'s layout): the
/// address to resume at and the probe point; sets `regs.rsp` to the program's stack pointer.
#[inline(always)]
pub(crate) fn stub_frame(regs: &mut PtRegs) -> (usize, &'static ProbePoint) {
    let area = regs as *mut PtRegs as usize;
    let word = |offset: usize| {
        // SAFETY: the stub left its return address and the probe point's address above the
        // registers (see `insn::frame`'s layout).
        unsafe { *((area + offset) as *const usize) }
    };
    let (resume, pp) = (word(frame::RESUME_SLOT), word(frame::CONTEXT_SLOT));
    regs.rsp = (area + frame::JUMP_CALLER_RSP) as u64;
    // SAFETY: the stub was built for this probe point, which is never freed.
    (resume, unsafe { &*(pp as *const ProbePoint) })
}

// To the resume address; drops the context word and the red zone.
// The vectors are saved where the probe point says its consumers need them.
frame::trap_free_entry!(
    "",
    "uprobe_jump_common",
    "",
    "mov rax, qword ptr [rbx + {context_slot}]\n movzx r12d, byte ptr [rax + {pp_vectors}]",
    jump_hit,
    "ret {stub_frame}",
    stub_frame = const frame::STUB_FRAME,
    context_slot = const frame::CONTEXT_SLOT,
    pp_vectors = const core::mem::offset_of!(ProbePoint, vectors)
);

extern "C" {
    fn uprobe_jump_common();
}

/// The address jump stubs call.
pub fn jump_common_entry() -> u64 {
    uprobe_jump_common as *const () as u64
}
