//! User stacks at a hit: the unwind rows of every loaded module (the main program, its
//! libraries, those `dlopen`ed later, the vDSO), compiled when a run first asks for stacks
//! ([`enable`]) and again after each `dlopen`/`dlclose` ([`refresh`]), and the walk a hit
//! makes over them ([`walk`]).
//!
//! The walk starts from the hit's registers and follows one rule per frame
//! (`insn::unwind`), found first in a direct-mapped cache of the addresses seen before (one
//! word each: the address and the rule's index among the list's rules; a new list, made at
//! each refresh, starts with an empty one), else in the module's table, whose answer is
//! then kept there: no lock, no system call, no allocation; stack words are read with the
//! fault-safe copy, so a corrupt stack ends with [`CORRUPT`] and never harms the program. A
//! return address replaced by the return-probe trampoline is read back as the real one; a
//! signal frame continues into the interrupted code. A module without call-frame information
//! is followed by its frame pointers (said once, when its tables are made).
//!
//! Context: [`walk`] on the hit paths, inside the handler's read-side section (a replaced
//! module list is freed only after a grace period); the rest in normal context.

use std::collections::HashMap;
use std::ffi::CString;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use object::{Object, ObjectSegment};

use crate::base::abi::PtRegs;
use crate::base::maps::{self, Mapping};
use crate::base::{elf, output, sys, usercopy};
use crate::insn::stub::{BODY_OFFSET, STUB_SIZE};
use crate::insn::unwind::{self, Regs, Rule, Step};
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
    /// Where its table's rules start in the list's `rules`.
    first_id: usize,
}

struct List {
    ranges: Vec<Range>,
    /// The rules of every range's table, one table's after another; first
    /// `Rule::FramePointers`, the rule of every address in a module without tables.
    rules: Vec<Rule>,
    /// [`CACHE_SLOTS`] words, each 0 or `pc << 16 | index in rules` for an address looked up.
    cache: Box<[AtomicU64]>,
}

const CACHE_BITS: u32 = 12;
const CACHE_SLOTS: usize = 1 << CACHE_BITS;
/// Addresses a cache word can hold (below 2^48) and rule indices (below 2^16).
const CACHE_PC_LIMIT: usize = 1 << 48;
const CACHE_IDS: usize = 1 << 16;

impl List {
    fn new(mut ranges: Vec<Range>) -> List {
        ranges.sort_unstable_by_key(|r| r.start);
        let mut rules = vec![Rule::FramePointers];
        let mut placed: Vec<(*const unwind::Table, usize)> = Vec::new();
        for r in &mut ranges {
            if r.rows.is_empty() {
                continue;
            }
            let table = Arc::as_ptr(&r.rows);
            r.first_id = match placed.iter().find(|p| p.0 == table) {
                Some(&(_, at)) => at,
                None => {
                    let at = rules.len();
                    placed.push((table, at));
                    rules.extend_from_slice(r.rows.rules());
                    at
                }
            };
        }
        List { ranges, rules, cache: (0..CACHE_SLOTS).map(|_| AtomicU64::new(0)).collect() }
    }

    /// The rule for run-time address `pc`, None when no module holds it; `near`: the range
    /// of the last lookup that missed the cache, tried first (hit path).
    #[inline]
    fn rule_at<'a>(&'a self, pc: usize, near: &mut Option<&'a Range>) -> Option<&'a Rule> {
        let cacheable = (sys::PAGE_SIZE..CACHE_PC_LIMIT).contains(&pc);
        let slot = &self.cache[((pc as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - CACHE_BITS)) as usize];
        let word = slot.load(Ordering::Relaxed);
        if cacheable && (word >> 16) as usize == pc {
            return self.rules.get((word & 0xffff) as usize);
        }
        // Callers are mostly in the module of their callee: that one is tried first.
        let range = near.filter(|r| r.start <= pc && pc < r.end).or_else(|| range_of(self, pc))?;
        *near = Some(range);
        let id = if range.rows.is_empty() {
            0
        } else {
            range.first_id + range.rows.id_at(pc.wrapping_sub(range.bias) as u64) as usize
        };
        if cacheable && id < CACHE_IDS {
            slot.store((pc as u64) << 16 | id as u64, Ordering::Relaxed);
        }
        self.rules.get(id)
    }
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
            ranges.push(Range { start, end, bias, rows: rows.clone(), first_id: 0 });
        }
        live.push(key);
    }
    if let Some(range) = vdso(&maps) {
        ranges.push(range);
    }
    made.retain(|k, _| live.contains(k));
    let old = LIST.swap(Box::into_raw(Box::new(List::new(ranges))), Ordering::AcqRel);
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
    let rows = Arc::new(unwind::Table::new(&rows));
    Some(Range { start, end, bias: start.wrapping_sub(first as usize), rows, first_id: 0 })
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
    // SAFETY: `MaybeUninit<u64>` has `u64`'s layout, and every `u64` is a valid one; what
    // `walk_into` writes are `u64`s.
    let out = unsafe { &mut *(out as *mut [u64] as *mut [MaybeUninit<u64>]) };
    walk_into(regs, out).len()
}

