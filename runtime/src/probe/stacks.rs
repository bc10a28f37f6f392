//! User stacks at a hit: the unwind rows of every loaded module (the main program, its
//! libraries, those `dlopen`ed later, the vDSO), compiled when a run first asks for stacks
//! ([`enable`]) and again after each `dlopen`/`dlclose` ([`refresh`]), and the walk a hit
//! makes over them ([`walk`]).
//!
//! The walk starts from the hit's registers and follows one rule per frame
//! (`insn::unwind`): no lock, no system call, no allocation; stack words are read with the
//! fault-safe copy, so a corrupt stack ends with [`CORRUPT`] and never harms the program. A
//! return address replaced by the return-probe trampoline is read back as the real one; a
//! signal frame continues into the interrupted code. A module without call-frame information
//! is followed by its frame pointers (said once, when its tables are made).
//!
//! Context: [`walk`] on the hit paths, inside the handler's read-side section (a replaced
//! module list is freed only after a grace period); the rest in normal context.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};

use object::{Object, ObjectSegment};

use crate::base::abi::PtRegs;
use crate::base::maps::{self, Mapping};
use crate::base::{elf, output, sys, usercopy};
use crate::insn::stub::{BODY_OFFSET, STUB_SIZE};
use crate::insn::unwind::{self, Regs, Step};
use crate::probe::ssol::SLOT_SIZE;
use crate::probe::{rcu, retprobe, table};

/// The deepest stack a walk gives (`ustack:DEPTH`).
pub const MAX_DEPTH: usize = 127;
/// The frame a walk ends with when the stack could not be read or went the wrong way.
pub const CORRUPT: u64 = 1;

/// One executable range of a module, with its rows (empty: frame pointers).
struct Range {
    start: usize,
    end: usize,
    bias: usize,
    rows: Arc<unwind::Table>,
}

struct List {
    ranges: Vec<Range>,
}

