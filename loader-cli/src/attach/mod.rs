//! `uprobe-run --pid PID`: attaching to a running process, and detaching from it.
//!
//! 1. `target` checks the process (exists, may be traced, a dynamic x86-64 glibc program,
//!    not traced already, no session on);
//! 2. `stop` holds every thread; a thread at a safe place is kept (one blocked in a system
//!    call other than futex or the allocator's, else a futex wait, else one running the
//!    program's own code; never one in the dynamic loader, or in the C library outside a
//!    system call: it may hold their locks), the others run on;
//! 3. `inject` makes that thread call functions in the process, each returning through a
//!    signal frame that restores the thread by itself: `load` puts the runtime in (unless it
//!    is there already) through a sealed memory file, then the runtime's
//!    `uprobe_attach_begin` starts its agent with a socket pair, whose other end uprobe-run
//!    takes from the process: no name anyone could bind or connect to;
//! 4. `session` runs the session with the agent: it stops the threads
//!    whenever the agent writes a batch, relays the handlers' output, and on Ctrl-C, SIGTERM,
//!    the end of `--duration` or the process's exit, ends it.
//!
//! The files import in one direction, bottom first: `request`, `ptrace` and `net` (plain
//! data and system calls); `error`; `target`; `symbols` and `stop`; `inject`; `copies` and
//! `load`; `session`; this file, which turns the plan into a `Request` (the definitions and
//! aggregations as the run spec carries them, as a launch's) and serves `--serve`.

mod copies;
mod error;
mod files;
mod inject;
mod load;
mod net;
mod ptrace;
mod request;
mod session;
mod stop;
mod symbols;
mod target;

pub use error::AttachError;
pub use request::Request;

use std::borrow::Cow;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::base::error::Error;
use crate::base::{check, runtime, sys};
use crate::launch;
use crate::output::serve;
use crate::plan::{self, Output};
use inject::{Arg, Hijacked};
use stop::{Held, StopError};
use target::{Mapping, Target};

/// Rounds of stopping the threads in search of one at a safe place.
const PICK_ROUNDS: usize = 50;

/// Attaches as `plan` says, once the runtime and the handler libraries are checked, and runs
/// the session; returns uprobe-run's exit status.
pub fn run(plan: plan::Attach) -> Result<i32, Error> {
    let (runtime, runtime_bytes) = runtime::for_attach()?;
    let handlers = check::handlers(&plan.setup.handlers)?;
    let switches = plan.setup.switches;
    // The definitions, filters and aggregations as a launch passes them; an `--events` file
    // is read here (the process reads no file of uprobe-run's), its definitions numbered
    // after the `-e` ones as its filters are.
    let mut spec = launch::event_spec(&plan.events)?;
    spec.event_files.clear();
    for file in &plan.events.files {
        let text = std::fs::read(file).map_err(|source| Error::EventsFile { path: file.clone(), source })?;
        let text = String::from_utf8_lossy(&text);
        spec.events.extend(uprobe_contracts::def::file_lines(&text).map(|(_, def)| def.to_owned()));
    }
    spec.aggregate = plan.aggregation.clone();
    spec.list = plan.list.clone();
    // `--serve`: served here while the session runs; the feed's other end goes to the process.
    let serving = match &plan.serve {
        Some(serve) => {
            let (ours, theirs) = serve::socket_pair(&serve.addr)?;
            let endpoint = serve::bind(&serve.addr)?;
            let keys = serve.keys.unwrap_or(serve::metrics::DEFAULT_KEYS);
            Some((serve::attached(endpoint, ours, keys), theirs, serve.linger))
        }
        None => None,
    };
    let request = Request {
        pid: plan.pid,
        runtime,
        runtime_bytes,
        handlers,
        params: plan.setup.params.iter().map(|p| (p.name.clone(), p.value.clone())).collect(),
        output: plan.setup.output.map(|output| match output {
            Output::Stdout => PathBuf::from("-"),
            Output::File(path) => path,
        }),
        switches: switches.names(),
        duration: plan.duration,
        verbose: switches.verbose,
        chrome: matches!(plan.events.format, Some(plan::Format::Chrome | plan::Format::Folded)),
        spec,
        feed: serving.as_ref().map(|(_, theirs, _)| *theirs),
    };
    let status = attach(request);
    if let Some((serving, theirs, linger)) = serving {
        sys::close(theirs);
        serving.finish(if status.is_ok() { linger } else { Duration::ZERO });
    }
    Ok(status?)
}

impl From<AttachError> for Error {
    fn from(error: AttachError) -> Error {
        Error::Attach(Box::new(error))
    }
}

