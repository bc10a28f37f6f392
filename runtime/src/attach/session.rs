//! An attach session's handler libraries: loaded, their `uprobe_init` run in one placement
//! batch each, and, at the end, their `uprobe_exit` run and every probe they own removed in
//! one batch, then the libraries unloaded where that is safe.
//!
//! A probe belongs to a library when its handler (or its probe object) lies in the library's
//! code or data: that covers what `uprobe_init` registered and what its handlers registered
//! later, and is exactly what must go before the library may be unloaded. Probes of the
//! process itself (a program started by `uprobe-run`) or of other sessions stay.
//!
//! Normal context, on the agent thread (the other threads run, or are held for a batch).

use core::ffi::c_int;
use core::sync::atomic::Ordering;

use libloading::os::unix::{Library, Symbol, RTLD_NOW};

use crate::base::spec::{Options, Spec};
use crate::base::{maps, output, route, sys};
use crate::hazard::guard::{self, Escape};
use crate::hazard::late;
use crate::probe::table::{self, Consumer};
use crate::probe::{deferred, lifecycle, owners, place, registry};

type InitFn = unsafe extern "C" fn() -> c_int;
type ExitFn = unsafe extern "C" fn();

/// How long detach waits for handlers' queued registration requests before it leaves their
/// libraries loaded instead.
const SETTLE_NS: u64 = 1_000_000_000;
/// How long a library's `uprobe_init` may run in a session.
pub const INIT_TIMEOUT_NS: u64 = 10_000_000_000;

struct Loaded {
    path: String,
    library: Library,
    /// `uprobe_exit`, while it is still to run (not for a library whose init failed).
    exit: Option<ExitFn>,
    /// Every address the library's mappings cover.
    lo: usize,
    hi: usize,
    /// Its inode, to tell whether it is still mapped after `dlclose`.
    inode: u64,
}

/// What a session runs besides its handler libraries: its definitions streamed or
/// aggregated, or a listing. The layer above sets it (`api::attached`): the session
/// delivers the spec a launch delivers, and those front-ends run it unchanged.
pub trait Events: Sync {
    /// Starts what `spec` asks; the line to refuse the session with.
    fn start(&self, spec: &Spec, out: i32) -> Result<Started, String>;
    /// The probes of the events started.
    fn probes(&self) -> Vec<Consumer>;
    /// Once their probes are gone: the rest of the stream and the reports, to the session.
    fn finish(&self);
}

/// What [`Events::start`] started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Started {
    Events,
    /// A listing was written: how many functions it has.
    Listed(usize),
}

/// The session's front-ends, set once by the layer above before any session.
pub static EVENTS: std::sync::OnceLock<&'static dyn Events> = std::sync::OnceLock::new();

/// Why a session did not start.
pub enum LoadError {
    /// What was asked cannot be done in this process (nothing of it stays).
    Refused(String),
    /// A handler library failed to load, or its `uprobe_init` failed.
    Failed(String),
}

/// Whether `spec` asks for more than handler libraries.
pub fn wants_events(spec: &Spec) -> bool {
    !spec.events.is_empty() || !spec.event_files.is_empty() || spec.aggregate.any() || spec.list.is_some()
}

pub struct Session {
    pub spec: Spec,
    /// The session's output (a socket to `uprobe-run`).
    pub out: i32,
    libraries: Vec<Loaded>,
    /// What [`Events::start`] started, while it runs.
    pub started: Option<Started>,
}

/// The address range of every mapping of the file with inode `inode`.
fn range_of(inode: u64) -> (usize, usize) {
    if inode == 0 {
        return (0, 0);
    }
    let text = sys::read_file(c"/proc/self/maps").map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let mappings: Vec<maps::Mapping> = maps::parse(&text).into_iter().filter(|m| m.inode == inode).collect();
    let lo = mappings.iter().map(|m| m.start).min().unwrap_or(0);
    let hi = mappings.iter().map(|m| m.end).max().unwrap_or(0);
    (lo as usize, hi as usize)
}

