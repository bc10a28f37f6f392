//! The arguments: the command line's definitions (clap), with the checks a value makes on
//! its own (numbers, sizes, seconds), the `--config` file's format ([`config`]), and the
//! reference generated from the definitions ([`mod@reference`]: man page, completions). What
//! the options mean together is the plan's to judge (`crate::plan`).
//!
//! Context: uprobe-run's own process, first thing.

pub mod config;
pub mod reference;

use crate::base::error::Error;
use clap::builder::TypedValueParser as _;
use clap::error::ErrorKind;
use clap::Parser;
use std::ffi::OsString;
use std::path::PathBuf;
pub use uprobe_contracts::spec::Format;

/// The headings of `--help` (and of the man page), in the order they first appear: each
/// option goes under one. `-h`, `--help` and `-V` stand under clap's own "Options".
pub mod heading {
    pub const HANDLERS: &str = "Handlers and output";
    pub const PROBES: &str = "Probes";
    pub const EVENTS: &str = "Events";
    pub const AGGREGATIONS: &str = "Aggregations";
    pub const METRICS: &str = "Metrics";
    pub const MODES: &str = "Listing and attaching";
}

/// Runs PROGRAM with in-process user-space probes: the runtime (libuprobe.so) is preloaded,
/// loads the handler libraries and lets them probe the program's code.
#[derive(Debug, Parser)]
#[command(
    name = "uprobe-run",
    disable_version_flag = true,
    override_usage = "uprobe-run [OPTIONS] [--] PROGRAM [ARGS...]\n       uprobe-run [OPTIONS] -p|--pid PID",
    after_help = "\
Exit status: the program keeps uprobe-run's process: its exit status, or the signal that
killed it, is uprobe-run's; where writes of the output (-o, default stderr; -o - is stdout)
failed, one line says what was lost and an exit status of 0 becomes 74. Refusals (static or
setuid program, missing library, bad config) print one line and exit with status 2 before the
program starts. The handlers' uprobe_exit and the end-of-run lines come once per process
however it ends: return from main, exit, _exit, exec, or a signal such as Ctrl-C, SIGTERM or
SIGSEGV (the process then dies of that signal); SIGKILL is the one ending that cannot report.

Attaching: with --pid, uprobe-run attaches to the running process PID instead: it loads the
runtime into it (if it is not there), runs the handlers' uprobe_init there and stays in the
foreground, relaying their output; Ctrl-C, SIGTERM, the end of --duration or the process's
exit detaches (uprobe_exit runs, the probes are removed, the process runs on). Exit status:
0 after a detach, 127 if a uprobe_init failed, 74 if the output could not all be written,
2 for a refusal (nothing was changed). Definitions (-e, --events), aggregations,
--format, --buffer-size and --lenient work with --pid as in a launch: records and reports
come over the session, the final report when it ends; -l [PATTERN] --pid PID lists what
the process has mapped now.

