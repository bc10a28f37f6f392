//! Event definitions in the kernel's `uprobe_events` grammar (`Documentation/trace/
//! uprobetracer.rst`), parsed. Pure: text in, [`Definition`] or a [`DefError`] out.
//!
//! ```text
//! p[:[GRP/][EVENT]] WHERE [FETCHARGS] [if FILTER]   an entry (or any instruction) event
//! r[:[GRP/][EVENT]] WHERE [FETCHARGS] [if FILTER]   a return event; also p ... WHERE%return
//! WHERE: PATH:OFFSET   a file offset into the executable or library, as tracefs takes it
//!        [MODULE:]SYMBOL[+OFFSET]   a function by name (mangled or demangled), or a glob
//!        0xADDR        an address in the process
//! ```
//!
//! Words are separated by blanks outside parentheses and angle brackets, so a demangled C++
//! name (`libfoo.so:ns::f(int, char const*)`) is one word.

use thiserror::Error;

use crate::fetch::{self, FetchArg, Site};

/// The most fetchargs an event may have (one fault bit each in a record).
/// At most as many fetchargs as a record has fault bits.
pub const MAX_ARGS: usize = 32;
/// The group of an event defined without `GRP/` (as the kernel's).
pub const DEFAULT_GROUP: &str = "uprobes";

/// Whether a definition is an entry event (`p`) or a return event (`r`, `%return`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `p`: at the instruction WHERE names (a function's entry, or any instruction).
    Entry,
    /// `r` (or `p ... WHERE%return`): at the return of the function WHERE names.
    Return,
}

/// Where a definition puts its probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// `PATH:OFFSET`: a file offset (PATH a path, or a module's name).
    FileOffset {
        /// The file as written.
        path: String,
        /// The offset into the file.
        offset: u64,
    },
    /// `[MODULE:]SYMBOL[+OFFSET]`; SYMBOL may be a glob.
    Symbol {
        /// The module, when given (a path, a file name or its stem).
        module: Option<String>,
        /// The symbol, or a glob of symbols.
        name: String,
        /// The offset from the symbol's start.
        offset: u64,
    },
    /// `0xADDR`: an address in the process.
    Address(u64),
}

/// One parsed definition: `p|r[:[GRP/]EVENT] WHERE [FETCHARGS] [if FILTER]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Definition {
    /// The definition as the user wrote it.
    pub text: String,
    /// Entry or return.
    pub kind: Kind,
    /// GRP, or [`DEFAULT_GROUP`].
    pub group: String,
    /// The name given; None: derived from WHERE (see [`Definition::default_name`]).
    pub event: Option<String>,
    /// WHERE.
    pub place: Place,
    /// The fetchargs, in the order written.
    pub args: Vec<FetchArg>,
    /// `if FILTER`: the predicate's text and the byte where it starts (see `filter`).
    pub filter: Option<(usize, String)>,
}

/// A definition that does not parse: what was expected at which byte of the text.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("at column {}: expected {what}", .at + 1)]
pub struct DefError {
    /// The byte of the text where the error is.
    pub at: usize,
    /// What was expected there.
    pub what: String,
}

fn fail<T>(at: usize, what: impl Into<String>) -> Result<T, DefError> {
    Err(DefError { at, what: what.into() })
}

/// Splits at blanks outside `()`, `<>` and double quotes; each word with its byte offset.
fn words(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let (mut depth, mut quoted, mut start) = (0i32, false, None);
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '(' | '<' if !quoted => depth += 1,
            ')' | '>' if !quoted => depth -= 1,
            _ => {}
        }
        if c.is_whitespace() && depth <= 0 && !quoted {
            if let Some(s) = start.take() {
                out.push((s, &text[s..i]));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        out.push((s, &text[s..]));
    }
    out
}

