//! A runtime loaded into a running process (attach) cannot interpose anything: the program's
//! calls were bound to libc long before. So, while an attach session runs, internal probes on
//! the entries of libc's own functions send the program's calls to the very interposers a
//! launched program's calls reach (`signals`, `masks`, `dl`), as a tail call: the probe's
//! handler changes only the instruction pointer, the arguments and the return address stay
//! the caller's. What the interposers then call in libc is the runtime's own call, which the
//! probes let through (it comes from the runtime's code, or runs marked as inside it).
//!
//! | libc function | goes to | so that |
//! |---|---|---|
//! | `sigaction` (and `signal`, `sysv_signal`... which call it) | `signals::sigaction` | the program's SIGTRAP handler is remembered and chained, not installed; no handler mask blocks SIGTRAP; the fatal signals keep the runtime's handler |
//! | `pthread_sigmask` (and `sigprocmask`, which calls it), `sigsuspend` | `masks` | SIGTRAP is never blocked; the program still sees it blocked |
//! | `dlopen`, `dlclose` | `dl` | "module:symbol" probes wait for their module and are armed at its load |
//! | `_exit` (`_Exit`) | `quick_exit` here | the session's report comes before the process ends |
//!
//! The fatal signals the program leaves at their default get the runtime's handler for the
//! session (`signals::take_over`), which reports the session before the process dies. At the
//! session's end every internal probe is removed and the program's actions of the fatal
//! signals go back to the kernel; in a child forked meanwhile, the same happens at once
//! (`fork`), and every probe of the session is taken out of its code.
//!
//! Context: [`start`] and [`stop`] on the agent thread (normal context); the probes' handler
//! in signal or stub context (it reads one word of the stack and sets the instruction
//! pointer); [`forked_child`] in the child's `pthread_atfork` handler.

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void, CStr};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::base::abi::{PtRegs, Uprobe};
use crate::base::{maps, output, sys};
use crate::hazard::endings::{self, Ending};
use crate::hazard::{dl, signals, sigtrap};
use crate::probe::registry::{self, FOLLOWS_LOADS};
use crate::probe::table::Consumer;

/// One internal probe: where, and the interposer the program's calls go to.
struct Internal {
    probe: UnsafeCell<Uprobe>,
    /// The name of the runtime's interposer the program's calls go to (None: [`quick_exit`]).
    export: Option<&'static CStr>,
    /// What the process loses where the probe cannot be placed.
    without: &'static str,
}

// SAFETY: the probe objects are written only by `start` and `stop` on the agent thread (one
// session at a time), and read by the registry, which the C ABI lets keep a pointer to them.
unsafe impl Sync for Internal {}

const fn internal(spec: &'static CStr, export: Option<&'static CStr>, without: &'static str) -> Internal {
    Internal {
        probe: UnsafeCell::new(Uprobe {
            pid: 0,
            flags: 0,
            vaddr: 0,
            handler: Some(on_call),
            registration_callback: None,
            symbol_name: spec.as_ptr(),
            offset: 0,
            reserved: [core::ptr::null_mut(); 4],
        }),
        export,
        without,
    }
}

static PROBES: [Internal; 6] = [
    internal(
        c"libc.so.6:sigaction",
        Some(c"sigaction"),
        "the program's sigaction(SIGTRAP) replaces the runtime's handler",
    ),
    internal(
        c"libc.so.6:pthread_sigmask",
        Some(c"pthread_sigmask"),
        "SIGTRAP blocked by the program kills it at an int3 probe",
    ),
    internal(
        c"libc.so.6:sigsuspend",
        Some(c"sigsuspend"),
        "SIGTRAP blocked by sigsuspend kills the program at an int3 probe",
    ),
    internal(c"libc.so.6:dlopen", Some(c"dlopen"), "libraries loaded later are not seen"),
    internal(c"libc.so.6:dlclose", Some(c"dlclose"), "libraries unloaded later are not seen"),
    internal(c"libc.so.6:_exit", None, "an end by _exit does not report the session"),
];

/// Where each of [`PROBES`] sends the program's calls (0: nowhere yet).
static TARGETS: [AtomicUsize; 6] = [const { AtomicUsize::new(0) }; 6];

/// The runtime's own definition of the exported function `name`, looked up in the runtime
/// itself: the name alone resolves to libc's in a runtime loaded with `dlopen`, and the
/// compiler may fold a local function of the same body into the export.
fn own_definition(name: &CStr) -> usize {
    extern "C" {
        fn dladdr1(addr: *const c_void, info: *mut libc::Dl_info, extra: *mut *mut c_void, flags: c_int) -> c_int;
    }
    const RTLD_DL_LINKMAP: c_int = 2;
    // SAFETY: dladdr1 fills `info` and the link map of the object holding a code address of
    // ours; a glibc link map is a handle dlsym takes, and searches that object first.
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        let mut map: *mut c_void = core::ptr::null_mut();
        if dladdr1(on_call as *const c_void, &mut info, &mut map, RTLD_DL_LINKMAP) == 0 || map.is_null() {
            return 0;
        }
        libc::dlsym(map, name.as_ptr()) as usize
    }
}

/// Which of [`PROBES`] are registered (bit i for the i-th).
static ARMED: AtomicUsize = AtomicUsize::new(0);
/// The runtime's own mappings: calls from there are the runtime's.
static OWN_LO: AtomicUsize = AtomicUsize::new(0);
static OWN_HI: AtomicUsize = AtomicUsize::new(0);
/// A session is followed.
static ON: AtomicBool = AtomicBool::new(false);