Config file: one directive per line, `#` starts a comment line:
  handlers PATH       like --handlers (relative paths: from the config file's directory)
  param NAME=VALUE    like --param
  output PATH         like --output
  no-optimize         like --no-optimize
  verbose             like --verbose
  full-vector-state   like --full-vector-state
  follow-exec         like --follow-exec (also `option follow-exec`)
  no-follow-fork      like --no-follow-fork (also `option no-follow-fork`)
  stats, lenient, raw-address   like the options of the same name
Config entries come before command-line ones; --output overrides `output`.

Environment: UPROBE_LIB overrides the runtime library. Without it, uprobe-run preloads
libuprobe.so from beside itself, or else the copy it carries, written once to
$XDG_CACHE_HOME/uprobe-run/ (default ~/.cache; /tmp/uprobe-run-UID if that cannot be written).

Examples:
  # The classic example: a probe at myfunc's address (nm of a non-PIE program), each hit told
  uprobe-run --handlers uprobe_example --param vaddr=0x401126 ./myprog
  # The same by name (PIE programs, libraries): --param symbol=myfunc or symbol=libc:malloc
  uprobe-run --handlers uprobe_example --param symbol=myfunc ./myprog
  # Count hits per probe, a table at the end
  uprobe-run --handlers count --param probes=main,myfunc,libc.so.6:printf ./myprog
  # Each call of myfunc and what it returns (a return probe)
  uprobe-run --handlers uretprobe_example --param func=myfunc ./myprog
  # An event per call, no code to write (the kernel's uprobe_events syntax)
  uprobe-run -e 'p:myfunc ./myprog:myfunc n=%di:s32' ./myprog
  # malloc calls counted per size (the 10 most common), then how long each call takes
  uprobe-run -e 'p:m libc:malloc size=%di:u64' --count --by size --top 10 ./myprog
  uprobe-run --latency libc:malloc ./myprog
  # Only the large allocations, then counted by caller and size
  uprobe-run -e 'p libc.so.6:malloc size=%di:u64 if size >= 65536' ./myprog
  uprobe-run -e 'p:m libc:malloc size=%di:u64' --filter 'm: size >= 4096' --count --by caller,size ./myprog
  # Attach to a running process; Ctrl-C detaches
  uprobe-run --pid 4242 --handlers uprobe_example --param symbol=myfunc

Bundled handlers: uprobe-run carries these, named by their short names (or their file names)
in --handlers, and writes them once to $XDG_CACHE_HOME/uprobe-run/handlers/ (default
~/.cache); a file of the name given, or one beside uprobe-run (target/release/), is preferred:
  uprobe_example        the classic kernel example: --param vaddr=ADDRESS or symbol=NAME,
                        verbose=0 to count only
  uretprobe_example     calls and return values: --param func=NAME (or an 0x address)
  count (libcount.so)   hits per probe: --param probes=SPEC,... and/or probes-file=FILE"
)]
// The fields' doc comments are the --help text, not Markdown: `[FETCHARGS]` is usage, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
pub struct Cli {
    /// Handler library to load (repeatable; loaded in the order given): a path, or a bundled
    /// library's short name (count, uprobe_example, uretprobe_example).
    #[arg(long = "handlers", value_name = "LIB.so", help_heading = heading::HANDLERS)]
    pub handlers: Vec<PathBuf>,

    /// Parameter for the handlers, read with uprobe_param() (repeatable; the last NAME wins).
    #[arg(long = "param", value_name = "NAME=VALUE", help_heading = heading::HANDLERS)]
    pub params: Vec<String>,

    /// File naming handler libraries, parameters and the output file.
    #[arg(long, value_name = "FILE", help_heading = heading::HANDLERS)]
    pub config: Option<PathBuf>,

    /// Where uprobe_printf and the handlers write (created or truncated; default: stderr).
    #[arg(short, long, value_name = "FILE", help_heading = heading::HANDLERS)]
    pub output: Option<PathBuf>,

    /// Keep every probe on the int3 trap path (no jump probes), like kprobes' optimization
    /// switch; for comparing the two paths.
    #[arg(long, help_heading = heading::PROBES)]
    pub no_optimize: bool,

    /// Say, for each registered probe, the strategy chosen (jump or int3) and why not a jump.
    #[arg(short, long, help_heading = heading::PROBES)]
    pub verbose: bool,

    /// Make jump probes and return probes save the whole vector state (XSAVE) around
    /// handlers, not only xmm0-15: for programs that keep AVX values live across calls.
    #[arg(long, help_heading = heading::PROBES)]
    pub full_vector_state: bool,

    /// Print the runtime's own counters at exit: time spent placing probes, the system calls
    /// it made for that, reads of the address space, and traps it took itself.
    #[arg(long, help_heading = heading::PROBES)]
    pub stats: bool,

    /// Run programs that the program execs with the runtime and the same handlers too
    /// (default: they run without it, as kernel uprobes are dropped on exec).
    #[arg(long, help_heading = heading::PROBES)]
    pub follow_exec: bool,

