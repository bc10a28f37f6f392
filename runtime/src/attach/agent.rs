//! The agent: a thread of the runtime's own that carries out an attach session in the target
//! process. `uprobe_attach_begin` (run by `uprobe-run` on a hijacked thread) makes its
//! channel to the `uprobe-run` that attached (a socket pair, one end of which `uprobe-run`
//! takes) and starts it; it then
//!
//! 1. says hello and receives the session: handler libraries, parameters, options, and the
//!    descriptor the session's output goes to;
//! 2. loads the libraries and runs their `uprobe_init` (normal context, the program's threads
//!    running), each batch written while `uprobe-run` holds the other threads (see `hold`);
//! 3. waits, idle, until `uprobe-run` says detach (or goes away, or the process exits), then
//!    runs the libraries' `uprobe_exit`, removes their probes in one batch, unloads them and
//!    ends.
//!
//! The agent blocks every asynchronous signal (the program's signals go to its own threads),
//! runs marked as inside the runtime (a probe it meets runs no handler), and while idle does
//! not count as a thread that may run the program's code (see `probe::world`). One session at
//! a time.
//!
//! Normal context; `at_exit` runs in the exiting thread, from `exit`.

use core::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use crate::attach::channel::{Channel, RecvError};
use crate::attach::hold;
use crate::attach::session::Session;
use crate::attach::wire::{FromAgent, ToAgent};
use crate::base::spec::{self, Spec};
use crate::base::sys::{self, Errno};
use crate::base::{output, params, route, socket};
use crate::insn::vector;
use crate::probe::{deferred, registry, world};

/// The process whose agent is running (a forked child has none), or 0.
static RUNNING: AtomicI32 = AtomicI32::new(0);
/// The eventfd `at_exit` wakes the agent with, or -1.
static EXIT_EVENT: AtomicI32 = AtomicI32::new(-1);
/// Set by the agent when the libraries' exits ran for `at_exit`.
static EXIT_DONE: AtomicU32 = AtomicU32::new(0);
/// How long the exiting thread waits for the agent.
const EXIT_WAIT_NS: u64 = 2_000_000_000;

const fn bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

/// Signals the agent keeps deliverable: the synchronous ones (a probe's int3 among them, and
/// a faulting handler) and glibc's internal two (setxid broadcasts wait for every thread).
const KEPT: u64 = bit(libc::SIGTRAP)
    | bit(libc::SIGSEGV)
    | bit(libc::SIGBUS)
    | bit(libc::SIGILL)
    | bit(libc::SIGFPE)
    | bit(libc::SIGABRT)
    | bit(libc::SIGSYS)
    | bit(32)
    | bit(33);

/// Why no agent could be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartError {
    /// This process has a running session already.
    Busy,
    /// `uprobe-run` could not be reached, or the thread not made.
    Sys(Errno),
}

/// Claims the process's one session and makes its channel: the agent's end, and the end
/// `uprobe-run` takes from this process (on the thread `uprobe-run` hijacked, which must
/// return soon).
pub fn open() -> Result<(Channel, i32), StartError> {
    let me = sys::getpid();
    // A value left by the parent of a forked child is stale: its agent did not come along.
    let before = RUNNING.load(Ordering::SeqCst);
    if before == me || RUNNING.compare_exchange(before, me, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        return Err(StartError::Busy);
    }
    match socket::socketpair_seqpacket() {
        Ok((ours, theirs)) => Ok((Channel { fd: ours }, theirs)),
        Err(e) => {
            RUNNING.store(0, Ordering::SeqCst);
            Err(StartError::Sys(e))
        }
    }
}

/// Starts the agent on the session's channel; `theirs`: `uprobe-run`'s end, closed here once
/// `uprobe-run` holds its own copy (its first message), or when it does not come in time.
/// `preloaded`: the runtime was there since the process started.
pub fn start(channel: Channel, theirs: i32, preloaded: bool) -> Result<(), StartError> {
    let started = spawn(channel, theirs, preloaded);
    if started.is_err() {
        sys::close(theirs);
        RUNNING.store(0, Ordering::SeqCst);
    }
    started
}

