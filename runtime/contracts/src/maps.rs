//! Lines of `/proc/PID/maps`, read by the runtime about its own process and by `uprobe-run`
//! about a process it attaches to. Pure: the caller reads the file.

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `r` in the permissions.
    pub read: bool,
    /// `w` in the permissions.
    pub write: bool,
    /// `x` in the permissions.
    pub exec: bool,
    /// `s` (shared) rather than `p` (private).
    pub shared: bool,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// The device of the file, `(major, minor)`.
    pub dev: (u32, u32),
    /// The inode of the file; 0 for anonymous memory.
    pub inode: u64,
    /// The file path (` (deleted)` included when the kernel adds it), a pseudo name like
    /// `[vdso]`, or empty for anonymous memory.
    pub path: String,
}

impl Mapping {
    /// Whether `addr` lies inside.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// Whether a file is mapped (not anonymous memory, not a pseudo mapping).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }

    /// The path's last component.
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

/// The mappings of a maps file's text; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

/// One line: `START-END PERMS OFFSET MAJOR:MINOR INODE [PATH]`, or None if it is not one.
pub fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let (start, end) = (hex(start)?, hex(end)?);
    let perms = fields.next()?.as_bytes();
    let offset = hex(fields.next()?)?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let dev = (u32::try_from(hex(major)?).ok()?, u32::try_from(hex(minor)?).ok()?);
    let inode = fields.next()?;
    if inode.is_empty() || !inode.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let flag = |i: usize, set: u8| match perms.get(i) {
        Some(&b) if b == set => Some(true),
        Some(b'-') => Some(false),
        _ => None,
    };
    let shared = match perms.get(3) {
        Some(b's') => true,
        Some(b'p') => false,
        _ => return None,
    };
    if perms.len() != 4 || start > end {
        return None;
    }
    Some(Mapping {
        start,
        end,
        read: flag(0, b'r')?,
        write: flag(1, b'w')?,
        exec: flag(2, b'x')?,
        shared,
        offset,
        dev,
        inode: inode.parse().ok()?,
        path: fields.next().unwrap_or("").trim_start_matches(' ').to_owned(),
    })
}

/// A hex number as the maps file writes them (no sign, no prefix).
fn hex(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testgen::{cuts, Rng};

    const SAMPLE: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234    /tmp/my prog
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:01 1234    /tmp/my prog
7f1e2c000000-7f1e2c021000 rw-s 00000000 00:00 0 
7ffd1b5f0000-7ffd1b5f2000 r-xp 00000000 00:00 0                          [vdso]
7f12a000-7f12b000 r-xp 00001000 08:01 1234   /memfd:libuprobe.so (deleted)
";

    #[test]
    fn parses_paths_with_spaces_and_anonymous_lines() {
        let maps = parse(SAMPLE);
        assert_eq!(maps.len(), 5);
        assert_eq!(maps[1].path, "/tmp/my prog");
        assert_eq!(maps[1].file_name(), "my prog");
        assert!(maps[1].read && maps[1].exec && !maps[1].write && !maps[1].shared);
        assert_eq!((maps[1].start, maps[1].end, maps[1].offset), (0x55d0c0a01000, 0x55d0c0a02000, 0x1000));
        assert_eq!((maps[1].dev, maps[1].inode), ((0xfe, 1), 1234));
        assert!(maps[1].is_file() && maps[1].contains(0x55d0c0a01800) && !maps[1].contains(0x55d0c0a02000));
        assert_eq!(maps[2].path, "");
        assert!(maps[2].shared && maps[2].write && !maps[2].is_file());
        assert_eq!(maps[3].path, "[vdso]");
        assert!(!maps[3].is_file());
        assert_eq!(maps[4].path, "/memfd:libuprobe.so (deleted)");
        assert_eq!(maps[4].dev, (8, 1));
    }

    #[test]
    fn malformed_lines_are_skipped() {
        for line in [
            "",
            "55d0c0a00000 r--p 00000000 fe:01 1234 /a",
            "55d0c0a01000-55d0c0a00000 r--p 00000000 fe:01 1234 /a",
            "55d0c0a00000-55d0c0a01000 r--q 00000000 fe:01 1234 /a",
            "55d0c0a00000-55d0c0a01000 r-- 00000000 fe:01 1234 /a",
            "55d0c0a00000-55d0c0a01000 rx-p 00000000 fe:01 1234 /a",
            "55d0c0a00000-55d0c0a01000 r--p +0000000 fe:01 1234 /a",
            "55d0c0a00000-55d0c0a01000 r--p 00000000 fe01 1234 /a",
            "55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 -1234 /a",
            "55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01",
            "1ffffffffffffffff-2ffffffffffffffff r--p 00000000 fe:01 1 /a",
        ] {
            assert_eq!(parse_line(line), None, "{line:?}");
        }
    }

    /// Cut short or changed anywhere, a line is read or skipped, never a panic. (A line cut
    /// inside a number reads as a smaller number: the file is read whole, so lines are not cut.)
    #[test]
    fn cut_or_changed_lines_never_panic() {
        let mut rng = Rng::new(7);
        for line in SAMPLE.lines() {
            for cut in cuts(line) {
                let _ = parse_line(cut);
            }
            for _ in 0..2000 {
                let _ = parse_line(&rng.changed(line));
            }
        }
    }
}
