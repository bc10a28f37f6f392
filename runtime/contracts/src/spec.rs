//! What `uprobe-run` passes to the runtime: the run's [`Spec`], as the `UPROBE_RUN_SPEC`
//! environment variable of a launch or the first message of an attach session.
//!
//! The text is `KEY<TAB>VALUE` records, one a line, ending with `end<TAB>CHECK`: the FNV-1a
//! hash of every byte before that record, in 16 hex digits. [`encode`] writes it and [`decode`]
//! reads it, on both sides; a text cut short or changed on its way (the environment is the
//! program's to edit and pass on) is refused as a whole rather than read as another spec.

use thiserror::Error;

mod encode;
mod options;
pub use encode::encode;
use encode::{check, END};

/// The environment variable that carries the spec of a launch.
pub const ENV_SPEC: &str = "UPROBE_RUN_SPEC";

/// Everything a run asks of the runtime.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    /// Handler libraries, in command-line order.
    pub handlers: Vec<String>,
    /// `--param NAME=VALUE` pairs; a later one with the same name wins.
    pub params: Vec<(String, String)>,
    /// Where the runtime writes; None is stderr.
    pub output: Option<String>,
    /// `option<TAB>NAME` records.
    pub options: Options,
    /// `event<TAB>DEF`: event definitions (`-e`), in order.
    pub events: Vec<String>,
    /// `events<TAB>PATH`: files of event definitions (`--events`).
    pub event_files: Vec<String>,
    /// `filter<TAB>N<TAB>PROGRAM`: the compiled predicate of the Nth definition (`-e` in
    /// order, then the files' definitions), as `uprobe_contracts::filter::Program` writes it.
    pub filters: Vec<(usize, String)>,
    /// `max-events<TAB>N`: the stream keeps at most N records.
    pub max_events: Option<u64>,
    /// `trigger<TAB>EVENT:enable=E,disable=F`: hits of EVENT switch other events on or off.
    pub triggers: Vec<String>,
    /// `format<TAB>text|json|chrome|folded`: how events and reports are written (`folded`:
    /// a report's stacks as `frame;frame count` lines).
    pub format: Option<Format>,
    /// `buffer-size<TAB>BYTES`: each thread's event buffer.
    pub buffer_size: Option<usize>,
    /// `list<TAB>PATTERN`: list the functions that can be probed and end (PATTERN may be empty).
    pub list: Option<String>,
    /// What to aggregate instead of streaming events.
    pub aggregate: Aggregate,
}

/// How events (and aggregation reports) are written: the `format` record's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Format {
    /// `text`: as the kernel's trace shows them.
    #[default]
    Text = 0,
    /// `json`: one object a line.
    Json = 1,
    /// `chrome`: the Trace Event Format (Perfetto, chrome://tracing).
    Chrome = 2,
    /// `folded`: a report's stacks as `frame;frame;frame count` lines (`--count --by ustack`).
    Folded = 3,
}

impl Format {
    /// Every format, in the order of their numbers.
    pub const ALL: [Format; 4] = [Format::Text, Format::Json, Format::Chrome, Format::Folded];

    /// Its name in a `format` record and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
            Format::Chrome => "chrome",
            Format::Folded => "folded",
        }
    }

    /// The format `name` names, if it names one (exactly: no blanks, lower case).
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// Aggregation records: events counted, histograms and latencies kept instead of a stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Aggregate {
    /// `count<TAB>`: count every event.
    pub count: bool,
    /// `by<TAB>KEY`: counts per KEY (an argument's name, `tid`, `comm` or `caller`).
    pub by: Option<String>,
    /// `top<TAB>N`: keep the N largest counts.
    pub top: Option<usize>,
    /// `hist<TAB>EVENT.ARG`, `lhist<TAB>EVENT.ARG,MIN,MAX,STEP`, in order.
    pub hists: Vec<String>,
    /// See `hists`.
    pub lhists: Vec<String>,
    /// `latency<TAB>WHERE`: functions whose calls are timed.
    pub latency: Vec<String>,
    /// `interval<TAB>NS`: a report every NS nanoseconds.
    pub interval_ns: Option<u64>,
    /// `cumulative<TAB>`: interval reports count from the start.
    pub cumulative: bool,
    /// `feed<TAB>FD`: an inherited socket on which uprobe-run asks for the numbers it serves
    /// as metrics (`--serve`).
    pub feed: Option<i32>,
    /// `flamegraph<TAB>PATH`: the end of the run draws the stacks counted by `ustack` as a
    /// flame graph SVG into PATH.
    pub flamegraph: Option<String>,
    /// `pprof<TAB>PATH`: the end of the run writes the stacks counted by `ustack` as a
    /// gzipped pprof profile into PATH.
    pub pprof: Option<String>,
}

