//! The session, from uprobe-run's side: sends the agent its handlers, parameters, options and
//! output; holds the target's threads whenever the agent writes a batch; relays the handlers'
//! output as it comes; and ends the session on Ctrl-C, SIGTERM, SIGHUP, the end of
//! `--duration`, or the target's exit. Reports, with `--verbose`, how long attaching and
//! detaching took and how long the target's threads were held (the pause).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::attach::error::AttachError;
use crate::attach::files::Files;
use crate::attach::net;
use crate::attach::request::Request;
use crate::attach::stop::{self, StopError, Stopped};
use crate::attach::target::Target;
use crate::base::spec;
use uprobe_contracts::wire::{FromAgent, ToAgent, FILE_PART, MAX_MESSAGE};

/// Exit status when a handler library's `uprobe_init` failed (as for a launched program).
const INIT_FAILED: i32 = 127;
/// Exit status of a refusal.
const REFUSED: i32 = 2;
/// How long the agent may take to say hello once started.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long, after Ctrl-C (SIGTERM, SIGHUP), the agent may take to finish loading and then
/// to detach: past it (or at a second signal), uprobe-run leaves; the agent, seeing the
/// session's socket close, ends the session by itself.
const END_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent may take to end after it said it detached.
const AGENT_END_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a process whose agent went away may take to finish exiting.
const EXIT_GRACE: Duration = Duration::from_millis(500);
/// How long the target's threads run between two stops when one sat where a jump goes.
const RESTOP_GAP: Duration = Duration::from_millis(1);
/// The first byte of an output message that is one of the runtime's lines for stderr
/// (`base::output::ASIDE`).
const ASIDE: u8 = 1;
/// The output socket's send buffer in the target: lines wait there while uprobe-run is busy.
const OUTPUT_BUFFER: libc::c_int = 1 << 20;

/// Where the handlers' output goes: the `-o` file (`-`: stdout), or uprobe-run's stderr.
pub struct Output(Box<dyn Write>);

/// The first error a write of the output met, and the writes it lost.
static FAILURE: std::sync::Mutex<Option<(io::Error, u64)>> = std::sync::Mutex::new(None);
/// The output as the user named it, for that line.
static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

impl Output {
    /// Creates or truncates `path` (mode 0644), as a launched run does; stderr without one.
    pub fn open(path: Option<&Path>) -> Result<Output, AttachError> {
        let name = match path {
            None => "standard error".to_string(),
            Some(p) if p.as_os_str() == "-" => "standard output".to_string(),
            Some(p) => p.display().to_string(),
        };
        let _ = NAME.set(name);
        match path {
            None => Ok(Output(Box::new(std::io::stderr()))),
            Some(path) if path.as_os_str() == "-" => Ok(Output(Box::new(std::io::stdout()))),
            Some(path) => OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .open(path)
                .map(|f: File| Output(Box::new(f)))
                .map_err(|source| AttachError::Output { path: PathBuf::from(path), source }),
        }
    }

    /// Writes `bytes`; a failure is kept for [`Output::failure`] (the session goes on).
    fn write(&mut self, bytes: &[u8]) {
        if let Err(e) = self.0.write_all(bytes).and_then(|()| self.0.flush()) {
            let mut failure = FAILURE.lock().unwrap_or_else(|p| p.into_inner());
            failure.get_or_insert((e, 0)).1 += 1;
        }
    }

