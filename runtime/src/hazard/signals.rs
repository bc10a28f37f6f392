//! The program's signal actions, kept apart from the runtime's.
//!
//! The runtime needs SIGTRAP (every probe hit), SIGSEGV/SIGBUS (to name a handler that
//! faults, and to survive its own guarded reads), and the signals whose default action ends
//! the process (to report before it ends: see `endings`). The program may want all of them.
//! So `sigaction`, `signal`, `bsd_signal` and `sysv_signal` are interposed:
//!
//! - SIGTRAP: the program's action is only remembered (the kernel keeps the runtime's); a
//!   trap that is not a probe hit is given to it ([`foreign_trap`]) with its flags and mask,
//!   or meets SIG_DFL/SIG_IGN semantics.
//! - SIGSEGV/SIGBUS: the runtime's handler is installed with the program's own flags and mask
//!   (so the kernel picks the stack and blocks what the program asked for); it turns a fault
//!   of the runtime's guarded reads (`base::usercopy`) into a failed read, names a handler or
//!   a handler library that faults, and otherwise calls the program's handler, or, where the
//!   program left the default, reports the end of the run and lets the default action follow.
//! - The other signals whose default action ends the process (SIGINT, SIGTERM, SIGABRT...):
//!   while the program leaves the default, the runtime's handler stands in for it; the
//!   program's own handler or SIG_IGN goes to the kernel as is.
//! - Every signal: SIGTRAP is taken out of a handler's mask. `sigaction` reports the
//!   program's own action and mask back.
//!
//! SIGNAL CONTEXT: [`foreign_trap`] and `on_fault` run in signal handlers: no allocation, no
//! lock. The program's actions live in atomics.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::base::{output, usercopy};
use crate::hazard::endings::{self, Ending};
use crate::hazard::faults;
use crate::hazard::guard;
use crate::hazard::masks;
use crate::hazard::sigset::{self, bit, bits, real_sigaction, set_of, TRAP_BIT};

/// The program's view of the action of a signal the runtime stands in front of.
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

    fn handler(&self) -> usize {
        self.handler.load(Ordering::Acquire)
    }
}

static ACTIONS: [ProgramAction; 65] = [const { ProgramAction::new() }; 65];

/// What the runtime does with a signal.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// SIGTRAP: always the runtime's handler.
    Trap,
    /// SIGSEGV, SIGBUS: always the runtime's handler, in front of the program's.
    Fault,
    /// Ends the process by default: the runtime's handler while the program leaves that.
    Fatal,
}

fn role(sig: c_int) -> Option<Role> {
    match sig {
        libc::SIGTRAP => Some(Role::Trap),
        libc::SIGSEGV | libc::SIGBUS => Some(Role::Fault),
        _ if endings::FATAL.contains(&sig) => Some(Role::Fatal),
        _ => None,
    }
}

/// Signals whose handler mask, as the program gave it, held SIGTRAP.
static MASK_HAD_TRAP: AtomicU64 = AtomicU64::new(0);

/// Installs the kernel action behind the program's action for a SIGSEGV/SIGBUS or a fatal
/// signal.
fn install(sig: c_int) -> c_int {
    let program = &ACTIONS[sig as usize];
    // SAFETY: a zeroed sigaction is valid; every field the kernel reads is set below.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    let handler = program.handler();
    let flags = program.flags.load(Ordering::Relaxed);
    sa.sa_mask = set_of(program.mask.load(Ordering::Relaxed) & !TRAP_BIT);
    match (role(sig), handler) {
        (Some(Role::Fault), libc::SIG_DFL | libc::SIG_IGN) => {
            // SIG_IGN too: a guarded read must still reach `on_fault`.
            sa.sa_sigaction = on_fault as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        }
        (Some(Role::Fault), _) => {
            sa.sa_sigaction = on_fault as *const () as usize;
            sa.sa_flags = flags | libc::SA_SIGINFO;
        }
        (_, libc::SIG_DFL) => {
            sa.sa_sigaction = endings::on_fatal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            sa.sa_mask = set_of(0);
        }
        _ => {
            sa.sa_sigaction = handler;
            sa.sa_flags = flags;
        }
    }
    real_sigaction(sig, Some(&sa), None)
}

/// Start-up: records the actions the process inherited (a SIG_IGN from the parent stays),
/// installs the runtime's handlers and starts interposing. Runs before the SIGTRAP handler
/// is installed. `endings`: also stand in for the default action of the fatal signals, to
/// report before the process dies of one.
pub fn init(endings: bool) {
    sigset::init();
    masks::init();
    for sig in 1..=64 {
        let Some(role) = role(sig) else { continue };
        // Loaded into a running process (attach), nothing is interposed: a handler for a
        // fatal signal would show through the program's own sigaction calls, and the
        // session's report has its own ending (see `attach`).
        if role == Role::Fatal && !endings {
            continue;
        }
        // SAFETY: a zeroed sigaction is valid output space.
        let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
        if real_sigaction(sig, None, Some(&mut old)) == 0 {
            ACTIONS[sig as usize].store(&old);
        }
        if role != Role::Trap {
            install(sig);
        }
    }
    sigset::activate();
}

