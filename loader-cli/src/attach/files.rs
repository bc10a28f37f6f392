//! The files an attach session's end writes here rather than in the process (`--flamegraph`,
//! `--pprof`): the process would write them as its own user, in its own file system. Its
//! runtime sends their contents at detach as marked output messages
//! (`uprobe_contracts::wire::FILE_PART`): the folded stacks, drawn here into an SVG with
//! inferno, and the profile, decoded here, re-encoded and gzipped.
//!
//! What comes is another user's process's: each file is bounded ([`MAX_FILE`]), folded
//! lines are read only when they have the shape `frame;frame count` within bounds (a line
//! of another shape is left out and counted), a profile only when it decodes whole; nothing
//! of it panics.

use std::io::Write;
use std::path::Path;

use uprobe_contracts::pprof;
use uprobe_contracts::wire::{FOLDED, PPROF};

/// The most bytes kept of each file.
pub const MAX_FILE: usize = 64 << 20;
/// The longest folded line read, and the most frames in it (127 frames, the key's other
/// parts and the event's name).
const MAX_LINE: usize = 1 << 20;
const MAX_FRAMES: usize = 256;

/// The files' bytes as they come.
#[derive(Default)]
pub struct Files {
    folded: Option<Vec<u8>>,
    pprof: Option<Vec<u8>>,
    /// Bytes beyond [`MAX_FILE`], dropped.
    over: bool,
}

impl Files {
    /// Takes one marked message (its marker removed): the kind, then bytes.
    pub fn take(&mut self, message: &[u8]) {
        let Some((&kind, bytes)) = message.split_first() else { return };
        let file = match kind {
            FOLDED => self.folded.get_or_insert_with(Vec::new),
            PPROF => self.pprof.get_or_insert_with(Vec::new),
            _ => return,
        };
        if file.len() + bytes.len() > MAX_FILE {
            self.over = true;
            return;
        }
        file.extend_from_slice(bytes);
    }

    /// Writes the files asked for (whole paths) with what came; a line on stderr for each
    /// that could not be. `title`: the flame graph's.
    pub fn write(&self, flamegraph: Option<&str>, profile: Option<&str>, title: &str) -> bool {
        let mut ok = !self.over;
        if self.over {
            eprintln!("uprobe-run: the process sent more than {} MiB for a file: the rest was dropped", MAX_FILE >> 20);
        }
        let missing = |option: &str, path: &str| {
            eprintln!("uprobe-run: {option} {path}: the process sent no stacks (it ended before its report)")
        };
        if let Some(path) = flamegraph {
            match &self.folded {
                Some(text) => ok &= report(svg(Path::new(path), title, text)),
                None => {
                    missing("--flamegraph", path);
                    ok = false;
                }
            }
        }
        if let Some(path) = profile {
            match &self.pprof {
                Some(bytes) => ok &= report(write_pprof(Path::new(path), bytes)),
                None => {
                    missing("--pprof", path);
                    ok = false;
                }
            }
        }
        ok
    }
}

fn report(result: Result<(), String>) -> bool {
    result.map_err(|line| eprintln!("uprobe-run: {line}")).is_ok()
}

/// The well-formed folded lines of `text` (`frames count`, the frames separated by `;`,
/// within bounds), and how many lines were not.
pub fn folded_lines(text: &[u8]) -> (Vec<String>, usize) {
    let mut lines = Vec::new();
    let mut bad = 0;
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let line = String::from_utf8_lossy(line);
        let ok = line.len() <= MAX_LINE
            && line.rsplit_once(' ').is_some_and(|(stack, count)| {
                let frames = stack.split(';');
                count.parse::<u64>().is_ok_and(|n| n > 0)
                    && !stack.is_empty()
                    && !line.contains(['\r', '\0'])
                    && frames.clone().count() <= MAX_FRAMES
                    && frames.into_iter().all(|f| !f.is_empty())
            });
        match ok {
            true => lines.push(line.into_owned()),
            false => bad += 1,
        }
    }
    (lines, bad)
}

