//! Where a program's DWARF is, and its sections' bytes: the program itself, or its separate
//! debug file, found by build id (`/usr/lib/debug/.build-id/NN/REST.debug`) and then by
//! `.gnu_debuglink` (beside the program, in its `.debug/`, or under `/usr/lib/debug`), as gdb
//! and perf find them. Sections compressed with zlib (`SHF_COMPRESSED`, as Debian ships debug
//! files) are inflated. Used by line places ([`super::lines`]) and variables
//! ([`super::dwarf`]).
//!
//! The files are hostile input: a header claiming more than 4 GiB is refused.

use std::borrow::Cow;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection};

/// The separate debug file of `file` (read from `path`): by build id, then by
/// `.gnu_debuglink`; None when there is none.
pub fn separate(file: &object::File<'_>, path: &Path) -> Option<PathBuf> {
    if let Ok(Some(id)) = file.build_id() {
        if id.len() >= 2 {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            let p = PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]));
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let (name, _crc) = file.gnu_debuglink().ok().flatten()?;
    let name = String::from_utf8_lossy(name).into_owned();
    let dir = fs::canonicalize(path).ok()?.parent()?.to_path_buf();
    let candidates = [
        dir.join(&name),
        dir.join(".debug").join(&name),
        Path::new("/usr/lib/debug").join(dir.strip_prefix("/").unwrap_or(&dir)).join(&name),
    ];
    candidates.into_iter().find(|p| p.is_file() && p != path)
}

/// A section's bytes (empty when `file` has no such section), inflated when compressed.
pub fn section<'a>(file: &object::File<'a>, name: &str) -> Result<Cow<'a, [u8]>, String> {
    let Some(s) = file.section_by_name(name) else { return Ok(Cow::Borrowed(&[])) };
    let compressed = s.compressed_data().map_err(|e| format!("{name}: {e}"))?;
    match compressed.format {
        object::CompressionFormat::None => Ok(Cow::Borrowed(compressed.data)),
        object::CompressionFormat::Zlib => {
            let size = usize::try_from(compressed.uncompressed_size).unwrap_or(usize::MAX);
            // A bound against a hostile header claiming terabytes.
            if size > 1 << 32 {
                return Err(format!("{name}: compressed section claims {size} bytes"));
            }
            let mut out = Vec::with_capacity(size);
            flate2::read::ZlibDecoder::new(compressed.data)
                .take(size as u64)
                .read_to_end(&mut out)
                .map_err(|e| format!("{name}: cannot inflate: {e}"))?;
            Ok(Cow::Owned(out))
        }
        other => Err(format!("{name}: compressed as {other:?}, which is not read here")),
    }
}
