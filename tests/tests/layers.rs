//! The runtime's source reads in layers: `runtime/src` has one folder per layer, each file
//! imports only from its own folder and the folders below it, no two files import each other
//! in a circle, and no file is much over 500 lines. This reads the source, as a reviewer
//! would, and fails on the first import that goes up or closes a circle. Every path form
//! counts: `crate::`, `super::` and `self::` paths, grouped `use crate::{a::b, c::d}`, and
//! paths written in code (`crate::probe::x()`); the tests at the end check the reading on
//! small trees written for them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use uprobe_tests::workspace_root;

/// Bottom first. Front-ends beside the C API (tracing, aggregation, attach) sit between the
/// hazards and the face when they exist.
const LAYERS: &[&str] = &["base", "insn", "probe", "hazard", "trace", "aggregate", "attach", "api"];
const MAX_LINES: usize = 560;

/// `folder/file` -> its source without comments.
fn sources() -> BTreeMap<String, String> {
    let src = workspace_root().join("runtime/src");
    let mut files = BTreeMap::new();
    for layer in LAYERS {
        let dir = src.join(layer);
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                let stem = path.file_stem().unwrap().to_str().unwrap().to_string();
                let text = std::fs::read_to_string(&path).unwrap();
                files.insert(format!("{layer}/{stem}"), text);
            }
        }
    }
    files
}

/// The source without comments, string and character literals (their text cannot import).
fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |end| end + 2);
        } else if let Some(hashes) = raw_string_hashes(rest) {
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            i += body + rest[body..].find(&close).map_or(rest.len() - body, |end| end + close.len());
            out.push_str("\"\"");
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() && rest.as_bytes()[j] != b'"' {
                j += if rest.as_bytes()[j] == b'\\' { 2 } else { 1 };
            }
            i += (j + 1).min(rest.len());
            out.push_str("\"\"");
        } else if let Some(len) = char_literal_len(rest) {
            i += len;
            out.push_str("' '");
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// `r"`, `r#"`, ...: the number of `#`.
fn raw_string_hashes(rest: &str) -> Option<usize> {
    let after = rest.strip_prefix('r')?;
    let hashes = after.len() - after.trim_start_matches('#').len();
    after[hashes..].starts_with('"').then_some(hashes)
}

/// The length of a character literal at the start of `rest` (`'x'`, `'\n'`, `'\u{..}'`), or
/// None for a lifetime.
fn char_literal_len(rest: &str) -> Option<usize> {
    let after = rest.strip_prefix('\'')?;
    let end = if after.starts_with('\\') { after.find('\'')? } else { after.chars().next()?.len_utf8() };
    (after[end..].starts_with('\'') && end > 0).then_some(end + 2)
}

/// Every path that starts at `crate::`, `super::` or `self::` in `code`, with the inline
/// module it is written in (`mod tests { use super::*; }` names the file itself), groups
/// spelled out: `use crate::{a::b, c::{d, e}}` gives `crate::a::b`, `crate::c::d`,
/// `crate::c::e`. Paths written in code (`crate::probe::x()`) count as imports too.
fn paths(code: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    // Open inline modules: (name, the brace depth inside them).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    let word_start =
        |i: usize| i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
    while i < bytes.len() {
        let rest = &code[i..];
        match bytes[i] {
            b'{' => depth += 1,
            b'}' => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        if word_start(i) && rest.starts_with("mod ") {
            let name: String =
                rest[4..].trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let after = rest[4..].trim_start()[name.len()..].trim_start();
            if after.starts_with('{') {
                inline.push((name, depth + 1));
            }
        }
        if word_start(i) && ["crate::", "super::", "self::"].iter().any(|root| rest.starts_with(root)) {
            let (trees, len) = use_tree(rest);
            let within: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
            found.extend(trees.into_iter().map(|t| (within.clone(), t)));
            i += len.max(1);
            continue;
        }
        i += 1;
    }
    found
}

/// The paths of the use tree at the start of `text`, and the bytes it spans.
fn use_tree(text: &str) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let mut i = 0;
    loop {
        let rest = &text[i..];
        let ws = rest.len() - rest.trim_start().len();
        let rest = &rest[ws..];
        i += ws;
        if let Some(group) = rest.strip_prefix('{') {
            i += 1;
            let mut all = Vec::new();
            let mut at = 0;
            loop {
                let (subs, len) = use_tree(&group[at..]);
                all.extend(subs.into_iter().map(|s| [prefix.clone(), s].concat()));
                at += len;
                let tail = &group[at..];
                let ws = tail.len() - tail.trim_start().len();
                at += ws;
                match group[at..].chars().next() {
                    Some(',') => at += 1,
                    Some('}') => return (all, i + at + 1),
                    _ => return (all, i + at),
                }
                if group[at..].trim_start().starts_with('}') {
                    let ws = group[at..].len() - group[at..].trim_start().len();
                    return (all, i + at + ws + 1);
                }
            }
        }
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '*').collect();
        if name.is_empty() {
            return (vec![prefix].into_iter().filter(|p| !p.is_empty()).collect(), i);
        }
        prefix.push(name.clone());
        i += name.len();
        if !text[i..].starts_with("::") {
            return (vec![prefix], i);
        }
        i += 2;
    }
}

