//! The runtime's own allocator.
//!
//! The runtime allocates only at set-up time (registration, symbol reading), but registration
//! requested from inside a handler is carried out on the hit path, in signal context, where
//! the program's `malloc` may be interrupted half-way and must not be re-entered. So the
//! runtime's Rust code never uses `malloc`: it takes memory from here, size-classed free lists
//! carved out of anonymous mappings, behind a spin lock that only runtime code takes. The hit
//! path itself never allocates, and deferred registrations run only when the interrupted code
//! on that thread was not inside the runtime, so the lock is never taken re-entrantly.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr;

use crate::base::sys;

const MIN_CLASS: usize = 16;
const CLASSES: usize = 13; // 16 .. 64 KiB
const CHUNK: usize = 1024 * 1024;

struct Arena {
    free: [usize; CLASSES],
    bump: usize,
    bump_end: usize,
}

static ARENA: spin::Mutex<Arena> = spin::Mutex::new(Arena { free: [0; CLASSES], bump: 0, bump_end: 0 });

/// The size class holding `size` bytes at alignment `align`, or None for large blocks.
fn class_of(size: usize, align: usize) -> Option<usize> {
    let need = size.max(align).max(MIN_CLASS).next_power_of_two();
    let class = need.trailing_zeros() as usize - MIN_CLASS.trailing_zeros() as usize;
    (class < CLASSES).then_some(class)
}

fn class_size(class: usize) -> usize {
    MIN_CLASS << class
}

fn large_len(size: usize) -> usize {
    (size + sys::PAGE_SIZE - 1) & !(sys::PAGE_SIZE - 1)
}

pub struct RuntimeAlloc;

// SAFETY: blocks never overlap (each comes from a free list or fresh bump space), start at a
// multiple of their power-of-two class size (bump space is carved at aligned offsets), and
// large blocks are whole page mappings.
unsafe impl GlobalAlloc for RuntimeAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(class) = class_of(layout.size(), layout.align()) else {
            if layout.align() > sys::PAGE_SIZE {
                return ptr::null_mut();
            }
            return sys::mmap_anon(large_len(layout.size())).map_or(ptr::null_mut(), |a| a as *mut u8);
        };
        let size = class_size(class);
        let mut arena = ARENA.lock();
        let head = arena.free[class];
        if head != 0 {
            // SAFETY: a free block's first word holds the next free block, written by dealloc.
            arena.free[class] = unsafe { *(head as *const usize) };
            return head as *mut u8;
        }
        let mut start = (arena.bump + size - 1) & !(size - 1);
        if arena.bump == 0 || start + size > arena.bump_end {
            let Ok(chunk) = sys::mmap_anon(CHUNK) else {
                return ptr::null_mut();
            };
            arena.bump_end = chunk + CHUNK;
            start = (chunk + size - 1) & !(size - 1);
        }
        arena.bump = start + size;
        start as *mut u8
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let Some(class) = class_of(layout.size(), layout.align()) else {
            // SAFETY: large blocks are their own mapping, and the caller gives up the block.
            unsafe { sys::munmap(block as usize, large_len(layout.size())) };
            return;
        };
        let mut arena = ARENA.lock();
        // SAFETY: the block is at least 16 bytes and ours again; its first word links the list.
        unsafe { *(block as *mut usize) = arena.free[class] };
        arena.free[class] = block as usize;
    }
}

/// Holds the allocator's lock across `fork` (the `pthread_atfork` prepare step), so that the
/// child never inherits it locked by a thread that does not exist there.
pub fn fork_lock() {
    core::mem::forget(ARENA.lock());
}

/// Ends [`fork_lock`], in the parent and in the child.
pub fn fork_unlock() {
    // SAFETY: called only after `fork_lock` on this thread (or its copy in the child), whose
    // forgotten guard is the lock's only holder.
    unsafe { ARENA.force_unlock() };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_size_and_alignment() {
        assert_eq!(class_of(1, 1), Some(0));
        assert_eq!(class_of(16, 8), Some(0));
        assert_eq!(class_of(17, 8), Some(1));
        assert_eq!(class_of(8, 64), Some(2));
        assert_eq!(class_of(4096, 8), Some(8));
        assert_eq!(class_of(65536, 8), Some(12));
        assert_eq!(class_of(65537, 8), None);
    }

    #[test]
    fn blocks_are_aligned_distinct_and_reused() {
        let a = RuntimeAlloc;
        let layout = Layout::from_size_align(40, 8).unwrap();
        // SAFETY: layouts are non-zero; blocks are freed with the layout they were made with.
        unsafe {
            let p = a.alloc(layout);
            let q = a.alloc(layout);
            assert!(!p.is_null() && !q.is_null() && p != q);
            assert_eq!(p as usize % 64, 0);
            a.dealloc(p, layout);
            a.dealloc(q, layout);
            let big = Layout::from_size_align(10_000, 8).unwrap();
            let b = a.alloc(big);
            b.write_bytes(7, 10_000);
            a.dealloc(b, big);
        }
    }
}
