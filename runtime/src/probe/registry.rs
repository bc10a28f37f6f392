//! Registration: which probe objects are registered where, which wait for their module, and
//! the placement batch that writes them.
//!
//! Probes registered together are placed as one batch: everything a handler library's
//! `uprobe_init` registers, the pending probes one `dlopen` arms, what one attach places. A
//! registration in a batch is checked and prepared at once (its result and `vaddr` are
//! final), and its bytes are written when the batch closes, all in one pass of the
//! code-writing protocol (`place::write`). A registration outside a batch is a batch of one.
//! A registration from a thread that does not own the open batch writes that batch first, so
//! a probe is always in place when its `register_uprobe` returns to another thread.
//!
//! Normal context, under the registry lock; requests made from inside a handler reach here
//! through `deferred`, after the handlers ran.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::base::abi::{Uprobe, Uretprobe};
use crate::base::elf;
use crate::base::lock::{Mutex, MutexGuard};
use crate::base::stats::{self, Syscalls};
use crate::base::{output, sys};
use crate::insn::patch::Session;
use crate::probe::error::RegisterError;
use crate::probe::extent;
use crate::probe::place::{self, Change, Strategy, Target, WriteError};
use crate::probe::returnable;
use crate::probe::semaphore;
use crate::probe::ssol::Slots;
use crate::probe::symbols::View;
use crate::probe::table::{self, Consumer, ProbePoint, Retired, MAX_PATCH};
use crate::probe::thread;
use crate::probe::vectors;

/// `--verbose`: say, for each registration, the strategy chosen and why not a jump.
pub static VERBOSE: AtomicBool = AtomicBool::new(false);
/// Libraries loaded later are seen (a runtime loaded into a running process follows `dlopen`
/// only during an attach session): "module:symbol" probes may wait for their module.
pub static FOLLOWS_LOADS: AtomicBool = AtomicBool::new(false);

/// A front-end's hook, told (under the registry lock) each time a probe waiting for its module
/// is placed: `fn(probe object key, address)`. 0: none.
pub static ON_ARMED: AtomicUsize = AtomicUsize::new(0);

/// The open placement batch.
pub(super) struct Batch {
    /// The thread that opened it, and how many times it did; 0: none open.
    owner: i32,
    depth: u32,
    /// Points waiting for their bytes.
    pub(super) points: Vec<&'static ProbePoint>,
    /// Points whose last probe was removed in the batch, waiting for their original bytes.
    pub(super) removals: Vec<&'static ProbePoint>,
    /// `--verbose`: each registration's address and symbol, to say its strategy once written.
    verbose: Vec<(usize, String)>,
    /// When the batch's first registration started, and the syscall counts then.
    started: Option<(u64, Syscalls)>,
    /// The ranges made writable for it.
    session: Session,
    /// Consumer lists replaced while it was prepared, freed after one grace period.
    retired: Retired,
}

impl Batch {
    pub(super) fn is_empty(&self) -> bool {
        self.points.is_empty() && self.removals.is_empty()
    }

    pub(super) const fn new() -> Batch {
        Batch {
            owner: 0,
            depth: 0,
            points: Vec::new(),
            removals: Vec::new(),
            verbose: Vec::new(),
            started: None,
            session: Session::new(),
            retired: Retired::new(),
        }
    }
}

/// A probe waiting for its module.
#[derive(Clone, Copy)]
pub(super) struct Pending {
    pub(super) is_return: bool,
    /// It was placed before, and its module unloaded since.
    pub(super) placed_before: bool,
}

pub(super) struct State {
    /// Registered probe objects and their addresses.
    pub(super) registered: vectors::Registered,
    /// Registered "module:symbol" probes whose module is not loaded (see `arm_pending`), by
    /// probe object.
    pub(super) pending: BTreeMap<usize, Pending>,
    pub(super) view: View,
    pub(super) slots: Slots,
    pub(super) batch: Batch,
}

