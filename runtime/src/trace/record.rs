//! The recording handlers: what a hit of an event does. They run on the hit path (signal
//! context on the `int3` path, stub or trampoline context otherwise), with the thread marked
//! busy by the core: no allocation, no lock, no system call, no libc; memory the program
//! names is read with `base::usercopy`, so a bad pointer costs a fault signal and is recorded
//! as a fault.
//!
//! A record, in the thread's ring (little-endian, 8-byte aligned):
//!
//! ```text
//! 0  u32 size   4 u32 event   8 u64 clock reading   16 u64 address (the probe; a return
//! event: the function)   24 u16 cpu   26 u16 flags (CALLER: a caller word follows)
//! 28 u32 fault bits (bit i: fetcharg i could not be read)   [32 u64 caller: return events]
//! then the fetchargs, in order:
//!    a number: u64 (as read, not yet extended or cut to its bitfield)
//!    an array of N numbers: N u64s
//!    a string: u32 length, then its bytes; FAULT for a fault, COMM for `$comm`
//!    an array of N strings: N strings
//!    `$optimized_out`: nothing
//!    a stack (`$ustack`): u32 frames, u32 0, then the frames' addresses, innermost first
//!    (the last `probe::stacks::CORRUPT` where the stack could not be followed)
//! ```

use crate::base::abi::{PtRegs, Uprobe, UretprobeInstance};
use crate::base::usercopy;
use crate::probe::stacks;
use crate::trace::buffers::{self, Full, Writer};
use crate::trace::events::{self, EntryProbe, Event, ReturnProbe};
use crate::trace::fetch::{Base, Fetch, FetchArg};
use crate::trace::read::{address, arg_value, fetch_number};
use crate::trace::{clock, filter};

/// The fixed part of every record; a return event's caller word follows it.
pub const HEADER_LEN: usize = 32;
/// Flag: the caller word follows the fixed part.
pub const CALLER: u16 = 1;
/// A string's length word for a string that could not be read.
pub const FAULT: u32 = u32::MAX;
/// A string's length word for `$comm`, which the drain thread fills in.
pub const COMM: u32 = u32::MAX - 1;
/// The longest string kept (the kernel's limit, less its NUL).
pub const MAX_STRING: usize = 4095;

/// The size of a record of `args` without the caller word, where each is one number read
/// as `trace::read::fetch_number` reads it (a register, a stack slot, memory, a constant):
/// a record whose size is known before its hit; None where one is a string, an array,
/// `$comm`, `$ustack` or `$optimized_out`.
pub fn numbers_only(args: &[FetchArg]) -> Option<usize> {
    let number = |a: &FetchArg| {
        a.ty.count.is_none()
            && a.ty.base != Base::String
            && !matches!(a.fetch, Fetch::Comm | Fetch::ImmediateString(_) | Fetch::OptimizedOut | Fetch::Ustack(_))
    };
    args.iter().all(number).then(|| HEADER_LEN + 8 * args.len())
}

/// The entry handler of every entry event.
///
/// # Safety
/// Called by the core with its probe object (an [`EntryProbe`]) and the registers.
pub unsafe extern "C" fn on_entry(u: *mut Uprobe, regs: *mut PtRegs) {
    // SAFETY: the core passes the registered object, which is an EntryProbe, and the hit's
    // registers, valid for the call.
    let (index, regs) = unsafe { ((*(u as *mut EntryProbe)).event, &*regs) };
    if let Some(ev) = events::get(index) {
        if !ev.gated || admitted(ev, regs) {
            record(ev, index, regs, regs.rip, 0);
        }
    }
}

/// The return handler of every return event.
///
/// # Safety
/// Called by the core with the instance of a [`ReturnProbe`] and the registers.
pub unsafe extern "C" fn on_return(ri: *mut UretprobeInstance, regs: *mut PtRegs) {
    // SAFETY: as in `on_entry`; the instance names its return probe, a ReturnProbe.
    let (index, func, caller, regs) = unsafe {
        let rp = (*ri).rp;
        ((*(rp as *mut ReturnProbe)).event, (*rp).u.vaddr, (*ri).ret_addr, &*regs)
    };
    if let Some(ev) = events::get(index) {
        if !ev.gated || admitted(ev, regs) {
            record(ev, index, regs, func, caller);
        }
    }
}