/// Attaches as `request` says and runs the session; returns uprobe-run's exit status.
fn attach(request: Request) -> Result<i32, AttachError> {
    let started = Instant::now();
    // First: a Ctrl-C from now on ends the session properly instead of killing uprobe-run
    // half-way through.
    let signals = net::signalfd(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]).map_err(AttachError::Socket)?;
    let target = Target::open(request.pid)?;
    let events = &request.spec;
    let more = !events.events.is_empty() || !events.aggregate.latency.is_empty() || events.list.is_some();
    if request.handlers.is_empty() && !more {
        return Err(AttachError::NothingToDo { pid: target.pid });
    }
    // Libraries the process has already (its own run's) are loaded from copies.
    let mut request = request;
    let (handlers, _copies) = copies::for_session(target.pid, &target.maps()?, &request.handlers)?;
    request.handlers = handlers;
    // A process that ended meanwhile has no root to look in: that is what to say.
    copies::check_reachable(target.pid, &request.handlers).map_err(|e| target.changed().unwrap_or(e))?;
    // A listing goes to standard output, as a launch's does.
    let listing = request.spec.list.is_some();
    let out = session::Output::open(if listing { Some(std::path::Path::new("-")) } else { request.output.as_deref() })?;
    // The files written at the end: made now, so that a path that cannot be is said first.
    let aggregate = &request.spec.aggregate;
    for path in [&aggregate.flamegraph, &aggregate.pprof].into_iter().flatten() {
        std::fs::File::create(path).map_err(|source| AttachError::Output { path: PathBuf::from(path), source })?;
    }
    let pidfd =
        net::pidfd(target.pid).map_err(|_| target.changed().unwrap_or(AttachError::NoSuchProcess(target.pid)))?;
    let mut pause = session::Pause::default();
    // Whatever failed, a process that exited or exec'd meanwhile is the cause to name.
    let control =
        start_agent(&target, &request, &signals, &pidfd, &mut pause).map_err(|e| target.changed().unwrap_or(e))?;
    let files = files::Files::default();
    session::Session { target, control, out, signals, request, started, pause, files }
        .run()
        .map(session::output_checked)
}

/// System calls the C library's allocator makes while it holds an arena lock: a thread
/// blocked in one must not run `dlopen` (it would wait for its own lock).
const ALLOCATOR_CALLS: [i64; 6] =
    [libc::SYS_mmap, libc::SYS_mprotect, libc::SYS_munmap, libc::SYS_brk, libc::SYS_mremap, libc::SYS_madvise];

