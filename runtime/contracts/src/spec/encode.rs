//! The spec's text, written: [`encode`]; `decode` (the parent module) reads it back.

use super::{Spec, SpecError};

/// The key of the record that closes a spec.
pub(super) const END: &str = "end\t";

/// FNV-1a, 64 bits: the check of the `end` record.
pub(super) fn check(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The spec as its text: the records in a fixed order, then the `end` record.
pub fn encode(spec: &Spec) -> Result<String, SpecError> {
    let mut text = String::new();
    let mut record = |key: &'static str, value: &str| {
        if value.contains(['\n', '\0']) {
            return Err(SpecError::Unencodable { key, value: value.into() });
        }
        text.push_str(key);
        text.push('\t');
        text.push_str(value);
        text.push('\n');
        Ok(())
    };
    for h in &spec.handlers {
        record("handlers", h)?;
    }
    for (name, value) in &spec.params {
        if name.contains('=') {
            return Err(SpecError::Unencodable { key: "param", value: name.clone() });
        }
        record("param", &format!("{name}={value}"))?;
    }
    if let Some(output) = &spec.output {
        record("output", output)?;
    }
    for name in spec.options.names() {
        record("option", name)?;
    }
    for def in &spec.events {
        record("event", def)?;
    }
    for path in &spec.event_files {
        record("events", path)?;
    }
    for (n, program) in &spec.filters {
        record("filter", &format!("{n}\t{program}"))?;
    }
    if let Some(format) = spec.format {
        record("format", format.name())?;
    }
    if let Some(size) = spec.buffer_size {
        record("buffer-size", &size.to_string())?;
    }
    for trigger in &spec.triggers {
        record("trigger", trigger)?;
    }
    if let Some(n) = spec.max_events {
        record("max-events", &n.to_string())?;
    }
    let a = &spec.aggregate;
    if a.count {
        record("count", "")?;
    }
    if let Some(by) = &a.by {
        record("by", by)?;
    }
    if let Some(top) = a.top {
        record("top", &top.to_string())?;
    }
    for h in &a.hists {
        record("hist", h)?;
    }
    for h in &a.lhists {
        record("lhist", h)?;
    }
    for l in &a.latency {
        record("latency", l)?;
    }
    if let Some(ns) = a.interval_ns {
        record("interval", &ns.to_string())?;
    }
    if a.cumulative {
        record("cumulative", "")?;
    }
    if let Some(path) = &a.flamegraph {
        record("flamegraph", path)?;
    }
    if let Some(path) = &a.pprof {
        record("pprof", path)?;
    }
    if let Some(fd) = a.feed {
        if fd < 0 {
            return Err(SpecError::Unencodable { key: "feed", value: fd.to_string() });
        }
        record("feed", &fd.to_string())?;
    }
    if let Some(pattern) = &spec.list {
        record("list", pattern)?;
    }
    let sum = check(text.as_bytes());
    text.push_str(&format!("{END}{sum:016x}"));
    Ok(text)
}
