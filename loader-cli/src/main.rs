//! `uprobe-run`: checks the program, the handler libraries and the runtime, then replaces
//! itself with the program, the runtime preloaded; or, with `--pid`, attaches to a running
//! process (see `attach`).
#![deny(unsafe_code)]

mod aggregate;
mod attach;
mod bundled;
mod check;
mod cli;
mod config;
mod elf;
mod error;
mod filter;
mod launch;
mod runtime;
mod serve;
mod sys;

use cli::Cli;
use error::Error;
use launch::{Candidate, Launch};
use std::convert::Infallible;
use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Exit status of every refusal.
const REFUSED: i32 = 2;

fn main() {
    let error = match run() {
        Ok(never) => match never {},
        Err(error) => error,
    };
    eprintln!("uprobe-run: {error}");
    std::process::exit(REFUSED);
}

fn run() -> Result<Infallible, Error> {
    let mut cli = Cli::from_args()?;
    if cli.version {
        let (path, origin) = runtime::locate()?;
        println!("uprobe-run {}", env!("CARGO_PKG_VERSION"));
        println!("runtime: {} ({})", path.display(), origin.describe());
        std::process::exit(0);
    }

    let mut handlers = Vec::new();
    let mut params = Vec::new();
    let mut output = None;
    let mut options = Vec::new();
    if let Some(path) = &cli.config {
        let config = load_config(path)?;
        handlers.extend(config.handlers);
        params.extend(config.params);
        output = config.output;
        options = config.options;
    }
    let flags = [
        (cli.no_optimize, "no-optimize"),
        (cli.verbose, "verbose"),
        (cli.full_vector_state, "full-vector-state"),
        (cli.stats, "stats"),
        (cli.follow_exec, "follow-exec"),
        (cli.no_follow_fork, "no-follow-fork"),
        (cli.lenient, "lenient"),
        (cli.raw_address, "raw-address"),
    ];
    for (set, name) in flags {
        if set && !options.iter().any(|o| o == name) {
            options.push(name.to_owned());
        }
    }
    let aggregation = aggregate::records(&cli)?;
    check_serve(&cli, !aggregation.is_empty())?;
    for param in &cli.params {
        config::check_param(param).map_err(|reason| Error::Param { param: param.clone(), reason })?;
    }
    handlers.extend(cli.handlers.clone());
    params.extend(cli.params.clone());
    let output = cli.output.clone().or(output);

    if let Some(pid) = cli.pid.or_else(|| listed_pid(&mut cli)) {
        let duration = match cli.duration {
            Some(d) if !(d >= 0.0 && d.is_finite()) => return Err(Error::BadDuration(d)),
            d => d.map(std::time::Duration::from_secs_f64),
        };
        let mut extra = event_records(&cli, &aggregation, true)?;
        extra.extend(aggregation);
        let mut command = cli.command.clone();
        if cli.list {
            // -l [PATTERN] --pid PID: what the process has mapped now.
            let pattern = match command.as_slice() {
                [] => String::new(),
                [pattern] => pattern.to_str().ok_or(Error::List("the PATTERN is not UTF-8"))?.to_owned(),
                _ => return Err(Error::PidAndProgram),
            };
            if pattern.contains('\n') {
                return Err(Error::List("the PATTERN contains a newline"));
            }
            extra.push(("list", pattern.into()));
            handlers.clear();
            command.clear();
        }
        let chrome = cli.format == Some(cli::Format::Chrome);
        // --serve: served by uprobe-run while the session runs; the feed's other end goes to
        // the process over the session.
        let serving = match &cli.serve {
            Some(addr) => {
                let (ours, theirs) = serve::socket_pair(addr)?;
                let endpoint = serve::bind(addr)?;
                let keys = cli.serve_keys.map_or(serve::metrics::DEFAULT_KEYS, |n| n as usize);
                Some((serve::attached(endpoint, ours, keys), theirs))
            }
            None => None,
        };
        let feed = serving.as_ref().map(|(_, theirs)| *theirs);
        let status = attach_to(pid, &command, &handlers, params, output, options, duration, extra, chrome, feed);
        if let Some((serving, theirs)) = serving {
            sys::close(theirs);
            let linger = if status.is_ok() { cli.serve_linger.unwrap_or(0) } else { 0 };
            serving.finish(std::time::Duration::from_nanos(linger));
        }
        std::process::exit(status?);
    }
    if cli.duration.is_some() {
        return Err(Error::DurationWithoutPid);
    }

    let mut extra = event_records(&cli, &aggregation, false)?;
    extra.extend(aggregation);
    // The feed's socket pair: its number is in the specification the program reads.
    let feed = match &cli.serve {
        Some(addr) => Some(serve::socket_pair(addr)?),
        None => None,
    };
    if let Some((_, program_end)) = feed {
        extra.push(("feed", program_end.to_string().into()));
    }
    let command = if cli.list {
        // -l [PATTERN] [--] PROGRAM: the listing runs the program's start-up only.
        let (pattern, command) = list_arguments(&cli.command)?;
        extra.push(("list", pattern.unwrap_or_default().into()));
        handlers.clear();
        command
    } else {
        cli.command.clone()
    };
    let (name, args) = command.split_first().ok_or(Error::NoProgram)?;
    let program = resolve_program(Path::new(name))?;
    check::program(&program)?;
    let has_events = extra.iter().any(|(key, _)| matches!(*key, "event" | "events" | "list" | "latency"));
    if handlers.is_empty() && !has_events && !check::calls_the_api(&program) {
        return Err(Error::NothingToDo);
    }

    let (runtime, _) = runtime::locate()?;
    check::library(&runtime).map_err(|e| match e {
        Error::NoSuchFile(path) => Error::NoRuntime(path),
        other => other,
    })?;
    let runtime = absolute(&runtime)?;
    if runtime.as_os_str().as_bytes().iter().any(|&b| b == b':' || b.is_ascii_whitespace()) {
        return Err(Error::UnusablePath {
            path: runtime,
            reason: "LD_PRELOAD cannot carry a path containing ':' or blanks",
        });
    }

    let mut handler_paths = Vec::with_capacity(handlers.len());
    for handler in &handlers {
        let handler = bundled::resolve(handler)?;
        check::handler_library(&handler)?;
        handler_paths.push(spec_path(&handler)?);
    }
    // `-o -`: standard output, as every Unix tool reads it (nothing is created).
    let output = match output.as_deref() {
        Some(path) if is_stdout(path) => Some(PathBuf::from("-")),
        other => other.map(spec_path).transpose()?,
    };

    let launch = Launch {
        program: program.clone(),
        argv0: name.clone(),
        args: args.to_vec(),
        ld_preload: launch::ld_preload(std::env::var_os("LD_PRELOAD").as_deref(), &runtime),
        run_spec: launch::run_spec(&handler_paths, &params, output.as_deref(), &options, &extra),
    };
    if let Some((variable, len)) = launch.oversized() {
        let largest = (variable == "UPROBE_RUN_SPEC").then(|| launch::largest_record(&launch.run_spec)).flatten();
        return Err(Error::TooLong { variable, len, limit: launch::MAX_ARG_STRLEN, largest });
    }
    let spec_len = launch.run_spec.len();
    let exec_size = launch.exec_size();
    // Last: nothing is created unless the program is about to start.
    if let Some(output) = output.as_ref().filter(|o| !is_stdout(o)) {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(output)
            .map_err(|source| Error::Output { path: output.clone(), source })?;
    }
    let started = match (feed, &cli.serve) {
        (Some((ours, program_end)), Some(addr)) => {
            let endpoint = serve::bind(addr)?;
            let keys = cli.serve_keys.map_or(serve::metrics::DEFAULT_KEYS, |n| n as usize);
            let linger = std::time::Duration::from_nanos(cli.serve_linger.unwrap_or(0));
            match serve::run(endpoint, launch.command(), ours, program_end, keys, linger) {
                Ok(never) => match never {},
                Err(e) => e,
            }
        }
        _ => launch.exec(),
    };
    match started {
        source if source.raw_os_error() == Some(libc::E2BIG) => {
            Err(Error::ExecTooBig { path: program, spec: spec_len, total: exec_size, limit: sys::exec_size_limit() })
        }
        source => Err(Error::Exec { path: program, source }),
    }
}

