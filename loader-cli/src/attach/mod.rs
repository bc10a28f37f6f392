//! `uprobe-run --pid PID`: attaching to a running process, and detaching from it.
//!
//! 1. `target` checks the process (exists, may be traced, a dynamic x86-64 glibc program,
//!    not traced already, no session on);
//! 2. `stop` holds every thread; a thread at a safe place is kept (one blocked in a system
//!    call other than futex or the allocator's, else a futex wait, else one running the
//!    program's own code; never one in the dynamic loader, or in the C library outside a
//!    system call: it may hold their locks), the others run on;
//! 3. `inject` makes that thread call `dlopen` on the runtime (unless it is there already)
//!    and then the runtime's `uprobe_attach_start`, and gives it back its registers;
//! 4. the runtime's agent connects, and `session` runs the session: it stops the threads
//!    whenever the agent writes a batch, relays the handlers' output, and on Ctrl-C, SIGTERM,
//!    the end of `--duration` or the process's exit, ends it.

mod copies;
mod error;
mod inject;
mod net;
mod ptrace;
mod session;
mod stop;
mod symbols;
mod target;
// Each side sends one half of the messages and decodes the other.
#[allow(dead_code)]
#[path = "../../../runtime/src/attach/wire.rs"]
mod wire;

pub use error::AttachError;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inject::{Arg, Hijacked};
use stop::{Held, StopError};
use target::{Mapping, Target};

/// What the command line asks of an attach.
#[derive(Debug)]
pub struct Request {
    pub pid: i32,
    /// The runtime to load, absolute.
    pub runtime: PathBuf,
    /// Absolute paths.
    pub handlers: Vec<PathBuf>,
    pub params: Vec<String>,
    pub output: Option<PathBuf>,
    /// Runtime options (`no-optimize`, `verbose`, `stats`, `full-vector-state`).
    pub options: Vec<String>,
    pub duration: Option<Duration>,
    pub verbose: bool,
}

/// Rounds of stopping the threads in search of one at a safe place.
const PICK_ROUNDS: usize = 50;

/// How long the agent may take to connect once started.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Attaches as `request` says and runs the session; returns uprobe-run's exit status.
pub fn run(request: Request) -> Result<i32, AttachError> {
    let started = Instant::now();
    // First: a Ctrl-C from now on ends the session properly instead of killing uprobe-run
    // half-way through.
    let signals = net::signalfd(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]).map_err(AttachError::Socket)?;
    let target = Target::open(request.pid)?;
    if request.handlers.is_empty() {
        return Err(AttachError::NothingToDo { pid: target.pid });
    }
    // Libraries the process has already (its own run's) are loaded from copies.
    let mut request = request;
    let (handlers, _copies) = copies::for_session(target.pid, &target.maps()?, &request.handlers)?;
    request.handlers = handlers;
    let name = wire::socket_name(std::process::id(), target.pid);
    let listener = net::listen(&name).map_err(AttachError::Socket)?;
    let out = session::Output::open(request.output.as_deref())?;
    let mut pause = session::Pause::default();
    start_agent(&target, &request.runtime, &name, &mut pause)?;
    let ready =
        net::poll(&[std::os::fd::AsRawFd::as_raw_fd(&listener)], Some(CONNECT_TIMEOUT)).map_err(AttachError::Socket)?;
    if !ready[0] {
        return Err(target
            .changed()
            .unwrap_or(AttachError::NoAgent { pid: target.pid, secs: CONNECT_TIMEOUT.as_secs() }));
    }
    let (control, peer) = net::accept(&listener).map_err(AttachError::Socket)?;
    if peer != target.pid {
        return Err(AttachError::Protocol { pid: target.pid, what: format!("process {peer} connected instead") });
    }
    drop(listener);
    session::Session { target, control, out, signals, request, started, pause }.run().map(session::output_checked)
}

/// System calls the C library's allocator makes while it holds an arena lock: a thread
/// blocked in one must not run `dlopen` (it would wait for its own lock).
const ALLOCATOR_CALLS: [i64; 6] =
    [libc::SYS_mmap, libc::SYS_mprotect, libc::SYS_munmap, libc::SYS_brk, libc::SYS_mremap, libc::SYS_madvise];

