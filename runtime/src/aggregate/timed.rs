//! Timed calls without a register frame: the quick entry and return of `--latency`'s return
//! probes. A timed function's jump goes to its stub's quick entry (`insn::stub`), which jumps
//! to `uprobe_timed_entry` (below): it calls `timed_entry` with the flags and the
//! call-clobbered registers saved, nothing more, and then calls the function through
//! `uprobe_call_through` (`probe::retprobe`), so that the function's return into the
//! trampoline is predicted; the trampoline calls `timed_return` the same way before it
//! builds its frame (`probe::retprobe::QUICK_RETURN`) and leaves by `ret`. Each does what the
//! generic path and the `latency_entry`/`latency_return` handlers (`hit`) do for a timed call
//! with no filter and no key, on the same records (`probe::retprobe::quick_entry`):
//! unwinders, `longjmp`, fork and detach find them as they find any. Whatever is not that
//! plain case (a thread marked busy or with requests queued, a point with other consumers, a
//! thread with no block yet, records out of order, a full stack, a tail call, a consumer list
//! changed since the entry) goes on to the common path unchanged, as if the quick code had
//! not run.
//!
//! Context: as `hit` (stub or trampoline context, the thread marked busy while the records
//! change): no allocation, no lock, no system call, no libc (so errno stays), no atomic
//! read-modify-write, no vector register (the `hit_code` test reads the built code).

use core::sync::atomic::Ordering;

use crate::aggregate::blocks::{self, Block};
use crate::aggregate::hit::{self, latency_entry, latency_return, LATENCY_DATA};
use crate::aggregate::plan;
use crate::base::abi::{PtRegs, UretprobeInstance};
use crate::insn::stub::BODY_OFFSET;
use crate::probe::table::{self, Consumer, ProbePoint};
use crate::probe::thread::{self, ThreadState};
use crate::probe::{rcu, retprobe};
use crate::trace::clock;
use crate::trace::events::ReturnProbe;

/// Sends the hits of `--latency`'s return probes to the quick paths (start-up, before any
/// of them is placed).
pub fn enable() {
    let for_probe: unsafe fn(Consumer) -> usize = quick_for;
    table::QUICK_ENTRY_FOR.store(for_probe as usize, Ordering::Release);
    table::QUICK_CALLS.store(false, Ordering::Release);
    let ret: extern "C" fn(usize) -> usize = timed_return;
    retprobe::QUICK_RETURN.store(ret as usize, Ordering::Release);
    extern "C" {
        fn uprobe_timed_entry();
    }
    table::QUICK_ENTRY.store(uprobe_timed_entry as *const () as usize, Ordering::Release);
}

/// Where the numbers of `c`'s function lie in a thread's block (their first word, never 0)
/// when `c` is a timed call's probe with the handlers the quick paths stand in for, and its
/// calls are neither filtered nor split by a key; 0 otherwise (the point's quick word).
///
/// # Safety
/// `c` is a registered probe.
unsafe fn quick_for(c: Consumer) -> usize {
    let Consumer::Uretprobe(rp) = c else { return 0 };
    let entry: unsafe extern "C" fn(*mut UretprobeInstance, *mut PtRegs) -> core::ffi::c_int = latency_entry;
    let ret: unsafe extern "C" fn(*mut UretprobeInstance, *mut PtRegs) = latency_return;
    // SAFETY: a registered probe object (the caller), valid while registered (C ABI).
    let probe = unsafe { &*rp };
    if probe.entry_handler.map(|h| h as usize) != Some(entry as usize)
        || probe.handler.map(|h| h as usize) != Some(ret as usize)
        || probe.data_size != LATENCY_DATA
    {
        return 0;
    }
    // SAFETY: the latency handlers are registered only with a trace `ReturnProbe`.
    let index = unsafe { (*(rp as *mut ReturnProbe)).event };
    match plan::get(index) {
        Some((plans, p)) if !p.gated && p.key.is_none() => p.latency.map_or(0, |l| plans.latencies[l].at),
        _ => 0,
    }
}

/// Runs `f` with the thread marked busy, inside a read-side section, unless the thread is
/// quiet or has requests queued (0 then: the common path decides).
#[inline(always)]
fn quick<R: Default>(f: impl FnOnce(&ThreadState) -> R) -> R {
    let t = thread::current();
    if t.quiet() || t.queued.get() != 0 {
        return R::default();
    }
    t.set_busy_alone(true);
    let section = rcu::read_lock(t);
    let result = f(t);
    rcu::read_unlock(section);
    t.set_busy_alone(false);
    result
}

