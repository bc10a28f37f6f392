//! Out-of-line slots: executable memory near the probed code, holding relocated copies of
//! displaced instructions and the stubs of jump probes. A slot must lie within +-2 GiB of the
//! instruction it stands for, so that rel32 jumps and RIP-relative operands reach; areas are
//! mapped in the free gap of the address space closest to the probed module. Slots are never
//! freed: a thread may still be running in one after its probe is gone.
//!
//! Areas are written during a placement batch and sealed (made read-execute) at its end, so
//! each area changes protection at most twice a batch. Normal context, under the registry
//! lock.

use crate::base::maps::Mapping;
use crate::base::sys::{self, PAGE_SIZE};

pub const SLOT_SIZE: usize = 32;
const AREA_SIZE: usize = 256 * PAGE_SIZE;
/// How far a slot may be from its instruction: rel32 reach less the area's own size.
const REACH: usize = (1 << 31) - 2 * AREA_SIZE;
const LOWEST: usize = 0x10000;
const HIGHEST: usize = 0x7fff_ffff_0000;
const SEALED: i32 = libc::PROT_READ | libc::PROT_EXEC;
const OPEN: i32 = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;

struct Area {
    base: usize,
    used: usize,
    /// Writable until the batch that opened it seals it.
    open: bool,
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
    let ends =
        maps.iter().map(|m| (m.start as usize, m.end as usize, m.path == "[heap]")).chain([(HIGHEST, HIGHEST, false)]);
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

/// Maps a new, writable area near `near`, placed by `maps` first and by a fresh read of the
/// address space if that place is taken meanwhile.
fn map_near(near: usize, maps: &[Mapping]) -> Result<usize, SlotError> {
    let mut last = SlotError::NoRoom { near };
    let mut fresh;
    let mut maps = maps;
    for _ in 0..8 {
        let base = place_near(maps, near, AREA_SIZE, REACH).ok_or(SlotError::NoRoom { near })?;
        match sys::mmap_anon_at(base, AREA_SIZE, OPEN) {
            Ok(base) => return Ok(base),
            Err(errno) => last = SlotError::Map { base, errno },
        }
        if matches!(last, SlotError::Map { errno, .. } if errno != libc::EEXIST) {
            break;
        }
        fresh = crate::base::maps::current();
        maps = &fresh;
    }
    Err(last)
}

impl Slots {
    /// A fresh slot within reach of `near`, holding `code` (`maps`: the address space).
    pub fn alloc(
        &mut self,
        near: usize,
        maps: &[Mapping],
        code: impl Fn(usize) -> Option<Vec<u8>>,
    ) -> Result<usize, SlotError> {
        self.alloc_sized(near, SLOT_SIZE, maps, code)
    }

    /// A fresh slot of `size` bytes (a multiple of 16) within reach of `near`, holding `code`.
    pub fn alloc_sized(
        &mut self,
        near: usize,
        size: usize,
        maps: &[Mapping],
        code: impl Fn(usize) -> Option<Vec<u8>>,
    ) -> Result<usize, SlotError> {
        let reusable = self.areas.iter().position(|a| a.used + size <= AREA_SIZE && distance(a.base, near) <= REACH);
        let area = match reusable {
            Some(i) => i,
            None => {
                self.areas.push(Area { base: map_near(near, maps)?, used: 0, open: true });
                self.areas.len() - 1
            }
        };
        let slot = self.areas[area].base + self.areas[area].used;
        let bytes = code(slot).ok_or(SlotError::Relocate)?;
        if bytes.len() > size {
            return Err(SlotError::TooLong(bytes.len()));
        }
        let a = &mut self.areas[area];
        if !a.open {
            sys::mprotect(a.base, AREA_SIZE, OPEN).map_err(|errno| SlotError::Map { base: a.base, errno })?;
            a.open = true;
        }
        // SAFETY: the slot lies in an area of ours, writable now; no thread runs these bytes
        // before the probe using them is written.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), slot as *mut u8, bytes.len()) };
        a.used += size;
        Ok(slot)
    }

    /// Makes the areas written since the last seal read-execute again (end of a batch).
    pub fn seal(&mut self) {
        for a in self.areas.iter_mut().filter(|a| a.open) {
            // Cannot fail for a mapping of ours that took PROT_EXEC before.
            let _ = sys::mprotect(a.base, AREA_SIZE, SEALED);
            a.open = false;
        }
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
        crate::base::maps::parse(text)
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
