//! The units of a module's `.debug_info`, each parsed once when first read, and the DIE a
//! reference attribute names in whichever unit holds it. A link-time optimized build
//! (`-flto`) refers from the unit of its generated code to the DIEs of the units it was
//! compiled from (`DW_FORM_ref_addr`); such a DIE is read in its own unit, with that unit's
//! abbreviations, string offsets and encoding.

use std::cell::OnceCell;

use gimli::{AttributeValue, EndianSlice, LittleEndian, UnitOffset};

type R<'a> = EndianSlice<'a, LittleEndian>;

pub type Unit<'a> = gimli::Unit<R<'a>>;

pub struct Units<'a> {
    pub dwarf: gimli::Dwarf<R<'a>>,
    /// In `.debug_info` order.
    headers: Vec<gimli::UnitHeader<R<'a>>>,
    parsed: Vec<OnceCell<Option<Unit<'a>>>>,
}

/// Where a unit starts in `.debug_info`.
fn start(header: &gimli::UnitHeader<R<'_>>) -> usize {
    header.offset().as_debug_info_offset().map_or(0, |o| o.0)
}

/// A DIE's offset in `.debug_info`, one key for a DIE of any unit (kept as a `UnitOffset`,
/// the type the type table's references have).
pub fn global(unit: &Unit<'_>, at: UnitOffset) -> UnitOffset {
    UnitOffset(start(&unit.header) + at.0)
}

impl<'a> Units<'a> {
    pub fn new(dwarf: gimli::Dwarf<R<'a>>) -> Result<Units<'a>, String> {
        let mut headers = Vec::new();
        let mut it = dwarf.units();
        while let Some(h) = it.next().map_err(|e| e.to_string())? {
            headers.push(h);
        }
        headers.sort_by_key(start);
        let parsed = headers.iter().map(|_| OnceCell::new()).collect();
        Ok(Units { dwarf, headers, parsed })
    }

    fn get(&self, i: usize) -> Option<&Unit<'a>> {
        self.parsed[i].get_or_init(|| self.dwarf.unit(self.headers[i]).ok()).as_ref()
    }

    /// The units that parse, in `.debug_info` order.
    pub fn iter(&self) -> impl Iterator<Item = &Unit<'a>> {
        (0..self.headers.len()).filter_map(|i| self.get(i))
    }

    /// The unit that holds `.debug_info` offset `at`, and the offset in it.
    pub fn holding(&self, at: usize) -> Option<(&Unit<'a>, UnitOffset)> {
        let i = self.headers.partition_point(|h| start(h) <= at).checked_sub(1)?;
        let unit = self.get(i)?;
        Some((unit, gimli::DebugInfoOffset(at).to_unit_offset(&unit.header)?))
    }

    /// The unit and offset of the DIE that reference `v`, read in `unit`, names.
    pub fn die<'s>(&'s self, unit: &'s Unit<'a>, v: AttributeValue<R<'a>>) -> Option<(&'s Unit<'a>, UnitOffset)> {
        match v {
            AttributeValue::UnitRef(o) => Some((unit, o)),
            AttributeValue::DebugInfoRef(o) => self.holding(o.0),
            _ => None,
        }
    }
}
