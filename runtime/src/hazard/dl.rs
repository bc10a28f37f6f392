//! Libraries loaded and unloaded while the program runs: `dlopen` and `dlclose`, interposed.
//!
//! A "module:symbol" probe registered before its module is loaded waits in the registry's
//! pending list; after every `dlopen` that maps something new the pending probes whose module
//! is now there are armed (so a library loaded, unloaded and loaded again is probed every
//! time). After every `dlclose` the probes whose code is no longer mapped are forgotten:
//! "module:symbol" probes go back to pending, address probes are reported as gone.
//!
//! Probes are armed when `dlopen` returns, so the library's constructors run unprobed; they
//! stay armed while its destructors run in `dlclose`, and are forgotten before `dlclose`
//! returns.
//!
//! glibc resolves a relative name, `$ORIGIN` and the RUNPATH from the object that called
//! `dlopen`, found by its return address. Called from here that would be the runtime, so
//! the real `dlopen` is called through a stub in anonymous memory, which belongs to no
//! object: glibc then takes the main program as the caller, which is right for calls from
//! the program (and what a library's own `dlopen` calls get too; see docs/hazards.md, dlopen / dlclose).

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::base::{output, sys};
use crate::hazard::interpose::{next, Next};
use crate::probe::deferred;
use crate::probe::owners;
use crate::probe::thread;
use crate::probe::{lifecycle, registry, stacks};

static DLOPEN: Next = Next::new(c"dlopen");
static DLCLOSE: Next = Next::new(c"dlclose");

/// The call stub, or 0 where it could not be made.
static STUB: AtomicUsize = AtomicUsize::new(0);
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// `stub(real, file, mode)`: calls `real(file, mode)` from anonymous memory.
const STUB_CODE: [u8; 20] = [
    0x48, 0x89, 0xf8, // mov rax, rdi
    0x48, 0x89, 0xf7, // mov rdi, rsi
    0x48, 0x89, 0xd6, // mov rsi, rdx
    0x48, 0x83, 0xec, 0x08, // sub rsp, 8 (the call below needs a 16-byte aligned stack)
    0xff, 0xd0, // call rax
    0x48, 0x83, 0xc4, 0x08, // add rsp, 8
    0xc3, // ret
];

type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
type StubFn = unsafe extern "C" fn(usize, *const c_char, c_int) -> *mut c_void;
type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// Start-up: makes the call stub and starts following loads.
pub fn init() {
    DLOPEN.resolve();
    DLCLOSE.resolve();
    if let Ok(page) = sys::mmap_anon(sys::PAGE_SIZE) {
        // SAFETY: the page is ours, fresh and writable; the stub fits in it.
        unsafe { core::ptr::copy_nonoverlapping(STUB_CODE.as_ptr(), page as *mut u8, STUB_CODE.len()) };
        if sys::mprotect(page, sys::PAGE_SIZE, libc::PROT_READ | libc::PROT_EXEC).is_ok() {
            STUB.store(page, Ordering::Release);
        }
    }
    ACTIVE.store(1, Ordering::Release);
}

/// Whether `addr` lies in the call stub (the return address of the runtime's own `dlopen`).
pub fn is_stub(addr: usize) -> bool {
    let stub = STUB.load(Ordering::Acquire);
    stub != 0 && (stub..stub + STUB_CODE.len()).contains(&addr)
}

fn real_dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    let stub = STUB.load(Ordering::Acquire);
    // SAFETY: forwarding the caller's arguments to libc's dlopen, directly or through the
    // stub, which passes them on unchanged.
    unsafe {
        if stub == 0 {
            next!(DLOPEN, DlopenFn)(file, mode)
        } else {
            let stub: StubFn = core::mem::transmute(stub);
            stub(DLOPEN.get() as usize, file, mode)
        }
    }
}

/// Whether this call is the program's, made where the registry may be used.
fn follow() -> bool {
    ACTIVE.load(Ordering::Acquire) != 0 && !thread::inside_runtime() && !thread::in_handler()
}

fn after_load() {
    stacks::refresh();
    for (consumer, result) in deferred::inside(lifecycle::arm_pending) {
        match result {
            Ok(addr) => {
                owners::describe(consumer.key(), addr, registry::symbolize(addr).as_deref(), consumer.handler_address())
            }
            Err(e) => deferred::report(consumer, &e),
        }
    }
}

fn after_unload() {
    stacks::refresh();
    for (consumer, addr) in deferred::inside(lifecycle::drop_unmapped) {
        let kind = if consumer.is_return() { "return probe" } else { "probe" };
        output::message(format_args!("{kind} at {addr:#x} removed: its library was unloaded"));
    }
}

/// `dlopen(3)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    let handle = real_dlopen(file, mode);
    if !handle.is_null() && follow() {
        after_load();
    }
    handle
}

/// `dlclose(3)`, interposed: see the module doc.
///
/// # Safety
/// The libc contract.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    // SAFETY: forwarding the caller's handle to libc's dlclose.
    let rc = unsafe { next!(DLCLOSE, DlcloseFn)(handle) };
    if rc == 0 && follow() {
        after_unload();
    }
    rc
}
