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
