//! The launch mode: a program started with the runtime preloaded. Checks the program, the
//! runtime and the handler libraries, writes the plan into the run specification, then
//! replaces uprobe-run with the program (or, with `--serve`, starts it as a child and serves
//! its aggregations, see `output::serve`).
//!
//! - [`exec`]: the environment handed to the program, and the exec itself;
//! - here: the checks, in the order their refusals are made, and the start.
//!
//! Context: uprobe-run's own process, before the program starts; nothing is created unless
//! the program is about to start.

pub mod exec;

use std::convert::Infallible;
use std::ffi::{OsStr, OsString};
use std::fs::OpenOptions;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use uprobe_contracts::spec::Spec;

use crate::base::error::Error;
use crate::base::program::resolve_program;
use crate::base::{check, runtime, spec, sys};
use crate::output::serve;
use crate::plan::{self, Events, Output, Serve, Setup};
use exec::Launch;

/// Starts the program that `plan` names; returns only with the reason it could not.
pub fn run(plan: plan::Launch) -> Result<Infallible, Error> {
    let mut spec = event_spec(&plan.events)?;
    spec.aggregate = plan.aggregation.clone();
    // The feed's socket pair: its number is in the specification the program reads.
    let serve = match plan.serve {
        Some(serve) => {
            let (ours, program_end) = serve::socket_pair(&serve.addr)?;
            spec.aggregate.feed = Some(program_end);
            Some(Served { serve, ours, program_end })
        }
        None => None,
    };
    let has_work =
        !plan.events.definitions.is_empty() || !plan.events.files.is_empty() || !plan.aggregation.latency.is_empty();
    start(Start { setup: &plan.setup, program: &plan.program, args: &plan.args, spec, has_work, serve })
}

/// `--serve`, with the feed's socket pair made.
pub struct Served {
    pub serve: Serve,
    /// uprobe-run's end of the feed.
    pub ours: i32,
    /// The program's end (its number is in the run specification).
    pub program_end: i32,
}

/// A program to start with the runtime preloaded: a launch's, or a listing's.
pub struct Start<'a> {
    pub setup: &'a Setup,
    pub program: &'a OsStr,
    pub args: &'a [OsString],
    /// The run specification beyond the setup's handlers, params, output and switches.
    pub spec: Spec,
    /// Events, timed calls or a listing: the runtime has work even without handler libraries.
    pub has_work: bool,
    pub serve: Option<Served>,
}

/// Checks the program, the runtime, the libraries and the output, then starts the program;
/// returns only with the reason it could not.
pub fn start(start: Start) -> Result<Infallible, Error> {
    let Start { setup, program: name, args, spec: rest, has_work, serve } = start;
    let program = resolve_program(Path::new(name))?;
    check::program(&program)?;
    if setup.handlers.is_empty() && !has_work && !check::calls_the_api(&program) {
        return Err(Error::NothingToDo);
    }

    let (runtime, _) = runtime::locate()?;
    check::library(&runtime).map_err(|e| match e {
        Error::NoSuchFile(path) => Error::NoRuntime(path),
        other => other,
    })?;
    let runtime = spec::absolute(&runtime)?;
    if runtime.as_os_str().as_bytes().iter().any(|&b| b == b':' || b.is_ascii_whitespace()) {
        return Err(Error::UnusablePath {
            path: runtime,
            reason: "LD_PRELOAD cannot carry a path containing ':' or blanks",
        });
    }
    let handlers = check::handlers(&setup.handlers)?;
    let file = match &setup.output {
        Some(Output::File(path)) => Some(spec::path(path)?),
        Some(Output::Stdout) | None => None,
    };
    let output = match &setup.output {
        Some(Output::Stdout) => Some(PathBuf::from("-")),
        _ => file.clone(),
    };
    let params: Vec<(String, String)> = setup.params.iter().map(|p| (p.name.clone(), p.value.clone())).collect();
    let spec = spec::run_spec(&handlers, &params, output.as_deref(), &setup.switches.names(), rest)?;

    let launch = Launch {
        program: program.clone(),
        argv0: name.to_owned(),
        args: args.to_vec(),
        ld_preload: exec::ld_preload(std::env::var_os("LD_PRELOAD").as_deref(), &runtime),
        run_spec: spec::encode(&spec)?,
    };
    if let Some((variable, len)) = launch.oversized() {
        let largest = (variable == "UPROBE_RUN_SPEC").then(|| exec::largest_record(&launch.run_spec)).flatten();
        return Err(Error::TooLong { variable, len, limit: exec::MAX_ARG_STRLEN, largest });
    }
    let spec_len = launch.run_spec.len();
    let exec_size = launch.exec_size();
    // The files the run's end writes (`--flamegraph`, `--pprof`; the runtime writes them, as
    // this user): a path that cannot be written is said before the program runs, not after.
    // They are not made here: the runtime may still refuse the run.
    for path in [&spec.aggregate.flamegraph, &spec.aggregate.pprof].into_iter().flatten().map(PathBuf::from) {
        sys::may_write(&path).map_err(|source| Error::Output { path, source })?;
    }
    // Last: nothing is created unless the program is about to start.
    if let Some(path) = &file {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(path)
            .map_err(|source| Error::Output { path: path.clone(), source })?;
    }
    let started = match serve {
        Some(Served { serve, ours, program_end }) => {
            let endpoint = serve::bind(&serve.addr)?;
            let keys = serve.keys.unwrap_or(serve::metrics::DEFAULT_KEYS);
            match serve::run(endpoint, launch.command(), ours, program_end, keys, serve.linger) {
                Ok(never) => match never {},
                Err(e) => e,
            }
        }
        None => launch.exec(),
    };
    match started {
        source if source.raw_os_error() == Some(libc::E2BIG) => {
            Err(Error::ExecTooBig { path: program, spec: spec_len, total: exec_size, limit: sys::exec_size_limit() })
        }
        source => Err(Error::Exec { path: program, source }),
    }
}

/// The event options as the run specification carries them (an attach's too).
pub fn event_spec(events: &Events) -> Result<Spec, Error> {
    Ok(Spec {
        events: events.definitions.clone(),
        event_files: events.files.iter().map(|f| spec::spec_text(f)).collect::<Result<_, _>>()?,
        filters: events.filters.iter().map(plan::filter::Compiled::spec_entry).collect(),
        format: events.format,
        buffer_size: events.buffer_size,
        triggers: events.triggers.clone(),
        max_events: events.max_events,
        ..Spec::default()
    })
}
