//! `-L FUNC[:A[-B]]` and `-L FILE:A[-B]`: the source lines, numbered where a probe can go
//! on them, as `perf probe -L` prints them (numbers relative to the function's declared line
//! for a function, absolute for a file; two lines of context after the last probe-able line
//! when no end is given).

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::debug::Debug;
use super::walk::{self, listed, same_file};

/// What `-L` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    /// A function's name or a source file's path (or its tail).
    pub target: String,
    pub start: u32,
    pub end: Option<u32>,
}

/// `FUNC`, `FUNC:A`, `FUNC:A-B`, `FUNC:A+N`, and the same with `FILE.c`.
pub fn parse(text: &str) -> Result<Range, String> {
    let bad = || format!("-L '{text}': expected FUNC[:START[-END]] or FILE:START[-END]");
    let (target, range) = match text.rsplit_once(':') {
        Some((t, r)) => (t, Some(r)),
        None => (text, None),
    };
    if target.is_empty() || target.contains(char::is_whitespace) {
        return Err(bad());
    }
    let number = |s: &str| s.parse::<u32>().map_err(|_| bad());
    let (start, end) = match range {
        None => (0, None),
        Some(r) => match (r.split_once('-'), r.split_once('+')) {
            (Some((a, b)), _) => (number(a)?, Some(number(b)?)),
            (None, Some((a, n))) => (number(a)?, Some(number(a)?.saturating_add(number(n)?))),
            (None, None) => (number(r)?, None),
        },
    };
    if end.is_some_and(|e| e < start) {
        return Err(format!("-L '{text}': the range ends before it starts"));
    }
    if range.is_none() && super::is_source_file(target) {
        return Ok(Range { target: target.into(), start: 1, end: None });
    }
    Ok(Range { target: target.into(), start, end })
}

/// The listing, or why there is none (one line).
pub fn show(debug: &Debug, range: &Range) -> Result<String, String> {
    // (path, offset of the numbering, marked absolute lines, first and last absolute line).
    let is_file = super::is_source_file(&range.target) || range.target.contains('/');
    let (path, offset, mut marked, header) = if is_file {
        let mut path = None;
        let mut marked = Vec::new();
        for unit in &debug.units {
            let Some(file) = unit.files.iter().find(|f| same_file(f, &range.target)) else { continue };
            path.get_or_insert_with(|| file.clone());
            marked.extend(
                walk::unit_lines(unit)
                    .into_iter()
                    .filter(|&s| same_file(&unit.files[s.0], file) && listed(unit, s))
                    .map(|s| s.1),
            );
        }
        let Some(path) = path else {
            return Err(format!("no source file {} in the DWARF of {}", range.target, debug.from.display()));
        };
        let header = format!("<{path}:{}>", range.start);
        (path, 0, marked, header)
    } else {
        let found = debug
            .units
            .iter()
            .find_map(|u| u.funcs.iter().find(|f| f.name == range.target && f.decl.is_some()).map(|f| (u, f)));
        let Some((unit, func)) = found else {
            let mut have: Vec<&str> =
                debug.units.iter().flat_map(|u| u.funcs.iter().map(|f| f.name.as_str())).collect();
            have.sort_unstable();
            have.dedup();
            return Err(format!(
                "no function {} with code in the DWARF of {}{}",
                range.target,
                debug.from.display(),
                super::like(&have, &range.target, "functions with code")
            ));
        };
        let (file, decl) = func.decl.expect("filtered");
        let path = unit.files[file].clone();
        let marked = walk::function_lines(unit, func)
            .into_iter()
            .filter(|&s| same_file(&unit.files[s.0], &path) && listed(unit, s))
            .map(|s| s.1)
            .collect();
        let header = format!("<{}@{path}:{}>", func.name, range.start);
        (path, decl, marked, header)
    };
    marked.sort_unstable();
    marked.dedup();
    let first = offset.saturating_add(range.start);
    let last = range.end.map(|e| offset.saturating_add(e));
    marked.retain(|&l| l >= first && last.is_none_or(|e| l <= e));
    let source = match fs::read(Path::new(&path)) {
        Ok(s) => String::from_utf8_lossy(&s).into_owned(),
        Err(e) => {
            let numbers: Vec<String> = marked.iter().map(|l| (l - offset).to_string()).collect();
            return Err(format!(
                "{path}: cannot read the source ({}); the lines a probe can go on: {}",
                e.kind(),
                if numbers.is_empty() { "none".into() } else { numbers.join(", ") }
            ));
        }
    };
    let lines: Vec<&str> = source.lines().collect();
    let end = match last {
        Some(e) => e,
        // perf's NR_ADDITIONAL_LINES after the line following the last numbered one.
        None => marked.last().map_or(first, |&l| l.saturating_add(3)),
    };
    let mut out = header;
    out.push('\n');
    for l in first.max(1)..=end {
        let Some(text) = lines.get(l as usize - 1) else { break };
        match marked.binary_search(&l) {
            Ok(_) => writeln!(out, "{:>7}  {text}", l - offset),
            Err(_) => writeln!(out, "         {text}"),
        }
        .expect("writing to a String");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_as_perf_takes_them() {
        let r = |t: &str, s, e| Range { target: t.into(), start: s, end: e };
        assert_eq!(parse("classify"), Ok(r("classify", 0, None)));
        assert_eq!(parse("classify:4-6"), Ok(r("classify", 4, Some(6))));
        assert_eq!(parse("classify:4+2"), Ok(r("classify", 4, Some(6))));
        assert_eq!(parse("lines.c:20-22"), Ok(r("lines.c", 20, Some(22))));
        assert_eq!(parse("lines.c"), Ok(r("lines.c", 1, None)));
        assert!(parse("f:6-4").is_err() && parse("f:x").is_err() && parse(":3").is_err());
    }
}
