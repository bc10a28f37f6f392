//! Placing probes: checking an address, preparing how its displaced instruction will run (and,
//! at a function entry, a jump and its stub), and writing the patches of a whole batch.
//!
//! Preparation may read files and call libc (nothing of the batch is written yet). Writing a
//! batch ([`write()`]) follows the code-writing protocol of `insn::patch`, every step once for
//! the whole batch: the ranges made writable, the `int3`s, a sync, the tails of the jumps, a
//! sync, their first bytes, a sync, the protections back. From the first write to the last
//! it calls nothing but its own routines and raw system calls, so the runtime never meets one
//! of the probes it is placing.
//!
//! Normal context, under the registry lock.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::base::maps::Mapping;
use crate::base::sys;
use crate::insn::decode::{self, Plan, PlanError, MAX_INSN_LEN};
use crate::insn::jump::{self, JumpPlan, NoJump, JMP_OPCODE};
use crate::insn::patch::{self, PatchError, Session};
use crate::insn::stub;
use crate::probe::error::RegisterError;
use crate::probe::ssol::Slots;
use crate::probe::symbols::{FunctionCode, View};
use crate::probe::table::{self, JumpPrep, ProbePoint, INT3, MAX_PATCH};
use crate::probe::world::{self, World};

/// `--no-optimize` clears this: every probe then keeps its `int3`.
pub static OPTIMIZE: AtomicBool = AtomicBool::new(true);

/// The address jump stubs call, the common entry of the stub hit path (`dispatch`), given at
/// start-up: placement builds stubs from plain values and knows no hit path.
pub static JUMP_ENTRY: AtomicU64 = AtomicU64::new(0);

/// What a point's bytes should be after a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Armed: the `int3` (or the jump, where [`write()`] finds it safe).
    Armed,
    /// Armed, with the `int3` only (a jump in place is taken out).
    Int3,
    /// The original bytes.
    Original,
}

/// One point to change in a batch, and what became of it.
pub struct Change {
    pub pp: &'static ProbePoint,
    pub target: Target,
    pub result: Result<Strategy, WriteError>,
}

/// Why a point could not be written.
#[derive(Clone, Debug)]
pub enum WriteError {
    Patch(PatchError),
    /// The point must take a jump (`ProbePoint::trap_unsafe`) and cannot now.
    TrapUnsafe(NoJump),
}

impl Change {
    pub fn new(pp: &'static ProbePoint, target: Target) -> Change {
        Change { pp, target, result: Ok(Strategy::Original) }
    }
}

/// How a point ended up after its batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Strategy {
    Jump,
    Int3(NoJump),
    Original,
}

/// How an armed point stands now (for a registration that joined it without a write).
pub fn strategy_of(pp: &ProbePoint) -> Strategy {
    if pp.jump_active.load(Ordering::SeqCst) {
        return Strategy::Jump;
    }
    Strategy::Int3(match &pp.jump {
        Err(why) => why.clone(),
        Ok(_) => NoJump::Live,
    })
}

/// Whether the point's patch is in the text now. The caller checked that the address is
/// executable (hence readable).
pub fn is_written(pp: &ProbePoint) -> bool {
    // SAFETY: see above.
    let first = unsafe { *(pp.addr as *const u8) };
    first == INT3 || (first == JMP_OPCODE && pp.jump_active.load(Ordering::SeqCst))
}

/// The address of this library's own code, to refuse probes inside the runtime.
fn runtime_addr() -> usize {
    table::lookup as *const () as usize
}

/// The address of `__tls_get_addr`, which the hit path itself calls (looked up once).
fn tls_get_addr() -> usize {
    static ADDR: AtomicU64 = AtomicU64::new(0);
    let mut addr = ADDR.load(Ordering::Relaxed) as usize;
    if addr == 0 {
        // SAFETY: dlsym with RTLD_DEFAULT and a C string.
        addr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__tls_get_addr".as_ptr()) as usize };
        ADDR.store(addr as u64, Ordering::Relaxed);
    }
    addr
}