/// Gives up the session claimed by [`open`] (the runtime cannot work here).
pub fn abandon(channel: Channel, theirs: i32) {
    drop(channel);
    sys::close(theirs);
    RUNNING.store(0, Ordering::SeqCst);
}

fn spawn(channel: Channel, theirs: i32, preloaded: bool) -> Result<(), StartError> {
    if EXIT_EVENT.load(Ordering::SeqCst) < 0 {
        let event = socket::eventfd().map_err(StartError::Sys)?;
        EXIT_EVENT.store(event, Ordering::SeqCst);
        // SAFETY: at_exit is an extern "C" fn() in this library, which is never unloaded.
        unsafe { libc::atexit(at_exit) };
    }
    let spawned =
        std::thread::Builder::new().name("uprobe-agent".into()).spawn(move || run(channel, theirs, preloaded));
    spawned.map(drop).map_err(|e| StartError::Sys(e.raw_os_error().unwrap_or(libc::EAGAIN)))
}

/// What woke the idle agent.
enum Event {
    Message(Result<ToAgent, RecvError>),
    Exit,
}

fn wait(channel: &Channel) -> Event {
    let event = EXIT_EVENT.load(Ordering::SeqCst);
    let mut fds = [
        libc::pollfd { fd: channel.fd, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: event, events: libc::POLLIN, revents: 0 },
    ];
    loop {
        match socket::poll(&mut fds, -1) {
            Ok(_) if fds[1].revents != 0 => {
                let mut count = [0u8; 8];
                let _ = sys::read(event, &mut count);
                return Event::Exit;
            }
            Ok(_) if fds[0].revents != 0 => {
                return Event::Message(channel.recv().map(|(message, fd)| {
                    if let Some(fd) = fd {
                        sys::close(fd);
                    }
                    message
                }))
            }
            Ok(_) | Err(libc::EINTR) => continue,
            Err(e) => return Event::Message(Err(RecvError::Io(e))),
        }
    }
}

/// How long `uprobe-run` may take to send the session's spec once the agent started: past
/// it, `uprobe-run` is taken to be gone (killed during the attach) and the agent ends,
/// having placed nothing.
const SPEC_TIMEOUT_MS: i32 = 5_000;

/// The session's spec and output descriptor, the first message, within [`SPEC_TIMEOUT_MS`].
fn receive_spec(channel: &Channel) -> Option<(Spec, i32)> {
    let mut fds = [libc::pollfd { fd: channel.fd, events: libc::POLLIN, revents: 0 }];
    let deadline = sys::monotonic_ns() + SPEC_TIMEOUT_MS as u64 * 1_000_000;
    loop {
        let left = deadline.saturating_sub(sys::monotonic_ns()) / 1_000_000;
        match socket::poll(&mut fds, left as i32) {
            Ok(_) if fds[0].revents != 0 => break,
            Ok(_) if left == 0 => return None,
            Ok(_) | Err(libc::EINTR) => continue,
            Err(_) => return None,
        }
    }
    match channel.recv() {
        Ok((ToAgent::Spec(text), Some(fd))) => match spec::decode(&text) {
            Ok(spec) => Some((spec, fd)),
            Err(e) => {
                let _ = channel.send(&FromAgent::Failed { line: format!("the session's spec: {e}") });
                sys::close(fd);
                None
            }
        },
        Ok((_, fd)) => {
            if let Some(fd) = fd {
                sys::close(fd);
            }
            None
        }
        Err(_) => None,
    }
}

