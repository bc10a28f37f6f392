//! `int3` and `jump`: the fixture run under `uprobe-run` with `bench_handler.so`, which
//! registers the probe, counts hits with relaxed atomic adds and prints the counts at exit.
//! `int3` passes `--no-optimize` when uprobe-run has it (trap path forced); `jump` runs with
//! the default strategy and exists only once that switch does.

use super::{
    check_hits, describe_exit, fixture_args, key_values, parse_report, run_command, Engine, Failure, Finished, Job,
    Measurement,
};
use crate::fixture::{Fixture, Paths};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A built uprobe-run and what it supports.
#[derive(Clone, Debug)]
pub struct UprobeRun {
    pub bin: PathBuf,
    pub lib: PathBuf,
    pub handler: PathBuf,
    /// uprobe-run accepts `--no-optimize` (the trap-free path exists and can be turned off).
    pub no_optimize: bool,
    /// uprobe-run accepts `--verbose` (it reports the strategy of each probe).
    pub verbose: bool,
}

/// What bench_handler.so printed at exit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HandlerReport {
    pub entries: u64,
    pub returns: u64,
    pub others: u64,
    pub registered: u64,
    pub failed: u64,
    /// (errno, registrations that failed with it)
    pub failed_by_errno: Vec<(i32, u64)>,
}

/// The runtime's own counters of one run (`uprobe-run --stats`): what placing the probes cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeStats {
    pub placement_ms: f64,
    pub batches: u64,
    pub points: u64,
    pub jumps: u64,
    pub syscalls: u64,
    /// "mprotect 3, membarrier 4, ...": the system calls by kind.
    pub syscalls_by_kind: String,
    pub maps_reads: u64,
    pub traps_in_runtime: u64,
}

impl RuntimeStats {
    /// Parses the `uprobe-run: stats: ...` line.
    pub fn parse(output: &str) -> Option<RuntimeStats> {
        let line = output.lines().rev().find_map(|l| l.strip_prefix("uprobe-run: stats: "))?;
        let after = |key: &str| -> Option<&str> { line.find(key).map(|at| line[at + key.len()..].trim_start()) };
        let number = |key: &str| -> Option<f64> {
            after(key)?.split(|c: char| !c.is_ascii_digit() && c != '.').next()?.parse().ok()
        };
        let by_kind = after("syscalls ")
            .and_then(|rest| rest.split_once('(').filter(|(n, _)| !n.contains(';')))
            .map(|(_, rest)| rest.split(')').next().unwrap_or("").to_string())
            .unwrap_or_default();
        Some(RuntimeStats {
            placement_ms: number("placement ")?,
            batches: number("ms in ")? as u64,
            points: number("batches, ")? as u64,
            jumps: number("armed (")? as u64,
            syscalls: number("syscalls ")? as u64,
            syscalls_by_kind: by_kind,
            maps_reads: number("maps reads ")? as u64,
            traps_in_runtime: number("SIGTRAPs in the runtime ")? as u64,
        })
    }
}

impl HandlerReport {
    pub fn parse(output: &str) -> Option<HandlerReport> {
        let line = output.lines().rev().find(|l| l.starts_with("entries="))?;
        let kv = key_values(line);
        let get = |k: &str| kv.get(k)?.parse().ok();
        let failed_by_errno = output
            .lines()
            .filter(|l| l.starts_with("failed_errno="))
            .filter_map(|l| {
                let kv = key_values(l);
                Some((kv.get("failed_errno")?.parse().ok()?, kv.get("count")?.parse().ok()?))
            })
            .collect();
        Some(HandlerReport {
            entries: get("entries")?,
            returns: get("returns")?,
            others: get("others")?,
            registered: get("registered")?,
            failed: get("failed")?,
            failed_by_errno,
        })
    }
}

/// One run of the idle fixture under uprobe-run.
#[derive(Clone, Debug)]
pub struct IdleRun {
    /// From starting uprobe-run to its exit.
    pub wall: Duration,
    pub rss_kb: u64,
    pub handler: HandlerReport,
    /// The runtime's counters, where this uprobe-run prints them (`--stats`).
    pub stats: Option<RuntimeStats>,
    /// How many processes wrote bench_handler's report (forked children write their own).
    pub reports: usize,
}

/// The symbolic name of an errno value.
pub fn errno_name(errno: i32) -> String {
    uprobe_contracts::errno::name(errno).map_or_else(|| format!("errno {errno}"), str::to_owned)
}

