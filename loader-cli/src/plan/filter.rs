//! Predicates: `-e 'DEF if EXPR'`, the same in `--events` files, and `--filter 'EVENT: EXPR'`,
//! checked against the fields of the definitions they apply to (names, types, operators) and
//! compiled here, before the program starts, into the programs the runtime runs at each hit.
//! Each travels as a `filter<TAB>N<TAB>PROGRAM` record: N counts the run's definitions as the
//! runtime reads them (`-e` in order, then each `--events` file's definitions), and PROGRAM
//! is `uprobe_contracts::filter::Program`'s text.
//!
//! A definition that does not parse is left to the runtime, which refuses it (or skips it
//! with `--lenient`) with the column at fault, as without a filter.

use std::path::PathBuf;

use uprobe_contracts::def::{self, Definition, Place};
use uprobe_contracts::filter::{self, glob, Program, MAX_NODES};

use crate::base::error::Error;

/// `--filter 'EVENT: EXPR'`, split.
struct Named<'a> {
    text: &'a str,
    event: &'a str,
    expr: &'a str,
    /// Byte of `expr` in `text`.
    at: usize,
}

fn split(text: &str) -> Result<Named<'_>, Error> {
    let Some((event, rest)) = text.split_once(':') else {
        return Err(Error::Filter(format!("--filter '{}': expected EVENT: EXPR", one_line(text))));
    };
    let at = event.len() + 1 + (rest.len() - rest.trim_start().len());
    let (event, expr) = (event.trim(), rest.trim());
    if event.is_empty() || event.contains(char::is_whitespace) {
        return Err(Error::Filter(format!("--filter '{}': expected an EVENT name before ':'", one_line(text))));
    }
    Ok(Named { text, event, expr, at })
}

/// Event names of a definition a `--filter` may use: its name (given, or derived from WHERE
/// as the runtime derives it), with or without its group, and a glob symbol as written.
fn names(d: &Definition) -> Vec<String> {
    let name = d.event.clone().unwrap_or_else(|| d.default_name(None));
    let mut out = vec![format!("{}/{name}", d.group), name];
    if let Place::Symbol { name, .. } = &d.place {
        out.push(name.clone());
    }
    out
}

fn one_line(text: &str) -> String {
    text.replace('\n', "\\n")
}

/// A definition's predicate, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    /// The definition's number, as the runtime counts them.
    pub definition: usize,
    pub program: Program,
}

impl Compiled {
    /// As the run spec carries it: the definition's number and the encoded program.
    pub fn spec_entry(&self) -> (usize, String) {
        (self.definition, self.program.encode())
    }
}

