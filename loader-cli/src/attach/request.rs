//! What the command line asks of an attach (plain data, the bottom of `attach`).

use std::path::PathBuf;
use std::time::Duration;

use uprobe_contracts::spec::Spec;

/// What the command line asks of an attach.
pub struct Request {
    pub pid: i32,
    /// The runtime's name, for messages (a path, or where it is carried).
    pub runtime: PathBuf,
    /// The runtime's bytes (see `load`).
    pub runtime_bytes: Vec<u8>,
    /// Absolute paths.
    pub handlers: Vec<PathBuf>,
    /// `--param NAME=VALUE`, as (name, value).
    pub params: Vec<(String, String)>,
    pub output: Option<PathBuf>,
    /// Runtime switches by name (`no-optimize`, `verbose`, `stats`, `full-vector-state`).
    pub switches: Vec<&'static str>,
    pub duration: Option<Duration>,
    pub verbose: bool,
    /// What the session runs besides handler libraries, as the run spec carries it:
    /// definitions, filters, stream and aggregation options, a listing.
    pub spec: Spec,
    /// `--format chrome` or `folded`: the runtime's own lines come beside the trace or the
    /// folded stacks, for stderr.
    pub chrome: bool,
    /// `--serve`: the process's end of the metrics feed, handed to it over the session.
    pub feed: Option<std::os::fd::RawFd>,
}