static STATE: Mutex<State> = Mutex::new(State {
    registered: vectors::Registered::new(),
    pending: BTreeMap::new(),
    view: View::new(),
    slots: Slots::new(),
    batch: Batch::new(),
});

pub(super) fn state() -> MutexGuard<'static, State> {
    STATE.lock()
}

/// Opens a placement batch on the calling thread (nesting counts); returns whether this
/// thread owns the open batch. Another thread's open batch is not joined: this thread's
/// registrations are then placed one by one.
pub fn open_batch() -> bool {
    let mut st = state();
    let me = sys::gettid();
    match st.batch.owner {
        0 => {
            st.batch.owner = me;
            st.batch.depth = 1;
            true
        }
        owner if owner == me => {
            st.batch.depth += 1;
            true
        }
        _ => false,
    }
}

/// Closes a batch opened by [`open_batch`] (when it returned true); the outermost close
/// writes it, and returns the probes whose bytes could not be written, with the reason.
pub fn close_batch() -> Vec<(Consumer, RegisterError)> {
    let mut st = state();
    if st.batch.owner != sys::gettid() {
        return Vec::new();
    }
    st.batch.depth -= 1;
    if st.batch.depth > 0 {
        return Vec::new();
    }
    st.batch.owner = 0;
    flush(&mut st)
}

impl State {
    /// Prepares a registration: writes another thread's open batch first, and starts the
    /// clock of this one. Returns whether the caller owns an open batch (else it writes its
    /// registration at once).
    pub(super) fn begin(&mut self) -> bool {
        let me = sys::gettid();
        if self.batch.owner != me && !self.batch.is_empty() {
            flush(self);
        }
        if self.batch.started.is_none() {
            self.batch.started = Some((sys::monotonic_ns(), Syscalls::now()));
        }
        self.batch.owner == me
    }
}

/// Writes the points of the open batch; points whose bytes could not be written lose their
/// probes, which are returned with the reason.
pub(super) fn flush(st: &mut State) -> Vec<(Consumer, RegisterError)> {
    let points = core::mem::take(&mut st.batch.points);
    let armed = points.len();
    let mut changes: Vec<Change> = points.iter().map(|&pp| Change::new(pp, Target::Armed)).collect();
    // A point emptied in the batch may have been joined again since: it then stays armed.
    for pp in core::mem::take(&mut st.batch.removals) {
        if !points.iter().any(|p| core::ptr::eq(*p, pp)) {
            changes.push(Change::new(pp, if pp.is_armed() { Target::Armed } else { Target::Original }));
        }
    }
    let mut session = core::mem::take(&mut st.batch.session);
    place::write(&mut changes, &mut session, &mut st.view, &mut st.slots);
    let mut failed = Vec::new();
    for (i, c) in changes.iter().enumerate() {
        c.pp.queued.store(false, Ordering::SeqCst);
        match &c.result {
            // A failure to take a point out leaves its int3: hits then run no handler.
            _ if i >= armed && c.target == Target::Original => {}
            Ok(strategy) => {
                stats::POINTS_ARMED.add(1);
                if *strategy == Strategy::Jump {
                    stats::JUMPS_WRITTEN.add(1);
                }
            }
            Err(e) => {
                let addr = c.pp.addr;
                let error = match e {
                    WriteError::Patch(source) => RegisterError::Patch { addr, source: *source },
                    WriteError::TrapUnsafe(why) => RegisterError::TrapUnsafe {
                        addr,
                        function: st.view.name_of(addr),
                        blocked: c.pp.trap_unsafe.unwrap_or_default(),
                        why: why.to_string(),
                    },
                };
                for &consumer in &c.pp.probes() {
                    st.registered.remove(consumer.key());
                    semaphore::lower(consumer.key());
                    failed.push((consumer, error.clone()));
                }
                c.pp.publish(Vec::new());
            }
        }
    }
    core::mem::take(&mut st.batch.retired).free();
    if let Some((ns, calls)) = st.batch.started.take() {
        stats::BATCHES.add(1);
        stats::PLACEMENT_NS.add(sys::monotonic_ns().saturating_sub(ns));
        stats::add_placement_syscalls(Syscalls::now().since(calls));
    }
    for (addr, name) in core::mem::take(&mut st.batch.verbose) {
        let strategy = changes.iter().find(|c| c.pp.addr == addr).map(|c| &c.result);
        let strategy =
            strategy.cloned().unwrap_or_else(|| Ok(table::lookup(addr).map_or(Strategy::Original, place::strategy_of)));
        match strategy {
            Ok(Strategy::Jump) => output::message(format_args!("probe at {addr:#x} ({name}): jump")),
            Ok(Strategy::Int3(why)) => output::message(format_args!("probe at {addr:#x} ({name}): int3 ({why})")),
            Ok(Strategy::Original) | Err(_) => {}
        }
    }
    failed
}