/// Where a quick entry goes on: to `to`, called through `uprobe_call_through` when
/// `called` (the stub's relocated instructions: the call is timed), jumped to otherwise (the
/// stub's head: the common path).
#[repr(C)]
struct Next {
    to: usize,
    called: usize,
}

/// The quick entry of a timed function at point `pp`, whose return address is at `slot`:
/// counts and times the call and records its return, or leaves it to the common path.
extern "C" fn timed_entry(pp: &ProbePoint, slot: usize) -> Next {
    // Through a stub: the point has its jump.
    let stub = pp.jump.as_ref().map_or(0, |j| j.stub);
    let called = quick(|t| {
        let list = pp.consumers.load(Ordering::SeqCst);
        // The word after the list: set after a list it holds for, cleared before another.
        let at = pp.quick.load(Ordering::SeqCst);
        if list.is_null() || at == 0 {
            return false;
        }
        // SAFETY: published lists stay allocated until this read-side section ends.
        let list = unsafe { &*list };
        let [Consumer::Uretprobe(rp)] = list.probes[..] else { return false };
        let Some(b) = blocks::claimed() else { return false };
        // SAFETY: thread busy, read-side section, `rp` registered in `list`, with 16 bytes
        // of data (`quick_for`); `slot` is the program's stack pointer at the entry.
        let Some(data) = (unsafe { retprobe::quick_entry(t, rp, pp, list.generation, slot) }) else { return false };
        let numbers = hit::entered(b, at);
        let words = data.cast::<u64>();
        // SAFETY: the instance's data, 16 bytes, this thread's; one store each (a pair of
        // words may be stored through a vector register).
        unsafe {
            words.write_volatile(clock::ticks());
            words.add(1).write_volatile(numbers as u64);
        }
        true
    });
    match called {
        true => Next { to: stub + BODY_OFFSET, called: 1 },
        false => Next { to: stub, called: 0 },
    }
}

/// The quick return of a timed call, to the stack pointer `caller_rsp`: the address to
/// resume at once the call's time is added, 0 for the common path.
extern "C" fn timed_return(caller_rsp: usize) -> usize {
    quick(|t| {
        // SAFETY: thread busy, inside a read-side section.
        unsafe {
            retprobe::quick_return(t, caller_rsp - 8, |[started, words]| {
                hit::add_call(Block::from_word(words as usize), started, clock::ticks());
            })
        }
    })
}

// The stub's quick entry jumps here with the head's frame: the point's word, the red zone,
// then the program's stack, the return address on top. A timed call is called through
// `uprobe_call_through` (see `probe::retprobe`), with the return address dropped and the
// stub's relocated instructions 16 bytes below the stack pointer; any other goes to the
// stub's head, with the stack as at the probe. Both addresses are left below the program's
// stack pointer, in the red zone, which signal delivery skips.
core::arch::global_asm!(
    ".pushsection .text.uprobe_timed_entry,\"ax\",@progbits",
    ".globl uprobe_timed_entry",
    ".hidden uprobe_timed_entry",
    ".type uprobe_timed_entry,@function",
    ".p2align 4",
    "uprobe_timed_entry:",
    crate::insn::frame::save_scratch!(),
    "mov rdi, qword ptr [rbx + {scratch}]",
    "lea rsi, [rbx + {scratch} + {stub_frame}]",
    "call {entry}",
    "mov qword ptr [rbx + {scratch}], rax",
    "test edx, edx",
    "jz 81f",
    crate::insn::frame::restore_scratch!(),
    "push qword ptr [rsp]",
    "pop qword ptr [rsp + {stub_frame} - 8]",
    "lea rsp, [rsp + {stub_frame} + 8]",
    "jmp uprobe_call_through",
    "81:",
    crate::insn::frame::restore_scratch!(),
    "push qword ptr [rsp]",
    "pop qword ptr [rsp + {stub_frame} - 8]",
    "lea rsp, [rsp + {stub_frame}]",
    "jmp qword ptr [rsp - 8]",
    ".size uprobe_timed_entry, . - uprobe_timed_entry",
    ".popsection",
    entry = sym timed_entry,
    scratch = const crate::insn::frame::SCRATCH_SIZE,
    stub_frame = const crate::insn::frame::STUB_FRAME,
);