/// What placing a probe at `addr` starts from: the checks every probe passes, the function
/// around it (as before any probe) and the displaced instruction.
struct Site {
    maps: std::sync::Arc<Vec<Mapping>>,
    function: Option<FunctionCode>,
    insn: iced_x86::Instruction,
    /// The function's name and where glibc runs it with every signal blocked, if it does.
    trap_unsafe: Option<(&'static str, &'static str)>,
}

fn examine(view: &mut View, addr: usize) -> Result<Site, RegisterError> {
    let maps = view.maps(Some(addr));
    let mapping = crate::base::maps::find(&maps, addr).filter(|m| m.exec).ok_or(RegisterError::NotCode(addr))?;
    if matches!(mapping.path.as_str(), "[vdso]" | "[vsyscall]") {
        return Err(RegisterError::KernelPage(addr, mapping.path.clone()));
    }
    if mapping.contains(runtime_addr() as u64) {
        return Err(RegisterError::InRuntime(addr));
    }
    if addr == tls_get_addr() {
        return Err(RegisterError::UsedByHitPath(addr, "__tls_get_addr"));
    }
    // SAFETY: the mapping is executable, hence readable; reads stop at its end.
    if unsafe { *(addr as *const u8) } == INT3 {
        return Err(RegisterError::ForeignBreakpoint(addr));
    }
    let function = view.function_code(addr);
    let insn = match &function {
        Some(f) => {
            decode::check_boundary(&f.bytes, f.start as u64, addr as u64)
                .map_err(|source| RegisterError::NotBoundary { addr, function: f.name.clone(), source })?;
            decode::decode_at(&f.bytes[addr - f.start..], addr as u64)
        }
        None => {
            let len = MAX_INSN_LEN.min(mapping.end as usize - addr);
            // SAFETY: the range lies inside the executable mapping.
            let mut bytes = unsafe { patch::read_code(addr, len) };
            view.unpatch(&mut bytes, addr);
            decode::decode_at(&bytes, addr as u64)
        }
    }
    .ok_or(RegisterError::Undecodable(addr))?;
    let trap_unsafe = view.trap_unsafe(addr, function.as_ref().map_or(addr, |f| f.start));
    Ok(Site { maps, function, insn, trap_unsafe })
}

/// How the displaced instruction will run.
fn plan_of(site: &Site, addr: usize) -> Result<Plan, RegisterError> {
    decode::plan(&site.insn).map_err(|source| match source {
        PlanError::Breakpoint => RegisterError::ForeignBreakpoint(addr),
        _ => RegisterError::Unsupported { addr, source },
    })
}

