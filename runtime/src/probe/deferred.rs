//! Registration requests, carried out at once or, when made from inside a handler, queued on
//! the calling thread and carried out once the probe point's handlers have run (still on the
//! hit path, so without `malloc`: the runtime allocates from its own allocator). A queued
//! request is carried out only when the thread is not inside the runtime, so the registry's
//! lock and the allocator are never re-entered; `registration_callback` reports its result.
//!
//! Context: normal, or the end of a hit (signal or stub context) for queued requests.

use core::ffi::c_int;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::ffi::CStr;

use crate::base::abi::{Uprobe, UPTY_UPROBE, UPTY_URETPROBE};
use crate::base::{disable, output, sys};
use crate::probe::error::RegisterError;
use crate::probe::table::Consumer;
use crate::probe::{owners, registry, thread};

#[derive(Clone, Copy)]
pub enum Request {
    Register(Consumer),
    Unregister(Consumer),
}

impl Request {
    /// The two words a request is queued as in `ThreadState::requests` ([0, _]: none).
    fn encode(self) -> [usize; 2] {
        match self {
            Request::Register(c) => [1 + c.is_return() as usize, c.key()],
            Request::Unregister(c) => [3 + c.is_return() as usize, c.key()],
        }
    }

    fn decode([kind, key]: [usize; 2]) -> Option<Request> {
        let consumer = |ret: bool| {
            if ret {
                Consumer::Uretprobe(key as *mut crate::base::abi::Uretprobe)
            } else {
                Consumer::Uprobe(key as *mut Uprobe)
            }
        };
        match kind {
            1 | 2 => Some(Request::Register(consumer(kind == 2))),
            3 | 4 => Some(Request::Unregister(consumer(kind == 4))),
            _ => None,
        }
    }
}

/// Marks the calling thread as inside the runtime for its lifetime: probe hits meanwhile run
/// no handler.
pub struct Inside;

impl Inside {
    pub fn enter() -> Inside {
        let t = thread::current();
        t.change_marks(|t| t.depth.set(t.depth.get() + 1));
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let t = thread::current();
        t.change_marks(|t| t.depth.set(t.depth.get() - 1));
        run_deferred();
    }
}

/// Runs `f` marked as inside the runtime (probe hits on the way run no handler).
pub fn inside<R>(f: impl FnOnce() -> R) -> R {
    let _inside = Inside::enter();
    f()
}

/// Runs a handler library's entry point `f` (`uprobe_init`, `uprobe_exit`), described by
/// `what` for a fault there: probe hits on the way run no handler.
pub fn entry_point<R>(what: &'static str, f: impl FnOnce() -> R) -> R {
    let t = thread::current();
    t.change_marks(|t| t.entry.set(t.entry.get() + 1));
    let outer = t.enter_entry_point(what);
    let result = f();
    t.leave_entry_point(outer);
    t.change_marks(|t| t.entry.set(t.entry.get() - 1));
    run_deferred();
    result
}

/// Runs `f` with a placement batch open (see `registry`): what it registers is written when
/// it returns. Probes whose bytes could not be written are reported (or switch the runtime
/// off, where the process refuses writable code).
pub fn batch<R>(f: impl FnOnce() -> R) -> R {
    let opened = registry::open_batch();
    let result = f();
    if opened {
        for (consumer, e) in registry::close_batch() {
            if e.refuses_writable_code() {
                disable_for_wx(&e);
            } else {
                report(consumer, &e);
            }
        }
    }
    result
}

/// Carries out `request` now, or queues it when the thread is running a handler. Returns
/// what `register_uprobe` returns (0 for unregistration).
pub fn request(request: Request) -> c_int {
    if thread::in_handler() {
        return queue(request);
    }
    let _inside = Inside::enter();
    carry_out(request)
}

/// Removes several probe objects at once (`unregister_uprobes`): every probe at one address
/// leaves in the same instant, so their handlers saw the same hits. From a handler, each is
/// queued as [`request`] queues one.
pub fn unregister_all(consumers: &[Consumer]) {
    if thread::in_handler() {
        for &c in consumers {
            let _ = queue(Request::Unregister(c));
        }
        return;
    }
    let _inside = Inside::enter();
    registry::unregister_all(consumers);
}

fn queue(request: Request) -> c_int {
    let t = thread::current();
    let i = t.queued.get();
    if i == thread::QUEUE_LEN {
        return -libc::EAGAIN;
    }
    t.requests[i].set(request.encode());
    t.queued.set(i + 1);
    QUEUED.fetch_add(1, Ordering::SeqCst);
    -libc::EINPROGRESS
}

