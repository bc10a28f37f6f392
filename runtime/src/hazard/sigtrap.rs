//! The SIGTRAP entry point. Every `int3` probe hit arrives here; so do the program's own traps
//! (`raise(SIGTRAP)`, an `int3` it executes), which are handed on to what the program
//! installed (`signals::foreign_trap`).
//!
//! SIGNAL CONTEXT: see `probe::dispatch` for what the hit path may do.

use core::ffi::{c_int, c_void};

use crate::base::sys;
use crate::hazard::{signals, sigset};
use crate::probe::dispatch;

/// si_code of a trap raised by the CPU's `int3`.
const SI_KERNEL: c_int = 0x80;

/// Installs the SIGTRAP handler.
pub fn install() -> Result<(), sys::Errno> {
    // SAFETY: a zeroed sigaction is a valid starting point; we fill in handler, flags and an
    // empty mask before passing it to the kernel.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_sigtrap as *const () as usize;
        // NODEFER: a probe hit inside a handler (or inside the runtime) traps again.
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        // The libc function itself: `sigaction` calls reach the program's view (`signals`).
        if sigset::real_sigaction(libc::SIGTRAP, Some(&sa), None) != 0 {
            return Err(sys::errno());
        }
    }
    Ok(())
}

/// The address of the runtime's SIGTRAP handler, to tell it from another.
pub fn handler() -> usize {
    on_sigtrap as *const () as usize
}

/// The SIGTRAP handler (signal context).
extern "C" fn on_sigtrap(_sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler; the
    // register array is ours to edit until the handler returns.
    let (code, gregs) = unsafe { ((*info).si_code, &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs) };
    // SAFETY: as above; the kernel saved the vector state with the signal frame, at fpregs.
    let fpregs = unsafe { (*(ctx as *mut libc::ucontext_t)).uc_mcontext.fpregs } as usize;
    let vectors = if fpregs == 0 { 0 } else { fpregs + core::mem::offset_of!(libc::_libc_fpstate, _xmm) };
    let addr = (gregs[libc::REG_RIP as usize] as usize).wrapping_sub(1);
    if code == SI_KERNEL && dispatch::on_trap(addr, gregs, vectors) {
        return;
    }
    // SAFETY: the kernel's arguments to this handler, passed on.
    unsafe { signals::foreign_trap(addr, info, ctx) };
}