/// Turns the handler's `error=CALL(SYM): RESULT` line into a reason.
pub fn explain_handler_error(line: &str) -> String {
    let Some((call, result)) = line.rsplit_once(": ") else {
        return line.to_owned();
    };
    let Ok(rc) = result.trim().parse::<i32>() else {
        return line.to_owned();
    };
    let call_name = call.split('(').next().unwrap_or(call);
    if rc == -libc::ENOSYS && call_name == "register_uretprobe" {
        return "register_uretprobe: -ENOSYS (return probes not implemented)".into();
    }
    if rc < 0 {
        format!("{call}: -{}", errno_name(-rc))
    } else {
        format!("{call}: {rc}")
    }
}

/// The strategy in a `--verbose` line `uprobe-run: probe at 0x... (f+0x0): jump` (or
/// `...: int3 (reason)`).
pub fn probe_strategy(output: &str) -> Option<String> {
    output.lines().find_map(|l| {
        let rest = &l[l.find("probe at ")?..];
        Some(rest.split_once("): ")?.1.trim().to_owned())
    })
}

fn first_error_line(text: &str) -> Option<&str> {
    text.lines().map(str::trim).find(|l| l.starts_with("error"))
}

impl UprobeRun {
    /// Brings target/release/uprobe-run and libuprobe.so up to date with `cargo build
    /// --release` in the workspace (unless `skip_build`), so that a stale build is never
    /// measured; if the build fails, binaries from an earlier build are used with a warning.
    pub fn prepare(paths: &Paths, fixture: &Fixture, skip_build: bool) -> Result<UprobeRun, String> {
        let handler = fixture.handler.clone()?;
        let bin = paths.release.join("uprobe-run");
        let lib = paths.release.join("libuprobe.so");
        if !skip_build {
            eprintln!("hitcost: cargo build --release (uprobe-run and libuprobe.so)");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let out = Command::new(cargo)
                .args(["build", "--release"])
                .current_dir(&paths.root)
                .output()
                .map_err(|e| format!("cannot run cargo build --release: {e}"))?;
            if !out.status.success() {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let why =
                    format!("cargo build --release failed: {}", first_error_line(&stderr).unwrap_or("(no error line)"));
                if !(bin.exists() && lib.exists()) {
                    return Err(why);
                }
                eprintln!("hitcost: warning: {why}; measuring the binaries of an earlier build");
            }
        }
        for needed in [&bin, &lib] {
            if !needed.exists() {
                return Err(format!("{} does not exist after cargo build --release", needed.display()));
            }
        }
        let help =
            Command::new(&bin).arg("--help").output().map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let help = String::from_utf8_lossy(&help.stdout) + String::from_utf8_lossy(&help.stderr);
        Ok(UprobeRun {
            no_optimize: help.contains("--no-optimize"),
            verbose: help.contains("--verbose"),
            bin,
            lib,
            handler,
        })
    }

    fn command(&self, output: &Path) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.env("UPROBE_LIB", &self.lib).arg("--handlers").arg(&self.handler).arg("-o").arg(output);
        cmd
    }

    /// Runs the hit loop of `job` with the probe of `job.kind` on `job.function`.
    pub fn run_loop(&self, fixture: &Fixture, job: &Job, scratch: &Path) -> Result<Measurement, Failure> {
        let output = scratch.join("uprobe-run.out");
        let mut cmd = self.command(&output);
        if job.engine == Engine::Int3 && self.no_optimize {
            cmd.arg("--no-optimize");
        }
        if self.verbose {
            cmd.arg("--verbose");
        }
        cmd.arg("--param")
            .arg(format!("func={}", job.function))
            .arg("--param")
            .arg(format!("kind={}", job.kind.name()))
            .arg("--")
            .arg(&fixture.program)
            .args(fixture_args(job));
        let (finished, report, counts) = run_with_handler(&mut cmd, &output, scratch)?;
        let expected = job.hits * u64::from(job.threads);
        if job.kind.has_entry() {
            check_hits("entry handler", counts.entries, expected)?;
        }
        if job.kind.has_return() {
            check_hits("return handler", counts.returns, expected)?;
        }
        let mut m = parse_report(&finished.stdout).map_err(Failure::Invalid)?;
        m.strategy = probe_strategy(&report);
        Ok(m)
    }

    /// Runs the idle fixture with the handler given `params` (NAME, VALUE), with
    /// `--no-optimize` if asked.
    pub fn run_idle(
        &self,
        fixture: &Fixture,
        params: &[(&str, String)],
        no_optimize: bool,
        scratch: &Path,
    ) -> Result<IdleRun, Failure> {
        self.run_mode(fixture, params, no_optimize, &["idle"], scratch).map(|(run, _)| run)
    }

    /// The fixture run with `args` (a mode of `hitloop`) under uprobe-run and bench_handler
    /// with `params`; also the fixture's own report.
    pub fn run_mode(
        &self,
        fixture: &Fixture,
        params: &[(&str, String)],
        no_optimize: bool,
        args: &[&str],
        scratch: &Path,
    ) -> Result<(IdleRun, Measurement), Failure> {
        let output = scratch.join("uprobe-run.out");
        let mut cmd = self.command(&output);
        if no_optimize {
            cmd.arg("--no-optimize");
        }
        for (name, value) in params {
            cmd.arg("--param").arg(format!("{name}={value}"));
        }
        cmd.arg("--stats").arg("--").arg(&fixture.program).args(args);
        let (finished, report, handler) = run_with_handler(&mut cmd, &output, scratch)?;
        let m = parse_report(&finished.stdout).map_err(Failure::Invalid)?;
        let reports = report.lines().filter(|l| l.starts_with("entries=")).count();
        let stats = RuntimeStats::parse(&report);
        Ok((IdleRun { wall: finished.wall, rss_kb: m.rss_kb, handler, stats, reports }, m))
    }
}

