//! A thread's pending returns: the records of the return-probed calls it has not returned
//! from, each with the stack slot whose return address was replaced, and the instances
//! (`struct uretprobe_instance` and its data) in a bounded per-thread arena. Plain data in the
//! thread's state, prepared before any hit: nothing here allocates or locks.
//!
//! Touched only by paths that hold the thread's busy mark (entry hits, the trampoline, the
//! unwinders' interposers), so never by two at once.

use crate::base::abi::{Uretprobe, UretprobeInstance};

/// Pending returns one thread can hold, over all return probes.
pub const MAX_FRAMES: usize = 256;
/// Bytes for the instances (`struct uretprobe_instance` and its data) of one thread.
pub const ARENA_SIZE: usize = 32 * 1024;
/// `maxactive` when the probe leaves it at 0 or below: pending returns per thread and probe.
pub const DEFAULT_MAXACTIVE: usize = 64;
/// The largest `data_size` a return probe may ask for.
pub const MAX_DATA_SIZE: usize = 4096;

#[derive(Clone, Copy)]
pub struct Frame {
    pub rp: *mut Uretprobe,
    /// The entry probe point (`table::ProbePoint`, never freed): its consumer list says whether
    /// `rp` is still registered.
    pub pp: usize,
    /// Where on the program's stack the return address was replaced.
    pub slot: usize,
    /// The real return address.
    pub orig: usize,
    /// Offset of the instance in the arena.
    pub instance: usize,
}

const NO_FRAME: Frame = Frame { rp: core::ptr::null_mut(), pp: 0, slot: 0, orig: 0, instance: 0 };

/// A thread's pending returns (kept in its `thread::ThreadState`).
pub struct ReturnStack {
    pub frames: [Frame; MAX_FRAMES],
    pub depth: usize,
    arena: [u64; ARENA_SIZE / 8],
    pub arena_top: usize,
}

impl ReturnStack {
    pub const EMPTY: ReturnStack =
        ReturnStack { frames: [NO_FRAME; MAX_FRAMES], depth: 0, arena: [0; ARENA_SIZE / 8], arena_top: 0 };
}

impl ReturnStack {
    pub fn top(&self) -> Option<&Frame> {
        self.depth.checked_sub(1).map(|i| &self.frames[i])
    }

    pub fn pop(&mut self) -> Frame {
        self.depth -= 1;
        let frame = self.frames[self.depth];
        self.arena_top = frame.instance;
        frame
    }

    /// Drops the records of frames left without returning: those whose slot is below `rsp`
    /// (or at it, when `inclusive`).
    pub fn drop_dead(&mut self, rsp: usize, inclusive: bool) {
        while let Some(top) = self.top() {
            if top.slot < rsp || (inclusive && top.slot == rsp) {
                self.pop();
            } else {
                break;
            }
        }
    }

    pub fn instance(&mut self, offset: usize) -> *mut UretprobeInstance {
        (self.arena.as_mut_ptr() as usize + offset) as *mut UretprobeInstance
    }

    /// Puts the real return addresses back on the stack where the trampoline's (`tramp`) is.
    pub fn restore_all(&mut self, tramp: usize) {
        for f in &self.frames[..self.depth] {
            // SAFETY: `slot` is a live stack slot of this thread that held its return address.
            unsafe {
                if *(f.slot as *const usize) == tramp {
                    *(f.slot as *mut usize) = f.orig;
                }
            }
        }
    }

    /// Hooks the returns of the recorded frames again, to the trampoline at `tramp`.
    pub fn rehook_all(&mut self, tramp: usize) {
        for f in &self.frames[..self.depth] {
            // SAFETY: as in `restore_all`; only slots still holding their real address change.
            unsafe {
                if *(f.slot as *const usize) == f.orig {
                    *(f.slot as *mut usize) = tramp;
                }
            }
        }
    }
}
