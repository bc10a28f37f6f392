//! Source lines as probe places, in `perf probe`'s spelling: `p PROG:FUNC:N` (N lines after
//! the line FUNC is declared on), `p PROG:FILE.c:N` and `p FILE.c:N` (in the program),
//! translated before the program starts into the kernel's `PATH:OFFSET` definitions the
//! runtime places, one per address of the line (a line the compiler copied, inlined or
//! split has several), with the addresses `perf probe` chooses (see [`walk`]). `-L` shows
//! which lines those are ([`listing`]).
//!
//! The DWARF comes from the module or its debug file by build id ([`debug`]). What follows
//! WHERE in a definition (fetchargs, filter) is kept as written, except variables by name
//! (`p prog:func:4 len buf->data:string`), which become fetchargs at each site's address
//! ([`super::dwarf`]).

pub mod debug;
pub mod listing;
pub mod vars;
pub mod walk;

use std::path::{Path, PathBuf};

use uprobe_contracts::def;

use crate::base::error::Error;
use debug::Debug;
use walk::{reversible, same_file, Spot};

/// A line place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinePlace {
    /// `FUNC:N`: the line N lines after FUNC's declared line.
    Function { name: String, line: u32 },
    /// `FILE:N`: line N of a source file (named by its tail: `lines.c`, `src/lines.c`).
    File { file: String, line: u32 },
}

impl std::fmt::Display for LinePlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinePlace::Function { name, line } => write!(f, "{name}:{line}"),
            LinePlace::File { file, line } => write!(f, "{file}:{line}"),
        }
    }
}

/// One address of a line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// The link-time address.
    pub addr: u64,
    /// The function whose code it is (the outer function where the line was inlined).
    pub function: String,
}

const SOURCE_EXTENSIONS: &[&str] =
    &["c", "h", "cc", "cpp", "cxx", "c++", "hh", "hpp", "hxx", "C", "S", "s", "rs", "go", "inl"];

fn is_source_file(name: &str) -> bool {
    name.rsplit_once('.').is_some_and(|(stem, ext)| !stem.is_empty() && SOURCE_EXTENSIONS.contains(&ext))
}

