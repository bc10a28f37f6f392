//! The probe table: one [`ProbePoint`] per patched address, in a fixed open-addressing table
//! that the hit paths read without locks (signal-safe lookups).
//!
//! Probe points are never freed: a thread that trapped on an `int3` may look its point up
//! after the probe was removed, and then still finds how to run the displaced instruction; a
//! thread may still be running in a point's stub or slot. The list of a point's consumers
//! (the registered probe objects) is an immutable snapshot swapped atomically; an old
//! snapshot is freed only after a grace period (`rcu`). Writers hold the registry lock.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::base::abi::{Uprobe, Uretprobe};
use crate::base::usercopy;
use crate::insn::decode::{Plan, MAX_INSN_LEN};
use crate::insn::jump::{NoJump, JMP_OPCODE};
use crate::insn::stub::{Entries, InlineCount, Quick};
use crate::probe::rcu;

pub const INT3: u8 = 0xcc;
const TABLE_BITS: u32 = 18;
const TABLE_SIZE: usize = 1 << TABLE_BITS;
/// The longest range a jump may overwrite (5 bytes rounded up to whole instructions).
pub const MAX_PATCH: usize = 32;

/// One patched address.
pub struct ProbePoint {
    pub addr: usize,
    /// The displaced instruction's original bytes.
    pub orig: [u8; MAX_INSN_LEN],
    pub len: usize,
    pub plan: Plan,
    /// The out-of-line copy, for `Plan::OutOfLine`.
    pub slot: usize,
    /// Null while no probe is registered here.
    pub consumers: AtomicPtr<Consumers>,
    /// Hits that ran no handler because the thread was already in one, or in the runtime.
    pub missed: AtomicU64,
    /// Whether (and how) this point can take a jump instead of the `int3`, decided once.
    pub jump: Result<JumpPrep, NoJump>,
    /// Whether the jump is in place now (while armed; otherwise the `int3` is).
    pub jump_active: AtomicBool,
    /// Whether the point took its jump when last armed, kept once its probes are gone: what
    /// a report written after them (an attach session's) says of how it was hit.
    pub jumped: AtomicBool,
    /// Whether the bytes after the first may hold the jump's: from just before the jump is
    /// written until its original bytes are back. A thread that meets the `int3` then must
    /// not resume inside the range: the trap path sends it to the stub's relocated code.
    pub tail_patched: AtomicBool,
    /// Whether a hit through the jump must save the vector registers: some consumer's
    /// handlers may use them (see `Consumer::needs_vectors`). Read by the common stub code
    /// before the hit's read-side section: a list published meanwhile may need them while
    /// they were not saved, which the dispatcher checks per consumer.
    pub vectors: AtomicBool,
    /// Whether a consumer here reads the saved vector registers (a `%xmmN` fetcharg, see
    /// [`READS_XMM`]): only then does a hit tell the thread where they were saved. Raised
    /// before such a list is published and lowered after one without: a hit reads it after
    /// its list.
    pub reads_xmm: AtomicBool,
    /// Where a hit through the stub's counting entry adds one in the thread's counter block
    /// (a byte offset, see `insn::stub::InlineCount`): set while the point's only consumer is
    /// a count that a front-end lets the stub make ([`INLINE_COUNT`]), 0 otherwise.
    pub count_at: AtomicUsize,
    /// What the front-end's quick code needs to handle a hit through the stub's quick entry
    /// (a word it chose, never 0): set while the point's only consumer is a probe that the
    /// front-end handles itself ([`QUICK_ENTRY`]), 0 before any other list is published.
    pub quick: AtomicUsize,
    /// Whether the point waits in an open placement batch for its bytes to be written.
    pub queued: AtomicBool,
    /// Where glibc runs this code with every signal blocked, if it does (`traps`): the point
    /// must take a jump, an `int3` there would kill the process.
    pub trap_unsafe: Option<&'static str>,
    /// Whether the runtime said already that something else changed this site's code.
    pub changed_reported: AtomicBool,
}

