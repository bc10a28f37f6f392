//! Function extents from call-frame information: the code range of every FDE in an ELF
//! file's `.eh_frame`. A stripped library keeps no symbol for its private functions (glibc's
//! IFUNC implementations, `__strlen_avx2` and the like), but the unwinder needs each one's
//! range, so the FDE still says where the function starts and ends. Pure: bytes in, ranges
//! out (read with `gimli`).

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
use object::{Object, ObjectSection};

/// `(start, end)` link-time ranges of the FDEs of ELF file `data`, sorted by start; empty
/// where the file has no readable `.eh_frame`.
pub fn fde_ranges(data: &[u8]) -> Vec<(u64, u64)> {
    let Ok(file) = object::File::parse(data) else { return Vec::new() };
    let Some(section) = file.section_by_name(".eh_frame") else { return Vec::new() };
    let Ok(bytes) = section.data() else { return Vec::new() };
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    ranges(bytes, &bases)
}

/// The FDE ranges of an `.eh_frame` section's bytes.
fn ranges(bytes: &[u8], bases: &BaseAddresses) -> Vec<(u64, u64)> {
    let eh_frame = EhFrame::new(bytes, LittleEndian);
    let mut entries = eh_frame.entries(bases);
    let mut out = Vec::new();
    // A malformed entry ends the walk: what was read before it stands.
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(|section, bases, offset| section.cie_from_offset(bases, offset)) else { continue };
        let (start, len) = (fde.initial_address(), fde.len());
        if len > 0 {
            out.push((start, start.saturating_add(len)));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The range of `ranges` (sorted, from [`fde_ranges`]) that holds `vaddr`.
pub fn containing(ranges: &[(u64, u64)], vaddr: u64) -> Option<(u64, u64)> {
    let i = ranges.partition_point(|&(start, _)| start <= vaddr);
    ranges[..i].iter().rev().take(4).find(|&&(start, end)| start <= vaddr && vaddr < end).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CIE (augmentation "zR", pointers pc-relative sdata4) and two FDEs, as a compiler
    /// writes them, at section address 0x1000.
    fn section() -> Vec<u8> {
        let mut s = Vec::new();
        // CIE: length, id 0, version 1, "zR\0", code align 1, data align -8, RA reg 16,
        // augmentation data length 1, encoding 0x1b, then padding instructions (nop).
        let cie: [u8; 20] = [16, 0, 0, 0, 0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b, 0, 0, 0];
        s.extend_from_slice(&cie);
        let fde = |s: &mut Vec<u8>, start: u64, len: u32| {
            let at = s.len() as u64;
            s.extend_from_slice(&20u32.to_le_bytes());
            s.extend_from_slice(&((at + 4) as u32).to_le_bytes()); // back to the CIE at 0
            let field = 0x1000 + s.len() as u64;
            s.extend_from_slice(&(start.wrapping_sub(field) as u32).to_le_bytes());
            s.extend_from_slice(&len.to_le_bytes());
            s.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]); // no augmentation data, nops
        };
        fde(&mut s, 0x2040, 0x80);
        fde(&mut s, 0x2000, 0x30);
        s.extend_from_slice(&[0, 0, 0, 0]); // terminator
        s
    }

    #[test]
    fn every_fde_gives_its_range_sorted() {
        let bases = BaseAddresses::default().set_eh_frame(0x1000);
        let ranges = ranges(&section(), &bases);
        assert_eq!(ranges, [(0x2000, 0x2030), (0x2040, 0x20c0)]);
        assert_eq!(containing(&ranges, 0x2000), Some((0x2000, 0x2030)));
        assert_eq!(containing(&ranges, 0x20bf), Some((0x2040, 0x20c0)));
        assert_eq!(containing(&ranges, 0x2030), None);
        assert_eq!(containing(&ranges, 0x1fff), None);
    }

    #[test]
    fn this_test_binarys_own_functions_have_ranges() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let ranges = fde_ranges(&exe);
        assert!(ranges.len() > 100, "{} FDEs", ranges.len());
        assert!(ranges.iter().all(|&(s, e)| s < e));
    }
}
