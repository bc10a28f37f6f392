//! A handler library's `uprobe_init` run guarded, in an attach session: a fault (SIGSEGV,
//! SIGBUS, SIGILL, SIGFPE), an `abort()` (SIGABRT), or running past a time bound, on the
//! thread that runs it (the agent), ends the call instead of the process. The process was
//! not started for the handlers: it must run on whatever their set-up does.
//!
//! The call goes through a small assembly frame that saves the callee-saved registers and
//! the stack pointer; the signal handler sends the thread back to it by editing the signal
//! context (a `longjmp` the kernel's signal return carries out), so the call returns
//! `ESCAPED`. This is safe only where the thread is not inside the runtime (its locks): a
//! fault there follows the usual path. The time bound is a POSIX timer aimed at that thread
//! alone, delivering SIGSEGV with `SI_TIMER` (the runtime's own SIGSEGV handler is always
//! installed; no signal of the program's is taken). SIGILL, SIGFPE and SIGABRT get a
//! handler only while the call runs; on any other thread it puts the program's action back
//! and lets the signal happen again, as if no handler had been there.
//!
//! Context: normal (the agent thread) for [`run`]; signal context for [`escape`].

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};

use crate::base::stats::Call;
use crate::base::sys;
use crate::hazard::sigset;
use crate::probe::thread;

core::arch::global_asm!(
    ".pushsection .text.uprobe_guard,\"ax\",@progbits",
    ".p2align 4",
    ".globl uprobe_guard_call",
    ".hidden uprobe_guard_call",
    ".type uprobe_guard_call,@function",
    // rdi: the function, rsi: 8 words for rbx, rbp, r12-r15, the stack pointer after the
    // return and the return address.
    "uprobe_guard_call:",
    "mov [rsi], rbx",
    "mov [rsi + 8], rbp",
    "mov [rsi + 16], r12",
    "mov [rsi + 24], r13",
    "mov [rsi + 32], r14",
    "mov [rsi + 40], r15",
    "lea rax, [rsp + 8]",
    "mov [rsi + 48], rax",
    "mov rax, [rsp]",
    "mov [rsi + 56], rax",
    "sub rsp, 8",
    "call rdi",
    "add rsp, 8",
    "movsxd rax, eax",
    "ret",
    ".size uprobe_guard_call, . - uprobe_guard_call",
    ".p2align 4",
    ".globl uprobe_guard_escape",
    ".hidden uprobe_guard_escape",
    ".type uprobe_guard_escape,@function",
    // Entered from a signal return with rdi: the saved words. Returns ESCAPED.
    "uprobe_guard_escape:",
    "mov rbx, [rdi]",
    "mov rbp, [rdi + 8]",
    "mov r12, [rdi + 16]",
    "mov r13, [rdi + 24]",
    "mov r14, [rdi + 32]",
    "mov r15, [rdi + 40]",
    "mov rsp, [rdi + 48]",
    "movabs rax, 0x8000000000000000",
    "jmp qword ptr [rdi + 56]",
    ".size uprobe_guard_escape, . - uprobe_guard_escape",
    ".popsection",
);

extern "C" {
    fn uprobe_guard_call(f: unsafe extern "C" fn() -> c_int, saved: *mut [usize; 8]) -> i64;
    fn uprobe_guard_escape();
}

const ESCAPED: i64 = i64::MIN;

/// Why a guarded call did not return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escape {
    /// A fault or an abort: the signal, and the faulting address (0 for SIGABRT).
    Signal { sig: i32, addr: usize },
    /// It ran past its time bound.
    Timeout,
}

/// The signals only the guard handles, while a call runs.
const CAUGHT: [c_int; 3] = [libc::SIGILL, libc::SIGFPE, libc::SIGABRT];

/// The guarded thread, 0 while no call runs.
static TID: AtomicI32 = AtomicI32::new(0);
/// Its runtime depth when the call started: deeper, the thread is inside the runtime.
static DEPTH: AtomicU32 = AtomicU32::new(0);
/// The saved registers of the running call.
static SAVED: AtomicUsize = AtomicUsize::new(0);
/// What ended it: the signal (-1 for the timer) and the address.
static WHY_SIG: AtomicI32 = AtomicI32::new(0);
static WHY_ADDR: AtomicUsize = AtomicUsize::new(0);
/// The thread the last timer was aimed at: a late expiry there is ignored.
static TIMER_TID: AtomicI32 = AtomicI32::new(0);

/// The program's actions for [`CAUGHT`], while the guard's stand in front of them.
struct Actions(UnsafeCell<[libc::sigaction; 3]>);
// SAFETY: written by `run` before the guard's handlers are installed and after they are
// removed; read by those handlers in between, never written then.
unsafe impl Sync for Actions {}
// SAFETY: an all-zero sigaction is a valid value (SIG_DFL, no flags, empty mask).
static PROGRAM: Actions = Actions(UnsafeCell::new(unsafe { core::mem::zeroed() }));