/// A jump ready to be written: its stub is built and stays for the life of the process.
pub struct JumpPrep {
    pub patch_len: usize,
    /// The original bytes of the patched range.
    pub orig: [u8; MAX_PATCH],
    pub stub: usize,
    /// The stub's counting entry, or 0 where it has none.
    pub count_entry: usize,
    /// The stub's quick entry, or 0 where it has none, and the quick code it goes to.
    pub quick_entry: usize,
    pub quick_code: usize,
}

impl JumpPrep {
    /// Where the jump of point `pp` goes: the counting entry while the point counts in the
    /// stub, the quick entry while its hits may be quick, the stub's head otherwise.
    pub fn target(&self, pp: &ProbePoint) -> usize {
        if self.count_entry != 0 && pp.count_at.load(Ordering::SeqCst) != 0 {
            self.count_entry
        } else if self.quick_entry != 0 && pp.quick.load(Ordering::SeqCst) != 0 {
            self.quick_entry
        } else {
            self.stub
        }
    }
}

/// The entries the stub of the point at `pp` gets: a counting entry where a stub can find
/// the thread's word (thread states lie at one offset from the thread pointer), reading that
/// and the point's; a quick entry where a front-end has quick code ([`QUICK_ENTRY`]).
pub fn stub_entries(pp: u64) -> Entries {
    let probe_word = pp + core::mem::offset_of!(ProbePoint, count_at) as u64;
    let count = crate::probe::thread::counting_offset().map(|thread_word| InlineCount { probe_word, thread_word });
    let code = QUICK_ENTRY.load(Ordering::Acquire) as u64;
    let quick = (code != 0).then(|| Quick { code, call: QUICK_CALLS.load(Ordering::Acquire) });
    Entries { count, quick }
}

/// What a probe object's [`Consumer::code_word`] holds when the code of its handlers was read
/// at registration and found free of vector instructions (`probe::vectors`); anything else:
/// not read, or not found free.
pub const VECTOR_FREE_CODE: usize = 0x7665_6366_7265_6531;

/// A front-end's hook (0: none), `unsafe fn(*mut Uprobe) -> usize` (given a registered
/// probe object): for an entry probe whose every
/// hit only adds one to a counter of the thread's block, that counter's byte offset in the
/// block; 0 for any other. Asked under the registry lock when a point's consumers change.
pub static INLINE_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Where a hit of `probes` alone counts in the stub, or 0 (see [`INLINE_COUNT`]).
fn inline_count(probes: &[Consumer]) -> usize {
    let hook = INLINE_COUNT.load(Ordering::Acquire);
    match probes {
        [Consumer::Uprobe(u)] if hook != 0 => {
            // SAFETY: set only to such a function (see above), given a registered object.
            unsafe { core::mem::transmute::<usize, unsafe fn(*mut Uprobe) -> usize>(hook)(*u) }
        }
        _ => 0,
    }
}

/// A front-end's quick code (0: none): the address a stub's quick entry goes to
/// (`insn::stub`), called when `QUICK_CALLS` (as the stub's head calls the common code),
/// jumped to otherwise, which handles the hits of the points whose `quick` word is set; and
/// `QUICK_ENTRY_FOR`, `unsafe fn(Consumer) -> usize` (given a registered probe), which gives
/// that word for a point whose only consumer is one it handles, 0 for others. Set before the
/// front-end's probes are placed; a stub keeps the code it was built with, and a point's word
/// is set only while that is the front-end's.
pub static QUICK_ENTRY: AtomicUsize = AtomicUsize::new(0);
pub static QUICK_CALLS: AtomicBool = AtomicBool::new(false);
pub static QUICK_ENTRY_FOR: AtomicUsize = AtomicUsize::new(0);

