//! Out-of-line slots: executable memory near the probed code, holding relocated copies of
//! displaced instructions. A slot must lie within +-2 GiB of the instruction it stands for,
//! so that rel32 jumps and RIP-relative operands reach; areas are mapped in the free gap of
//! the address space closest to the probed module. Slots are never freed: a thread may still
//! be running in one after its probe is gone.

use crate::maps::{self, Mapping};
use crate::patch;
use crate::sys::{self, PAGE_SIZE};

pub const SLOT_SIZE: usize = 32;
const AREA_SIZE: usize = 16 * PAGE_SIZE;
/// How far a slot may be from its instruction: rel32 reach less the area's own size.
const REACH: usize = (1 << 31) - 2 * AREA_SIZE;
const LOWEST: usize = 0x10000;
const HIGHEST: usize = 0x7fff_ffff_0000;
const PROT: i32 = libc::PROT_READ | libc::PROT_EXEC;

struct Area {
    base: usize,
    used: usize,
}

#[derive(Default)]
pub struct Slots {
    areas: Vec<Area>,
}

impl Slots {
    pub const fn new() -> Slots {
        Slots { areas: Vec::new() }
    }
}

fn distance(a: usize, b: usize) -> usize {
    a.abs_diff(b)
}

/// The start of a free, page-aligned range of `len` bytes, as close to `near` as possible and
/// within `reach` of it, given the current mappings (sorted by address). The gap just above
/// the heap is kept free for the heap to grow.
pub fn place_near(maps: &[Mapping], near: usize, len: usize, reach: usize) -> Option<usize> {
    let mut best: Option<usize> = None;
    let mut prev_end = LOWEST;
    let mut prev_is_heap = false;
    let ends = maps.iter().map(|m| (m.start, m.end, m.path == "[heap]")).chain([(HIGHEST, HIGHEST, false)]);
    for (start, end, heap) in ends {
        let (gap_lo, gap_hi) = (prev_end.max(LOWEST), start.min(HIGHEST));
        if gap_hi >= gap_lo + len && !prev_is_heap {
            let below = sys::page_floor(near.saturating_sub(len).min(gap_hi - len));
            let candidate = if below >= gap_lo { below } else { gap_lo };
            if distance(candidate, near) <= reach && best.is_none_or(|b| distance(candidate, near) < distance(b, near))
            {
                best = Some(candidate);
            }
        }
        prev_end = prev_end.max(end);
        prev_is_heap = heap;
    }
    best
}

/// Maps a new area near `near`. The address space is read afresh each time: other threads,
/// and the runtime's own allocator, map memory too.
fn map_near(near: usize) -> Result<usize, SlotError> {
    let mut last = SlotError::NoRoom { near };
    for _ in 0..8 {
        let base = place_near(&maps::current(), near, AREA_SIZE, REACH).ok_or(SlotError::NoRoom { near })?;
        match sys::mmap_anon_at(base, AREA_SIZE, PROT) {
            Ok(base) => return Ok(base),
            Err(errno) => last = SlotError::Map { base, errno },
        }
    }
    Err(last)
}

impl Slots {
    /// A fresh slot within reach of `near`, holding `code`.
    pub fn alloc(&mut self, near: usize, code: impl Fn(usize) -> Option<Vec<u8>>) -> Result<usize, SlotError> {
        self.alloc_sized(near, SLOT_SIZE, code)
    }

    /// A fresh slot of `size` bytes (a multiple of 16) within reach of `near`, holding `code`.
    pub fn alloc_sized(
        &mut self,
        near: usize,
        size: usize,
        code: impl Fn(usize) -> Option<Vec<u8>>,
    ) -> Result<usize, SlotError> {
        let reusable = self.areas.iter().position(|a| a.used + size <= AREA_SIZE && distance(a.base, near) <= REACH);
        let area = match reusable {
            Some(i) => i,
            None => {
                self.areas.push(Area { base: map_near(near)?, used: 0 });
                self.areas.len() - 1
            }
        };
        let slot = self.areas[area].base + self.areas[area].used;
        let bytes = code(slot).ok_or(SlotError::Relocate)?;
        if bytes.len() > size {
            return Err(SlotError::TooLong(bytes.len()));
        }
        patch::write_code(slot, &bytes, PROT).map_err(|e| SlotError::Map { base: slot, errno: e.errno })?;
        self.areas[area].used += size;
        Ok(slot)
    }
}

#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SlotError {
    #[error("no free address range within 2 GiB of {near:#x} for out-of-line slots")]
    NoRoom { near: usize },
    #[error("mapping out-of-line slots at {base:#x} failed: {}", std::io::Error::from_raw_os_error(*errno))]
    Map { base: usize, errno: i32 },
    #[error("the instruction cannot be relocated")]
    Relocate,
    #[error("the relocated instruction takes {0} bytes, more than a slot holds")]
    TooLong(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maps(text: &str) -> Vec<Mapping> {
        crate::maps::parse(text)
    }

    #[test]
    fn places_below_the_module_when_free() {
        let m = maps("555555554000-555555556000 r-xp 00000000 fe:01 7 /p\n555555557000-555555578000 rw-p 00000000 00:00 0 [heap]\n");
        let at = place_near(&m, 0x555555554000, 0x10000, REACH).unwrap();
        assert_eq!(at, 0x555555544000);
    }

    #[test]
    fn never_takes_the_gap_above_the_heap() {
        let m = maps("10000-400000 r--p 00000000 00:00 0\n400000-401000 r-xp 00000000 fe:01 7 /p\n401000-500000 rw-p 00000000 00:00 0 [heap]\n");
        let at = place_near(&m, 0x400000, 0x10000, REACH);
        assert_eq!(at, None);
        let m = maps("400000-401000 r-xp 00000000 fe:01 7 /p\n401000-500000 rw-p 00000000 00:00 0 [heap]\n");
        assert_eq!(place_near(&m, 0x400000, 0x10000, REACH), Some(0x3f0000));
    }

    #[test]
    fn respects_reach() {
        let m = maps("10000-7f0000000000 r--p 00000000 00:00 0\n7f0000000000-7f0000001000 r-xp 00000000 fe:01 7 /l\n");
        let at = place_near(&m, 0x7f0000000000, 0x10000, REACH).unwrap();
        assert_eq!(at, 0x7f0000001000);
        assert!(place_near(&maps("10000-7fffffff0000 r--p 00000000 00:00 0\n"), 0x20000, 0x10000, REACH).is_none());
    }
}