/// Whether a hit of gated event `ev` is recorded (`filter::admit`, vector-free as the
/// handlers here are declared: the `hit_code` test reads it).
#[inline(always)]
fn admitted(ev: &Event, regs: &PtRegs) -> bool {
    filter::admit(ev, regs, true) == Some(true)
}

#[inline(always)]
fn record(ev: &Event, index: u32, regs: &PtRegs, addr: u64, caller: u64) {
    // A return's time is its first thing; an entry's is read once the thread has its ring (a
    // thread's first record claims one and faults its first page in: no part of the call).
    let at_return = (caller != 0).then(clock::now);
    if buffers::closed() || !filter::take_record() {
        return;
    }
    let Some(ring) = buffers::mine() else {
        ev.dropped.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        return;
    };
    let (clock, cpu) = at_return.unwrap_or_else(clock::now);
    let header = Header { index, clock, addr, caller, cpu };
    let mut w = ring.writer(false);
    // A record of numbers only is written here, inlined: no writer handed to a call.
    let first = match ev.fixed_len {
        0 => write(&mut w, ev, regs, &header),
        _ => write_numbers(&mut w, ev, regs, &header),
    };
    if first.is_ok() && w.commit().is_ok() {
        return;
    }
    // No room by the tail as last read: read it again.
    if ring.catch_up() {
        let mut w = ring.writer(false);
        if write(&mut w, ev, regs, &header).is_ok() && w.commit().is_ok() {
            return;
        }
    }
    // No room before the ring's end: start over at its start, where the drain made room.
    if ring.writer(false).may_wrap() {
        let mut w = ring.writer(true);
        if write(&mut w, ev, regs, &header).is_ok() && w.commit().is_ok() {
            return;
        }
    }
    ev.dropped.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
}

struct Header {
    index: u32,
    clock: u64,
    addr: u64,
    caller: u64,
    cpu: u32,
}

fn write(w: &mut Writer, ev: &Event, regs: &PtRegs, h: &Header) -> Result<(), Full> {
    if ev.fixed_len != 0 {
        return write_numbers(w, ev, regs, h);
    }
    // Kept small: at these rates, the bytes written are most of a record's cost.
    w.put_u32(0)?;
    w.put_u32(h.index)?;
    w.put_u64(h.clock)?;
    w.put_u64(h.addr)?;
    let flags = if h.caller != 0 { CALLER } else { 0 };
    w.put_u32(h.cpu & 0xffff | u32::from(flags) << 16)?;
    w.put_u32(0)?;
    if h.caller != 0 {
        w.put_u64(h.caller)?;
    }
    let mut faults = 0u32;
    let file_base = ev.file_base.load(core::sync::atomic::Ordering::Relaxed);
    for (i, arg) in ev.args.iter().enumerate() {
        if !fetch_arg(w, arg, regs, file_base)? {
            faults |= 1 << i;
        }
    }
    w.patch_u32(28, faults);
    Ok(())
}

/// [`write`] for an event whose fetchargs are all numbers (`Event::fixed_len`): the same
/// bytes, stored as words into room taken at once.
#[inline(always)]
fn write_numbers(w: &mut Writer, ev: &Event, regs: &PtRegs, h: &Header) -> Result<(), Full> {
    let with_caller = h.caller != 0;
    let words = w.words(ev.fixed_len + if with_caller { 8 } else { 0 })?;
    let (head, values) = words.split_at_mut(HEADER_LEN / 8 + usize::from(with_caller));
    // One store each: the compiler would move the header's neighbouring words through a
    // vector register, which the hit path may not touch.
    let store = |slot: &mut u64, v: u64| {
        // SAFETY: a word of the record being written, a valid and aligned place.
        unsafe { core::ptr::write_volatile(slot, v) }
    };
    store(&mut head[0], u64::from(h.index) << 32);
    store(&mut head[1], h.clock);
    store(&mut head[2], h.addr);
    if with_caller {
        store(&mut head[4], h.caller);
    }
    let file_base = ev.file_base.load(core::sync::atomic::Ordering::Relaxed);
    let mut faults = 0u32;
    for (i, (arg, slot)) in ev.args.iter().zip(values.iter_mut()).enumerate() {
        let v = fetch_number(arg, regs, file_base);
        faults |= u32::from(v.is_none()) << i;
        *slot = v.unwrap_or(0);
    }
    let flags = if with_caller { CALLER } else { 0 };
    store(&mut head[3], u64::from(h.cpu & 0xffff | u32::from(flags) << 16) | u64::from(faults) << 32);
    Ok(())
}