/// Makes `addr` a probe point: checks it and prepares how the displaced instruction will run
/// (and the jump, where it may take one). Nothing is written: the point joins a batch.
pub fn prepare(view: &mut View, slots: &mut Slots, addr: usize) -> Result<&'static ProbePoint, RegisterError> {
    let site = examine(view, addr)?;
    let insn = site.insn;
    // Not one made under an earlier attach session's --no-optimize (its jump never built)
    // when this one may take jumps: a new point replaces it.
    let stale = |pp: &ProbePoint| matches!(pp.jump, Err(NoJump::Disabled)) && OPTIMIZE.load(Ordering::Relaxed);
    let reuse = table::lookup(addr).filter(|pp| {
        // SAFETY: the old point's bytes were read from this mapping, which is still there.
        !stale(pp) && pp.len == insn.len() && unsafe { patch::read_code(addr, pp.len) } == pp.orig[..pp.len]
    });
    if let Some(pp) = reuse {
        // Not written now (the caller checked): the text was replaced (a library unloaded
        // and loaded again), so no jump of it is there either.
        pp.jump_active.store(false, Ordering::SeqCst);
        pp.tail_patched.store(false, Ordering::SeqCst);
        return Ok(pp);
    }
    let plan = plan_of(&site, addr)?;
    let slot = match plan {
        Plan::OutOfLine => slots
            .alloc(addr, &site.maps, |slot| decode::relocate(&insn, slot as u64).ok())
            .map_err(|source| RegisterError::Slot { addr, source })?,
        Plan::Emulate(_) => 0,
    };
    let mut orig = [0; MAX_INSN_LEN];
    // SAFETY: the instruction lies inside the executable mapping.
    orig[..insn.len()].copy_from_slice(&unsafe { patch::read_code(addr, insn.len()) });
    let trap_unsafe = site.trap_unsafe.map(|(_, blocked)| blocked);
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
        jumped: AtomicBool::new(false),
        tail_patched: AtomicBool::new(false),
        vectors: AtomicBool::new(true),
        reads_xmm: AtomicBool::new(false),
        count_at: AtomicUsize::new(0),
        quick: AtomicUsize::new(0),
        queued: AtomicBool::new(false),
        trap_unsafe,
        changed_reported: AtomicBool::new(false),
    });
    let context = &*pp as *const ProbePoint as u64;
    let marker = site.function.as_ref().is_some_and(|f| view.is_marker(addr, f));
    let outside = |len: usize| branch_from_outside(view, site.function.as_ref(), len);
    let required = trap_unsafe.is_some();
    pp.jump = jump_for(site.function.as_ref(), addr, slots, &site.maps, context, required, marker, outside);
    if let (Some((name, blocked)), Err(why)) = (site.trap_unsafe, &pp.jump) {
        return Err(RegisterError::TrapUnsafe { addr, function: name.into(), blocked, why: why.to_string() });
    }
    let pp: &'static ProbePoint = Box::leak(pp);
    table::insert(pp).map_err(|_| RegisterError::TableFull)?;
    view.note_point(pp);
    Ok(pp)
}

/// How a probe at `addr` would be placed, found as [`prepare`] finds it but without making
/// anything (listing what can be probed): a jump, the `int3` and why, or the refusal.
pub fn assess(view: &mut View, addr: usize) -> Result<Strategy, RegisterError> {
    let site = examine(view, addr)?;
    plan_of(&site, addr)?;
    let jump = match &site.function {
        _ if !OPTIMIZE.load(Ordering::Relaxed) && site.trap_unsafe.is_none() => Err(NoJump::Disabled),
        None => Err(NoJump::NoFunction),
        Some(f) if f.start != addr && !view.is_marker(addr, f) => Err(NoJump::NotEntry),
        Some(f) => jump::plan_at(&f.bytes, f.start as u64, addr as u64, &f.padding).and_then(|plan| {
            if plan.patch_len > MAX_PATCH {
                return Err(NoJump::TooShort { len: plan.patch_len as u64 });
            }
            match branch_from_outside(view, Some(f), plan.patch_len) {
                Some((from, to)) => Err(NoJump::BranchIntoPatch { from, to }),
                None => Ok(()),
            }
        }),
    };
    match (jump, site.trap_unsafe) {
        (Ok(()), _) => Ok(Strategy::Jump),
        (Err(why), Some((name, blocked))) => {
            Err(RegisterError::TrapUnsafe { addr, function: name.into(), blocked, why: why.to_string() })
        }
        (Err(why), None) => Ok(Strategy::Int3(why)),
    }
}

/// A direct branch from another function into the first `len` bytes (past the first) of
/// `function`, where its extent comes from its FDE (`nosymbol`): `(from, to)`.
fn branch_from_outside(view: &mut View, function: Option<&FunctionCode>, len: usize) -> Option<(u64, u64)> {
    let f = function.filter(|f| f.from_cfi)?;
    view.branch_from_outside(f.start, f.bytes.len(), len)
}