/// How fit a held thread is to run the loader: lower is better, None not at all. `loader` is
/// the dynamic loader's code (a thread there holds its lock), `libc` the C library's.
fn fitness(h: &Held, loader: &[&Mapping], libc: &[&Mapping]) -> Option<u8> {
    let rip = h.regs.rip;
    // On its way to a signal: that delivery is the tracer's to make, and would be lost with it.
    if h.signal != 0 {
        return None;
    }
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

/// Holds one thread of `target` at a safe place, the others running, ready for calls;
/// counts the pause.
fn pick_thread(
    target: &Target,
    restorer: u64,
    signals: &OwnedFd,
    pause: &mut session::Pause,
) -> Result<Hijacked, AttachError> {
    let maps = target.maps()?;
    let code_of = |prefixes: &[&str]| -> Vec<&Mapping> {
        let named = |m: &&Mapping| prefixes.iter().any(|p| m.path.rsplit('/').next().unwrap_or("").starts_with(p));
        maps.iter().filter(|m| m.exec).filter(named).collect()
    };
    let loader = code_of(&["ld-linux"]);
    let libc = code_of(&["libc.so", "libpthread"]);
    for _ in 0..PICK_ROUNDS {
        if net::ready(signals.as_raw_fd()) {
            return Err(AttachError::Interrupted { pid: target.pid });
        }
        let stopped = stop::stop_all(target, None, true).map_err(|e| match e {
            StopError::Gone(e) | StopError::Failed(e) => e,
        })?;
        let best = stopped.threads.iter().filter_map(|h| Some((fitness(h, &loader, &libc)?, h.tid))).min();
        match best {
            Some((_, tid)) => {
                let (kept, held) = stopped.keep_only(tid);
                pause.add(held);
                let kept = kept.expect("the chosen thread is held");
                return Hijacked::new(target.pid, tid, kept.regs, restorer, signals);
            }
            None => {
                pause.add(stopped.resume());
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    Err(AttachError::NoSafeThread { pid: target.pid })
}

/// The bytes of the runtime the process has mapped at `first` (to find its entry point), as
/// uprobe-run can read them: the file itself; a memory file an attach loaded it from,
/// the runtime uprobe-run carries when what the process maps of it is that one, else through
/// `/proc/PID/map_files` (which needs privilege).
fn loaded_runtime<'a>(
    target: &Target,
    first: &Mapping,
    ours: &'a [u8],
) -> Result<(PathBuf, Cow<'a, [u8]>), AttachError> {
    if first.path != format!("{} (deleted)", target::MEMFD_PREFIX) {
        let file = target.file(first);
        let bytes = std::fs::read(&file)
            .map_err(|source| target.changed().unwrap_or(AttachError::Read { path: file.clone(), source }))?;
        return Ok((file, Cow::Owned(bytes)));
    }
    // The memory file holds only the loaded part of the runtime (`load::loadable_part`): its
    // symbols are read from the carried file when the first mapping is that file's.
    let len = (first.end - first.start) as usize;
    let mapped = ptrace::read_memory(target.pid, first.start, len).unwrap_or_default();
    if mapped.len() == len && ours.len() >= len && ours[..len] == mapped[..] {
        return Ok((PathBuf::from(&first.path), Cow::Borrowed(ours)));
    }
    let via = PathBuf::from(format!("/proc/{}/map_files/{:x}-{:x}", target.pid, first.start, first.end));
    if let Ok(bytes) = std::fs::read(&via) {
        return Ok((via, Cow::Owned(bytes)));
    }
    Err(AttachError::LoadFailed {
        pid: target.pid,
        runtime: PathBuf::from(&first.path),
        reason: "another build of the runtime is loaded there; attach with the uprobe-run that loaded it, or as root"
            .into(),
    })
}

/// Where `__restore_rt` (the signal return) is in the process's C library.
fn restorer(target: &Target, libc: &Mapping) -> Result<u64, AttachError> {
    let file = target.file(libc);
    let found = symbols::find_code(&file, &inject::RESTORER_BYTES).map_err(|e| target.changed().unwrap_or(e))?;
    let (value, base) = found.ok_or_else(|| AttachError::LoadFailed {
        pid: target.pid,
        runtime: PathBuf::from(&libc.path),
        reason: "no signal return (__restore_rt) found in it".into(),
    })?;
    Ok(symbols::runtime_address(libc, value, base))
}

/// Loads the runtime into `target` if it is not there, and starts its agent; the session's
/// channel (uprobe-run's end of the socket pair the runtime made, taken from the process).
fn start_agent(
    target: &Target,
    request: &Request,
    signals: &OwnedFd,
    pidfd: &OwnedFd,
    pause: &mut session::Pause,
) -> Result<OwnedFd, AttachError> {
    let pid = target.pid;
    let maps = target.maps()?;
    let libc = target
        .libc(&maps)
        .cloned()
        .ok_or_else(|| target.changed().unwrap_or(AttachError::ExitedDuringAttach { pid }))?;
    let restorer = restorer(target, &libc)?;
    let loaded = target.runtime(&maps).cloned();
    let mut thread = pick_thread(target, restorer, signals, pause)?;
    // A call's return would not match its shadow stack: the process would be killed.
    if target.shadow_stack(thread.tid) {
        return Err(AttachError::ShadowStack { pid, tid: thread.tid });
    }
    let first = match &loaded {
        Some(first) => first.clone(),
        None => load::runtime(target, &mut thread, &libc, pidfd, &request.runtime, &request.runtime_bytes)?,
    };
    // The runtime loaded already (a program started by uprobe-run, an earlier session) is
    // used as it is; its entry point comes from its own file.
    let (entry_file, entry_bytes) = match loaded {
        Some(_) => loaded_runtime(target, &first, &request.runtime_bytes)?,
        None => (request.runtime.clone(), Cow::Borrowed(&request.runtime_bytes[..])),
    };
    let no_entry = || AttachError::NoEntry { path: entry_file.clone(), symbol: ENTRY };
    let (value, base) = symbols::lookup_in(&entry_bytes, &entry_file, ENTRY)?.ok_or_else(no_entry)?;
    let entry = symbols::runtime_address(&first, value, base);
    // The last point to stop at without a trace: the runtime, if loaded, stays inert. Once
    // the agent runs, a Ctrl-C ends the session the proper way.
    if thread.interrupted() {
        return Err(AttachError::Interrupted { pid });
    }
    // The status, and the descriptor; a status the runtime never writes until it answers.
    let unanswered = i32::MIN;
    let result = [unanswered.to_ne_bytes(), (-1i32).to_ne_bytes()].concat();
    let answer = thread.call(ENTRY, entry, &[Arg::Buf(&result)])?.remove(0);
    thread.release();
    let word =
        |i: usize| answer.get(4 * i..4 * i + 4).map_or(unanswered, |b| i32::from_ne_bytes(b.try_into().unwrap()));
    let (status, fd) = (word(0), word(1));
    match -status {
        0 => net::take_fd(pidfd, fd).map_err(|e| target.changed().unwrap_or(AttachError::Socket(e))),
        libc::EBUSY => Err(AttachError::AlreadyAttached { pid, agent: "starting".into() }),
        libc::EPERM => Err(AttachError::RuntimeOff { pid, reason: "it could not install its SIGTRAP handler".into() }),
        _ if status == unanswered => Err(target
            .changed()
            .unwrap_or_else(|| AttachError::Protocol { pid, what: format!("{ENTRY} did not answer") })),
        errno => Err(AttachError::StartFailed { pid, source: std::io::Error::from_raw_os_error(errno) }),
    }
}

/// The runtime's entry point for an attach.
const ENTRY: &str = "uprobe_attach_begin";

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
        Mapping {
            start,
            end: start + 0x1000,
            read: true,
            write: false,
            exec: true,
            shared: false,
            offset: 0,
            dev: (8, 1),
            inode: 1,
            path: path.into(),
        }
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
        let mut signalled = held(0x40_0000, None);
        signalled.signal = libc::SIGUSR1;
        assert_eq!(fit(signalled), None, "on its way to a signal");
    }
}
