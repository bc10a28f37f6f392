//! The hit-time reads of fetchargs: values and strings from the registers and the program's
//! memory (through `base::usercopy`: a bad pointer is a fault, reported, never a crash), for
//! the records (`record`), the aggregations' keys and histograms, and the predicates, which
//! run here, before anything is recorded or counted ([`passes`]; the program itself is
//! `uprobe_contracts::filter::Program`, compiled by `uprobe-run`).
//!
//! Context: the hit path (signal, stub or trampoline context, thread busy: no allocation, no
//! lock, no libc; a system call only at a thread's first hit whose predicate reads `tid` or
//! `comm`).

use core::sync::atomic::Ordering;

use uprobe_contracts::filter::{self as program, Field, Fields, StrOp};

use crate::base::abi::PtRegs;
use crate::base::{sys, usercopy};
use crate::probe::thread;
use crate::trace::clock;
use crate::trace::events::Event;
use crate::trace::fetch::{Base, Fetch, FetchArg};

/// The registers as the 21 words of `struct pt_regs`.
fn word(regs: &PtRegs, i: u8) -> u64 {
    let words: &[u64; 21] =
        // SAFETY: PtRegs is repr(C) with exactly 21 u64 fields (checked by its layout test).
        unsafe { &*(regs as *const PtRegs as *const [u64; 21]) };
    words[usize::from(i).min(20)]
}

/// A value that is not read from memory at its last step, or None for a fault on the way.
#[inline]
pub fn value(f: &Fetch, regs: &PtRegs, file_base: u64) -> Option<u64> {
    match f {
        Fetch::Reg(r) => Some(word(regs, r.0)),
        Fetch::Xmm(n) => xmm(*n),
        Fetch::StackPointer => Some(regs.rsp),
        Fetch::Stack(n) => usercopy::read_u64(regs.rsp as usize + 8 * *n as usize),
        Fetch::Retval => Some(regs.rax),
        Fetch::Arg(n) => Some(match n {
            1 => regs.rdi,
            2 => regs.rsi,
            3 => regs.rdx,
            4 => regs.rcx,
            5 => regs.r8,
            6 => regs.r9,
            // At a function's entry the return address is at %rsp, the 7th argument above it.
            n => return usercopy::read_u64(regs.rsp as usize + 8 * (*n as usize - 6)),
        }),
        Fetch::Immediate(v) => Some(*v),
        Fetch::Indexed { base, index, scale } => {
            Some(word(regs, base.0).wrapping_add(word(regs, index.0).wrapping_mul(u64::from(*scale))))
        }
        Fetch::Memory(_) | Fetch::FileOffset(_) | Fetch::Deref { .. } => {
            usercopy::read_u64(address(f, regs, file_base)? as usize)
        }
        // A stack is no one number: it is recorded whole (`record`), never compared.
        Fetch::Comm | Fetch::ImmediateString(_) | Fetch::OptimizedOut | Fetch::Ustack(_) => None,
    }
}

/// The low 8 bytes of `%xmmN` as the hit saved them (None where they were not saved).
fn xmm(n: u8) -> Option<u64> {
    match thread::current().vectors.get() {
        0 => None,
        at => usercopy::read_u64(at + 16 * usize::from(n)),
    }
}

/// A fetcharg's value where no memory is read at its last step: [`value`], but a `float` or
/// `double` `$retval` is `%xmm0`'s.
#[inline]
pub fn arg_value(arg: &FetchArg, regs: &PtRegs, file_base: u64) -> Option<u64> {
    match arg.xmm() {
        Some(n) => xmm(n),
        None => value(&arg.fetch, regs, file_base),
    }
}

/// The address a memory fetch reads at its last step.
pub fn address(f: &Fetch, regs: &PtRegs, file_base: u64) -> Option<u64> {
    match f {
        Fetch::Memory(a) => Some(*a),
        Fetch::FileOffset(o) if file_base != 0 => Some(file_base.wrapping_add(*o)),
        Fetch::Deref { offset, inner } => Some(value(inner, regs, file_base)?.wrapping_add(*offset as u64)),
        _ => None,
    }
}

