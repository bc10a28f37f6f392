//! Start-up: runs from `.init_array`, before the program's own constructors and `main`.

use crate::spec::{self, Spec};
use std::sync::atomic::Ordering;

use crate::{api, handlers, output, patch, registry, sys, trap};

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// Exit status of a run stopped before `main` by the runtime.
const EXIT_SETUP_FAILED: i32 = 127;

fn fail(line: &str) -> ! {
    let _ = sys::write_all(2, format!("uprobe-run: {line}\n").as_bytes());
    sys::exit_now(EXIT_SETUP_FAILED)
}

/// This library's own path, as the dynamic loader knows it.
fn own_path() -> String {
    // SAFETY: dladdr fills `info` for an address inside a loaded object; dli_fname is a C
    // string owned by the loader.
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        if libc::dladdr(init as *const libc::c_void, &mut info) != 0 && !info.dli_fname.is_null() {
            return core::ffi::CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned();
        }
    }
    "libuprobe.so".into()
}

/// Takes the runtime out of the environment the program (and what it execs) sees.
fn scrub_environment() {
    std::env::remove_var(spec::ENV_SPEC);
    if let Ok(preload) = std::env::var("LD_PRELOAD") {
        match spec::preload_without(&preload, &own_path()) {
            rest if rest.is_empty() => std::env::remove_var("LD_PRELOAD"),
            rest => std::env::set_var("LD_PRELOAD", rest),
        }
    }
}

extern "C" fn init() {
    // Preloaded by something other than uprobe-run: stay inert.
    let Ok(text) = std::env::var(spec::ENV_SPEC) else {
        return;
    };
    scrub_environment();
    let spec = Spec::parse(&text).unwrap_or_else(|e| fail(&format!("bad {}: {e}", spec::ENV_SPEC)));
    output::init(spec.output.as_deref()).unwrap_or_else(|e| fail(&e));
    api::set_params(&spec.params);
    registry::OPTIMIZE.store(!spec.has_option("no-optimize"), Ordering::Relaxed);
    registry::VERBOSE.store(spec.has_option("verbose"), Ordering::Relaxed);
    patch::init();
    registry::init_readers();
    if let Err(errno) = trap::install() {
        fail(&format!("cannot install the SIGTRAP handler: {}", std::io::Error::from_raw_os_error(errno)));
    }
    // SAFETY: run_exits is an extern "C" fn() that stays loaded until the process ends.
    unsafe { libc::atexit(handlers::run_exits) };
    for path in &spec.handlers {
        if let Err(line) = handlers::load(path) {
            output::flush();
            fail(&line);
        }
    }
}