/// Where a probe object asks to be placed.
pub(super) enum Where {
    Address(usize),
    Symbol(String, u64),
}

pub(super) fn target_of(u: &Uprobe) -> Result<Where, RegisterError> {
    if !u.symbol_name.is_null() {
        // SAFETY: the C ABI says symbol_name is a NUL-terminated string when set.
        let name = unsafe { CStr::from_ptr(u.symbol_name) }.to_string_lossy().into_owned();
        return Ok(Where::Symbol(name, u.offset));
    }
    if u.vaddr == 0 {
        return Err(RegisterError::NoAddress);
    }
    Ok(Where::Address(u.vaddr as usize))
}

/// Registers a probe object (normal context, or the hit path on behalf of a handler).
/// Returns the address it was placed at, or 0 for a probe waiting for its module.
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
    if consumer.is_return() && st.view.main_is_go() {
        return Err(RegisterError::GoProgram);
    }
    let batched = st.begin();
    let placed = match target {
        Where::Address(a) => extent::check_address(&mut st.view, a).map(|()| Some(a)),
        Where::Symbol(name, offset) => match elf::parse_spec(&name) {
            Err(e) => Err(RegisterError::BadSpec(name.clone(), e)),
            Ok(spec) => match resolve_within(&mut st.view, &spec, offset) {
                // A runtime loaded into a running process sees a later dlopen only while an
                // attach session follows the loads (`hazard::late`): else it would wait forever.
                Err(RegisterError::UnknownModule { module, symbol })
                    if thread::pooled_states() && !FOLLOWS_LOADS.load(Ordering::SeqCst) =>
                {
                    Err(RegisterError::ModuleNotLoadedNow { module, symbol })
                }
                // Armed when the module is loaded (`pending`); 0 says so to the caller.
                Err(RegisterError::UnknownModule { module, .. }) => {
                    st.pending
                        .insert(consumer.key(), Pending { is_return: consumer.is_return(), placed_before: false });
                    if VERBOSE.load(Ordering::Relaxed) {
                        output::message(format_args!(
                            "probe {name} waits for a module named {module:?}: it is placed when one is loaded"
                        ));
                    }
                    Ok(None)
                }
                resolved => resolved.map(Some),
            },
        },
    }
    .and_then(|addr| match addr {
        Some(addr) => place(&mut st, consumer, addr).map(|()| addr),
        None => Ok(0),
    });
    if !batched {
        if let Some((_, e)) = flush(&mut st).into_iter().find(|(c, _)| *c == consumer) {
            return Err(e);
        }
    }
    placed
}

/// The address `spec` names, plus the probe object's own `offset`, inside the function the
/// symbol starts (see `extent`).
pub(super) fn resolve_within(view: &mut View, spec: &elf::ProbeSpec, offset: u64) -> Result<usize, RegisterError> {
    match *spec {
        elf::ProbeSpec::Symbol { module, name, offset: in_spec } => {
            let base = view.resolve(&elf::ProbeSpec::Symbol { module, name, offset: 0 })?;
            let shown = match module {
                Some(m) => format!("{m}:{name}"),
                None => name.to_string(),
            };
            extent::check_offset(view, &shown, base, in_spec.wrapping_add(offset))
        }
        elf::ProbeSpec::Address(a) => {
            let addr = (a as usize).wrapping_add(offset as usize);
            extent::check_address(view, addr).map(|()| addr)
        }
    }
}

