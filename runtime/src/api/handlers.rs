//! Handler libraries: loaded in command-line order, `uprobe_init` called after each load,
//! `uprobe_exit` at process exit in reverse order. Libraries stay loaded for the life of the
//! process, since their handlers may run until the very end.

use crate::base::lock::Mutex;
use core::ffi::c_int;

use libloading::os::unix::{Library, Symbol, RTLD_NOW};

use crate::base::{output, stats};
use crate::probe::{deferred, report};
use crate::{aggregate, trace};

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
        EXITS.lock().push(exit);
    }
    if let Some(init) = init {
        // Everything it registers is placed in one batch when it returns.
        // SAFETY: the library's documented entry point.
        let rc = deferred::batch(|| deferred::entry_point(|| unsafe { init() }));
        if rc != 0 {
            return Err(format!("{path}: uprobe_init() failed, returned {rc}"));
        }
    }
    Ok(())
}

/// Calls every library's `uprobe_exit`, last loaded first (registered with atexit).
pub extern "C" fn run_exits() {
    report::report_changed_sites();
    let exits = std::mem::take(&mut *EXITS.lock());
    for exit in exits.iter().rev() {
        // SAFETY: the library's documented exit point; the library is still loaded.
        deferred::entry_point(|| unsafe { exit() });
    }
    output::flush();
    // The event stream ends here, whatever ends the process through this path.
    trace::drain::finish();
    // So do the aggregation reports.
    aggregate::report::finish();
    report::report_missed();
    if stats::PRINT.load(core::sync::atomic::Ordering::Relaxed) {
        report::report_returns();
        output::message(format_args!("{}", stats::summary()));
    }
}
