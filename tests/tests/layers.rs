//! The runtime's source reads in layers: `runtime/src` has one folder per layer, each file
//! imports only from its own folder and the folders below it, no two files import each other
//! in a circle, and no file is much over 500 lines. This reads the source, as a reviewer
//! would, and fails on the first import that goes up or closes a circle.

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

fn without_comments(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The files of the crate that `text` names through `crate::LAYER::MODULE` paths.
fn imports(text: &str, files: &BTreeMap<String, String>) -> BTreeSet<String> {
    let code = without_comments(text);
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let Some((layer, tail)) = rest.split_once("::") else { continue };
        if !LAYERS.contains(&layer) {
            continue;
        }
        let modules: Vec<&str> = if let Some(group) = tail.strip_prefix('{') {
            group
                .split('}')
                .next()
                .unwrap_or("")
                .split(',')
                .map(|m| m.trim().split("::").next().unwrap_or(""))
                .collect()
        } else {
            vec![tail.split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap_or("")]
        };
        for m in modules {
            let name = format!("{layer}/{}", m.split_whitespace().next().unwrap_or(""));
            if files.contains_key(&name) {
                found.insert(name);
            }
        }
    }
    found
}

fn layer_of(file: &str) -> usize {
    LAYERS.iter().position(|l| file.starts_with(&format!("{l}/"))).unwrap()
}

#[test]
fn imports_only_go_down_and_never_in_a_circle() {
    let files = sources();
    assert!(files.len() > 20, "runtime sources not found: {files:?}");
    let graph: BTreeMap<String, BTreeSet<String>> = files
        .iter()
        .map(|(name, text)| {
            let mut deps = imports(text, &files);
            deps.remove(name);
            (name.clone(), deps)
        })
        .collect();
    for (file, deps) in &graph {
        for dep in deps {
            assert!(layer_of(dep) <= layer_of(file), "{file} imports {dep}, from a layer above it");
        }
    }
    // A circle: a file that reaches itself.
    for start in graph.keys() {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<(&String, Vec<&String>)> = graph[start].iter().map(|d| (d, vec![start, d])).collect();
        while let Some((at, path)) = todo.pop() {
            assert!(at != start, "import circle: {}", path.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" -> "));
            if seen.insert(at) {
                todo.extend(graph[at].iter().map(|d| {
                    let mut p = path.clone();
                    p.push(d);
                    (d, p)
                }));
            }
        }
    }
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
                out.insert(key, code_only(&std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(&workspace_root().join("loader-cli/src"), "", &mut files);
    files
}

/// `text` without its `#[cfg(test)] mod tests`, comments, string and character literals.
fn code_only(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let rest = |n: usize| chars.get(i + n).copied().unwrap_or(' ');
        match chars[i] {
            '/' if rest(1) == '/' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                out.push_str("\"\"");
            }
            '\'' if rest(1) == '\\' || rest(2) == '\'' => {
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                out.push_str("' '");
            }
            c => out.push(c),
        }
        i += 1;
    }
    out
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
    // The attach rework removes this exemption: until then the files of `attach/` import
    // each other in a circle, which this test does not look into (the layer rule above
    // holds for them all the same).
    let exempt = |a: &str, b: &str| a.starts_with("attach") && b.starts_with("attach");
    // Depth first: a module met again while its own imports are being followed is a circle.
    fn visit<'a>(
        at: &'a str,
        graph: &'a BTreeMap<&str, BTreeSet<String>>,
        exempt: &dyn Fn(&str, &str) -> bool,
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
        for dep in graph[at].iter().filter(|dep| !exempt(at, dep)) {
            visit(dep, graph, exempt, path, done);
        }
        path.pop();
        done.insert(at);
    }
    let mut done = BTreeSet::new();
    for file in graph.keys() {
        visit(file, &graph, &exempt, &mut Vec::new(), &mut done);
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
    .map(|(k, v)| (k.to_string(), code_only(v)))
    .collect();
    let imports = |name: &str| cli_imports(name, &files).into_iter().collect::<Vec<_>>();
    assert_eq!(imports("main"), ["a", "b"]);
    assert_eq!(imports("a"), ["a/inner", "b", "c", "c/d"]);
    assert_eq!(imports("a/inner"), ["b"]);
    assert_eq!(imports("c/d"), ["b"]);
}
