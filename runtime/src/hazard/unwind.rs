//! Interposed functions that read or discard return addresses: the C++ unwinder,
//! `backtrace()` and `pthread_exit`. A return-probed frame holds the trampoline's address in
//! place of its return address; these functions must see the real one. Each puts the real
//! addresses back before the real function runs (`probe::retprobe::restore_returns`), and where
//! the frames live on afterwards (after `backtrace()`, after a `catch`), hooks them again so
//! their returns keep being counted.
//!
//! Normal context: these run as the program's own calls.

use core::ffi::{c_int, c_void};

use crate::hazard::interpose::Next;
use crate::probe::retprobe;

static RAISE: Next = Next::new(c"_Unwind_RaiseException");
static RETHROW: Next = Next::new(c"_Unwind_Resume_or_Rethrow");
static FORCED_UNWIND: Next = Next::new(c"_Unwind_ForcedUnwind");
static BACKTRACE_UNWIND: Next = Next::new(c"_Unwind_Backtrace");
static BACKTRACE: Next = Next::new(c"backtrace");
static PTHREAD_EXIT: Next = Next::new(c"pthread_exit");
static BEGIN_CATCH: Next = Next::new(c"__cxa_begin_catch");

/// The next definition of an interposed function, as a function pointer of type `$ty`
/// (looked up on first use: libgcc_s may be loaded late).
macro_rules! next_fn {
    ($next:expr, $ty:ty) => {{
        // SAFETY: the symbol is the libc/libgcc function of this very name, whose signature
        // the caller writes as `$ty`.
        unsafe { core::mem::transmute::<*mut c_void, $ty>($next.get()) }
    }};
}

/// `_Unwind_RaiseException`: the unwinder walks return addresses, so they must be real.
///
/// # Safety
/// The libgcc contract.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_RaiseException(exception: *mut c_void) -> c_int {
    let here = 0u8;
    retprobe::throwing(&here as *const u8 as usize);
    let real = next_fn!(RAISE, unsafe extern "C" fn(*mut c_void) -> c_int);
    // SAFETY: forwarding the caller's arguments to the real function.
    unsafe { real(exception) }
}

/// `_Unwind_Resume_or_Rethrow` (`throw;` in a handler): as a new throw.
///
/// # Safety
/// The libgcc contract.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_Resume_or_Rethrow(exception: *mut c_void) -> c_int {
    let here = 0u8;
    retprobe::throwing(&here as *const u8 as usize);
    let real = next_fn!(RETHROW, unsafe extern "C" fn(*mut c_void) -> c_int);
    // SAFETY: forwarding the caller's arguments to the real function.
    unsafe { real(exception) }
}

/// `_Unwind_ForcedUnwind` (thread exit and cancellation through the unwinder).
///
/// # Safety
/// The libgcc contract.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_ForcedUnwind(exception: *mut c_void, stop: *mut c_void, arg: *mut c_void) -> c_int {
    retprobe::restore_returns();
    let real = next_fn!(FORCED_UNWIND, unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void) -> c_int);
    // SAFETY: forwarding the caller's arguments to the real function.
    unsafe { real(exception, stop, arg) }
}

/// `_Unwind_Backtrace`: real addresses while it walks, hooks again afterwards.
///
/// # Safety
/// The libgcc contract.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_Backtrace(trace: *mut c_void, arg: *mut c_void) -> c_int {
    retprobe::restore_returns();
    let real = next_fn!(BACKTRACE_UNWIND, unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int);
    // SAFETY: forwarding the caller's arguments to the real function.
    let rc = unsafe { real(trace, arg) };
    retprobe::rehook_returns();
    rc
}

/// `backtrace(3)`: glibc reaches the unwinder without going through the PLT, so it is
/// interposed itself.
///
/// # Safety
/// The glibc contract.
#[no_mangle]
pub unsafe extern "C" fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int {
    const ROOM: usize = 256;
    if size <= 0 {
        return 0;
    }
    retprobe::restore_returns();
    let real = next_fn!(BACKTRACE, unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int);
    // The real backtrace leaves out its own frame but sees this one: drop it, so the caller
    // gets the frames it would get without the runtime.
    let size = size as usize;
    let mut room = [core::ptr::null_mut::<c_void>(); ROOM + 1];
    // SAFETY: each call gets a buffer of the size passed with it; copies stay within the
    // caller's `size` entries.
    let n = unsafe {
        if size <= ROOM {
            let n = real(room.as_mut_ptr(), size as c_int + 1).max(1) as usize;
            core::ptr::copy_nonoverlapping(room.as_ptr().add(1), buffer, n - 1);
            n - 1
        } else {
            // Too many to stage on the stack: the deepest frame is lost when the trace fills it.
            let n = real(buffer, size as c_int).max(1) as usize;
            core::ptr::copy(buffer.add(1), buffer, n - 1);
            n - 1
        }
    };
    retprobe::rehook_returns();
    n as c_int
}

/// `pthread_exit(3)`: glibc unwinds through its own handle on the unwinder.
///
/// # Safety
/// The glibc contract.
#[no_mangle]
pub unsafe extern "C" fn pthread_exit(retval: *mut c_void) -> ! {
    retprobe::thread_exiting();
    let real = next_fn!(PTHREAD_EXIT, unsafe extern "C" fn(*mut c_void) -> !);
    // SAFETY: forwarding the caller's argument to the real function.
    unsafe { real(retval) }
}

/// The body of `__cxa_begin_catch`: the frames below the catching one are gone; hook the
/// returns of the frames still live again.
extern "C" fn begin_catch(exception: *mut c_void, own_slot: usize) -> *mut c_void {
    retprobe::caught_at(own_slot);
    let real = next_fn!(BEGIN_CATCH, unsafe extern "C" fn(*mut c_void) -> *mut c_void);
    // SAFETY: forwarding the caller's argument to the real function.
    unsafe { real(exception) }
}

/// `__cxa_begin_catch`, entered with the catching frame's stack just above its return slot.
///
/// # Safety
/// The C++ ABI contract.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn __cxa_begin_catch() {
    core::arch::naked_asm!("mov rsi, rsp", "jmp {body}", body = sym begin_catch)
}