/// The file (`folder/module`, or `folder/mod`) that an absolute module path lands in.
fn file_of(path: &[String], files: &BTreeMap<String, String>) -> Option<String> {
    let layer = path.first()?;
    if let Some(module) = path.get(1) {
        let name = format!("{layer}/{module}");
        if files.contains_key(&name) {
            return Some(name);
        }
    }
    let name = format!("{layer}/mod");
    files.contains_key(&name).then_some(name)
}

/// The files of the crate that the file `name` (`folder/file`, `folder/mod`) names, by any
/// path form.
fn imports(name: &str, text: &str, files: &BTreeMap<String, String>) -> BTreeSet<String> {
    let (folder, file) = name.split_once('/').unwrap();
    let module: Vec<String> = if file == "mod" { vec![folder.into()] } else { vec![folder.into(), file.into()] };
    let mut found = BTreeSet::new();
    for (inline, path) in paths(&code_only(text)) {
        let mut at: Vec<String> = [module.clone(), inline].concat();
        let mut rest = path.as_slice();
        match rest.first().map(String::as_str) {
            Some("crate") => {
                at.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            _ => {}
        }
        while rest.first().is_some_and(|s| s == "super") {
            at.pop();
            rest = &rest[1..];
        }
        let absolute: Vec<String> = [at, rest.to_vec()].concat();
        // Only paths into the layers are files of the runtime (not `crate::some_macro`).
        if absolute.first().is_some_and(|l| LAYERS.contains(&l.as_str())) {
            if let Some(dep) = file_of(&absolute, files) {
                found.insert(dep);
            }
        }
    }
    found.remove(name);
    found
}

/// Each file's imports.
fn graph(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    files.iter().map(|(name, text)| (name.clone(), imports(name, text, files))).collect()
}

/// An import circle, as its files in order, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    for start in graph.keys() {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<Vec<&String>> = graph[start].iter().map(|d| vec![start, d]).collect();
        while let Some(path) = todo.pop() {
            let at = *path.last().unwrap();
            if at == start {
                return Some(path.into_iter().cloned().collect());
            }
            if seen.insert(at) {
                todo.extend(graph.get(at).into_iter().flatten().map(|d| [path.clone(), vec![d]].concat()));
            }
        }
    }
    None
}

fn layer_of(file: &str) -> usize {
    LAYERS.iter().position(|l| file.starts_with(&format!("{l}/"))).unwrap()
}

#[test]
fn imports_only_go_down_and_never_in_a_circle() {
    let files = sources();
    assert!(files.len() > 20, "runtime sources not found: {files:?}");
    let graph = graph(&files);
    for (file, deps) in &graph {
        for dep in deps {
            assert!(layer_of(dep) <= layer_of(file), "{file} imports {dep}, from a layer above it");
        }
    }
    if let Some(circle) = circle(&graph) {
        panic!("import circle: {}", circle.join(" -> "));
    }
}

