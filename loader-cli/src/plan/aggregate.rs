//! The aggregation options (`--count`, `--by`, `--top`, `--hist`, `--lhist`, `--latency`,
//! `--interval`, `--cumulative`): checked for what makes sense together, then passed to the
//! runtime as `UPROBE_RUN_SPEC` records. What they name (events, arguments, functions) is the
//! runtime's to check, against the definitions it resolves, before the program starts.

use std::ffi::OsString;

use crate::cli::{Cli, Format};
use crate::error::Error;

/// The records for the aggregation options of `cli`, or the one line refusing them.
pub fn records(cli: &Cli) -> Result<Vec<(&'static str, OsString)>, Error> {
    let aggregating = cli.count || !cli.hists.is_empty() || !cli.lhists.is_empty() || !cli.latency.is_empty();
    let needs = |set: bool, option: &'static str, reason: &'static str| match set {
        true => Err(Error::Aggregate { option, reason }),
        false => Ok(()),
    };
    needs(cli.by.is_some() && !cli.count, "--by", "counts per key need --count")?;
    needs(cli.top.is_some() && !cli.count, "--top", "keeps the largest counts: it needs --count")?;
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
    needs(aggregating && cli.format == Some(Format::Chrome), "--format chrome", "reports are text or json")?;

    let mut out: Vec<(&'static str, OsString)> = Vec::new();
    let mut value = |key: &'static str, option: &'static str, text: &str| {
        if text.contains('\n') {
            return Err(Error::AggregateValue { option, value: text.to_owned(), reason: "contains a newline" });
        }
        out.push((key, text.into()));
        Ok(())
    };
    if cli.count {
        value("count", "--count", "")?;
    }
    if let Some(key) = &cli.by {
        value("by", "--by", key)?;
    }
    if let Some(n) = cli.top {
        value("top", "--top", &n.to_string())?;
    }
    for h in &cli.hists {
        value("hist", "--hist", h)?;
    }
    for h in &cli.lhists {
        value("lhist", "--lhist", h)?;
    }
    for l in &cli.latency {
        value("latency", "--latency", l)?;
    }
    if let Some(ns) = cli.interval {
        value("interval", "--interval", &ns.to_string())?;
    }
    if cli.cumulative {
        value("cumulative", "--cumulative", "")?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records_of(args: &[&str]) -> Result<Vec<(&'static str, String)>, String> {
        let cli = Cli::parse_from_args(std::iter::once("uprobe-run").chain(args.iter().copied()).chain(["./t"]))
            .map_err(|e| e.to_string())?;
        records(&cli)
            .map(|r| r.into_iter().map(|(k, v)| (k, v.into_string().unwrap())).collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn records_in_order() {
        let r = records_of(&[
            "-e",
            "p t:f a=%di",
            "--count",
            "--by",
            "a",
            "--top",
            "3",
            "--hist",
            "f.a",
            "--interval",
            "1",
        ])
        .unwrap();
        let keys: Vec<&str> = r.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["count", "by", "top", "hist", "interval"]);
        assert_eq!(r[1].1, "a");
        assert_eq!(r[4].1, "1000000000");
        assert_eq!(records_of(&["--latency", "t:f"]).unwrap(), [("latency", "t:f".to_string())]);
        assert!(records_of(&[]).unwrap().is_empty());
    }

    #[test]
    fn refusals_name_the_option() {
        let refused = |args: &[&str]| records_of(args).unwrap_err();
        assert_eq!(refused(&["-e", "p t:f", "--by", "tid"]), "--by: counts per key need --count");
        assert_eq!(refused(&["-e", "p t:f", "--top", "2"]), "--top: keeps the largest counts: it needs --count");
        assert!(refused(&["--latency", "f", "--cumulative"]).starts_with("--cumulative: "));
        assert!(refused(&["-e", "p t:f", "--interval", "1"]).starts_with("--interval: needs a report"));
        assert!(refused(&["--count"]).starts_with("--count: no events to count"));
        assert!(refused(&["--lhist", "f.a,0,10,1"]).starts_with("--hist: no events"));
        assert_eq!(refused(&["--latency", "f", "--format", "chrome"]), "--format chrome: reports are text or json");
        assert_eq!(refused(&["--latency", "f\ng"]), "--latency 'f\\ng': contains a newline");
    }
}
