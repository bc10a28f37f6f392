//! Start-up: runs from `.init_array`, before the program's own constructors and `main`; or,
//! for a runtime loaded into a running process, when the first attach session starts.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::aggregate;
use crate::api::{ending, exports, handlers};
use crate::base::lock::Mutex;
use crate::base::spec::{self, Spec};
use crate::base::{disable, output, stats, sys};
use crate::hazard::{dl, endings, environ, exec, fds, fork, signals, sigtrap, spawn};
use crate::insn::{patch, vector};
use crate::probe::{deferred, dispatch, extent, place, rcu, registry, thread};
use crate::trace;
use crate::trace::drain::Format;
use crate::trace::setup::{self, Settings};

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
    environ::remove(spec::ENV_SPEC);
    if let Some(preload) = environ::get("LD_PRELOAD") {
        match spec::preload_without(&preload, &own_path()) {
            rest if rest.is_empty() => environ::remove("LD_PRELOAD"),
            rest => {
                environ::replace("LD_PRELOAD", &rest);
            }
        }
    }
}

/// Leaves the runtime in the environment for the programs this one execs (`--follow-exec`),
/// marking the specification so that they know they were exec'd.
fn pass_on_environment(spec: &Spec) {
    if !spec.options.followed_exec {
        let mut passed = spec.clone();
        passed.options.followed_exec = true;
        // The metrics feed's descriptor is this program's alone (close-on-exec): a later
        // program would find another file, or nothing, at that number.
        passed.aggregate.feed = None;
        match spec::encode(&passed) {
            Ok(text) => drop(environ::replace(spec::ENV_SPEC, &text)),
            Err(e) => fail(&format!("cannot pass {} on: {e}", spec::ENV_SPEC)),
        }
    }
}

/// The program's path, for messages.
fn program_path() -> String {
    sys::readlink(c"/proc/self/exe").unwrap_or_else(|_| "this program".into())
}

extern "C" fn init() {
    // Preloaded by something other than uprobe-run: stay inert.
    let Some(text) = environ::get(spec::ENV_SPEC) else {
        return;
    };
    sys::init_errno();
    thread::init_static();
    let spec = spec::decode(&text).unwrap_or_else(|e| fail(&format!("bad {}: {e}", spec::ENV_SPEC)));
    if spec.options.follow_exec {
        pass_on_environment(&spec);
    } else {
        scrub_environment();
    }
    output::init(spec.output.as_deref()).unwrap_or_else(|e| fail(&e));
    fds::init();
    {
        let _once = SETUP.lock();
        setup(&spec, true).unwrap_or_else(|e| fail(&e));
        STARTED.store(AT_START, Ordering::SeqCst);
    }
    endings::init(ending::finish);
    exec::resolve_all();
    // SAFETY: at_exit is an extern "C" fn() that stays loaded until the process ends.
    unsafe { libc::atexit(endings::at_exit) };
    start(&spec);
}

/// How the runtime came to be set up in this process.
const NOT_YET: u8 = 0;
const AT_START: u8 = 1;
const BY_ATTACH: u8 = 2;
static STARTED: AtomicU8 = AtomicU8::new(NOT_YET);
/// Held while the runtime is set up (two attaches may race for it).
static SETUP: Mutex<()> = Mutex::new(());

/// Sets the runtime up for an attach session, if it is not yet (it was then loaded into the
/// running process, or preloaded inert); returns whether it was set up when the process
/// started (by `uprobe-run`), or why it cannot be.
pub fn for_attach() -> Result<bool, String> {
    let _once = SETUP.lock();
    match STARTED.load(Ordering::SeqCst) {
        AT_START => Ok(true),
        BY_ATTACH => Ok(false),
        _ => {
            // Loaded late, the runtime's thread-local storage is allocated on each thread's
            // first access, with malloc: the hit paths keep their state elsewhere (see
            // `probe::thread`), and the output has no per-thread line buffer. The output is
            // the session's, once it is known.
            thread::use_pool();
            output::set_unbuffered();
            output::set_socket(-1);
            sys::init_errno();
            setup(&Spec::default(), false)?;
            STARTED.store(BY_ATTACH, Ordering::SeqCst);
            Ok(false)
        }
    }
}