/// Joins `consumer` to the point at `addr` (prepared now if needed), records it as
/// registered, and queues the point's bytes in the batch.
pub(super) fn place(st: &mut State, consumer: Consumer, addr: usize) -> Result<(), RegisterError> {
    if consumer.is_return() {
        returnable::check(&mut st.view, addr)?;
    }
    let counter = semaphore::locate(consumer.key(), addr, &st.view.maps(Some(addr)))?;
    let executable = st.view.mapping(addr).is_some_and(|m| m.exec);
    let live =
        |pp: &&ProbePoint| executable && (pp.queued.load(Ordering::SeqCst) || (pp.is_armed() && place::is_written(pp)));
    let pp = match table::lookup(addr).filter(live) {
        Some(pp) => pp,
        None => {
            make_room_at(st, addr);
            place::prepare(&mut st.view, &mut st.slots, addr)?
        }
    };
    let upgradable = pp.jump.is_ok() && !pp.jump_active.load(Ordering::SeqCst);
    let write = !pp.queued.load(Ordering::SeqCst) && (!place::is_written(pp) || upgradable);
    if write {
        let maps = st.view.maps(Some(addr));
        place::open_for(&mut st.batch.session, &maps, addr).map_err(|source| RegisterError::Patch { addr, source })?;
    }
    // Marked and counted before its hits can begin (see `vectors`).
    vectors::mark(&mut st.view, consumer, VERBOSE.load(Ordering::Relaxed));
    st.registered.insert(consumer, addr);
    let mut probes = pp.probes();
    probes.push(consumer);
    let old = pp.replace(probes);
    st.batch.retired.add(old);
    if let Some(at) = counter {
        semaphore::raise(consumer.key(), at);
    }
    // Like kprobes filling in `addr`: the object now says where it was placed.
    // SAFETY: the object is valid (caller) and owned by the registry until unregistered.
    unsafe { (*consumer.placement()).vaddr = addr as _ };
    if VERBOSE.load(Ordering::Relaxed) {
        let name = st.view.name_of(addr);
        st.batch.verbose.push((addr, name));
    }
    if write {
        pp.queued.store(true, Ordering::SeqCst);
        st.batch.points.push(pp);
    }
    Ok(())
}

/// Takes out the active jump whose patched range holds `addr`, if any, so a probe can go
/// there (its point keeps the `int3`).
fn make_room_at(st: &mut State, addr: usize) {
    for k in 1..MAX_PATCH {
        let Some(pp) = addr.checked_sub(k).and_then(table::lookup) else { continue };
        if matches!(&pp.jump, Ok(prep) if k < prep.patch_len) && pp.jump_active.load(Ordering::SeqCst) {
            place::write(&mut [Change::new(pp, Target::Int3)], &mut Session::new(), &mut st.view, &mut st.slots);
        }
    }
}

/// Removes a probe object; when it was the last probe at its address, the original bytes go
/// back. On return no handler of it is running or will run.
pub fn unregister(consumer: Consumer) {
    unregister_all(&[consumer]);
}