impl Aggregate {
    /// Whether the run aggregates instead of streaming its events.
    pub fn any(&self) -> bool {
        self.count || !self.hists.is_empty() || !self.lhists.is_empty() || !self.latency.is_empty()
    }
}

/// Behaviour switches, each an `option<TAB>NAME` record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// `follow-exec`: programs the process execs run with the runtime and the same handlers.
    pub follow_exec: bool,
    /// `no-follow-fork`: a forked child gets its text back without probes.
    pub no_follow_fork: bool,
    /// `no-optimize`: every probe keeps its `int3` (no jump probes).
    pub no_optimize: bool,
    /// `verbose`: each registration says the strategy chosen and why not a jump.
    pub verbose: bool,
    /// `full-vector-state`: jump stubs and the return trampoline save the whole vector state.
    pub full_vector_state: bool,
    /// `stats`: print the runtime's counters (placement time, system calls, traps) at exit.
    pub stats: bool,
    /// `lenient`: definitions whose probes cannot be placed are skipped, not refused.
    pub lenient: bool,
    /// `raw-address`: probes may go at addresses outside every function symbol.
    pub raw_address: bool,
    /// `call-graph`: every event records the user stack at its hit (`-g`), as `$ustack`.
    pub call_graph: bool,
    /// `followed-exec`: set by the runtime itself in the environment it passes on, so the
    /// exec'd program knows it was not started by uprobe-run directly.
    pub followed_exec: bool,
}

/// Why a text is not a spec, or a spec cannot be written as one.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SpecError {
    /// A line without the tab between key and value.
    #[error("record {0:?} has no tab between key and value")]
    NoTab(String),
    /// A `param` record whose value has no `=`.
    #[error("param record {0:?} has no '='")]
    ParamWithoutValue(String),
    /// A record key the runtime does not know.
    #[error("unknown record key {0:?}")]
    UnknownKey(String),
    /// An `option` record the runtime does not know.
    #[error("unknown option {0:?}")]
    UnknownOption(String),
    /// A record whose value does not parse.
    #[error("record {0:?} has a bad value")]
    BadValue(String),
    /// No `end` record closes the text: it was cut short.
    #[error("the spec is cut short (no end record)")]
    Truncated,
    /// The `end` record's check does not match the text before it.
    #[error("the spec was changed on its way (its check does not match)")]
    Corrupt,
    /// A value that a record cannot carry (a newline or a NUL, or a `param` name with `=`).
    #[error("{key} value {value:?} cannot be carried in a spec record")]
    Unencodable {
        /// The record's key.
        key: &'static str,
        /// The value.
        value: String,
    },
}

