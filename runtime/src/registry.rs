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
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;

use crate::abi::{Uprobe, Uretprobe};
use crate::decode::{self, BoundaryError, Plan, PlanError, MAX_INSN_LEN};
use crate::maps::{self, Mapping};
use crate::resolve::{self, ElfInfo, LoadedModule, ProbeSpec};
use crate::ssol::{SlotError, Slots};
use crate::{patch, sys};

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
    /// Hits, and hits that ran no handler because the thread was already in one.
    pub hits: AtomicU64,
    pub missed: AtomicU64,
}

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

// Grace periods: readers count themselves in one of two counters; a writer waits for both to
// drain after unpublishing, flipping the epoch so that new readers use the other counter.
static EPOCH: AtomicUsize = AtomicUsize::new(0);
static READERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Starts a read-side section (signal-safe). Pass the result to [`read_unlock`].
pub fn read_lock() -> usize {
    let i = EPOCH.load(Ordering::SeqCst) & 1;
    READERS[i].fetch_add(1, Ordering::SeqCst);
    i
}

pub fn read_unlock(i: usize) {
    READERS[i].fetch_sub(1, Ordering::SeqCst);
}

/// Waits until every read-side section that started before the call has ended.
fn synchronize() {
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
    // SAFETY: lists are only freed under the registry lock, which the caller holds.
    if p.is_null() {
        Vec::new()
    } else {
        unsafe { (*p).probes.clone() }
    }
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
        let modules = resolve::loaded_modules(maps);
        let module = modules.iter().find(|m| m.holds(addr))?;
        let info = self.elf(&module.path)?;
        let bias = info.bias(module.first_start, module.first_offset)?;
        let sym = info.containing(addr.wrapping_sub(bias) as u64)?;
        let start = bias.wrapping_add(sym.value as usize);
        maps::find(maps, start).filter(|m| m.exec && start + sym.size as usize <= m.end)?;
        // SAFETY: the whole symbol lies inside one executable (hence readable) mapping.
        let mut bytes = unsafe { patch::read_code(start, sym.size as usize) };
        unpatch(&mut bytes, start);
        Some((sym.name.clone(), start, bytes))
    }
}

/// Puts back the original first byte of every armed probe point inside `bytes` (at `start`).
fn unpatch(bytes: &mut [u8], start: usize) {
    for (i, b) in bytes.iter_mut().enumerate() {
        if *b == INT3 {
            if let Some(pp) = lookup(start + i).filter(|pp| !pp.consumers.load(Ordering::SeqCst).is_null()) {
                *b = pp.orig[0];
            }
        }
    }
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
    // A point is live when it has consumers and its int3 is there: a library unloaded and
    // another mapped at the same address leaves consumers behind without the int3.
    // SAFETY: `addr` is in executable (hence readable) memory, or `arm` refuses it below.
    let live =
        |pp: &&ProbePoint| !pp.consumers.load(Ordering::SeqCst).is_null() && unsafe { *(addr as *const u8) } == INT3;
    let pp = match lookup(addr).filter(|pp| maps::find(&maps, addr).is_some_and(|m| m.exec) && live(pp)) {
        Some(pp) => pp,
        None => arm(st, addr, &maps)?,
    };
    let mut probes = current_probes(pp);
    probes.push(consumer);
    publish(pp, probes);
    st.registered.insert(consumer.key(), addr);
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
    // SAFETY: the mapping is executable, hence readable; reads stop at its end.
    if unsafe { *(addr as *const u8) } == INT3 {
        return Err(RegisterError::ForeignBreakpoint(addr));
    }
    let insn =
        match st.function_at(addr, maps) {
            Some((name, start, bytes)) => {
                decode::check_boundary(&bytes, start as u64, addr as u64)
                    .map_err(|source| RegisterError::NotBoundary { addr, function: name.clone(), source })?;
                decode::decode_at(&bytes[addr - start..], addr as u64)
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
            let pp: &'static ProbePoint = Box::leak(Box::new(ProbePoint {
                addr,
                orig,
                len: insn.len(),
                plan,
                slot,
                consumers: AtomicPtr::new(core::ptr::null_mut()),
                hits: AtomicU64::new(0),
                missed: AtomicU64::new(0),
            }));
            insert(pp)?;
            pp
        }
    };
    patch::write_code(addr, &[INT3], mapping.prot()).map_err(|source| RegisterError::Patch { addr, source })?;
    Ok(pp)
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
        let prot = maps::find(&st.maps(Some(addr)), addr).map_or(libc::PROT_READ | libc::PROT_EXEC, Mapping::prot);
        // A failure leaves the int3 in place: hits then run no handler and stay correct.
        let _ = patch::write_code(addr, &pp.orig[..1], prot);
    }
    publish(pp, probes);
    drop(st);
}

/// The address a registered probe object was placed at.
pub fn address_of(u: *mut Uprobe) -> Option<usize> {
    state().registered.get(&(u as usize)).copied()
}

/// `symbol+0xoff` for a run-time code address, where a symbol covers it.
pub fn symbolize(addr: usize) -> Option<String> {
    let mut st = state();
    let maps = st.maps(Some(addr));
    let modules = resolve::loaded_modules(&maps);
    let module = modules.iter().find(|m| m.holds(addr))?;
    let info = st.elf(&module.path)?;
    let bias = info.bias(module.first_start, module.first_offset)?;
    let sym = info.containing(addr.wrapping_sub(bias) as u64)?;
    Some(format!("{}+{:#x}", sym.name, addr - bias.wrapping_add(sym.value as usize)))
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
        READERS.iter().for_each(|r| r.store(0, Ordering::SeqCst));
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
        let prot =
            maps::find(&st.maps(Some(pp.addr)), pp.addr).map_or(libc::PROT_READ | libc::PROT_EXEC, Mapping::prot);
        let _ = patch::write_code(pp.addr, &pp.orig[..1], prot);
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
