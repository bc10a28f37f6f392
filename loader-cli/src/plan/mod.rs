//! The run plan: what the arguments (and the `--config` file) ask for, as one typed value per
//! mode, built and checked once. Every refusal of an option, a value or a combination of
//! options is made here, as one line, before any mode starts; past this point no option is
//! text to look into: the modes read fields.
//!
//! What stays text is text in a language the runtime reads (`-e` definitions, `--latency`
//! places, `--trigger` actions, `--hist` names): the runtime parses and refuses those with
//! the column at fault. USDT markers by name are the exception: [`usdt`] finds them in the
//! program's files and writes them as the kernel's `PATH:OFFSET(REF_CTR_OFFSET)` definitions.
//!
//! Context: uprobe-run's own process, before anything is started or attached; reads the
//! `--config` file, the `--events` files and the program's ELF files, changes nothing.

pub mod aggregate;
pub mod debugfile;
pub mod dwarf;
pub mod filter;
pub mod lines;
pub mod usdt;

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::args::Format;
use crate::args::{config, Cli};
use crate::base::error::Error;
use crate::base::program::resolve_program;
use crate::base::spec;
use uprobe_contracts::spec::Aggregate;

/// One run of uprobe-run.
#[derive(Debug)]
pub enum Plan {
    /// `-V`: the version and the runtime library a launch would preload.
    Version,
    /// `--write-reference DIR`: the man page and the shell completions, written there.
    Reference(PathBuf),
    /// Start a program with probes.
    Launch(Box<Launch>),
    /// `-l`: list what can be probed in a program.
    List(List),
    /// `--vars FUNC[:LINE] PROGRAM`: the DWARF variables available at a function's entry or
    /// on a source line.
    Vars { place: String, program: PathBuf },
    /// `--pid`: attach to a running process.
    Attach(Box<Attach>),
    /// `-L`: the source lines a probe can go on.
    Lines(Lines),
}

/// `-L RANGE PROGRAM`: the lines of a function or a source file, numbered where a probe can
/// go, as `perf probe -L` shows them.
#[derive(Debug)]
pub struct Lines {
    pub range: lines::listing::Range,
    pub program: PathBuf,
}

/// What every mode hands the runtime: the handler libraries, their parameters, the output,
/// the switches. The `--config` file's entries come first.
#[derive(Debug, Default)]
pub struct Setup {
    /// As given: paths, or the short names of bundled libraries.
    pub handlers: Vec<PathBuf>,
    pub params: Vec<Param>,
    pub output: Option<Output>,
    pub switches: Switches,
}

/// `--param NAME=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    pub name: String,
    pub value: String,
}

impl Param {
    /// `NAME=VALUE`, NAME not empty, no newline (see [`config::check_param`]).
    pub fn parse(text: &str) -> Result<Param, &'static str> {
        config::check_param(text)?;
        let (name, value) = text.split_once('=').ok_or("expected NAME=VALUE")?;
        Ok(Param { name: name.to_owned(), value: value.to_owned() })
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

/// `-o`: where the handlers and the records go (default: stderr).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// `-o -`: standard output, as every Unix tool reads it (nothing is created).
    Stdout,
    /// A file, created or truncated (relative paths: from the current directory).
    File(PathBuf),
}

impl Output {
    fn new(path: PathBuf) -> Output {
        match path.as_os_str() == "-" {
            true => Output::Stdout,
            false => Output::File(path),
        }
    }
}

/// The runtime's switches: the options without a value that the runtime itself reads.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Switches {
    pub no_optimize: bool,
    pub verbose: bool,
    pub full_vector_state: bool,
    pub follow_exec: bool,
    pub no_follow_fork: bool,
    pub stats: bool,
    pub lenient: bool,
    pub raw_address: bool,
    pub call_graph: bool,
}