/// Runs `f` guarded for at most `timeout_ns` (see the module doc).
pub fn run(f: unsafe extern "C" fn() -> c_int, timeout_ns: u64) -> Result<c_int, Escape> {
    let mut saved = [0usize; 8];
    let me = sys::gettid();
    DEPTH.store(thread::current().depth.get(), Ordering::SeqCst);
    SAVED.store(saved.as_mut_ptr() as usize, Ordering::SeqCst);
    install();
    TID.store(me, Ordering::SeqCst);
    let timer = arm_timer(me, timeout_ns);
    // SAFETY: `f` is the library's entry point (C ABI, no arguments); `saved` lives until the
    // call returns, normally or through `uprobe_guard_escape`.
    let rc = unsafe { uprobe_guard_call(f, &mut saved) };
    if let Some(timer) = timer {
        // SAFETY: timer_delete takes the id timer_create gave.
        let _ = unsafe { sys::call(Call::Other, libc::SYS_timer_delete, [timer, 0, 0, 0, 0, 0]) };
    }
    TID.store(0, Ordering::SeqCst);
    restore();
    if rc != ESCAPED {
        return Ok(rc as c_int);
    }
    match WHY_SIG.load(Ordering::SeqCst) {
        -1 => Err(Escape::Timeout),
        sig => Err(Escape::Signal { sig, addr: WHY_ADDR.load(Ordering::SeqCst) }),
    }
}

/// A timer that sends SIGSEGV (`SI_TIMER`) to thread `tid` after `ns`; its id.
fn arm_timer(tid: i32, ns: u64) -> Option<usize> {
    // SAFETY: a zeroed sigevent is valid; the fields the kernel reads are set below.
    let mut event: libc::sigevent = unsafe { core::mem::zeroed() };
    event.sigev_notify = libc::SIGEV_THREAD_ID;
    event.sigev_signo = libc::SIGSEGV;
    event.sigev_notify_thread_id = tid;
    let mut id: c_int = 0;
    let args = [libc::CLOCK_MONOTONIC as usize, &mut event as *mut _ as usize, &mut id as *mut _ as usize, 0, 0, 0];
    // SAFETY: timer_create reads the sigevent and writes the id, both valid here.
    unsafe { sys::call(Call::Other, libc::SYS_timer_create, args) }.ok()?;
    TIMER_TID.store(tid, Ordering::SeqCst);
    let when = libc::itimerspec {
        // Again every 100 ms after the bound, should it meet the thread inside the runtime.
        it_interval: libc::timespec { tv_sec: 0, tv_nsec: 100_000_000 },
        it_value: libc::timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 },
    };
    let args = [id as usize, 0, &when as *const _ as usize, 0, 0, 0];
    // SAFETY: timer_settime reads a valid itimerspec; no old value is asked for.
    unsafe { sys::call(Call::Other, libc::SYS_timer_settime, args) }.ok()?;
    Some(id as usize)
}

fn install() {
    // SAFETY: a zeroed sigaction is valid; handler, flags and mask are set below.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = on_signal as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO;
    // SAFETY: no guard handler is installed yet: nothing reads PROGRAM.
    let program = unsafe { &mut *PROGRAM.0.get() };
    for (i, &sig) in CAUGHT.iter().enumerate() {
        sigset::real_sigaction(sig, Some(&sa), Some(&mut program[i]));
    }
}

fn restore() {
    // SAFETY: read-only while handlers may run (see `Actions`).
    let program = unsafe { &*PROGRAM.0.get() };
    for (i, &sig) in CAUGHT.iter().enumerate() {
        sigset::real_sigaction(sig, Some(&program[i]), None);
    }
}

/// The guard's handler for [`CAUGHT`] (signal context).
extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
    let (code, addr, gregs) = unsafe {
        ((*info).si_code, (*info).si_addr() as usize, &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs)
    };
    let addr = if sig == libc::SIGABRT { 0 } else { addr };
    if escape(sig, code, addr, gregs) {
        return;
    }
    // Another thread's: the program's action again, and the signal again (a fault by running
    // the instruction again, a sent signal by sending it again: it is blocked until this
    // handler returns).
    if let Some(i) = CAUGHT.iter().position(|&s| s == sig) {
        // SAFETY: read-only while handlers may run (see `Actions`).
        sigset::real_sigaction(sig, Some(unsafe { &(*PROGRAM.0.get())[i] }), None);
    }
    if code <= 0 {
        let args = [sys::getpid() as usize, sys::gettid() as usize, sig as usize, 0, 0, 0];
        // SAFETY: tgkill takes plain integers: this process, this thread.
        let _ = unsafe { sys::call(Call::Other, libc::SYS_tgkill, args) };
    }
}

/// Sends the guarded thread back out of its call when `sig` hit it outside the runtime, and
/// swallows a late timer expiry; says whether the signal was handled so (signal context).
pub fn escape(sig: c_int, code: c_int, addr: usize, gregs: &mut [i64; 23]) -> bool {
    let me = sys::gettid();
    let timer = sig == libc::SIGSEGV && code == libc::SI_TIMER;
    if TID.load(Ordering::SeqCst) != me {
        return timer && TIMER_TID.load(Ordering::SeqCst) == me;
    }
    let t = thread::current();
    if t.depth.get() != DEPTH.load(Ordering::SeqCst) || t.busy.get() {
        // Inside the runtime (its locks may be held): the usual path; a timer waits.
        return timer;
    }
    WHY_SIG.store(if timer { -1 } else { sig }, Ordering::SeqCst);
    WHY_ADDR.store(addr, Ordering::SeqCst);
    TID.store(0, Ordering::SeqCst);
    gregs[libc::REG_RIP as usize] = uprobe_guard_escape as *const () as usize as i64;
    gregs[libc::REG_RDI as usize] = SAVED.load(Ordering::SeqCst) as i64;
    true
}