/// The records of the definitions and the stream's options (`-e`, `--events`, filters,
/// `--format`, `--buffer-size`, `--trigger`, `--max-events`). `attach`: the runtime in a
/// running process reads no file of uprobe-run's, so `--events` files are read here and
/// their definitions sent as they are.
fn event_records(
    cli: &Cli,
    aggregation: &[(&'static str, OsString)],
    attach: bool,
) -> Result<Vec<(&'static str, OsString)>, Error> {
    let mut extra: Vec<(&str, OsString)> = Vec::new();
    for def in &cli.events {
        if def.contains('\n') {
            return Err(Error::Definition { def: def.clone(), reason: "one definition a line: no newline in -e" });
        }
        extra.push(("event", def.into()));
    }
    for file in &cli.event_files {
        if attach {
            let text = fs::read(file).map_err(|source| Error::EventsFile { path: file.clone(), source })?;
            let text = String::from_utf8_lossy(&text);
            extra.extend(uprobe_contracts::def::file_lines(&text).map(|(_, def)| ("event", def.into())));
            continue;
        }
        fs::File::open(file).map_err(|source| Error::EventsFile { path: file.clone(), source })?;
        extra.push(("events", spec_path(file)?.into_os_string()));
    }
    extra.extend(filter::records(&cli.events, &cli.event_files, &cli.filters, &cli.latency)?);
    if let Some(format) = cli.format {
        extra.push(("format", format.name().into()));
    }
    if let Some(size) = cli.buffer_size {
        extra.push(("buffer-size", size.to_string().into()));
    }
    for t in &cli.triggers {
        if t.contains('\n') || !t.contains(':') {
            return Err(Error::Filter(format!(
                "--trigger '{}': expected EVENT:enable=EVENT or EVENT:disable=EVENT",
                t.replace('\n', "\\n")
            )));
        }
        extra.push(("trigger", t.into()));
    }
    if let Some(n) = cli.max_events {
        if !aggregation.is_empty() {
            return Err(Error::Aggregate {
                option: "--max-events",
                reason: "limits the records of a stream: aggregations keep no records",
            });
        }
        extra.push(("max-events", n.to_string().into()));
    }
    Ok(extra)
}

/// `-l [PATTERN] --pid PID`: the words after `-l` are taken as a program, so a `--pid` among
/// them is found here (and taken out).
fn listed_pid(cli: &mut Cli) -> Option<i32> {
    if !cli.list {
        return None;
    }
    let words: Vec<&str> = cli.command.iter().map(|w| w.to_str().unwrap_or("")).collect();
    let (at, pid) = match words.as_slice() {
        [flag, pid] | [_, flag, pid] if matches!(*flag, "-p" | "--pid") => (words.len() - 2, *pid),
        [flag] | [_, flag] if flag.starts_with("--pid=") => (words.len() - 1, &flag["--pid=".len()..]),
        _ => return None,
    };
    let pid = pid.parse().ok()?;
    cli.command.truncate(at);
    Some(pid)
}

/// `--serve` and its options: what they need, refused in one line before anything starts.
fn check_serve(cli: &Cli, aggregating: bool) -> Result<(), Error> {
    let refuse = |option, reason| Err(Error::ServeOption { option, reason });
    if cli.serve.is_none() {
        if cli.serve_keys.is_some() {
            return refuse("--serve-keys", "bounds what --serve serves: it needs --serve");
        }
        if cli.serve_linger.is_some() {
            return refuse("--serve-linger", "applies to --serve: it needs --serve");
        }
        return Ok(());
    }
    if cli.list {
        return refuse("--serve", "serves a run's aggregations, not a listing");
    }
    if !aggregating {
        return refuse("--serve", "serves aggregations: give --count, --hist, --lhist or --latency");
    }
    if cli.top.is_some() {
        return refuse("--top", "not with --serve: served counters must not come and go (--serve-keys bounds them)");
    }
    Ok(())
}

/// `--list`'s words: `[PATTERN] [--] PROGRAM [ARGS]`. One word is the program; with more,
/// the first is the pattern. (A running process, once attach exists, is listed by the same
/// runtime entry, `trace::list::list`, called there.)
fn list_arguments(words: &[OsString]) -> Result<(Option<String>, Vec<OsString>), Error> {
    match words {
        [] => Err(Error::List("give the PROGRAM whose functions to list")),
        [program] => Ok((None, vec![program.clone()])),
        [dashes, rest @ ..] if dashes == "--" => Ok((None, rest.to_vec())),
        [pattern, rest @ ..] => {
            let rest = match rest.split_first() {
                Some((d, r)) if d == "--" => r.to_vec(),
                _ => rest.to_vec(),
            };
            let pattern = pattern.to_str().ok_or(Error::List("the PATTERN is not UTF-8"))?;
            if pattern.contains('\n') {
                return Err(Error::List("the PATTERN contains a newline"));
            }
            Ok((Some(pattern.to_owned()), rest))
        }
    }
}

/// `--pid`: checks what only a launch can use, the runtime and the libraries, then attaches;
/// returns uprobe-run's exit status.
#[allow(clippy::too_many_arguments)]
fn attach_to(
    pid: i32,
    command: &[std::ffi::OsString],
    handlers: &[PathBuf],
    params: Vec<String>,
    output: Option<PathBuf>,
    options: Vec<String>,
    duration: Option<std::time::Duration>,
    extra: Vec<(&'static str, OsString)>,
    chrome: bool,
    feed: Option<i32>,
) -> Result<i32, Error> {
    if !command.is_empty() {
        return Err(Error::PidAndProgram);
    }
    for (name, flag) in [("follow-exec", "--follow-exec"), ("no-follow-fork", "--no-follow-fork")] {
        if options.iter().any(|o| o == name) {
            return Err(Error::NotWithPid(flag));
        }
    }
    let (runtime, runtime_bytes) = runtime::for_attach()?;
    let mut handler_paths = Vec::with_capacity(handlers.len());
    for handler in handlers {
        let handler = bundled::resolve(handler)?;
        check::handler_library(&handler)?;
        handler_paths.push(spec_path(&handler)?);
    }
    let verbose = options.iter().any(|o| o == "verbose");
    let request = attach::Request {
        pid,
        runtime,
        runtime_bytes,
        handlers: handler_paths,
        params,
        output,
        options,
        duration,
        verbose,
        extra: extra.into_iter().map(|(key, value)| (key.to_owned(), value)).collect(),
        chrome,
        copies_dir: runtime::shared_private_dir,
        feed,
    };
    Ok(attach::run(request)?)
}

fn load_config(path: &Path) -> Result<config::Config, Error> {
    let text = fs::read_to_string(path).map_err(|source| Error::ConfigRead {
        path: path.into(),
        source: match source.kind() {
            io::ErrorKind::InvalidData => io::Error::other("not UTF-8 text"),
            _ => source,
        },
    })?;
    let base = path.parent().unwrap_or(Path::new(""));
    config::parse(&text, base).map_err(|error| Error::Config { path: path.into(), error })
}

/// A name without `/` is looked up in PATH, like execvp does.
fn resolve_program(name: &Path) -> Result<PathBuf, Error> {
    if name.as_os_str().is_empty() {
        return Err(Error::NoProgram);
    }
    if name.as_os_str().as_bytes().contains(&b'/') {
        return Ok(name.into());
    }
    let path_var = std::env::var_os("PATH");
    launch::search_path(name.as_os_str(), path_var.as_deref(), |candidate| match fs::metadata(candidate) {
        Ok(meta) if meta.is_file() && sys::may_execute(candidate) => Candidate::Executable,
        Ok(_) => Candidate::Present,
        Err(_) => Candidate::Missing,
    })
    .ok_or_else(|| Error::NotInPath(name.into()))
}

/// `-o -`.
fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == "-"
}

fn absolute(path: &Path) -> Result<PathBuf, Error> {
    std::path::absolute(path).map_err(|source| Error::Read { path: path.into(), source })
}

/// An absolute path that fits in a `UPROBE_RUN_SPEC` record.
fn spec_path(path: &Path) -> Result<PathBuf, Error> {
    if path.as_os_str().as_bytes().contains(&b'\n') {
        return Err(Error::UnusablePath {
            path: path.into(),
            reason: "contains a newline, which UPROBE_RUN_SPEC cannot carry",
        });
    }
    absolute(path)
}
