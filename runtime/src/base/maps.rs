//! The process's address space as `/proc/self/maps` describes it (lines parsed by
//! `uprobe_contracts::maps`).

pub use uprobe_contracts::maps::{parse, Mapping};

/// The `PROT_*` bits of a mapping.
pub fn prot(m: &Mapping) -> i32 {
    let mut prot = 0;
    if m.read {
        prot |= libc::PROT_READ;
    }
    if m.write {
        prot |= libc::PROT_WRITE;
    }
    if m.exec {
        prot |= libc::PROT_EXEC;
    }
    prot
}

/// Reads this process's mappings (raw system calls; counted in the stats).
pub fn current() -> Vec<Mapping> {
    crate::base::stats::MAPS_READS.add(1);
    crate::base::sys::read_file(c"/proc/self/maps").map(|t| parse(&String::from_utf8_lossy(&t))).unwrap_or_default()
}

/// The mapping holding `addr`.
pub fn find(maps: &[Mapping], addr: usize) -> Option<&Mapping> {
    maps.iter().find(|m| m.contains(addr as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protections_follow_the_permissions() {
        let maps = parse("1000-2000 r-xp 00001000 fe:01 1234 /p\n3000-4000 rw-p 00000000 00:00 0 \n");
        assert_eq!(prot(&maps[0]), libc::PROT_READ | libc::PROT_EXEC);
        assert_eq!(prot(&maps[1]), libc::PROT_READ | libc::PROT_WRITE);
        assert_eq!(find(&maps, 0x1800).unwrap().offset, 0x1000);
        assert!(find(&maps, 0x2000).is_none());
    }
}