/// The spec a text encodes: every record checked, the whole text checked against its `end`
/// record. Never panics, whatever the text.
pub fn decode(text: &str) -> Result<Spec, SpecError> {
    let (body, sum) = match text.rsplit_once('\n') {
        Some((before, last)) => (&text[..before.len() + 1], last),
        None => ("", text),
    };
    let sum = sum.strip_prefix(END).ok_or(SpecError::Truncated)?;
    if sum.len() != 16 || !sum.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(SpecError::Truncated);
    }
    if u64::from_str_radix(sum, 16).ok() != Some(check(body.as_bytes())) {
        return Err(SpecError::Corrupt);
    }
    let mut spec = Spec::default();
    for line in body.split_terminator('\n') {
        let (key, value) = line.split_once('\t').ok_or_else(|| SpecError::NoTab(line.into()))?;
        match key {
            "handlers" => spec.handlers.push(value.into()),
            "param" => {
                let (name, v) = value.split_once('=').ok_or_else(|| SpecError::ParamWithoutValue(value.into()))?;
                spec.params.retain(|(n, _)| n != name);
                spec.params.push((name.into(), v.into()));
            }
            "output" => spec.output = Some(value.into()),
            "event" => spec.events.push(value.into()),
            "events" => spec.event_files.push(value.into()),
            "filter" => {
                let (n, program) = value.split_once('\t').ok_or_else(|| SpecError::BadValue(line.into()))?;
                let n = n.parse().map_err(|_| SpecError::BadValue(line.into()))?;
                spec.filters.push((n, program.into()));
            }
            "max-events" => spec.max_events = Some(value.parse().map_err(|_| SpecError::BadValue(line.into()))?),
            "trigger" => spec.triggers.push(value.into()),
            "format" => spec.format = Some(Format::from_name(value).ok_or_else(|| SpecError::BadValue(line.into()))?),
            "buffer-size" => spec.buffer_size = Some(value.parse().map_err(|_| SpecError::BadValue(line.into()))?),
            "list" => spec.list = Some(value.into()),
            "count" => spec.aggregate.count = true,
            "by" => spec.aggregate.by = Some(value.into()),
            "top" => spec.aggregate.top = Some(value.parse().map_err(|_| SpecError::BadValue(line.into()))?),
            "hist" => spec.aggregate.hists.push(value.into()),
            "lhist" => spec.aggregate.lhists.push(value.into()),
            "latency" => spec.aggregate.latency.push(value.into()),
            "interval" => {
                spec.aggregate.interval_ns = Some(value.parse().map_err(|_| SpecError::BadValue(line.into()))?)
            }
            "cumulative" => spec.aggregate.cumulative = true,
            "flamegraph" => spec.aggregate.flamegraph = Some(value.into()),
            "pprof" => spec.aggregate.pprof = Some(value.into()),
            "feed" => {
                let fd = value.parse().ok().filter(|&fd: &i32| fd >= 0);
                spec.aggregate.feed = Some(fd.ok_or_else(|| SpecError::BadValue(line.into()))?)
            }
            "option" => spec.options.set(value)?,
            _ => return Err(SpecError::UnknownKey(key.into())),
        }
    }
    Ok(spec)
}