    /// Give forked children their code back without probes (default: children keep the
    /// probes and the handlers' state).
    #[arg(long, help_heading = heading::PROBES)]
    pub no_follow_fork: bool,

    /// Event definition in the kernel's uprobe_events grammar: p|r[:[GRP/]EVENT] WHERE
    /// [FETCHARGS] [if FILTER] (repeatable). Each hit becomes a record on the output; with
    /// `if`, only the hits that pass FILTER (the kernel's event-filter grammar, see --filter).
    #[arg(short = 'e', long = "event", value_name = "DEF", help_heading = heading::EVENTS)]
    pub events: Vec<String>,

    /// File of event definitions, one a line (`#` starts a comment line; repeatable).
    #[arg(long = "events", value_name = "FILE", help_heading = heading::EVENTS)]
    pub event_files: Vec<PathBuf>,

    /// A predicate on the events named EVENT (GRP/EVENT or a glob), in the kernel's event
    /// filter grammar: FIELD OP VALUE joined by &&, || and !, with parentheses; numbers take
    /// == != < <= > >= &, strings == != ~ (a glob). FIELDs: the event's fetchargs, $retval
    /// (return events), comm, tid (common_pid), cpu. Hits that fail are neither recorded nor
    /// counted (repeatable; with `if` in the definition too, a hit must pass both).
    #[arg(long = "filter", value_name = "EVENT: EXPR", help_heading = heading::EVENTS)]
    pub filters: Vec<String>,

    /// Record the user stack at every hit of every event, as a `$ustack` fetcharg (perf's
    /// -g): text shows it as perf script shows call chains, json as an array of frames.
    #[arg(short = 'g', long, help_heading = heading::EVENTS)]
    pub call_graph: bool,

    /// How events are written: text (as the kernel's trace shows them), json (one object a
    /// line) or chrome (Trace Event Format, for Perfetto and chrome://tracing); reports are
    /// text or json, or folded (`--count --by ustack`: one `frame;frame;frame count` line a
    /// stack, outermost first, as stackcollapse writes them for flame graph tools).
    #[arg(long, value_name = "FORMAT", value_parser = format_parser(), help_heading = heading::EVENTS)]
    pub format: Option<Format>,

    /// Each thread's event buffer (bytes; K, M and G suffixes; default 1M). A full buffer
    /// drops records, counted per event and reported at the end.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, allow_hyphen_values = true, help_heading = heading::EVENTS)]
    pub buffer_size: Option<usize>,

    /// A hit of EVENT that passes its filter switches other events on or off, for the whole
    /// process: `--trigger begin_request:enable=query --trigger end_request:disable=query`
    /// records the queries of one request. An event some trigger enables starts off
    /// (repeatable; ACTIONs separated by commas; names may be GRP/EVENT or globs).
    #[arg(long = "trigger", value_name = "EVENT:enable|disable=EVENT", help_heading = heading::EVENTS)]
    pub triggers: Vec<String>,

    /// Stop recording events after N records (the program runs on; the end of the run says
    /// how many hits were not recorded).
    #[arg(long, value_name = "N", value_parser = parse_records, allow_hyphen_values = true, help_heading = heading::EVENTS)]
    pub max_events: Option<u64>,

    /// Skip event probes that cannot be placed (unknown function, glob matching nothing)
    /// instead of refusing the run; a definition that does not parse is still refused.
    #[arg(long, help_heading = heading::PROBES)]
    pub lenient: bool,

    /// Allow probes at addresses outside every function symbol (stripped programs, assembly
    /// without symbol sizes); by default such an address is refused with -EINVAL, since an
    /// int3 in padding or data never fires or corrupts what it replaces.
    #[arg(long, help_heading = heading::PROBES)]
    pub raw_address: bool,
    /// Count the events instead of streaming them; a report at the end (and every --interval).
    #[arg(long, help_heading = heading::AGGREGATIONS)]
    pub count: bool,

