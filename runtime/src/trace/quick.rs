//! Events recorded without the dispatcher: a jump probe whose only consumer is an entry
//! event of the stream (its probe object calls `record::on_entry`, and no fetcharg of it reads
//! a saved vector register) goes to its stub's quick entry, which calls `uprobe_event_entry`
//! as the stub's head calls the common code: the same `struct pt_regs` frame, without the
//! vector save, and `event_hit` in place of the dispatcher. That does what the dispatcher
//! does for such a point (the thread marked busy, errno kept, a read-side section around the
//! point's consumer list) and calls the record handler directly, without the bookkeeping a
//! handler library's call needs (whose handler runs, where its output goes). A hit the quick
//! code does not take (a quiet thread, requests queued, a point another probe has joined) goes
//! to the dispatcher on the same frame, as if it had come through the head, the vectors not
//! saved (the dispatcher saves them around a consumer that needs them).
//!
//! Context: the hit path (stub context): no allocation, no lock, no libc, no vector register
//! but through `insn::vector::saving_vectors` (the `hit_code` test reads the built code).

use core::sync::atomic::Ordering;

use crate::base::abi::{PtRegs, Uprobe};
use crate::base::sys;
use crate::insn::frame;
use crate::probe::table::{self, Consumer};
use crate::probe::{dispatch, rcu, thread};
use crate::trace::record;

/// Sends the hits of the stream's entry events to the quick path (start-up, before any of
/// their probes is placed).
pub fn enable() {
    let for_probe: unsafe fn(Consumer) -> usize = quick_for;
    table::QUICK_ENTRY_FOR.store(for_probe as usize, Ordering::Release);
    table::QUICK_CALLS.store(true, Ordering::Release);
    extern "C" {
        fn uprobe_event_entry();
    }
    table::QUICK_ENTRY.store(uprobe_event_entry as *const () as usize, Ordering::Release);
}

/// 1 when `c` is an entry event's probe object, which calls the record handler, and reads no
/// saved vector register; 0 otherwise (the point's quick word).
///
/// # Safety
/// `c` is a registered probe.
unsafe fn quick_for(c: Consumer) -> usize {
    let Consumer::Uprobe(u) = c else { return 0 };
    let entry: unsafe extern "C" fn(*mut Uprobe, *mut PtRegs) = record::on_entry;
    // SAFETY: a registered probe object (the caller), valid while registered (C ABI).
    let handler = unsafe { (*u).handler };
    usize::from(handler.map(|h| h as usize) == Some(entry as usize) && !c.reads_xmm())
}

/// Called by `uprobe_event_entry` with the registers it saved (not the vectors): records
/// the hit of the point's event and gives the address to resume at, the stub's relocated
/// instructions (a record handler changes no register).
extern "C" fn event_hit(regs: &mut PtRegs, vectors_saved: bool) -> usize {
    let t = thread::current();
    if t.quiet() || t.queued.get() != 0 {
        return dispatch::jump_hit(regs, vectors_saved);
    }
    let (resume, pp) = dispatch::stub_frame(regs);
    regs.rip = pp.addr as u64;
    t.set_busy_alone(true);
    let errno_at = sys::errno_location();
    // SAFETY: the calling thread's errno, valid for the thread's life.
    let saved_errno = unsafe { *errno_at };
    let section = rcu::read_lock(t);
    let list = pp.consumers.load(Ordering::SeqCst);
    // The word after the list: set after a list it holds for, cleared before another.
    let quick = pp.quick.load(Ordering::SeqCst) != 0;
    // SAFETY: published lists stay allocated until this read-side section ends.
    let u = match unsafe { list.as_ref() } {
        Some(list) if quick => match list.probes[..] {
            [Consumer::Uprobe(u)] => Some(u),
            _ => None,
        },
        _ => None,
    };
    if let Some(u) = u {
        // SAFETY: `u` is registered in the list (valid in this section), an entry event's
        // probe object (`quick_for`); `regs` are the hit's.
        unsafe { record::on_entry(u, regs) };
    }
    rcu::read_unlock(section);
    // SAFETY: as above.
    unsafe { *errno_at = saved_errno };
    t.set_busy_alone(false);
    match u {
        Some(_) => resume,
        None => dispatch::jump_hit(regs, vectors_saved),
    }
}

// The stub's quick entry calls this as its head calls the common code (the same frame); it
// returns to the stub's relocated instructions, dropping the context word and the red zone.
frame::trap_free_entry!(
    "",
    "uprobe_event_entry",
    "",
    "xor r12d, r12d",
    event_hit,
    "ret {stub_frame}",
    stub_frame = const frame::STUB_FRAME
);