fn is_identifier(s: &str) -> bool {
    s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A WHERE that names a source line: `[MODULE:]FILE.c:N` or `MODULE:FUNC:N`, N decimal.
/// Anything else (`PATH:OFFSET`, `SYMBOL+OFFSET`, markers) is not one.
pub fn parse_place(place: &str) -> Option<(Option<&str>, LinePlace)> {
    let (head, n) = place.rsplit_once(':')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let line: u32 = n.parse().ok()?;
    let (module, target) = match head.rsplit_once(':') {
        Some((m, t)) if !m.is_empty() && !m.ends_with(':') => (Some(m), t),
        Some(_) => return None,
        None => (None, head),
    };
    if is_source_file(target) {
        return Some((module, LinePlace::File { file: target.to_string(), line }));
    }
    match (module, is_identifier(target)) {
        (Some(m), true) if m != "sdt" => Some((module, LinePlace::Function { name: target.to_string(), line })),
        _ => None,
    }
}

/// Whether a definition puts its probe on a source line.
pub fn names_a_line(text: &str) -> bool {
    def::words(text).get(1).is_some_and(|&(_, w)| parse_place(w.strip_suffix("%return").unwrap_or(w)).is_some())
}

/// The addresses of `place` in the DWARF of a module, as `perf probe` places them, sorted;
/// or why there are none, naming the lines, functions or files that exist instead.
pub fn line_addresses(debug: &Debug, place: &LinePlace) -> Result<Vec<Site>, String> {
    // (unit, file of the line, line): one walk per unit, as perf searches each unit.
    let mut targets: Vec<(usize, String, u32)> = Vec::new();
    match place {
        LinePlace::Function { name, line } => {
            for (u, unit) in debug.units.iter().enumerate() {
                if let Some(&(_, (file, decl))) = unit.defs.iter().find(|(n, _)| n == name) {
                    targets.push((u, unit.files[file].clone(), decl.saturating_add(*line)));
                }
            }
            if targets.is_empty() {
                return Err(format!(
                    "no function {name} in the DWARF of {}{}",
                    debug.from.display(),
                    functions_like(debug, name)
                ));
            }
        }
        LinePlace::File { file, line } => {
            for (u, unit) in debug.units.iter().enumerate() {
                if let Some(f) = unit.files.iter().find(|f| same_file(f, file)) {
                    targets.push((u, f.clone(), *line));
                }
            }
            if targets.is_empty() {
                return Err(format!(
                    "no source file {file} in the DWARF of {}{}",
                    debug.from.display(),
                    files_like(debug, file)
                ));
            }
        }
    }
    let mut sites: Vec<Site> = Vec::new();
    for (u, file, line) in &targets {
        let unit = &debug.units[*u];
        let mut spots: Vec<Spot> = walk::unit_lines(unit)
            .into_iter()
            .filter(|&(f, l, _)| l == *line && same_file(&unit.files[f], file))
            .collect();
        spots.sort_by_key(|s| s.2);
        spots.dedup_by_key(|s| s.2);
        for spot in spots {
            if let Err((_, other)) = reversible(unit, spot) {
                let instead = match place {
                    LinePlace::Function { name, line: rel } => {
                        let decl = line - rel;
                        match other.checked_sub(decl) {
                            Some(r) => format!("{name}:{r}"),
                            None => format!("{file}:{other}"),
                        }
                    }
                    LinePlace::File { file, .. } => format!("{file}:{other}"),
                };
                return Err(format!(
                    "{place} (line {line} of {file}) shares its address {:#x} with line {other}: probe {instead} instead (as perf probe refuses it)",
                    spot.2
                ));
            }
            let Some(func) = unit.funcs.iter().find(|f| f.contains(spot.2)) else { continue };
            if let LinePlace::Function { name, .. } = place {
                if !walk::in_function(unit, spot.2, name) {
                    continue;
                }
            }
            if !sites.iter().any(|s| s.addr == spot.2) {
                sites.push(Site { addr: spot.2, function: func.name.clone() });
            }
        }
    }
    if sites.is_empty() {
        let (_, file, line) = &targets[0];
        return Err(format!("{place} (line {line} of {file}) has no code{}", nearest(debug, file, *line, place)));
    }
    sites.sort_by_key(|s| s.addr);
    Ok(sites)
}

/// ` (nearest lines with code: 22, 25)`, in the place's own numbering; for `FUNC:N`, lines
/// of FUNC only (a line of the next function is not FUNC's to offer).
/// Every unit that has the file is searched: with link-time optimization, a file's lines are
/// spread over several.
fn nearest(debug: &Debug, file: &str, line: u32, place: &LinePlace) -> String {
    let mut lines: Vec<u32> = Vec::new();
    for unit in &debug.units {
        if !unit.files.iter().any(|f| same_file(f, file)) {
            continue;
        }
        let ours = |s: Spot| match place {
            LinePlace::Function { name, .. } => walk::in_function(unit, s.2, name),
            LinePlace::File { .. } => true,
        };
        lines.extend(
            walk::unit_lines(unit)
                .into_iter()
                .filter(|&s| same_file(&unit.files[s.0], file) && walk::listed(unit, s) && ours(s))
                .map(|s| s.1),
        );
    }
    lines.sort_unstable();
    lines.dedup();
    let before = lines.iter().rev().find(|&&l| l < line);
    let after = lines.iter().find(|&&l| l > line);
    let name = |l: u32| match place {
        LinePlace::Function { name, line: rel } => {
            let decl = line - rel;
            l.checked_sub(decl).map_or(format!("{file}:{l}"), |r| format!("{name}:{r}"))
        }
        LinePlace::File { file, .. } => format!("{file}:{l}"),
    };
    let near: Vec<String> = before.into_iter().chain(after).map(|&l| name(l)).collect();
    match near.is_empty() {
        true => " (the file has no line with code)".into(),
        false => format!(" (nearest lines with code: {})", near.join(", ")),
    }
}

/// ` (functions it has: a, b, ...)`, those sharing the longest start with `name` first.
fn functions_like(debug: &Debug, name: &str) -> String {
    let mut have: Vec<&str> = debug.units.iter().flat_map(|u| u.funcs.iter().map(|f| f.name.as_str())).collect();
    have.sort_unstable();
    have.dedup();
    like(&have, name, "functions with code")
}

fn files_like(debug: &Debug, name: &str) -> String {
    let mut have: Vec<&str> = debug
        .units
        .iter()
        .flat_map(|u| u.files.iter().filter(|f| !f.starts_with("/usr/include") && !f.contains("/lib/gcc/")))
        .map(String::as_str)
        .collect();
    have.sort_unstable();
    have.dedup();
    like(&have, name, "source files")
}

fn like(have: &[&str], wanted: &str, what: &str) -> String {
    if have.is_empty() {
        return format!(" (it has no {what})");
    }
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    let common = |s: &str| base(s).bytes().zip(base(wanted).bytes()).take_while(|(a, b)| a == b).count();
    let mut ranked: Vec<&str> = have.to_vec();
    ranked.sort_by_key(|s| std::cmp::Reverse(common(s)));
    let more = if have.len() > 8 { ", ..." } else { "" };
    format!(" ({what}: {}{more})", ranked[..have.len().min(8)].join(", "))
}

/// The `-e` definitions with each line place replaced by the definitions of its sites
/// (`p:[GRP/]EVENT PATH:OFFSET REST`); the others unchanged.
pub fn translate(defs: &[String], program: &Path) -> Result<Vec<String>, Error> {
    let mut out = Vec::with_capacity(defs.len());
    let mut startup: Option<Vec<PathBuf>> = None;
    let mut loaded: Vec<(PathBuf, Debug)> = Vec::new();
    let mut variables: Vec<(PathBuf, super::dwarf::Module)> = Vec::new();
    for text in defs {
        let words = def::words(text);
        let Some(&(where_at, place_word)) = words.get(1) else {
            out.push(text.clone());
            continue;
        };
        let refuse = |reason: String| Error::Lines { def: text.clone(), reason };
        let head = words[0].1;
        let bare = place_word.strip_suffix("%return").unwrap_or(place_word);
        let Some((module, place)) = parse_place(bare) else {
            out.push(text.clone());
            continue;
        };
        if head.starts_with('r') || bare.len() != place_word.len() {
            return Err(refuse("a source line is not a function: no return probe on it (r, %return)".into()));
        }
        let Some(named) = head.strip_prefix("p").filter(|n| n.is_empty() || n.starts_with(':')) else {
            out.push(text.clone());
            continue;
        };
        let path = match module {
            None => program.to_path_buf(),
            Some(m) => {
                let startup = startup.get_or_insert_with(|| super::usdt::startup_modules(program));
                super::usdt::module_file(m, startup).ok_or_else(|| {
                    refuse(format!("no module {m:?}: not the program, none of its libraries, no such library file"))
                })?
            }
        };
        let path = std::fs::canonicalize(&path).unwrap_or(path);
        if !loaded.iter().any(|(p, _)| *p == path) {
            let debug = debug::load(&path).map_err(&refuse)?;
            loaded.push((path.clone(), debug));
        }
        let (_, debug) = loaded.iter().find(|(p, _)| *p == path).expect("loaded above");
        let sites = line_addresses(debug, &place).map_err(&refuse)?;
        let module =
            super::usdt::Module::read(&path).ok_or_else(|| refuse(format!("{}: cannot read", path.display())))?;
        let shown = path.display().to_string();
        if shown.contains(char::is_whitespace) {
            return Err(refuse(format!("{shown}: a path with blanks cannot be written in a definition")));
        }
        let (group, event) = match named.strip_prefix(':') {
            Some(n) => match n.split_once('/') {
                Some((g, e)) => (Some(g), (!e.is_empty()).then_some(e)),
                None => (None, Some(n)),
            },
            None => (None, None),
        };
        let base = match (event, &place) {
            (Some(e), _) => e.to_string(),
            (None, LinePlace::Function { name, line }) => def::sanitize(&format!("{name}_L{line}")),
            (None, LinePlace::File { file, line }) => {
                let stem = file.rsplit('/').next().unwrap_or(file);
                let stem = stem.split('.').next().unwrap_or(stem);
                def::sanitize(&format!("{stem}_L{line}"))
            }
        };
        let rest = &text[where_at + place_word.len()..];
        let by_name = super::dwarf::names_variables(text);
        if by_name && !variables.iter().any(|(p, _)| *p == path) {
            variables.push((path.clone(), super::dwarf::Module::load(&path).map_err(&refuse)?));
        }
        for (n, site) in sites.iter().enumerate() {
            let offset = module.offset_of(site.addr).ok_or_else(|| {
                refuse(format!("address {:#x} of {place} lies outside the file's segments", site.addr))
            })?;
            let name = if n == 0 { base.clone() } else { format!("{base}_{n}") };
            let head = match group {
                Some(g) => format!("p:{g}/{name}"),
                None => format!("p:{name}"),
            };
            if by_name {
                // Each site's variables where they are at its address: location lists and
                // the frame (CFA) taken there, not at the function's entry.
                let (_, m) = variables.iter().find(|(p, _)| *p == path).expect("loaded above");
                let f = m.variables_at(site.addr).map_err(&refuse)?;
                let args = super::dwarf::fetchargs(text, &f, &place.to_string(), false).map_err(&refuse)?;
                out.push(super::dwarf::with_args(text, &format!("{head} {shown}:{offset:#x}"), &args));
                continue;
            }
            out.push(format!("{head} {shown}:{offset:#x}{rest}"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_places_are_told_from_offsets_symbols_and_markers() {
        let func = |n: &str, l| LinePlace::Function { name: n.into(), line: l };
        let file = |f: &str, l| LinePlace::File { file: f.into(), line: l };
        assert_eq!(parse_place("lines:classify:4"), Some((Some("lines"), func("classify", 4))));
        assert_eq!(parse_place("/bin/x:lines.c:22"), Some((Some("/bin/x"), file("lines.c", 22))));
        assert_eq!(parse_place("lines.c:22"), Some((None, file("lines.c", 22))));
        assert_eq!(parse_place("src/a.cc:7"), Some((None, file("src/a.cc", 7))));
        for not in ["/bin/x:4096", "x:0x10", "main+4", "libc.so.6:1234", "sdt:app:tick", "classify:4", "a::b:3"] {
            assert_eq!(parse_place(not), None, "{not}");
        }
        assert!(names_a_line("p:g/e lines:loop:3 x=%di if x > 1"));
        assert!(!names_a_line("p lines:loop x=%di"));
    }
}