/// A small tree written for the test: `folder/file` -> source.
fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect()
}

fn deps_of(files: &BTreeMap<String, String>, name: &str) -> Vec<String> {
    imports(name, &files[name], files).into_iter().collect()
}

#[test]
fn every_path_form_is_an_import() {
    let files = tree(&[
        ("base/sys", ""),
        ("base/maps", ""),
        ("base/mod", "pub mod sys;\npub mod maps;\npub use self::sys::read;"),
        ("probe/table", ""),
        ("probe/mod", "pub fn shared() {}"),
        ("hazard/exec", ""),
        ("hazard/fork", ""),
        ("hazard/crate_form", "use crate::base::sys;"),
        ("hazard/grouped", "use crate::{base::sys, probe::{table, shared}};"),
        ("hazard/inline", "fn f() { crate::base::maps::parse(); }"),
        ("hazard/sup", "fn f() { super::exec::resolve_all(); }"),
        ("hazard/sup_group", "use super::{exec::x, fork};"),
        ("hazard/mod", "use self::exec::x;\nuse super::probe::table;"),
        ("hazard/tests_only", "#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::fork::y;\n}"),
        ("hazard/not_code", "// crate::base::sys\nconst S: &str = \"crate::probe::table\"; const C: char = '{';\nuse crate::base::maps;"),
    ]);
    assert_eq!(deps_of(&files, "hazard/crate_form"), ["base/sys"]);
    assert_eq!(deps_of(&files, "hazard/grouped"), ["base/sys", "probe/mod", "probe/table"]);
    assert_eq!(deps_of(&files, "hazard/inline"), ["base/maps"]);
    assert_eq!(deps_of(&files, "hazard/sup"), ["hazard/exec"]);
    assert_eq!(deps_of(&files, "hazard/sup_group"), ["hazard/exec", "hazard/fork"]);
    assert_eq!(deps_of(&files, "hazard/mod"), ["hazard/exec", "probe/table"]);
    assert_eq!(deps_of(&files, "base/mod"), ["base/sys"]);
    assert_eq!(deps_of(&files, "hazard/tests_only"), ["hazard/fork"], "super inside `mod tests` is the file itself");
    assert_eq!(deps_of(&files, "hazard/not_code"), ["base/maps"], "comments and literals import nothing");
}

#[test]
fn a_circle_through_any_path_form_is_found() {
    let circular = tree(&[
        ("hazard/endings", "pub fn init() { super::exec::resolve_all(); }"),
        ("hazard/exec", "use crate::hazard::{endings::end, environ};"),
        ("hazard/environ", ""),
    ]);
    let found = circle(&graph(&circular)).expect("the circle is seen");
    assert!(found.contains(&"hazard/endings".to_string()) && found.contains(&"hazard/exec".to_string()), "{found:?}");
    let straight = tree(&[
        ("hazard/endings", "use crate::hazard::environ;"),
        ("hazard/exec", "use crate::hazard::{endings::end, environ};"),
        ("hazard/environ", ""),
    ]);
    assert_eq!(circle(&graph(&straight)), None);
}

#[test]
fn every_layer_says_what_it_owns_and_no_file_is_too_long() {
    let src = workspace_root().join("runtime/src");
    for layer in LAYERS {
        let module = src.join(layer).join("mod.rs");
        if !Path::new(&src.join(layer)).exists() {
            continue;
        }
        let text = std::fs::read_to_string(&module).unwrap_or_default();
        assert!(
            text.starts_with("//!") && text.contains("Context"),
            "{} must open with a module doc that says what it owns and in which context its code runs",
            module.display()
        );
    }
    for (name, text) in sources() {
        let lines = text.lines().count();
        assert!(lines <= MAX_LINES, "runtime/src/{name}.rs has {lines} lines: is it one job?");
    }
}

// The command line's source, `loader-cli/src`: its own folders, its own reading of paths.

