//! The aggregation rows (`HITCOST_ONLY=aggregate`): `uprobe-run --count` (an event counted per
//! thread) and `uprobe-run --latency` (entry and return timed with the TSC) on `f_push`,
//! through its jump probe, next to the floor of a handler-based entry+return probe
//! (`bench_handler.so kind=entry+return empty=1`: handlers that do next to nothing, with the
//! 16 bytes of `ri->data` `--latency` uses). Every run checks its count: the report's
//! `count`, or the handler's.

use super::uprobe_run::{HandlerReport, UprobeRun};
use super::{check_hits, describe_exit, parse_report, run_command, Failure, Finished, Measurement};
use crate::fixture::Fixture;
use std::fs;
use std::path::Path;
use std::process::Command;

/// The number after `"count":` in the first report line of `kind`.
fn reported_count(output: &str, kind: &str) -> Option<u64> {
    let line = output.lines().find(|l| l.contains(&format!("\"kind\":\"{kind}\"")))?;
    let rest = &line[line.find("\"count\":")? + "\"count\":".len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// `hitloop loop f_push HITS 1` under `uprobe-run --verbose -o OUT` with `options`: the run
/// and what it wrote to OUT; a run that failed is invalid.
fn run_loop(
    u: &UprobeRun,
    fixture: &Fixture,
    options: &[String],
    hits: u64,
    scratch: &Path,
) -> Result<(Finished, String), Failure> {
    let output = scratch.join("aggregate.out");
    let mut cmd = Command::new(&u.bin);
    cmd.env("UPROBE_LIB", &u.lib).arg("-o").arg(&output).arg("--verbose").args(options);
    cmd.arg("--").arg(&fixture.program).args(["loop", "f_push", &hits.to_string(), "1"]);
    let finished = run_command(&mut cmd, &scratch.join("run.stdout")).map_err(Failure::Invalid)?;
    let report = fs::read_to_string(&output).unwrap_or_default();
    let _ = fs::remove_file(&output);
    if !finished.status.success() {
        return Err(Failure::Invalid(describe_exit("uprobe-run", &finished)));
    }
    Ok((finished, report))
}

/// The fixture under uprobe-run with `options` (which print a JSON report), checking that
/// the report of `kind` counted `hits` and that the probe took the jump.
fn run_report(
    u: &UprobeRun,
    fixture: &Fixture,
    options: &[String],
    kind: &str,
    hits: u64,
    scratch: &Path,
) -> Result<Measurement, Failure> {
    let mut args: Vec<String> = ["--format", "json"].map(String::from).to_vec();
    args.extend_from_slice(options);
    let (finished, report) = run_loop(u, fixture, &args, hits, scratch)?;
    let counted = reported_count(&report, kind)
        .ok_or_else(|| Failure::Invalid(format!("no {kind} report in the output: {:?}", report.trim())))?;
    check_hits(&format!("uprobe-run's {kind} report"), counted, hits)?;
    let mut m = parse_report(&finished.stdout).map_err(Failure::Invalid)?;
    m.strategy = super::uprobe_run::probe_strategy(&report);
    Ok(m)
}

/// `uprobe-run --count -e 'p:hitcost/f_push PROGRAM:OFFSET'`.
pub fn run_count(u: &UprobeRun, fixture: &Fixture, hits: u64, scratch: &Path) -> Result<Measurement, Failure> {
    let f = fixture.function("f_push");
    let def = format!("p:hitcost/f_push {}:{:#x}", fixture.program.display(), f.file_offset);
    run_report(u, fixture, &["--count".into(), "-e".into(), def], "count", hits, scratch)
}

/// `uprobe-run --count` of `f_push` with a one-comparison filter on its argument (the loop's
/// index, below 4e9): with `pass`, every hit passes and is counted; without, none does. The
/// report's filter line must have seen every hit.
pub fn run_filtered(
    u: &UprobeRun,
    fixture: &Fixture,
    hits: u64,
    pass: bool,
    scratch: &Path,
) -> Result<Measurement, Failure> {
    let f = fixture.function("f_push");
    let op = if pass { "<" } else { ">=" };
    let def =
        format!("p:hitcost/f_push {}:{:#x} x=%di:u64 if x {op} 4000000000", fixture.program.display(), f.file_offset);
    let mut args: Vec<String> = ["--format", "json", "--count", "-e"].map(String::from).to_vec();
    args.push(def);
    let (finished, report) = run_loop(u, fixture, &args, hits, scratch)?;
    let number = |kind: &str, field: &str| -> Result<u64, Failure> {
        let line = report.lines().find(|l| l.contains(&format!("\"kind\":\"{kind}\"")));
        let rest = line.and_then(|l| l.split_once(&format!("\"{field}\":"))).map(|(_, r)| r);
        rest.and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
            .ok_or_else(|| Failure::Invalid(format!("no {kind} {field} in the output: {:?}", report.trim())))
    };
    check_hits("the filter's hits", number("filter", "hits")?, hits)?;
    check_hits("the hits counted", number("count", "count")?, if pass { hits } else { 0 })?;
    let mut m = parse_report(&finished.stdout).map_err(Failure::Invalid)?;
    m.strategy = super::uprobe_run::probe_strategy(&report);
    Ok(m)
}

/// `uprobe-run --count --by tid,caller` of `f_push`: a key of two parts (one key in all).
pub fn run_two_part_key(u: &UprobeRun, fixture: &Fixture, hits: u64, scratch: &Path) -> Result<Measurement, Failure> {
    let f = fixture.function("f_push");
    let def = format!("p:hitcost/f_push {}:{:#x}", fixture.program.display(), f.file_offset);
    let options = ["--count", "--by", "tid,caller", "-e", &def].map(String::from);
    run_report(u, fixture, &options, "count", hits, scratch)
}

/// `uprobe-run --latency PROGRAM:f_push`.
pub fn run_latency(u: &UprobeRun, fixture: &Fixture, hits: u64, scratch: &Path) -> Result<Measurement, Failure> {
    let place = format!("{}:f_push", fixture.program.display());
    run_report(u, fixture, &["--latency".into(), place], "latency", hits, scratch)
}

/// An entry+return probe on `f_push` whose handlers do next to nothing.
pub fn run_empty(u: &UprobeRun, fixture: &Fixture, hits: u64, scratch: &Path) -> Result<Measurement, Failure> {
    let handler = fixture.handler.clone().map_err(Failure::Unavailable)?;
    let mut args = vec!["--handlers".to_string(), handler.display().to_string()];
    for p in ["func=f_push", "kind=entry+return", "empty=1"] {
        args.extend(["--param".to_string(), p.to_string()]);
    }
    let (finished, report) = run_loop(u, fixture, &args, hits, scratch)?;
    let counts = HandlerReport::parse(&report)
        .ok_or_else(|| Failure::Invalid(format!("bench_handler printed no counts: {:?}", report.trim())))?;
    check_hits("the empty entry handler", counts.entries, hits)?;
    check_hits("the empty return handler", counts.returns, hits)?;
    let mut m = parse_report(&finished.stdout).map_err(Failure::Invalid)?;
    m.strategy = super::uprobe_run::probe_strategy(&report);
    Ok(m)
}

/// A jump entry probe on `f_push` with `bench_handler.so`'s entry handler as `param` makes it:
/// `novec=1` (the counting handler declaring `UPROBE_NO_VECTORS`), `empty=1` (a plain add, no
/// locked instruction), `fp=1` (the count and an add to a double: the vector save kept).
pub fn run_entry(
    u: &UprobeRun,
    fixture: &Fixture,
    param: &str,
    hits: u64,
    scratch: &Path,
) -> Result<Measurement, Failure> {
    let handler = fixture.handler.clone().map_err(Failure::Unavailable)?;
    let mut args = vec!["--handlers".to_string(), handler.display().to_string()];
    for p in ["func=f_push", param] {
        args.extend(["--param".to_string(), p.to_string()]);
    }
    let (finished, report) = run_loop(u, fixture, &args, hits, scratch)?;
    let counts = HandlerReport::parse(&report)
        .ok_or_else(|| Failure::Invalid(format!("bench_handler printed no counts: {:?}", report.trim())))?;
    check_hits(&format!("the counting handler ({param})"), counts.entries, hits)?;
    let mut m = parse_report(&finished.stdout).map_err(Failure::Invalid)?;
    m.strategy = super::uprobe_run::probe_strategy(&report);
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_from_the_report() {
        let out = "uprobe-run: probe at 0x1 (f_push+0x0): jump\n\
                   {\"kind\":\"latency\",\"pid\":3,\"function\":\"f_push\",\"count\":200,\"total_ns\":5}\n\
                   {\"kind\":\"count\",\"pid\":3,\"event\":\"f_push\",\"count\":100}\n";
        assert_eq!(reported_count(out, "count"), Some(100));
        assert_eq!(reported_count(out, "latency"), Some(200));
        assert_eq!(reported_count(out, "hist"), None);
    }
}
