//! Handler libraries the process has loaded already: a library the process's own run (a
//! program started by uprobe-run) uses is one object to the dynamic loader, whatever a second
//! `dlopen` of it asks, so a session would share its statics, run its `uprobe_init` a second
//! time over them and, at detach, its `uprobe_exit`, unregistering the run's own probes. The
//! session gets a copy of the file instead: another file, another object.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::error::AttachError;
use super::target::Mapping;

/// The copies made for a session, removed when it is dropped (the process keeps its
/// mapping of a copy it loaded).
pub struct Copies {
    made: Vec<PathBuf>,
}

impl Drop for Copies {
    fn drop(&mut self) {
        for path in &self.made {
            let _ = fs::remove_file(path);
        }
    }
}

/// The paths to load in process `pid` (whose mappings are `maps`): `handlers` as given,
/// except those the process maps already, copied into [`directory`].
pub fn for_session(pid: i32, maps: &[Mapping], handlers: &[PathBuf]) -> Result<(Vec<PathBuf>, Copies), AttachError> {
    let mut copies = Copies { made: Vec::new() };
    let mut paths = Vec::with_capacity(handlers.len());
    for (n, handler) in handlers.iter().enumerate() {
        if !mapped(maps, handler) {
            paths.push(handler.clone());
            continue;
        }
        let name = handler.file_name().map_or_else(|| "handler.so".into(), |f| f.to_string_lossy().into_owned());
        let name = format!("session-{}-{pid}-{n}-{name}", std::process::id());
        let copy = directory().map(|dir| dir.join(&name)).unwrap_or_else(|_| std::env::temp_dir().join(&name));
        let made = directory()
            .and_then(|_| fs::copy(handler, &copy))
            .and_then(|_| fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)));
        made.map_err(|source| AttachError::Copy { path: handler.clone(), copy: copy.clone(), source })?;
        copies.made.push(copy.clone());
        paths.push(copy);
    }
    Ok((paths, copies))
}

/// Whether `file` is mapped in the process: same inode, and the same file by path.
fn mapped(maps: &[Mapping], file: &Path) -> bool {
    let Ok(meta) = fs::metadata(file) else { return false };
    let canonical = fs::canonicalize(file).ok();
    maps.iter().any(|m| {
        m.inode == meta.ino() && (Some(Path::new(&m.path)) == canonical.as_deref() || same_file(&m.path, &meta))
    })
}

/// Whether the mapping's path (as the process sees it) is the file of `meta`.
fn same_file(path: &str, meta: &fs::Metadata) -> bool {
    fs::metadata(path).is_ok_and(|m| m.ino() == meta.ino() && m.dev() == meta.dev())
}

/// The directory for copies: the private one uprobe-run keeps in /tmp, readable (not
/// listable) by the process whatever its user.
fn directory() -> io::Result<PathBuf> {
    crate::base::runtime::shared_private_dir()
}
