//! A handler that faults. While a thread runs a probe's handler it records which probe that
//! is, and while it runs a handler library's `uprobe_init` or `uprobe_exit`, which library
//! and which function; the runtime's SIGSEGV/SIGBUS handler (see `signals`) then says so, with
//! the address, instead of the program dying silently or hanging, and lets the default action
//! follow.
//!
//! The probe's line is prepared at registration (symbol, library path: `dladdr` is not
//! signal-safe); the fault path only looks it up and writes it.

use crate::base::output;
use crate::probe::{owners, thread};

/// Writes the line for a fault of `sig` at `fault_addr` if the thread was running a probe's
/// handler or a handler library's entry point, and says whether it was (signal context).
pub fn report_if_ours(sig: i32, fault_addr: usize) -> bool {
    let t = thread::current();
    let mut line = output::Line::new();
    let key = t.handling.get();
    if key != 0 {
        line.push(b"uprobe-run: handler for ");
        line.push(owners::text_of(key).unwrap_or("a probe").as_bytes());
    } else if let Some(what) = t.entry_point() {
        line.push(b"uprobe-run: ");
        line.push(what.as_bytes());
    } else {
        return false;
    }
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
    output::flush();
    true
}
