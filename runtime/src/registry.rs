//! The probe table and (un)registration.
//!
//! A probe point is one patched address. Probe points live in a fixed open-addressing table
//! that the hit path reads without locks, and are never freed: a thread that trapped on an
//! `int3` may look its probe point up after the probe was removed, and then still finds how to
//! run the displaced instruction. The list of a point's consumers (the registered `struct
//! uprobe`s) is an immutable snapshot swapped atomically; an old snapshot is freed only after
//! every hit that could have read it has finished (a two-counter grace period, as in SRCU),
//! which is also what lets `unregister_uprobe` promise that none of its handlers still runs.
//!
//! Registration and removal take one mutex; they run in normal context, or on the hit path
//! for requests made from inside a handler, never re-entrantly on one thread (see `api`).

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;

use crate::abi::{Uprobe, Uretprobe};
use crate::decode::{self, BoundaryError, Plan, PlanError, MAX_INSN_LEN};
use crate::jump::{self, JumpPlan, NoJump};
use crate::maps::{self, Mapping};
use crate::resolve::{self, ElfInfo, LoadedModule, ProbeSpec};
use crate::ssol::{SlotError, Slots};
use crate::thread::ThreadState;
use crate::{patch, sys, trap};

const INT3: u8 = 0xcc;
const TABLE_BITS: u32 = 18;
const TABLE_SIZE: usize = 1 << TABLE_BITS;

/// One patched address.
pub struct ProbePoint {
    pub addr: usize,
    /// The displaced instruction's original bytes.
    pub orig: [u8; MAX_INSN_LEN],
    pub len: usize,
    pub plan: Plan,
    /// The out-of-line copy, for `Plan::OutOfLine`.
    pub slot: usize,
    /// Null while no probe is registered here (the original byte is back in place).
    pub consumers: AtomicPtr<Consumers>,
    /// Hits that ran no handler because the thread was already in one, or in the runtime.
    pub missed: AtomicU64,
    /// Whether (and how) this point can take a jump instead of the `int3`, decided once.
    pub jump: Result<JumpPrep, NoJump>,
    /// Whether the jump is in place now (while armed; otherwise the `int3` is).
    pub jump_active: AtomicBool,
    /// Whether the bytes after the first may hold the jump's: from just before the jump is
    /// written until its original bytes are back. A thread that meets the `int3` then must
    /// not resume inside the range: the trap path sends it to the stub's relocated code.
    pub tail_patched: AtomicBool,
}

/// A jump ready to be written: its stub is built and stays for the life of the process.
pub struct JumpPrep {
    pub patch_len: usize,
    /// The original bytes of the patched range.
    pub orig: [u8; MAX_PATCH],
    pub stub: usize,
}

/// The longest range a jump may overwrite (5 bytes rounded up to whole instructions).
const MAX_PATCH: usize = 32;

/// `--no-optimize` clears this: every probe then keeps its `int3`.
pub static OPTIMIZE: AtomicBool = AtomicBool::new(true);
/// `--verbose`: say, for each registration, the strategy chosen and why not a jump.
pub static VERBOSE: AtomicBool = AtomicBool::new(false);

/// The probes registered at one address, in registration order.
pub struct Consumers {
    pub probes: Vec<Consumer>,
}

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
    fn placement(self) -> *mut Uprobe {
        match self {
            Consumer::Uprobe(u) => u,
            Consumer::Uretprobe(rp) => rp.cast(),
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

/// Puts `pp` in the table, replacing the point at the same address if any. Under the lock.
fn insert(pp: &'static ProbePoint) -> Result<(), RegisterError> {
    let mut i = hash(pp.addr);
    for _ in 0..TABLE_SIZE / 2 {
        let p = TABLE[i].load(Ordering::Acquire);
        // SAFETY: as in `lookup`.
        if p.is_null() || unsafe { (*p).addr } == pp.addr {
            TABLE[i].store(pp as *const ProbePoint as *mut ProbePoint, Ordering::Release);
            return Ok(());
        }
        i = (i + 1) & (TABLE_SIZE - 1);
    }
    Err(RegisterError::TableFull)
}

// Grace periods. A hit reads a consumer list inside a read-side section; a writer that
// unpublished a list waits until every section that might have read it has ended.
//
// Each thread owns a reader slot, a sequence number that is odd while the thread is in a
// section. The owner updates it with plain stores, no locked instruction: the writer, after
// unpublishing, makes every thread of the process execute a full barrier with
// membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), so that a reader either had its odd
// sequence visible before the writer scans, or loads the new list. Slots are claimed on a
// thread's first hit and given back by a thread-exit destructor. Threads without a slot
// (more than `READER_SLOTS` at once, or no membarrier) count themselves in two shared
// counters instead, which the writer drains by flipping an epoch, as SRCU does.

const READER_SLOTS: usize = 1024;
const NO_SLOT: u32 = u32::MAX;
/// A reader slot's sequence, alone in its cache line: threads on other cores must not share
/// the line they write at every hit.
#[repr(align(64))]
struct Seq(AtomicU64);

impl core::ops::Deref for Seq {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        &self.0
    }
}

static SLOT_SEQ: [Seq; READER_SLOTS] = [const { Seq(AtomicU64::new(0)) }; READER_SLOTS];
static SLOT_TAKEN: [AtomicBool; READER_SLOTS] = [const { AtomicBool::new(false) }; READER_SLOTS];
/// Whether private expedited membarriers work here (set at start-up).
static FAST_READERS: AtomicBool = AtomicBool::new(false);
static SLOT_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);

