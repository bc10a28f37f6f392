//! The environment handed to the program and the exec itself.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What execvp searches when PATH is unset (glibc's default).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// `LD_PRELOAD` with the runtime appended to whatever the caller already preloads.
pub fn ld_preload(existing: Option<&OsStr>, runtime: &Path) -> OsString {
    let mut value = OsString::new();
    if let Some(existing) = existing.filter(|e| !e.is_empty()) {
        value.push(existing);
        value.push(":");
    }
    value.push(runtime);
    value
}

/// What a directory entry looks like to execvp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidate {
    Missing,
    /// Exists, but is not an executable file.
    Present,
    Executable,
}

/// Finds `name` (which has no `/`) in `path_var` as execvp would: the first executable
/// candidate wins; failing that, the first one that exists (so the caller can say why it
/// cannot run); an empty PATH element means the current directory.
pub fn search_path(
    name: &OsStr,
    path_var: Option<&OsStr>,
    mut probe: impl FnMut(&Path) -> Candidate,
) -> Option<PathBuf> {
    let path_var = path_var.unwrap_or(OsStr::new(DEFAULT_PATH));
    let mut first_present = None;
    for dir in path_var.as_bytes().split(|&b| b == b':') {
        let dir = if dir.is_empty() { OsStr::new(".") } else { OsStr::from_bytes(dir) };
        let candidate = Path::new(dir).join(name);
        match probe(&candidate) {
            Candidate::Executable => return Some(candidate),
            Candidate::Present if first_present.is_none() => first_present = Some(candidate),
            Candidate::Present | Candidate::Missing => {}
        }
    }
    first_present
}

/// The kernel's limit on one argument or environment string, its NUL included
/// (`MAX_ARG_STRLEN`, 32 pages): a longer one fails the exec with E2BIG.
pub const MAX_ARG_STRLEN: usize = 32 * 4096;

/// The largest record of a run specification: (key, the record's first words), and its
/// length.
pub fn largest_record(spec: &OsStr) -> Option<(String, usize)> {
    spec.as_bytes().split(|&b| b == b'\n').max_by_key(|r| r.len()).map(|r| {
        let text = String::from_utf8_lossy(r);
        let (key, value) = text.split_once('\t').unwrap_or((&text, ""));
        let shown = match key {
            "param" => format!("--param {}", value.split_once('=').map_or(value, |(n, _)| n)),
            "event" => format!("-e '{}...'", value.chars().take(24).collect::<String>()),
            other => format!("{other} {}", value.chars().take(40).collect::<String>()),
        };
        (shown, r.len())
    })
}

/// The program as it will be started.
#[derive(Debug)]
pub struct Launch {
    /// The file to execute (PATH already searched).
    pub program: PathBuf,
    /// `argv[0]`: the program as the user named it.
    pub argv0: OsString,
    pub args: Vec<OsString>,
    pub ld_preload: OsString,
    pub run_spec: OsString,
}

impl Launch {
    /// The first environment string the exec would add that is over [`MAX_ARG_STRLEN`]:
    /// its name and length (`NAME=value` and the NUL).
    pub fn oversized(&self) -> Option<(&'static str, usize)> {
        [("LD_PRELOAD", &self.ld_preload), ("UPROBE_RUN_SPEC", &self.run_spec)]
            .into_iter()
            .map(|(name, value)| (name, name.len() + 1 + value.len() + 1))
            .find(|&(_, len)| len > MAX_ARG_STRLEN)
    }

    /// The bytes the exec passes: arguments and environment, with their NULs and pointers.
    pub fn exec_size(&self) -> usize {
        let strings = |items: &mut dyn Iterator<Item = usize>| items.map(|l| l + 1 + 8).sum::<usize>();
        let args = strings(&mut std::iter::once(self.argv0.len()).chain(self.args.iter().map(|a| a.len())));
        let env = strings(
            &mut std::env::vars_os()
                .filter(|(n, _)| n != "LD_PRELOAD" && n != "UPROBE_RUN_SPEC")
                .map(|(n, v)| n.len() + 1 + v.len()),
        );
        let ours = strings(&mut [11 + self.ld_preload.len(), 16 + self.run_spec.len()].into_iter());
        args + env + ours
    }

    /// Replaces this process with the program: same pid, so the caller sees the program's
    /// own exit status or fatal signal. Returns only on failure.
    pub fn exec(self) -> io::Error {
        self.command().exec()
    }

    /// The program as a command to start (`--serve`: uprobe-run stays, the program is its
    /// child).
    pub fn command(self) -> Command {
        let mut command = Command::new(&self.program);
        command
            .arg0(&self.argv0)
            .args(&self.args)
            .env("LD_PRELOAD", &self.ld_preload)
            .env("UPROBE_RUN_SPEC", &self.run_spec);
        command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_is_appended() {
        let rt = Path::new("/opt/uprobe/libuprobe.so");
        assert_eq!(ld_preload(None, rt), "/opt/uprobe/libuprobe.so");
        assert_eq!(ld_preload(Some(OsStr::new("")), rt), "/opt/uprobe/libuprobe.so");
        assert_eq!(ld_preload(Some(OsStr::new("/a.so:/b.so")), rt), "/a.so:/b.so:/opt/uprobe/libuprobe.so");
    }

    #[test]
    fn path_search_follows_execvp() {
        let probe = |p: &Path| match p.to_str().unwrap() {
            "/usr/local/bin/prog" => Candidate::Present,
            "/usr/bin/prog" | "./prog" => Candidate::Executable,
            _ => Candidate::Missing,
        };
        let name = OsStr::new("prog");
        let search = |path: &str| search_path(name, Some(OsStr::new(path)), probe);
        assert_eq!(search("/bin:/usr/local/bin:/usr/bin"), Some("/usr/bin/prog".into()));
        assert_eq!(search("/bin:/usr/local/bin"), Some("/usr/local/bin/prog".into()));
        assert_eq!(search("/bin"), None);
        assert_eq!(search("/bin::/usr/bin"), Some("./prog".into()));
        assert_eq!(search_path(name, None, probe), Some("/usr/bin/prog".into()));
    }
}
