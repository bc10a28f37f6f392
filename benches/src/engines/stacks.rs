//! The stack rows (`HITCOST_ONLY=stacks`): what a whole user stack costs at a hit. The
//! fixture calls `f_push` through a chain of distinct functions (`hitloop chain`, built
//! `-O2 -fomit-frame-pointer`), so that its stack is exactly as deep as asked, and is run:
//! alone; under `uprobe-run --count` and `--count --by ustack` (jump probe); with the
//! kernel's uprobe recorded by `perf record --call-graph dwarf` (a 64 MiB buffer, so that
//! no sample is lost); and with `bpftrace -e 'uprobe:...:f_push { @[ustack] = count(); }'`.
//!
//! Every figure is CPU time of the looping thread (user and system: the kernel's uprobe, the
//! BPF program and perf's copy of the stack run there), from the fixture's `cpu_ns`: a
//! loaded machine inflates wall time by every time slice another process takes. Every run
//! checks its result: uprobe-run's count and the depth of its one stack, perf's samples,
//! bpftrace's counts; perf's and bpftrace's stacks are described (how many frames they
//! gave), not required to be right.

use super::uprobe_run::UprobeRun;
use super::{check_hits, describe_exit, key_values, run_command, Failure, Finished};
use crate::fixture::Fixture;
use std::fs;
use std::path::Path;
use std::process::Command;

/// The stack depths measured.
pub const DEPTHS: [usize; 2] = [8, 30];
/// The longest chain `hitloop chain` has.
const MAX_CHAIN: usize = 40;
const GROUP: &str = "hitcost_stacks";
const TRACEFS: &str = "/sys/kernel/tracing";

/// One run's CPU ns per call, and what the tool said about its stacks.
#[derive(Clone, Debug, PartialEq)]
pub struct StackRun {
    pub cpu_ns_per_call: f64,
    pub note: Option<String>,
}

/// CPU ns per call from the fixture's report line.
fn cpu_per_call(stdout: &str) -> Result<f64, Failure> {
    let line = stdout.lines().rev().find(|l| l.starts_with("elapsed_ns="));
    let kv = line.map(key_values).unwrap_or_default();
    let get = |k: &str| kv.get(k).and_then(|v| v.parse::<u64>().ok());
    match (get("cpu_ns"), get("calls")) {
        (Some(cpu), Some(calls)) if calls > 0 => Ok(cpu as f64 / calls as f64),
        _ => Err(Failure::Invalid(format!("the fixture printed no cpu_ns/calls report (stdout: {:?})", stdout.trim()))),
    }
}

fn chain_args(hits: u64, chain: usize) -> Vec<String> {
    vec!["chain".into(), "f_push".into(), hits.to_string(), chain.to_string()]
}

fn finished_ok(what: &str, finished: &Finished) -> Result<(), Failure> {
    if finished.status.success() {
        Ok(())
    } else {
        Err(Failure::Invalid(describe_exit(what, finished)))
    }
}

/// The fixture alone, `hits` calls through `chain` functions.
pub fn run_plain(fixture: &Fixture, hits: u64, chain: usize, scratch: &Path) -> Result<StackRun, Failure> {
    let mut cmd = Command::new(&fixture.program);
    cmd.args(chain_args(hits, chain));
    let finished = run_command(&mut cmd, &scratch.join("run.stdout")).map_err(Failure::Invalid)?;
    finished_ok("fixture", &finished)?;
    Ok(StackRun { cpu_ns_per_call: cpu_per_call(&finished.stdout)?, note: None })
}

/// The count and the frames of each key of uprobe-run's JSON count report.
fn json_counts(report: &str) -> Result<(u64, Vec<usize>), Failure> {
    let mut total = None;
    let mut keys = Vec::new();
    for line in report.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| Failure::Invalid(format!("uprobe-run's report: {e}: {line}")))?;
        if v["kind"] != "count" {
            continue;
        }
        match v.get("key") {
            Some(serde_json::Value::Array(frames)) => keys.push(frames.len()),
            _ => total = v["count"].as_u64(),
        }
    }
    let total = total.ok_or_else(|| Failure::Invalid(format!("no count report in {:?}", report.trim())))?;
    Ok((total, keys))
}

