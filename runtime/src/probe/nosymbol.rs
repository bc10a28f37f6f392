//! Functions no sized symbol covers, known by their FDE (`base::cfi`): the extent of an IFUNC
//! implementation the loader chose in a stripped library (`strlen` runs `__strlen_avx2`,
//! which Debian's libc has no symbol for), so that it can be decoded, checked and probed like
//! any function, with a jump where the code allows.
//!
//! A symbol-less function's neighbours are symbol-less too, and hand-written assembly jumps
//! from one function into another (glibc's `__mempcpy_*` into the body of `__memmove_*`,
//! three bytes past its entry): before such a function takes a jump, every direct branch of
//! the module's FDE-covered code is read from the file once, and a branch from another
//! function into the bytes the jump would overwrite keeps the `int3`.
//!
//! Normal context, under the registry lock (set-up: allocates, reads files).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::sync::Arc;

use iced_x86::{Decoder, DecoderOptions, FlowControl, OpKind};

use crate::base::{cfi, elf::ElfInfo, sys};

/// What is known of the modules' FDEs, per module path (link-time addresses).
#[derive(Default)]
pub struct Known {
    ranges: BTreeMap<String, Arc<Vec<(u64, u64)>>>,
    /// `(target, from)` of every direct branch into another FDE's range past its start,
    /// sorted by target.
    crossings: BTreeMap<String, Arc<Vec<(u64, u64)>>>,
    /// IFUNC implementations as the loader chose them: run-time address -> IFUNC name.
    pub ifuncs: BTreeMap<usize, String>,
}

impl Known {
    pub const fn new() -> Known {
        Known { ranges: BTreeMap::new(), crossings: BTreeMap::new(), ifuncs: BTreeMap::new() }
    }
}

fn map(path: &str) -> Option<sys::MappedFile> {
    CString::new(path).ok().and_then(|c| sys::map_file(&c).ok())
}

impl Known {
    /// The FDE ranges of the module file at `path`.
    pub fn ranges(&mut self, path: &str) -> Arc<Vec<(u64, u64)>> {
        if let Some(r) = self.ranges.get(path) {
            return r.clone();
        }
        let ranges = Arc::new(map(path).map(|f| cfi::fde_ranges(f.bytes())).unwrap_or_default());
        self.ranges.insert(path.to_string(), ranges.clone());
        ranges
    }

    /// The name shown for a function without a symbol starting at run-time `start`: the IFUNC
    /// it implements, or its address.
    pub fn name(&self, start: usize) -> String {
        self.ifuncs.get(&start).cloned().unwrap_or_else(|| format!("{start:#x}"))
    }

    /// A direct branch of the module at `path` (`info`, loaded at `bias`) from outside the
    /// function `start..start + size` into `start + 1 .. start + len` (run-time addresses):
    /// `(from, to)`.
    pub fn branch_from_outside(
        &mut self,
        path: &str,
        info: &ElfInfo,
        bias: usize,
        (start, size, len): (usize, usize, usize),
    ) -> Option<(u64, u64)> {
        let crossings = self.crossings(path, info);
        let link = |a: usize| a.wrapping_sub(bias) as u64;
        let (lo, hi, fn_lo, fn_hi) = (link(start + 1), link(start + len), link(start), link(start + size));
        let first = crossings.partition_point(|&(t, _)| t < lo);
        crossings[first..]
            .iter()
            .take_while(|&&(t, _)| t < hi)
            .find(|&&(_, from)| !(fn_lo..fn_hi).contains(&from))
            .map(|&(to, from)| (bias.wrapping_add(from as usize) as u64, bias.wrapping_add(to as usize) as u64))
    }

    /// Every direct branch of the module's FDE-covered code that lands inside another FDE's
    /// range, past its first byte (read from the file: the code as before any probe).
    fn crossings(&mut self, path: &str, info: &ElfInfo) -> Arc<Vec<(u64, u64)>> {
        if let Some(c) = self.crossings.get(path) {
            return c.clone();
        }
        let ranges = self.ranges(path);
        let mut out = Vec::new();
        if let Some(file) = map(path) {
            let bytes = file.bytes();
            for &(start, end) in ranges.iter() {
                let Some(offset) = info.offset_of_vaddr(start) else { continue };
                let Some(code) = bytes.get(offset as usize..(offset + (end - start)) as usize) else { continue };
                out.extend(crossings_of(code, start, end, &ranges));
            }
        }
        out.sort_unstable();
        let out = Arc::new(out);
        self.crossings.insert(path.to_string(), out.clone());
        out
    }
}

/// `(target, from)` of the direct branches of the function `code` (at `start..end`) into
/// another range of `ranges`, past its first byte.
fn crossings_of(code: &[u8], start: u64, end: u64, ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    while decoder.can_decode() {
        let insn = decoder.decode();
        let direct = matches!(
            insn.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
        ) && matches!(insn.op0_kind(), OpKind::NearBranch64);
        if !direct {
            continue;
        }
        let to = insn.near_branch_target();
        // Inside its own function: the jump plan checks those.
        if !(start..end).contains(&to) && cfi::containing(ranges, to).is_some_and(|(s, _)| s != to) {
            out.push((to, insn.ip()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_into_anothers_body_is_a_crossing_a_tail_call_is_not() {
        // mempcpy at 0x1000: mov %rdi,%rax; add %rdx,%rax; jmp 0x1043 (memmove+3); then
        // jmp 0x1040 (memmove's entry); memmove at 0x1040.
        let code = [0x48, 0x89, 0xf8, 0x48, 0x01, 0xd0, 0xeb, 0x3b, 0xeb, 0x36];
        let ranges = [(0x1000, 0x100a), (0x1040, 0x1080)];
        assert_eq!(crossings_of(&code, 0x1000, 0x100a, &ranges), [(0x1043, 0x1006)]);
    }
}
