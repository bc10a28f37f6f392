//! The documentation a clone carries holds together: every relative link and `#anchor` of
//! README.md and `docs/*.md` leads to a file of the repository and, for an anchor, to a
//! heading of that page as GitHub names it; nothing points outside the repository; every
//! table renders as a table. This reads the Markdown as text, with no network, and fails
//! with every dead link named (file, line, target).

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use uprobe_tests::workspace_root;

/// README.md and every `docs/*.md` under `root`, sorted.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![root.join("README.md")];
    if let Ok(entries) = std::fs::read_dir(root.join("docs")) {
        let mut pages: Vec<PathBuf> =
            entries.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "md")).collect();
        pages.sort();
        docs.extend(pages);
    }
    docs
}

/// The fence that opens or closes a code block: its character and length.
fn fence(line: &str) -> Option<(char, usize)> {
    let t = line.trim_start();
    let c = t.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let n = t.chars().take_while(|&x| x == c).count();
    (n >= 3).then_some((c, n))
}

/// Each line of `text` with its number (from 1), and whether it lies in a fenced code block
/// (the fences included).
fn lines_outside_code(text: &str) -> Vec<(usize, &str, bool)> {
    let mut open: Option<(char, usize)> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match (open, fence(line)) {
            (None, Some(f)) => {
                open = Some(f);
                out.push((i + 1, line, true));
            }
            (Some((c, n)), Some((c2, n2))) if c == c2 && n2 >= n && line.trim().chars().all(|x| x == c) => {
                open = None;
                out.push((i + 1, line, true));
            }
            (o, _) => out.push((i + 1, line, o.is_some())),
        }
    }
    out
}

/// `line` without its inline code spans (each replaced by a blank).
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '`' {
            let n = chars[i..].iter().take_while(|&&c| c == '`').count();
            // The closing run is the next run of exactly n backticks.
            let mut j = i + n;
            let mut close = None;
            while j < chars.len() {
                if chars[j] == '`' {
                    let m = chars[j..].iter().take_while(|&&c| c == '`').count();
                    if m == n {
                        close = Some(j + m);
                        break;
                    }
                    j += m;
                } else {
                    j += 1;
                }
            }
            match close {
                Some(end) => {
                    out.push(' ');
                    i = end;
                }
                None => {
                    out.extend(&chars[i..i + n]);
                    i += n;
                }
            }
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// A heading's text as GitHub makes it an anchor: the text as rendered (code spans keep
/// their content, links their text), lower case, every character that is not a letter, a
/// digit, `-`, `_` or a space dropped, each space made a `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](target) -> text
    while let Some(at) = rest.find('[') {
        text.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        match after.find("](").and_then(|close| after[close + 2..].find(')').map(|end| (close, end))) {
            Some((close, end)) => {
                text.push_str(&after[..close]);
                rest = &after[close + 2 + end + 1..];
            }
            None => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown page: its headings' slugs (a repeated one numbered `-1`,
/// `-2`..., as GitHub does) and the `id`/`name` of its HTML anchors.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (_, line, code) in lines_outside_code(text) {
        if code {
            continue;
        }
        let t = line.trim_start();
        let hashes = t.chars().take_while(|&c| c == '#').count();
        let indent = line.len() - t.len();
        if indent <= 3 && (1..=6).contains(&hashes) && (t.len() == hashes || t[hashes..].starts_with(' ')) {
            let title = t[hashes..].trim().trim_end_matches('#').trim();
            let base = slug(title);
            let mut name = base.clone();
            let mut n = 0;
            while found.contains(&name) {
                n += 1;
                name = format!("{base}-{n}");
            }
            found.insert(name);
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                rest = &rest[at + attr.len()..];
                if let Some(end) = rest.find('"') {
                    found.insert(rest[..end].to_string());
                }
            }
        }
    }
    found
}

/// The link targets of a line outside code: inline links and images `[text](target "title")`,
/// `<target>` inside them, and reference definitions `[label]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let t = line.trim_start();
    if t.starts_with('[') {
        if let Some(close) = t.find("]:") {
            if !t[..close].contains(']') {
                if let Some(target) = t[close + 2..].split_whitespace().next() {
                    targets.push(target.trim_start_matches('<').trim_end_matches('>').to_string());
                }
            }
        }
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        // The target ends at the `)` that balances the opening one.
        let mut depth = 0usize;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = i;
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let inner = rest[..end].trim();
        let target = if let Some(angle) = inner.strip_prefix('<') {
            angle.split('>').next().unwrap_or("").to_string()
        } else {
            inner.split_whitespace().next().unwrap_or("").to_string()
        };
        targets.push(target);
        rest = &rest[end..];
    }
    targets
}