/// The predicates of the run's definitions (`-e`, then the `--events` files, then
/// `--latency`), or the one line refusing a filter.
pub fn compile(
    events: &[String],
    files: &[PathBuf],
    filters: &[String],
    latency: &[String],
) -> Result<Vec<Compiled>, Error> {
    let mut defs: Vec<(String, String)> = events.iter().map(|t| ("-e".to_string(), t.clone())).collect();
    for file in files {
        let bytes = std::fs::read(file).map_err(|source| Error::EventsFile { path: file.clone(), source })?;
        let text = String::from_utf8_lossy(&bytes);
        defs.extend(def::file_lines(&text).map(|(n, l)| (format!("{}:{n}", file.display()), l.to_string())));
    }
    let named = filters.iter().map(|f| split(f)).collect::<Result<Vec<_>, _>>()?;
    let mut used = vec![false; named.len()];
    let mut out = Vec::new();
    for (ordinal, (origin, text)) in defs.iter().enumerate() {
        let Ok(d) = def::parse(text) else { continue };
        let fields = filter::fields_of(&d);
        let mut program: Option<Program> = None;
        if let Some((start, expr)) = &d.filter {
            let p = filter::compile(expr, &fields).map_err(|e| {
                let e = filter::FilterError { at: start + e.at, ..e };
                Error::Filter(format!("{origin} '{}': {e}", one_line(text)))
            })?;
            program = Some(p);
        }
        let names = names(&d);
        for (i, n) in named.iter().enumerate() {
            if !names.iter().any(|name| glob(n.event.as_bytes(), name.as_bytes())) {
                continue;
            }
            used[i] = true;
            let p = filter::compile(n.expr, &fields).map_err(|e| {
                let e = filter::FilterError { at: n.at + e.at, ..e };
                Error::Filter(format!("--filter '{}' on {origin} '{}': {e}", one_line(n.text), one_line(text)))
            })?;
            program = Some(match program {
                Some(before) => before.and(&p),
                None => p,
            });
        }
        if let Some(p) = program {
            if p.nodes.len() > MAX_NODES {
                return Err(Error::Filter(format!(
                    "{origin} '{}': its filters together have more than {MAX_NODES} comparisons and operators",
                    one_line(text)
                )));
            }
            out.push(Compiled { definition: ordinal, program: p });
        }
    }
    // A timed call's filter is run at its entry: the common fields only.
    for (n, place) in latency.iter().enumerate() {
        let Ok(d) = def::parse(&format!("p {place}")) else { continue };
        let Some((start, expr)) = &d.filter else { continue };
        let p = filter::compile(expr, &filter::fields_of(&d)).map_err(|e| {
            let e = filter::FilterError { at: start - 2 + e.at, ..e };
            Error::Filter(format!("--latency '{}': {e}", one_line(place)))
        })?;
        out.push(Compiled { definition: defs.len() + n, program: p });
    }
    if let Some(i) = used.iter().position(|u| !u) {
        let known: Vec<String> =
            defs.iter().filter_map(|(_, t)| def::parse(t).ok()).map(|d| names(&d).swap_remove(1)).collect();
        let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
        return Err(Error::Filter(format!(
            "--filter '{}': no event named {} (events: {known})",
            one_line(named[i].text),
            named[i].event
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[&str], filters: &[&str]) -> Result<Vec<String>, String> {
        let events: Vec<String> = events.iter().map(|s| s.to_string()).collect();
        let filters: Vec<String> = filters.iter().map(|s| s.to_string()).collect();
        compile(&events, &[], &filters, &[])
            .map(|r| r.into_iter().map(|c| format!("{}\t{}", c.definition, c.program.encode())).collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn if_and_filter_compile_to_records_by_definition_number() {
        let r = run(&["p t:f a=%di", "p:m t:g size=%di:u64 if size >= 65536"], &["f: a == 1"]).unwrap();
        assert_eq!(r, ["0\tn,a0,eq,u,1", "1\tn,a0,ge,u,65536"]);
        let both = run(&["p:m t:g size=%di:u64 if size > 1"], &["uprobes/m: comm ~ \"sq*\""]).unwrap();
        assert_eq!(both, ["0\tn,a0,gt,u,1 s,comm,glob,73712a and,0,1"]);
        assert_eq!(run(&["p t:f"], &[]).unwrap(), Vec::<String>::new());
        assert_eq!(run(&["p t:f", "bad definition if x"], &[]).unwrap(), Vec::<String>::new(), "left to the runtime");
    }

    #[test]
    fn refusals_name_the_definition_and_the_column() {
        let e = run(&["p:m t:g size=%di:u64 if size < \"x\""], &[]).unwrap_err();
        assert_eq!(
            e,
            "-e 'p:m t:g size=%di:u64 if size < \"x\"': at column 32: expected a number for size (u64), not a string"
        );
        let e = run(&["p t:f s=+0(%di):string"], &["f: s < 3"]).unwrap_err();
        assert_eq!(
            e,
            "--filter 'f: s < 3' on -e 'p t:f s=+0(%di):string': at column 6: expected ==, != or ~ for s, a string (< compares numbers)"
        );
        let e = run(&["p t:f"], &["g: tid == 1"]).unwrap_err();
        assert_eq!(e, "--filter 'g: tid == 1': no event named g (events: f)");
        assert_eq!(run(&["p t:f"], &["tid == 1"]).unwrap_err(), "--filter 'tid == 1': expected EVENT: EXPR");
        let latency = ["libc:malloc if comm == \"a\"".to_string(), "t:f if $retval > 1".to_string()];
        let e = compile(&["p t:f".into()], &[], &[], &latency).unwrap_err().to_string();
        assert!(
            e.starts_with("--latency 't:f if $retval > 1': at column 8: expected a field of this event: $retval"),
            "{e}"
        );
        let r = compile(&["p t:f".into()], &[], &[], &latency[..1]).unwrap();
        assert_eq!(r[0].spec_entry(), (1, "s,comm,eq,61".to_string()));
        let e = run(&["r t:f"], &["f__return: size > 1"]).unwrap_err();
        assert!(e.contains("at column 12: expected a field of this event, not size (its fields: $retval, comm"), "{e}");
    }
}
