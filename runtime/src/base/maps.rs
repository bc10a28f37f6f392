//! The process's address space as `/proc/self/maps` describes it.

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: usize,
    pub end: usize,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub offset: usize,
    pub inode: u64,
    /// The file path, a pseudo name like `[vdso]`, or empty for anonymous memory.
    pub path: String,
}

impl Mapping {
    pub fn contains(&self, addr: usize) -> bool {
        self.start <= addr && addr < self.end
    }

    /// The `PROT_*` bits of this mapping.
    pub fn prot(&self) -> i32 {
        let mut prot = 0;
        if self.read {
            prot |= libc::PROT_READ;
        }
        if self.write {
            prot |= libc::PROT_WRITE;
        }
        if self.exec {
            prot |= libc::PROT_EXEC;
        }
        prot
    }

    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }
}

/// Parses the text of a maps file; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?.as_bytes();
    let offset = usize::from_str_radix(fields.next()?, 16).ok()?;
    let _dev = fields.next()?;
    let inode = fields.next()?.parse().ok()?;
    let path = fields.next().unwrap_or("").trim_start().to_string();
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        read: perms.first() == Some(&b'r'),
        write: perms.get(1) == Some(&b'w'),
        exec: perms.get(2) == Some(&b'x'),
        offset,
        inode,
        path,
    })
}

/// Reads this process's mappings (raw system calls; counted in the stats).
pub fn current() -> Vec<Mapping> {
    crate::base::stats::MAPS_READS.add(1);
    crate::base::sys::read_file(c"/proc/self/maps").map(|t| parse(&String::from_utf8_lossy(&t))).unwrap_or_default()
}

/// The mapping holding `addr`.
pub fn find(maps: &[Mapping], addr: usize) -> Option<&Mapping> {
    maps.iter().find(|m| m.contains(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234    /tmp/my prog
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:01 1234    /tmp/my prog
7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0 
7ffd1b5f0000-7ffd1b5f2000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn parses_paths_with_spaces_and_anonymous_lines() {
        let maps = parse(SAMPLE);
        assert_eq!(maps.len(), 4);
        assert_eq!(maps[1].path, "/tmp/my prog");
        assert!(maps[1].exec && !maps[1].write);
        assert_eq!(maps[1].offset, 0x1000);
        assert_eq!(maps[1].prot(), libc::PROT_READ | libc::PROT_EXEC);
        assert!(maps[1].is_file());
        assert_eq!(maps[2].path, "");
        assert_eq!(maps[3].path, "[vdso]");
        assert!(!maps[3].is_file());
        assert_eq!(find(&maps, 0x55d0c0a01800).unwrap().offset, 0x1000);
        assert!(find(&maps, 0x10).is_none());
    }
}