static EPOCH: AtomicUsize = AtomicUsize::new(0);
static READERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Enables per-thread reader slots where the kernel has private expedited membarriers and a
/// thread-exit destructor can be had (start-up).
pub fn init_readers() {
    extern "C" fn release(value: *mut libc::c_void) {
        let slot = value as usize - 1;
        SLOT_SEQ[slot].store(0, Ordering::Release);
        SLOT_TAKEN[slot].store(false, Ordering::Release);
    }
    let mut key: libc::pthread_key_t = 0;
    // The key is made first thing at start-up, so it is one of the few a thread descriptor
    // holds inline, and setting it never allocates.
    // SAFETY: pthread_key_create writes the key; `release` has the destructor's signature.
    if unsafe { libc::pthread_key_create(&mut key, Some(release)) } != 0 {
        return;
    }
    SLOT_KEY.store(key as usize, Ordering::Relaxed);
    FAST_READERS.store(sys::membarrier_register_private_expedited(), Ordering::Relaxed);
}

/// In a child after fork: only the forking thread exists, so the other threads' reader
/// slots and shared counts are stale (one may have been mid-section) and are cleared.
fn readers_after_fork() {
    let own = crate::thread::current().reader.get();
    for i in 0..READER_SLOTS {
        if own == 0 || own == NO_SLOT || i != own as usize - 1 {
            SLOT_SEQ[i].store(0, Ordering::Relaxed);
            SLOT_TAKEN[i].store(false, Ordering::Relaxed);
        }
    }
    READERS[0].store(0, Ordering::Relaxed);
    READERS[1].store(0, Ordering::Relaxed);
}

/// Claims a reader slot for the calling thread (its first hit; signal-safe).
fn claim_slot() -> u32 {
    let key = SLOT_KEY.load(Ordering::Relaxed);
    if !FAST_READERS.load(Ordering::Relaxed) || key == usize::MAX {
        return NO_SLOT;
    }
    let start = sys::gettid() as usize % READER_SLOTS;
    for k in 0..READER_SLOTS {
        let i = (start + k) % READER_SLOTS;
        if SLOT_TAKEN[i].compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // SAFETY: a key made at start-up; the value is the slot plus one, never null.
            unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, (i + 1) as *const libc::c_void) };
            return i as u32;
        }
    }
    NO_SLOT
}

/// A read-side section in progress.
pub enum ReadSection {
    Slot(usize),
    Shared(usize),
}

/// Starts a read-side section (signal-safe; never nested on a thread: the hit paths hold the
/// thread's busy mark). End it with [`read_unlock`].
#[inline]
pub fn read_lock(t: &ThreadState) -> ReadSection {
    let mut slot = t.reader.get();
    if slot == 0 {
        slot = match claim_slot() {
            NO_SLOT => NO_SLOT,
            i => i + 1,
        };
        t.reader.set(slot);
    }
    if slot != NO_SLOT {
        let i = slot as usize - 1;
        let seq = SLOT_SEQ[i].load(Ordering::Relaxed);
        SLOT_SEQ[i].store(seq + 1, Ordering::Relaxed);
        // The writer's membarrier orders this store before our loads of the list.
        compiler_fence(Ordering::SeqCst);
        return ReadSection::Slot(i);
    }
    let i = EPOCH.load(Ordering::SeqCst) & 1;
    READERS[i].fetch_add(1, Ordering::SeqCst);
    ReadSection::Shared(i)
}