/// The inode of `path` (0 if it cannot be read: its mappings are then not found either).
fn inode_of(path: &str) -> u64 {
    std::fs::metadata(path).map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m))
}

/// Runs `f` with a session's `--no-optimize` and `--verbose` in force.
fn with_options<R>(options: Options, f: impl FnOnce() -> R) -> R {
    let optimize = place::OPTIMIZE.swap(!options.no_optimize, Ordering::Relaxed);
    let verbose = registry::VERBOSE.swap(options.verbose, Ordering::Relaxed);
    let result = f();
    place::OPTIMIZE.store(optimize, Ordering::Relaxed);
    registry::VERBOSE.store(verbose, Ordering::Relaxed);
    result
}

impl Session {
    pub fn new(spec: Spec, out: i32) -> Session {
        Session { spec, out, libraries: Vec::new(), started: None }
    }

    /// Starts the session's events, as a launch does before its libraries, then loads the
    /// libraries in order and runs their `uprobe_init`. The error is the line to show; what
    /// started is then all taken out again (see [`Session::end`]). `preloaded`: the process
    /// runs a launch's runtime, whose output and events are its own.
    pub fn load(&mut self, preloaded: bool) -> Result<(), LoadError> {
        if wants_events(&self.spec) {
            if preloaded {
                return Err(LoadError::Refused(
                    "-e, --events, --count, --hist, --lhist, --latency and --list attach only to a process uprobe-run \
                     did not start (this one's runtime streams to its own output)"
                        .into(),
                ));
            }
            let events = *EVENTS.get().ok_or_else(|| LoadError::Refused("no event front-end".into()))?;
            let (spec, out) = (self.spec.clone(), self.out);
            // Marked started first: a refusal after some probes were placed takes them out.
            self.started = Some(Started::Events);
            let started = with_options(self.spec.options, || events.start(&spec, out)).map_err(LoadError::Refused)?;
            self.started = Some(started);
        }
        let paths = self.spec.handlers.clone();
        with_options(self.spec.options, || paths.iter().try_for_each(|path| self.load_one(path)))
            .map_err(LoadError::Failed)
    }

    fn load_one(&mut self, path: &str) -> Result<(), String> {
        // SAFETY: loading a library runs its constructors; that is what the user asked for.
        let library =
            unsafe { Library::open(Some(path), RTLD_NOW | libc::RTLD_LOCAL) }.map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: the symbols, where present, have the signatures of include/uprobe.h.
        let (init, exit) = unsafe {
            let init: Option<Symbol<InitFn>> = library.get(b"uprobe_init\0").ok();
            let exit: Option<Symbol<ExitFn>> = library.get(b"uprobe_exit\0").ok();
            (init.map(|s| *s), exit.map(|s| *s))
        };
        let inode = inode_of(path);
        let (lo, hi) = range_of(inode);
        if route::add_code(lo, hi, self.out).is_err() {
            output::message(format_args!(
                "{path}: too many handler libraries at once: its output goes to the process's"
            ));
        }
        self.libraries.push(Loaded { path: path.into(), library, exit: None, lo, hi, inode });
        if let Some(init) = init {
            // Everything it registers is placed in one batch when it returns.
            // SAFETY: the library's documented entry point.
            let what: &'static str = Box::leak(format!("{path}: uprobe_init()").into_boxed_str());
            // Guarded: a fault, an abort or a hang there ends the session, not the process.
            let rc = deferred::batch(|| deferred::entry_point(what, || guard::run(init, INIT_TIMEOUT_NS)));
            match rc {
                Ok(0) => {}
                Ok(rc) => return Err(format!("{path}: uprobe_init() failed, returned {rc}")),
                Err(Escape::Signal { sig, addr }) => {
                    let name = match sig {
                        libc::SIGSEGV => "SIGSEGV",
                        libc::SIGBUS => "SIGBUS",
                        libc::SIGILL => "SIGILL",
                        libc::SIGFPE => "SIGFPE",
                        _ => "SIGABRT (abort)",
                    };
                    let at = if sig == libc::SIGABRT { String::new() } else { format!(" at {addr:#x}") };
                    return Err(format!(
                        "{path}: uprobe_init() faulted: {name}{at}; the session ends, its probes removed, the process runs on"
                    ));
                }
                Err(Escape::Timeout) => {
                    return Err(format!(
                        "{path}: uprobe_init() did not return within {} s; the session ends, its probes removed, the process runs on",
                        INIT_TIMEOUT_NS / 1_000_000_000
                    ));
                }
            }
        }
        if let Some(last) = self.libraries.last_mut() {
            last.exit = exit;
        }
        Ok(())
    }

