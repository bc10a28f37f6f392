//! Timed calls without a register frame: the quick entry and return of `--latency`'s return
//! probes. A timed function's jump goes to its stub's quick entry (`insn::stub`), which calls
//! `timed_entry` with the flags and the call-clobbered registers saved, nothing more; the
//! return trampoline calls `timed_return` the same way before it builds its frame
//! (`probe::retprobe::QUICK_RETURN`). Each does what the generic path and the
//! `latency_entry`/`latency_return` handlers (`hit`) do for a timed call with no filter and no
//! key, on the same records (`probe::retprobe::quick_entry`): unwinders, `longjmp`, fork and
//! detach find them as they find any. Whatever is not that plain case (a thread marked busy or
//! with requests queued, a point with other consumers, a thread with no block yet, records out
//! of order, a full stack, a tail call, a consumer list changed since the entry) goes on to
//! the common path unchanged, as if the quick code had not run.
//!
//! Context: as `hit` (stub or trampoline context, the thread marked busy while the records
//! change): no allocation, no lock, no system call, no libc (so errno stays), no atomic
//! read-modify-write, no vector register (the `hit_code` test reads the built code).

use core::sync::atomic::Ordering;

use crate::aggregate::blocks::{self, Block};
use crate::aggregate::hit::{self, latency_entry, latency_return, LATENCY_DATA};
use crate::aggregate::plan::{self, ENTERED};
use crate::base::abi::{PtRegs, Uretprobe, UretprobeInstance};
use crate::probe::table::{self, Consumer, ProbePoint};
use crate::probe::thread::{self, ThreadState};
use crate::probe::{rcu, retprobe};
use crate::trace::clock;
use crate::trace::events::ReturnProbe;

/// Sends the hits of `--latency`'s return probes to the quick paths (start-up, before any
/// of them is placed).
pub fn enable() {
    let for_probe: unsafe fn(*mut Uretprobe) -> usize = quick_for;
    table::QUICK_ENTRY_FOR.store(for_probe as usize, Ordering::Release);
    let ret: extern "C" fn(usize) -> usize = timed_return;
    retprobe::QUICK_RETURN.store(ret as usize, Ordering::Release);
    extern "C" {
        fn uprobe_timed_entry();
    }
    table::QUICK_ENTRY.store(uprobe_timed_entry as *const () as usize, Ordering::Release);
}

/// Where the numbers of `rp`'s function lie in a thread's block (their first word, never 0)
/// when `rp` is a timed call's probe with the handlers the quick paths stand in for, and its
/// calls are neither filtered nor split by a key; 0 otherwise (the point's quick word).
///
/// # Safety
/// `rp` is a registered probe object.
unsafe fn quick_for(rp: *mut Uretprobe) -> usize {
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

/// The quick entry of a timed function at point `pp`, whose return address is at `slot`:
/// 1 when it was counted and timed and its return hooked, 0 for the common path.
extern "C" fn timed_entry(pp: &ProbePoint, slot: usize) -> u32 {
    quick(|t| {
        let list = pp.consumers.load(Ordering::SeqCst);
        // The word after the list: set after a list it holds for, cleared before another.
        let at = pp.quick.load(Ordering::SeqCst);
        if list.is_null() || at == 0 {
            return 0;
        }
        // SAFETY: published lists stay allocated until this read-side section ends.
        let list = unsafe { &*list };
        let [Consumer::Uretprobe(rp)] = list.probes[..] else { return 0 };
        let Some(b) = blocks::claimed() else { return 0 };
        // SAFETY: thread busy, read-side section, `rp` registered in `list`, with 16 bytes
        // of data (`quick_for`); `slot` is the program's stack pointer at the entry.
        let Some(data) = (unsafe { retprobe::quick_entry(t, rp, pp, list.generation, slot) }) else { return 0 };
        b.add(at + ENTERED, 1);
        let words = data.cast::<u64>();
        // SAFETY: the instance's data, 16 bytes, this thread's; one store each (a pair of
        // words may be stored through a vector register).
        unsafe {
            words.write_volatile(clock::ticks());
            words.add(1).write_volatile(b.address_of(at) as u64);
        }
        1
    })
}

/// The quick return of a timed call, to the stack pointer `caller_rsp`: the address to
/// resume at once the call's time is added, 0 for the common path.
extern "C" fn timed_return(caller_rsp: usize) -> usize {
    quick(|t| {
        // SAFETY: thread busy, inside a read-side section.
        unsafe {
            retprobe::quick_return(t, caller_rsp - 8, |_, [started, words]| {
                hit::add_call(Block::from_word(words as usize), started, clock::ticks());
            })
        }
    })
}

// The stub's quick entry calls this with the head's frame: the address to resume at (the
// stub's jump to its body), the point, the red zone, then the program's stack. Handled, it
// returns there and drops the rest as the common code does; otherwise the common code runs
// on the frame as it was.
core::arch::global_asm!(
    ".pushsection .text.uprobe_timed_entry,\"ax\",@progbits",
    ".globl uprobe_timed_entry",
    ".hidden uprobe_timed_entry",
    ".type uprobe_timed_entry,@function",
    ".p2align 4",
    "uprobe_timed_entry:",
    crate::insn::frame::save_scratch!(),
    "mov rdi, qword ptr [rbx + {scratch} + 8]",
    "lea rsi, [rbx + {scratch} + 8 + {stub_frame}]",
    "call {entry}",
    "test eax, eax",
    "jz 81f",
    crate::insn::frame::restore_scratch!(),
    "ret {stub_frame}",
    "81:",
    crate::insn::frame::restore_scratch!(),
    "jmp uprobe_jump_common",
    ".size uprobe_timed_entry, . - uprobe_timed_entry",
    ".popsection",
    entry = sym timed_entry,
    scratch = const crate::insn::frame::SCRATCH_SIZE,
    stub_frame = const crate::insn::frame::STUB_FRAME,
);
