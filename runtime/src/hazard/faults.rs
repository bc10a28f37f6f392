//! A handler that faults. While a thread runs a probe's handler it records which probe that
//! is; the runtime's SIGSEGV/SIGBUS handler (see `signals`) then says which probe, which
//! handler library and which address, instead of the program dying silently or hanging, and
//! lets the default action follow.
//!
//! The line is prepared at registration (symbol, library path: `dladdr` is not signal-safe);
//! the fault path only looks it up and writes it.

use crate::base::output;
use crate::probe::owners;

/// The probe object whose handler the thread is running (signal-safe).
pub fn current() -> Option<usize> {
    let key = crate::probe::thread::current().handling.get();
    (key != 0).then_some(key)
}

/// Writes the line for a fault of `sig` at `fault_addr` in the handler of `key` (signal
/// context).
pub fn report(key: usize, sig: i32, fault_addr: usize) {
    let mut line = output::Line::new();
    line.push(b"uprobe-run: handler for ");
    line.push(owners::text_of(key).unwrap_or("a probe").as_bytes());
    line.push(if sig == libc::SIGBUS { b" faulted: SIGBUS at " } else { b" faulted: SIGSEGV at " });
    let mut hex = [0u8; 18];
    let mut n = 0;
    let mut started = false;
    hex[..2].copy_from_slice(b"0x");
    for i in (0..16).rev() {
        let digit = (fault_addr >> (4 * i)) & 0xf;
        if digit != 0 || started || i == 0 {
            started = true;
            hex[2 + n] = b"0123456789abcdef"[digit];
            n += 1;
        }
    }
    line.push(&hex[..2 + n]);
    line.push(b"\n");
    output::emit(line.as_bytes());
}