/// Everything the runtime needs before it can place a probe, with `spec`'s options.
/// `preloaded`: the runtime started with the program, and its interposers stand between the
/// program and libc; loaded later by attach, it takes over no more of the program's signals
/// than probes need (SIGTRAP, and the faults a handler may cause).
fn setup(spec: &Spec, preloaded: bool) -> Result<(), String> {
    exports::set_params(&spec.params);
    place::OPTIMIZE.store(!spec.options.no_optimize, Ordering::Relaxed);
    place::JUMP_ENTRY.store(dispatch::jump_common_entry(), Ordering::Relaxed);
    registry::VERBOSE.store(spec.options.verbose, Ordering::Relaxed);
    extent::RAW_ADDRESS.store(spec.options.raw_address, Ordering::Relaxed);
    stats::PRINT.store(spec.options.stats, Ordering::Relaxed);
    if spec.options.full_vector_state && !vector::save_full_state() {
        output::message(format_args!("--full-vector-state: this processor has no XSAVE; saving xmm0-15 only"));
    }
    patch::init();
    rcu::init_readers();
    fork::init(spec.options.no_follow_fork);
    signals::init(preloaded);
    dl::init();
    spawn::init();
    if let Err(errno) = sigtrap::install() {
        return Err(format!("cannot install the SIGTRAP handler: {}", std::io::Error::from_raw_os_error(errno)));
    }
    Ok(())
}

/// What a run started by `uprobe-run` asks for: `--list`, the event definitions, the handler
/// libraries.
fn start(spec: &Spec) {
    if !spec.handlers.is_empty() && registry::main_is_go() {
        output::message(format_args!(
            "{} is a Go program: return probes are not available in it (Go moves goroutine stacks and walks return addresses); entry probes work",
            program_path()
        ));
    }
    if let Some(pattern) = &spec.list {
        // `--list`: say what can be probed, and end before the program's constructors.
        let pattern = Some(pattern.as_str()).filter(|p| !p.is_empty());
        let found = deferred::inside(|| trace::list::list(pattern, 1));
        if found == 0 {
            let _ =
                sys::write_all(2, format!("uprobe-run: no function matches {}\n", pattern.unwrap_or("")).as_bytes());
        }
        sys::exit_now(if found == 0 { 1 } else { 0 });
    }
    let (settings, _) = settings(spec);
    let started = match spec.aggregate.any() {
        true => aggregate::setup::start(&settings, &spec.aggregate, spec.format),
        false => setup::start(&settings),
    };
    if let Err(line) = started {
        setup::refuse_line(&line, &settings);
    }
    for path in &spec.handlers {
        if let Err(line) = handlers::load(path) {
            // Fail open: the runtime said once that it is off, the program runs unprobed.
            if disable::reason() == Some(disable::Reason::WriteXorExecute) {
                continue;
            }
            // A program reached by a followed exec is not the one the user pointed
            // uprobe-run at: what does not apply to it is reported, not fatal.
            if spec.options.followed_exec {
                output::message(format_args!("{line}; {} (exec'd) runs without it", program_path()));
                continue;
            }
            output::flush();
            fail(&line);
        }
    }
}

/// What `spec` asks of events (the stream or the aggregations), and their format; the
/// runtime's own lines set to keep that format readable.
pub fn settings(spec: &Spec) -> (Settings, Format) {
    // Folded reports come with no stream of their own: events are text.
    let format = match spec.format.unwrap_or_default() {
        Format::Folded => Format::Text,
        format => format,
    };
    // The runtime's own lines keep a machine-readable output readable.
    match format {
        Format::Json => output::set_messages(output::Messages::Json),
        Format::Chrome => output::set_messages(output::Messages::Stderr),
        // Folded lines go to flame graph tools as they are: the runtime's lines go aside.
        Format::Text if spec.format == Some(Format::Folded) => output::set_messages(output::Messages::Stderr),
        Format::Text | Format::Folded => {}
    }
    let settings = Settings {
        events: spec.events.clone(),
        files: spec.event_files.clone(),
        filters: spec.filters.clone(),
        max_events: spec.max_events,
        triggers: spec.triggers.clone(),
        format,
        buffer_size: spec.buffer_size.unwrap_or(setup::DEFAULT_BUFFER),
        lenient: spec.options.lenient,
        call_graph: spec.options.call_graph,
        followed_exec: spec.options.followed_exec,
    };
    (settings, format)
}
