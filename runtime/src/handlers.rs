//! Handler libraries: loaded in command-line order, `uprobe_init` called after each load,
//! `uprobe_exit` at process exit in reverse order. Libraries stay loaded for the life of the
//! process, since their handlers may run until the very end.

use core::ffi::c_int;
use std::sync::Mutex;

use libloading::os::unix::{Library, Symbol, RTLD_NOW};

use crate::output;

type ExitFn = unsafe extern "C" fn();

static EXITS: Mutex<Vec<ExitFn>> = Mutex::new(Vec::new());

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
    // The library is never unloaded: its handlers and exit function stay callable.
    std::mem::forget(lib);
    if let Some(exit) = exit {
        EXITS.lock().unwrap_or_else(|e| e.into_inner()).push(exit);
    }
    if let Some(init) = init {
        // SAFETY: the library's documented entry point.
        let rc = unsafe { init() };
        if rc != 0 {
            return Err(format!("{path}: uprobe_init() failed, returned {rc}"));
        }
    }
    Ok(())
}

/// Calls every library's `uprobe_exit`, last loaded first (registered with atexit).
pub extern "C" fn run_exits() {
    let exits = std::mem::take(&mut *EXITS.lock().unwrap_or_else(|e| e.into_inner()));
    for exit in exits.iter().rev() {
        // SAFETY: the library's documented exit point; the library is still loaded.
        unsafe { exit() };
    }
    output::flush();
    crate::registry::report_missed();
}