/// The jump a point at `addr` may take, its stub built: only at a function's entry, and only
/// when jumps are on; `outside` finds a branch from elsewhere into the patched bytes.
#[allow(clippy::too_many_arguments)]
fn jump_for(
    function: Option<&FunctionCode>,
    addr: usize,
    slots: &mut Slots,
    maps: &[Mapping],
    context: u64,
    required: bool,
    marker: bool,
    outside: impl FnOnce(usize) -> Option<(u64, u64)>,
) -> Result<JumpPrep, NoJump> {
    if !OPTIMIZE.load(Ordering::Relaxed) && !required {
        return Err(NoJump::Disabled);
    }
    let f = function.ok_or(NoJump::NoFunction)?;
    if f.start != addr && !marker {
        return Err(NoJump::NotEntry);
    }
    let plan = jump::plan_at(&f.bytes, f.start as u64, addr as u64, &f.padding)?;
    if let Some((from, to)) = outside(plan.patch_len) {
        return Err(NoJump::BranchIntoPatch { from, to });
    }
    prepare_jump(&plan, slots, maps, context)
}

/// Builds the stub of a planned jump and keeps the bytes the jump will overwrite.
fn prepare_jump(plan: &JumpPlan, slots: &mut Slots, maps: &[Mapping], context: u64) -> Result<JumpPrep, NoJump> {
    let addr = plan.covered[0].ip() as usize;
    if plan.patch_len > MAX_PATCH {
        return Err(NoJump::TooShort { len: plan.patch_len as u64 });
    }
    let common = Some(JUMP_ENTRY.load(Ordering::Relaxed)).filter(|&c| c != 0);
    let common = common.ok_or_else(|| NoJump::Stub("no stub entry".into()))?;
    let (entries, at) = (table::stub_entries(context), core::cell::Cell::new((0, 0)));
    let stub = slots
        .alloc_sized(addr, stub::STUB_SIZE, maps, |s| {
            let built = stub::build_stub(plan, s as u64, context, common, entries).ok()?;
            at.set((built.count_entry.map_or(0, |e| s + e), built.quick_entry.map_or(0, |e| s + e)));
            Some(built.code)
        })
        .map_err(|e| NoJump::Stub(e.to_string()))?;
    let mut orig = [0; MAX_PATCH];
    // SAFETY: the range is the function's first bytes and the padding checked after it, all
    // inside the executable mapping; no patch of this point is written yet.
    orig[..plan.patch_len].copy_from_slice(&unsafe { patch::read_code(addr, plan.patch_len) });
    let ((count_entry, quick_entry), patch_len) = (at.get(), plan.patch_len);
    let quick_code = entries.quick.filter(|_| quick_entry != 0).map_or(0, |q| q.code as usize);
    Ok(JumpPrep { patch_len, orig, stub, count_entry, quick_entry, quick_code })
}

/// Set while every other thread of the process is held stopped at a safe place (attach):
/// jumps may then be written although the process has other threads.
pub static WORLD_STOPPED: AtomicBool = AtomicBool::new(false);

/// Whether no other thread may be running the code a batch changes: the process has a single
/// thread (the caller, from /proc/self/status), or the others are held stopped; and the
/// caller did not interrupt arbitrary code of its own (a registration from the trap path).
fn alone() -> bool {
    if crate::probe::thread::in_signal() {
        return false;
    }
    WORLD_STOPPED.load(Ordering::SeqCst) || world::single_program_thread()
}

/// Why `pp` may not take its jump in this batch (None: it may). `targets` are the batch's
/// points and what they become.
fn no_jump(pp: &ProbePoint, alone: bool, targets: &[(usize, Target)]) -> Option<NoJump> {
    if !OPTIMIZE.load(Ordering::Relaxed) && pp.trap_unsafe.is_none() {
        return Some(NoJump::Disabled);
    }
    let prep = match &pp.jump {
        Ok(prep) => prep,
        Err(why) => return Some(why.clone()),
    };
    if pp.jump_active.load(Ordering::SeqCst) {
        return None; // in place already: nothing to write
    }
    if !alone {
        return Some(NoJump::Live);
    }
    let stays_armed = |q: &ProbePoint| {
        targets.iter().find(|(a, _)| *a == q.addr).map_or(q.is_armed(), |(_, t)| *t != Target::Original)
    };
    (1..prep.patch_len)
        .find(|k| table::lookup(pp.addr + k).is_some_and(stays_armed))
        .map(|k| NoJump::ProbeInside { at: (pp.addr + k) as u64 })
}