fn consumer(i: usize) -> Consumer {
    Consumer::Uprobe(PROBES[i].probe.get())
}

/// Whether a call returning to `addr` is the runtime's own (signal-safe).
fn own(addr: usize) -> bool {
    (OWN_LO.load(Ordering::Relaxed)..OWN_HI.load(Ordering::Relaxed)).contains(&addr) || dl::is_stub(addr)
}

/// The internal probes' handler (signal or stub context): sends the program's call on to the
/// interposer, as a tail call.
///
/// # Safety
/// The runtime's hit paths call it with a registered probe object and the thread's registers.
unsafe extern "C" fn on_call(u: *mut Uprobe, regs: *mut PtRegs) {
    // SAFETY: the hit path's registers, ours until the handler returns.
    let regs = unsafe { &mut *regs };
    // SAFETY: at a function's entry the stack pointer points to the return address the call
    // pushed, a mapped word of the thread's stack.
    let caller = unsafe { *(regs.rsp as *const usize) };
    // A child sharing the process's memory (vfork, posix_spawn) changes nothing in it.
    if own(caller) || endings::in_vfork_child() {
        return;
    }
    if let Some(i) = PROBES.iter().position(|p| p.probe.get() == u) {
        let to = TARGETS[i].load(Ordering::Acquire);
        if to != 0 {
            regs.rip = to as u64;
        }
    }
}

/// Where the program's `_exit` goes: the session's report, then the end `_exit` makes.
extern "C" fn quick_exit(status: c_int) -> ! {
    endings::end(Ending::QuickExit);
    sys::exit_now(status)
}

/// The range of the runtime's own mappings (those of its file, by inode and path).
fn own_range() -> (usize, usize) {
    let here = on_call as *const () as usize;
    let all = maps::current();
    let Some(me) = maps::find(&all, here).filter(|m| m.inode != 0) else { return (0, 0) };
    let mine = all.iter().filter(|m| m.inode == me.inode && m.path == me.path);
    let lo = mine.clone().map(|m| m.start).min().unwrap_or(0);
    (lo as usize, mine.map(|m| m.end).max().unwrap_or(0) as usize)
}

/// The start of an attach session in a runtime loaded into the running process (agent
/// thread, marked inside the runtime, its batches served by `uprobe-run`): the process's end
/// runs `report`, the internal probes are placed in one batch, the fatal signals get the
/// runtime's handler. Says what cannot be followed, and why.
pub fn start(report: fn(Ending)) {
    let (lo, hi) = own_range();
    OWN_LO.store(lo, Ordering::Relaxed);
    OWN_HI.store(hi, Ordering::Relaxed);
    endings::set_report(report);
    signals::take_over(sigtrap::handler());
    // The program may have replaced the runtime's SIGTRAP handler while no session ran.
    if let Err(e) = sigtrap::install() {
        output::message(format_args!("cannot install the SIGTRAP handler again: errno {e}"));
    }
    let opened = registry::open_batch();
    let mut failed = Vec::new();
    let mut armed = 0;
    for i in 0..PROBES.len() {
        let to = PROBES[i].export.map_or(quick_exit as *const () as usize, own_definition);
        if to == 0 || !own(to) {
            failed.push((i, "the runtime's own definition was not found".to_string()));
            continue;
        }
        TARGETS[i].store(to, Ordering::Release);
        // SAFETY: a static probe object, valid for the process's life.
        match unsafe { registry::register(consumer(i)) } {
            Ok(_) => armed |= 1 << i,
            Err(e) => failed.push((i, e.to_string())),
        }
    }
    if opened {
        for (c, e) in registry::close_batch() {
            if let Some(i) = (0..PROBES.len()).find(|&i| consumer(i) == c) {
                armed &= !(1 << i);
                failed.push((i, e.to_string()));
            }
        }
    }
    ARMED.store(armed, Ordering::SeqCst);
    FOLLOWS_LOADS.store(armed & (1 << 3) != 0, Ordering::SeqCst);
    ON.store(true, Ordering::SeqCst);
    for (i, e) in failed {
        // SAFETY: the spec is a static C string.
        let spec = unsafe { CStr::from_ptr((*PROBES[i].probe.get()).symbol_name) }.to_string_lossy();
        output::message(format_args!("{spec} cannot be followed in this process ({e}): {}", PROBES[i].without));
    }
}

/// The end of the session (agent thread): the internal probes go, in one batch; the program's
/// actions of the fatal signals go back to the kernel.
pub fn stop() {
    if !ON.swap(false, Ordering::SeqCst) {
        return;
    }
    FOLLOWS_LOADS.store(false, Ordering::SeqCst);
    let armed = ARMED.swap(0, Ordering::SeqCst);
    let consumers: Vec<Consumer> = (0..PROBES.len()).filter(|i| armed & (1 << i) != 0).map(consumer).collect();
    registry::unregister_all(&consumers);
    signals::give_back();
}

/// In the child of a `fork` during a session (its `pthread_atfork` handler, one thread):
/// the child has no session, so nothing of it stays: returns true when the child's probes
/// must be taken out of its code (see `fork`), after giving the program's signal actions
/// back.
pub fn forked_child() -> bool {
    if !ON.swap(false, Ordering::SeqCst) {
        return false;
    }
    FOLLOWS_LOADS.store(false, Ordering::SeqCst);
    ARMED.store(0, Ordering::SeqCst);
    signals::give_back();
    true
}
