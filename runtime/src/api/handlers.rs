//! Handler libraries: loaded in command-line order, `uprobe_init` called after each load,
//! `uprobe_exit` at the end of the run in reverse order (see `ending`). Libraries stay
//! loaded for the life of the process, since their handlers may run until the very end.

use crate::base::lock::Mutex;
use core::ffi::c_int;

use libloading::os::unix::{Library, Symbol, RTLD_NOW};

use crate::probe::deferred;

type ExitFn = unsafe extern "C" fn();

/// Each library's `uprobe_exit`, and its description for a fault there.
static EXITS: Mutex<Vec<(ExitFn, &'static str)>> = Mutex::new(Vec::new());

/// Loads `path` and runs its `uprobe_init`; the error is the line to show the user.
pub fn load(path: &str) -> Result<(), String> {
    // SAFETY: loading a library runs its constructors; that is what the user asked for.
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | libc::RTLD_LOCAL) }.map_err(|e| format!("{path}: {e}"))?;
    // SAFETY: the symbols, where present, have the signatures of include/uprobe.h.
    let (init, exit) = unsafe {
        let init: Option<Symbol<unsafe extern "C" fn() -> c_int>> = lib.get(b"uprobe_init\0").ok();
        let exit: Option<Symbol<ExitFn>> = lib.get(b"uprobe_exit\0").ok();
        (init.map(|s| *s), exit.map(|s| *s))
    };
    if init.is_none() && exit.is_none() {
        return Err(format!(
            "{path}: exports neither uprobe_init nor uprobe_exit, so it can neither place a probe nor report"
        ));
    }
    // The library is never unloaded: its handlers and exit function stay callable.
    std::mem::forget(lib);
    let describe = |function: &str| -> &'static str { Box::leak(format!("{path}: {function}()").into_boxed_str()) };
    if let Some(init) = init {
        let what = describe("uprobe_init");
        // Everything it registers is placed in one batch when it returns.
        // SAFETY: the library's documented entry point.
        let rc = deferred::batch(|| deferred::entry_point(what, || unsafe { init() }));
        if rc != 0 {
            return Err(format!("{path}: uprobe_init() failed, returned {rc}"));
        }
    }
    // Like a kernel module's exit, only a library whose init succeeded (or that has none)
    // gets its exit called.
    if let Some(exit) = exit {
        EXITS.lock().push((exit, describe("uprobe_exit")));
    }
    Ok(())
}

/// Calls every library's `uprobe_exit`, last loaded first, once. `in_signal`: from a fatal
/// signal's handler, where the list's lock may be held by the very thread that died: then
/// the exits are skipped rather than waited for.
pub fn call_exits(in_signal: bool) {
    let exits = if in_signal {
        match EXITS.try_lock() {
            Some(mut list) => std::mem::take(&mut *list),
            None => return,
        }
    } else {
        std::mem::take(&mut *EXITS.lock())
    };
    for (exit, what) in exits.iter().rev() {
        // SAFETY: the library's documented exit point; the library is still loaded.
        deferred::entry_point(what, || unsafe { exit() });
    }
}
