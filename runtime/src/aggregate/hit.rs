//! The aggregating handlers: what a hit of a counted event, and an entry and a return of a
//! timed function, do. They run on the hit path (signal context on the `int3` path, stub or
//! trampoline context otherwise), with the thread marked busy by the core: no allocation, no
//! lock, no system call (but a thread's first hit's, in `blocks::claim`), no libc, and no
//! atomic read-modify-write: each thread adds to its own block with plain loads and stores.
//! Memory the program names is read through `base::usercopy` (by the trace layer's fetch).
//!
//! A hit of a thread that found no block still counts in its event's total (a shared
//! counter, the one locked add on this path, which only threads beyond `blocks::THREADS`
//! take); its key or values are counted as not kept.

use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use crate::aggregate::blocks::{self, Block};
use crate::aggregate::buckets::log2_index;
use crate::aggregate::plan::{self, EventPlan, Key, Plans, CALLS, ENTERED, LAT_HIST, MAX, MIN, SETS, TOTAL};
use crate::aggregate::stacks;
use crate::base::abi::{PtRegs, Uprobe, UretprobeInstance};
use crate::base::usercopy;
use crate::probe::{retprobe, thread};
use crate::trace::clock;
use crate::trace::events::{self, EntryProbe, ReturnProbe};
use crate::trace::fetch::Base;
use crate::trace::{filter, format, read};

/// Per event: hits of threads that had no block (counted in totals, their keys and values
/// not kept). Made at start-up, before any probe is placed.
static UNBLOCKED: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());

/// Nanoseconds per tick of `clock::ticks`, times 2^32 (set at start-up, refined by reports).
pub static NS_PER_TICK: AtomicU64 = AtomicU64::new(1 << 32);
/// The interval being counted (reports turn it over; see `report`).
pub static EPOCH: AtomicU64 = AtomicU64::new(0);
/// Whether reports come every `--interval` (timed calls then keep each interval's extremes).
pub static INTERVALS: AtomicBool = AtomicBool::new(false);

/// Makes the per-event counters of hits without a block (start-up).
pub fn init_unblocked(events: usize) {
    let counters: Box<[AtomicU64]> = (0..events).map(|_| AtomicU64::new(0)).collect();
    let counters = Box::leak(counters);
    let old = UNBLOCKED.swap(counters.as_mut_ptr(), Ordering::AcqRel);
    let old_len = OLD_LEN.swap(counters.len(), Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: the counters of an attach session before this one, leaked above with
        // `old_len` of them; nothing counts or reads them any more (see `plan::publish`).
        drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(old, old_len)) });
    }
}

/// How many counters `UNBLOCKED` points to.
static OLD_LEN: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

fn unblocked_counter(index: usize) -> Option<&'static AtomicU64> {
    let at = UNBLOCKED.load(Ordering::Acquire);
    let events = plan::plans().map_or(0, |p| p.events.len());
    // SAFETY: one per event, made before their probes, freed only when a later session
    // replaces them (see `init_unblocked`); `index` is checked against the events' number.
    (!at.is_null() && index < events).then(|| unsafe { &*at.add(index) })
}

/// Hits of event `index` from threads without a block.
pub fn unblocked(index: usize) -> u64 {
    unblocked_counter(index).map_or(0, |c| c.load(Ordering::Relaxed))
}