impl ProbePoint {
    /// The quick word of this point with the consumers `probes` (see [`QUICK_ENTRY`]).
    fn quick_word(&self, probes: &[Consumer]) -> usize {
        let hook = QUICK_ENTRY_FOR.load(Ordering::Acquire);
        let code = self.jump.as_ref().map_or(0, |j| j.quick_code);
        match probes {
            [c] if hook != 0 && code != 0 && code == QUICK_ENTRY.load(Ordering::Acquire) => {
                // SAFETY: set only to such a function (see above), given a registered probe.
                unsafe { core::mem::transmute::<usize, unsafe fn(Consumer) -> usize>(hook)(*c) }
            }
            _ => 0,
        }
    }
}

/// A bit of `struct uprobe`'s flags that the runtime's own probes set (it is no `UPROBE_*`
/// flag, so it also keeps the vector registers saved): the probe's hits read the saved
/// `%xmmN` registers, through the thread's `vectors` word, which a hit sets only for them.
pub const READS_XMM: core::ffi::c_uint = 1 << 31;

/// Whether any probe that reads the saved `%xmmN` registers was registered (the return
/// trampoline, which serves every return probe, asks this instead of a point).
pub static XMM_READERS: AtomicBool = AtomicBool::new(false);

/// The probes registered at one address, in registration order.
pub struct Consumers {
    pub probes: Vec<Consumer>,
    /// This list's number, unique for the life of the process: a return finds its probe
    /// still registered, without searching, when the list it was called from is in place.
    pub generation: u64,
}

/// The number of the next consumer list.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// A registered probe object: an entry probe, or a return probe (whose entry lives here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumer {
    Uprobe(*mut Uprobe),
    Uretprobe(*mut Uretprobe),
}

impl Consumer {
    /// The identity of the probe object (its address).
    pub fn key(self) -> usize {
        match self {
            Consumer::Uprobe(u) => u as usize,
            Consumer::Uretprobe(rp) => rp as usize,
        }
    }

    /// Where the object asks to be placed: `struct uretprobe` starts with its `struct uprobe`.
    pub fn placement(self) -> *mut Uprobe {
        match self {
            Consumer::Uprobe(u) => u,
            Consumer::Uretprobe(rp) => rp.cast(),
        }
    }

    /// Whether calling the probe's handlers needs the vector registers saved: unless the
    /// probe declares `UPROBE_NO_VECTORS`, or their code was read at registration and uses
    /// none (`vectors`); for a return probe: its entry handler and its return handler (the
    /// runtime's own bookkeeping of returns uses none).
    #[inline(always)]
    pub fn needs_vectors(self) -> bool {
        // `struct uretprobe` starts with its `struct uprobe`; the runtime's word is written
        // before the probe joins a list.
        let u = self.placement();
        // SAFETY: registered probe objects are valid (C ABI); their flags do not change then.
        unsafe { !(*u).vector_free() && self.code_word().load(Ordering::Relaxed) != VECTOR_FREE_CODE }
    }

    /// The runtime's word of the probe object (valid while it is registered) that says its
    /// handlers' code was found free of vector instructions ([`VECTOR_FREE_CODE`]); the last
    /// of `struct uprobe`'s reserved words (return probes count their left calls in the first
    /// three).
    pub fn code_word(self) -> &'static AtomicUsize {
        // SAFETY: the reserved words are the runtime's, pointer-sized and aligned, and the
        // object outlives its registration (C ABI); the word is only accessed atomically.
        unsafe { AtomicUsize::from_ptr(core::ptr::addr_of_mut!((*self.placement()).reserved[3]).cast::<usize>()) }
    }

    /// Whether the probe's hits read the saved vector registers ([`READS_XMM`]).
    pub fn reads_xmm(self) -> bool {
        // SAFETY: as in `needs_vectors`.
        unsafe { (*self.placement()).flags & READS_XMM != 0 }
    }

    pub fn is_return(self) -> bool {
        matches!(self, Consumer::Uretprobe(_))
    }

    /// The address of the object's handler, to name its library (normal context).
    pub fn handler_address(self) -> usize {
        // SAFETY: registered probe objects are valid (C ABI).
        unsafe {
            match self {
                Consumer::Uprobe(u) => (*u).handler.map_or(0, |h| h as usize),
                Consumer::Uretprobe(rp) => {
                    (*rp).handler.map(|h| h as usize).or((*rp).entry_handler.map(|h| h as usize)).unwrap_or(0)
                }
            }
        }
    }
}

