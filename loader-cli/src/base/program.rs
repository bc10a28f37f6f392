//! The program a launch names: a path, or a name looked up in PATH as execvp does.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::base::error::Error;
use crate::base::sys;

/// What execvp searches when PATH is unset (glibc's default).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// A name without `/` is looked up in PATH, like execvp does.
pub fn resolve_program(name: &Path) -> Result<PathBuf, Error> {
    if name.as_os_str().is_empty() {
        return Err(Error::NoProgram);
    }
    if name.as_os_str().as_bytes().contains(&b'/') {
        return Ok(name.into());
    }
    let path_var = std::env::var_os("PATH");
    search_path(name.as_os_str(), path_var.as_deref(), |candidate| match fs::metadata(candidate) {
        Ok(meta) if meta.is_file() && sys::may_execute(candidate) => Candidate::Executable,
        Ok(_) => Candidate::Present,
        Err(_) => Candidate::Missing,
    })
    .ok_or_else(|| Error::NotInPath(name.into()))
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

#[cfg(test)]
mod tests {
    use super::*;

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
