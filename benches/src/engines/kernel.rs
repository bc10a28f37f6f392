//! `kernel`: kernel uprobes and uretprobes on the same function, counted by perf (counting
//! mode, no samples: only the kernel's hit path and a counter increment). The fixture starts
//! gated, so the events exist before its exec; `enable_on_exec` turns them on there and
//! `inherit` follows its threads.
//!
//! Single-threaded rows use perf_event_open with the `uprobe` PMU (path in config1, file
//! offset in config2). That event cannot follow new threads: on clone the kernel builds the
//! inherited event from the same attributes and reads the path through config1 again, in the
//! traced process, where that pointer means nothing, so clone fails with EFAULT. Rows with
//! more threads therefore define the probes in tracefs (`uprobe_events`) and count them with
//! a perf tracepoint event: the same kernel hit path.

use super::{check_hits, fixture_args, parse_report, Failure, Job, Measurement};
use crate::fixture::Fixture;
use crate::sys::{self, Child, PerfEventAttr, StartMode, Status};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const PMU_DIR: &str = "/sys/bus/event_source/devices/uprobe";
const TRACEFS_DIRS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];
const PERF_TYPE_TRACEPOINT: u32 = 2;
/// The tracefs event group of this benchmark's probes.
const GROUP: &str = "hitcost";

/// The kernel's `uprobe` perf PMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UprobePmu {
    pub pmu_type: u32,
    /// The bit of `config` that asks for a return probe.
    pub retprobe_bit: u32,
}

/// Parses a PMU format file such as `config:0`.
pub fn parse_format_bit(text: &str) -> Option<u32> {
    let bit = text.trim().strip_prefix("config:")?;
    bit.parse().ok()
}

impl UprobePmu {
    pub fn discover() -> Result<UprobePmu, String> {
        let read = |file: &str| {
            fs::read_to_string(Path::new(PMU_DIR).join(file))
                .map_err(|e| format!("no uprobe perf PMU: {PMU_DIR}/{file}: {e}"))
        };
        let pmu_type = read("type")?.trim().parse().map_err(|e| format!("{PMU_DIR}/type: {e}"))?;
        let retprobe_bit = parse_format_bit(&read("format/retprobe")?)
            .ok_or_else(|| format!("{PMU_DIR}/format/retprobe: not a config bit"))?;
        Ok(UprobePmu { pmu_type, retprobe_bit })
    }
}

/// A uprobe defined in tracefs for the length of one run; removed on drop.
struct TracefsProbe {
    events: PathBuf,
    name: String,
}

impl TracefsProbe {
    /// Defines `p:hitcost/NAME PATH:OFFSET` (or `r:` for a return probe); returns the probe
    /// and its tracepoint id.
    fn define(
        tracefs: &Path,
        name: String,
        retprobe: bool,
        path: &Path,
        offset: u64,
    ) -> Result<(TracefsProbe, u64), String> {
        let events = tracefs.join("uprobe_events");
        let line = format!("{}:{GROUP}/{name} {}:{offset:#x}\n", if retprobe { 'r' } else { 'p' }, path.display());
        append(&events, &line)?;
        let probe = TracefsProbe { events, name };
        let id_file = tracefs.join("events").join(GROUP).join(&probe.name).join("id");
        let id = fs::read_to_string(&id_file)
            .map_err(|e| format!("{}: {e}", id_file.display()))?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", id_file.display()))?;
        Ok((probe, id))
    }
}

impl Drop for TracefsProbe {
    fn drop(&mut self) {
        let _ = append(&self.events, &format!("-:{GROUP}/{}\n", self.name));
    }
}

fn append(file: &Path, line: &str) -> Result<(), String> {
    OpenOptions::new()
        .append(true)
        .open(file)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .map_err(|e| format!("writing {:?} to {}: {e}", line.trim(), file.display()))
}

/// Kernel uprobes as this machine offers them.
#[derive(Clone, Debug)]
pub struct KernelProbes {
    pub pmu: Result<UprobePmu, String>,
    pub tracefs: Result<PathBuf, String>,
}

impl KernelProbes {
    pub fn discover() -> KernelProbes {
        let tracefs = TRACEFS_DIRS
            .iter()
            .map(PathBuf::from)
            .find(|d| d.join("uprobe_events").exists())
            .ok_or_else(|| format!("no uprobe_events in {}", TRACEFS_DIRS.join(" or ")));
        if let Ok(dir) = &tracefs {
            remove_stale_probes(dir);
        }
        KernelProbes { pmu: UprobePmu::discover(), tracefs }
    }

    /// Why no kernel row can run here, if none can.
    pub fn unavailable(&self) -> Option<String> {
        match (&self.pmu, &self.tracefs) {
            (Err(a), Err(b)) => Some(format!("{a}; {b}")),
            _ => None,
        }
    }

