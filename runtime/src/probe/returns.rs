//! A thread's pending returns: the records of the return-probed calls it has not returned
//! from, each with the stack slot whose return address was replaced, and the instances
//! (`struct uretprobe_instance` and its data) in a bounded per-thread arena. Plain data in the
//! thread's state, prepared before any hit: nothing here allocates or locks.
//!
//! Touched only by paths that hold the thread's busy mark (entry hits, the trampoline, the
//! unwinders' interposers), so never by two at once.

use crate::base::abi::{Uretprobe, UretprobeInstance};
use crate::base::sys;

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
    /// Offset of the instance in the arena, and its size.
    pub instance: usize,
    pub size: usize,
    /// The number of the point's consumer list at the entry (`table::Consumers`): while it
    /// is still the one in place, `rp` is registered.
    pub list: u64,
    /// Whether the probe's handlers need the vector registers saved (see
    /// `table::Consumer::needs_vectors`), read at the entry, while it was registered.
    pub vectors: bool,
    /// Whether the entry was a quick one (`retprobe::quick_entry`): its return may be quick
    /// too.
    pub quick: bool,
}

const NO_FRAME: Frame = Frame {
    rp: core::ptr::null_mut(),
    pp: 0,
    slot: 0,
    orig: 0,
    instance: 0,
    size: 0,
    list: 0,
    vectors: true,
    quick: false,
};

/// A thread's pending returns (kept in its `thread::ThreadState`).
pub struct ReturnStack {
    pub frames: [Frame; MAX_FRAMES],
    pub depth: usize,
    arena: [u64; ARENA_SIZE / 8],
    pub arena_top: usize,
    /// The stack pointer where the exception being propagated was thrown, or 0.
    pub thrown_at: usize,
    /// Whether the live records' slots go down as they get newer (one stack, calls nested
    /// as usual): then no record but the newest can lie at or below a new call's slot, and
    /// an entry finds the records to forget without looking at them all. Cleared by a
    /// record that breaks the order (another stack's), set again by a full look.
    ordered: bool,
}

impl ReturnStack {
    pub const EMPTY: ReturnStack = ReturnStack {
        frames: [NO_FRAME; MAX_FRAMES],
        depth: 0,
        arena: [0; ARENA_SIZE / 8],
        arena_top: 0,
        thrown_at: 0,
        ordered: true,
    };
}

impl Frame {
    /// A removed record whose space is not reclaimed yet (records above it are live).
    fn is_gone(&self) -> bool {
        self.rp.is_null()
    }

    /// Whether this call can still return through the trampoline: its slot still holds the
    /// trampoline's address, or its real one while unwinders look (`restore_all`). Read by a
    /// system call that cannot fault: the stack of a coroutine or a child that is gone reads
    /// as dead, even where glibc runs with every signal blocked.
    fn may_return(&self, tramp: usize) -> bool {
        sys::read_u64_checked(self.slot).is_some_and(|v| v as usize == tramp || v as usize == self.orig)
    }
}

/// Why a hooked call will never come back through the trampoline (counted per return probe,
/// for `--stats`).
#[derive(Clone, Copy)]
pub enum Left {
    /// Its frame was left by `longjmp` or an exception, or its stack is gone.
    Gone = 0,
    /// It was made by a child sharing the thread's memory (`posix_spawn`), which exec'd.
    Child = 1,
    /// Its thread exited (`pthread_exit`) with the call pending.
    ThreadExit = 2,
}

/// What the records say about one return.
pub enum Lookup {
    /// The newest record for the slot.
    Found(usize),
    Missing,
}

impl ReturnStack {
    /// The records in use, oldest first (removed ones included, see `Frame::is_gone`).
    pub fn live(&self) -> impl Iterator<Item = (usize, &Frame)> {
        self.frames[..self.depth].iter().enumerate().filter(|(_, f)| !f.is_gone())
    }

    /// The newest record of the call whose return address sits at `slot`. Several calls may
    /// share a slot (a hooked function that tail-calls another); the newest returns first.
    #[inline]
    pub fn find(&self, slot: usize) -> Lookup {
        let mut i = self.depth;
        while i > 0 {
            i -= 1;
            let f = &self.frames[i];
            if !f.is_gone() && f.slot == slot {
                return Lookup::Found(i);
            }
        }
        Lookup::Missing
    }