fn is_name(s: &str) -> bool {
    s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Parses one definition.
pub fn parse(text: &str) -> Result<Definition, DefError> {
    let words = words(text);
    let Some(&(_, head)) = words.first() else { return fail(0, "p or r, then WHERE") };
    let (mut kind, named) = match head.split_once(':') {
        Some(("p", n)) => (Kind::Entry, Some(n)),
        Some(("r", n)) => (Kind::Return, Some(n)),
        None if head == "p" => (Kind::Entry, None),
        None if head == "r" => (Kind::Return, None),
        _ => return fail(0, "p or r (p[:[GRP/]EVENT] WHERE [FETCHARGS])"),
    };
    let (mut group, mut event) = (DEFAULT_GROUP.to_string(), None);
    if let Some(n) = named {
        let (g, e) = match n.split_once('/') {
            Some((g, e)) => (Some(g), e),
            None => (None, n),
        };
        if let Some(g) = g {
            if !is_name(g) {
                return fail(2, "a group name (letters, digits, '_') before '/'");
            }
            group = g.to_string();
        }
        if !e.is_empty() {
            if !is_name(e) {
                return fail(2 + g.map_or(0, |g| g.len() + 1), "an event name (letters, digits, '_')");
            }
            event = Some(e.to_string());
        } else if g.is_none() {
            return fail(2, "an event name after ':'");
        }
    }
    let Some(&(where_at, mut place_text)) = words.get(1) else {
        return fail(text.trim_end().len(), "WHERE: PATH:OFFSET, [MODULE:]SYMBOL[+OFFSET] or 0xADDR");
    };
    if let Some(stripped) = place_text.strip_suffix("%return") {
        if kind == Kind::Return {
            return fail(where_at + stripped.len(), "no %return on an r: event (it is one already)");
        }
        kind = Kind::Return;
        place_text = stripped;
    }
    let place = parse_place(place_text, where_at)?;
    if kind == Kind::Return {
        if let Place::Symbol { offset, .. } = place {
            if offset != 0 {
                return fail(where_at, "a function's entry for a return event (no +OFFSET)");
            }
        }
    }
    let site = if kind == Kind::Return { Site::Return } else { Site::Entry };
    let mut args: Vec<FetchArg> = Vec::new();
    let mut filter = None;
    for (i, &(at, word)) in words[2..].iter().enumerate() {
        if word == "if" {
            let start = at + 2 + (text[at + 2..].len() - text[at + 2..].trim_start().len());
            let expr = text[start..].trim_end();
            if expr.is_empty() {
                return fail(at + 2, "a FILTER after 'if'");
            }
            filter = Some((start, expr.to_string()));
            break;
        }
        if args.len() == MAX_ARGS {
            return fail(at, format!("at most {MAX_ARGS} fetchargs"));
        }
        let arg = fetch::parse(word, i + 1, site).map_err(|e| DefError { at: at + e.at, what: e.what })?;
        if args.iter().any(|a| a.name == arg.name) {
            return fail(at, format!("a name not used twice ({} is)", arg.name));
        }
        args.push(arg);
    }
    Ok(Definition { text: text.trim().to_string(), kind, group, event, place, args, filter })
}

fn parse_place(text: &str, at: usize) -> Result<Place, DefError> {
    if text.is_empty() {
        return fail(at, "WHERE");
    }
    if let Some(i) = text.find('(').filter(|_| text.ends_with(')')) {
        if fetch::number(&text[i + 1..text.len() - 1]).is_some() {
            return fail(at + i, "no reference counter (SDT semaphores are not supported)");
        }
    }
    let (module, rest, rest_at) = match module_colon(text) {
        Some(i) => (Some(&text[..i]), &text[i + 1..], at + i + 1),
        None => (None, text, at),
    };
    if module == Some("") {
        return fail(at, "a PATH or module name before ':'");
    }
    if rest.is_empty() {
        return fail(rest_at, "an OFFSET or a SYMBOL after ':'");
    }
    if let Some(v) = fetch::number(rest) {
        return match (module, v) {
            (_, v) if v < 0 => fail(rest_at, "a non-negative offset"),
            (Some(path), v) => Ok(Place::FileOffset { path: path.to_string(), offset: v as u64 }),
            (None, v) => Ok(Place::Address(v as u64)),
        };
    }
    let (name, offset) = match plus_offset(rest) {
        Some(i) => (&rest[..i], fetch::number(&rest[i + 1..]).unwrap_or(0) as u64),
        None => (rest, 0),
    };
    if name.is_empty() {
        return fail(rest_at, "a SYMBOL");
    }
    Ok(Place::Symbol { module: module.map(str::to_string), name: name.to_string(), offset })
}

/// The ':' that ends a module name: the first one not part of a `::` and outside brackets.
fn module_colon(text: &str) -> Option<usize> {
    let b = text.as_bytes();
    let mut depth = 0;
    for i in 0..b.len() {
        match b[i] {
            b'(' | b'<' => depth += 1,
            b')' | b'>' => depth -= 1,
            b':' if depth == 0 && b.get(i + 1) != Some(&b':') && (i == 0 || b[i - 1] != b':') => return Some(i),
            _ => {}
        }
    }
    None
}

/// The '+' of a trailing `+OFFSET`, where what follows is a number.
fn plus_offset(text: &str) -> Option<usize> {
    let i = text.rfind('+')?;
    (i > 0 && fetch::number(&text[i + 1..]).is_some_and(|v| v >= 0) && !text[i + 1..].starts_with('-')).then_some(i)
}

impl Definition {
    /// The event's name when none was given: the kernel's `p_<file>_0x<offset>` for file
    /// offsets (the file name up to its first '.', '-' or '_'), the function's name (with
    /// `__return` for a return event, as `perf probe` names them) for symbols.
    pub fn default_name(&self, symbol: Option<&str>) -> String {
        match &self.place {
            Place::FileOffset { path, offset } => {
                let file = path.rsplit('/').next().unwrap_or(path);
                let tail = file.split(['.', '-', '_']).next().unwrap_or(file);
                format!("p_{}_{offset:#x}", sanitize(tail))
            }
            Place::Address(a) => format!("p_{a:#x}"),
            Place::Symbol { name, offset, .. } => {
                let mut n = sanitize(symbol.unwrap_or(name));
                if *offset != 0 {
                    n += &format!("_{offset}");
                }
                if self.kind == Kind::Return {
                    n += "__return";
                }
                n
            }
        }
    }
}

/// A name made of letters, digits and '_' (a C++ name loses its parameter list).
pub fn sanitize(name: &str) -> String {
    let name = name.split('(').next().unwrap_or(name);
    let mut out: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) || out.is_empty() {
        out.insert(0, '_');
    }
    out
}