    /// With --count: counts per KEY, an argument name of the events, tid, comm, caller (the
    /// return address, as symbol+offset) or ustack[:DEPTH] (the whole user stack, at most
    /// DEPTH frames, 1 to 127, default 127); several KEYs separated by commas count per
    /// combination (`--by caller,size`), a column each.
    #[arg(long, value_name = "KEY[,KEY...]", help_heading = heading::AGGREGATIONS)]
    pub by: Option<String>,

    /// With --count --by ustack: at the end of the run, draw the counted stacks as a flame
    /// graph into FILE.svg (an SVG, as flamegraph.pl draws them).
    #[arg(long, value_name = "FILE.svg", help_heading = heading::AGGREGATIONS)]
    pub flamegraph: Option<PathBuf>,

    /// With --count --by ustack: at the end of the run, write the counted stacks as a
    /// gzipped pprof profile into FILE (`go tool pprof`, Pyroscope, speedscope read it).
    #[arg(long, value_name = "FILE", help_heading = heading::AGGREGATIONS)]
    pub pprof: Option<PathBuf>,

    /// With --count: keep the N largest counts.
    #[arg(long, value_name = "N", value_parser = parse_top, allow_negative_numbers = true, help_heading = heading::AGGREGATIONS)]
    pub top: Option<u64>,

    /// A log2 histogram of an event's argument, as bpftrace's hist() (repeatable; EVENT may be
    /// GRP/EVENT or a glob).
    #[arg(long = "hist", value_name = "EVENT.ARG", help_heading = heading::AGGREGATIONS)]
    pub hists: Vec<String>,

    /// A linear histogram of an event's argument, as bpftrace's lhist() (repeatable).
    #[arg(long = "lhist", value_name = "EVENT.ARG,MIN,MAX,STEP", help_heading = heading::AGGREGATIONS)]
    pub lhists: Vec<String>,

    /// Time every call of the functions at WHERE (as in a definition; globs allowed): calls,
    /// total, min, max, mean and a log2 histogram in ns (repeatable).
    #[arg(long, value_name = "WHERE", help_heading = heading::AGGREGATIONS)]
    pub latency: Vec<String>,

    /// A report every SECONDS (decimals allowed), each with that interval's own numbers.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, allow_negative_numbers = true, help_heading = heading::AGGREGATIONS)]
    pub interval: Option<u64>,

    /// With --interval: each report counts from the start of the run.
    #[arg(long, help_heading = heading::AGGREGATIONS)]
    pub cumulative: bool,

    /// Serve the aggregations as Prometheus metrics at ADDR/metrics (HOST:PORT, [::1]:PORT,
    /// or the path of a unix socket to create), from uprobe-run while the program runs.
    #[arg(long, value_name = "ADDR", help_heading = heading::METRICS)]
    pub serve: Option<String>,

    /// With --serve: the most keys of --by served (default 10000); the hits of the others are
    /// counted as cut.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000_000), help_heading = heading::METRICS)]
    pub serve_keys: Option<u64>,

    /// With --serve: keep serving the last numbers SECONDS after the program ends (SIGINT or
    /// SIGTERM ends that early); by default uprobe-run ends with the program.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, help_heading = heading::METRICS)]
    pub serve_linger: Option<u64>,

    /// List the functions that can be probed in PROGRAM and the libraries it loads, with
    /// the strategy a probe would get: uprobe-run -l [PATTERN] [--] PROGRAM; or in a running
    /// process, what it has mapped now: uprobe-run -l [PATTERN] --pid PID.
    #[arg(short = 'l', long, help_heading = heading::MODES)]
    pub list: bool,