    /// Adds the record `f` on top (room checked by the caller).
    #[inline(always)]
    pub fn push(&mut self, f: Frame) {
        let d = self.depth;
        let mut below = d;
        while below > 0 && self.frames[below - 1].is_gone() {
            below -= 1;
        }
        if below == 0 {
            self.ordered = true;
        } else if f.slot >= self.frames[below - 1].slot {
            self.ordered = false;
        }
        // Field by field, each store on its own: merged, they would go through a vector
        // register, which the quick entry (`retprobe::quick_entry`) runs without saving.
        let at = &mut self.frames[d];
        // SAFETY: plain stores to the fields of a record of this stack, borrowed mutably.
        unsafe {
            core::ptr::addr_of_mut!(at.rp).write_volatile(f.rp);
            core::ptr::addr_of_mut!(at.pp).write_volatile(f.pp);
            core::ptr::addr_of_mut!(at.slot).write_volatile(f.slot);
            core::ptr::addr_of_mut!(at.orig).write_volatile(f.orig);
            core::ptr::addr_of_mut!(at.instance).write_volatile(f.instance);
            core::ptr::addr_of_mut!(at.size).write_volatile(f.size);
            core::ptr::addr_of_mut!(at.list).write_volatile(f.list);
            core::ptr::addr_of_mut!(at.vectors).write_volatile(f.vectors);
            core::ptr::addr_of_mut!(at.quick).write_volatile(f.quick);
        }
        self.depth = d + 1;
    }

    /// Whether a call whose return address is at `slot` can be recorded without looking at the
    /// other records: they are in order and all above `slot` (so [`Self::collect`] would
    /// forget none), the thread has fewer than `limit` of them (nor can its probe), and the
    /// arena has `size` bytes free.
    #[inline(always)]
    pub fn room_in_order(&self, slot: usize, limit: usize, size: usize) -> bool {
        let d = self.depth;
        let above = d == 0 || (self.ordered && !self.frames[d - 1].is_gone() && self.frames[d - 1].slot > slot);
        above && d < limit.min(MAX_FRAMES) && self.arena_top + size <= ARENA_SIZE
    }

    /// The record of the return leaving from `slot` when it is the newest one, of a quick
    /// entry, and the records are in order (so it is the only one of that slot, and no newer
    /// record is left for [`Self::collect`] to forget).
    #[inline(always)]
    pub fn quick_top(&self, slot: usize) -> Option<usize> {
        let d = self.depth;
        let top = self.frames[..d].last()?;
        (self.ordered && !top.is_gone() && top.quick && top.slot == slot).then_some(d - 1)
    }

    /// Takes record `i` out, and reclaims the space of removed records at the top.
    #[inline]
    pub fn remove(&mut self, i: usize) {
        self.frames[i].rp = core::ptr::null_mut();
        self.remove_top_gone();
    }

    /// How many records `rp` has pending.
    pub fn pending(&self, rp: *mut Uretprobe) -> usize {
        self.live().filter(|(_, f)| f.rp == rp).count()
    }

    /// Forgets the records of calls that can no longer return, as a new call's return address
    /// is stored at `slot` (an entry) or a return leaves from it:
    /// - a record at `slot` itself belongs to an earlier call whose frame is gone (its slot now
    ///   holds another return address), unless the new call is a tail call of it (`chained`);
    /// - records newer than every live one below `slot` whose slot no longer holds the
    ///   trampoline's address: frames left by `longjmp` or an exception, whose stack was reused.
    ///
    /// A record below `slot` whose slot still holds the trampoline stays: it may be a frame
    /// of another stack (a coroutine suspended by `swapcontext` or a hand-written switch),
    /// which must survive the thread running elsewhere; such records are found by exact slot
    /// when their return comes. With `sweep`, every record is checked, not only the newest.
    /// `left` hears of each record forgotten.
    pub fn collect(
        &mut self,
        slot: usize,
        chained: bool,
        tramp: usize,
        sweep: bool,
        left: &mut dyn FnMut(&Frame, Left),
    ) {
        // With the records in order, only those at or below `slot` can share it, and those
        // are the newest: the loop below starts at the newest record and stops at the first
        // one above `slot`. Out of order (or sweeping), every record is looked at, and the
        // order is learnt again.
        if sweep || (!chained && !self.ordered) {
            let mut ordered = true;
            let mut above = usize::MAX;
            for i in 0..self.depth {
                let f = &self.frames[i];
                if f.is_gone() {
                    continue;
                }
                if (f.slot == slot && !chained) || (sweep && !f.may_return(tramp)) {
                    left(f, Left::Gone);
                    self.frames[i].rp = core::ptr::null_mut();
                    continue;
                }
                ordered &= f.slot < above;
                above = f.slot;
            }
            self.ordered = ordered;
        } else if !chained {
            let mut i = self.depth;
            while i > 0 {
                i -= 1;
                let f = &self.frames[i];
                if f.is_gone() {
                    continue;
                }
                if f.slot > slot {
                    break;
                }
                if f.slot == slot {
                    left(f, Left::Gone);
                    self.frames[i].rp = core::ptr::null_mut();
                }
            }
        }
        self.remove_top_gone();
        while self.depth > 0 {
            let top = &self.frames[self.depth - 1];
            if top.slot < slot && !top.may_return(tramp) {
                left(top, Left::Gone);
                self.remove(self.depth - 1);
            } else {
                break;
            }
        }
    }