fn carry_out(request: Request) -> c_int {
    match request {
        Request::Register(c) => register(c),
        Request::Unregister(c) => {
            registry::unregister(c);
            0
        }
    }
}

/// Requests queued by handlers on every thread and not yet carried out (their callbacks not
/// yet returned).
static QUEUED: AtomicUsize = AtomicUsize::new(0);

/// Counts a queued request done when dropped (after its callback returned).
struct Done;

impl Drop for Done {
    fn drop(&mut self) {
        QUEUED.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits until no request queued by a handler is still to be carried out, for at most
/// `timeout_ns`; false if some still are. Requests are queued inside a hit's read-side
/// section, so after a grace period this covers every handler that could still call back into
/// a handler library (its `registration_callback`) before the library is unloaded.
pub fn settle(timeout_ns: u64) -> bool {
    let start = sys::monotonic_ns();
    while QUEUED.load(Ordering::SeqCst) != 0 {
        if sys::monotonic_ns().saturating_sub(start) > timeout_ns {
            return false;
        }
        sys::sched_yield();
    }
    true
}

/// Carries out the requests handlers queued on this thread, when it is safe to (see the
/// module doc); signal-safe as far as the registry is.
pub fn run_deferred() {
    let t = thread::current();
    if t.depth.get() != 0 || t.entry.get() != 0 || t.busy.get() || t.queued.get() == 0 {
        return;
    }
    let _inside = Inside::enter();
    let mut i = 0;
    while i < t.queued.get() {
        let request = Request::decode(t.requests[i].replace([0; 2]));
        i += 1;
        let Some(request) = request else { continue };
        let _done = Done;
        let result = carry_out(request);
        let (consumer, reg) = match request {
            Request::Register(c) => (c, 1),
            Request::Unregister(c) => (c, 0),
        };
        let (u, kind) = match consumer {
            Consumer::Uprobe(u) => (u, UPTY_UPROBE),
            Consumer::Uretprobe(rp) => (rp.cast::<Uprobe>(), UPTY_URETPROBE),
        };
        // SAFETY: `u` is the caller's probe object, valid per the C ABI; the callback is the
        // user's function with the documented signature.
        unsafe {
            if let Some(callback) = (*u).registration_callback {
                callback(u, reg, kind, result);
            }
        }
    }
    t.queued.set(0);
}

/// Registers `consumer`: 0 or the negative errno, the reason said on the run's output.
fn register(consumer: Consumer) -> c_int {
    if disable::reason().is_some() {
        return -libc::EPERM;
    }
    // SAFETY: the object came through register_uprobe/register_uretprobe, whose contract keeps
    // it valid while registered.
    match unsafe { registry::register(consumer) } {
        Ok(addr) => {
            if addr != 0 {
                owners::describe(
                    consumer.key(),
                    addr,
                    registry::symbolize(addr).as_deref(),
                    consumer.handler_address(),
                );
            }
            0
        }
        Err(e) if e.refuses_writable_code() => {
            disable_for_wx(&e);
            -libc::EPERM
        }
        Err(e) => {
            report(consumer, &e);
            e.errno()
        }
    }
}

/// Switches the runtime off in a process that refuses writable code, saying so once.
pub fn disable_for_wx(e: &RegisterError) {
    if disable::disable(disable::Reason::WriteXorExecute) {
        output::message(format_args!(
            "this process refuses to make its code writable ({e}; W^X, as with PR_SET_MDWE): the runtime is disabled and the program runs unprobed"
        ));
    }
}

fn describe(u: &Uprobe) -> String {
    if u.symbol_name.is_null() {
        format!("{:#x}", u.vaddr)
    } else {
        // SAFETY: symbol_name is a C string when set (C ABI).
        let name = unsafe { CStr::from_ptr(u.symbol_name) }.to_string_lossy();
        if u.offset == 0 {
            name.into_owned()
        } else {
            format!("{name}+{:#x}", u.offset)
        }
    }
}

/// Says why a registration failed, on the run's output.
pub fn report(consumer: Consumer, e: &RegisterError) {
    if *e == RegisterError::AlreadyRegistered {
        return;
    }
    let call = if consumer.is_return() { "register_uretprobe" } else { "register_uprobe" };
    // SAFETY: the object is non-null and valid (checked by the caller, C ABI).
    output::message(format_args!("{call}({}): {e}", describe(unsafe { &*consumer.placement() })));
}