    /// List the DWARF variables available at FUNC's entry (FUNC, FUNC+OFFSET or
    /// MODULE:FUNC) or on a source line (FUNC:LINE, MODULE:FUNC:LINE, [MODULE:]FILE.c:LINE)
    /// in PROGRAM, with their types and the fetchargs they become, as `perf probe -V` lists
    /// them: uprobe-run --vars FUNC[:LINE] PROGRAM.
    #[arg(long, value_name = "FUNC", help_heading = heading::MODES)]
    pub vars: Option<String>,
    /// Show the source lines of a function (numbered from its declared line) or of a source
    /// file, with a number on each line a probe can go on (`p PROG:FUNC:N`, `p FILE.c:N`),
    /// as perf probe -L shows them: uprobe-run -L FUNC[:START[-END]] PROGRAM, or
    /// -L FILE.c[:START[-END]] PROGRAM. Reads the DWARF of PROGRAM or of its debug file.
    #[arg(short = 'L', long = "line", value_name = "FUNC|FILE[:START[-END]]", help_heading = heading::MODES)]
    pub line_range: Option<String>,

    /// Print the version and the runtime library uprobe-run preloads, then exit.
    #[arg(short = 'V', long)]
    pub version: bool,
    /// Attach to the running process PID instead of starting a program; Ctrl-C detaches.
    #[arg(short = 'p', long, value_name = "PID", value_parser = parse_pid, allow_negative_numbers = true, help_heading = heading::MODES)]
    pub pid: Option<i32>,

    /// With --pid: detach after SECONDS (a decimal number).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, help_heading = heading::MODES)]
    pub duration: Option<f64>,

    /// Write the man page and the bash, zsh and fish completions into DIR, then exit (for
    /// installs and packages; see loader-cli/README.md).
    #[arg(long, value_name = "DIR", hide = true)]
    pub write_reference: Option<PathBuf>,

    /// The program to run and its arguments, passed on verbatim.
    #[arg(value_name = "PROGRAM", trailing_var_arg = true)]
    pub command: Vec<OsString>,
}

/// `--format`: one of the run spec's formats, by the name its record carries.
fn format_parser() -> impl clap::builder::TypedValueParser<Value = Format> {
    clap::builder::PossibleValuesParser::new(Format::ALL.map(Format::name))
        .map(|name| Format::from_name(&name).expect("a possible value names a format"))
}

/// A period in seconds (`1`, `0.5`), as nanoseconds: from 1 ms to a day.
pub fn parse_seconds(text: &str) -> Result<u64, String> {
    let seconds: f64 = text.trim().parse().map_err(|_| format!("expected seconds like 1 or 0.5, not {text:?}"))?;
    if !(0.001..=86_400.0).contains(&seconds) {
        return Err(format!("{text}: from 0.001 to 86400 seconds"));
    }
    Ok((seconds * 1e9).round() as u64)
}

/// `--top`: a whole number from 1.
pub fn parse_top(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("a whole number of keys from 1 up, not {text:?}")),
    }
}

/// `--max-events`: a whole number of records from 1.
pub fn parse_records(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("a whole number of records from 1 up, not {text:?}")),
    }
}

/// `--pid`: a process id, a whole number from 1.
pub fn parse_pid(text: &str) -> Result<i32, String> {
    match text.trim().parse::<i32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("a process id (a whole number from 1 up), not {text:?}")),
    }
}

/// A size in bytes: `65536`, `64K`, `1M`, `1G`.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("expected a size like 65536, 64K or 1M, not {text:?}")),
    };
    let n: usize = digits.parse().map_err(|_| format!("expected a size like 65536, 64K or 1M, not {text:?}"))?;
    match n.checked_shl(shift).filter(|&b| (4096..=1 << 30).contains(&b)) {
        Some(bytes) => Ok(bytes),
        None => Err(format!("{text}: a buffer from 4K to 1G")),
    }
}

impl Cli {
    /// Parses the process's arguments; `--help` and `--version` print and exit here.
    pub fn from_args() -> Result<Self, Error> {
        Self::parse_from_args(std::env::args_os())
    }

    pub fn parse_from_args<I, T>(args: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Self::try_parse_from(args).or_else(|e| match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => Err(Error::Usage(first_line(&e.to_string()))),
        })
    }
}