/// `uprobe-run --count [--by ustack] -e 'p:hitcost/f_push PROGRAM:OFFSET'` over `hits` calls
/// through `chain` functions: checks the count and, with `ustack`, that there is one stack
/// (its depth returned as the note's number).
fn run_ours(
    u: &UprobeRun,
    fixture: &Fixture,
    hits: u64,
    chain: usize,
    ustack: bool,
    scratch: &Path,
) -> Result<(StackRun, Option<usize>), Failure> {
    let f = fixture.function("f_push");
    let def = format!("p:hitcost/f_push {}:{:#x}", fixture.program.display(), f.file_offset);
    let output = scratch.join("stacks.out");
    let mut cmd = Command::new(&u.bin);
    cmd.env("UPROBE_LIB", &u.lib).arg("-o").arg(&output).args(["--format", "json", "--count"]);
    if ustack {
        cmd.args(["--by", "ustack"]);
    }
    cmd.args(["-e", &def, "--"]).arg(&fixture.program).args(chain_args(hits, chain));
    let finished = run_command(&mut cmd, &scratch.join("run.stdout")).map_err(Failure::Invalid)?;
    let report = fs::read_to_string(&output).unwrap_or_default();
    let _ = fs::remove_file(&output);
    finished_ok("uprobe-run", &finished)?;
    let (total, keys) = json_counts(&report)?;
    check_hits("uprobe-run --count", total, hits)?;
    let depth = match (ustack, keys.as_slice()) {
        (false, _) => None,
        (true, [depth]) => Some(*depth),
        (true, _) => return Err(Failure::Invalid(format!("{} stacks, expected one", keys.len()))),
    };
    Ok((StackRun { cpu_ns_per_call: cpu_per_call(&finished.stdout)?, note: None }, depth))
}

/// How many chain functions give `f_push` a stack `depth` frames deep: one short run of
/// `--by ustack` without a chain tells how deep the stack is below it.
pub fn chain_for(u: &UprobeRun, fixture: &Fixture, depth: usize, scratch: &Path) -> Result<usize, Failure> {
    let (_, below) = run_ours(u, fixture, 1_000, 0, true, scratch)?;
    let below = below.unwrap_or(0);
    depth
        .checked_sub(below)
        .filter(|&n| n <= MAX_CHAIN)
        .ok_or_else(|| Failure::Unavailable(format!("f_push's stack is {below} frames deep without a chain")))
}

/// `uprobe-run --count`, without a key.
pub fn run_count(
    u: &UprobeRun,
    fixture: &Fixture,
    hits: u64,
    chain: usize,
    scratch: &Path,
) -> Result<StackRun, Failure> {
    run_ours(u, fixture, hits, chain, false, scratch).map(|r| r.0)
}

/// `uprobe-run --count --by ustack`; the one stack must be `depth` frames deep.
pub fn run_ustack(
    u: &UprobeRun,
    fixture: &Fixture,
    hits: u64,
    chain: usize,
    depth: usize,
    scratch: &Path,
) -> Result<StackRun, Failure> {
    let (run, got) = run_ours(u, fixture, hits, chain, true, scratch)?;
    match got {
        Some(d) if d == depth => Ok(run),
        _ => Err(Failure::Invalid(format!("a stack of {got:?} frames, expected {depth}"))),
    }
}

fn tracefs_append(file: &str, line: &str) -> Result<(), String> {
    use std::io::Write;
    fs::OpenOptions::new()
        .append(true)
        .open(Path::new(TRACEFS).join(file))
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
        .map_err(|e| format!("{TRACEFS}/{file}: {e}"))
}

/// The number in perf record's `(N samples)`.
fn perf_samples(stderr: &str) -> Option<u64> {
    let at = stderr.rfind(" samples)")?;
    stderr[..at].rsplit('(').next()?.trim().parse().ok()
}