/// The CLI's folders, bottom first; folders on one rank (the modes) do not import each other.
/// Data goes arguments -> plan -> mode -> output: each layer takes the one before it, and the
/// modes hand what the runtime sends to `output`, which is why it sits below them.
const CLI_LAYERS: &[&[&str]] = &[&["base"], &["args"], &["plan"], &["output"], &["launch"], &["list", "attach"]];

/// The CLI's modules: `folder/file` (a folder's `mod.rs` is the folder itself, `main` the
/// crate root) -> its code, without comments, strings, character literals and unit tests.
fn cli_sources() -> BTreeMap<String, String> {
    fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            if path.is_dir() {
                walk(&path, &format!("{prefix}{name}/"), out);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let key = match stem {
                    "mod" => prefix.trim_end_matches('/').to_string(),
                    _ => format!("{prefix}{stem}"),
                };
                out.insert(key, cli_code(&std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(&workspace_root().join("loader-cli/src"), "", &mut files);
    files
}

/// `text` without its `#[cfg(test)] mod tests`, comments, string and character literals.
fn cli_code(text: &str) -> String {
    code_only(text.split("#[cfg(test)]\nmod tests").next().unwrap_or(""))
}

/// The paths written in `code`, each as its segments (`use a::{b, c::d}` gives `a::b` and
/// `a::c::d`; `self` in a group is the group's own path), with the name each is known by
/// after a `use ... as NAME`.
fn cli_paths(code: &str) -> Vec<(Vec<String>, Option<String>)> {
    fn ident(c: char) -> bool {
        c.is_alphanumeric() || c == '_'
    }
    // The path starting at `s` (an identifier) and where it ends.
    fn path_at(s: &[char], mut i: usize, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) -> usize {
        let mut segments = prefix;
        let mut any = !segments.is_empty();
        loop {
            let start = i;
            while i < s.len() && ident(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            if word != "self" || segments.is_empty() {
                segments.push(word);
            }
            if s.get(i) == Some(&':') && s.get(i + 1) == Some(&':') {
                i += 2;
                any = true;
                if s.get(i) == Some(&'{') {
                    return group(s, i + 1, segments, out);
                }
                if s.get(i) == Some(&'*') || !s.get(i).copied().is_some_and(ident) {
                    break;
                }
                continue;
            }
            break;
        }
        let rest: String = s[i..s.len().min(i + 40)].iter().collect();
        let alias = rest.strip_prefix(" as ").map(|r| r.chars().take_while(|&c| ident(c)).collect());
        if any {
            out.push((segments, alias));
        }
        i
    }
    // The items of a `{...}` group after `prefix::`, up to its closing brace.
    fn group(s: &[char], mut i: usize, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) -> usize {
        while i < s.len() && s[i] != '}' {
            if ident(s[i]) {
                i = path_at(s, i, prefix.clone(), out);
            } else {
                i += 1;
            }
        }
        i + 1
    }
    let s: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let after_path = i > 0 && (ident(s[i - 1]) || s[i - 1] == ':');
        if ident(s[i]) && !after_path && !s[i].is_ascii_digit() {
            i = path_at(&s, i, Vec::new(), &mut out);
        } else {
            i += 1;
        }
    }
    out
}

/// The modules `files[name]` imports: every path resolved as rustc does (`crate::`,
/// `super::`, `self::`, a child module, a name brought in by `use`), to the longest module
/// it names.
fn cli_imports(name: &str, files: &BTreeMap<String, String>) -> BTreeSet<String> {
    let module: Vec<String> = if name == "main" { vec![] } else { name.split('/').map(String::from).collect() };
    let key = |segments: &[String]| if segments.is_empty() { "main".to_string() } else { segments.join("/") };
    let paths = cli_paths(&files[name]);
    let mut aliases: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let resolve = |segments: &[String], aliases: &BTreeMap<String, Vec<String>>| -> Option<Vec<String>> {
        let (mut base, rest) = match segments[0].as_str() {
            "crate" => (vec![], &segments[1..]),
            "self" => (module.clone(), &segments[1..]),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                (module[..module.len().saturating_sub(ups)].to_vec(), &segments[ups..])
            }
            first => match aliases.get(first) {
                Some(target) => (target.clone(), &segments[1..]),
                None if files.contains_key(&key(&[module.clone(), vec![first.to_string()]].concat())) => {
                    (module.clone(), segments)
                }
                None => return None,
            },
        };
        base.extend(rest.iter().cloned());
        Some(base)
    };
    let mut found = BTreeSet::new();
    // Twice: a `use` may come after the code that uses its name.
    for _ in 0..2 {
        for (segments, alias) in &paths {
            let Some(full) = resolve(segments, &aliases) else { continue };
            let longest = (0..=full.len()).rev().map(|n| key(&full[..n])).find(|k| files.contains_key(k)).unwrap();
            if !full.is_empty() && key(&full) == longest {
                let named = alias.clone().unwrap_or_else(|| full.last().unwrap().clone());
                aliases.insert(named, full.clone());
            }
            found.insert(longest);
        }
    }
    found.remove(name);
    found
}

fn cli_rank(module: &str) -> usize {
    let folder = module.split('/').next().unwrap();
    match CLI_LAYERS.iter().position(|rank| rank.contains(&folder)) {
        Some(rank) => rank,
        None if module == "main" => CLI_LAYERS.len(),
        None => panic!("loader-cli/src/{module}: not in a layer folder ({CLI_LAYERS:?})"),
    }
}

#[test]
fn the_command_line_reads_in_layers_without_a_circle() {
    let files = cli_sources();
    assert!(files.contains_key("main") && files.contains_key("plan"), "CLI sources not found: {:?}", files.keys());
    let graph: BTreeMap<&str, BTreeSet<String>> = files.keys().map(|f| (f.as_str(), cli_imports(f, &files))).collect();
    for (file, deps) in &graph {
        let folder = file.split('/').next().unwrap();
        for dep in deps {
            let same_folder = dep.split('/').next().unwrap() == folder;
            assert!(
                same_folder || cli_rank(dep) < cli_rank(file),
                "loader-cli/src/{file} imports {dep}, which is not in a layer below it"
            );
            // Past the plan, no option is read from the arguments.
            let past_plan = *file != "main" && cli_rank(file) > cli_rank("plan");
            assert!(
                !(past_plan && dep.starts_with("args")),
                "loader-cli/src/{file} reads the arguments ({dep}): take the plan"
            );
        }
    }
    // Depth first: a module met again while its own imports are being followed is a circle
    // (within a folder too: `attach/` reads in one direction, see its module doc).
    fn visit<'a>(
        at: &'a str,
        graph: &'a BTreeMap<&str, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(start) = path.iter().position(|p| *p == at) {
            panic!("import circle in loader-cli/src: {} -> {at}", path[start..].join(" -> "));
        }
        if done.contains(at) {
            return;
        }
        path.push(at);
        for dep in &graph[at] {
            visit(dep, graph, path, done);
        }
        path.pop();
        done.insert(at);
    }
    let mut done = BTreeSet::new();
    for file in graph.keys() {
        visit(file, &graph, &mut Vec::new(), &mut done);
    }
}

#[test]
fn the_layers_test_reads_every_path_form_of_the_command_line() {
    let files: BTreeMap<String, String> = [
        ("main", "mod a; use a::x; fn f() { b::y(); }"),
        ("a", "use self::inner::z; use crate::{c::{self, d as e}, b};\nfn g() { e::h(); let s = \"crate::q::r\"; }"),
        ("a/inner", "use super::super::b::k; // crate::c::gone"),
        ("b", "pub fn y() {}"),
        ("c", "pub mod d;"),
        ("c/d", "use crate::b::{self};"),
        ("q", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), cli_code(v)))
    .collect();
    let imports = |name: &str| cli_imports(name, &files).into_iter().collect::<Vec<_>>();
    assert_eq!(imports("main"), ["a", "b"]);
    assert_eq!(imports("a"), ["a/inner", "b", "c", "c/d"]);
    assert_eq!(imports("a/inner"), ["b"]);
    assert_eq!(imports("c/d"), ["b"]);
}
