//! Where a probe may go: inside a function, known by its sized symbol or, where the library
//! keeps none, by its FDE (`nosymbol`). A raw address outside every function (padding
//! between functions, a literal pool, a typo) would take an `int3` that never fires, or
//! corrupt data read as code; it is refused unless `--raw-address` allows it. A
//! `symbol+offset` must stay inside the symbol's function, whatever the option.
//!
//! Normal context, under the registry lock.

use core::sync::atomic::{AtomicBool, Ordering};

use crate::probe::error::RegisterError;
use crate::probe::symbols::View;

/// `--raw-address`: addresses outside every function symbol may be probed (stripped
/// programs, hand-written assembly without symbol sizes).
pub static RAW_ADDRESS: AtomicBool = AtomicBool::new(false);

fn raw_allowed() -> bool {
    RAW_ADDRESS.load(Ordering::Relaxed)
}

/// A probe given by address. Addresses outside executable code are left to the placement's
/// own refusal, with a hint when the address is a PIE program's link-time address (what
/// `nm` and `objdump` show).
pub fn check_address(view: &mut View, addr: usize) -> Result<(), RegisterError> {
    if !view.mapping(addr).is_some_and(|m| m.exec) {
        return match link_time_hint(view, addr) {
            Some((function, runtime)) => Err(RegisterError::LinkTimeAddress { addr, function, runtime }),
            None => Ok(()),
        };
    }
    if raw_allowed() || view.function_code(addr).is_some() {
        return Ok(());
    }
    Err(RegisterError::OutsideFunctions(addr))
}

/// A probe given as `symbol+offset` (the symbol resolved to `base`): the address, if it lies
/// in the function starting at `base`. An offset into a function whose extent is unknown (no
/// sized symbol covers it) needs `--raw-address`.
pub fn check_offset(view: &mut View, name: &str, base: usize, offset: u64) -> Result<usize, RegisterError> {
    let addr = base.wrapping_add(offset as usize);
    if offset == 0 {
        return Ok(addr);
    }
    let function = view.function_code(base).filter(|f| f.start == base);
    match function {
        Some(f) if (offset as usize) < f.bytes.len() => Ok(addr),
        Some(f) => Err(RegisterError::PastFunction { function: bare(name).into(), offset, size: f.bytes.len() }),
        None if raw_allowed() => Ok(addr),
        None => Err(RegisterError::UnknownExtent { spec: format!("{}+{offset:#x}", bare(name)), base }),
    }
}

/// The symbol of a specification, without its offset.
fn bare(name: &str) -> &str {
    name.split_once('+').map_or(name, |(n, _)| n)
}

/// Where `addr` is a function's address in the main program's file and the program is
/// position-independent: that function (`name+0xoff`) and its run-time address.
fn link_time_hint(view: &mut View, addr: usize) -> Option<(String, usize)> {
    let main = view.modules().first()?.clone();
    let info = view.elf(&main.path)?;
    let bias = info.bias(main.first_start, main.first_offset)?;
    if bias == 0 {
        return None;
    }
    let sym = info.containing(addr as u64)?;
    let runtime = bias.checked_add(addr)?;
    let offset = addr as u64 - sym.value;
    let function = if offset == 0 { sym.name.clone() } else { format!("{}+{offset:#x}", sym.name) };
    Some((function, runtime))
}
