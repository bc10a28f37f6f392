//! The exported C functions of `include/uprobe.h`.
//!
//! Requests made from inside a handler are queued on the calling thread and carried out once
//! the probe point's handlers have run (still on the hit path, so without `malloc`: the
//! runtime allocates from its own allocator). A request is carried out only when the thread
//! is not inside the runtime, so the registry's lock and the allocator are never re-entered.

use core::ffi::{c_char, c_int, c_ulong, CStr};
use std::cell::Cell;
use std::ffi::CString;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::abi::{Uprobe, Uretprobe, UPTY_UPROBE, UPTY_URETPROBE};
use crate::registry::{self, Consumer, RegisterError};
use crate::{output, retprobe, thread, trap};

#[derive(Clone, Copy)]
enum Request {
    Register(Consumer),
    Unregister(Consumer),
}

const QUEUE_LEN: usize = 32;

thread_local! {
    /// Requests queued by handlers on this thread; `thread::ThreadState::queued` counts them.
    static QUEUE: [Cell<Option<Request>>; QUEUE_LEN] = const { [const { Cell::new(None) }; QUEUE_LEN] };
}

/// Marks the calling thread as inside the runtime for its lifetime.
struct Inside;

impl Inside {
    fn enter() -> Inside {
        let t = thread::current();
        t.depth.set(t.depth.get() + 1);
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let t = thread::current();
        t.depth.set(t.depth.get() - 1);
        run_deferred();
    }
}

/// Whether the calling thread is inside a runtime entry point (signal-safe).
pub fn inside_runtime() -> bool {
    thread::current().depth.get() != 0
}

fn queue(request: Request) -> c_int {
    let n = &thread::current().queued;
    let i = n.get();
    if i == QUEUE_LEN {
        return -libc::EAGAIN;
    }
    QUEUE.with(|q| q[i].set(Some(request)));
    n.set(i + 1);
    -libc::EINPROGRESS
}

