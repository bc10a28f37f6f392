//! Where a return probe may go: only on a function's first instruction, and only on a
//! function that returns once, to its caller, by `ret` (or a tail call). Elsewhere the
//! hooked return address would corrupt the stack or meet the trampoline with no record.
//!
//! Normal context, under the registry lock (registration).

use crate::insn::decode;
use crate::probe::error::RegisterError;
use crate::probe::symbols::View;

/// Functions that return twice: the second return would come back to the trampoline after the
/// first one took the record (`setjmp`'s jump buffer, a `vfork` child, a saved context).
const RETURNS_TWICE: &[&str] = &[
    "setjmp",
    "_setjmp",
    "__setjmp",
    "sigsetjmp",
    "__sigsetjmp",
    "savectx",
    "vfork",
    "__vfork",
    "getcontext",
    "__getcontext",
];

/// The program's entry point (`AT_ENTRY`), read once.
fn entry_point() -> usize {
    static ENTRY: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ENTRY.get_or_init(|| crate::base::sys::auxv(libc::AT_ENTRY).unwrap_or(0) as usize)
}

/// Checks that a return probe may go at `addr`.
pub fn check(view: &mut View, addr: usize) -> Result<(), RegisterError> {
    if addr == entry_point() {
        return Err(RegisterError::EntryPoint(addr));
    }
    let Some(f) = view.function_code(addr) else {
        return Ok(()); // no sized symbol: nothing known against it
    };
    if f.start != addr {
        return Err(RegisterError::NotEntry { addr, function: f.name, start: f.start });
    }
    let names = view.names_at(addr);
    if let Some(name) = names.iter().find(|n| RETURNS_TWICE.contains(&n.as_str())) {
        return Err(RegisterError::ReturnsTwice { addr, function: name.clone() });
    }
    if !decode::may_return(&f.bytes, f.start as u64) {
        return Err(RegisterError::NeverReturns { addr, function: f.name });
    }
    Ok(())
}