/// The kernel's uprobe on `f_push` (defined in tracefs) recorded by `perf record
/// --call-graph dwarf -m 64M`; every hit must be a sample written.
pub fn run_perf(fixture: &Fixture, hits: u64, chain: usize, scratch: &Path) -> Result<StackRun, Failure> {
    let f = fixture.function("f_push");
    let def = format!("p:{GROUP}/f_push {}:{:#x}", fixture.program.display(), f.file_offset);
    let _ = tracefs_append("uprobe_events", &format!("-:{GROUP}/f_push"));
    tracefs_append("uprobe_events", &def).map_err(Failure::Unavailable)?;
    let data = scratch.join("stacks-perf.data");
    let result = (|| {
        let mut cmd = Command::new("perf");
        cmd.args(["record", "-e", &format!("{GROUP}:f_push"), "--call-graph", "dwarf", "-m", "64M", "-o"]);
        cmd.arg(&data).arg("--").arg(&fixture.program).args(chain_args(hits, chain));
        let finished = run_command(&mut cmd, &scratch.join("run.stdout")).map_err(Failure::Unavailable)?;
        finished_ok("perf record", &finished)?;
        let samples = perf_samples(&finished.stderr).ok_or_else(|| {
            Failure::Invalid(format!("perf record said no sample count: {:?}", finished.stderr.trim()))
        })?;
        check_hits("perf record's samples", samples, hits)?;
        let size = fs::metadata(&data).map(|m| m.len()).unwrap_or(0);
        let note = format!("{samples} samples, {:.1} KiB each", size as f64 / 1024.0 / samples.max(1) as f64);
        Ok(StackRun { cpu_ns_per_call: cpu_per_call(&finished.stdout)?, note: Some(note) })
    })();
    let _ = fs::remove_file(&data);
    let _ = tracefs_append("uprobe_events", &format!("-:{GROUP}/f_push"));
    result
}

/// The keys bpftrace printed for `@`: (frames, count) of each.
fn bpftrace_keys(out: &str) -> Vec<(usize, u64)> {
    let mut keys = Vec::new();
    let mut frames = None;
    for line in out.lines() {
        let line = line.trim();
        if line == "@[" {
            frames = Some(0);
        } else if let Some(count) = line.strip_prefix("]: ") {
            if let (Some(n), Ok(c)) = (frames.take(), count.trim().parse()) {
                keys.push((n, c));
            }
        } else if let Some(n) = frames.as_mut() {
            *n += 1;
        }
    }
    keys
}

/// `bpftrace -e 'uprobe:PROGRAM:f_push { @[ustack] = count(); }' -c 'PROGRAM chain ...'`:
/// its counts must add up to the hits.
pub fn run_bpftrace(fixture: &Fixture, hits: u64, chain: usize, scratch: &Path) -> Result<StackRun, Failure> {
    let program = format!("uprobe:{}:f_push {{ @[ustack] = count(); }}", fixture.program.display());
    let command =
        std::iter::once(fixture.program.display().to_string()).chain(chain_args(hits, chain)).collect::<Vec<_>>();
    let mut cmd = Command::new("bpftrace");
    cmd.args(["-e", &program, "-c", &command.join(" ")]);
    let finished = run_command(&mut cmd, &scratch.join("run.stdout")).map_err(Failure::Unavailable)?;
    finished_ok("bpftrace", &finished)?;
    let keys = bpftrace_keys(&finished.stdout);
    check_hits("bpftrace's @[ustack]", keys.iter().map(|k| k.1).sum(), hits)?;
    let mut depths: Vec<usize> = keys.iter().map(|k| k.0).collect();
    depths.sort_unstable();
    depths.dedup();
    let shown: Vec<String> = depths.iter().map(usize::to_string).collect();
    let note = format!("{} stack{} of {} frames", keys.len(), if keys.len() == 1 { "" } else { "s" }, shown.join("/"));
    Ok(StackRun { cpu_ns_per_call: cpu_per_call(&finished.stdout)?, note: Some(note) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_read() {
        let out = "elapsed_ns=900 cpu_ns=500 calls=10 threads=1 rss_kb=1 sink=0\n";
        assert_eq!(cpu_per_call(out), Ok(50.0));
        assert!(cpu_per_call("elapsed_ns=900 calls=10").is_err());
        let json =
            "{\"kind\":\"count\",\"count\":7,\"keys\":1}\n{\"kind\":\"count\",\"key\":[\"a\",\"b\"],\"count\":7}\n";
        assert_eq!(json_counts(json), Ok((7, vec![2])));
        let err = "[ perf record: Captured and wrote 40.401 MB /tmp/perf.data (5000 samples) ]\n";
        assert_eq!(perf_samples(err), Some(5000));
        let bt =
            "Attaching 1 probe...\nelapsed_ns=1\n\n\n@[\n    0x55c0\n    0x5081\n    0x59f\n]: 99\n@[\n    0x1\n]: 1\n";
        assert_eq!(bpftrace_keys(bt), vec![(3, 99), (1, 1)]);
    }
}
