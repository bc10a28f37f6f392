//! The aggregation options (`--count`, `--by`, `--top`, `--hist`, `--lhist`, `--latency`,
//! `--interval`, `--cumulative`): checked for what makes sense together, then passed to the
//! runtime in the run spec. What they name (events, arguments, functions) is the
//! runtime's to check, against the definitions it resolves, before the program starts.

use uprobe_contracts::spec::Aggregate;

use crate::args::{Cli, Format};
use crate::base::error::Error;

/// The aggregation options of `cli` as the run spec carries them (all empty when the run
/// streams records instead: [`Aggregate::any`] is false), or the one line refusing them.
pub fn aggregation(cli: &Cli) -> Result<Aggregate, Error> {
    let aggregating = cli.count || !cli.hists.is_empty() || !cli.lhists.is_empty() || !cli.latency.is_empty();
    let needs = |set: bool, option: &'static str, reason: &'static str| match set {
        true => Err(Error::Aggregate { option, reason }),
        false => Ok(()),
    };
    needs(cli.by.is_some() && !aggregating, "--by", "splits a report: it needs --count, --hist, --lhist or --latency")?;
    needs(
        cli.top.is_some() && !cli.count && cli.by.is_none(),
        "--top",
        "keeps the largest counts or keys: it needs --count or --by",
    )?;
    needs(
        cli.cumulative && cli.interval.is_none(),
        "--cumulative",
        "applies to interval reports: it needs --interval",
    )?;
    needs(
        cli.interval.is_some() && !aggregating,
        "--interval",
        "needs a report: --count, --hist, --lhist or --latency",
    )?;
    let no_events = cli.events.is_empty() && cli.event_files.is_empty();
    needs(cli.count && no_events, "--count", "no events to count (define them with -e or --events)")?;
    let histograms = !cli.hists.is_empty() || !cli.lhists.is_empty();
    needs(histograms && no_events, "--hist", "no events to take values from (define them with -e or --events)")?;
    needs(aggregating && cli.format == Some(Format::Chrome), "--format chrome", "reports are text, json or folded")?;
    // Whether a part of the key is a stack (`ustack`, or an argument `$ustack`) is the
    // runtime's to check, against the definitions.
    let stacks = cli.count && cli.by.is_some();
    let folded = cli.format == Some(Format::Folded);
    let timed = !cli.latency.is_empty() && cli.by.is_some();
    needs(
        folded && !stacks && !timed,
        "--format folded",
        "folds the stacks of --count --by ustack or of --latency --by ustack",
    )?;
    needs(
        folded && stacks && timed,
        "--format folded",
        "folds counts or timed calls (total ns), not both in one report",
    )?;
    needs(folded && histograms, "--format folded", "histograms have no stacks to fold")?;
    needs(cli.flamegraph.is_some() && !stacks, "--flamegraph", "draws the stacks of --count --by ustack")?;
    needs(cli.pprof.is_some() && !stacks, "--pprof", "writes the stacks of --count --by ustack")?;
    needs(
        cli.pprof.is_some() && timed,
        "--pprof",
        "writes the stacks of counted hits, not of timed calls (--latency)",
    )?;
    let flamegraph = whole_path("--flamegraph", cli.flamegraph.as_deref())?;
    let pprof = whole_path("--pprof", cli.pprof.as_deref())?;

    let one_line = |option: &'static str, texts: &[String]| match texts.iter().find(|t| t.contains('\n')) {
        Some(text) => Err(Error::AggregateValue { option, value: text.clone(), reason: "contains a newline" }),
        None => Ok(texts.to_vec()),
    };
    let by = cli.by.as_ref().map(|keys| one_line("--by", std::slice::from_ref(keys))).transpose()?;
    // A part written twice is refused by the runtime's plan; two stacks of other depths
    // (`ustack:4,ustack`) are not the same words, and are refused here.
    if let Some(keys) = &cli.by {
        let parts: Vec<&str> = keys.split(',').map(str::trim).collect();
        let stacks = parts.iter().filter(|p| **p == "ustack" || p.starts_with("ustack:")).count();
        needs_value(stacks > 1, "--by", keys, "one stack a key (ustack or ustack:DEPTH, once)")?;
    }
    Ok(Aggregate {
        count: cli.count,
        by: by.map(|keys| keys.concat()),
        top: cli.top.map(|n| n as usize),
        hists: one_line("--hist", &cli.hists)?,
        lhists: one_line("--lhist", &cli.lhists)?,
        latency: one_line("--latency", &cli.latency)?,
        interval_ns: cli.interval,
        cumulative: cli.cumulative,
        // The socket's number is known when the launch or attach makes it (`--serve`).
        feed: None,
        flamegraph,
        pprof,
    })
}