    /// Forgets every record above `depth` (their calls will not return: `why`, told to
    /// `left`).
    pub fn truncate(&mut self, depth: usize, arena_top: usize, why: Left, left: &mut dyn FnMut(&Frame, Left)) {
        for f in &self.frames[depth.min(self.depth)..self.depth] {
            if !f.is_gone() {
                left(f, why);
            }
        }
        if self.depth > depth {
            self.depth = depth;
            self.arena_top = arena_top;
            // What stays may have changed meanwhile (a child's records): learnt again.
            self.ordered = depth == 0;
        }
    }

    /// Closes the gaps that removed records leave below live ones (calls that returned on one
    /// stack while another stack's calls are pending above them): records and instances move
    /// down, in order. Between hits no instance is in use, so moving them is safe.
    pub fn compact(&mut self) {
        let mut kept = 0;
        let mut top = 0;
        let mut ordered = true;
        for i in 0..self.depth {
            let mut f = self.frames[i];
            if f.is_gone() {
                continue;
            }
            if f.instance != top {
                self.arena_bytes().copy_within(f.instance..f.instance + f.size, top);
                f.instance = top;
            }
            top += f.size;
            ordered &= kept == 0 || f.slot < self.frames[kept - 1].slot;
            self.frames[kept] = f;
            kept += 1;
        }
        self.depth = kept;
        self.arena_top = top;
        self.ordered = ordered;
    }

    fn arena_bytes(&mut self) -> &mut [u8] {
        // SAFETY: the arena is plain memory of this stack, ARENA_SIZE bytes long.
        unsafe { core::slice::from_raw_parts_mut(self.arena.as_mut_ptr().cast::<u8>(), ARENA_SIZE) }
    }

    fn remove_top_gone(&mut self) {
        while self.depth > 0 && self.frames[self.depth - 1].is_gone() {
            self.depth -= 1;
            self.arena_top = self.frames[self.depth].instance;
        }
    }

    /// An exception thrown at stack pointer `thrown_at` (0: unknown) is caught by the frame
    /// whose return slot is just above `catch_slot`: the calls in between are gone.
    pub fn caught(&mut self, thrown_at: usize, catch_slot: usize, left: &mut dyn FnMut(&Frame, Left)) {
        for i in 0..self.depth {
            let f = &self.frames[i];
            if !f.is_gone() && f.slot <= catch_slot && (thrown_at == 0 || f.slot >= thrown_at) {
                left(f, Left::Gone);
                self.frames[i].rp = core::ptr::null_mut();
            }
        }
        self.remove_top_gone();
    }

    pub fn instance(&mut self, offset: usize) -> *mut UretprobeInstance {
        (self.arena.as_mut_ptr() as usize + offset) as *mut UretprobeInstance
    }

    /// Puts the real return addresses back on the stack where the trampoline's (`tramp`) is.
    pub fn restore_all(&mut self, tramp: usize) {
        for (_, f) in self.live() {
            if sys::read_u64_checked(f.slot) == Some(tramp as u64) {
                // SAFETY: the slot was just read, so it is mapped; it holds the trampoline's
                // address, which only a hooked return address of this record can be.
                unsafe { *(f.slot as *mut usize) = f.orig };
            }
        }
    }

    /// Hooks the returns of the recorded frames again, to the trampoline at `tramp`.
    pub fn rehook_all(&mut self, tramp: usize) {
        for (_, f) in self.live() {
            if sys::read_u64_checked(f.slot) == Some(f.orig as u64) {
                // SAFETY: as in `restore_all`; only slots still holding their real address change.
                unsafe { *(f.slot as *mut usize) = tramp };
            }
        }
    }
}