/// Draws the folded lines of `text` as a flame graph SVG into `path`.
fn svg(path: &Path, title: &str, text: &[u8]) -> Result<(), String> {
    use inferno::flamegraph::{self, Options};
    let name = path.display();
    let (lines, bad) = folded_lines(text);
    if bad > 0 {
        eprintln!("uprobe-run: --flamegraph {name}: {bad} lines from the process were not folded stacks: left out");
    }
    let mut options = Options::default();
    options.title = title.to_string();
    options.count_name = "hits".to_string();
    let file = std::fs::File::create(path).map_err(|e| format!("--flamegraph {name}: {e}"))?;
    let writer = std::io::BufWriter::new(file);
    // No stacks: inferno refuses to draw, the file says so instead.
    if lines.is_empty() {
        let mut writer = writer;
        return writer.write_all(EMPTY_SVG.as_bytes()).map_err(|e| format!("--flamegraph {name}: {e}"));
    }
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), writer)
        .map_err(|e| format!("--flamegraph {name}: {e}"))
}

/// What an empty flame graph is.
const EMPTY_SVG: &str = "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"1200\" \
                         height=\"60\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"600\" y=\"30\" \
                         text-anchor=\"middle\">no stacks</text></svg>\n";

/// Checks the profile `bytes` (it must decode whole, count hits), and writes it re-encoded
/// and gzipped into `path`.
fn write_pprof(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let name = path.display();
    let profile = pprof::decode(bytes).map_err(|e| format!("--pprof {name}: the process sent no profile ({e})"))?;
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&profile.encode()).map_err(|e| format!("--pprof {name}: {e}"))?;
    let gz = z.finish().map_err(|e| format!("--pprof {name}: {e}"))?;
    std::fs::write(path, gz).map_err(|e| format!("--pprof {name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_folded_lines_within_bounds_are_read() {
        let long = format!("{} 1\n", vec!["f"; MAX_FRAMES + 1].join(";"));
        let text = format!("main;f;leaf 5\nno count\nmain;g 0\n;; 3\nmain;;x 2\nmain;g -1\n\u{0}x 2\n{long}a 7\n");
        assert_eq!(folded_lines(text.as_bytes()), (vec!["main;f;leaf 5".to_string(), "a 7".to_string()], 7));
        assert_eq!(folded_lines(b"\xff\xfe;x 3\n"), (vec!["\u{fffd}\u{fffd};x 3".to_string()], 0));
    }

    #[test]
    fn files_are_bounded_and_kept_by_kind() {
        let mut f = Files::default();
        f.take(b"fmain 1\n");
        f.take(b"fleaf 2\n");
        f.take(b"x junk");
        f.take(b"");
        f.take(b"p");
        assert_eq!(f.folded.as_deref(), Some(&b"main 1\nleaf 2\n"[..]));
        assert_eq!(f.pprof.as_deref(), Some(&b""[..]));
        let big = vec![b'p'; MAX_FILE + 2];
        f.take(&big);
        assert!(f.over);
        assert_eq!(f.pprof.as_deref(), Some(&b""[..]));
    }

    #[test]
    fn junk_draws_no_flame_graph_and_writes_no_profile_without_panic() {
        let dir = std::env::temp_dir().join(format!("uprobe-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg_path = dir.join("x.svg");
        svg(&svg_path, "t", b"\x00\x01;;; \n \n").unwrap();
        assert!(std::fs::read_to_string(&svg_path).unwrap().contains("no stacks"));
        svg(&svg_path, "t", b"main;leaf 3\n").unwrap();
        assert!(std::fs::read_to_string(&svg_path).unwrap().contains("<title>leaf (3 hits, 100.00%)</title>"));
        let pb = dir.join("x.pb.gz");
        assert!(write_pprof(&pb, b"\x0a\xff").unwrap_err().contains("the process sent no profile"));
        assert!(!pb.exists());
        write_pprof(&pb, &pprof::Profile::default().encode()).unwrap();
        assert_eq!(&std::fs::read(&pb).unwrap()[..2], [0x1f, 0x8b]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