fn run(channel: Channel, theirs: i32, preloaded: bool) {
    sys::block_signals(!KEPT);
    let _inside = deferred::Inside::enter();
    let tid = sys::gettid();
    let hello = FromAgent::Hello { pid: sys::getpid(), tid, preloaded };
    let spec = channel.send(&hello).ok().and_then(|()| receive_spec(&channel));
    // uprobe-run answered with its own copy of its end, or is not coming.
    sys::close(theirs);
    if let Some((spec, out)) = spec {
        // A process started by uprobe-run keeps its own output; in one the runtime came into
        // with this attach, the session's output is the output.
        let _ = route::add_thread(tid, out);
        if !preloaded {
            output::set_socket(out);
        }
        params::set_session(tid, out, &spec.params);
        output::set_waiter(tid);
        output::take_dropped();
        hold::set_socket(channel.fd);
        world::install(tid, &hold::TRACER);
        if registry::main_is_go() {
            let exe = sys::readlink(c"/proc/self/exe").unwrap_or_else(|_| "this program".into());
            output::message(format_args!(
                "{exe} is a Go program: return probes are not available in it (Go moves goroutine stacks and walks return addresses); entry probes work"
            ));
        }
        if spec.options.full_vector_state && !vector::save_full_state() {
            output::message(format_args!("--full-vector-state: this processor has no XSAVE; saving xmm0-15 only"));
        }
        serve(&channel, Session::new(spec, out));
        world::remove(tid);
        output::set_waiter(0);
        hold::set_socket(-1);
        params::clear_session();
        route::remove_fd(out);
        if !preloaded {
            output::set_socket(-1);
        }
        sys::close(out);
    }
    RUNNING.store(0, Ordering::SeqCst);
}

/// Runs the session until it ends.
fn serve(channel: &Channel, mut session: Session) {
    let started = crate::base::stats::Counters::now();
    if let Err(line) = session.load() {
        session.end();
        let _ = channel.send(&FromAgent::Failed { line });
        return;
    }
    let (probes, jumps) = session.placed();
    let libraries = session.spec.handlers.len();
    if channel.send(&FromAgent::Ready { libraries, probes, jumps }).is_err() {
        session.end();
        return;
    }
    loop {
        world::set_own_idle(true);
        let event = wait(channel);
        world::set_own_idle(false);
        match event {
            Event::Message(Ok(ToAgent::Detach)) => {
                let (probes, mut notes) = session.end();
                notes.extend(dropped_note());
                if session.spec.options.stats {
                    notes.push(crate::base::stats::summary_since(&started));
                }
                let _ = channel.send(&FromAgent::Detached { probes, notes });
                return;
            }
            // Anything else is out of turn: ignored.
            Event::Message(Ok(_)) | Event::Message(Err(RecvError::Garbled)) => {}
            // uprobe-run is gone: the session ends, without it to hold the threads (jumps are
            // taken out live, which is safe; nothing new is placed).
            Event::Message(Err(_)) => {
                session.end();
                return;
            }
            Event::Exit => {
                session.exit();
                output::flush();
                if let Some(note) = dropped_note() {
                    output::message(format_args!("{note}"));
                }
                let _ = channel.send(&FromAgent::Exiting);
                EXIT_DONE.store(1, Ordering::SeqCst);
                // The process ends now; the agent leaves everything as it is.
                loop {
                    sys::sleep_ns(1_000_000_000);
                }
            }
        }
    }
}

/// The line saying how much of the session's output was dropped, if any was.
fn dropped_note() -> Option<String> {
    let dropped = output::take_dropped();
    (dropped > 0).then(|| {
        format!(
            "{dropped} write{} of output dropped: uprobe-run did not read them in time (stopped, or its own output not read); the process's threads never wait for it",
            if dropped == 1 { "" } else { "s" }
        )
    })
}

/// Registered with `atexit` at the first attach.
extern "C" fn at_exit() {
    process_ends();
}

/// The process is ending (exit, or, in a process uprobe-run started, any ending it reports:
/// `api::ending`) with a session on, so the agent runs the session's `uprobe_exit` (their
/// output reaches the session) before the process goes; this thread waits for it, for a
/// bounded time. Raw system calls only: this may run in a fatal signal's handler.
pub fn process_ends() {
    let event = EXIT_EVENT.load(Ordering::SeqCst);
    if event < 0 || RUNNING.load(Ordering::SeqCst) != sys::getpid() {
        return;
    }
    EXIT_DONE.store(0, Ordering::SeqCst);
    if sys::write_all(event, &1u64.to_ne_bytes()).is_err() {
        return;
    }
    let start = sys::monotonic_ns();
    while EXIT_DONE.load(Ordering::SeqCst) == 0 && sys::monotonic_ns() - start < EXIT_WAIT_NS {
        sys::sleep_ns(1_000_000);
    }
}