/// Runs `cmd` (uprobe-run with bench_handler writing to `output`) and reads the handler's
/// report: a registration error makes the row unavailable; a failed run or a report without
/// counts makes it invalid.
fn run_with_handler(
    cmd: &mut Command,
    output: &Path,
    scratch: &Path,
) -> Result<(Finished, String, HandlerReport), Failure> {
    let finished = run_command(cmd, &scratch.join("run.stdout")).map_err(Failure::Invalid)?;
    let report = fs::read_to_string(output).unwrap_or_default();
    if let Some(line) = report.lines().find_map(|l| l.strip_prefix("error=")) {
        return Err(Failure::Unavailable(explain_handler_error(line)));
    }
    if !finished.status.success() {
        return Err(Failure::Invalid(describe_exit("uprobe-run", &finished)));
    }
    let counts = HandlerReport::parse(&report)
        .ok_or_else(|| Failure::Invalid(format!("bench_handler printed no counts (output: {:?})", report.trim())))?;
    Ok((finished, report, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_stats_line() {
        let out = "x\nuprobe-run: stats: placement 17.531 ms in 1 batches, 2168 points armed (2076 jumps), syscalls 55 (read 4, mprotect 3, membarrier 4); maps reads 1; SIGTRAPs in the runtime 0\n";
        let s = RuntimeStats::parse(out).unwrap();
        assert_eq!(
            (s.batches, s.points, s.jumps, s.syscalls, s.maps_reads, s.traps_in_runtime),
            (1, 2168, 2076, 55, 1, 0)
        );
        assert_eq!(s.syscalls_by_kind, "read 4, mprotect 3, membarrier 4");
        assert!((s.placement_ms - 17.531).abs() < 1e-9);
        assert_eq!(RuntimeStats::parse("no stats"), None);
    }

    #[test]
    fn handler_report_with_errno_lines() {
        let out = "noise\nentries=10 returns=0 others=3 registered=5 failed=2\n\
                   failed_errno=22 count=1\nfailed_errno=16 count=1\n";
        let r = HandlerReport::parse(out).unwrap();
        assert_eq!(r.entries, 10);
        assert_eq!(r.others, 3);
        assert_eq!((r.registered, r.failed), (5, 2));
        assert_eq!(r.failed_by_errno, vec![(22, 1), (16, 1)]);
        assert_eq!(HandlerReport::parse("nothing"), None);
    }

    #[test]
    fn verbose_strategy_lines() {
        assert_eq!(probe_strategy("x\nuprobe-run: probe at 0x55d0 (f_lea+0x0): jump\nentries=1"), Some("jump".into()));
        assert_eq!(
            probe_strategy("uprobe-run: probe at 0x1 (f+0x0): int3 (jump probes disabled (--no-optimize))"),
            Some("int3 (jump probes disabled (--no-optimize))".into())
        );
        assert_eq!(probe_strategy("entries=1"), None);
    }

    #[test]
    fn handler_errors_are_explained() {
        assert_eq!(
            explain_handler_error("register_uretprobe(f_push): -38"),
            "register_uretprobe: -ENOSYS (return probes not implemented)"
        );
        assert_eq!(explain_handler_error("register_uprobe(f_lea): -22"), "register_uprobe(f_lea): -EINVAL");
        assert_eq!(explain_handler_error("odd"), "odd");
    }
}