#[cold]
pub fn no_block(index: u32) {
    if let Some(c) = unblocked_counter(index as usize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The entry handler of every counted entry event.
///
/// # Safety
/// Called by the core with its probe object (a trace `EntryProbe`) and the registers.
pub unsafe extern "C" fn on_entry(u: *mut Uprobe, regs: *mut PtRegs) {
    // SAFETY: the core passes the registered object, an EntryProbe, and the hit's registers.
    let (index, regs) = unsafe { ((*(u as *mut EntryProbe)).event, &*regs) };
    counted(index, regs, 0);
}

/// Where a jump probe's stub may count a hit of entry probe `u` itself (the
/// `probe::table::INLINE_COUNT` hook): the byte offset of its event's counter in a thread's
/// block when the probe is a counted event's whose hit does nothing else (no filter or
/// trigger, no key, no histogram of it), and the blocks allow it; 0 otherwise. The stub then
/// does what `counted` does for such an event: one added to that word of the thread's own
/// block, found as `blocks::mine` finds it.
///
/// # Safety
/// `u` is a registered probe object.
pub unsafe fn count_in_stub(u: *mut Uprobe) -> usize {
    if thread::counting_offset().is_none() {
        return 0;
    }
    let entry: unsafe extern "C" fn(*mut Uprobe, *mut PtRegs) = on_entry;
    // SAFETY: a registered probe object (the caller), valid while registered (C ABI).
    if unsafe { (*u).handler }.map(|h| h as usize) != Some(entry as usize) {
        return 0;
    }
    // SAFETY: this front-end registers `on_entry` only with a trace `EntryProbe`.
    let index = unsafe { (*(u as *mut EntryProbe)).event };
    match plan::get(index) {
        Some((_, p)) if p.simple && !p.gated && p.latency.is_none() && blocks::counts_in_stubs() => 8 * p.count,
        _ => 0,
    }
}

/// The return handler of every counted return event.
///
/// # Safety
/// Called by the core with the instance of a trace `ReturnProbe` and the registers.
pub unsafe extern "C" fn on_return(ri: *mut UretprobeInstance, regs: *mut PtRegs) {
    // SAFETY: as in `on_entry`; the instance names its return probe, a ReturnProbe.
    let (index, caller, regs) = unsafe { ((*((*ri).rp as *mut ReturnProbe)).event, (*ri).ret_addr, &*regs) };
    counted(index, regs, caller);
}

/// Counts a hit of event `index`. Vector-free (the probes say so with `UPROBE_NO_VECTORS`,
/// and the `hit_code` test reads the built code), filters included: what may use vector
/// registers (a string comparison, a thread's first claim) runs through `saving_vectors`;
/// keys and histogram values need none.
#[inline(always)]
fn counted(index: u32, regs: &PtRegs, caller: u64) {
    let Some((plans, p)) = plan::get(index) else { return };
    if p.gated && !passes(plans, index, regs) {
        return;
    }
    let Some(b) = blocks::mine() else { return no_block(index) };
    b.add(p.count, 1);
    if !p.simple {
        keys_and_values(plans, p, b, index, regs, caller);
    }
}

/// Whether a hit of gated event `index` (a filter or a trigger) counts; one that fails its
/// filter is counted as such in the thread's block, one of an event switched off not at all.
#[inline(always)]
fn passes(plans: &Plans, index: u32, regs: &PtRegs) -> bool {
    let Some(ev) = events::get(index) else { return false };
    match filter::admit(ev, regs, false) {
        Some(true) => return true,
        Some(false) => {
            if let Some(b) = blocks::mine() {
                b.add(plans.layout.failed + index as usize, 1);
            }
        }
        None => {}
    }
    false
}

/// The key (`--by`) and the histogram values of a hit.
fn keys_and_values(plans: &Plans, p: &EventPlan, b: Block, index: u32, regs: &PtRegs, caller: u64) {
    let Some(ev) = events::get(index) else { return };
    let file_base = ev.file_base.load(Ordering::Relaxed);
    let layout = &plans.layout;
    let mut space = core::mem::MaybeUninit::<[u64; plan::MAX_KEY_WORDS]>::uninit();
    let mut key = None;
    if let Some(parts) = &p.key {
        key = key_of(plans, parts, b, ev, index, regs, caller, &mut space);
        let counted = match key {
            Some((tag, words)) if p.count_by_key => b.count_key(layout, tag, words),
            Some(_) => true,
            None => false,
        };
        if !counted {
            b.add(layout.dropped + index as usize, 1);
        }
    }
    for &h in &p.hists {
        let plan = &plans.hists[h];
        // A keyed histogram counts in its key's slot; one whose key found no room, in its
        // own words (the values not split by key).
        let slot = match key {
            Some((tag, words)) if plan.keyed => b.slot(layout, tag | (2 + h as u64) << WHAT_SHIFT, words),
            _ => None,
        };
        let (at, faults) = match slot {
            Some(s) => {
                b.add(s + 1, 1);
                (s + layout.values, s + layout.values + plan.scale.buckets())
            }
            None => (plan.at, plan.faults),
        };
        let arg = &ev.args[plan.arg];
        match read::fetch_number(arg, regs, file_base) {
            Some(raw) => {
                let v = typed(arg, raw);
                b.add(at + plan.scale.index(v), 1);
                b.add(faults + 1, v as u64);
            }
            None => b.add(faults, 1),
        }
    }
}

/// A hit's key: its tag and words (in `space`), or None when a stack part found no room in
/// the thread's store.
#[allow(clippy::too_many_arguments)]
#[inline]
fn key_of<'s>(
    plans: &Plans,
    parts: &[plan::KeyPart],
    b: Block,
    ev: &events::Event,
    index: u32,
    regs: &PtRegs,
    caller: u64,
    space: &'s mut core::mem::MaybeUninit<[u64; plan::MAX_KEY_WORDS]>,
) -> Option<(u64, &'s [u64])> {
    let layout = &plans.layout;
    let file_base = ev.file_base.load(Ordering::Relaxed);
    let words = zeroed_words(space, layout.key_words);
    let mut tag = u64::from(index) + 1;
    for (i, part) in parts.iter().enumerate() {
        let w = &mut words[part.at..part.at + part.key.words()];
        let read = match part.key {
            Key::Arg(a) => {
                let arg = &ev.args[a];
                read::fetch_number(arg, regs, file_base).map(|raw| w[0] = format::bits_of(&arg.ty, raw))
            }
            Key::String(a) => {
                // The words hold the string's bytes as they lie in memory (little-endian,
                // as the reports read them back), copied there directly.
                // SAFETY: the words' own bytes, initialised, as long as `w` is borrowed.
                let bytes = unsafe { core::slice::from_raw_parts_mut(w.as_mut_ptr().cast::<u8>(), w.len() * 8) };
                let bytes = &mut bytes[..plan::STRING_KEY];
                read::fetch_string(&ev.args[a], regs, file_base, bytes).map(|_| ())
            }
            Key::Tid | Key::Comm => {
                w[0] = u64::from(b.owner_tid() as u32);
                Some(())
            }
            Key::Caller => {
                w[0] = if caller != 0 { caller } else { caller_at_entry(regs) };
                Some(())
            }
            Key::Ustack(depth) => {
                // No room for another stack: the hit's key is not kept.
                w[0] = stacks::key(b, layout, regs, depth)?;
                Some(())
            }
            Key::Reg(n) => {
                // A match, not an array of the registers: that one is built with vector moves.
                w[0] = match n {
                    0 => regs.rdi,
                    1 => regs.rsi,
                    2 => regs.rdx,
                    3 => regs.rcx,
                    4 => regs.r8,
                    _ => regs.r9,
                };
                Some(())
            }
        };
        if read.is_none() {
            tag |= FAULT_TAG | 1 << (PART_FAULT_SHIFT + i);
        }
    }
    Some((tag, words))
}

/// The first `n` words of `space` (at most all of them), zeroed one store at a time: the
/// compiler clears a whole array with vector stores, which keyed hits may not use (they run
/// without the vector registers saved).
fn zeroed_words(space: &mut core::mem::MaybeUninit<[u64; plan::MAX_KEY_WORDS]>, n: usize) -> &mut [u64] {
    let n = n.min(plan::MAX_KEY_WORDS);
    let at = space.as_mut_ptr().cast::<u64>();
    for i in 0..n {
        // SAFETY: `i` is inside the array; a volatile store is never merged into a wider one.
        unsafe { at.add(i).write_volatile(0) };
    }
    // SAFETY: the first `n` words were just written; the slice borrows `space`.
    unsafe { core::slice::from_raw_parts_mut(at, n) }
}

/// A key's tag: the event's index plus one in the low 32 bits; bit 63: a part could not be
/// read, and which one in the bits from `PART_FAULT_SHIFT` (one per part).
/// What the slot keeps, from bit `WHAT_SHIFT`: 0 a count, 1 a timed call's numbers, 2 + h
/// histogram h's buckets.
pub const FAULT_TAG: u64 = 1 << 63;
pub const PART_FAULT_SHIFT: usize = 40;
pub const WHAT_SHIFT: u32 = 48;
pub const WHAT_TIMED: u64 = 1;

/// A number as its type says (signed types sign-extended, bitfields extracted).
#[inline]
pub fn typed(arg: &crate::trace::fetch::FetchArg, raw: u64) -> i128 {
    let v = format::bits_of(&arg.ty, raw);
    if arg.ty.base == Base::Signed && arg.ty.bitfield.is_none() {
        i128::from(format::signed(&arg.ty, v))
    } else {
        i128::from(v)
    }
}

/// The return address at a function's entry: at %rsp, unless a return probe replaced it by
/// its trampoline's, then the real one it saved.
fn caller_at_entry(regs: &PtRegs) -> u64 {
    let slot = regs.rsp as usize;
    match usercopy::read_u64(slot) {
        Some(a) if a as usize == retprobe::trampoline() => retprobe::hooked_return(slot).unwrap_or(0) as u64,
        Some(a) => a,
        None => 0,
    }
}

/// The bytes of `ri->data` a timed call keeps from its entry to its return: the clock
/// reading, and where its function's words are in the thread's block (0 without a block).
/// A return runs on the thread of its entry (its record is in that thread's return stack), so
/// the return finds the block without looking it up again.
pub const LATENCY_DATA: usize = 16;

fn data(ri: *mut UretprobeInstance) -> *mut [u64; 2] {
    (ri as usize + core::mem::size_of::<UretprobeInstance>()) as *mut [u64; 2]
}

/// The entry handler of every timed function: notes the time and counts the call.
/// Vector-free, as the counting handler.
///
/// # Safety
/// Called by the core with an instance of a trace `ReturnProbe` whose `data_size` is
/// [`LATENCY_DATA`].
pub unsafe extern "C" fn latency_entry(ri: *mut UretprobeInstance, regs: *mut PtRegs) -> c_int {
    // SAFETY: as in `on_return`.
    let index = unsafe { (*((*ri).rp as *mut ReturnProbe)).event };
    let mut words = 0;
    if let Some((plans, _)) = plan::get(index).filter(|(_, p)| p.gated) {
        // SAFETY: the core passes the entry's registers, valid for the call.
        if !passes(plans, index, unsafe { &*regs }) {
            // Not timed: its return is not probed.
            return 1;
        }
    }
    if let (Some((plans, p)), Some(b)) = (plan::get(index), blocks::mine()) {
        if let Some(l) = p.latency {
            let mut at = plans.latencies[l].at;
            if let (Some(parts), Some(ev)) = (&p.key, events::get(index)) {
                // The key of the call, at its entry: its numbers go to the key's slot (to
                // the function's own words when the key finds no room).
                let mut space = core::mem::MaybeUninit::uninit();
                // SAFETY: the core passes the entry's registers, valid for the call.
                let regs = unsafe { &*regs };
                let slot = key_of(plans, parts, b, ev, index, regs, 0, &mut space)
                    .and_then(|(tag, words)| b.slot(&plans.layout, tag | WHAT_TIMED << WHAT_SHIFT, words));
                if let Some(s) = slot {
                    at = s + plans.layout.values;
                }
            }
            words = entered(b, at);
        }
    }
    // SAFETY: the instance's data holds the LATENCY_DATA bytes the probe asked for.
    unsafe { data(ri).write([clock::ticks(), words as u64]) };
    0
}

/// The return handler of every timed function: the call's time from its entry.
///
/// # Safety
/// As [`latency_entry`].
pub unsafe extern "C" fn latency_return(ri: *mut UretprobeInstance, _regs: *mut PtRegs) {
    let now = clock::ticks();
    // SAFETY: as in `latency_entry`; the entry handler wrote the data.
    let [started, words] = unsafe { data(ri).read() };
    if words == 0 {
        // SAFETY: as in `on_return`.
        return no_block(unsafe { (*((*ri).rp as *mut ReturnProbe)).event });
    }
    add_call(Block::from_word(words as usize), started, now);
}

/// Counts a timed call's entry in the function's words at `at` of the thread's block `b`;
/// gives where those words are, for the call's return.
#[inline(always)]
pub fn entered(b: Block, at: usize) -> usize {
    b.add(at + ENTERED, 1);
    b.address_of(at)
}

/// Adds a timed call, from its entry's reading `started` to its return's `now`, to the
/// function's words `b` in the thread's block (numbered from 0).
#[inline(always)]
pub fn add_call(b: Block, started: u64, now: u64) {
    let ns = ((u128::from(now.saturating_sub(started)) * u128::from(NS_PER_TICK.load(Ordering::Relaxed))) >> 32) as u64;
    let calls = b.get(CALLS);
    b.set(CALLS, calls + 1);
    b.add(TOTAL, ns);
    if calls == 0 || ns < b.get(MIN) {
        b.set(MIN, ns);
    }
    if ns > b.get(MAX) {
        b.set(MAX, ns);
    }
    b.add(LAT_HIST + log2_index(ns), 1);
    if INTERVALS.load(Ordering::Relaxed) {
        interval_extremes(b, ns);
    }
}

/// Min and max of the interval being counted: two sets, one per parity of the epoch, each
/// tagged with the epoch (plus one) it holds; the first call of an epoch starts its set over.
fn interval_extremes(b: Block, ns: u64) {
    let epoch = EPOCH.load(Ordering::Relaxed);
    let set = SETS + 3 * (epoch as usize & 1);
    if b.get(set) != epoch + 1 {
        b.set(set + 1, ns);
        b.set(set + 2, ns);
        b.publish(set, epoch + 1);
        return;
    }
    if ns < b.get(set + 1) {
        b.set(set + 1, ns);
    }
    if ns > b.get(set + 2) {
        b.set(set + 2, ns);
    }
}
