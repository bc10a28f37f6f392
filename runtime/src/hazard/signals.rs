//! The program's signal handling, kept apart from the runtime's.
//!
//! The runtime needs SIGTRAP (every probe hit) for itself and SIGSEGV/SIGBUS to name a handler
//! that faults; the program may want all three, and may block SIGTRAP. So the libc functions
//! that install actions and change masks are interposed:
//!
//! - `sigaction`, `signal`, `bsd_signal`, `sysv_signal`: for SIGTRAP the program's action is
//!   only remembered (the kernel keeps the runtime's); a trap that is not a probe hit is given
//!   to it ([`foreign_trap`]) with its flags and mask, or meets SIG_DFL/SIG_IGN semantics. For
//!   SIGSEGV/SIGBUS the runtime's handler is installed with the program's own flags and mask
//!   (so the kernel picks the stack and blocks what the program asked for), checks for a
//!   handler fault and otherwise calls the program's handler; SIG_IGN goes to the kernel as
//!   is. For every signal, SIGTRAP is taken out of the handler's mask. `sigaction` reports
//!   the program's own action and mask back.
//! - `sigprocmask`, `pthread_sigmask`, `sigsuspend`: SIGTRAP is taken out of the set; the
//!   thread remembers that the program blocked it and reports it blocked. A SIGTRAP the
//!   program sends itself (`raise`, `kill`) while it believes SIGTRAP blocked is held and
//!   delivered when the program unblocks it; a trap the CPU raises then (its own `int3`)
//!   ends the process with SIGTRAP, as the kernel would for a blocked synchronous trap.
//!
//! SIGNAL CONTEXT: [`foreign_trap`] and `on_fault` run in signal handlers: no allocation, no
//! lock. The program's actions live in atomics.

use core::cell::Cell;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::base::output;
use crate::hazard::faults;
use crate::hazard::interpose::{next, Next};
use crate::probe::thread;

type SigactionFn = unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
type MaskFn = unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;
type SuspendFn = unsafe extern "C" fn(*const libc::sigset_t) -> c_int;

static SIGACTION: Next = Next::new(c"sigaction");
static SIGPROCMASK: Next = Next::new(c"sigprocmask");
static PTHREAD_SIGMASK: Next = Next::new(c"pthread_sigmask");
static SIGSUSPEND: Next = Next::new(c"sigsuspend");

static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The program's view of the action of a signal the runtime handles itself.
struct ProgramAction {
    handler: AtomicUsize,
    flags: AtomicI32,
    /// The first 64 signals of the handler's mask (all that Linux has).
    mask: AtomicU64,
}

impl ProgramAction {
    const fn new() -> ProgramAction {
        ProgramAction { handler: AtomicUsize::new(libc::SIG_DFL), flags: AtomicI32::new(0), mask: AtomicU64::new(0) }
    }

    fn store(&self, sa: &libc::sigaction) {
        self.mask.store(bits(&sa.sa_mask), Ordering::Relaxed);
        self.flags.store(sa.sa_flags, Ordering::Relaxed);
        self.handler.store(sa.sa_sigaction, Ordering::Release);
    }

    /// Writes the program's action into `sa`, keeping what else the kernel reported.
    fn load_into(&self, sa: &mut libc::sigaction) {
        sa.sa_sigaction = self.handler.load(Ordering::Acquire);
        sa.sa_flags = self.flags.load(Ordering::Relaxed);
        sa.sa_mask = set_of(self.mask.load(Ordering::Relaxed));
    }
}

static TRAP: ProgramAction = ProgramAction::new();
static SEGV: ProgramAction = ProgramAction::new();
static BUS: ProgramAction = ProgramAction::new();

fn program_action(sig: c_int) -> Option<&'static ProgramAction> {
    match sig {
        libc::SIGTRAP => Some(&TRAP),
        libc::SIGSEGV => Some(&SEGV),
        libc::SIGBUS => Some(&BUS),
        _ => None,
    }
}

/// Signals whose handler mask, as the program gave it, held SIGTRAP.
static MASK_HAD_TRAP: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The program believes SIGTRAP blocked on this thread.
    static TRAP_BLOCKED: Cell<bool> = const { Cell::new(false) };
    /// A SIGTRAP the program sent while it believed it blocked, to deliver at unblocking.
    static TRAP_PENDING: Cell<bool> = const { Cell::new(false) };
}