/// [`walk`] into a buffer that need not be initialized: the frames written (hit path).
pub fn walk_into<'a>(regs: &PtRegs, out: &'a mut [MaybeUninit<u64>]) -> &'a [u64] {
    let n = walk_frames(regs, out);
    // SAFETY: `walk_frames` wrote the first `n` elements.
    unsafe { core::slice::from_raw_parts(out.as_ptr().cast::<u64>(), n) }
}

fn walk_frames(regs: &PtRegs, out: &mut [MaybeUninit<u64>]) -> usize {
    // SAFETY: published by `refresh`, freed only after a grace period; the caller is in a
    // read-side section (a handler).
    let Some(list) = (unsafe { LIST.load(Ordering::Acquire).as_ref() }) else { return 0 };
    let mut read = |at: u64| usercopy::read_u64(at as usize);
    let mut r = Regs { rip: regs.rip, rsp: regs.rsp, rbp: regs.rbp };
    // Whether `rip` is where the frame stands (the hit, an interrupted instruction) rather
    // than a return address, which may lie past the end of a call's function.
    let mut exact = true;
    let mut n = 0;
    let mut near = None;
    let mut memo = None;
    let trampoline = retprobe::trampoline() as u64;
    while n < out.len() {
        let at = |rip: u64| if exact { rip } else { rip.wrapping_sub(1) } as usize;
        // A recursion's frames share their return address, and so their rule.
        let mut rule = match memo {
            Some((pc, rule)) if pc == at(r.rip) => Some(rule),
            _ => list.rule_at(at(r.rip), &mut near),
        };
        if rule.is_none() {
            // Code the runtime relocated (an interrupted syscall in a stub, a call's return
            // into a slot): the same place in the probed function.
            if let Some(orig) = relocated(r.rip as usize) {
                r.rip = orig as u64;
                rule = list.rule_at(at(r.rip), &mut near);
            }
        }
        let pc = at(r.rip);
        out[n].write(r.rip);
        n += 1;
        let Some(rule) = rule else { break };
        memo = Some((pc, rule));
        // Where a module with tables has no rule, %rbp is no frame pointer to trust: the rule
        // is Unknown, which ends the stack.
        let (mut next, slot) = match unwind::step(*rule, &r, &mut read) {
            Step::Caller { regs, slot } => (regs, slot),
            Step::End => break,
            Step::Fault => {
                if n < out.len() {
                    out[n].write(CORRUPT);
                    n += 1;
                }
                break;
            }
        };
        if slot != 0 && next.rip == trampoline {
            next.rip = retprobe::hooked_return(slot as usize).unwrap_or(0) as u64;
        }
        // A caller's frame lies above its callee's (a signal frame may switch stacks).
        if next.rip == 0 || (slot != 0 && next.rsp <= r.rsp) {
            if next.rip != 0 && n < out.len() {
                out[n].write(CORRUPT);
                n += 1;
            }
            break;
        }
        exact = slot == 0;
        r = next;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::insn::unwind::Row;

    #[test]
    fn the_cache_answers_as_the_tables_do_through_collisions_and_modules_without_tables() {
        let entry = Rule::Cfa { rbp_based: false, cfa: 8, ra: -8, rbp: 0 };
        let pushed = Rule::Cfa { rbp_based: false, cfa: 16, ra: -8, rbp: -16 };
        let rows: Vec<Row> = (0..512u64)
            .flat_map(|f| {
                let at = 0x1000 + 64 * f;
                [
                    Row { start: at, rule: entry },
                    Row { start: at + 1, rule: pushed },
                    Row { start: at + 60, rule: Rule::End },
                ]
            })
            .collect();
        let table = Arc::new(unwind::Table::new(&rows));
        let (a, fp) = (0x5555_0000_0000usize, 0x7777_0000_0000usize);
        let ranges = vec![
            Range { start: fp, end: fp + 0x1000, bias: fp, rows: Arc::new(unwind::Table::default()), first_id: 0 },
            Range { start: a + 0x1000, end: a + 0x9000, bias: a, rows: table.clone(), first_id: 0 },
        ];
        let list = List::new(ranges);
        let mut near = None;
        // Twice over every address: first from the tables, then (most) from the cache, whose
        // 4,096 slots these 36,864 addresses share.
        for _ in 0..2 {
            for pc in (a + 0x1000..a + 0x9000).chain(fp..fp + 0x1000) {
                let want = if pc >= fp { Rule::FramePointers } else { unwind::rule_at(&rows, (pc - a) as u64) };
                assert_eq!(list.rule_at(pc, &mut near).copied(), Some(want), "{pc:#x}");
            }
        }
        assert_eq!(list.rule_at(a, &mut near), None);
        assert_eq!(list.rule_at(fp + 0x1000, &mut near), None);
    }
}
