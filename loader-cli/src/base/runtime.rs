//! Which runtime library the program gets preloaded: `$UPROBE_LIB`; else `libuprobe.so`
//! beside this executable (a build tree); else the copy carried inside this executable
//! (`build.rs`), written once to a private cache file, since LD_PRELOAD needs a path that
//! the program, and the programs it execs, can open. Only release builds carry a copy.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::base::error::Error;

/// The runtime built with this executable; empty in a build that carries none (not release).
static EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libuprobe.so"));
/// A hash of [`EMBEDDED`]: the cache directory's name, with the version.
const HASH: &str = env!("UPROBE_RUNTIME_HASH");

/// Where the runtime comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `$UPROBE_LIB`.
    Environment,
    /// `libuprobe.so` beside uprobe-run.
    Beside,
    /// Carried inside uprobe-run and written to a cache file.
    Embedded,
}

impl Origin {
    pub fn describe(self) -> &'static str {
        match self {
            Origin::Environment => "from UPROBE_LIB",
            Origin::Beside => "beside uprobe-run",
            Origin::Embedded => "carried inside uprobe-run, written there on first use",
        }
    }
}

/// The runtime library to preload, and where it comes from.
pub fn locate() -> Result<(PathBuf, Origin), Error> {
    if let Some(found) = given()? {
        return Ok(found);
    }
    if EMBEDDED.is_empty() {
        return Err(Error::RuntimeNotCarried);
    }
    extract().map(|path| (path, Origin::Embedded))
}

/// `$UPROBE_LIB`, or `libuprobe.so` beside this executable, if there.
fn given() -> Result<Option<(PathBuf, Origin)>, Error> {
    if let Some(lib) = std::env::var_os("UPROBE_LIB").filter(|v| !v.is_empty()) {
        return Ok(Some((lib.into(), Origin::Environment)));
    }
    let exe = std::env::current_exe().map_err(|source| Error::Read { path: "/proc/self/exe".into(), source })?;
    let beside = exe.with_file_name("libuprobe.so");
    Ok(beside.is_file().then_some((beside, Origin::Beside)))
}

/// The runtime a running process is to load (attach): its name for messages, and its bytes,
/// which go to the process in a memory file of its own (see `attach::load`), never through
/// a path another user could have made or could change.
pub fn for_attach() -> Result<(PathBuf, Vec<u8>), Error> {
    match given()? {
        Some((path, _)) => {
            crate::base::check::library(&path).map_err(|e| match e {
                Error::NoSuchFile(path) => Error::NoRuntime(path),
                other => other,
            })?;
            let bytes = fs::read(&path).map_err(|source| Error::Read { path: path.clone(), source })?;
            Ok((path, bytes))
        }
        None if EMBEDDED.is_empty() => Err(Error::RuntimeNotCarried),
        // Copied: the ELF reader wants its data aligned as a heap block is, not as a static.
        None => Ok((PathBuf::from("libuprobe.so (carried inside uprobe-run)"), EMBEDDED.to_vec())),
    }
}

/// The cache directories tried, in order: `$XDG_CACHE_HOME` or `~/.cache`, then a directory
/// of this user's in /tmp.
fn cache_dirs() -> Vec<PathBuf> {
    let env_dir = |name: &str| std::env::var_os(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let mut dirs = Vec::new();
    match env_dir("XDG_CACHE_HOME") {
        Some(dir) => dirs.push(dir),
        // A home that does not exist is not made.
        None => dirs.extend(env_dir("HOME").filter(|home| home.is_dir()).map(|home| home.join(".cache"))),
    }
    dirs.push(tmp_dir());
    dirs
}

/// This user's directory in /tmp.
fn tmp_dir() -> PathBuf {
    std::env::temp_dir().join(format!("uprobe-run-{}", crate::base::sys::uid()))
}

/// Writes the embedded runtime to `<cache>/uprobe-run/<version>-<hash>/libuprobe.so`, unless
/// it is there already with the same bytes.
fn extract() -> Result<PathBuf, Error> {
    let leaf = Path::new("uprobe-run").join(format!("{}-{HASH}", env!("CARGO_PKG_VERSION"))).join("libuprobe.so");
    let mut first_error = None;
    for dir in cache_dirs() {
        let path = dir.join(&leaf);
        // LD_PRELOAD splits on ':' and blanks.
        if path.as_os_str().as_bytes().iter().any(|&b| b == b':' || b.is_ascii_whitespace()) {
            continue;
        }
        match write_once(&dir, &path) {
            Ok(()) => return Ok(path),
            Err(source) => {
                first_error.get_or_insert(Error::RuntimeCache { path, source });
            }
        }
    }
    Err(first_error.unwrap_or(Error::RuntimeCache { path: leaf, source: io::Error::other("no cache directory") }))
}

fn write_once(base: &Path, path: &Path) -> io::Result<()> {
    // The directory is checked before anything in it is used: in /tmp another user may have
    // made it first, and with it the file.
    if base == tmp_dir() {
        private_dir(base)?;
    } else if !base.is_dir() {
        // The cache directory itself, as the XDG spec asks: private.
        DirBuilder::new().recursive(true).mode(0o700).create(base)?;
    }
    if fs::read(path).is_ok_and(|bytes| bytes == EMBEDDED) {
        return Ok(());
    }
    let dir = path.parent().expect("the leaf has directories");
    DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
    // Written beside and renamed: a concurrent run sees the old file or the whole new one.
    let temp = dir.join(format!(".libuprobe.so.{}", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&temp)
        .and_then(|mut f| f.write_all(EMBEDDED).and_then(|()| f.sync_all()));
    let renamed = written.and_then(|()| fs::rename(&temp, path));
    if renamed.is_err() {
        let _ = fs::remove_file(&temp);
    }
    renamed
}

/// `/tmp/uprobe-run-UID`, made private if it is not there (see [`private_dir`]): files any
/// process may open by name, that only this user can change.
pub fn shared_private_dir() -> io::Result<PathBuf> {
    let dir = tmp_dir();
    private_dir(&dir)?;
    Ok(dir)
}

/// A directory in a shared place (/tmp) that only this user can write: created 0711 (others
/// may open a file in it they know the name of, not list or change it), or found as a real
/// directory owned by this user and closed to others' writes.
fn private_dir(dir: &Path) -> io::Result<()> {
    match DirBuilder::new().mode(0o711).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        Err(_) => {}
    }
    let meta = fs::symlink_metadata(dir)?;
    let private = meta.is_dir() && meta.uid() == crate::base::sys::uid() && meta.permissions().mode() & 0o022 == 0;
    match private {
        true => Ok(()),
        false => Err(io::Error::other(format!("{} is not a private directory of this user", dir.display()))),
    }
}