    /// The registered probes that belong to the session's libraries.
    pub fn owned(&self) -> Vec<Consumer> {
        let mine = |addr: usize| self.libraries.iter().any(|l| l.lo <= addr && addr < l.hi);
        let mut owned: Vec<Consumer> =
            registry::consumers().into_iter().filter(|c| mine(c.key()) || mine(c.handler_address())).collect();
        if let (Some(Started::Events), Some(events)) = (self.started, EVENTS.get()) {
            owned.extend(events.probes());
        }
        owned
    }

    /// How many of the session's probes are placed, and how many of those are jumps.
    pub fn placed(&self) -> (usize, usize) {
        let owned = self.owned();
        let jumps = owned
            .iter()
            .filter(|c| {
                // SAFETY: registered probe objects are valid (C ABI).
                let addr = unsafe { (*c.placement()).vaddr } as usize;
                table::lookup(addr).is_some_and(|pp| pp.jump_active.load(Ordering::SeqCst))
            })
            .count();
        (owned.len(), jumps)
    }

    /// Runs the libraries' `uprobe_exit` (last loaded first) and removes every probe they own,
    /// with the session's internal probes, in one batch; returns how many probes were removed.
    pub fn exit(&mut self) -> usize {
        // Probes in libraries the program unloaded meanwhile have no code to restore (a runtime
        // loaded late does not see dlclose happen).
        lifecycle::drop_unmapped();
        let owned = self.owned();
        with_options(self.spec.options, || {
            deferred::batch(|| {
                for l in self.libraries.iter_mut().rev() {
                    if let Some(exit) = l.exit.take() {
                        let what: &'static str = Box::leak(format!("{}: uprobe_exit()", l.path).into_boxed_str());
                        // SAFETY: the library's documented exit point; it is still loaded.
                        deferred::entry_point(what, || unsafe { exit() });
                    }
                }
                registry::unregister_all(&self.owned());
                // The internal probes that followed the program for the session go in the
                // same batch (a runtime loaded by attach: `hazard::late`).
                late::stop();
            })
        });
        // Unregistered, and a grace period passed: their fault messages are not needed, and
        // the events' last records and reports can be written.
        for c in &owned {
            owners::forget(c.key());
        }
        if let (Some(Started::Events), Some(events)) = (self.started.take(), EVENTS.get()) {
            events.finish();
        }
        owned.len()
    }

    /// Ends the session: [`Session::exit`], then unloads the libraries where that is safe.
    /// Returns how many probes were removed, and what the user should know.
    pub fn end(&mut self) -> (usize, Vec<String>) {
        let removed = self.exit();
        output::flush();
        // Handlers may still be about to call a library back (registration callbacks).
        let settled = deferred::settle(SETTLE_NS);
        let mut notes = Vec::new();
        for l in self.libraries.drain(..).rev() {
            route::remove_code(l.lo, l.hi);
            if !settled {
                notes.push(format!("{} stays loaded, inert: requests its handlers queued were still pending", l.path));
                core::mem::forget(l.library);
                continue;
            }
            let _ = l.library.close();
            if range_of(l.inode) != (0, 0) {
                notes.push(format!(
                    "{} stays loaded, inert: the dynamic loader keeps it (RTLD_NODELETE, unique symbols or thread-local destructors)",
                    l.path
                ));
            }
        }
        (removed, notes)
    }
}