/// A file the end of the run writes, as a whole path (the program may change directory).
/// `Err` naming `option` and its `value` with `reason` if `refused`.
fn needs_value(refused: bool, option: &'static str, value: &str, reason: &'static str) -> Result<(), Error> {
    match refused {
        true => Err(Error::AggregateValue { option, value: value.to_owned(), reason }),
        false => Ok(()),
    }
}

fn whole_path(option: &'static str, path: Option<&std::path::Path>) -> Result<Option<String>, Error> {
    let Some(path) = path else { return Ok(None) };
    let whole = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match whole.to_str().filter(|p| !p.contains('\n')) {
        Some(p) => Ok(Some(p.to_owned())),
        None => {
            let value = whole.to_string_lossy().into_owned();
            Err(Error::AggregateValue { option, value, reason: "not a UTF-8 path of one line" })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_of(args: &[&str]) -> Result<Aggregate, String> {
        let cli = Cli::parse_from_args(std::iter::once("uprobe-run").chain(args.iter().copied()).chain(["./t"]))
            .map_err(|e| e.to_string())?;
        aggregation(&cli).map_err(|e| e.to_string())
    }

    #[test]
    fn options_become_the_spec() {
        let r =
            spec_of(&["-e", "p t:f a=%di", "--count", "--by", "a", "--top", "3", "--hist", "f.a", "--interval", "1"])
                .unwrap();
        let expected = Aggregate {
            count: true,
            by: Some("a".into()),
            top: Some(3),
            hists: vec!["f.a".into()],
            interval_ns: Some(1_000_000_000),
            ..Aggregate::default()
        };
        assert_eq!(r, expected);
        assert_eq!(
            spec_of(&["--latency", "t:f"]).unwrap(),
            Aggregate { latency: vec!["t:f".into()], ..Aggregate::default() }
        );
        assert!(!spec_of(&[]).unwrap().any());
    }

    #[test]
    fn refusals_name_the_option() {
        let refused = |args: &[&str]| spec_of(args).unwrap_err();
        assert_eq!(
            refused(&["-e", "p t:f", "--by", "tid"]),
            "--by: splits a report: it needs --count, --hist, --lhist or --latency"
        );
        assert_eq!(
            refused(&["-e", "p t:f", "--top", "2"]),
            "--top: keeps the largest counts or keys: it needs --count or --by"
        );
        assert!(spec_of(&["--latency", "t:f", "--by", "ustack:4", "--top", "2"]).is_ok());
        assert!(refused(&["--latency", "f", "--cumulative"]).starts_with("--cumulative: "));
        assert!(refused(&["-e", "p t:f", "--interval", "1"]).starts_with("--interval: needs a report"));
        assert!(refused(&["--count"]).starts_with("--count: no events to count"));
        assert!(refused(&["--lhist", "f.a,0,10,1"]).starts_with("--hist: no events"));
        assert_eq!(
            refused(&["--latency", "f", "--format", "chrome"]),
            "--format chrome: reports are text, json or folded"
        );
        assert_eq!(refused(&["--latency", "f\ng"]), "--latency 'f\\ng': contains a newline");
        assert_eq!(
            refused(&["-e", "p t:f", "--count", "--by", "ustack:4,ustack"]),
            "--by 'ustack:4,ustack': one stack a key (ustack or ustack:DEPTH, once)"
        );
        assert_eq!(
            refused(&["-e", "p t:f", "--count", "--pprof", "x.pb.gz"]),
            "--pprof: writes the stacks of --count --by ustack"
        );
        assert_eq!(
            refused(&["-e", "p t:f", "--count", "--by", "ustack", "--latency", "f", "--pprof", "x.pb.gz"]),
            "--pprof: writes the stacks of counted hits, not of timed calls (--latency)"
        );
    }
}