/// Writes one fetcharg; Ok(false) for a fault (the slot is still written, zero).
fn fetch_arg(w: &mut Writer, arg: &FetchArg, regs: &PtRegs, file_base: u64) -> Result<bool, Full> {
    let count = arg.ty.count.unwrap_or(1) as usize;
    match (&arg.fetch, arg.ty.base) {
        (Fetch::Comm, _) => w.put_u32(COMM).map(|()| true),
        // Known before the run to have no value here: nothing to record.
        (Fetch::OptimizedOut, _) => Ok(true),
        (Fetch::Ustack(depth), _) => {
            let mut frames = [core::mem::MaybeUninit::<u64>::uninit(); stacks::MAX_DEPTH];
            let frames = stacks::walk_into(regs, &mut frames[..usize::from(*depth).min(stacks::MAX_DEPTH)]);
            w.put_u32(frames.len() as u32)?;
            w.put_u32(0)?;
            let mut next = frames.iter();
            repeat(w, frames.len(), |w| w.put_u64(next.next().copied().unwrap_or(0)))?;
            Ok(true)
        }
        (Fetch::ImmediateString(s), _) => {
            let s = &s[..s.len().min(MAX_STRING)];
            w.put_u32(s.len() as u32)?;
            w.put(s).map(|()| true)
        }
        (f, Base::String) => {
            let Some(at) = address(f, regs, file_base) else {
                return repeat(w, count, |w| w.put_u32(FAULT)).map(|()| false);
            };
            let mut all = true;
            for i in 0..count {
                // An array of strings holds pointers; a single string is read where it is.
                let start = if arg.ty.count.is_some() { usercopy::read_u64(at as usize + 8 * i) } else { Some(at) };
                all &= string(w, start)?;
            }
            Ok(all)
        }
        (f, _) => {
            let size = usize::from(arg.ty.size);
            let at = match f {
                Fetch::Memory(_) | Fetch::FileOffset(_) | Fetch::Deref { .. } => address(f, regs, file_base),
                _ => {
                    let v = arg_value(arg, regs, file_base);
                    w.put_u64(v.unwrap_or(0))?;
                    return Ok(v.is_some());
                }
            };
            let Some(a) = at else {
                return repeat(w, count, |w| w.put_u64(0)).map(|()| false);
            };
            let mut ok = true;
            for i in 0..count {
                let mut b = [0u8; 8];
                ok &= usercopy::copy(&mut b[..size], a as usize + i * size);
                w.put_u64(if ok { u64::from_le_bytes(b) } else { 0 })?;
            }
            Ok(ok)
        }
    }
}

/// `put` `n` times, one word at a time: the compiler would fill such a run with vector
/// stores, which the hit path may not use (the record handlers are declared vector-free).
fn repeat(w: &mut Writer, n: usize, mut put: impl FnMut(&mut Writer) -> Result<(), Full>) -> Result<(), Full> {
    for _ in 0..n {
        put(core::hint::black_box(&mut *w))?;
    }
    Ok(())
}

/// Writes the string at `at`: its length and bytes, or FAULT.
fn string(w: &mut Writer, at: Option<u64>) -> Result<bool, Full> {
    w.put_u32(0)?;
    let len_at = w.len - 4;
    let room = w.room();
    let max = room.len().min(MAX_STRING);
    let got = at.and_then(|a| usercopy::strncpy(&mut room[..max], a as usize));
    match got {
        // Cut by the room left, not by the string's end: the record does not fit here.
        Some(n) if n == max && max < MAX_STRING => Err(Full),
        Some(n) => {
            w.advance(n);
            w.patch_u32(len_at, n as u32);
            Ok(true)
        }
        None => {
            w.patch_u32(len_at, FAULT);
            Ok(false)
        }
    }
}