/// clap's first line, without its `error: ` prefix: the rest (tips, usage) would make the
/// refusal more than one line.
fn first_line(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, Error> {
        Cli::parse_from_args(std::iter::once("uprobe-run").chain(args.iter().copied()))
    }

    #[test]
    fn program_arguments_pass_verbatim() {
        let cli = parse(&[
            "--handlers",
            "a.so",
            "--param",
            "p=1",
            "--handlers",
            "b.so",
            "./prog",
            "-v",
            "--foo",
            "--help",
            "-o",
            "--handlers",
            "c.so",
            "--",
        ])
        .unwrap();
        assert_eq!(cli.handlers, [PathBuf::from("a.so"), PathBuf::from("b.so")]);
        assert_eq!(cli.params, ["p=1"]);
        assert_eq!(cli.command, ["./prog", "-v", "--foo", "--help", "-o", "--handlers", "c.so", "--"]);
    }

    #[test]
    fn follow_options() {
        let cli = parse(&["--follow-exec", "--no-follow-fork", "./prog", "--follow-exec"]).unwrap();
        assert!(cli.follow_exec && cli.no_follow_fork);
        assert_eq!(cli.command, ["./prog", "--follow-exec"]);
        let cli = parse(&["./prog"]).unwrap();
        assert!(!cli.follow_exec && !cli.no_follow_fork);
    }

    #[test]
    fn double_dash_ends_options() {
        let cli = parse(&["-o", "out", "--", "-prog", "x"]).unwrap();
        assert_eq!(cli.output, Some(PathBuf::from("out")));
        assert_eq!(cli.command, ["-prog", "x"]);
    }

    #[test]
    fn no_program_is_not_a_clap_error() {
        assert!(parse(&["--handlers", "a.so"]).unwrap().command.is_empty());
    }

    #[test]
    fn event_options() {
        let cli = parse(&[
            "-e",
            "p t:add a=%di",
            "--event",
            "r t:add $retval",
            "--events",
            "e.txt",
            "--format",
            "json",
            "--buffer-size",
            "64K",
            "--lenient",
            "./t",
        ])
        .unwrap();
        assert_eq!(cli.events, ["p t:add a=%di", "r t:add $retval"]);
        assert_eq!(cli.event_files, [PathBuf::from("e.txt")]);
        assert_eq!((cli.format, cli.buffer_size, cli.lenient), (Some(Format::Json), Some(65536), true));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert!(parse_size("12").is_err() && parse_size("3X").is_err());
        let cli = parse(&["-l", "str*", "--", "./t"]).unwrap();
        assert!(cli.list);
        assert_eq!(cli.command, ["str*", "--", "./t"]);
    }

    #[test]
    fn attach_options() {
        let cli = parse(&["-p", "42", "--handlers", "h.so", "--duration", "1.5"]).unwrap();
        assert_eq!((cli.pid, cli.duration), (Some(42), Some(1.5)));
        assert!(cli.command.is_empty());
        assert_eq!(parse(&["--pid", "7"]).unwrap().pid, Some(7));
    }

    #[test]
    fn aggregation_options() {
        let cli = parse(&[
            "--count",
            "--by",
            "size",
            "--top",
            "5",
            "--hist",
            "a.x",
            "--lhist",
            "a.x,0,100,10",
            "--latency",
            "libc:str*",
            "--interval",
            "0.5",
            "--cumulative",
            "./t",
        ])
        .unwrap();
        assert!(cli.count && cli.cumulative);
        assert_eq!((cli.by.as_deref(), cli.top, cli.interval), (Some("size"), Some(5), Some(500_000_000)));
        assert_eq!((cli.hists.len(), cli.lhists.len(), cli.latency.len()), (1, 1, 1));
        assert!(parse(&["--top", "0", "./t"]).is_err());
        assert!(parse_seconds("0").is_err() && parse_seconds("x").is_err());
        assert_eq!(parse_seconds("2"), Ok(2_000_000_000));
    }

    #[test]
    fn unknown_options_are_one_line() {
        let err = parse(&["--bogus", "./prog"]).unwrap_err().to_string();
        assert_eq!(err, "unexpected argument '--bogus' found (see uprobe-run --help)");
    }
}
