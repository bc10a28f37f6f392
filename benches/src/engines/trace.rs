//! The event rows (`HITCOST_ONLY=trace`): an event on `f_push` with one fetcharg (a
//! register), and one with two (a register and a string), each recorded by uprobe-run (`-e`,
//! through its jump probe) and by the kernel's uprobe trace event with the same definition
//! (tracefs `uprobe_events`, recorded in the kernel's ring buffer). Both definitions name the
//! probe by file offset and the string by `@+OFFSET`, as tracefs takes them.

use super::{describe_exit, parse_report, run_command, Failure, Measurement};
use crate::fixture::Fixture;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const GROUP: &str = "hitcost_trace";
const TRACEFS: &str = "/sys/kernel/tracing";

/// The fetchargs of an event row.
#[derive(Clone, Copy)]
pub enum Args {
    /// `n=%di`
    Register,
    /// `n=%di s=@+OFFSET:string`
    RegisterAndString,
}

/// The definition, for uprobe-run and for tracefs alike.
pub fn definition(fixture: &Fixture, args: Args) -> Result<String, String> {
    let f = fixture.function("f_push");
    let probe = format!("p:{GROUP}/f_push {}:{:#x} n=%di", fixture.program.display(), f.file_offset);
    if let Args::Register = args {
        return Ok(probe);
    }
    let out = Command::new("nm").arg(&fixture.program).output().map_err(|e| format!("nm: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let name = text
        .lines()
        .find_map(|l| l.strip_suffix(" g_name").and_then(|l| l.split_whitespace().next()))
        .and_then(|a| u64::from_str_radix(a, 16).ok())
        .ok_or("g_name not in the fixture")?;
    Ok(format!("{probe} s=@+{name:#x}:string"))
}

/// Counts the lines of a file without holding it whole.
fn count_lines(path: &Path, needle: &str) -> usize {
    fs::read(path).map(|b| String::from_utf8_lossy(&b).lines().filter(|l| l.contains(needle)).count()).unwrap_or(0)
}

/// The fixture under `uprobe-run -e DEF`; every hit must be written (no drop).
pub fn run_uprobe_run(
    bin: &Path,
    fixture: &Fixture,
    args: Args,
    hits: u64,
    scratch: &Path,
) -> Result<Measurement, Failure> {
    let def = definition(fixture, args).map_err(Failure::Unavailable)?;
    let output = scratch.join("trace-events.out");
    let mut cmd = Command::new(bin);
    cmd.arg("-o").arg(&output).args(["--buffer-size", "256M", "-e", &def, "--"]).arg(&fixture.program);
    cmd.args(["loop", "f_push", &hits.to_string(), "1"]);
    let finished = run_command(&mut cmd, &scratch.join("run.stdout")).map_err(Failure::Invalid)?;
    if !finished.status.success() {
        return Err(Failure::Invalid(describe_exit("uprobe-run -e", &finished)));
    }
    let m = parse_report(&finished.stdout).map_err(Failure::Invalid)?;
    let written = count_lines(&output, "f_push: (f_push+0x0) n=0x");
    let _ = fs::remove_file(&output);
    if written as u64 != hits {
        return Err(Failure::Invalid(format!("{written} records written, expected {hits}")));
    }
    Ok(m)
}

/// The fixture with the same definition as a kernel trace event, enabled in tracefs.
pub fn run_kernel(fixture: &Fixture, args: Args, hits: u64, scratch: &Path) -> Result<Measurement, Failure> {
    let def = definition(fixture, args).map_err(Failure::Unavailable)?;
    let root = PathBuf::from(TRACEFS);
    let append = |file: &str, line: &str| -> Result<(), String> {
        use std::io::Write;
        fs::OpenOptions::new()
            .append(true)
            .open(root.join(file))
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
            .map_err(|e| format!("{TRACEFS}/{file}: {e}"))
    };
    let _ = append(&format!("events/{GROUP}/enable"), "0");
    let _ = append("uprobe_events", &format!("-:{GROUP}/f_push"));
    append("uprobe_events", &def).map_err(Failure::Unavailable)?;
    let result = (|| {
        append(&format!("events/{GROUP}/enable"), "1").map_err(Failure::Unavailable)?;
        let _ = fs::write(root.join("trace"), "");
        let mut cmd = Command::new(&fixture.program);
        cmd.args(["loop", "f_push", &hits.to_string(), "1"]);
        let finished = run_command(&mut cmd, &scratch.join("run.stdout")).map_err(Failure::Invalid)?;
        let _ = append(&format!("events/{GROUP}/enable"), "0");
        let profile = fs::read_to_string(root.join("uprobe_profile")).unwrap_or_default();
        let counted: u64 = profile
            .lines()
            .find(|l| l.contains(" f_push "))
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or(0);
        if counted != hits {
            return Err(Failure::Invalid(format!("the kernel counted {counted} hits, expected {hits}")));
        }
        parse_report(&finished.stdout).map_err(Failure::Invalid)
    })();
    let _ = append("uprobe_events", &format!("-:{GROUP}/f_push"));
    result
}