impl Spec {
    /// The value of parameter `name`, if given.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `LD_PRELOAD` without the entries that name `lib` (by path or file name).
pub fn preload_without(preload: &str, lib: &str) -> String {
    let base = lib.rsplit('/').next().unwrap_or(lib);
    preload
        .split([':', ' '])
        .filter(|e| !e.is_empty() && *e != lib && e.rsplit('/').next() != Some(base))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    mod generated;

    /// `records` closed with their `end` record, decoded.
    fn parse(records: &str) -> Result<Spec, SpecError> {
        let body =
            if records.is_empty() || records.ends_with('\n') { records.to_owned() } else { format!("{records}\n") };
        decode(&format!("{body}{END}{:016x}", check(body.as_bytes())))
    }

    #[test]
    fn parses_records_in_order() {
        let s = parse("handlers\t/a.so\nparam\tv=1\nhandlers\t/b.so\nparam\tv=2=3\noutput\t/o\n").unwrap();
        assert_eq!(s.handlers, ["/a.so", "/b.so"]);
        assert_eq!(s.param("v"), Some("2=3"));
        assert_eq!(s.output.as_deref(), Some("/o"));
        assert_eq!(s.param("w"), None);
        assert_eq!(s.options, Options::default());
    }

    #[test]
    fn parses_options() {
        let s = parse("option\tfollow-exec\noption\tno-follow-fork\n").unwrap();
        assert_eq!(s.options, Options { follow_exec: true, no_follow_fork: true, ..Options::default() });
        let s = parse("option\tno-optimize\noption\tverbose\n").unwrap();
        assert!(s.options.no_optimize && s.options.verbose && !s.options.follow_exec);
        let s = parse("option\tfollow-exec\noption\tfollowed-exec").unwrap();
        assert!(s.options.followed_exec);
        assert_eq!(parse("option\tfollow-fork"), Err(SpecError::UnknownOption("follow-fork".into())));
    }

    #[test]
    fn parses_event_records() {
        let s = parse(
            "event\tp:a/b t:add a=%di\tx\nevents\t/e.txt\nformat\tjson\nbuffer-size\t4096\nlist\t\noption\tlenient\n",
        )
        .unwrap();
        assert_eq!(s.events, ["p:a/b t:add a=%di\tx"]);
        assert_eq!(s.event_files, ["/e.txt"]);
        assert_eq!((s.format, s.buffer_size, s.list.as_deref()), (Some(Format::Json), Some(4096), Some("")));
        assert!(s.options.lenient);
        assert_eq!(parse("format\txml"), Err(SpecError::BadValue("format\txml".into())));
        let s = parse("filter\t1\tn,a0,gt,u,3 not,0\nmax-events\t10\ntrigger\ta:enable=b\n").unwrap();
        assert_eq!(s.filters, [(1, "n,a0,gt,u,3 not,0".to_string())]);
        assert_eq!((s.max_events, s.triggers.as_slice()), (Some(10), &["a:enable=b".to_string()][..]));
        assert!(parse("filter\tx\tn").is_err() && parse("filter\t1").is_err());
    }

    #[test]
    fn formats_are_written_by_name_and_read_back() {
        assert_eq!(Format::ALL.map(Format::name), ["text", "json", "chrome", "folded"]);
        for format in Format::ALL {
            let spec = Spec { format: Some(format), ..Spec::default() };
            let text = encode(&spec).unwrap();
            assert!(text.starts_with(&format!("format\t{}\n", format.name())), "{text:?}");
            assert_eq!(decode(&text), Ok(spec));
            assert_eq!(Format::from_name(format.name()), Some(format));
        }
        for bad in ["xml", "JSON", " json", "json ", "", "text\tjson"] {
            let record = format!("format\t{bad}");
            assert_eq!(parse(&record), Err(SpecError::BadValue(record.clone())), "{bad:?}");
        }
    }

    #[test]
    fn parses_aggregation_records() {
        let s = parse(
            "count\t\nby\tsize\ntop\t5\nhist\tmalloc.size\nlhist\tf.x,0,100,10\nlatency\tlibc:str*\n\
             interval\t500000000\ncumulative\t\nfeed\t5\n",
        )
        .unwrap();
        let a = &s.aggregate;
        assert!(a.count && a.cumulative && a.any());
        assert_eq!((a.by.as_deref(), a.top, a.interval_ns), (Some("size"), Some(5), Some(500_000_000)));
        assert_eq!(
            (a.hists.as_slice(), a.lhists.as_slice()),
            (&["malloc.size".to_string()][..], &["f.x,0,100,10".to_string()][..])
        );
        assert_eq!((a.latency.as_slice(), a.feed), (&["libc:str*".to_string()][..], Some(5)));
        assert_eq!(parse("feed\t-1"), Err(SpecError::BadValue("feed\t-1".into())));
        assert!(!parse("").unwrap().aggregate.any());
        assert_eq!(parse("top\tx"), Err(SpecError::BadValue("top\tx".into())));
    }

    #[test]
    fn rejects_malformed_records() {
        assert_eq!(parse("handlers /a.so"), Err(SpecError::NoTab("handlers /a.so".into())));
        assert_eq!(parse("param\tv"), Err(SpecError::ParamWithoutValue("v".into())));
        assert_eq!(parse("x\ty"), Err(SpecError::UnknownKey("x".into())));
    }

    #[test]
    fn removes_only_our_preload_entry() {
        assert_eq!(preload_without("/x/libuprobe.so", "/x/libuprobe.so"), "");
        assert_eq!(preload_without("/u/a.so:/x/libuprobe.so", "/x/libuprobe.so"), "/u/a.so");
        assert_eq!(preload_without("/u/a.so /y/libuprobe.so b.so", "/x/libuprobe.so"), "/u/a.so:b.so");
    }
}
