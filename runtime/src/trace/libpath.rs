//! Whether a module a definition names, not loaded at start-up, could still be loaded later:
//! a file of that name (or stem: `libfoo` for `libfoo.so.1`) on the dynamic loader's search
//! path (`LD_LIBRARY_PATH`, the directories of the modules loaded, the default directories,
//! the libraries in `/etc/ld.so.cache`), or at the path given. A name no file answers to is
//! a typo: the run is refused with the closest names, loaded or installed.
//!
//! Start-up, normal context (reads directories and the loader's cache).

use crate::base::elf::{self, LoadedModule};

/// The loader's default directories on x86_64 (Debian's multiarch ones first).
const DEFAULT_DIRS: [&str; 6] =
    ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"];
const LD_SO_CACHE: &str = "/etc/ld.so.cache";
/// How many close names a refusal offers.
const SUGGESTIONS: usize = 3;

/// Ok if a file could be the module `name`; otherwise the closest names known (loaded
/// modules first, then installed libraries), at most `SUGGESTIONS`.
pub fn findable(name: &str, loaded: &[LoadedModule]) -> Result<(), Vec<String>> {
    if name.contains('/') {
        return match std::fs::metadata(name) {
            Ok(m) if m.is_file() => Ok(()),
            _ => Err(Vec::new()),
        };
    }
    let loaded_names: Vec<String> = loaded.iter().map(|m| base(&m.path).to_string()).collect();
    let installed = installed_names(loaded);
    if installed.iter().any(|n| elf::module_matches(n, name)) {
        return Ok(());
    }
    let mut known: Vec<String> = loaded_names;
    known.extend(installed);
    Err(closest(name, &known))
}

fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The file names of every library the loader could find by name.
fn installed_names(loaded: &[LoadedModule]) -> Vec<String> {
    let mut dirs: Vec<String> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split([':', ';'])
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect();
    dirs.extend(loaded.iter().filter_map(|m| m.path.rsplit_once('/').map(|(d, _)| d.to_string())));
    dirs.extend(DEFAULT_DIRS.iter().map(|d| d.to_string()));
    let mut names = Vec::new();
    for dir in &dirs {
        if let Ok(entries) = std::fs::read_dir(dir) {
            let files = entries.flatten().filter_map(|e| e.file_name().into_string().ok());
            names.extend(files.filter(|n| n.contains(".so")));
        }
    }
    if let Ok(cache) = std::fs::read(LD_SO_CACHE) {
        names.extend(cache_paths(&cache).into_iter().map(|p| base(&p).to_string()));
    }
    names.sort();
    names.dedup();
    names
}

/// The library paths the loader's cache holds: its string table's absolute paths.
fn cache_paths(cache: &[u8]) -> Vec<String> {
    cache
        .split(|&b| b == 0)
        .filter(|s| s.first() == Some(&b'/') && s.len() > 1)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .filter(|s| s.contains(".so"))
        .map(str::to_string)
        .collect()
}

/// The names of `known` closest to `name` (edit distance on the file name, or on its part
/// as long as `name`, so `libcc.so.6` finds `libc.so.6` and `libsqlite` finds
/// `libsqlite3.so.0`), best first.
fn closest(name: &str, known: &[String]) -> Vec<String> {
    let limit = (name.len() / 3).max(2);
    let mut scored: Vec<(usize, usize, &String)> = known
        .iter()
        .enumerate()
        .filter_map(|(i, k)| {
            let prefix: String = k.chars().take(name.chars().count()).collect();
            let d = distance(name, k).min(distance(name, &prefix) + 1);
            (d <= limit).then_some((d, i, k))
        })
        .collect();
    scored.sort();
    let mut out: Vec<String> = Vec::new();
    for (_, _, k) in scored {
        if !out.contains(k) && out.len() < SUGGESTIONS {
            out.push(k.clone());
        }
    }
    out
}

/// Levenshtein distance, by characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1).min(row[j] + 1).min(diagonal + usize::from(ca != cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_names_come_first() {
        let known: Vec<String> = ["libc.so.6", "libm.so.6", "libsqlite3.so.0", "libcrypt.so.1", "ld-linux-x86-64.so.2"]
            .map(String::from)
            .into();
        assert_eq!(closest("libcc.so.6", &known), ["libc.so.6", "libm.so.6"]);
        assert_eq!(closest("libsqlite", &known), ["libsqlite3.so.0"]);
        assert!(closest("zzzzzzzzzzzzzz", &known).is_empty());
        assert_eq!(distance("kitten", "sitting"), 3);
    }

    #[test]
    fn the_caches_paths_are_its_absolute_strings() {
        let cache =
            b"glibc-ld.so.cache1.1\0\x01\0/lib/x86_64-linux-gnu/libc.so.6\0libc.so.6\0/usr/lib/libz.so.1\0/etc\0";
        assert_eq!(cache_paths(cache), ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/libz.so.1"]);
    }
}
