//! Stacks as keys (`--by ustack[:DEPTH]`): a hit's stack is walked (`probe::stacks`), kept
//! once in its thread's block, and counted under its id, a 64-bit hash of its frames, as one
//! word of the key. Reports read the stacks back by id from every block.
//!
//! A block's stack store: [`STACK_SLOTS`] slots of `[id, frames, frame addresses...]`
//! (`Layout::stack_words` words each), id 0 for a free slot; a new stack's frames are written
//! before its id, so a reader that sees the id sees the frames.
//!
//! Context: [`key`] on the hit path (thread busy: no allocation, no lock, no system call);
//! [`gather`] in reports.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;

use crate::aggregate::blocks::Block;
use crate::aggregate::plan::Layout;
use crate::base::abi::PtRegs;
use crate::probe::stacks::{self, MAX_DEPTH};

pub use crate::aggregate::request::STACK_SLOTS;

/// The id of the stack of a hit with registers `regs`, at most `depth` frames, kept in `b`;
/// None when `b` has no room for a new stack (hit path).
#[inline]
pub fn key(b: Block, layout: &Layout, regs: &PtRegs, depth: usize) -> Option<u64> {
    // Not zeroed first: only the frames written are read.
    let mut frames = [MaybeUninit::<u64>::uninit(); MAX_DEPTH];
    let frames = stacks::walk_into(regs, &mut frames[..depth.min(MAX_DEPTH)]);
    let n = frames.len();
    let id = hash(frames);
    let mut slot = (id >> 32) as usize % STACK_SLOTS;
    // Bounded probing, as for keys.
    for _ in 0..64 {
        let at = layout.stacks + slot * layout.stack_words;
        match b.get(at) {
            0 => {
                b.set(at + 1, n as u64);
                for (i, &f) in frames.iter().enumerate() {
                    b.set(at + 2 + i, f);
                }
                b.publish(at, id);
                return Some(id);
            }
            t if t == id => return Some(id),
            _ => slot = (slot + 1) % STACK_SLOTS,
        }
    }
    None
}

/// A stack's id: never 0 (a free slot), and the same in every thread.
fn hash(frames: &[u64]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ frames.len() as u64;
    for &f in frames {
        h = (h ^ f).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 31;
    }
    h | 1
}

/// The stacks kept in block `b`, by id (reports).
pub fn gather(b: Block, layout: &Layout, into: &mut BTreeMap<u64, Vec<u64>>) {
    if layout.stack_words == 0 {
        return;
    }
    for slot in 0..STACK_SLOTS {
        let at = layout.stacks + slot * layout.stack_words;
        let id = b.get_published(at);
        if id == 0 || into.contains_key(&id) {
            continue;
        }
        let n = (b.get(at + 1) as usize).min(layout.stack_words - 2);
        into.insert(id, (0..n).map(|i| b.get(at + 2 + i)).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_tell_stacks_apart_and_are_never_zero() {
        assert_ne!(hash(&[1, 2, 3]), hash(&[1, 3, 2]));
        assert_ne!(hash(&[1, 2]), hash(&[1, 2, 0]));
        assert_eq!(hash(&[0x401000, 0x401100]), hash(&[0x401000, 0x401100]));
        assert_eq!(hash(&[]) & 1, 1);
    }
}