/// A number fetcharg's value as a record would hold it (as read, not yet cut to its type or
/// bitfield), or None for a fault; for front-ends that use values without recording them
/// (aggregation). Hit path.
#[inline]
pub fn fetch_number(arg: &FetchArg, regs: &PtRegs, file_base: u64) -> Option<u64> {
    match &arg.fetch {
        f @ (Fetch::Memory(_) | Fetch::FileOffset(_) | Fetch::Deref { .. }) => {
            let at = address(f, regs, file_base)?;
            let mut b = [0u8; 8];
            usercopy::copy(&mut b[..usize::from(arg.ty.size).min(8)], at as usize).then(|| u64::from_le_bytes(b))
        }
        _ => arg_value(arg, regs, file_base),
    }
}

/// A string fetcharg's bytes, copied into `out` (cut at its length): how many, or None for a
/// fault. `$comm` is not known here (None). Hit path.
pub fn fetch_string(arg: &FetchArg, regs: &PtRegs, file_base: u64, out: &mut [u8]) -> Option<usize> {
    match &arg.fetch {
        Fetch::ImmediateString(s) => {
            let n = s.len().min(out.len());
            out[..n].copy_from_slice(&s[..n]);
            Some(n)
        }
        Fetch::Comm => None,
        f => usercopy::strncpy(out, address(f, regs, file_base)? as usize),
    }
}

/// A hit's values, read on demand.
struct Hit<'a> {
    ev: &'a Event,
    regs: &'a PtRegs,
    file_base: u64,
}

impl Fields for Hit<'_> {
    #[inline(always)]
    fn number(&mut self, field: Field) -> Option<u64> {
        match field {
            Field::Arg(i) => {
                let arg = self.ev.args.get(usize::from(i))?;
                let v = arg.ty.bits(fetch_number(arg, self.regs, self.file_base)?);
                Some(match arg.ty.base {
                    Base::Signed if arg.ty.bitfield.is_none() => arg.ty.sign_extend(v) as u64,
                    _ => v,
                })
            }
            Field::Retval => Some(self.regs.rax),
            Field::Tid => Some(tid() as i64 as u64),
            Field::Cpu => Some(u64::from(clock::cpu())),
            Field::Comm => None,
        }
    }

    #[inline]
    fn string(&mut self, field: Field, buf: &mut [u8]) -> Option<usize> {
        match field {
            Field::Arg(i) => {
                let arg = self.ev.args.get(usize::from(i))?;
                if arg.fetch == Fetch::Comm {
                    return Some(comm(buf));
                }
                fetch_string(arg, self.regs, self.file_base, buf)
            }
            Field::Comm => Some(comm(buf)),
            _ => None,
        }
    }

    /// With the vector registers saved: the filters run on hit paths that did not save them.
    #[cold]
    fn compare_string(&mut self, field: Field, op: StrOp, pattern: &[u8]) -> Option<bool> {
        let mut result = None;
        crate::insn::vector::saving_vectors(|| result = program::compare_string(self, field, op, pattern));
        result
    }
}

/// The calling thread's id (a system call at its first use on the thread).
fn tid() -> i32 {
    let state = thread::current();
    match state.filter_tid.get() {
        0 => {
            let t = sys::gettid();
            state.filter_tid.set(t);
            t
        }
        t => t,
    }
}

/// The calling thread's name into `buf`: its length. Read at the thread's first use, so a
/// name it takes after its first filtered hit is not seen.
fn comm(buf: &mut [u8]) -> usize {
    let state = thread::current();
    let mut name = state.filter_comm.get();
    if name[0] == 0 {
        name = sys::thread_name();
        state.filter_comm.set(name);
    }
    let n = name.iter().position(|&b| b == 0).unwrap_or(16).min(buf.len());
    buf[..n].copy_from_slice(&name[..n]);
    n
}

/// Whether the hit of `ev` passes its filter (always, without one). The caller counts (the
/// stream in the event, aggregations in the thread's block).
#[inline(always)]
pub fn passes(ev: &Event, regs: &PtRegs) -> bool {
    match &ev.filter {
        None => true,
        Some(program) => program.passes(&mut Hit { ev, regs, file_base: ev.file_base.load(Ordering::Relaxed) }),
    }
}