static TABLE: [AtomicPtr<ProbePoint>; TABLE_SIZE] = [const { AtomicPtr::new(core::ptr::null_mut()) }; TABLE_SIZE];

fn hash(addr: usize) -> usize {
    (addr as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) as usize >> (usize::BITS - TABLE_BITS)
}

/// The probe point at `addr`, if one was ever made (lock-free; signal-safe).
pub fn lookup(addr: usize) -> Option<&'static ProbePoint> {
    let mut i = hash(addr);
    loop {
        let p = TABLE[i].load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: table entries point to leaked, never-freed probe points.
        let pp = unsafe { &*p };
        if pp.addr == addr {
            return Some(pp);
        }
        i = (i + 1) & (TABLE_SIZE - 1);
    }
}

/// The table is full.
#[derive(Clone, Copy, Debug)]
pub struct TableFull;

/// Puts `pp` in the table, replacing the point at the same address if any. Under the lock.
pub fn insert(pp: &'static ProbePoint) -> Result<(), TableFull> {
    let mut i = hash(pp.addr);
    for _ in 0..TABLE_SIZE / 2 {
        let p = TABLE[i].load(Ordering::Acquire);
        // SAFETY: as in `lookup`.
        if p.is_null() || unsafe { (*p).addr } == pp.addr {
            let n = LISTED.load(Ordering::Relaxed);
            if n == LIST.len() {
                return Err(TableFull);
            }
            let pp = pp as *const ProbePoint as *mut ProbePoint;
            LIST[n].store(pp, Ordering::Release);
            LISTED.store(n + 1, Ordering::Release);
            TABLE[i].store(pp, Ordering::Release);
            return Ok(());
        }
        i = (i + 1) & (TABLE_SIZE - 1);
    }
    Err(TableFull)
}

/// Every point inserted, in order, so that walking them does not read the whole table (a
/// process's end-of-run report walks them, in every forked child too). A point replaced at
/// its address stays listed; [`points`] skips it.
static LIST: [AtomicPtr<ProbePoint>; TABLE_SIZE / 2] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; TABLE_SIZE / 2];
static LISTED: AtomicUsize = AtomicUsize::new(0);

/// Every probe point ever made (the current one at each address).
pub fn points() -> impl Iterator<Item = &'static ProbePoint> {
    LIST[..LISTED.load(Ordering::Acquire).min(LIST.len())].iter().filter_map(|entry| {
        // SAFETY: as in `lookup`.
        let pp = unsafe { entry.load(Ordering::Acquire).as_ref()? };
        lookup(pp.addr).filter(|current| core::ptr::eq(*current, pp))
    })
}

impl ProbePoint {
    /// The line saying that this armed point holds other bytes than the runtime wrote, the
    /// first time it is found so; `name` gives its symbol.
    pub fn changed_message(&self, name: impl FnOnce() -> String) -> Option<String> {
        let mut first = [0u8; 1];
        if !usercopy::copy(&mut first, self.addr) {
            return None; // unmapped meanwhile (a library unloaded behind the loader's back)
        }
        let expected = if self.jump_active.load(Ordering::SeqCst) { JMP_OPCODE } else { INT3 };
        if first[0] == expected || self.changed_reported.swap(true, Ordering::SeqCst) {
            return None;
        }
        Some(format!(
            "probe at {:#x} ({}): its code was changed by something else while it was probed (a kernel uprobe from perf, bpftrace or ftrace, or a debugger): byte {:#04x} where the runtime wrote {expected:#04x}; hits there were not seen",
            self.addr,
            name(),
            first[0]
        ))
    }