const fn bit(sig: c_int) -> u64 {
    1 << (sig - 1)
}

const TRAP_BIT: u64 = bit(libc::SIGTRAP);

fn bits(set: &libc::sigset_t) -> u64 {
    // SAFETY: glibc's sigset_t is an array of unsigned longs whose first word holds signals
    // 1..=64 as bits 0..=63, the layout the kernel uses.
    unsafe { *(set as *const libc::sigset_t as *const u64) }
}

fn set_of(bits: u64) -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is the empty set; the first word is signals 1..=64.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        *(&mut set as *mut libc::sigset_t as *mut u64) = bits;
        set
    }
}

/// The libc `sigaction` the program would have called.
pub fn real_sigaction(sig: c_int, act: Option<&libc::sigaction>, old: Option<&mut libc::sigaction>) -> c_int {
    let act = act.map_or(core::ptr::null(), |a| a as *const libc::sigaction);
    let old = old.map_or(core::ptr::null_mut(), |o| o as *mut libc::sigaction);
    // SAFETY: forwarding pointers that are null or valid sigaction structs.
    unsafe { next!(SIGACTION, SigactionFn)(sig, act, old) }
}

fn real_pthread_sigmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int {
    // SAFETY: as above, for sigset_t.
    unsafe { next!(PTHREAD_SIGMASK, MaskFn)(how, set, old) }
}

/// Installs the kernel action behind the program's action for SIGSEGV or SIGBUS.
fn install_fault_handler(sig: c_int) -> c_int {
    let Some(program) = program_action(sig) else { return 0 };
    // SAFETY: a zeroed sigaction is valid; every field the kernel reads is set below.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    let handler = program.handler.load(Ordering::Acquire);
    let flags = program.flags.load(Ordering::Relaxed);
    sa.sa_mask = set_of(program.mask.load(Ordering::Relaxed) & !TRAP_BIT);
    if handler == libc::SIG_IGN {
        sa.sa_sigaction = libc::SIG_IGN;
        sa.sa_flags = flags;
    } else if handler == libc::SIG_DFL {
        sa.sa_sigaction = on_fault as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
    } else {
        sa.sa_sigaction = on_fault as *const () as usize;
        sa.sa_flags = flags | libc::SA_SIGINFO;
    }
    real_sigaction(sig, Some(&sa), None)
}

/// Start-up: records the actions the process inherited, installs the fault handlers and
/// starts interposing. Runs before the SIGTRAP handler is installed.
pub fn init() {
    for next in [&SIGACTION, &SIGPROCMASK, &PTHREAD_SIGMASK, &SIGSUSPEND] {
        next.resolve();
    }
    for sig in [libc::SIGTRAP, libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: a zeroed sigaction is valid output space.
        let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
        if real_sigaction(sig, None, Some(&mut old)) == 0 {
            program_action(sig).unwrap().store(&old);
        }
        if sig != libc::SIGTRAP {
            install_fault_handler(sig);
        }
    }
    // A SIGTRAP blocked since before exec would turn the first probe hit into death.
    let unblock = set_of(TRAP_BIT);
    // SAFETY: a zeroed sigset_t is valid output space.
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    if real_pthread_sigmask(libc::SIG_UNBLOCK, &unblock, &mut old) == 0 && bits(&old) & TRAP_BIT != 0 {
        TRAP_BLOCKED.with(|b| b.set(true));
    }
    ACTIVE.store(true, Ordering::Release);
}

fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Ends the process the way `sig`'s default action does (signal context).
fn die_by(sig: c_int) {
    // SAFETY: a zeroed sigaction with SIG_DFL is the default action.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = libc::SIG_DFL;
    real_sigaction(sig, Some(&sa), None);
    let unblock = set_of(bit(sig));
    real_pthread_sigmask(libc::SIG_UNBLOCK, &unblock, core::ptr::null_mut());
    // SAFETY: raise is async-signal-safe; with the default action the process ends here.
    unsafe { libc::raise(sig) };
}

/// Calls the program's handler `handler` as its flags say (signal context).
///
/// # Safety
/// `handler` is the program's handler for `sig`; `info` and `ctx` are the kernel's.
unsafe fn call_program(handler: usize, flags: c_int, sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the program installed `handler` with these flags, which say its signature.
    unsafe {
        if flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = core::mem::transmute(handler);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(c_int) = core::mem::transmute(handler);
            f(sig);
        }
    }
}