/// A runtime loaded into a running process, at the start of an attach session: stands in
/// front of the program's SIGSEGV/SIGBUS and fatal signals as at start-up (their handlers
/// report the session before the process dies), taking the program's actions from the
/// kernel where they are not the runtime's (changed while no session ran). `trap`: the
/// runtime's SIGTRAP handler; a SIGTRAP action that is not it becomes the program's.
pub fn take_over(trap: usize) {
    for sig in 1..=64 {
        let Some(role) = role(sig) else { continue };
        // SAFETY: a zeroed sigaction is valid output space.
        let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
        if real_sigaction(sig, None, Some(&mut old)) != 0 {
            continue;
        }
        let ours = match role {
            Role::Trap => trap,
            Role::Fault => on_fault as *const () as usize,
            Role::Fatal => endings::on_fatal as *const () as usize,
        };
        if old.sa_sigaction != ours {
            ACTIONS[sig as usize].store(&old);
            if role != Role::Trap {
                install(sig);
            }
        }
    }
}

/// The end of an attach session: the program's own actions go back to the kernel for the
/// fatal signals (SIGTRAP, SIGSEGV and SIGBUS keep the runtime's handlers, which pass on
/// what is not theirs).
pub fn give_back() {
    for sig in endings::FATAL {
        let program = &ACTIONS[sig as usize];
        // SAFETY: a zeroed sigaction is valid; handler, flags and mask are set below.
        let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
        program.load_into(&mut sa);
        real_sigaction(sig, Some(&sa), None);
    }
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
    let trap = &ACTIONS[libc::SIGTRAP as usize];
    if masks::trap_blocked() {
        if from_cpu {
            // The kernel forces the default action on a blocked trap the CPU raised.
            endings::end(Ending::Signal(libc::SIGTRAP));
            return sigset::die_by(libc::SIGTRAP);
        }
        masks::hold_trap();
        return;
    }
    let handler = trap.handler();
    let flags = trap.flags.load(Ordering::Relaxed);
    if handler == libc::SIG_IGN && !from_cpu {
        return;
    }
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        if from_cpu {
            output::message_fixed(b"uprobe-run: SIGTRAP that is not a probe hit, near ", addr);
        }
        endings::end(Ending::Signal(libc::SIGTRAP));
        return sigset::die_by(libc::SIGTRAP);
    }
    if flags & libc::SA_RESETHAND != 0 {
        trap.handler.store(libc::SIG_DFL, Ordering::Release);
    }
    // The kernel blocked nothing for the runtime's handler: block what the program's handler
    // asks for (never SIGTRAP itself); the signal return puts the mask back.
    let mask = set_of(trap.mask.load(Ordering::Relaxed) & !TRAP_BIT);
    sigset::real_pthread_sigmask(libc::SIG_BLOCK, Some(&mask), None);
    // SAFETY: the program's handler, with the kernel's arguments.
    unsafe { call_program(handler, flags, libc::SIGTRAP, info, ctx) };
}

/// The runtime's SIGSEGV/SIGBUS handler (signal context).
extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler; the
    // register array is ours to edit until the handler returns.
    let (code, fault_addr, gregs) = unsafe {
        ((*info).si_code, (*info).si_addr() as usize, &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs)
    };
    // A guarded read through a bad pointer: the copy resumes at its fixup and reports it.
    if let Some(to) = usercopy::fixup(gregs[libc::REG_RIP as usize] as usize) {
        gregs[libc::REG_RIP as usize] = to as i64;
        return;
    }
    // A handler library's uprobe_init in an attach session: it ends, the process does not.
    if guard::escape(sig, code, fault_addr, gregs) {
        return;
    }
    if faults::report_if_ours(sig, fault_addr) {
        endings::end(Ending::Signal(sig));
        return die_or_refault(sig, code);
    }
    let program = &ACTIONS[sig as usize];
    let handler = program.handler();
    let flags = program.flags.load(Ordering::Relaxed);
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // Sent by kill() or sigqueue(): ignored where the program said so.
        if code <= 0 && handler == libc::SIG_IGN {
            return;
        }
        endings::end(Ending::Signal(sig));
        return die_or_refault(sig, code);
    }
    if flags & libc::SA_RESETHAND != 0 {
        // The kernel has reset the action already (the flag was passed on).
        program.handler.store(libc::SIG_DFL, Ordering::Release);
    }
    // SAFETY: the program's handler, with the kernel's arguments; the kernel applied its mask.
    unsafe { call_program(handler, flags, sig, info, ctx) };
}

/// Ends the process by `sig`'s default action: a fault the CPU raised runs again and meets it
/// (the same death, core dump included); a sent signal is raised again.
pub fn die_or_refault(sig: c_int, code: c_int) {
    if code <= 0 {
        return sigset::die_by(sig);
    }
    sigset::default_action(sig);
}

/// `sigaction(2)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    // SAFETY: null or valid sigaction structs (libc contract).
    let (act, old) = unsafe { (act.as_ref(), old.as_mut()) };
    if !sigset::active() || !(1..=64).contains(&sig) || sig == libc::SIGKILL || sig == libc::SIGSTOP {
        return real_sigaction(sig, act, old);
    }
    if let Some(role) = role(sig) {
        let program = &ACTIONS[sig as usize];
        if let Some(old) = old {
            // The kernel's answer for the fields the runtime does not track (sa_restorer).
            real_sigaction(sig, None, Some(&mut *old));
            program.load_into(old);
        }
        if let Some(act) = act {
            program.store(act);
            if role != Role::Trap {
                return install(sig);
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