static LIST: AtomicPtr<List> = AtomicPtr::new(core::ptr::null_mut());
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Load biases and tables already made, by (path, inode, first mapping's start): reused
/// across refreshes.
type Made = HashMap<(String, u64, usize), (usize, Arc<unwind::Table>)>;
static MADE: Mutex<Option<Made>> = Mutex::new(None);

/// Makes the tables of the modules loaded now and keeps them current from here on
/// (start-up, before any probe that walks stacks is placed).
pub fn enable() {
    ENABLED.store(true, Ordering::Release);
    refresh();
}

/// After a `dlopen` or `dlclose`: tables for what is mapped now (when stacks are asked).
pub fn refresh() {
    if !ENABLED.load(Ordering::Acquire) {
        return;
    }
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let made = made.get_or_insert_with(HashMap::new);
    let maps = maps::current();
    let mut ranges = Vec::new();
    let mut live = Vec::new();
    for m in elf::loaded_modules(&maps) {
        let key = (m.path.clone(), m.inode, m.first_start);
        let (bias, rows) = match made.get(&key) {
            Some(known) => known.clone(),
            None => {
                let Some(bias) = made_bias(&m.path, m.first_start, m.first_offset) else { continue };
                let rows = Arc::new(unwind::Table::new(&file_rows(&m.path)));
                made.insert(key.clone(), (bias, rows.clone()));
                (bias, rows)
            }
        };
        for &(start, end) in &m.text {
            ranges.push(Range { start, end, bias, rows: rows.clone() });
        }
        live.push(key);
    }
    if let Some(range) = vdso(&maps) {
        ranges.push(range);
    }
    made.retain(|k, _| live.contains(k));
    ranges.sort_unstable_by_key(|r| r.start);
    let old = LIST.swap(Box::into_raw(Box::new(List { ranges })), Ordering::AcqRel);
    if !old.is_null() {
        rcu::synchronize();
        // SAFETY: unpublished above, and no walk that could have read it is still running.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// The load bias of the module file at `path` whose lowest mapping (of file offset
/// `offset`) starts at `start`.
fn made_bias(path: &str, start: usize, offset: usize) -> Option<usize> {
    let file = sys::map_file(&CString::new(path).ok()?).ok()?;
    let obj = object::File::parse(file.bytes()).ok()?;
    let page = |v: u64| v & !(sys::PAGE_SIZE as u64 - 1);
    let seg = obj.segments().find(|s| page(s.file_range().0) == offset as u64)?;
    Some(start.wrapping_sub(page(seg.address()) as usize))
}

/// The rows of the module file at `path`; none (and it is said) where it has no CFI.
fn file_rows(path: &str) -> Vec<unwind::Row> {
    let rows = CString::new(path).ok().and_then(|c| sys::map_file(&c).ok()).and_then(|f| unwind::compile(f.bytes()));
    rows.unwrap_or_else(|| {
        output::message(format_args!(
            "stacks: {path} has no call-frame information (.eh_frame): its frames are followed by frame pointers"
        ));
        Vec::new()
    })
}

/// The vDSO's range and rows, read from its image in memory.
fn vdso(maps: &[Mapping]) -> Option<Range> {
    let m = maps.iter().find(|m| m.path == "[vdso]" && m.read)?;
    let (start, end) = (m.start as usize, m.end as usize);
    // SAFETY: the vDSO mapping is readable for its whole length for the life of the process.
    let image = unsafe { core::slice::from_raw_parts(start as *const u8, end - start) };
    let obj = object::File::parse(image).ok()?;
    let first = obj.segments().map(|s| s.address()).min()?;
    let rows = unwind::compile(image)?;
    Some(Range { start, end, bias: start.wrapping_sub(first as usize), rows: Arc::new(unwind::Table::new(&rows)) })
}

/// Where a `pc` in code the runtime made stands in the probed function: in a jump probe's
/// stub, the place of the relocated instruction in the patched range (its head: the probed
/// instruction); in an out-of-line slot, that of the displaced instruction or just past it
/// (hit path: the probe table is read without a lock).
fn relocated(pc: usize) -> Option<usize> {
    for pp in table::points() {
        if let Ok(j) = &pp.jump {
            if j.stub <= pc && pc < j.stub + STUB_SIZE {
                return Some(pp.addr + pc.saturating_sub(j.stub + BODY_OFFSET).min(j.patch_len));
            }
        }
        if pp.slot != 0 && pp.slot <= pc && pc < pp.slot + SLOT_SIZE {
            return Some(pp.addr + (pc - pp.slot).min(pp.len));
        }
    }
    None
}

fn range_of(list: &List, pc: usize) -> Option<&Range> {
    let i = list.ranges.partition_point(|r| r.start <= pc);
    list.ranges[..i].last().filter(|r| pc < r.end)
}

/// The user stack at a hit with registers `regs`, innermost first, into `out` (its length is
/// the depth): how many frames were written. The last is [`CORRUPT`] when the stack could
/// not be followed to its end (hit path).
pub fn walk(regs: &PtRegs, out: &mut [u64]) -> usize {
    // SAFETY: published by `refresh`, freed only after a grace period; the caller is in a
    // read-side section (a handler).
    let Some(list) = (unsafe { LIST.load(Ordering::Acquire).as_ref() }) else { return 0 };
    let mut read = |at: u64| usercopy::read_u64(at as usize);
    let mut r = Regs { rip: regs.rip, rsp: regs.rsp, rbp: regs.rbp };
    // Whether `rip` is where the frame stands (the hit, an interrupted instruction) rather
    // than a return address, which may lie past the end of a call's function.
    let mut exact = true;
    let mut n = 0;
    let mut last = None;
    let mut memo = None;
    while n < out.len() {
        let at = |rip: u64| if exact { rip } else { rip.wrapping_sub(1) } as usize;
        // Callers are mostly in the module of their callee: that one is tried first.
        let near = last.filter(|m: &&Range| m.start <= at(r.rip) && at(r.rip) < m.end);
        let mut range = near.or_else(|| range_of(list, at(r.rip)));
        if range.is_none() {
            // Code the runtime relocated (an interrupted syscall in a stub, a call's return
            // into a slot): the same place in the probed function.
            if let Some(orig) = relocated(r.rip as usize) {
                r.rip = orig as u64;
                range = range_of(list, at(r.rip));
            }
        }
        let pc = at(r.rip);
        out[n] = r.rip;
        n += 1;
        let Some(range) = range else { break };
        last = Some(range);
        let step = if range.rows.is_empty() {
            unwind::frame_pointer_step(&r, &mut read)
        } else {
            // A recursion's frames share their return address, and so their rule.
            let rule = match memo {
                Some((at, rule)) if at == pc => rule,
                _ => range.rows.rule_at(pc.wrapping_sub(range.bias) as u64),
            };
            memo = Some((pc, rule));
            // Where a module with tables has no rule, %rbp is no frame pointer to trust.
            unwind::step(rule, &r, &mut read)
        };
        let (mut next, slot) = match step {
            Step::Caller { regs, slot } => (regs, slot),
            Step::End => break,
            Step::Fault => {
                if n < out.len() {
                    out[n] = CORRUPT;
                    n += 1;
                }
                break;
            }
        };
        if slot != 0 && next.rip as usize == retprobe::trampoline() {
            next.rip = retprobe::hooked_return(slot as usize).unwrap_or(0) as u64;
        }
        // A caller's frame lies above its callee's (a signal frame may switch stacks).
        if next.rip == 0 || (slot != 0 && next.rsp <= r.rsp) {
            if next.rip != 0 && n < out.len() {
                out[n] = CORRUPT;
                n += 1;
            }
            break;
        }
        exact = slot == 0;
        r = next;
    }
    n
}