    pub fn run(&self, fixture: &Fixture, job: &Job, stdout: &Path) -> Result<Measurement, Failure> {
        let func = fixture.function(job.function);
        let invalid = |e: String| Failure::Invalid(e);
        let path = CString::new(fixture.program.as_os_str().as_bytes()).map_err(|e| invalid(e.to_string()))?;
        let mut argv = vec![path.clone()];
        for arg in fixture_args(job) {
            argv.push(CString::new(arg).map_err(|e| invalid(e.to_string()))?);
        }
        let out = File::create(stdout).map_err(|e| invalid(format!("{}: {e}", stdout.display())))?;
        let mut child =
            sys::spawn(&argv, &out, StartMode::Gated).map_err(|e| invalid(format!("cannot start the fixture: {e}")))?;

        // Declared before the counters, so that they are closed before the probes go.
        let mut defined: Vec<TracefsProbe> = Vec::new();
        let mut counters: Vec<(bool, File)> = Vec::new();
        for retprobe in [false, true] {
            if (retprobe && !job.kind.has_return()) || (!retprobe && !job.kind.has_entry()) {
                continue;
            }
            let flags = sys::PERF_ATTR_DISABLED | sys::PERF_ATTR_INHERIT | sys::PERF_ATTR_ENABLE_ON_EXEC;
            let what = if retprobe { "uretprobe" } else { "uprobe" };
            let attr = if job.threads == 1 {
                let pmu = self.pmu.as_ref().map_err(|e| unavailable(&mut child, e.clone()))?;
                PerfEventAttr {
                    type_: pmu.pmu_type,
                    config: if retprobe { 1 << pmu.retprobe_bit } else { 0 },
                    config1: path.as_ptr() as u64,
                    config2: func.file_offset,
                    flags,
                    ..Default::default()
                }
            } else {
                let tracefs = self
                    .tracefs
                    .as_ref()
                    .map_err(|e| unavailable(&mut child, format!("{e} (needed for inherited events)")))?;
                let name = format!("{}_{}_{}", what, std::process::id(), child.pid);
                let (probe, id) = TracefsProbe::define(tracefs, name, retprobe, &fixture.program, func.file_offset)
                    .map_err(|e| unavailable(&mut child, e))?;
                defined.push(probe);
                PerfEventAttr { type_: PERF_TYPE_TRACEPOINT, config: id, flags, ..Default::default() }
            };
            match sys::perf_event_open(&attr, child.pid) {
                Ok(fd) => counters.push((retprobe, fd)),
                Err(e) => {
                    return Err(unavailable(
                        &mut child,
                        format!("perf_event_open({what} at {}+{:#x}): {e}", func.name, func.file_offset),
                    ))
                }
            }
        }
        if let Err(e) = child.release() {
            child.kill_and_reap();
            return Err(invalid(format!("cannot release the fixture: {e}")));
        }
        match sys::wait(child.pid) {
            Ok(Status::Exited(0)) => {}
            Ok(other) => return Err(invalid(format!("fixture ended with {other:?}"))),
            Err(e) => return Err(invalid(format!("waitpid: {e}"))),
        }
        let m = parse_report(&fs::read_to_string(stdout).unwrap_or_default()).map_err(invalid)?;
        let expected = job.hits * u64::from(job.threads);
        for (retprobe, mut fd) in counters {
            let mut count = [0u8; 8];
            fd.read_exact(&mut count).map_err(|e| invalid(format!("reading the perf counter: {e}")))?;
            let what = if retprobe { "kernel uretprobe" } else { "kernel uprobe" };
            check_hits(what, u64::from_ne_bytes(count), expected)?;
        }
        drop(defined);
        Ok(m)
    }
}

fn unavailable(child: &mut Child, reason: String) -> Failure {
    child.kill_and_reap();
    Failure::Unavailable(reason)
}

/// Removes probes of this group left by an interrupted earlier run.
fn remove_stale_probes(tracefs: &Path) {
    let events = tracefs.join("uprobe_events");
    let Ok(text) = fs::read_to_string(&events) else {
        return;
    };
    for line in text.lines() {
        let Some(spec) = line.split_whitespace().next() else {
            continue;
        };
        if let Some(name) = spec.get(2..).and_then(|s| s.strip_prefix(&format!("{GROUP}/"))) {
            let _ = append(&events, &format!("-:{GROUP}/{name}\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_bits() {
        assert_eq!(parse_format_bit("config:0\n"), Some(0));
        assert_eq!(parse_format_bit("config:63"), Some(63));
        assert_eq!(parse_format_bit("config1:0-63"), None);
    }
}
