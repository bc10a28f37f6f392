//! The bundled handler libraries, by their short names: `--handlers count` (or `libcount`,
//! `libcount.so`), `uprobe_example`, `uretprobe_example`. A name that is a file is that file;
//! otherwise a bundled library of that name is taken from beside uprobe-run (a build tree:
//! `target/release/`), or else from the copy uprobe-run carries (`build.rs`), written once
//! into a directory of this user's that no one else can write, checked before every use.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::base::error::Error;

/// (short name, file name, the carried bytes: empty where the build could not make them).
const BUNDLED: [(&str, &str, &[u8]); 3] = [
    ("count", "libcount.so", include_bytes!(concat!(env!("OUT_DIR"), "/libcount.so"))),
    ("uprobe_example", "uprobe_example.so", include_bytes!(concat!(env!("OUT_DIR"), "/uprobe_example.so"))),
    ("uretprobe_example", "uretprobe_example.so", include_bytes!(concat!(env!("OUT_DIR"), "/uretprobe_example.so"))),
];

/// The bundled library `name` names, if it names one: `count`, `libcount`, `libcount.so`.
fn bundled(name: &str) -> Option<(&'static str, &'static [u8])> {
    let stem = name.strip_suffix(".so").unwrap_or(name);
    let stem = stem.strip_prefix("lib").filter(|s| *s == "count").unwrap_or(stem);
    BUNDLED.iter().find(|(short, _, _)| *short == stem).map(|&(_, file, bytes)| (file, bytes))
}

/// The file a `--handlers` argument stands for: itself, unless it is no file and a bundled
/// library's short name.
pub fn resolve(arg: &Path) -> Result<PathBuf, Error> {
    let Some(name) = arg.to_str().filter(|n| !n.contains('/')) else { return Ok(arg.into()) };
    let Some((file, bytes)) = bundled(name) else { return Ok(arg.into()) };
    if fs::symlink_metadata(arg).is_ok() {
        return Ok(arg.into());
    }
    if let Some(beside) = std::env::current_exe().ok().map(|exe| exe.with_file_name(file)).filter(|p| p.is_file()) {
        return Ok(beside);
    }
    if bytes.is_empty() {
        return Err(Error::NotCarried(file));
    }
    write_carried(file, bytes)
}

/// FNV-1a of the bytes: the copy's name changes with its content.
fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// `$XDG_CACHE_HOME/uprobe-run/handlers` (`~/.cache` by default), this user's and closed to
/// others' writes, made where missing.
fn private_dir() -> Result<PathBuf, Error> {
    let env_dir = |name: &str| std::env::var_os(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let cache = env_dir("XDG_CACHE_HOME").or_else(|| env_dir("HOME").map(|h| h.join(".cache")));
    let cache = cache.ok_or(Error::NoCacheDir)?;
    let dir = cache.join("uprobe-run").join("handlers");
    for d in [cache.clone(), cache.join("uprobe-run"), dir.clone()] {
        match DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(Error::HandlerCache { path: d, source }),
        }
        ours_and_closed(&d, true).map_err(|source| Error::HandlerCache { path: d.clone(), source })?;
    }
    Ok(dir)
}

/// Whether `path` (not followed if a link) is a directory (or a regular file) of this user
/// that no one else may write.
fn ours_and_closed(path: &Path, dir: bool) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    let kind = if dir { meta.is_dir() } else { meta.is_file() };
    if kind && meta.uid() == crate::base::sys::uid() && meta.mode() & 0o022 == 0 {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "not a {} of this user closed to others' writes",
        if dir { "directory" } else { "file" }
    )))
}

/// Writes `bytes` as `<private dir>/<hash>-<file>` unless that file is there with those bytes.
fn write_carried(file: &str, bytes: &[u8]) -> Result<PathBuf, Error> {
    let dir = private_dir()?;
    let path = dir.join(format!("{:016x}-{file}", hash(bytes)));
    let error = |source| Error::HandlerCache { path: path.clone(), source };
    if ours_and_closed(&path, false).is_ok() && fs::read(&path).is_ok_and(|b| b == bytes) {
        return Ok(path);
    }
    // Written beside and renamed: a concurrent run sees the old file or the whole new one.
    let temp = dir.join(format!(".{file}.{}", std::process::id()));
    let _ = fs::remove_file(&temp);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&temp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()));
    match written.and_then(|()| fs::rename(&temp, &path)) {
        Ok(()) => Ok(path),
        Err(e) => {
            let _ = fs::remove_file(&temp);
            Err(error(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names() {
        for name in ["count", "libcount", "libcount.so"] {
            assert_eq!(bundled(name).map(|b| b.0), Some("libcount.so"), "{name}");
        }
        assert_eq!(bundled("uprobe_example.so").map(|b| b.0), Some("uprobe_example.so"));
        assert_eq!(bundled("uretprobe_example").map(|b| b.0), Some("uretprobe_example.so"));
        assert!(bundled("libuprobe_example").is_none() && bundled("trace").is_none());
    }

    #[test]
    fn a_path_or_an_existing_file_is_kept() {
        assert_eq!(resolve(Path::new("./count")).unwrap(), PathBuf::from("./count"));
        assert_eq!(resolve(Path::new("h.so")).unwrap(), PathBuf::from("h.so"));
    }
}