/// The definitions of an `--events` file: (line number from 1, text) for each line that is
/// neither blank nor a `#` comment. `uprobe-run` and the runtime number them alike.
pub fn file_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// Whether a symbol pattern is a glob (`*`, `?` or a `[...]` class).
pub fn is_glob(name: &str) -> bool {
    name.contains(['*', '?']) || (name.contains('[') && name.contains(']') && !name.contains("operator"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::{Fetch, Reg};

    fn ok(text: &str) -> Definition {
        parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn tracefs_lines_parse_unchanged() {
        let d = ok("p:myapp/alloc /usr/lib/libc.so.6:0x9a0f0 size=%di");
        assert_eq!((d.kind, d.group.as_str(), d.event.as_deref()), (Kind::Entry, "myapp", Some("alloc")));
        assert_eq!(d.place, Place::FileOffset { path: "/usr/lib/libc.so.6".into(), offset: 0x9a0f0 });
        assert_eq!(d.args[0].fetch, Fetch::Reg(Reg(14)));
        let r = ok("r:myapp/alloc_ret libc.so.6:malloc ptr=$retval");
        assert_eq!(r.kind, Kind::Return);
        assert_eq!(r.place, Place::Symbol { module: Some("libc.so.6".into()), name: "malloc".into(), offset: 0 });
        let p = ok("p /bin/t:0x1139%return $retval");
        assert_eq!((p.kind, p.event.as_deref(), p.group.as_str()), (Kind::Return, None, "uprobes"));
        assert_eq!(p.default_name(None), "p_t_0x1139");
        assert_eq!(ok("p:grp/ /x/kt_t:4096").default_name(None), "p_kt_0x1000");
    }

    #[test]
    fn symbols_offsets_addresses_and_demangled_names() {
        assert_eq!(ok("p main+4").place, Place::Symbol { module: None, name: "main".into(), offset: 4 });
        assert_eq!(ok("p 0x401126").place, Place::Address(0x401126));
        let d = ok("p libfoo.so:ns::f(int, char const*) a=%di");
        assert_eq!(
            d.place,
            Place::Symbol { module: Some("libfoo.so".into()), name: "ns::f(int, char const*)".into(), offset: 0 }
        );
        assert_eq!(d.args.len(), 1);
        assert_eq!(
            ok("p ns::operator+(int)+0x8").place,
            Place::Symbol { module: None, name: "ns::operator+(int)".into(), offset: 8 }
        );
        assert_eq!(ok("r t:add").default_name(None), "add__return");
        assert_eq!(ok("p t:add+4").default_name(None), "add_4");
        assert!(is_glob("str*") && !is_glob("strlen"));
    }

    #[test]
    fn errors_name_the_column_and_what_was_expected() {
        let e = parse("p:x t:add a=%zz").unwrap_err();
        assert_eq!(e.at, 12);
        assert!(e.to_string().starts_with("at column 13: expected a register"), "{e}");
        assert_eq!(parse("q t:add").unwrap_err().at, 0);
        assert_eq!(parse("p").unwrap_err().what, "WHERE: PATH:OFFSET, [MODULE:]SYMBOL[+OFFSET] or 0xADDR");
        assert_eq!(parse("p t:add $retval").unwrap_err().at, 8);
        assert!(parse("p:a-b t:add").unwrap_err().what.starts_with("an event name"));
        assert!(parse("r t:add+4").unwrap_err().what.starts_with("a function's entry"));
        assert!(parse("p t:add a=%di a=%si").unwrap_err().what.contains("not used twice"));
        assert!(parse("p /t:0x10(0x20)").unwrap_err().what.contains("reference counter"));
        assert_eq!(parse("p t:add x=%di:u7").unwrap_err().at, 14);
        assert_eq!(parse("p t:add x=%di if ").unwrap_err().what, "a FILTER after 'if'");
    }

    #[test]
    fn a_filter_follows_if() {
        let d = ok("p libc.so.6:malloc size=%di:u64 if size >= 65536 && comm == \"a b\"");
        assert_eq!(d.args.len(), 1);
        assert_eq!(d.filter, Some((35, "size >= 65536 && comm == \"a b\"".to_string())));
        assert_eq!(&d.text[35..38], "siz");
        assert_eq!(ok("r t:f if $retval < 0").filter, Some((9, "$retval < 0".to_string())));
        assert_eq!(ok("p t:f").filter, None);
    }
}