/// `%20`-style escapes decoded.
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `base` joined with the relative `path`, `.` and `..` resolved without touching the file
/// system; `None` when it climbs above the file system's root.
fn joined(base: &Path, path: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in base.join(path).components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// Every table of `text` renders: a table starts after a blank line with a header row and a
/// delimiter row, each row has as many cells as the header (a `|` inside a code span splits
/// cells too, unless written `\|`), and a blank line ends it.
fn table_problems(text: &str) -> Vec<(usize, String)> {
    let lines = lines_outside_code(text);
    let is_row = |l: &str| l.trim_start().starts_with('|');
    let cells = |l: &str| {
        let t = l.trim();
        let mut n = 0;
        let mut prev = ' ';
        for c in t.chars() {
            if c == '|' && prev != '\\' {
                n += 1;
            }
            prev = c;
        }
        // `| a | b |` has three pipes and two cells.
        n - usize::from(t.starts_with('|')) - usize::from(t.ends_with('|') && !t.ends_with("\\|")) + 1
    };
    let mut problems = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let (no, line, code) = lines[i];
        if code || !is_row(line) {
            i += 1;
            continue;
        }
        let start = i;
        while i < lines.len() && !lines[i].2 && is_row(lines[i].1) {
            i += 1;
        }
        let block = &lines[start..i];
        if start > 0 && !lines[start - 1].1.trim().is_empty() {
            problems.push((no, "a table row that follows text: it renders as text, not as a table row".into()));
            continue;
        }
        let delimiter = block.get(1).map(|l| l.1.trim()).unwrap_or("");
        let is_delimiter = !delimiter.is_empty()
            && delimiter.contains('-')
            && delimiter.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '));
        if !is_delimiter {
            problems.push((no, "a table without a delimiter row (|---|) under its header".into()));
            continue;
        }
        let width = cells(line);
        for &(row_no, row, _) in block {
            if cells(row) != width {
                problems.push((row_no, format!("a table row of {} cells under a header of {width}", cells(row))));
            }
        }
        if let Some(&(after_no, after, _)) = lines.get(i) {
            if !after.trim().is_empty() {
                problems.push((after_no, "text right after a table: it renders as one more table row".into()));
            }
        }
    }
    problems
}

