//! Helpers for the attach tests (`uprobe-run --pid`): fixture programs commanded on their
//! stdin, sessions whose stderr is read as it comes, and whether ptrace is permitted here.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{default_signals, fixture, int3_only, uprobe_run};

pub const WAIT: Duration = Duration::from_secs(20);

/// Lines of a child's stream, read by a thread as they come.
pub struct Lines {
    rx: Receiver<String>,
    pub seen: Vec<String>,
    /// Which of `seen` an `expect` returned already.
    matched: Vec<bool>,
    what: String,
}

impl Lines {
    pub fn of(stream: impl Read + Send + 'static, what: &str) -> Lines {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { rx, seen: Vec::new(), matched: Vec::new(), what: what.into() }
    }

    /// The first line starting with `prefix` that no `expect` returned yet, seen already or
    /// waited for (lines of different threads come in any order).
    pub fn expect(&mut self, prefix: &str) -> String {
        if let Some(i) = (0..self.seen.len()).find(|&i| !self.matched[i] && self.seen[i].starts_with(prefix)) {
            self.matched[i] = true;
            return self.seen[i].clone();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            match self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    let found = line.starts_with(prefix);
                    self.seen.push(line.clone());
                    self.matched.push(found);
                    if found {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    panic!("{}: no line starting with {prefix:?}; got:\n{}", self.what, self.seen.join("\n"))
                }
            }
        }
    }

    /// Everything until the stream ends.
    pub fn rest(&mut self) -> Vec<String> {
        let start = self.seen.len();
        while let Ok(line) = self.rx.recv_timeout(WAIT) {
            self.seen.push(line);
            self.matched.push(false);
        }
        self.seen[start..].to_vec()
    }
}

/// A fixture program run directly, commanded on its stdin.
pub struct Target {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub out: Lines,
    pub pid: i32,
}

impl Target {
    pub fn start(program: &Path, args: &[&str]) -> Target {
        Target::start_with(Command::new(program).args(args))
    }

    pub fn start_with(command: &mut Command) -> Target {
        let mut child =
            default_signals(command).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("start the target");
        let stdin = child.stdin.take();
        let mut out = Lines::of(child.stdout.take().unwrap(), "the target's stdout");
        let ready = out.expect("ready ");
        let pid = ready["ready ".len()..].trim().parse().unwrap();
        Target { child, stdin, out, pid }
    }

    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    pub fn alive(&self) -> bool {
        alive(self.pid)
    }

    pub fn maps(&self) -> Vec<String> {
        maps(self.pid)
    }

    pub fn vm_rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches(" kB").parse().unwrap()
    }

    /// Sends `quit` (or closes stdin) and waits for the end.
    pub fn finish(mut self) -> (ExitStatus, Vec<String>) {
        if self.stdin.is_some() {
            self.send("quit");
        }
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        (status, self.out.rest())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z"))
}

pub fn maps(pid: i32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap().lines().map(str::to_owned).collect()
}

/// A running `uprobe-run --pid` session, with `--verbose` so that its "attached" line says
/// when the probes are in place; its stderr (the handlers' output and its own lines).
pub struct Session {
    pub child: Child,
    pub err: Lines,
}

pub fn attach_command(pid: i32, args: &[&str]) -> Command {
    let mut command = Command::new(uprobe_run());
    default_signals(&mut command);
    command.args(int3_only().then_some("--no-optimize")).arg("--pid").arg(pid.to_string()).args(args);
    command.env_remove("UPROBE_LIB");
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

impl Session {
    /// Starts a session and waits until its probes are in place.
    pub fn start(pid: i32, args: &[&str]) -> Session {
        let mut session = Session::begin(pid, args);
        session.expect("uprobe-run: attached to process");
        session
    }

    /// Starts a session (which may fail).
    pub fn begin(pid: i32, args: &[&str]) -> Session {
        let mut child = attach_command(pid, &[&["-v"], args].concat()).spawn().expect("start uprobe-run");
        let err = Lines::of(child.stderr.take().unwrap(), "uprobe-run's stderr");
        Session { child, err }
    }

    pub fn expect(&mut self, prefix: &str) -> String {
        self.err.expect(prefix)
    }

    /// Sends `signal` and waits for the end: the exit status and the handlers' lines.
    pub fn end(mut self, signal: i32) -> (ExitStatus, Vec<String>) {
        let signal = Signal::try_from(signal).expect("a signal number");
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
        self.wait()
    }

    /// Waits for the end: the exit status and the handlers' lines (uprobe-run's own lines,
    /// which start with `uprobe-run: `, are in `err.seen`).
    pub fn wait(&mut self) -> (ExitStatus, Vec<String>) {
        let status = self.child.wait().unwrap();
        self.err.rest();
        (status, self.err.seen.iter().filter(|l| !l.starts_with("uprobe-run: ")).cloned().collect())
    }

    /// uprobe-run's own lines.
    pub fn own_lines(&self) -> Vec<String> {
        self.err.seen.iter().filter(|l| l.starts_with("uprobe-run: ")).cloned().collect()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `uprobe-run --pid PID ARGS` to its end (a refusal): exit status and stderr.
pub fn attach_once(pid: i32, args: &[&str]) -> (ExitStatus, String) {
    let out = attach_command(pid, args).output().unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Whether this process may trace its own children; says why not.
pub fn ptrace_allowed() -> Result<(), String> {
    let mut sleeper = Command::new("sleep").arg("10").spawn().unwrap();
    let pid = Pid::from_raw(sleeper.id() as i32);
    let seized = ptrace::seize(pid, ptrace::Options::empty());
    let _ = ptrace::detach(pid, None);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let why = match seized {
        Ok(()) => return Ok(()),
        Err(errno) => std::io::Error::from(errno),
    };
    let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_else(|_| "absent".into());
    Err(format!("ptrace is not permitted here ({why}; kernel.yama.ptrace_scope {})", yama.trim()))
}

#[macro_export]
macro_rules! need_ptrace {
    () => {
        if let Err(why) = $crate::attach::ptrace_allowed() {
            println!("SKIPPED: {why}");
            return;
        }
    };
}

pub fn service() -> PathBuf {
    fixture("service", &["-O2", "-g", "-pthread"])
}

pub fn myprog() -> PathBuf {
    fixture("myprog_attach", &["-O0", "-g", "-no-pie"])
}

pub fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}