/// A SIGTRAP that is not a probe hit: what the program would have met without the runtime
/// (signal context, from the SIGTRAP handler).
///
/// # Safety
/// `info` and `ctx` are the kernel's arguments to the SIGTRAP handler.
pub unsafe fn foreign_trap(addr: usize, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel's siginfo.
    let from_cpu = unsafe { (*info).si_code } > 0;
    // A runtime loaded by attach interposes nothing (its thread-local storage is out of reach
    // here, see `probe::thread`): the program's masks are its own.
    if !thread::pooled_states() && TRAP_BLOCKED.with(Cell::get) {
        if from_cpu {
            // The kernel forces the default action on a blocked trap the CPU raised.
            return die_by(libc::SIGTRAP);
        }
        TRAP_PENDING.with(|p| p.set(true));
        return;
    }
    let handler = TRAP.handler.load(Ordering::Acquire);
    let flags = TRAP.flags.load(Ordering::Relaxed);
    if handler == libc::SIG_IGN && !from_cpu {
        return;
    }
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        if from_cpu {
            output::message_fixed(b"uprobe-run: SIGTRAP that is not a probe hit, near ", addr);
        }
        return die_by(libc::SIGTRAP);
    }
    if flags & libc::SA_RESETHAND != 0 {
        TRAP.handler.store(libc::SIG_DFL, Ordering::Release);
    }
    // The kernel blocked nothing for the runtime's handler: block what the program's handler
    // asks for (never SIGTRAP itself); the signal return puts the mask back.
    let mask = set_of(TRAP.mask.load(Ordering::Relaxed) & !TRAP_BIT);
    real_pthread_sigmask(libc::SIG_BLOCK, &mask, core::ptr::null_mut());
    // SAFETY: the program's handler, with the kernel's arguments.
    unsafe { call_program(handler, flags, libc::SIGTRAP, info, ctx) };
}

/// The runtime's SIGSEGV/SIGBUS handler (signal context).
extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, fault_addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if let Some(probe) = faults::current() {
        faults::report(probe, sig, fault_addr);
        output::flush();
        if code <= 0 {
            return die_by(sig);
        }
        // SAFETY: a zeroed sigaction with SIG_DFL is the default action.
        let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
        sa.sa_sigaction = libc::SIG_DFL;
        real_sigaction(sig, Some(&sa), None);
        return; // the faulting instruction runs again and meets the default action
    }
    let Some(program) = program_action(sig) else { return };
    let handler = program.handler.load(Ordering::Acquire);
    let flags = program.flags.load(Ordering::Relaxed);
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        if code <= 0 {
            return die_by(sig);
        }
        // SAFETY: as above.
        let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
        sa.sa_sigaction = libc::SIG_DFL;
        real_sigaction(sig, Some(&sa), None);
        return;
    }
    if flags & libc::SA_RESETHAND != 0 {
        // The kernel has reset the action already (the flag was passed on).
        program.handler.store(libc::SIG_DFL, Ordering::Release);
    }
    // SAFETY: the program's handler, with the kernel's arguments; the kernel applied its mask.
    unsafe { call_program(handler, flags, sig, info, ctx) };
}

/// `sigaction(2)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    // SAFETY: null or valid sigaction structs (libc contract).
    let (act, old) = unsafe { (act.as_ref(), old.as_mut()) };
    if !active() || !(1..=64).contains(&sig) || sig == libc::SIGKILL || sig == libc::SIGSTOP {
        return real_sigaction(sig, act, old);
    }
    if let Some(program) = program_action(sig) {
        if let Some(old) = old {
            // The kernel's answer for the fields the runtime does not track (sa_restorer).
            real_sigaction(sig, None, Some(&mut *old));
            program.load_into(old);
        }
        if let Some(act) = act {
            program.store(act);
            if sig != libc::SIGTRAP {
                return install_fault_handler(sig);
            }
        }
        return 0;
    }
    let had_trap = MASK_HAD_TRAP.load(Ordering::Relaxed) & bit(sig) != 0;
    let mut copy;
    let act = match act {
        None => None,
        Some(act) => {
            copy = *act;
            let has = bits(&copy.sa_mask) & TRAP_BIT != 0;
            copy.sa_mask = set_of(bits(&copy.sa_mask) & !TRAP_BIT);
            if has {
                MASK_HAD_TRAP.fetch_or(bit(sig), Ordering::Relaxed);
            } else {
                MASK_HAD_TRAP.fetch_and(!bit(sig), Ordering::Relaxed);
            }
            Some(&copy)
        }
    };
    let mut old = old;
    let rc = real_sigaction(sig, act, old.as_deref_mut());
    if let Some(old) = old.filter(|_| rc == 0 && had_trap) {
        old.sa_mask = set_of(bits(&old.sa_mask) | TRAP_BIT);
    }
    rc
}