/// Carries out the requests handlers queued on this thread, when it is safe to (signal-safe:
/// see the module doc).
pub fn run_deferred() {
    let t = thread::current();
    if t.depth.get() != 0 || t.busy.get() || t.queued.get() == 0 {
        return;
    }
    let _inside = Inside::enter();
    let mut i = 0;
    while i < t.queued.get() {
        let request = QUEUE.with(|q| q[i].take());
        i += 1;
        let (consumer, reg, result) = match request {
            Some(Request::Register(c)) => (c, 1, do_register(c)),
            Some(Request::Unregister(c)) => {
                registry::unregister(c);
                (c, 0, 0)
            }
            None => continue,
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

fn do_register(consumer: Consumer) -> c_int {
    if crate::disable::reason().is_some() {
        return -libc::EPERM;
    }
    // SAFETY: the object came through register_uprobe/register_uretprobe, whose contract keeps
    // it valid while registered.
    match unsafe { registry::register(consumer) } {
        Ok(addr) => {
            if addr != 0 {
                crate::faults::describe(consumer.key(), addr, handler_of(consumer));
            }
            0
        }
        Err(e) if refuses_writable_code(&e) => {
            if crate::disable::disable(crate::disable::Reason::WriteXorExecute) {
                output::message(format_args!(
                    "this process refuses to make its code writable ({e}; W^X, as with PR_SET_MDWE): the runtime is disabled and the program runs unprobed"
                ));
            }
            -libc::EPERM
        }
        Err(e) => {
            report(consumer, &e);
            e.errno()
        }
    }
}

/// The address of a probe object's handler, to name its library when it faults.
pub fn handler_of(consumer: Consumer) -> usize {
    // SAFETY: registered probe objects are valid (C ABI).
    unsafe {
        match consumer {
            Consumer::Uprobe(u) => (*u).handler.map_or(0, |h| h as usize),
            Consumer::Uretprobe(rp) => {
                (*rp).handler.map(|h| h as usize).or((*rp).entry_handler.map(|h| h as usize)).unwrap_or(0)
            }
        }
    }
}

/// Whether a registration failed because the process refuses writable code (W^X).
fn refuses_writable_code(e: &RegisterError) -> bool {
    let errno = match e {
        RegisterError::Patch { source, .. } => source.errno,
        RegisterError::Slot { source: crate::ssol::SlotError::Map { errno, .. }, .. } => *errno,
        _ => return false,
    };
    errno == libc::EACCES || errno == libc::EPERM
}

/// Runs `f` marked as inside the runtime (probe hits on the way run no handler).
pub fn inside<R>(f: impl FnOnce() -> R) -> R {
    let _inside = Inside::enter();
    f()
}

/// Says why a registration failed, on the run's output.
pub fn report(consumer: Consumer, e: &RegisterError) {
    if *e == RegisterError::AlreadyRegistered {
        return;
    }
    let (call, u) = match consumer {
        Consumer::Uprobe(u) => ("register_uprobe", u),
        Consumer::Uretprobe(rp) => ("register_uretprobe", rp.cast::<Uprobe>()),
    };
    // SAFETY: the object is non-null and valid (checked by the caller, C ABI).
    output::message(format_args!("{call}({}): {e}", describe(unsafe { &*u })));
}

fn register_request(consumer: Consumer) -> c_int {
    if trap::in_handler() {
        return queue(Request::Register(consumer));
    }
    let _inside = Inside::enter();
    do_register(consumer)
}

fn unregister_request(consumer: Consumer) {
    if trap::in_handler() {
        queue(Request::Unregister(consumer));
        return;
    }
    let _inside = Inside::enter();
    registry::unregister(consumer);
}

/// `int register_uprobe(struct uprobe *u)`.
///
/// # Safety
/// `u` must point to a `struct uprobe` that stays valid until it is unregistered.
#[no_mangle]
pub unsafe extern "C" fn register_uprobe(u: *mut Uprobe) -> c_int {
    if u.is_null() {
        return -libc::EINVAL;
    }
    register_request(Consumer::Uprobe(u))
}

/// `void unregister_uprobe(struct uprobe *u)`.
///
/// # Safety
/// `u` must be null, unregistered, or a registered probe object.
#[no_mangle]
pub unsafe extern "C" fn unregister_uprobe(u: *mut Uprobe) {
    if !u.is_null() {
        unregister_request(Consumer::Uprobe(u));
    }
}

/// `int register_uretprobe(struct uretprobe *rp)`.
///
/// # Safety
/// `rp` must point to a `struct uretprobe` that stays valid until it is unregistered.
#[no_mangle]
pub unsafe extern "C" fn register_uretprobe(rp: *mut Uretprobe) -> c_int {
    if rp.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: non-null, and valid per the contract.
    let data_size = unsafe { (*rp).data_size };
    if data_size > retprobe::MAX_DATA_SIZE {
        output::message(format_args!(
            "register_uretprobe: data_size {data_size} is more than the {} bytes an instance may hold",
            retprobe::MAX_DATA_SIZE
        ));
        return -libc::EINVAL;
    }
    register_request(Consumer::Uretprobe(rp))
}

/// `void unregister_uretprobe(struct uretprobe *rp)`. Returns pending on other threads keep
/// returning correctly but run no handler once this returns.
///
/// # Safety
/// `rp` must be null, unregistered, or a registered return probe.
#[no_mangle]
pub unsafe extern "C" fn unregister_uretprobe(rp: *mut Uretprobe) {
    if !rp.is_null() {
        unregister_request(Consumer::Uretprobe(rp));
    }
}

/// The `--param` values, as C strings, set once before any handler library is loaded.
static PARAMS: AtomicPtr<Vec<(CString, CString)>> = AtomicPtr::new(core::ptr::null_mut());

pub fn set_params(params: &[(String, String)]) {
    let list: Vec<(CString, CString)> = params
        .iter()
        .filter_map(|(n, v)| Some((CString::new(n.as_str()).ok()?, CString::new(v.as_str()).ok()?)))
        .collect();
    PARAMS.store(Box::into_raw(Box::new(list)), Ordering::Release);
}

/// `const char *uprobe_param(const char *name)`.
///
/// # Safety
/// `name` must be null or a C string.
#[no_mangle]
pub unsafe extern "C" fn uprobe_param(name: *const c_char) -> *const c_char {
    let params = PARAMS.load(Ordering::Acquire);
    if name.is_null() || params.is_null() {
        return core::ptr::null();
    }
    // SAFETY: `name` is a C string (caller); the list is leaked, never freed or changed.
    let (name, params) = unsafe { (CStr::from_ptr(name), &*params) };
    params.iter().find(|(n, _)| n.as_c_str() == name).map_or(core::ptr::null(), |(_, v)| v.as_ptr())
}

/// `unsigned long uprobe_lookup(const char *spec)`.
///
/// # Safety
/// `spec` must be null or a C string.
#[no_mangle]
pub unsafe extern "C" fn uprobe_lookup(spec: *const c_char) -> c_ulong {
    if spec.is_null() {
        return 0;
    }
    // SAFETY: `spec` is a C string (caller).
    let spec = unsafe { CStr::from_ptr(spec) }.to_string_lossy();
    let _inside = Inside::enter();
    registry::lookup_spec(&spec).map_or(0, |a| a as c_ulong)
}