#[inline]
pub fn read_unlock(section: ReadSection) {
    match section {
        ReadSection::Slot(i) => {
            compiler_fence(Ordering::SeqCst);
            let seq = SLOT_SEQ[i].load(Ordering::Relaxed);
            SLOT_SEQ[i].store(seq + 1, Ordering::Release);
        }
        ReadSection::Shared(i) => {
            READERS[i].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Waits until every read-side section that started before the call has ended.
fn synchronize() {
    if FAST_READERS.load(Ordering::Relaxed) {
        sys::membarrier_private_expedited();
        for i in 0..READER_SLOTS {
            if !SLOT_TAKEN[i].load(Ordering::Acquire) {
                continue;
            }
            let seq = SLOT_SEQ[i].load(Ordering::Acquire);
            if seq % 2 == 1 {
                while SLOT_SEQ[i].load(Ordering::Acquire) == seq {
                    std::thread::yield_now();
                }
            }
        }
    }
    for _ in 0..2 {
        let old = EPOCH.fetch_add(1, Ordering::SeqCst) & 1;
        while READERS[old].load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

/// Replaces `pp`'s consumers and frees the old list once no hit can be reading it.
fn publish(pp: &ProbePoint, probes: Vec<Consumer>) {
    let new = if probes.is_empty() { core::ptr::null_mut() } else { Box::into_raw(Box::new(Consumers { probes })) };
    let old = pp.consumers.swap(new, Ordering::SeqCst);
    if !old.is_null() {
        synchronize();
        // SAFETY: `old` came from Box::into_raw above, is unpublished, and the grace period
        // has ended, so no reader holds it.
        drop(unsafe { Box::from_raw(old) });
    }
}

fn current_probes(pp: &ProbePoint) -> Vec<Consumer> {
    let p = pp.consumers.load(Ordering::SeqCst);
    if p.is_null() {
        return Vec::new();
    }
    // SAFETY: lists are only freed under the registry lock, which the caller holds.
    unsafe { (*p).probes.clone() }
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum RegisterError {
    #[error("pid {0} is not this process ({1})")]
    OtherProcess(i32, i32),
    #[error("this probe object is already registered")]
    AlreadyRegistered,
    #[error("neither vaddr nor symbol_name is set")]
    NoAddress,
    #[error("symbol {0:?} not found in any loaded module")]
    UnknownSymbol(String),
    #[error("module {module:?} is not loaded (symbol {symbol:?})")]
    UnknownModule { module: String, symbol: String },
    #[error("bad probe specification {0:?}: {1}")]
    BadSpec(String, resolve::SpecError),
    #[error("{0:#x} is not in executable code")]
    NotCode(usize),
    #[error("{0:#x} is in {1}, which the kernel does not let a process patch")]
    KernelPage(usize, String),
    #[error("{0:#x} is {1}, which the runtime's hit path itself calls")]
    UsedByHitPath(usize, &'static str),
    #[error("{0:#x} is inside the runtime itself")]
    InRuntime(usize),
    #[error("{addr:#x} is not an instruction boundary of {function}: {source}")]
    NotBoundary { addr: usize, function: String, source: BoundaryError },
    #[error("{0:#x} does not decode as an instruction")]
    Undecodable(usize),
    #[error("{0:#x} holds a breakpoint that is not ours")]
    ForeignBreakpoint(usize),
    #[error("the instruction at {addr:#x} cannot be probed: {source}")]
    Unsupported { addr: usize, source: PlanError },
    #[error("the instruction at {addr:#x} needs an out-of-line slot: {source}")]
    Slot { addr: usize, source: SlotError },
    #[error("cannot patch {addr:#x}: {source}")]
    Patch { addr: usize, source: patch::PatchError },
    #[error(
        "{addr:#x} is not the first instruction of {function} (at {start:#x}): return probes go on a function's entry"
    )]
    NotEntry { addr: usize, function: String, start: usize },
    #[error("return probes are refused in Go programs: Go moves goroutine stacks and walks return addresses, which a replaced return address breaks")]
    GoProgram,
    #[error("the probe table is full")]
    TableFull,
}

impl RegisterError {
    /// The negative errno `register_uprobe` returns for this error.
    pub fn errno(&self) -> i32 {
        use RegisterError::*;
        -match self {
            OtherProcess(..) => libc::ESRCH,
            AlreadyRegistered => libc::EEXIST,
            UnknownSymbol(_) | UnknownModule { .. } => libc::ENOENT,
            ForeignBreakpoint(_) => libc::EBUSY,
            Slot { .. } | TableFull => libc::ENOMEM,
            GoProgram => libc::ENOTSUP,
            Patch { source, .. } => source.errno,
            NoAddress
            | BadSpec(..)
            | NotCode(_)
            | KernelPage(..)
            | InRuntime(_)
            | UsedByHitPath(..)
            | NotBoundary { .. }
            | Undecodable(_)
            | Unsupported { .. }
            | NotEntry { .. } => libc::EINVAL,
        }
    }
}

struct State {
    /// Registered probe objects and their addresses.
    registered: BTreeMap<usize, usize>,
    /// Registered "module:symbol" probes whose module is not loaded (see `arm_pending`), by
    /// probe object; true for return probes.
    pending: BTreeMap<usize, bool>,
    elf: BTreeMap<String, Arc<ElfInfo>>,
    slots: Slots,
    /// The address space as last read, and the loader's (adds, subs) counters then.
    maps: Option<Arc<Vec<Mapping>>>,
    maps_generation: (u64, u64),
}

static STATE: Mutex<State> = Mutex::new(State {
    registered: BTreeMap::new(),
    pending: BTreeMap::new(),
    elf: BTreeMap::new(),
    slots: Slots::new(),
    maps: None,
    maps_generation: (0, 0),
});

/// The dynamic loader's counts of objects loaded and unloaded so far.
fn loader_generation() -> (u64, u64) {
    extern "C" fn first(info: *mut libc::dl_phdr_info, _size: usize, out: *mut libc::c_void) -> libc::c_int {
        // SAFETY: the loader passes a valid dl_phdr_info; `out` is the (u64, u64) we passed.
        unsafe { *(out as *mut (u64, u64)) = ((*info).dlpi_adds, (*info).dlpi_subs) };
        1
    }
    let mut generation = (0u64, 0u64);
    // SAFETY: the callback matches dl_iterate_phdr's signature and writes only `generation`.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut generation as *mut (u64, u64) as *mut libc::c_void) };
    generation
}

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The address of this library's own code, to refuse probes inside the runtime.
fn runtime_addr() -> usize {
    lookup as *const () as usize
}

impl State {
    /// The address space, re-read only when the loader mapped or unmapped a module since the
    /// last read, or when `addr` is not in known executable memory: reading /proc/self/maps at
    /// every registration makes probing thousands of functions slow.
    fn maps(&mut self, addr: Option<usize>) -> Arc<Vec<Mapping>> {
        let generation = loader_generation();
        let fresh = self.maps.as_ref().filter(|maps| {
            generation == self.maps_generation && addr.is_none_or(|a| maps::find(maps, a).is_some_and(|m| m.exec))
        });
        if let Some(maps) = fresh {
            return maps.clone();
        }
        let maps = Arc::new(maps::current());
        self.maps = Some(maps.clone());
        self.maps_generation = generation;
        maps
    }

    /// Whether the main program is written in Go (it has Go's build-info section or runtime).
    fn main_is_go(&mut self) -> bool {
        let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
            return false;
        };
        let Some(path) = exe.to_str() else {
            return false;
        };
        self.elf(path).is_some_and(|info| info.is_go())
    }

    /// `symbol+0xoff` for a run-time code address, where a symbol covers it.
    fn symbolize(&mut self, addr: usize) -> Option<String> {
        let maps = self.maps(Some(addr));
        let modules = resolve::loaded_modules(&maps);
        let module = modules.iter().find(|m| m.holds(addr))?;
        let info = self.elf(&module.path)?;
        let bias = info.bias(module.first_start, module.first_offset)?;
        let sym = info.containing(addr.wrapping_sub(bias) as u64)?;
        Some(format!("{}+{:#x}", sym.name, addr - bias.wrapping_add(sym.value as usize)))
    }

    fn elf(&mut self, path: &str) -> Option<Arc<ElfInfo>> {
        if let Some(info) = self.elf.get(path) {
            return Some(info.clone());
        }
        let data = std::fs::read(path).ok()?;
        let info = Arc::new(ElfInfo::parse(&data).ok()?);
        self.elf.insert(path.to_string(), info.clone());
        Some(info)
    }

    /// The run-time address of `name` in `module`, following IFUNCs to their implementation.
    fn symbol_in(&mut self, module: &LoadedModule, name: &str) -> Option<usize> {
        let info = self.elf(&module.path)?;
        let sym = info.symbol(name)?;
        let bias = info.bias(module.first_start, module.first_offset)?;
        let addr = bias.wrapping_add(sym.value as usize);
        // An IFUNC's own address is its resolver: probe the implementation the loader chose,
        // or the resolver where the loader does not say (private symbols).
        Some(if sym.ifunc { ifunc_target(&module.path, name).unwrap_or(addr) } else { addr })
    }

    fn resolve(&mut self, spec: &ProbeSpec, maps: &[Mapping]) -> Result<usize, RegisterError> {
        let (module, name, offset) = match *spec {
            ProbeSpec::Address(a) => return Ok(a as usize),
            ProbeSpec::Symbol { module, name, offset } => (module, name, offset as usize),
        };
        let modules = resolve::loaded_modules(maps);
        let candidates: Vec<&LoadedModule> = match module {
            Some(m) => {
                let found: Vec<_> = modules.iter().filter(|x| resolve::module_matches(&x.path, m)).collect();
                if found.is_empty() {
                    return Err(RegisterError::UnknownModule { module: m.into(), symbol: name.into() });
                }
                found
            }
            None => modules.iter().collect(),
        };
        candidates
            .into_iter()
            .find_map(|m| self.symbol_in(m, name))
            .map(|a| a.wrapping_add(offset))
            .ok_or_else(|| RegisterError::UnknownSymbol(name.into()))
    }

    /// The bytes of the function holding `addr` as they were before any probe, its name, and
    /// its start; None where no sized symbol covers the address.
    fn function_at(&mut self, addr: usize, maps: &[Mapping]) -> Option<(String, usize, Vec<u8>)> {
        self.function_code(addr, maps).map(|f| (f.name, f.start, f.bytes))
    }

    fn function_code(&mut self, addr: usize, maps: &[Mapping]) -> Option<FunctionCode> {
        let modules = resolve::loaded_modules(maps);
        let module = modules.iter().find(|m| m.holds(addr))?;
        let info = self.elf(&module.path)?;
        let bias = info.bias(module.first_start, module.first_offset)?;
        let sym = info.containing(addr.wrapping_sub(bias) as u64)?;
        let start = bias.wrapping_add(sym.value as usize);
        let text = maps::find(maps, start).filter(|m| m.exec && start + sym.size as usize <= m.end)?;
        let end = start + sym.size as usize;
        // The padding after the function: up to the next symbol, at most 16 bytes, same mapping.
        let next =
            info.next_symbol_after(sym.value + sym.size - 1).map_or(usize::MAX, |v| bias.wrapping_add(v as usize));
        let padding_end = next.min(end + 16).min(text.end).max(end);
        // SAFETY: the function and its padding lie inside one executable (hence readable) mapping.
        let mut bytes = unsafe { patch::read_code(start, padding_end - start) };
        unpatch(&mut bytes, start);
        let padding = bytes.split_off(sym.size as usize);
        Some(FunctionCode { name: sym.name.clone(), start, bytes, padding })
    }
}

struct FunctionCode {
    name: String,
    start: usize,
    bytes: Vec<u8>,
    padding: Vec<u8>,
}

/// Puts back the original bytes of every armed probe point inside `bytes` (at `start`): the
/// first byte of an `int3`, the whole range of a jump.
fn unpatch(bytes: &mut [u8], start: usize) {
    for i in 0..bytes.len() {
        let Some(pp) = lookup(start + i).filter(|pp| !pp.consumers.load(Ordering::SeqCst).is_null()) else {
            continue;
        };
        match &pp.jump {
            Ok(prep) if pp.jump_active.load(Ordering::SeqCst) => {
                let n = prep.patch_len.min(bytes.len() - i);
                bytes[i..i + n].copy_from_slice(&prep.orig[..n]);
            }
            _ if bytes[i] == INT3 => bytes[i] = pp.orig[0],
            _ => {}
        }
    }
}

/// Whether this process has a single thread (the caller), from /proc/self/status.
fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Threads:").map(|n| n.trim() == "1")))
        .unwrap_or(false)
}

/// The protection of the page holding `addr`.
fn prot_at(st: &mut State, addr: usize) -> i32 {
    maps::find(&st.maps(Some(addr)), addr).map_or(libc::PROT_READ | libc::PROT_EXEC, Mapping::prot)
}

/// Replaces the `int3` at an armed point by its jump, when that is safe now.
fn install_jump(st: &mut State, pp: &ProbePoint) -> Result<(), NoJump> {
    if !OPTIMIZE.load(Ordering::Relaxed) {
        return Err(NoJump::Disabled);
    }
    let prep = pp.jump.as_ref().map_err(Clone::clone)?;
    if pp.jump_active.load(Ordering::SeqCst) {
        return Ok(());
    }
    // No thread may be stopped inside the bytes about to change: only a lone thread, not
    // interrupted in arbitrary code by a trap, may put a jump in.
    if trap::in_signal() || !single_threaded() {
        return Err(NoJump::Live);
    }
    if let Some(k) = (1..prep.patch_len).find(|k| lookup(pp.addr + k).is_some_and(is_armed)) {
        return Err(NoJump::ProbeInside { at: (pp.addr + k) as u64 });
    }
    let bytes = jump::patch_bytes(pp.addr as u64, prep.stub as u64, prep.patch_len);
    let prot = prot_at(st, pp.addr);
    // int3 first (already there), then the tail, then the first byte; each step is synced.
    pp.tail_patched.store(true, Ordering::SeqCst);
    if let Err(e) = patch::write_code(pp.addr + 1, &bytes[1..], prot) {
        pp.tail_patched.store(false, Ordering::SeqCst);
        return Err(NoJump::Stub(e.to_string()));
    }
    // Cannot fail now that the same pages took the tail; if it did, the int3 stays and
    // threads meeting it go through the stub's relocated code.
    let _ = patch::write_code(pp.addr, &bytes[..1], prot);
    pp.jump_active.store(true, Ordering::SeqCst);
    Ok(())
}

/// Puts the `int3` back in place of an active jump (the point stays armed).
fn remove_jump(st: &mut State, pp: &ProbePoint) {
    let Ok(prep) = &pp.jump else {
        return;
    };
    if !pp.jump_active.swap(false, Ordering::SeqCst) {
        return;
    }
    let prot = prot_at(st, pp.addr);
    // A thread meeting the int3 meanwhile is sent to the stub's relocated code.
    let _ = patch::write_code(pp.addr, &[INT3], prot);
    if patch::write_code(pp.addr + 1, &prep.orig[1..prep.patch_len], prot).is_ok() {
        pp.tail_patched.store(false, Ordering::SeqCst);
    }
}

/// Removes the active jump whose patched range holds `addr`, if any, so a probe can go there.
fn make_room_at(st: &mut State, addr: usize) {
    for k in 1..MAX_PATCH {
        if let Some(pp) = addr.checked_sub(k).and_then(lookup) {
            if matches!(&pp.jump, Ok(prep) if k < prep.patch_len) && pp.jump_active.load(Ordering::SeqCst) {
                remove_jump(st, pp);
            }
        }
    }
}

fn is_armed(pp: &ProbePoint) -> bool {
    !pp.consumers.load(Ordering::SeqCst).is_null()
}

/// Whether an armed point's patch is still in the text: a library unloaded and another mapped
/// at the same address leaves consumers behind without it. The caller checked that the
/// address is executable (hence readable).
fn is_live(pp: &ProbePoint) -> bool {
    // SAFETY: see above.
    let first = unsafe { *(pp.addr as *const u8) };
    is_armed(pp) && (first == INT3 || (first == jump::JMP_OPCODE && pp.jump_active.load(Ordering::SeqCst)))
}

/// The implementation an IFUNC symbol resolves to, as the dynamic loader chose it.
fn ifunc_target(path: &str, name: &str) -> Option<usize> {
    let path = std::ffi::CString::new(path).ok()?;
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: RTLD_NOLOAD only looks up a library that is already loaded; dlsym is given
    // NUL-terminated strings and a handle that dlopen returned.
    unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if handle.is_null() {
            return None;
        }
        let addr = libc::dlsym(handle, name.as_ptr());
        libc::dlclose(handle);
        (!addr.is_null()).then_some(addr as usize)
    }
}

/// Where a probe object asks to be placed.
fn target_of(u: &Uprobe) -> Result<ProbeSpecOwned, RegisterError> {
    if !u.symbol_name.is_null() {
        // SAFETY: the C ABI says symbol_name is a NUL-terminated string when set.
        let name = unsafe { CStr::from_ptr(u.symbol_name) }.to_string_lossy().into_owned();
        return Ok(ProbeSpecOwned::Symbol(name, u.offset));
    }
    if u.vaddr == 0 {
        return Err(RegisterError::NoAddress);
    }
    Ok(ProbeSpecOwned::Address(u.vaddr as usize))
}

enum ProbeSpecOwned {
    Address(usize),
    Symbol(String, u64),
}

/// The run-time address of a probe specification string (`uprobe_lookup`).
pub fn lookup_spec(spec: &str) -> Result<usize, RegisterError> {
    let parsed = resolve::parse_spec(spec).map_err(|e| RegisterError::BadSpec(spec.into(), e))?;
    let mut st = state();
    let maps = st.maps(None);
    st.resolve(&parsed, &maps)
}

/// Registers a probe object (normal context, or the hit path on behalf of a handler).
///
/// # Safety
/// The object must stay valid until it is unregistered.
pub unsafe fn register(consumer: Consumer) -> Result<usize, RegisterError> {
    // SAFETY: the caller passes a probe object that stays valid while registered (C ABI).
    let probe = unsafe { &*consumer.placement() };
    let me = sys::getpid();
    if probe.pid != 0 && probe.pid != me {
        return Err(RegisterError::OtherProcess(probe.pid, me));
    }
    let target = target_of(probe)?;
    let mut st = state();
    if st.registered.contains_key(&consumer.key()) || st.pending.contains_key(&consumer.key()) {
        return Err(RegisterError::AlreadyRegistered);
    }
    if matches!(consumer, Consumer::Uretprobe(_)) && st.main_is_go() {
        return Err(RegisterError::GoProgram);
    }
    let addr = match target {
        ProbeSpecOwned::Address(a) => a,
        ProbeSpecOwned::Symbol(name, offset) => {
            let spec = resolve::parse_spec(&name).map_err(|e| RegisterError::BadSpec(name.clone(), e))?;
            let maps = st.maps(None);
            match st.resolve(&spec, &maps) {
                // Armed when the module is loaded (`pending`); 0 says so to the caller.
                Err(RegisterError::UnknownModule { .. }) => {
                    st.pending.insert(consumer.key(), matches!(consumer, Consumer::Uretprobe(_)));
                    return Ok(0);
                }
                resolved => resolved?.wrapping_add(offset as usize),
            }
        }
    };
    place(&mut st, consumer, addr)?;
    Ok(addr)
}

/// Arms `addr` for `consumer` (or joins the probes there) and records it as registered.
fn place(st: &mut State, consumer: Consumer, addr: usize) -> Result<(), RegisterError> {
    let maps = st.maps(Some(addr));
    if matches!(consumer, Consumer::Uretprobe(_)) {
        if let Some((function, start, _)) = st.function_at(addr, &maps).filter(|(_, start, _)| *start != addr) {
            return Err(RegisterError::NotEntry { addr, function, start });
        }
    }
    let pp = match lookup(addr).filter(|pp| maps::find(&maps, addr).is_some_and(|m| m.exec) && is_live(pp)) {
        Some(pp) => pp,
        None => {
            make_room_at(st, addr);
            arm(st, addr, &maps)?
        }
    };
    let mut probes = current_probes(pp);
    probes.push(consumer);
    publish(pp, probes);
    st.registered.insert(consumer.key(), addr);
    // Like kprobes filling in `addr`: the object now says where it was placed.
    // SAFETY: the object is valid (caller) and owned by the registry until unregistered.
    unsafe { (*consumer.placement()).vaddr = addr as _ };
    let strategy = install_jump(st, pp);
    if VERBOSE.load(Ordering::Relaxed) {
        let name = st.symbolize(addr).unwrap_or_default();
        match strategy {
            Ok(()) => crate::output::message(format_args!("probe at {addr:#x} ({name}): jump")),
            Err(why) => crate::output::message(format_args!("probe at {addr:#x} ({name}): int3 ({why})")),
        }
    }
    Ok(())
}

/// Makes `addr` a live probe point: checks it, prepares the displaced instruction, writes the
/// `int3`. Returns with no consumers published yet (the hit path then runs no handler).
fn arm(st: &mut State, addr: usize, maps: &[Mapping]) -> Result<&'static ProbePoint, RegisterError> {
    let mapping = maps::find(maps, addr).filter(|m| m.exec).ok_or(RegisterError::NotCode(addr))?;
    if matches!(mapping.path.as_str(), "[vdso]" | "[vsyscall]") {
        return Err(RegisterError::KernelPage(addr, mapping.path.clone()));
    }
    if mapping.contains(runtime_addr()) {
        return Err(RegisterError::InRuntime(addr));
    }
    if addr == tls_get_addr() {
        return Err(RegisterError::UsedByHitPath(addr, "__tls_get_addr"));
    }
    // SAFETY: the mapping is executable, hence readable; reads stop at its end.
    if unsafe { *(addr as *const u8) } == INT3 {
        return Err(RegisterError::ForeignBreakpoint(addr));
    }
    let function = st.function_code(addr, maps);
    let insn = match &function {
        Some(f) => {
            decode::check_boundary(&f.bytes, f.start as u64, addr as u64)
                .map_err(|source| RegisterError::NotBoundary { addr, function: f.name.clone(), source })?;
            decode::decode_at(&f.bytes[addr - f.start..], addr as u64)
        }
        None => {
            let len = MAX_INSN_LEN.min(mapping.end - addr);
            // SAFETY: the range lies inside the executable mapping.
            let mut bytes = unsafe { patch::read_code(addr, len) };
            unpatch(&mut bytes, addr);
            decode::decode_at(&bytes, addr as u64)
        }
    }
    .ok_or(RegisterError::Undecodable(addr))?;
    let reuse = lookup(addr).filter(|pp| {
        // SAFETY: the old point's bytes were read from this mapping, which is still there.
        pp.len == insn.len() && unsafe { patch::read_code(addr, pp.len) } == pp.orig[..pp.len]
    });
    let pp = match reuse {
        Some(pp) => pp,
        None => {
            let plan = decode::plan(&insn).map_err(|source| match source {
                PlanError::Breakpoint => RegisterError::ForeignBreakpoint(addr),
                _ => RegisterError::Unsupported { addr, source },
            })?;
            let slot = match plan {
                Plan::OutOfLine => st
                    .slots
                    .alloc(addr, |slot| decode::relocate(&insn, slot as u64).ok())
                    .map_err(|source| RegisterError::Slot { addr, source })?,
                Plan::Emulate(_) => 0,
            };
            let mut orig = [0; MAX_INSN_LEN];
            // SAFETY: the instruction lies inside the executable mapping.
            orig[..insn.len()].copy_from_slice(&unsafe { patch::read_code(addr, insn.len()) });
            let mut pp = Box::new(ProbePoint {
                addr,
                orig,
                len: insn.len(),
                plan,
                slot,
                consumers: AtomicPtr::new(core::ptr::null_mut()),
                missed: AtomicU64::new(0),
                jump: Err(NoJump::NoFunction),
                jump_active: AtomicBool::new(false),
                tail_patched: AtomicBool::new(false),
            });
            let pp_addr = &*pp as *const ProbePoint as u64;
            pp.jump = match &function {
                None => Err(NoJump::NoFunction),
                Some(f) if f.start != addr => Err(NoJump::NotEntry),
                Some(f) => {
                    jump::plan(&f.bytes, addr as u64, &f.padding).and_then(|plan| prepare_jump(st, &plan, pp_addr))
                }
            };
            let pp: &'static ProbePoint = Box::leak(pp);
            insert(pp)?;
            pp
        }
    };
    patch::write_code(addr, &[INT3], mapping.prot()).map_err(|source| RegisterError::Patch { addr, source })?;
    Ok(pp)
}

/// Builds the stub of a planned jump and keeps the bytes the jump will overwrite.
fn prepare_jump(st: &mut State, plan: &JumpPlan, pp: u64) -> Result<JumpPrep, NoJump> {
    let addr = plan.covered[0].ip() as usize;
    if plan.patch_len > MAX_PATCH {
        return Err(NoJump::TooShort { len: plan.patch_len as u64 });
    }
    let common = jump::common_entry();
    let stub = st
        .slots
        .alloc_sized(addr, jump::STUB_SIZE, |s| jump::build_stub(plan, s as u64, pp, common).ok())
        .map_err(|e| NoJump::Stub(e.to_string()))?;
    let mut orig = [0; MAX_PATCH];
    // SAFETY: the range is the function's first bytes and the padding checked after it, all
    // inside the executable mapping; the int3 of this point is not written yet.
    orig[..plan.patch_len].copy_from_slice(&unsafe { patch::read_code(addr, plan.patch_len) });
    Ok(JumpPrep { patch_len: plan.patch_len, orig, stub })
}

/// The address of `__tls_get_addr`, which the hit path itself calls.
fn tls_get_addr() -> usize {
    // SAFETY: dlsym with RTLD_DEFAULT and a C string.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__tls_get_addr".as_ptr()) as usize }
}

/// Removes `u`; when it was the last probe at its address, the original byte goes back.
/// On return no handler of `u` is running or will run.
pub fn unregister(consumer: Consumer) {
    let mut st = state();
    if st.pending.remove(&consumer.key()).is_some() {
        return;
    }
    let Some(addr) = st.registered.remove(&consumer.key()) else {
        return;
    };
    let Some(pp) = lookup(addr) else {
        return;
    };
    let mut probes = current_probes(pp);
    probes.retain(|&p| p != consumer);
    if probes.is_empty() {
        remove_jump(&mut st, pp);
        let prot = prot_at(&mut st, addr);
        // A failure leaves the int3 in place: hits then run no handler and stay correct.
        let _ = patch::write_code(addr, &pp.orig[..1], prot);
    }
    publish(pp, probes);
    drop(st);
}

/// `symbol+0xoff` for a run-time code address, where a symbol covers it.
pub fn symbolize(addr: usize) -> Option<String> {
    state().symbolize(addr)
}

/// Whether the main program is written in Go.
pub fn main_is_go() -> bool {
    state().main_is_go()
}

/// Arms the pending probes whose module is now loaded (after `dlopen`). Returns each probe
/// that left the pending list, with its address or why it could not be placed.
pub fn arm_pending() -> Vec<(Consumer, Result<usize, RegisterError>)> {
    let mut st = state();
    let mut done = Vec::new();
    let pending: Vec<Consumer> = st
        .pending
        .iter()
        .map(
            |(&key, &ret)| {
                if ret {
                    Consumer::Uretprobe(key as *mut Uretprobe)
                } else {
                    Consumer::Uprobe(key as *mut Uprobe)
                }
            },
        )
        .collect();
    for consumer in pending {
        // SAFETY: registered (pending) probe objects stay valid until unregistered.
        let probe = unsafe { &*consumer.placement() };
        let Ok(ProbeSpecOwned::Symbol(name, offset)) = target_of(probe) else { continue };
        let Ok(spec) = resolve::parse_spec(&name) else { continue };
        let maps = st.maps(None);
        let result = match st.resolve(&spec, &maps) {
            Err(RegisterError::UnknownModule { .. }) => continue,
            Err(e) => Err(e),
            Ok(a) => {
                let addr = a.wrapping_add(offset as usize);
                place(&mut st, consumer, addr).map(|()| addr)
            }
        };
        st.pending.remove(&consumer.key());
        done.push((consumer, result));
    }
    done
}

/// Forgets the probes whose code is no longer mapped (after `dlclose`): "module:symbol"
/// probes go back to pending, to be armed when the module is loaded again; the others are
/// returned, with their address, as gone.
pub fn drop_unmapped() -> Vec<(Consumer, usize)> {
    let mut st = state();
    let maps = st.maps(None);
    let gone: Vec<(usize, usize)> = st
        .registered
        .iter()
        .filter(|(_, &addr)| !maps::find(&maps, addr).is_some_and(|m| m.exec))
        .map(|(&key, &addr)| (key, addr))
        .collect();
    let mut dropped = Vec::new();
    for (key, addr) in gone {
        st.registered.remove(&key);
        let Some(pp) = lookup(addr) else { continue };
        let mut probes = current_probes(pp);
        let Some(&consumer) = probes.iter().find(|c| c.key() == key) else { continue };
        probes.retain(|c| c.key() != key);
        // The code is gone, and its int3 with it: nothing to write back.
        publish(pp, probes);
        // SAFETY: registered probe objects stay valid until unregistered.
        let probe = unsafe { &*consumer.placement() };
        match target_of(probe) {
            Ok(ProbeSpecOwned::Symbol(name, _)) if name.contains(':') => {
                st.pending.insert(key, matches!(consumer, Consumer::Uretprobe(_)));
            }
            _ => dropped.push((consumer, addr)),
        }
    }
    dropped
}

thread_local! {
    /// The registry lock, held by the forking thread from `fork`'s prepare step until the
    /// parent and the child go on.
    static FORK_GUARD: std::cell::RefCell<Option<std::sync::MutexGuard<'static, State>>> =
        const { std::cell::RefCell::new(None) };
}

/// `fork` prepare step: takes the registry lock, so that the child does not inherit it held by
/// a thread that does not exist there.
pub fn fork_prepare() {
    let guard = state();
    FORK_GUARD.with(|g| *g.borrow_mut() = Some(guard));
}

/// `fork`, parent side: lets the registry go.
pub fn fork_parent() {
    FORK_GUARD.with(|g| g.borrow_mut().take());
}

/// `fork`, child side (one thread). Read-side sections of the parent's other threads were
/// copied half-done and will never end here: forget them, or the child's first unregister
/// would wait for them forever. With `disarm`, the child gets its original code back: every
/// armed probe point is restored and forgotten, without waiting for a grace period (no other
/// thread exists).
pub fn fork_child(disarm: bool, in_handler: bool) {
    let Some(mut st) = FORK_GUARD.with(|g| g.borrow_mut().take()) else {
        return;
    };
    if !in_handler {
        readers_after_fork();
    }
    if !disarm {
        return;
    }
    for entry in TABLE.iter() {
        let p = entry.load(Ordering::Acquire);
        // SAFETY: as in `lookup`.
        let Some(pp) = (unsafe { p.as_ref() }) else { continue };
        if pp.consumers.load(Ordering::SeqCst).is_null() {
            continue;
        }
        let prot = prot_at(&mut st, pp.addr);
        match &pp.jump {
            Ok(prep) if pp.jump_active.swap(false, Ordering::SeqCst) => {
                let _ = patch::write_code(pp.addr, &prep.orig[..prep.patch_len], prot);
                pp.tail_patched.store(false, Ordering::SeqCst);
            }
            _ => {
                let _ = patch::write_code(pp.addr, &pp.orig[..1], prot);
            }
        }
        // The old list is left allocated: a copied half-done hit may still hold it.
        pp.consumers.store(core::ptr::null_mut(), Ordering::SeqCst);
    }
    st.registered.clear();
}

/// Says, for every probe point, how many hits ran no handler because the thread was already
/// running one (process exit).
pub fn report_missed() {
    for entry in TABLE.iter() {
        let p = entry.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        // SAFETY: as in `lookup`.
        let pp = unsafe { &*p };
        let missed = pp.missed.load(Ordering::Relaxed);
        if missed > 0 {
            let name = symbolize(pp.addr).unwrap_or_default();
            crate::output::message(format_args!(
                "probe at {:#x} ({name}): {missed} hits ran no handler (they came from a handler or from the runtime itself)",
                pp.addr
            ));
        }
    }
}