/// Every problem of the documentation under `root`, one line each: `file:line: what`.
fn problems(root: &Path) -> Vec<String> {
    let root = root.canonicalize().unwrap();
    let mut out = Vec::new();
    for doc in documents(&root) {
        let name = doc.strip_prefix(&root).unwrap().display().to_string();
        let Ok(text) = std::fs::read_to_string(&doc) else {
            out.push(format!("{name}: missing"));
            continue;
        };
        let own = anchors(&text);
        for (no, why) in table_problems(&text) {
            out.push(format!("{name}:{no}: {why}"));
        }
        for (no, line, code) in lines_outside_code(&text) {
            if code {
                continue;
            }
            let prose = without_code_spans(line);
            for bare in ["http://", "https://", "www."] {
                if prose.contains(bare) && !link_targets(line).iter().any(|t| t.contains(bare)) {
                    out.push(format!("{name}:{no}: an address outside the repository ({bare}...)"));
                }
            }
            for target in link_targets(line) {
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                if target.is_empty() {
                    out.push(format!("{name}:{no}: an empty link"));
                    continue;
                }
                if path.contains(':') || path.starts_with('/') || path.starts_with("//") {
                    out.push(format!("{name}:{no}: {target}: points outside the repository"));
                    continue;
                }
                let page = if path.is_empty() {
                    doc.clone()
                } else {
                    match joined(doc.parent().unwrap(), &percent_decoded(path)) {
                        Some(p) if p.starts_with(&root) => p,
                        _ => {
                            out.push(format!("{name}:{no}: {target}: points outside the repository"));
                            continue;
                        }
                    }
                };
                if !page.exists() {
                    out.push(format!("{name}:{no}: {target}: no such file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                let anchor = percent_decoded(anchor);
                if page.extension().is_some_and(|e| e == "md") {
                    let theirs;
                    let set = if page == doc {
                        &own
                    } else {
                        theirs = anchors(&std::fs::read_to_string(&page).unwrap_or_default());
                        &theirs
                    };
                    if !set.contains(&anchor) {
                        out.push(format!("{name}:{no}: {target}: no heading makes the anchor #{anchor}"));
                    }
                } else {
                    // Source files: GitHub's line anchors only.
                    let lines = anchor.split('-').all(|p| {
                        p.strip_prefix('L').is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    });
                    if !lines {
                        out.push(format!("{name}:{no}: {target}: #{anchor} is not a line anchor of a source file"));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_link_and_anchor_of_the_documentation_resolves() {
    let root = workspace_root();
    let found = problems(&root);
    assert!(found.is_empty(), "{} problems in the documentation:\n{}", found.len(), found.join("\n"));
    // The checker sees the links (a reader that found none would pass anything).
    let links: usize = documents(&root)
        .iter()
        .map(|doc| {
            let text = std::fs::read_to_string(doc).unwrap();
            lines_outside_code(&text).iter().filter(|l| !l.2).map(|l| link_targets(l.1).len()).sum::<usize>()
        })
        .sum();
    assert!(links >= 40, "only {links} links found in README.md and docs/*.md");
    println!("{} documents, {links} links and anchors checked", documents(&root).len());
}

#[test]
fn the_readme_is_an_overview_and_docs_has_an_index() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let n = readme.lines().count();
    assert!(n <= 300, "README.md has {n} lines: the details belong in a page of docs/");
    let index = std::fs::read_to_string(root.join("docs/README.md")).unwrap();
    for page in documents(&root).iter().skip(1) {
        let file = page.file_name().unwrap().to_str().unwrap();
        if file != "README.md" {
            assert!(index.contains(&format!("]({file}")), "docs/README.md does not link to {file}");
        }
    }
}

/// The checker itself: a tree with one of each mistake is refused, each mistake named.
#[test]
fn planted_mistakes_are_each_found() {
    let root = std::env::temp_dir().join(format!("uprobe-docs-links-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(root.join("code.rs"), "fn main() {}\n").unwrap();
    std::fs::write(
        root.join("README.md"),
        "# Title\n\n## Events without code: `-e`\n\n## Again\n\n## Again\n\n\
         [ok](#events-without-code--e) [ok](#again-1) [ok](docs/page.md#a-b_c) [ok](code.rs#L3-L5)\n\
         [ok](docs/) [ok](<docs/page.md>) `[not a link](nowhere.md)`\n\n\
         ```\n[in a code block](nowhere.md)\n```\n\n\
         [dead file](docs/nowhere.md)\n[dead anchor](#again-2)\n[dead remote anchor](docs/page.md#nope)\n\
         [outside](../../etc/passwd) [web](https://example.com/)\n\n\
         | a | b |\n|---|---|\n| `x||y` | z |\n\n\
         text\n| c | d |\n|---|---|\n",
    )
    .unwrap();
    std::fs::write(
        root.join("docs/page.md"),
        "# Page\n\n## A, b_c!\n\n[back](../README.md#title)\n[code](../code.rs#main)\n",
    )
    .unwrap();
    let found = problems(&root);
    std::fs::remove_dir_all(&root).unwrap();
    let expect = [
        "README.md:16: docs/nowhere.md: no such file",
        "README.md:17: #again-2: no heading makes the anchor #again-2",
        "README.md:18: docs/page.md#nope: no heading makes the anchor #nope",
        "README.md:19: ../../etc/passwd: points outside the repository",
        "README.md:19: https://example.com/: points outside the repository",
        "README.md:23: a table row of 4 cells under a header of 2",
        "README.md:26: a table row that follows text: it renders as text, not as a table row",
        "docs/page.md:6: ../code.rs#main: #main is not a line anchor of a source file",
    ];
    let mut found_sorted = found.clone();
    found_sorted.sort();
    let mut expect_sorted: Vec<String> = expect.iter().map(|s| s.to_string()).collect();
    expect_sorted.sort();
    assert_eq!(found_sorted, expect_sorted, "found:\n{}", found.join("\n"));
}

#[test]
fn anchors_are_named_as_github_names_them() {
    assert_eq!(slug("Events without code: `-e`"), "events-without-code--e");
    assert_eq!(
        slug("Answers instead of streams: `--count`, `--hist`, `--latency`"),
        "answers-instead-of-streams---count---hist---latency"
    );
    assert_eq!(slug("How it counts, and what it costs"), "how-it-counts-and-what-it-costs");
    assert_eq!(slug("Prometheus metrics: `--serve`"), "prometheus-metrics---serve");
    assert_eq!(slug("See [the page](x.md) now"), "see-the-page-now");
    let page = "# T\n\n## Limits\n\n```\n## not a heading\n```\n\n### Limits\n";
    let found: Vec<String> = anchors(page).into_iter().collect();
    assert_eq!(found, ["limits", "limits-1", "t"]);
}
