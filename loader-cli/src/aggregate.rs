//! The aggregation options (`--count`, `--by`, `--top`, `--hist`, `--lhist`, `--latency`,
//! `--interval`, `--cumulative`): checked for what makes sense together, then passed to the
//! runtime in the run's spec. What they name (events, arguments, functions) is the
//! runtime's to check, against the definitions it resolves, before the program starts.

use uprobe_contracts::spec::Aggregate;

use crate::cli::{Cli, Format};
use crate::error::Error;

/// What the aggregation options of `cli` ask of the runtime, or the one line refusing them.
pub fn request(cli: &Cli) -> Result<Aggregate, Error> {
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

    let value = |option: &'static str, text: &String| {
        if text.contains('\n') {
            return Err(Error::AggregateValue { option, value: text.to_owned(), reason: "contains a newline" });
        }
        Ok(text.clone())
    };
    let values =
        |option: &'static str, texts: &[String]| texts.iter().map(|t| value(option, t)).collect::<Result<Vec<_>, _>>();
    Ok(Aggregate {
        count: cli.count,
        by: cli.by.as_ref().map(|key| value("--by", key)).transpose()?,
        top: cli.top.map(|n| n as usize),
        hists: values("--hist", &cli.hists)?,
        lhists: values("--lhist", &cli.lhists)?,
        latency: values("--latency", &cli.latency)?,
        interval_ns: cli.interval,
        cumulative: cli.cumulative,
        feed: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_of(args: &[&str]) -> Result<Aggregate, String> {
        let cli = Cli::parse_from_args(std::iter::once("uprobe-run").chain(args.iter().copied()).chain(["./t"]))
            .map_err(|e| e.to_string())?;
        request(&cli).map_err(|e| e.to_string())
    }

    #[test]
    fn options_become_the_request() {
        let r = request_of(&[
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
            request_of(&["--latency", "t:f"]).unwrap(),
            Aggregate { latency: vec!["t:f".into()], ..Aggregate::default() }
        );
        assert!(!request_of(&[]).unwrap().any());
    }

    #[test]
    fn refusals_name_the_option() {
        let refused = |args: &[&str]| request_of(args).unwrap_err();
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