    /// Whether probes are registered here.
    pub fn is_armed(&self) -> bool {
        !self.consumers.load(Ordering::SeqCst).is_null()
    }

    /// The registered probes here (under the registry lock, which keeps the list alive).
    pub fn probes(&self) -> Vec<Consumer> {
        let p = self.consumers.load(Ordering::SeqCst);
        if p.is_null() {
            return Vec::new();
        }
        // SAFETY: lists are only freed under the registry lock, which the caller holds.
        unsafe { (*p).probes.clone() }
    }

    /// Replaces the consumers and returns the old list, to be freed once no hit can be
    /// reading it ([`Retired::free`]).
    pub fn replace(&self, probes: Vec<Consumer>) -> Retired {
        // Raised before a list that needs the vectors saved is published, lowered after one
        // that does not: a hit that reads the flag lowered and then a newer list calls the
        // consumers that need them through `insn::vector::saving_vectors`.
        let vectors = probes.iter().any(|c| c.needs_vectors());
        if vectors {
            self.vectors.store(true, Ordering::SeqCst);
        }
        let reads_xmm = probes.iter().any(|c| c.reads_xmm());
        if reads_xmm {
            XMM_READERS.store(true, Ordering::SeqCst);
            self.reads_xmm.store(true, Ordering::SeqCst);
        }
        // The same for counts in the stub: off before a list they would not count for is
        // published, on after one they count for (a hit that read the old word counts as
        // if it came just before the change).
        let count_at = inline_count(&probes);
        if count_at == 0 {
            self.count_at.store(0, Ordering::SeqCst);
        }
        let quick = self.quick_word(&probes);
        if quick == 0 {
            self.quick.store(0, Ordering::SeqCst);
        }
        let new = if probes.is_empty() {
            core::ptr::null_mut()
        } else {
            let generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
            Box::into_raw(Box::new(Consumers { probes, generation }))
        };
        let old = self.consumers.swap(new, Ordering::SeqCst);
        if !vectors {
            self.vectors.store(false, Ordering::SeqCst);
        }
        if !reads_xmm {
            self.reads_xmm.store(false, Ordering::SeqCst);
        }
        if count_at != 0 {
            self.count_at.store(count_at, Ordering::SeqCst);
        }
        if quick != 0 {
            self.quick.store(quick, Ordering::SeqCst);
        }
        Retired(vec![old])
    }

    /// Replaces the consumers and frees the old list after a grace period.
    pub fn publish(&self, probes: Vec<Consumer>) {
        self.replace(probes).free();
    }
}

/// Consumer lists taken out of the table, waiting for a grace period.
#[derive(Default)]
pub struct Retired(Vec<*mut Consumers>);

// SAFETY: the lists are owned by the holder, unpublished, and freed by whichever thread frees
// them (under the registry lock); no other thread writes them.
unsafe impl Send for Retired {}

impl Retired {
    pub const fn new() -> Retired {
        Retired(Vec::new())
    }

    pub fn add(&mut self, other: Retired) {
        self.0.extend(other.0.into_iter().filter(|p| !p.is_null()));
    }

    /// Waits for every hit that may read the lists (one grace period for all) and frees them.
    pub fn free(self) {
        let lists: Vec<*mut Consumers> = self.0.into_iter().filter(|p| !p.is_null()).collect();
        if lists.is_empty() {
            return;
        }
        rcu::synchronize();
        for list in lists {
            // SAFETY: the list came from Box::into_raw in `replace`, is unpublished, and the
            // grace period has ended, so no reader holds it.
            drop(unsafe { Box::from_raw(list) });
        }
    }

    /// Leaves the lists allocated (a forked child: a copied half-done hit may hold them).
    pub fn leak(self) {}
}