/// What one change does to its point's bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Nothing to write (already as wanted, or failed).
    None,
    Int3,
    Jump,
    Original,
}

/// Makes the mapping holding `addr` writable for `session` (while the batch is prepared: a
/// refusal, W^X, is then the registration's error).
pub fn open_for(session: &mut Session, maps: &[Mapping], addr: usize) -> Result<(), PatchError> {
    let Some(m) = crate::base::maps::find(maps, addr).filter(|m| m.exec) else {
        return Err(PatchError { page: sys::page_floor(addr), errno: libc::EFAULT });
    };
    session.open(m.start as usize, m.end as usize, crate::base::maps::prot(m), addr)
}

/// Writes a batch of changes into `session`'s ranges (opening those it lacks) and closes it.
/// Each change's `result` says how its point ended up; a change whose pages could not be made
/// writable fails alone. `view` gives the protections.
pub fn write(changes: &mut [Change], session: &mut Session, view: &mut View, slots: &mut Slots) {
    slots.seal();
    if changes.is_empty() {
        session.close();
        return;
    }
    // Decide everything, and reserve every byte of memory, before the first write.
    let wants_jump = |c: &Change| {
        c.target == Target::Armed
            && c.pp.jump.is_ok()
            && (OPTIMIZE.load(Ordering::Relaxed) || c.pp.trap_unsafe.is_some())
    };
    let held_world = world::for_this_thread();
    let alone = changes.iter().any(wants_jump) && (held_world.is_some() || alone());
    let targets: Vec<(usize, Target)> = changes.iter().map(|c| (c.pp.addr, c.target)).collect();
    let mut steps = vec![Step::None; changes.len()];
    for (i, c) in changes.iter_mut().enumerate() {
        let pp = c.pp;
        let (step, strategy) = match c.target {
            Target::Original => (Step::Original, Strategy::Original),
            Target::Int3 => (Step::Int3, Strategy::Int3(NoJump::Live)),
            Target::Armed => match no_jump(pp, alone, &targets) {
                None => (Step::Jump, Strategy::Jump),
                Some(why) if pp.trap_unsafe.is_none() => (Step::Int3, Strategy::Int3(why)),
                Some(why) => {
                    steps[i] = Step::None;
                    c.result = Err(WriteError::TrapUnsafe(why));
                    continue;
                }
            },
        };
        let jumping = pp.jump_active.load(Ordering::SeqCst);
        let unchanged = match step {
            Step::Jump => jumping,
            Step::Int3 => !jumping && first_byte(pp) == INT3 && !pp.tail_patched.load(Ordering::SeqCst),
            _ => !jumping && first_byte(pp) != INT3,
        };
        steps[i] = if unchanged { Step::None } else { step };
        c.result = Ok(strategy);
    }
    // Every mapping written to is writable: opened while the batch was prepared, or now.
    let maps = view.maps(None);
    for (i, c) in changes.iter_mut().enumerate() {
        if steps[i] == Step::None {
            continue;
        }
        if let Err(e) = open_for(session, &maps, c.pp.addr) {
            c.result = Err(WriteError::Patch(e));
            steps[i] = Step::None;
        }
    }
    let held = held_world.filter(|_| steps.iter().any(|s| *s != Step::None)).map(|w| hold(w, changes, &mut steps));
    // From here to `close`: no allocation, no call into libc.
    let mut jump = [INT3; MAX_PATCH];
    // Step 1: an int3 on every first byte that changes.
    let mut wrote = false;
    for (i, c) in changes.iter().enumerate() {
        if steps[i] != Step::None && (c.pp.jump_active.swap(false, Ordering::SeqCst) || first_byte(c.pp) != INT3) {
            session.write(c.pp.addr, &[INT3]);
            wrote = true;
        }
    }
    if wrote {
        patch::sync_cores();
    }
    // Step 2: the tails: a jump's, or the original bytes where a jump is taken out.
    let mut restored = false;
    for (i, c) in changes.iter().enumerate() {
        let (pp, Ok(prep)) = (c.pp, &c.pp.jump) else { continue };
        let n = prep.patch_len;
        if steps[i] == Step::Jump {
            pp.tail_patched.store(true, Ordering::SeqCst);
            jump::patch_bytes(pp.addr as u64, prep.target(pp) as u64, &mut jump[..n]);
            session.write(pp.addr + 1, &jump[1..n]);
        } else if steps[i] != Step::None && pp.tail_patched.load(Ordering::SeqCst) {
            session.write(pp.addr + 1, &prep.orig[1..n]);
            restored = true;
        }
    }
    if steps.contains(&Step::Jump) || restored {
        patch::sync_cores();
    }
    // Step 3: the first bytes: the jump's opcode, or the original byte.
    let mut wrote = false;
    for (i, c) in changes.iter().enumerate() {
        let pp = c.pp;
        match steps[i] {
            Step::None => continue,
            Step::Jump => {
                session.write(pp.addr, &[JMP_OPCODE]);
                pp.jump_active.store(true, Ordering::SeqCst);
                pp.jumped.store(true, Ordering::Relaxed);
                wrote = true;
            }
            Step::Original => {
                session.write(pp.addr, &pp.orig[..1]);
                wrote = true;
            }
            Step::Int3 => pp.jumped.store(false, Ordering::Relaxed),
        }
        if steps[i] != Step::Jump {
            pp.tail_patched.store(false, Ordering::SeqCst);
        }
    }
    if wrote {
        patch::sync_cores();
    }
    session.close();
    if let Some(Held { world: Some(world), rips }) = held {
        WORLD_STOPPED.store(false, Ordering::SeqCst);
        world.resume();
        drop(rips);
    }
}