impl Switches {
    /// Each switch, by its name in the config file and in the runtime's `option` records.
    fn fields(&mut self) -> [(&'static str, &mut bool); 9] {
        [
            ("no-optimize", &mut self.no_optimize),
            ("verbose", &mut self.verbose),
            ("full-vector-state", &mut self.full_vector_state),
            ("follow-exec", &mut self.follow_exec),
            ("no-follow-fork", &mut self.no_follow_fork),
            ("stats", &mut self.stats),
            ("lenient", &mut self.lenient),
            ("raw-address", &mut self.raw_address),
            ("call-graph", &mut self.call_graph),
        ]
    }

    /// The names of the switches that are on.
    pub fn names(mut self) -> Vec<&'static str> {
        self.fields().into_iter().filter(|(_, on)| **on).map(|(name, _)| name).collect()
    }

    fn of(cli: &Cli, from_config: &[String]) -> Switches {
        let mut switches = Switches {
            no_optimize: cli.no_optimize,
            verbose: cli.verbose,
            full_vector_state: cli.full_vector_state,
            follow_exec: cli.follow_exec,
            no_follow_fork: cli.no_follow_fork,
            stats: cli.stats,
            lenient: cli.lenient,
            raw_address: cli.raw_address,
            call_graph: cli.call_graph,
        };
        for (name, on) in switches.fields() {
            *on |= from_config.iter().any(|n| n == name);
        }
        switches
    }
}

/// A program to start with probes.
#[derive(Debug)]
pub struct Launch {
    pub setup: Setup,
    /// As the user named it: looked up in PATH when it has no `/`.
    pub program: OsString,
    pub args: Vec<OsString>,
    pub events: Events,
    pub aggregation: Aggregate,
    pub serve: Option<Serve>,
}

/// The event options of a launch.
#[derive(Debug, Default)]
pub struct Events {
    /// `-e`: one definition each, in the kernel's uprobe_events grammar.
    pub definitions: Vec<String>,
    /// `--events`: readable files, as absolute paths.
    pub files: Vec<PathBuf>,
    /// The predicates (`if`, `--filter`, `--latency ... if`), compiled.
    pub filters: Vec<filter::Compiled>,
    pub format: Option<Format>,
    /// Bytes.
    pub buffer_size: Option<usize>,
    /// `--trigger EVENT:enable|disable=EVENT[,...]`.
    pub triggers: Vec<String>,
    pub max_events: Option<u64>,
}

/// `--serve ADDR` and its options.
#[derive(Debug)]
pub struct Serve {
    pub addr: ServeAddr,
    /// `--serve-keys`.
    pub keys: Option<usize>,
    /// `--serve-linger`.
    pub linger: Duration,
}

/// Where `--serve` serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeAddr {
    /// As given, for messages.
    pub text: String,
    pub kind: ServeAt,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServeAt {
    Tcp(SocketAddr),
    /// A unix socket to create (an address with a `/`).
    Unix(PathBuf),
}

impl ServeAddr {
    /// `HOST:PORT` (`127.0.0.1:9464`, `[::1]:9464`) or the path of a unix socket (it has a `/`).
    pub fn parse(text: &str) -> Result<ServeAddr, Error> {
        let kind = match text.contains('/') {
            true => ServeAt::Unix(PathBuf::from(text)),
            false => ServeAt::Tcp(text.parse().map_err(|_| Error::Serve {
                addr: text.to_owned(),
                reason: "not HOST:PORT (an IP address and a port, [::1]:9464 for IPv6) nor a socket path".into(),
            })?),
        };
        Ok(ServeAddr { text: text.to_owned(), kind })
    }
}

/// `-l [PATTERN] [--] PROGRAM [ARGS]`: the program's start-up only, to say what it has.
#[derive(Debug)]
pub struct List {
    /// No handler libraries: a listing runs none.
    pub setup: Setup,
    pub pattern: Option<String>,
    pub program: OsString,
    pub args: Vec<OsString>,
}

/// `--pid PID`: everything a launch takes but what only a program uprobe-run starts can
/// use, and `-l [PATTERN] --pid PID`.
#[derive(Debug)]
pub struct Attach {
    pub pid: i32,
    pub setup: Setup,
    /// `--duration`: detach after this long.
    pub duration: Option<Duration>,
    pub events: Events,
    pub aggregation: Aggregate,
    pub serve: Option<Serve>,
    /// `-l [PATTERN] --pid PID`: list what the process has mapped (the pattern, or empty).
    pub list: Option<String>,
}

