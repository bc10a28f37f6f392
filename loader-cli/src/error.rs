//! Every reason uprobe-run refuses to start a program. Display is the one line printed after
//! `uprobe-run: `; each names the file or argument at fault.

use crate::config::ConfigError;
use crate::elf::ElfProblem;
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
        "{}: no such file (the runtime library; build it, or set UPROBE_LIB to its path)",
        .0.display()
    )]
    NoRuntime(PathBuf),
    #[error("{}: cannot read config file: {}", .path.display(), describe(.source))]
    ConfigRead { path: PathBuf, source: io::Error },
    #[error("{}:{error}", .path.display())]
    Config { path: PathBuf, error: ConfigError },
    #[error("--param '{}': {reason}", one_line(.param))]
    Param { param: String, reason: &'static str },
    #[error("{}: {reason}", one_line(&.path.display().to_string()))]
    UnusablePath { path: PathBuf, reason: &'static str },
    #[error("-e '{}': {reason}", one_line(.def))]
    Definition { def: String, reason: &'static str },
    #[error("--events {}: cannot read: {}", .path.display(), describe(.source))]
    EventsFile { path: PathBuf, source: io::Error },
    #[error("{option}: {reason}")]
    Aggregate { option: &'static str, reason: &'static str },
    #[error("{option} '{}': {reason}", one_line(.value))]
    AggregateValue { option: &'static str, value: String, reason: &'static str },
    #[error("--list: {0}")]
    List(&'static str),
    #[error("{}: cannot create output file: {}", .path.display(), describe(.source))]
    Output { path: PathBuf, source: io::Error },
    #[error("{}: cannot execute: {}", .path.display(), describe(.source))]
    Exec { path: PathBuf, source: io::Error },
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
                    error: ConfigError {
                        line: 3,
                        reason: "unknown directive 'x' (expected handlers, param, output, follow-exec, no-follow-fork or option)".into(),
                    },
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
