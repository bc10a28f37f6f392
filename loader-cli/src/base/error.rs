//! Every reason uprobe-run refuses to start a program. Display is the one line printed after
//! `uprobe-run: `; each names the file or argument at fault.

use crate::base::elf::ElfProblem;
use std::io;
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("{0} (see uprobe-run --help)")]
    Usage(String),
    #[error("no program given (usage: uprobe-run [OPTIONS] [--] PROGRAM [ARGS...])")]
    NoProgram,
    #[error("{}: no such file", .0.display())]
    NoSuchFile(PathBuf),
    #[error("{}: not found in PATH", .0.display())]
    NotInPath(PathBuf),
    #[error("{}: is a directory", .0.display())]
    IsDirectory(PathBuf),
    #[error("{}: not a regular file", .0.display())]
    NotRegularFile(PathBuf),
    #[error("{}: not executable (permission denied)", .0.display())]
    NotExecutable(PathBuf),
    #[error("{}: cannot read: {}", .path.display(), describe(.source))]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: {problem}", .path.display())]
    Elf { path: PathBuf, problem: ElfProblem },
    #[error(
        "{}: static executable (no PT_INTERP): the runtime is loaded through LD_PRELOAD, \
         which static programs ignore",
        .0.display()
    )]
    Static(PathBuf),
    #[error(
        "{}: {kind} program: the dynamic loader ignores LD_PRELOAD for setuid/setgid programs",
        .path.display()
    )]
    SetId { path: PathBuf, kind: &'static str },
    #[error(
        "{}: no such file (the runtime library named by UPROBE_LIB)",
        .0.display()
    )]
    NoRuntime(PathBuf),
    #[error(
        "no runtime: this uprobe-run carries none (only release builds do) and no libuprobe.so is \
         beside it (build one there: cargo build -p uprobe; or set UPROBE_LIB to a libuprobe.so)"
    )]
    RuntimeNotCarried,
    #[error(
        "{}: cannot write the runtime carried inside uprobe-run there: {} (set XDG_CACHE_HOME \
         to a writable directory, or UPROBE_LIB to a libuprobe.so)",
        .path.display(),
        describe(.source)
    )]
    RuntimeCache { path: PathBuf, source: io::Error },
    #[error("{}: cannot read config file: {}", .path.display(), describe(.source))]
    ConfigRead { path: PathBuf, source: io::Error },
    #[error("{}:{line}: {reason}", .path.display())]
    Config { path: PathBuf, line: usize, reason: String },
    #[error("--param '{}': {reason}", one_line(.param))]
    Param { param: String, reason: &'static str },
    #[error("{}: {reason}", one_line(&.path.display().to_string()))]
    UnusablePath { path: PathBuf, reason: &'static str },
    #[error("the run's spec: {0}")]
    Spec(uprobe_contracts::spec::SpecError),
    #[error("-e '{}': {reason}", one_line(.def))]
    Definition { def: String, reason: &'static str },
    #[error("-e '{}': {reason}", one_line(.def))]
    Usdt { def: String, reason: String },
    #[error("--vars '{}': {reason}", one_line(.place))]
    Vars { place: String, reason: String },
    #[error("-e '{}': {reason}", one_line(.def))]
    Lines { def: String, reason: String },
    #[error("{0}")]
    LineRange(String),
    #[error("{0}")]
    Filter(String),
    #[error("--events {}: cannot read: {}", .path.display(), describe(.source))]
    EventsFile { path: PathBuf, source: io::Error },
    #[error("{option}: {reason}")]
    Aggregate { option: &'static str, reason: &'static str },
    #[error("{option} '{}': {reason}", one_line(.value))]
    AggregateValue { option: &'static str, value: String, reason: &'static str },
    #[error("--list: {0}")]
    List(&'static str),
    #[error("{}: cannot write the reference there: {}", .path.display(), describe(.source))]
    Reference { path: PathBuf, source: io::Error },
    #[error("{}: cannot create output file: {}", .path.display(), describe(.source))]
    Output { path: PathBuf, source: io::Error },
    #[error("{}: cannot execute: {}", .path.display(), describe(.source))]
    Exec { path: PathBuf, source: io::Error },
    #[error(
        "{variable} would be {len} bytes, over the kernel's limit of {limit} bytes for one \
         environment string (MAX_ARG_STRLEN){}",
        largest.as_ref().map_or(String::new(), |(what, n)| format!(": its largest part is {what} ({n} bytes); \
         pass long lists in a file the handler reads (libcount.so: --param probes-file=FILE)"))
    )]
    TooLong { variable: &'static str, len: usize, limit: usize, largest: Option<(String, usize)> },
    #[error(
        "{}: cannot execute: Argument list too long: its arguments and environment, with \
         LD_PRELOAD and UPROBE_RUN_SPEC ({spec} bytes) added, come to about {total} bytes, over \
         the kernel's limit here ({limit} bytes, a quarter of the stack size limit)",
        .path.display()
    )]
    ExecTooBig { path: PathBuf, spec: usize, total: usize, limit: usize },
    #[error(
        "nothing to do: give a handler library (--handlers LIB.so), an event definition \
         (-e DEF, --events FILE) or --latency WHERE; uprobe-run --help shows examples"
    )]
    NothingToDo,
    #[error(
        "{}: exports neither uprobe_init nor uprobe_exit, so it can neither place a probe nor \
         report (a handler library defines at least one; see uprobe.h)",
        .0.display()
    )]
    NoEntryPoints(PathBuf),
    #[error(
        "{0}: this uprobe-run does not carry it (a build that is not release carries no libcount.so; \
         gcc was missing for a C example): give the path of a built copy"
    )]
    NotCarried(&'static str),
    #[error("cannot write a bundled handler library: neither XDG_CACHE_HOME nor HOME names a directory")]
    NoCacheDir,
    #[error("{}: cannot write a bundled handler library there: {}", .path.display(), describe(.source))]
    HandlerCache { path: PathBuf, source: io::Error },
    /// An attach that failed (`attach::AttachError`, which names its own culprit).
    #[error("{0}")]
    Attach(Box<dyn std::error::Error + Send + Sync>),
    #[error("--pid attaches to a running process: give no PROGRAM with it (see uprobe-run --help)")]
    PidAndProgram,
    #[error("{0} applies to a program uprobe-run starts, not with --pid (see uprobe-run --help)")]
    NotWithPid(&'static str),
    #[error("--duration ends an attach session: give it with --pid (see uprobe-run --help)")]
    DurationWithoutPid,
    #[error("--duration {0}: not a number of seconds >= 0")]
    BadDuration(f64),
    #[error("--serve {addr}: {reason}")]
    Serve { addr: String, reason: String },
    #[error("{option}: {reason} (see uprobe-run --help)")]
    ServeOption { option: &'static str, reason: &'static str },
}

/// Control characters escaped, so that a refusal stays on one line.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

/// An I/O error without the trailing `(os error N)`: "Permission denied".
pub fn describe(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_owned(),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_culprit() {
        let cases = [
            (Error::NoSuchFile("./h.so".into()), "./h.so: no such file"),
            (
                Error::Static("./prog".into()),
                "./prog: static executable (no PT_INTERP): the runtime is loaded through \
                 LD_PRELOAD, which static programs ignore",
            ),
            (
                Error::SetId { path: "./suid".into(), kind: "setuid" },
                "./suid: setuid program: the dynamic loader ignores LD_PRELOAD for \
                 setuid/setgid programs",
            ),
            (
                Error::Read { path: "/x".into(), source: io::Error::from_raw_os_error(libc::EACCES) },
                "/x: cannot read: Permission denied",
            ),
            (
                Error::Config {
                    path: "run.conf".into(),
                    line: 3,
                    reason: "unknown directive 'x' (expected handlers, param, output, follow-exec, no-follow-fork or option)".into(),
                },
                "run.conf:3: unknown directive 'x' (expected handlers, param, output, follow-exec, no-follow-fork or option)",
            ),
        ];
        let newline = Error::Param { param: "a=b\nc".into(), reason: "contains a newline" };
        assert_eq!(newline.to_string(), "--param 'a=b\\nc': contains a newline");
        for (error, message) in cases {
            assert_eq!(error.to_string(), message);
        }
    }
}
