//! The ways of running the fixture: unprobed (`none`), the bare SIGTRAP loop (`sigtrap`),
//! under uprobe-run (`int3`, `jump`), under a ptrace tracer (`ptrace`, `ptrace-ool`) and with
//! kernel uprobes (`kernel`). Each run checks that the probe saw exactly the hits it should.

pub mod aggregate;
pub mod kernel;
pub mod plain;
pub mod ptrace;
pub mod stacks;
pub mod trace;
pub mod uprobe_run;

use crate::fixture::Fixture;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Engine {
    /// No probe: the baseline.
    None,
    /// The bare in-process round trip: int3, an SA_SIGINFO handler that returns.
    Sigtrap,
    /// uprobe-run's trap path.
    Int3,
    /// uprobe-run's trap-free path.
    Jump,
    /// Kernel uprobes through perf_event_open and the `uprobe` PMU.
    Kernel,
    /// A ptrace tracer that executes the displaced instruction out of line (no single-step).
    PtraceOol,
    /// A ptrace tracer that restores the byte, single-steps and re-inserts the breakpoint.
    Ptrace,
    /// `Ptrace` with tracer and tracee on different CPUs: every stop is a cross-CPU wake-up.
    PtraceXcpu,
}

impl Engine {
    pub const ALL: [Engine; 8] = [
        Engine::None,
        Engine::Sigtrap,
        Engine::Int3,
        Engine::Jump,
        Engine::Kernel,
        Engine::PtraceOol,
        Engine::Ptrace,
        Engine::PtraceXcpu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Engine::None => "none",
            Engine::Sigtrap => "sigtrap",
            Engine::Int3 => "int3",
            Engine::Jump => "jump",
            Engine::Kernel => "kernel",
            Engine::PtraceOol => "ptrace-ool",
            Engine::Ptrace => "ptrace",
            Engine::PtraceXcpu => "ptrace-xcpu",
        }
    }

    /// Hits of the short run that sizes the real ones.
    pub fn calibration_hits(self) -> u64 {
        match self {
            Engine::None => 2_000_000,
            Engine::Jump => 200_000,
            Engine::Sigtrap | Engine::Int3 | Engine::Kernel => 5_000,
            Engine::PtraceOol | Engine::Ptrace | Engine::PtraceXcpu => 500,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A plain call (engine `none`).
    Call,
    /// A bare trap (engine `sigtrap`).
    Trap,
    Entry,
    Return,
    EntryReturn,
}

impl Kind {
    pub const PROBES: [Kind; 3] = [Kind::Entry, Kind::Return, Kind::EntryReturn];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Call => "call",
            Kind::Trap => "trap",
            Kind::Entry => "entry",
            Kind::Return => "return",
            Kind::EntryReturn => "entry+return",
        }
    }

    pub fn has_entry(self) -> bool {
        matches!(self, Kind::Entry | Kind::EntryReturn)
    }

    pub fn has_return(self) -> bool {
        matches!(self, Kind::Return | Kind::EntryReturn)
    }
}

/// One run to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub engine: Engine,
    pub kind: Kind,
    /// A fixture function; unused by `sigtrap`.
    pub function: &'static str,
    pub threads: u32,
    /// Calls (or traps) per thread.
    pub hits: u64,
}

/// What the fixture reported about one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Measurement {
    /// Wall time of the timed loops.
    pub elapsed_ns: u64,
    /// Calls per thread.
    pub calls: u64,
    pub threads: u32,
    /// VmRSS at the end.
    pub rss_kb: u64,
    /// The probe strategy uprobe-run reported (`jump`, or `int3 (why not a jump)`), if any.
    pub strategy: Option<String>,
}

impl Measurement {
    /// Wall time per call of one thread (the threads run in parallel).
    pub fn ns_per_call(&self) -> f64 {
        self.elapsed_ns as f64 / self.calls.max(1) as f64
    }
}

/// Why a run produced no number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The engine cannot run here (missing tool, refused by the kernel, not implemented).
    Unavailable(String),
    /// The engine ran but the result cannot be trusted (wrong hit count, crash).
    Invalid(String),
}

impl Failure {
    pub fn reason(&self) -> &str {
        match self {
            Failure::Unavailable(r) | Failure::Invalid(r) => r,
        }
    }
}

/// Parses the fixture's `KEY=VALUE` report line.
pub fn parse_report(stdout: &str) -> Result<Measurement, String> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("elapsed_ns="))
        .ok_or_else(|| format!("the fixture printed no report (stdout: {:?})", stdout.trim()))?;
    let kv = key_values(line);
    let get = |k: &str| -> Result<u64, String> {
        kv.get(k).and_then(|v| v.parse().ok()).ok_or_else(|| format!("fixture report lacks {k}: {line}"))
    };
    Ok(Measurement {
        elapsed_ns: get("elapsed_ns")?,
        calls: get("calls")?,
        threads: get("threads")? as u32,
        rss_kb: get("rss_kb")?,
        strategy: None,
    })
}