impl Plan {
    /// The plan for `cli`, or the one line refusing it.
    pub fn new(mut cli: Cli) -> Result<Plan, Error> {
        if cli.version {
            return Ok(Plan::Version);
        }
        if let Some(dir) = cli.write_reference {
            return Ok(Plan::Reference(dir));
        }
        let config = match &cli.config {
            Some(path) => load_config(path)?,
            None => config::Config::default(),
        };
        if let Some(text) = &cli.line_range {
            let range = lines::listing::parse(text).map_err(Error::LineRange)?;
            let words = list_arguments(&cli.command)?.1;
            let program = resolve_program(Path::new(words.first().ok_or(Error::NoProgram)?))?;
            return Ok(Plan::Lines(Lines { range, program }));
        }
        let switches = Switches::of(&cli, &config.options);
        let aggregation = aggregate::aggregation(&cli)?;
        check_serve(&cli, aggregation.any())?;
        let mut params = Vec::new();
        for text in config.params.iter().chain(&cli.params) {
            params.push(Param::parse(text).map_err(|reason| Error::Param { param: text.clone(), reason })?);
        }
        let mut handlers = config.handlers;
        handlers.extend(cli.handlers.iter().cloned());
        let output = cli.output.clone().or(config.output).map(Output::new);
        let setup = Setup { handlers, params, output, switches };

        if let Some(pid) = cli.pid.or_else(|| listed_pid(&mut cli)) {
            return attach(pid, cli, setup, aggregation).map(|a| Plan::Attach(Box::new(a)));
        }
        if cli.duration.is_some() {
            return Err(Error::DurationWithoutPid);
        }
        if let Some(place) = &cli.vars {
            let program = resolve_program(Path::new(cli.command.first().ok_or(Error::NoProgram)?))?;
            return Ok(Plan::Vars { place: place.clone(), program });
        }
        let events = events(&cli, &aggregation)?;
        let serve = serve(&cli)?;
        if cli.list {
            let (pattern, command) = list_arguments(&cli.command)?;
            let (program, args) = command.split_first().ok_or(Error::NoProgram)?;
            let setup = Setup { handlers: Vec::new(), ..setup };
            return Ok(Plan::List(List { setup, pattern, program: program.clone(), args: args.to_vec() }));
        }
        let (program, args) = cli.command.split_first().ok_or(Error::NoProgram)?;
        let (program, args) = (program.clone(), args.to_vec());
        Ok(Plan::Launch(Box::new(Launch { setup, program, args, events, aggregation, serve })))
    }
}

/// `--serve` and its options, checked.
fn serve(cli: &Cli) -> Result<Option<Serve>, Error> {
    Ok(match &cli.serve {
        Some(addr) => Some(Serve {
            addr: ServeAddr::parse(addr)?,
            keys: cli.serve_keys.map(|n| n as usize),
            linger: Duration::from_nanos(cli.serve_linger.unwrap_or(0)),
        }),
        None => None,
    })
}

/// `-l [PATTERN] --pid PID`: the words after `-l` are read as a program, so a `--pid` among
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

/// `--pid`: every option of a launch, but those that apply to a program uprobe-run starts
/// (refused, named); with `-l`, the pattern.
fn attach(pid: i32, cli: Cli, setup: Setup, aggregation: Aggregate) -> Result<Attach, Error> {
    let duration = match cli.duration {
        Some(d) if !(d >= 0.0 && d.is_finite()) => return Err(Error::BadDuration(d)),
        d => d.map(Duration::from_secs_f64),
    };
    for (on, flag) in
        [(setup.switches.follow_exec, "--follow-exec"), (setup.switches.no_follow_fork, "--no-follow-fork")]
    {
        if on {
            return Err(Error::NotWithPid(flag));
        }
    }
    let list = match (cli.list, cli.command.as_slice()) {
        (true, []) => Some(String::new()),
        (true, [pattern]) => {
            let pattern = pattern.to_str().ok_or(Error::List("the PATTERN is not UTF-8"))?;
            if pattern.contains('\n') {
                return Err(Error::List("the PATTERN contains a newline"));
            }
            Some(pattern.to_owned())
        }
        (false, []) => None,
        _ => return Err(Error::PidAndProgram),
    };
    // A listing runs no handler library.
    let setup = match list {
        Some(_) => Setup { handlers: Vec::new(), ..setup },
        None => setup,
    };
    let events = events(&cli, &aggregation)?;
    let serve = serve(&cli)?;
    Ok(Attach { pid, setup, duration, events, aggregation, serve, list })
}