/// Stops the other threads for the writes of a batch whose steps are decided (attach). A jump
/// whose replaced bytes hold a stopped thread's resume address waits for the thread to move
/// on (a few short resumes), and otherwise takes the `int3`; if the threads cannot be stopped
/// at all, every jump does.
fn hold(world: &'static dyn World, changes: &mut [Change], steps: &mut [Step]) -> Held {
    let inside = |c: &Change, rips: &[usize]| match &c.pp.jump {
        Ok(prep) => rips.iter().copied().find(|&r| c.pp.addr < r && r < c.pp.addr + prep.patch_len),
        Err(_) => None,
    };
    // Reserved now: from the stop to the resume nothing may allocate.
    let mut rips = world::room_for_addresses();
    let mut stopped = world.stop(&mut rips);
    for _ in 0..RESTOPS {
        let blocked = changes.iter().zip(steps.iter()).any(|(c, s)| *s == Step::Jump && inside(c, &rips).is_some());
        if !stopped || !blocked {
            break;
        }
        stopped = world.restop(&mut rips);
    }
    for (i, c) in changes.iter_mut().enumerate() {
        if steps[i] != Step::Jump {
            continue;
        }
        let why = if !stopped {
            NoJump::Live
        } else {
            match inside(c, &rips) {
                Some(at) => NoJump::ThreadInside { at: at as u64 },
                None => continue,
            }
        };
        let jumping = c.pp.jump_active.load(Ordering::SeqCst);
        let armed = first_byte(c.pp) == INT3 && !c.pp.tail_patched.load(Ordering::SeqCst);
        steps[i] = if !jumping && armed { Step::None } else { Step::Int3 };
        c.result = Ok(Strategy::Int3(why));
    }
    if stopped {
        WORLD_STOPPED.store(true, Ordering::SeqCst);
    }
    debug_assert!(!steps.contains(&Step::Jump) || stopped);
    Held { world: stopped.then_some(world), rips }
}

/// The threads held for a batch: the world to resume them with (None: not held), and the
/// addresses' room, freed only once they run again.
struct Held {
    world: Option<&'static dyn World>,
    rips: Vec<usize>,
}

/// How many times a batch lets the threads move on when one sits where a jump goes.
const RESTOPS: usize = 3;

fn first_byte(pp: &ProbePoint) -> u8 {
    // SAFETY: the point's address lies in an executable mapping.
    unsafe { core::ptr::read_volatile(pp.addr as *const u8) }
}