/// `a=1 b=x` -> {a: "1", b: "x"}.
pub fn key_values(line: &str) -> HashMap<&str, &str> {
    line.split_whitespace().filter_map(|kv| kv.split_once('=')).collect()
}

/// An Invalid failure unless `got == expected`.
pub fn check_hits(what: &str, got: u64, expected: u64) -> Result<(), Failure> {
    if got == expected {
        Ok(())
    } else {
        Err(Failure::Invalid(format!("{what} counted {got} hits, expected {expected}")))
    }
}

/// The fixture's command line for a job.
pub fn fixture_args(job: &Job) -> Vec<String> {
    match job.kind {
        Kind::Trap => vec!["sigtrap".into(), job.hits.to_string(), job.threads.to_string()],
        _ => vec!["loop".into(), job.function.into(), job.hits.to_string(), job.threads.to_string()],
    }
}

/// What a finished command left behind.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From spawn to exit.
    pub wall: Duration,
}

/// Runs `cmd` with stdout going to `stdout_path` (read back afterwards) and stderr captured.
pub fn run_command(cmd: &mut Command, stdout_path: &Path) -> Result<Finished, String> {
    let out =
        std::fs::File::create(stdout_path).map_err(|e| format!("cannot create {}: {e}", stdout_path.display()))?;
    let start = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let output = child.wait_with_output().map_err(|e| format!("waiting for {:?}: {e}", cmd.get_program()))?;
    let wall = start.elapsed();
    Ok(Finished {
        status: output.status,
        stdout: std::fs::read_to_string(stdout_path).unwrap_or_default(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        wall,
    })
}

/// Describes a non-zero exit: status plus the last line of stderr.
pub fn describe_exit(what: &str, finished: &Finished) -> String {
    use std::os::unix::process::ExitStatusExt;
    let status = match (finished.status.code(), finished.status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "unknown status".into(),
    };
    match finished.stderr.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(line) => format!("{what}: {status}: {}", line.trim()),
        None => format!("{what}: {status}"),
    }
}

/// Everything the engines need, prepared once.
pub struct Engines {
    pub fixture: Fixture,
    /// Scratch directory for stdout and output files.
    pub scratch: PathBuf,
    pub uprobe_run: Result<uprobe_run::UprobeRun, String>,
    pub kernel: kernel::KernelProbes,
}

impl Engines {
    /// Why `engine` cannot run at all here, if it cannot.
    pub fn unavailable(&self, engine: Engine) -> Option<String> {
        match engine {
            Engine::Int3 => self.uprobe_run.as_ref().err().cloned(),
            Engine::Jump => match &self.uprobe_run {
                Err(e) => Some(e.clone()),
                Ok(u) if !u.no_optimize => {
                    Some("no trap-free path in this uprobe-run (it has no --no-optimize switch)".into())
                }
                Ok(_) => None,
            },
            Engine::Kernel => self.kernel.unavailable(),
            _ => None,
        }
    }

    /// Makes one run of `job`.
    pub fn run(&self, job: &Job) -> Result<Measurement, Failure> {
        if let Some(reason) = self.unavailable(job.engine) {
            return Err(Failure::Unavailable(reason));
        }
        let stdout = self.scratch.join("run.stdout");
        match job.engine {
            Engine::None | Engine::Sigtrap => plain::run(&self.fixture, job, &stdout),
            Engine::Int3 | Engine::Jump => {
                let u = self.uprobe_run.as_ref().map_err(|e| Failure::Unavailable(e.clone()))?;
                u.run_loop(&self.fixture, job, &self.scratch)
            }
            Engine::Kernel => self.kernel.run(&self.fixture, job, &stdout),
            Engine::Ptrace | Engine::PtraceOol | Engine::PtraceXcpu => ptrace::run(&self.fixture, job, &stdout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_fixture_report() {
        let m = parse_report("noise\nelapsed_ns=1000 calls=10 threads=2 rss_kb=1400 sink=5\n").unwrap();
        assert_eq!(m, Measurement { elapsed_ns: 1000, calls: 10, threads: 2, rss_kb: 1400, strategy: None });
        assert_eq!(m.ns_per_call(), 100.0);
        assert!(parse_report("").is_err());
        assert!(parse_report("elapsed_ns=1 calls=x").is_err());
    }

    #[test]
    fn fixture_arguments_per_kind() {
        let job = Job { engine: Engine::Kernel, kind: Kind::Entry, function: "f_lea", threads: 2, hits: 100 };
        assert_eq!(fixture_args(&job), ["loop", "f_lea", "100", "2"]);
        let trap = Job { engine: Engine::Sigtrap, kind: Kind::Trap, ..job };
        assert_eq!(fixture_args(&trap), ["sigtrap", "100", "2"]);
    }

    #[test]
    fn hit_checks() {
        assert_eq!(check_hits("x", 3, 3), Ok(()));
        assert!(matches!(check_hits("x", 2, 3), Err(Failure::Invalid(_))));
    }
}