/// The event options of a launch, checked.
fn events(cli: &Cli, aggregation: &Aggregate) -> Result<Events, Error> {
    let (mut definitions, mut event_files) = (cli.events.clone(), cli.event_files.clone());
    usdt::inline_files(&mut definitions, &mut event_files)?;
    let by_name = |t: &String| usdt::names_a_marker(t) || lines::names_a_line(t);
    if definitions.iter().any(by_name) {
        // Markers and source lines by name become PATH:OFFSET definitions of the program's
        // files (the attached process's executable with --pid).
        let program = match cli.pid {
            Some(pid) => fs::read_link(format!("/proc/{pid}/exe"))
                .map_err(|source| Error::Read { path: PathBuf::from(format!("/proc/{pid}/exe")), source })?,
            None => {
                let words = if cli.list { list_arguments(&cli.command)?.1 } else { cli.command.clone() };
                resolve_program(Path::new(words.first().ok_or(Error::NoProgram)?))?
            }
        };
        definitions = usdt::translate(&definitions, &program)?;
        definitions = lines::translate(&definitions, &program)?;
    }
    if definitions.iter().any(|t| dwarf::names_variables(t) || dwarf::types_retval(t) || dwarf::plain_function(t)) {
        // DWARF names become fetchargs (registers, offsets) at the function's entry, and
        // `$retval` takes the function's return type.
        let program = match cli.pid {
            Some(pid) => PathBuf::from(format!("/proc/{pid}/exe")),
            None => {
                let words = if cli.list { list_arguments(&cli.command)?.1 } else { cli.command.clone() };
                resolve_program(Path::new(words.first().ok_or(Error::NoProgram)?))?
            }
        };
        definitions = dwarf::translate(&definitions, &program)?;
    }
    for def in &definitions {
        if def.contains('\n') {
            return Err(Error::Definition { def: def.clone(), reason: "one definition a line: no newline in -e" });
        }
    }
    let mut files = Vec::new();
    for file in &event_files {
        fs::File::open(file).map_err(|source| Error::EventsFile { path: file.clone(), source })?;
        files.push(spec::path(file)?);
    }
    let filters = filter::compile(&definitions, &event_files, &cli.filters, &aggregation.latency)?;
    for t in &cli.triggers {
        if t.contains('\n') || !t.contains(':') {
            return Err(Error::Filter(format!(
                "--trigger '{}': expected EVENT:enable=EVENT or EVENT:disable=EVENT",
                t.replace('\n', "\\n")
            )));
        }
    }
    if cli.max_events.is_some() && aggregation.any() {
        return Err(Error::Aggregate {
            option: "--max-events",
            reason: "limits the records of a stream: aggregations keep no records",
        });
    }
    Ok(Events {
        definitions,
        files,
        filters,
        format: cli.format,
        buffer_size: cli.buffer_size,
        triggers: cli.triggers.clone(),
        max_events: cli.max_events,
    })
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
/// the first is the pattern.
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

fn load_config(path: &Path) -> Result<config::Config, Error> {
    let text = fs::read_to_string(path).map_err(|source| Error::ConfigRead {
        path: path.into(),
        source: match source.kind() {
            io::ErrorKind::InvalidData => io::Error::other("not UTF-8 text"),
            _ => source,
        },
    })?;
    let base = path.parent().unwrap_or(Path::new(""));
    config::parse(&text, base).map_err(|e| Error::Config { path: path.into(), line: e.line, reason: e.reason })
}