    /// The first write error of the session's output and how many writes failed.
    pub fn failure() -> Option<(io::Error, u64)> {
        FAILURE.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The exit status after a session whose status was `status`: where writes of the output
/// failed, one line on stderr says so, and a status of 0 becomes 74 (EX_IOERR), as a
/// launched run's.
pub fn output_checked(status: i32) -> i32 {
    let Some((error, writes)) = Output::failure() else { return status };
    let s = if writes == 1 { "" } else { "s" };
    let name = NAME.get().map_or("standard error", String::as_str);
    eprintln!(
        "uprobe-run: cannot write the output ({name}): {}: lost {writes} write{s} of the handlers' output",
        crate::base::error::describe(&error)
    );
    if status == 0 {
        74
    } else {
        status
    }
}

/// How long the target's threads were held, over how many stops.
#[derive(Debug, Default, Clone, Copy)]
pub struct Pause {
    pub total: Duration,
    pub stops: usize,
}

impl Pause {
    pub fn add(&mut self, held: Duration) {
        self.total += held;
        self.stops += 1;
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

impl std::fmt::Display for Pause {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let s = if self.stops == 1 { "" } else { "s" };
        write!(f, "threads held {:.3} ms in {} stop{s}", self.total.as_secs_f64() * 1e3, self.stops)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The agent loads the handler libraries.
    Loading,
    Attached,
    /// Detach was asked for.
    Detaching,
}

pub struct Session {
    pub target: Target,
    pub control: OwnedFd,
    pub out: Output,
    pub signals: OwnedFd,
    pub request: Request,
    pub started: Instant,
    /// The pause of the attach so far (finding a thread to load the runtime with).
    pub pause: Pause,
    /// What the process sent of the files written at the end.
    pub files: Files,
}

impl Session {
    fn pid(&self) -> i32 {
        self.target.pid
    }

    fn send(&self, message: &ToAgent, fd: Option<i32>) -> Result<(), AttachError> {
        net::send(&self.control, message.encode().as_bytes(), fd).map_err(AttachError::Socket)
    }

    fn protocol(&self, what: impl Into<String>) -> AttachError {
        AttachError::Protocol { pid: self.pid(), what: what.into() }
    }

    fn recv(&self) -> Result<Option<FromAgent>, AttachError> {
        let bytes = net::recv(self.control.as_raw_fd(), MAX_MESSAGE).map_err(AttachError::Socket)?;
        if bytes.is_empty() {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&bytes);
        FromAgent::decode(&text).map(Some).ok_or_else(|| self.protocol(format!("unknown message {text:?}")))
    }

    /// Runs the session to its end, then writes the files the process sent
    /// (`--flamegraph`, `--pprof`); returns uprobe-run's exit status.
    pub fn run(mut self) -> Result<i32, AttachError> {
        let status = self.session();
        let asked = &self.request.spec.aggregate;
        if asked.flamegraph.is_some() || asked.pprof.is_some() {
            let title = format!("uprobe-run: {} (pid {})", asked.by.as_deref().unwrap_or(""), self.pid());
            self.files.write(asked.flamegraph.as_deref(), asked.pprof.as_deref(), &title);
        }
        status
    }

    fn session(&mut self) -> Result<i32, AttachError> {
        let pid = self.pid();
        let hello = net::poll(&[self.control.as_raw_fd()], Some(HELLO_TIMEOUT)).map_err(AttachError::Socket)?;
        if !hello[0] {
            return Err(self.target.changed().unwrap_or(AttachError::NoAgent { pid, secs: HELLO_TIMEOUT.as_secs() }));
        }
        let hello = self.recv().map_err(|e| self.target.changed().unwrap_or(e))?;
        let Some(FromAgent::Hello { tid: agent, .. }) = hello else {
            return Err(self.target.changed().unwrap_or_else(|| self.protocol("no hello")));
        };
        // The agent knows itself by its id in the process's PID namespace.
        let agent = self.target.host_tid(agent).ok_or_else(|| {
            self.target.changed().unwrap_or_else(|| self.protocol(format!("no thread {agent} (its agent) in it")))
        })?;
        let (ours, theirs) = net::pair().map_err(AttachError::Socket)?;
        net::set_send_buffer(&theirs, OUTPUT_BUFFER);
        let request = &self.request;
        let records = spec::run_spec(&request.handlers, &request.params, None, &request.switches, request.spec.clone())
            .and_then(|spec| spec::encode(&spec))
            .map_err(|e| self.protocol(e.to_string()))?;
        if records.len() >= MAX_MESSAGE - 16 {
            return Err(self.protocol(format!(
                "the session's definitions and options take {} bytes, over the {MAX_MESSAGE} one message carries",
                records.len()
            )));
        }
        let records = records.to_string_lossy().into_owned();
        if let Some(feed) = self.request.feed {
            self.send(&ToAgent::Feed, Some(feed))?;
        }
        self.send(&ToAgent::Spec(records), Some(theirs.as_raw_fd()))?;
        drop(theirs);
        let pidfd = net::pidfd(self.pid()).map_err(AttachError::Socket)?;
        let mut phase = Phase::Loading;
        let mut exiting = false;
        let mut detach_wanted = false;
        let mut held: Option<Stopped> = None;
        let mut attach_pause = self.pause;
        let mut detach_pause = Pause::default();
        let mut detach_started = None;
        let deadline = self.request.duration.map(|d| Instant::now() + d);
        // Once asked to end: when uprobe-run leaves at the latest.
        let mut leave_at: Option<Instant> = None;
        loop {
            let timeout = match (phase, deadline, leave_at) {
                (_, _, Some(at)) => Some(at.saturating_duration_since(Instant::now())),
                (Phase::Attached, Some(at), None) => Some(at.saturating_duration_since(Instant::now())),
                _ => None,
            };
            let fds = [self.signals.as_raw_fd(), self.control.as_raw_fd(), ours.as_raw_fd(), pidfd.as_raw_fd()];
            let ready = net::poll(&fds, timeout).map_err(AttachError::Socket)?;
            if ready[2] {
                self.relay(&ours);
            }
            let timed_out = !ready.iter().any(|&r| r) && timeout.is_some();
            let signalled = ready[0] && net::read_signal(&self.signals).is_ok();
            let overdue = leave_at.is_some_and(|at| Instant::now() >= at);
            if overdue || (signalled && leave_at.is_some()) {
                self.relay(&ours);
                let doing = if phase == Phase::Loading { "loading" } else { "detaching" };
                eprintln!(
                    "uprobe-run: process {pid}: the runtime's agent is still {doing}; uprobe-run leaves, and the agent \
                     ends the session by itself (it removes every probe of the session)"
                );
                return Ok(REFUSED);
            }
            if signalled || timed_out {
                leave_at.get_or_insert(Instant::now() + END_TIMEOUT);
                match phase {
                    Phase::Loading => detach_wanted = true,
                    Phase::Attached => {
                        self.send(&ToAgent::Detach, None)?;
                        phase = Phase::Detaching;
                        detach_started = Some(Instant::now());
                    }
                    Phase::Detaching => {}
                }
            }
            if ready[1] {
                let message = self.recv()?;
                let pause = if phase == Phase::Loading { &mut attach_pause } else { &mut detach_pause };
                match message {
                    Some(FromAgent::Stop) => {
                        let reply = self.stop(agent, phase == Phase::Loading, &mut held);
                        self.send(&reply, None)?;
                    }
                    Some(FromAgent::Restop) => {
                        if let Some(s) = held.take() {
                            pause.add(s.resume());
                        }
                        std::thread::sleep(RESTOP_GAP);
                        let reply = self.stop(agent, phase == Phase::Loading, &mut held);
                        self.send(&reply, None)?;
                    }
                    Some(FromAgent::Resume) => {
                        if let Some(s) = held.take() {
                            pause.add(s.resume());
                        }
                        self.send(&ToAgent::Resumed, None)?;
                    }
                    Some(FromAgent::Ready { libraries, probes, jumps }) => {
                        phase = Phase::Attached;
                        if self.request.verbose {
                            let exe = self.target.exe.display();
                            eprintln!(
                                "uprobe-run: attached to process {} ({exe}) in {:.3} ms: {libraries} handler librar{}, {probes} probe{} ({jumps} jump{}); {attach_pause}",
                                self.pid(),
                                self.started.elapsed().as_secs_f64() * 1e3,
                                if libraries == 1 { "y" } else { "ies" },
                                plural(probes),
                                plural(jumps),
                            );
                        }
                        if detach_wanted {
                            self.send(&ToAgent::Detach, None)?;
                            phase = Phase::Detaching;
                            detach_started = Some(Instant::now());
                        }
                    }
                    Some(FromAgent::Failed { line }) => {
                        self.relay(&ours);
                        eprintln!("uprobe-run: {line}");
                        self.wait_agent_gone(agent);
                        return Ok(INIT_FAILED);
                    }
                    Some(FromAgent::Refused { line }) => {
                        self.relay(&ours);
                        eprintln!("uprobe-run: process {pid}: {line}");
                        self.wait_agent_gone(agent);
                        return Ok(REFUSED);
                    }
                    Some(FromAgent::Listed { functions }) => {
                        self.relay(&ours);
                        self.wait_agent_gone(agent);
                        if functions == 0 {
                            let pattern = self.request.spec.list.clone().unwrap_or_default();
                            eprintln!("uprobe-run: no function matches {pattern}");
                            return Ok(1);
                        }
                        return Ok(0);
                    }
                    Some(FromAgent::Detached { probes, notes }) => {
                        self.relay(&ours);
                        for note in notes {
                            eprintln!("uprobe-run: {note}");
                        }
                        self.wait_agent_gone(agent);
                        if self.request.verbose {
                            let took = detach_started.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
                            eprintln!(
                                "uprobe-run: detached from process {} in {took:.3} ms: {probes} probe{} removed; {detach_pause}",
                                self.pid(),
                                plural(probes)
                            );
                        }
                        return Ok(0);
                    }
                    Some(FromAgent::Exiting) => exiting = true,
                    Some(FromAgent::Hello { .. }) => return Err(self.protocol("a second hello")),
                    None => return self.agent_gone(phase, &ours, &pidfd, exiting),
                }
            }
            if ready[3] {
                return self.agent_gone(phase, &ours, &pidfd, exiting);
            }
        }
    }

    /// Holds every thread but the agent; the reply for the agent.
    fn stop(&self, agent: i32, attaching: bool, held: &mut Option<Stopped>) -> ToAgent {
        match stop::stop_all(&self.target, Some(agent), attaching) {
            Ok(s) => {
                let rips = s.resume_addresses();
                *held = Some(s);
                ToAgent::Stopped(rips)
            }
            Err(StopError::Gone(e) | StopError::Failed(e)) => ToAgent::Unstoppable(e.to_string()),
        }
    }

    /// Writes out every output message waiting.
    fn relay(&mut self, ours: &OwnedFd) {
        while let Ok(Some(bytes)) = net::try_recv(ours.as_raw_fd(), OUTPUT_BUFFER as usize) {
            if bytes.is_empty() {
                break;
            }
            // A Chrome trace is one JSON document: the runtime's lines come marked, for stderr.
            match bytes.split_first() {
                Some((&ASIDE, line)) if self.request.chrome => {
                    let _ = std::io::stderr().write_all(line);
                }
                Some((&FILE_PART, part)) if self.request.spec.aggregate.flamegraph.is_some() => self.files.take(part),
                Some((&FILE_PART, part)) if self.request.spec.aggregate.pprof.is_some() => self.files.take(part),
                _ => self.out.write(&bytes),
            }
        }
    }

    /// Waits (bounded) until the agent thread has ended.
    fn wait_agent_gone(&self, agent: i32) {
        let start = Instant::now();
        let task = PathBuf::from(format!("/proc/{}/task/{agent}", self.pid()));
        while task.exists() && start.elapsed() < AGENT_END_TIMEOUT {
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The agent went away without detaching: the process exited or exec'd. Returns the exit
    /// status. `exiting`: the agent said the process was exiting, its libraries' `uprobe_exit`
    /// done.
    fn agent_gone(&mut self, phase: Phase, ours: &OwnedFd, pidfd: &OwnedFd, exiting: bool) -> Result<i32, AttachError> {
        // The agent's socket closes while the process is still on its way out.
        let _ = net::poll(&[pidfd.as_raw_fd()], Some(EXIT_GRACE));
        self.relay(ours);
        let pid = self.pid();
        // An exec of the same program leaves the same executable: the runtime then is gone.
        let change = self.target.changed().or_else(|| {
            let runtime_gone = self.target.maps().is_ok_and(|maps| self.target.mapped(&maps, "libuprobe.so").is_none());
            runtime_gone.then(|| AttachError::ExecdDuringAttach { pid, now: self.target.exe.display().to_string() })
        });
        if phase == Phase::Loading {
            return Err(change.unwrap_or(AttachError::ExitedDuringAttach { pid }));
        }
        match change {
            Some(AttachError::ExecdDuringAttach { now, .. }) => {
                eprintln!("uprobe-run: process {pid} exec'd {now}: the session ended with the program it ran");
            }
            Some(_) if exiting => eprintln!("uprobe-run: process {pid} exited"),
            Some(_) => eprintln!(
                "uprobe-run: process {pid} ended without the handlers' uprobe_exit: killed by SIGKILL, or ended by \
                 a raw exit_group system call"
            ),
            None => {
                eprintln!("uprobe-run: process {pid}: the runtime's agent ended without detaching");
                return Ok(REFUSED);
            }
        }
        Ok(0)
    }
}
