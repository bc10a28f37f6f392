//! Holding the process's other threads stopped around a batch's writes, so that jumps may be
//! written while the process has other threads: the trap-free path's rule is that no thread
//! may be inside the bytes a jump replaces. An attach session provides the means (the
//! `uprobe-run` that attached stops the threads with ptrace) for its agent thread, the only
//! thread whose batches it serves; other threads' batches go on with `int3` only.
//!
//! Also counts the runtime's own threads while they are idle: they then run none of the
//! program's code and so do not make a process multi-threaded for placement.
//!
//! Normal context, under the registry lock (the batch's writer).

use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crate::base::lock::Mutex;
use crate::base::sys;
use crate::probe::thread;

/// A means to stop and resume every other thread of the process. While they are stopped,
/// one of them may hold the runtime's allocator lock: nothing here may allocate, which is
/// why the caller passes the room for the addresses.
pub trait World: Sync {
    /// Stops every other thread at a safe place (outside any system call or instruction in
    /// progress) and fills `rips` with where each will resume (its instruction pointer, and
    /// for a thread in a system call that restarts, the address of that `syscall` too),
    /// within the capacity the caller reserved. Returns false if they could not be stopped,
    /// or were let go again because their addresses did not fit.
    fn stop(&self, rips: &mut Vec<usize>) -> bool;
    /// Lets the stopped threads run briefly and stops them again (one sat where a jump goes).
    fn restop(&self, rips: &mut Vec<usize>) -> bool;
    /// Lets them run again.
    fn resume(&self);
}

/// Room for the resume addresses of every thread of the process, and more for threads that
/// appear before the stop (allocated before it).
pub fn room_for_addresses() -> Vec<usize> {
    let threads = sys::read_file(c"/proc/self/status")
        .ok()
        .and_then(|s| {
            String::from_utf8_lossy(&s)
                .lines()
                .find_map(|l| l.strip_prefix("Threads:").and_then(|n| n.trim().parse::<usize>().ok()))
        })
        .unwrap_or(0);
    Vec::with_capacity(2 * (threads + 256))
}

/// The thread whose batches a world serves, and the world.
static WORLD: Mutex<Option<(i32, &'static dyn World)>> = Mutex::new(None);

/// Idle threads of the runtime's own (attach agents waiting for their next request).
static OWN_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Threads of the runtime itself (the trace drain thread): they never run the program's code
/// while a batch is written (they call into libc only under the registry lock, which the
/// writer holds), so they do not count against a process being alone.
pub static RUNTIME_THREADS: AtomicU32 = AtomicU32::new(0);

/// Starts one of the runtime's own threads (a drain, a report or a feed thread), detached
/// and counted in [`RUNTIME_THREADS`], with every signal blocked but the synchronous ones
/// (the program's signals are never delivered to it); the error of `pthread_create`.
#[allow(unsafe_code)]
pub fn spawn(main: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void, arg: usize) -> Result<(), i32> {
    let synchronous = [libc::SIGSEGV, libc::SIGBUS, libc::SIGTRAP, libc::SIGILL, libc::SIGFPE];
    let keep = synchronous.iter().fold(0u64, |m, s| m | 1 << (s - 1));
    let old = sys::set_signal_mask(!keep);
    RUNTIME_THREADS.fetch_add(1, Ordering::SeqCst);
    let mut thread: libc::pthread_t = 0;
    // SAFETY: `main` is a thread entry point of the C ABI taking `arg` as its argument;
    // default attributes.
    let rc = unsafe { libc::pthread_create(&mut thread, core::ptr::null(), main, arg as *mut libc::c_void) };
    if rc == 0 {
        // SAFETY: a thread just created, never joined.
        unsafe { libc::pthread_detach(thread) };
    } else {
        RUNTIME_THREADS.fetch_sub(1, Ordering::SeqCst);
    }
    sys::set_signal_mask(old);
    if rc == 0 {
        Ok(())
    } else {
        Err(rc)
    }
}

/// Serves the batches of thread `tid` with `world` from now on.
pub fn install(tid: i32, world: &'static dyn World) {
    *WORLD.lock() = Some((tid, world));
}

/// Stops serving thread `tid`.
pub fn remove(tid: i32) {
    let mut w = WORLD.lock();
    if w.is_some_and(|(t, _)| t == tid) {
        *w = None;
    }
}

/// The world that serves the calling thread's batches, if any.
pub fn for_this_thread() -> Option<&'static dyn World> {
    let w = *WORLD.lock();
    w.filter(|(tid, _)| *tid == sys::gettid()).map(|(_, world)| world)
}

/// Marks the calling thread, one of the runtime's own, as idle (waiting, running none of the
/// program's or the handler libraries' code: it then does not count as a thread that may
/// run the code a batch changes), or busy again.
pub fn set_own_idle(idle: bool) {
    let t = thread::current();
    if t.own.replace(idle) != idle {
        if idle {
            OWN_THREADS.fetch_add(1, Ordering::SeqCst);
        } else {
            OWN_THREADS.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Whether the process has no thread but the caller that may run the program's code: from
/// the thread count in /proc/self/status, less the runtime's own idle threads other than the
/// caller, and its event stream's drain thread ([`RUNTIME_THREADS`]).
pub fn single_program_thread() -> bool {
    let Ok(status) = sys::read_file(c"/proc/self/status") else { return false };
    let others = OWN_THREADS.load(Ordering::SeqCst) - usize::from(thread::current().own.get())
        + RUNTIME_THREADS.load(Ordering::SeqCst) as usize;
    String::from_utf8_lossy(&status)
        .lines()
        .find_map(|l| l.strip_prefix("Threads:").and_then(|n| n.trim().parse::<usize>().ok()))
        .is_some_and(|n| n == 1 + others)
}