/// How fit a held thread is to run the loader: lower is better, None not at all. `loader` is
/// the dynamic loader's code (a thread there holds its lock), `libc` the C library's.
fn fitness(h: &Held, loader: &[&Mapping], libc: &[&Mapping]) -> Option<u8> {
    let rip = h.regs.rip;
    let inside = |code: &[&Mapping]| code.iter().any(|m| m.start <= rip && rip < m.end);
    if inside(loader) {
        return None;
    }
    if h.in_syscall() {
        let call = h.regs.orig_rax as i64;
        return match call {
            _ if ALLOCATOR_CALLS.contains(&call) => None,
            // A futex wait may be a lock holder waiting for a second lock.
            _ if call == libc::SYS_futex => Some(2),
            _ => Some(1),
        };
    }
    if inside(libc) {
        return None;
    }
    Some(3)
}

/// Holds one thread of `target` at a safe place, the others running; counts the pause.
fn pick_thread(target: &Target, pause: &mut session::Pause) -> Result<Hijacked, AttachError> {
    let maps = target.maps()?;
    let code_of = |prefixes: &[&str]| -> Vec<&Mapping> {
        let named = |m: &&Mapping| prefixes.iter().any(|p| m.path.rsplit('/').next().unwrap_or("").starts_with(p));
        maps.iter().filter(|m| m.perms.contains('x')).filter(named).collect()
    };
    let loader = code_of(&["ld-linux"]);
    let libc = code_of(&["libc.so", "libpthread"]);
    for _ in 0..PICK_ROUNDS {
        let stopped = stop::stop_all(target, None, true).map_err(|e| match e {
            StopError::Gone(e) | StopError::Failed(e) => e,
        })?;
        let best = stopped.threads.iter().filter_map(|h| Some((fitness(h, &loader, &libc)?, h.tid))).min();
        match best {
            Some((_, tid)) => {
                let (kept, held) = stopped.keep_only(tid);
                pause.add(held);
                let kept = kept.expect("the chosen thread is held");
                return Ok(Hijacked { pid: target.pid, tid, saved: kept.regs, signal: kept.signal });
            }
            None => {
                pause.add(stopped.resume());
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    Err(AttachError::NoSafeThread { pid: target.pid })
}

/// The run-time address of function `name` of the file mapped at `first`.
fn function_in(target: &Target, first: &Mapping, name: &'static str) -> Result<Option<u64>, AttachError> {
    let file = target.file(&first.path);
    Ok(symbols::lookup(&file, name)?.map(|(value, base)| symbols::runtime_address(first, value, base)))
}

/// Loads the runtime into `target` if it is not there, and starts its agent, which connects
/// to the socket `name`.
fn start_agent(target: &Target, runtime: &Path, name: &str, pause: &mut session::Pause) -> Result<(), AttachError> {
    let pid = target.pid;
    let maps = target.maps()?;
    let libc = target
        .libc(&maps)
        .cloned()
        .ok_or_else(|| target.changed().unwrap_or(AttachError::ExitedDuringAttach { pid }))?;
    let old_glibc = |symbol| AttachError::OldGlibc { pid, libc: PathBuf::from(&libc.path), symbol };
    let dlopen = function_in(target, &libc, "dlopen")?.ok_or_else(|| old_glibc("dlopen"))?;
    let dlerror = function_in(target, &libc, "dlerror")?.ok_or_else(|| old_glibc("dlerror"))?;
    let dlclose = function_in(target, &libc, "dlclose")?.ok_or_else(|| old_glibc("dlclose"))?;
    let loaded = target.mapped(&maps, "libuprobe.so").cloned();
    // The runtime loaded already (a program started by uprobe-run) is used as it is; its entry
    // point comes from its own file.
    let entry_file = loaded.as_ref().map_or_else(|| runtime.to_path_buf(), |m| target.file(&m.path));
    let no_entry = || AttachError::NoEntry { path: entry_file.clone(), symbol: "uprobe_attach_start" };
    let (entry_value, entry_base) = symbols::lookup(&entry_file, "uprobe_attach_start")?.ok_or_else(no_entry)?;
    let inode = std::fs::metadata(runtime)
        .map(|m| m.ino())
        .map_err(|source| AttachError::Read { path: runtime.into(), source })?;

    let thread = pick_thread(target, pause)?;
    let result = (|| {
        let (first, handle) = match loaded {
            Some(first) => (first, None),
            None => {
                let path = runtime.as_os_str().as_encoded_bytes();
                let handle = thread.call(
                    "dlopen",
                    dlopen,
                    &[Arg::Str(path), Arg::Int((libc::RTLD_NOW | libc::RTLD_GLOBAL) as u64)],
                )?;
                if handle == 0 {
                    let message = thread.call("dlerror", dlerror, &[])?;
                    let reason = if message == 0 { "dlopen failed".into() } else { thread.read_string(message) };
                    return Err(AttachError::LoadFailed { pid, runtime: runtime.into(), reason });
                }
                let maps = target.maps()?;
                let first = maps.iter().find(|m| m.inode == inode && m.offset == 0).cloned();
                let first = first.ok_or_else(|| AttachError::LoadFailed {
                    pid,
                    runtime: runtime.into(),
                    reason: "loaded, but not found in /proc/PID/maps".into(),
                })?;
                (first, Some(handle))
            }
        };
        let entry = symbols::runtime_address(&first, entry_value, entry_base);
        let rc = thread.call("uprobe_attach_start", entry, &[Arg::Str(name.as_bytes())])? as i64 as i32;
        if rc < 0 {
            // Nothing of the runtime was set up when it could not connect: take it out again.
            if let (Some(handle), true) = (handle, rc != -libc::EBUSY && rc != -libc::EPERM) {
                thread.call("dlclose", dlclose, &[Arg::Int(handle)])?;
            }
        }
        Ok(rc)
    })();
    match result {
        Ok(rc) => {
            thread.release()?;
            match -rc {
                0 => Ok(()),
                libc::EBUSY => Err(AttachError::AlreadyAttached { pid, agent: "starting".into() }),
                libc::EPERM => {
                    Err(AttachError::RuntimeOff { pid, reason: "it could not install its SIGTRAP handler".into() })
                }
                errno => Err(AttachError::StartFailed { pid, source: std::io::Error::from_raw_os_error(errno) }),
            }
        }
        // The thread is gone, or running a call it did not finish: nothing to give back.
        Err(
            e @ (AttachError::ExitedDuringAttach { .. }
            | AttachError::ExecdDuringAttach { .. }
            | AttachError::CallKilled { .. }
            | AttachError::CallTimeout { .. }),
        ) => Err(e),
        Err(e) => {
            thread.release()?;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(rip: u64, call: Option<i64>) -> Held {
        let mut regs = ptrace::zeroed_regs();
        regs.rip = rip;
        regs.orig_rax = call.map_or(u64::MAX, |c| c as u64);
        regs.rax = if call.is_some() { (-512i64) as u64 } else { 0 };
        Held { tid: 1, regs, signal: 0 }
    }

    fn code(start: u64, path: &str) -> Mapping {
        Mapping { start, end: start + 0x1000, perms: "r-xp".into(), offset: 0, inode: 1, path: path.into() }
    }

    #[test]
    fn threads_are_kept_where_they_hold_no_lock_of_the_loader_or_malloc() {
        let (ld, libc) = (code(0x1000, "/lib64/ld-linux-x86-64.so.2"), code(0x8000, "/lib/libc.so.6"));
        let fit = |h: Held| fitness(&h, &[&ld], &[&libc]);
        assert_eq!(fit(held(0x8010, Some(libc::SYS_read))), Some(1));
        assert_eq!(fit(held(0x8010, Some(libc::SYS_futex))), Some(2));
        assert_eq!(fit(held(0x8010, Some(libc::SYS_mmap))), None);
        assert_eq!(fit(held(0x1010, Some(libc::SYS_read))), None);
        assert_eq!(fit(held(0x40_0000, None)), Some(3));
        assert_eq!(fit(held(0x8010, None)), None);
        assert_eq!(fit(held(0x1010, None)), None);
    }
}
