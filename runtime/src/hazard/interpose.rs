//! The functions the runtime interposes (exports under libc's names, so the program's calls
//! reach them first) find the definition they stand in front of here.
//!
//! The runtime's own calls to these names reach the interposers too (the runtime is not
//! linked with -Bsymbolic): each interposer passes calls through unchanged where the runtime
//! is not active or the call is the runtime's own.

use core::ffi::{c_void, CStr};
use core::sync::atomic::{AtomicPtr, Ordering};

/// The next definition of a symbol after this library, looked up once.
pub struct Next {
    name: &'static CStr,
    ptr: AtomicPtr<c_void>,
}

impl Next {
    pub const fn new(name: &'static CStr) -> Next {
        Next { name, ptr: AtomicPtr::new(core::ptr::null_mut()) }
    }

    /// The address; looked up on first use (normal context), or by [`Next::resolve`] at
    /// start-up, after which it is signal-safe.
    pub fn get(&self) -> *mut c_void {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
        self.resolve()
    }

    pub fn resolve(&self) -> *mut c_void {
        // SAFETY: dlsym with RTLD_NEXT and a C string.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) };
        if p.is_null() {
            crate::base::output::message(format_args!("fatal: {:?} not found after the runtime", self.name));
            // SAFETY: abort has no preconditions; there is nothing to forward to.
            unsafe { libc::abort() };
        }
        self.ptr.store(p, Ordering::Release);
        p
    }
}

/// The next definition of an interposed function as a function pointer, to call inside an
/// `unsafe` block whose SAFETY comment covers the call: `next!(STATIC, unsafe extern "C"
/// fn(args) -> ret)(args)`. The symbol is libc's function of the same name, whose signature
/// the caller writes as `$ty`.
macro_rules! next {
    ($next:expr, $ty:ty) => {
        core::mem::transmute::<*mut core::ffi::c_void, $ty>($next.get())
    };
}
pub(crate) use next;