/// `signal`-style installation: `flags`, and the signal itself blocked unless NODEFER.
fn simple_signal(sig: c_int, handler: libc::sighandler_t, flags: c_int) -> libc::sighandler_t {
    if handler == libc::SIG_ERR || !(1..=64).contains(&sig) {
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return libc::SIG_ERR;
    }
    // SAFETY: zeroed sigactions are valid; the set functions get valid sets.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        let mut old: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = flags;
        if flags & libc::SA_NODEFER == 0 {
            libc::sigaddset(&mut sa.sa_mask, sig);
        }
        if sigaction(sig, &sa, &mut old) < 0 {
            return libc::SIG_ERR;
        }
        old.sa_sigaction
    }
}

/// `signal(3)` with glibc's BSD semantics, interposed: glibc's own calls `sigaction` inside
/// libc, out of the interposer's reach.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    simple_signal(sig, handler, libc::SA_RESTART)
}

/// `bsd_signal(3)`: `signal`.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    simple_signal(sig, handler, libc::SA_RESTART)
}

/// `sysv_signal(3)`: one-shot, not blocking the signal (what `signal` is in strict ISO C
/// builds, as `__sysv_signal`).
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn sysv_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    simple_signal(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER)
}

/// See [`sysv_signal`].
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn __sysv_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    simple_signal(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER)
}

/// A mask change of the program: SIGTRAP stays deliverable, the program's view is kept.
fn mask_change(real: &Next, how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int {
    let call = |set: *const libc::sigset_t| {
        // SAFETY: forwarding null or valid sets to the libc function of the same signature.
        unsafe { next!(real, MaskFn)(how, set, old) }
    };
    if !active() {
        return call(set);
    }
    let was = TRAP_BLOCKED.with(Cell::get);
    let mut copy;
    let mut now = was;
    let set = if set.is_null() {
        set
    } else {
        // SAFETY: `set` is valid (libc contract).
        copy = unsafe { *set };
        let has = bits(&copy) & TRAP_BIT != 0;
        // SAFETY: a valid set and signal number.
        unsafe { libc::sigdelset(&mut copy, libc::SIGTRAP) };
        now = match how {
            libc::SIG_BLOCK => was || has,
            libc::SIG_UNBLOCK => was && !has,
            libc::SIG_SETMASK => has,
            _ => was,
        };
        &copy
    };
    let rc = call(set);
    if rc != 0 {
        return rc;
    }
    if was && !old.is_null() {
        // SAFETY: `old` is valid and was filled in.
        unsafe { libc::sigaddset(old, libc::SIGTRAP) };
    }
    TRAP_BLOCKED.with(|b| b.set(now));
    if was && !now && TRAP_PENDING.with(|p| p.replace(false)) {
        // SAFETY: raise is async-signal-safe; the program's handler now gets its signal.
        unsafe { libc::raise(libc::SIGTRAP) };
    }
    rc
}

/// `sigprocmask(2)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int {
    mask_change(&SIGPROCMASK, how, set, old)
}

/// `pthread_sigmask(3)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int {
    mask_change(&PTHREAD_SIGMASK, how, set, old)
}

/// `sigsuspend(2)`, interposed: a probe hit in a handler that runs while the thread waits
/// must not meet a blocked SIGTRAP.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn sigsuspend(set: *const libc::sigset_t) -> c_int {
    let mut copy;
    let set = if active() && !set.is_null() {
        // SAFETY: `set` is valid (libc contract); a valid signal number.
        unsafe {
            copy = *set;
            libc::sigdelset(&mut copy, libc::SIGTRAP);
        }
        &copy as *const libc::sigset_t
    } else {
        set
    };
    // SAFETY: forwarding a null or valid set.
    unsafe { next!(SIGSUSPEND, SuspendFn)(set) }
}
