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

pub struct Session {
    pub spec: Spec,
    /// The session's output (a socket to `uprobe-run`).
    pub out: i32,
    libraries: Vec<Loaded>,
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
        Session { spec, out, libraries: Vec::new() }
    }

    /// Loads the session's libraries in order and runs their `uprobe_init`. The error is the
    /// line to show; the libraries are then all taken out again (see [`Session::end`]).
    pub fn load(&mut self) -> Result<(), String> {
        let paths = self.spec.handlers.clone();
        with_options(self.spec.options, || paths.iter().try_for_each(|path| self.load_one(path)))
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
        registry::consumers().into_iter().filter(|c| mine(c.key()) || mine(c.handler_address())).collect()
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
    /// in one batch; returns how many probes were removed.
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
            })
        });
        // Unregistered, and a grace period passed: their fault messages are not needed.
        for c in &owned {
            owners::forget(c.key());
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
