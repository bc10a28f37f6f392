//! What the run asks to aggregate, parsed from its `UPROBE_RUN_SPEC` records: `--count`,
//! `--by KEY`, `--top N`, `--hist EVENT.ARG`, `--lhist EVENT.ARG,MIN,MAX,STEP`,
//! `--latency WHERE`, `--interval`, `--cumulative`. Pure.

use thiserror::Error;

use crate::aggregate::buckets::{Scale, MAX_LINEAR_BUCKETS};
use crate::base::spec::{Aggregate, Format};
use crate::probe::stacks::MAX_DEPTH;

/// The spec's aggregation records as they were asked, and what the runtime reads out of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// The records (`--count`, `--by`, `--top`, `--latency`, `--interval`, ...), as given.
    pub asked: Aggregate,
    /// Its `hists` and `lhists`, parsed, in that order.
    pub hists: Vec<HistRequest>,
    /// Reports as JSON lines (`--format json`), else text.
    pub json: bool,
    /// Reports as folded stacks (`--format folded`): one `frame;frame count` line a stack.
    pub folded: bool,
}

/// One `--hist` or `--lhist`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistRequest {
    /// `--hist` or `--lhist`, and the value as written (for messages).
    pub option: &'static str,
    pub text: String,
    /// An event's name, `GROUP/NAME`, or a glob over them.
    pub event: String,
    pub arg: String,
    pub scale: Scale,
}

/// A value that does not parse: the option, the value, what was expected.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{option} '{text}': expected {what}")]
pub struct RequestError {
    pub option: &'static str,
    pub text: String,
    pub what: &'static str,
}

impl Request {
    /// The request of `spec`, its reports written in `format` (`--format`).
    pub fn parse(spec: &Aggregate, format: Option<Format>) -> Result<Request, RequestError> {
        let mut hists = Vec::new();
        for text in &spec.hists {
            hists.push(parse_hist(text)?);
        }
        for text in &spec.lhists {
            hists.push(parse_lhist(text)?);
        }
        let json = format == Some(Format::Json);
        Ok(Request { asked: spec.clone(), hists, json, folded: format == Some(Format::Folded) })
    }
}

/// Distinct stacks one thread can keep (`--by ustack`); hits of more are counted as not kept.
pub const STACK_SLOTS: usize = 4096;

