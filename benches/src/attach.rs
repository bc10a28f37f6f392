//! Attach rows: `uprobe-run --pid` on a running `hitloop wait` (blocked in `read`), with the
//! bench handler placing 1, 100 or every libc.so.6 function entry. Each run starts a fresh
//! process, so attaching includes loading the runtime into it. Measured:
//! - attach: wall time from starting `uprobe-run --pid` to its line saying the probes are in
//!   place; detach: from SIGINT to `uprobe-run` having exited (the process runs clean);
//! - the pause: how long the process's threads were held stopped, as `uprobe-run --verbose`
//!   reports it (from the first PTRACE_INTERRUPT to the last PTRACE_DETACH of each stop).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::engines::uprobe_run::UprobeRun;
use crate::engines::{parse_report, Failure};
use crate::fixture::Fixture;
use crate::json::{obj, opt_num, text};
use crate::stats::Summary;
use crate::sys;
use serde_json::Value;

/// How long one attach or detach may take before the run counts as failed.
const TIMEOUT: Duration = Duration::from_secs(60);

/// One attach row: every run of one probe set.
#[derive(Clone, Debug)]
pub struct AttachRow {
    pub label: String,
    /// The bench handler's parameters.
    pub params: Vec<(&'static str, String)>,
    pub no_optimize: bool,
    pub attach_ms: Vec<f64>,
    pub attach_pause_ms: Vec<f64>,
    pub detach_ms: Vec<f64>,
    pub detach_pause_ms: Vec<f64>,
    /// Probes placed and jumps among them (last run).
    pub placed: Option<(u64, u64)>,
    pub failure: Option<Failure>,
}

impl AttachRow {
    pub fn new(label: String, params: Vec<(&'static str, String)>, no_optimize: bool) -> AttachRow {
        AttachRow {
            label,
            params,
            no_optimize,
            attach_ms: Vec::new(),
            attach_pause_ms: Vec::new(),
            detach_ms: Vec::new(),
            detach_pause_ms: Vec::new(),
            placed: None,
            failure: None,
        }
    }
}

/// One run's figures.
struct Sample {
    attach_ms: f64,
    attach_pause_ms: f64,
    detach_ms: f64,
    detach_pause_ms: f64,
    probes: u64,
    jumps: u64,
}

/// The number right after `key` in `line`.
fn number_after(line: &str, key: &str) -> Option<f64> {
    let at = line.find(key)? + key.len();
    line[at..].split(|c: char| !c.is_ascii_digit() && c != '.').next()?.parse().ok()
}

/// `(probes, jumps, pause ms)` of `uprobe-run: attached to process ... in X ms: L handler
/// library, N probes (J jumps); threads held T ms in K stops`.
pub fn parse_attached(line: &str) -> Option<(u64, u64, f64)> {
    let rest = line.strip_prefix("uprobe-run: attached to process ")?;
    let placed = rest.split(", ").nth(1)?;
    let probes = placed.split(' ').next()?.parse().ok()?;
    Some((probes, number_after(placed, "(")? as u64, number_after(placed, "threads held ")?))
}

/// The pause of `uprobe-run: detached from process ... threads held T ms in K stops`.
pub fn parse_detached(line: &str) -> Option<f64> {
    number_after(line.strip_prefix("uprobe-run: detached from process ")?, "threads held ")
}

/// Attaches to a fresh `hitloop wait` as `row` says, then detaches.
fn run_once(u: &UprobeRun, fixture: &Fixture, row: &AttachRow, scratch: &Path) -> Result<Sample, Failure> {
    let invalid = |what: String| Failure::Invalid(what);
    let stdout = std::fs::File::create(scratch.join("wait.stdout")).map_err(|e| invalid(e.to_string()))?;
    let mut target = Command::new(&fixture.program)
        .arg("wait")
        .stdin(Stdio::piped())
        .stdout(stdout)
        .spawn()
        .map_err(|e| invalid(format!("cannot start the fixture: {e}")))?;
    // Until the fixture runs its own code (blocked in read).
    let start = Instant::now();
    let syscall = format!("/proc/{}/syscall", target.id());
    while !std::fs::read_to_string(&syscall).unwrap_or_default().starts_with("0 ") {
        if start.elapsed() > TIMEOUT {
            let _ = target.kill();
            return Err(invalid("the fixture never blocked in read".into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let output = scratch.join("attach.out");
    let mut cmd = Command::new(&u.bin);
    cmd.env("UPROBE_LIB", &u.lib).arg("--pid").arg(target.id().to_string()).arg("-v");
    if row.no_optimize {
        cmd.arg("--no-optimize");
    }
    cmd.arg("--handlers").arg(&u.handler).arg("-o").arg(&output);
    for (name, value) in &row.params {
        cmd.arg("--param").arg(format!("{name}={value}"));
    }
    let started = Instant::now();
    let mut session = cmd.stdin(Stdio::null()).stderr(Stdio::piped()).spawn().map_err(|e| invalid(e.to_string()))?;
    let (tx, rx) = channel();
    let stderr = session.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let wait_for = |prefix: &str, seen: &mut Vec<String>| -> Result<String, Failure> {
        loop {
            match rx.recv_timeout(TIMEOUT) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(line) => seen.push(line),
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    return Err(Failure::Invalid(format!("uprobe-run --pid: no {prefix:?} line: {}", seen.join(" | "))))
                }
            }
        }
    };
    let result = (|| {
        let attached = wait_for("uprobe-run: attached to process", &mut seen)?;
        let attach_ms = started.elapsed().as_secs_f64() * 1e3;
        let (probes, jumps, attach_pause_ms) =
            parse_attached(&attached).ok_or_else(|| Failure::Invalid(format!("unreadable: {attached}")))?;
        let detach_start = Instant::now();
        sys::signal(session.id() as i32, libc::SIGINT)
            .map_err(|e| Failure::Invalid(format!("cannot send SIGINT to uprobe-run: {e}")))?;
        let detached = wait_for("uprobe-run: detached from process", &mut seen)?;
        let status = session.wait().map_err(|e| Failure::Invalid(e.to_string()))?;
        let detach_ms = detach_start.elapsed().as_secs_f64() * 1e3;
        if !status.success() {
            return Err(Failure::Invalid(format!("uprobe-run --pid: {status}: {}", seen.join(" | "))));
        }
        let detach_pause_ms =
            parse_detached(&detached).ok_or_else(|| Failure::Invalid(format!("unreadable: {detached}")))?;
        Ok(Sample { attach_ms, attach_pause_ms, detach_ms, detach_pause_ms, probes, jumps })
    })();
    let _ = session.kill();
    let _ = session.wait();
    // The fixture ends with its input and says it still runs normally.
    drop(target.stdin.take());
    let ended = target.wait().map_err(|e| invalid(e.to_string()))?;
    let sample = result?;
    if !ended.success() {
        return Err(invalid(format!("the fixture ended badly after the detach: {ended}")));
    }
    parse_report(&std::fs::read_to_string(scratch.join("wait.stdout")).unwrap_or_default()).map_err(invalid)?;
    Ok(sample)
}

/// Runs every row `runs` times (interleaved).
pub fn measure(u: &Result<UprobeRun, String>, fixture: &Fixture, rows: &mut [AttachRow], runs: usize, scratch: &Path) {
    let u = match u {
        Ok(u) => u,
        Err(e) => {
            for row in rows.iter_mut() {
                row.failure = Some(Failure::Unavailable(e.clone()));
            }
            return;
        }
    };
    for pass in 1..=runs {
        for row in rows.iter_mut().filter(|r| r.failure.is_none()) {
            match run_once(u, fixture, row, scratch) {
                Ok(s) => {
                    eprintln!(
                        "hitcost: [{pass}/{runs}] attach {:<42} attach {:>8.2} ms (pause {:.3} ms)  detach {:>8.2} ms (pause {:.3} ms)",
                        row.label, s.attach_ms, s.attach_pause_ms, s.detach_ms, s.detach_pause_ms
                    );
                    row.attach_ms.push(s.attach_ms);
                    row.attach_pause_ms.push(s.attach_pause_ms);
                    row.detach_ms.push(s.detach_ms);
                    row.detach_pause_ms.push(s.detach_pause_ms);
                    row.placed = Some((s.probes, s.jumps));
                }
                Err(f) => {
                    eprintln!("hitcost: attach {}: {}", row.label, f.reason());
                    row.failure = Some(f);
                }
            }
        }
    }
}

fn median(samples: &[f64]) -> Option<f64> {
    Summary::of(samples).map(|s| s.median)
}

/// The rows as the report's section.
pub fn table(rows: &[AttachRow], runs: usize) -> String {
    let mut t = String::new();
    if rows.is_empty() {
        return t;
    }
    let _ = writeln!(
        t,
        "\nAttach and detach (`uprobe-run --pid` on a fresh `hitloop wait`, median of {runs}; pause: threads held stopped):"
    );
    let _ = writeln!(t, "  {:<44} {:>10} {:>10} {:>10} {:>10}  placed", "", "attach", "pause", "detach", "pause");
    for r in rows {
        let _ = write!(t, "  {:<44}", r.label);
        if let Some(f) = &r.failure {
            let kind = if matches!(f, Failure::Unavailable(_)) { "unavailable" } else { "invalid" };
            let _ = writeln!(t, " {kind}: {}", f.reason());
            continue;
        }
        let ms = |v: &[f64]| median(v).map_or("-".into(), |m| format!("{m:.2} ms"));
        let _ = write!(
            t,
            " {:>10} {:>10} {:>10} {:>10}",
            ms(&r.attach_ms),
            ms(&r.attach_pause_ms),
            ms(&r.detach_ms),
            ms(&r.detach_pause_ms)
        );
        if let Some((probes, jumps)) = r.placed {
            let s = |n: u64| if n == 1 { "" } else { "s" };
            let _ = write!(t, "  {probes} probe{} ({jumps} jump{})", s(probes), s(jumps));
        }
        let _ = writeln!(t);
    }
    t
}

/// The rows for `hitcost.json`.
pub fn to_json(rows: &[AttachRow]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                let mut o = vec![("label", text(&r.label)), ("no_optimize", Value::Bool(r.no_optimize))];
                if let Some(f) = &r.failure {
                    o.push(("reason", text(f.reason())));
                }
                for (key, samples) in [
                    ("attach_ms", &r.attach_ms),
                    ("attach_pause_ms", &r.attach_pause_ms),
                    ("detach_ms", &r.detach_ms),
                    ("detach_pause_ms", &r.detach_pause_ms),
                ] {
                    o.push((key, opt_num(median(samples))));
                }
                if let Some((probes, jumps)) = r.placed {
                    o.push(("probes", Value::from(probes as i64)));
                    o.push(("jumps", Value::from(jumps as i64)));
                }
                obj(o)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbose_lines_parse() {
        let attached = "uprobe-run: attached to process 42 (/x/hitloop) in 36.749 ms: 1 handler library, 2591 probes (2483 jumps); threads held 1.119 ms in 2 stops";
        assert_eq!(parse_attached(attached), Some((2591, 2483, 1.119)));
        let detached =
            "uprobe-run: detached from process 42 in 5.284 ms: 2591 probes removed; threads held 0.572 ms in 1 stop";
        assert_eq!(parse_detached(detached), Some(0.572));
        assert_eq!(parse_attached(detached), None);
    }
}
