//! `none` and `sigtrap`: the fixture run as it is.

use super::{describe_exit, fixture_args, parse_report, run_command, Failure, Job, Measurement};
use crate::fixture::Fixture;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub fn run(fixture: &Fixture, job: &Job, stdout: &Path) -> Result<Measurement, Failure> {
    let finished =
        run_command(Command::new(&fixture.program).args(fixture_args(job)), stdout).map_err(Failure::Invalid)?;
    if !finished.status.success() {
        return Err(Failure::Invalid(describe_exit("fixture", &finished)));
    }
    parse_report(&finished.stdout).map_err(Failure::Invalid)
}

/// Runs `hitloop idle`: wall time from start to exit, and the fixture's report.
pub fn run_idle(fixture: &Fixture, stdout: &Path) -> Result<(Duration, Measurement), Failure> {
    run_mode(fixture, &["idle"], stdout)
}

/// Runs the fixture alone with `args` (a mode of `hitloop`) and reads its report.
pub fn run_mode(fixture: &Fixture, args: &[&str], stdout: &Path) -> Result<(Duration, Measurement), Failure> {
    let finished = run_command(Command::new(&fixture.program).args(args), stdout).map_err(Failure::Invalid)?;
    if !finished.status.success() {
        return Err(Failure::Invalid(describe_exit("fixture", &finished)));
    }
    let m = parse_report(&finished.stdout).map_err(Failure::Invalid)?;
    Ok((finished.wall, m))
}