/// The depth a `--by` part `ustack` or `ustack:DEPTH` asks (the deepest when none is
/// given); Err says what was expected.
pub fn ustack_depth(part: &str) -> Result<usize, String> {
    match part.strip_prefix("ustack") {
        Some("") => Ok(MAX_DEPTH),
        Some(n) => match n.strip_prefix(':').map(str::parse::<usize>) {
            Some(Ok(d)) if (1..=MAX_DEPTH).contains(&d) => Ok(d),
            _ => Err(format!("ustack:DEPTH with DEPTH from 1 to {MAX_DEPTH}, not {part}")),
        },
        None => Err(format!("ustack or ustack:DEPTH, not {part}")),
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `EVENT.ARG`: split at the last dot; EVENT may carry a group and glob characters.
fn event_and_arg(option: &'static str, text: &str) -> Result<(String, String), RequestError> {
    let bad = |what| RequestError { option, text: text.to_string(), what };
    let (event, arg) = text.rsplit_once('.').ok_or_else(|| bad("EVENT.ARG: an event, a dot, an argument's name"))?;
    if event.is_empty() || event.contains(char::is_whitespace) {
        return Err(bad("an event's name before the dot"));
    }
    if !is_name(arg) {
        return Err(bad("an argument's name after the dot (letters, digits, '_')"));
    }
    Ok((event.to_string(), arg.to_string()))
}

/// `--hist EVENT.ARG`.
pub fn parse_hist(text: &str) -> Result<HistRequest, RequestError> {
    let (event, arg) = event_and_arg("--hist", text.trim())?;
    Ok(HistRequest { option: "--hist", text: text.to_string(), event, arg, scale: Scale::Log2 })
}

/// `--lhist EVENT.ARG,MIN,MAX,STEP`.
pub fn parse_lhist(text: &str) -> Result<HistRequest, RequestError> {
    let bad = |what| RequestError { option: "--lhist", text: text.to_string(), what };
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let [target, min, max, step] = parts[..] else {
        return Err(bad("EVENT.ARG,MIN,MAX,STEP"));
    };
    let (event, arg) = event_and_arg("--lhist", target).map_err(|e| RequestError { text: text.to_string(), ..e })?;
    let number = |s: &str| crate::trace::fetch::number(s).and_then(|v| i64::try_from(v).ok());
    let (Some(min), Some(max), Some(step)) = (number(min), number(max), number(step)) else {
        return Err(bad("whole numbers for MIN, MAX and STEP"));
    };
    if min >= max {
        return Err(bad("MIN below MAX"));
    }
    if step <= 0 || (max - min) % step != 0 {
        return Err(bad("a STEP above 0 that divides MAX - MIN"));
    }
    if (max - min) / step > MAX_LINEAR_BUCKETS {
        return Err(bad("at most 1000 buckets between MIN and MAX"));
    }
    Ok(HistRequest { option: "--lhist", text: text.to_string(), event, arg, scale: Scale::Linear { min, max, step } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depths() {
        assert_eq!(ustack_depth("ustack"), Ok(127));
        assert_eq!(ustack_depth("ustack:8"), Ok(8));
        assert_eq!(ustack_depth("ustack:128"), Err("ustack:DEPTH with DEPTH from 1 to 127, not ustack:128".into()));
        assert!(
            ustack_depth("ustack:0").is_err() && ustack_depth("ustack:x").is_err() && ustack_depth("ustackz").is_err()
        );
    }

    #[test]
    fn histograms_parse() {
        let h = parse_hist("malloc.size").unwrap();
        assert_eq!((h.event.as_str(), h.arg.as_str(), h.scale), ("malloc", "size", Scale::Log2));
        assert_eq!(parse_hist("grp/str*.arg1").unwrap().event, "grp/str*");
        let l = parse_lhist("f.x, -10, 0x10, 2").unwrap();
        assert_eq!(l.scale, Scale::Linear { min: -10, max: 16, step: 2 });
        assert_eq!(l.option, "--lhist");
    }

    #[test]
    fn refusals_say_what_was_expected() {
        assert_eq!(
            parse_hist("size").unwrap_err().to_string(),
            "--hist 'size': expected EVENT.ARG: an event, a dot, an argument's name"
        );
        assert!(parse_hist("f.").unwrap_err().what.starts_with("an argument's name"));
        assert!(parse_hist(".x").unwrap_err().what.starts_with("an event's name"));
        assert_eq!(parse_lhist("f.x,0,10").unwrap_err().what, "EVENT.ARG,MIN,MAX,STEP");
        assert_eq!(parse_lhist("f.x,10,0,1").unwrap_err().what, "MIN below MAX");
        assert_eq!(parse_lhist("f.x,0,10,3").unwrap_err().what, "a STEP above 0 that divides MAX - MIN");
        assert_eq!(parse_lhist("f.x,0,1,a").unwrap_err().what, "whole numbers for MIN, MAX and STEP");
        assert!(parse_lhist("f.x,0,100000,1").unwrap_err().what.starts_with("at most 1000"));
        assert_eq!(parse_lhist("fx,0,1,1").unwrap_err().text, "fx,0,1,1");
    }

    #[test]
    fn a_request_from_the_spec() {
        let spec = Aggregate {
            count: true,
            hists: vec!["a.x".into()],
            lhists: vec!["b.y,0,10,1".into()],
            interval_ns: Some(7),
            ..Aggregate::default()
        };
        let r = Request::parse(&spec, Some(Format::Json)).unwrap();
        assert_eq!(r.hists.len(), 2);
        assert_eq!((r.asked.count, r.json, r.asked.interval_ns), (true, true, Some(7)));
        assert_eq!(r.asked, spec);
        let bad = Aggregate { hists: vec!["nodot".into()], ..Aggregate::default() };
        assert!(Request::parse(&bad, None).is_err());
    }
}