/// Removes several probe objects at once: one batch of writes, one grace period. Inside a
/// batch this thread opened, the probes are gone (no handler of theirs runs) when this
/// returns, and their original bytes are written with the batch.
pub fn unregister_all(consumers: &[Consumer]) {
    let mut guard = state();
    let st = &mut *guard;
    let batched = st.batch.owner == sys::gettid();
    if !batched && !st.batch.is_empty() {
        flush(st);
    }
    let mut lists: BTreeMap<usize, Vec<Consumer>> = BTreeMap::new();
    for &consumer in consumers {
        semaphore::release(consumer.key());
        if st.pending.remove(&consumer.key()).is_some() {
            continue;
        }
        let Some(addr) = st.registered.remove(consumer.key()) else { continue };
        semaphore::lower(consumer.key());
        let Some(pp) = table::lookup(addr) else { continue };
        lists.entry(addr).or_insert_with(|| pp.probes()).retain(|&p| p != consumer);
    }
    let emptied: Vec<&'static ProbePoint> =
        lists.iter().filter(|(_, probes)| probes.is_empty()).filter_map(|(&addr, _)| table::lookup(addr)).collect();
    for pp in &emptied {
        if let Some(line) = pp.changed_message(|| st.view.name_of(pp.addr)) {
            output::message(format_args!("{line}"));
        }
    }
    if batched {
        for pp in emptied {
            pp.queued.store(true, Ordering::SeqCst);
            st.batch.removals.push(pp);
        }
    } else {
        let mut changes: Vec<Change> = emptied.into_iter().map(|pp| Change::new(pp, Target::Original)).collect();
        // A failure leaves the int3 in place: hits then run no handler and stay correct.
        place::write(&mut changes, &mut Session::new(), &mut st.view, &mut st.slots);
    }
    let mut retired = Retired::default();
    for (addr, probes) in lists {
        if let Some(pp) = table::lookup(addr) {
            retired.add(pp.replace(probes));
        }
    }
    retired.free();
    // A grace period passed: no handler of theirs runs, so no fault of one needs its line.
    for consumer in consumers {
        super::owners::forget(consumer.key());
    }
}

/// The registered return probes, with their addresses.
pub fn return_probes() -> Vec<(usize, *mut Uretprobe)> {
    let st = state();
    let mut found = Vec::new();
    for addr in st.registered.values() {
        let Some(pp) = table::lookup(addr) else { continue };
        for consumer in pp.probes() {
            if let Consumer::Uretprobe(rp) = consumer {
                if !found.iter().any(|&(_, r)| r == rp) {
                    found.push((addr, rp));
                }
            }
        }
    }
    found
}

/// Runs `f` on the registry's view of the address space and the modules' symbols (normal
/// context; front-ends resolving their definitions, listing functions).
pub fn with_view<R>(f: impl FnOnce(&mut View) -> R) -> R {
    f(&mut state().view)
}

/// Every registered probe object, placed or waiting for its module.
pub fn consumers() -> Vec<Consumer> {
    let st = state();
    let mut all = pending_consumers(&st);
    for (key, addr) in st.registered.iter() {
        if let Some(c) = table::lookup(addr).and_then(|pp| pp.probes().into_iter().find(|c| c.key() == key)) {
            all.push(c);
        }
    }
    all
}

/// `symbol+0xoff` for a run-time code address, where a symbol covers it.
pub fn symbolize(addr: usize) -> Option<String> {
    state().view.symbolize(addr)
}

/// What messages call the code at `addr` (`View::name_of`): never empty.
pub fn name_of(addr: usize) -> String {
    state().view.name_of(addr)
}

/// Like [`symbolize`], but None at once where the registry is busy (its holder may be the very
/// thread asking: an end-of-run report from a fatal signal); Some(None): no symbol covers it.
pub fn try_symbolize(addr: usize) -> Option<Option<String>> {
    STATE.try_lock().map(|mut st| st.view.symbolize(addr))
}

/// Whether the main program is written in Go.
pub fn main_is_go() -> bool {
    state().view.main_is_go()
}

/// The run-time address of a probe specification string (`uprobe_lookup`).
pub fn lookup_spec(spec: &str) -> Result<usize, RegisterError> {
    let parsed = elf::parse_spec(spec).map_err(|e| RegisterError::BadSpec(spec.into(), e))?;
    state().view.resolve(&parsed)
}

/// The probe objects that wait for their module, as the consumers they will be.
pub(super) fn pending_consumers(st: &State) -> Vec<Consumer> {
    st.pending.iter().map(|(&key, p)| pending_consumer(key, p)).collect()
}

pub(super) fn pending_consumer(key: usize, p: &Pending) -> Consumer {
    if p.is_return {
        Consumer::Uretprobe(key as *mut Uretprobe)
    } else {
        Consumer::Uprobe(key as *mut Uprobe)
    }
}
