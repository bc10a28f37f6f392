//! Walking a function's DIEs: its entry, its name and type (through abstract origins, across
//! units), the variables in scope at an address and their location expressions, and the
//! names nearest a misspelt one.

use gimli::{EndianSlice, LittleEndian, Operation, UnitOffset};

use super::units::{global, Unit, Units};

type R<'a> = EndianSlice<'a, LittleEndian>;

pub(super) fn ops<'a>(e: &gimli::Expression<R<'a>>, enc: gimli::Encoding) -> Vec<Operation<R<'a>>> {
    let mut out = Vec::new();
    let mut it = (*e).operations(enc);
    while let Ok(Some(op)) = it.next() {
        out.push(op);
    }
    out
}

fn low_pc(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    e: &gimli::DebuggingInformationEntry<R<'_>>,
) -> Option<u64> {
    if e.attr_value(gimli::DW_AT_declaration).ok().flatten().is_some() {
        return None;
    }
    dwarf.attr_address(unit, e.attr_value(gimli::DW_AT_low_pc).ok().flatten()?).ok().flatten()
}

/// Where a function's code starts: its low_pc, or the first of its ranges where its code is
/// split (gcc's hot and `.cold` parts have `DW_AT_ranges` and no low_pc).
pub(super) fn entry_pc(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    e: &gimli::DebuggingInformationEntry<R<'_>>,
) -> Option<u64> {
    if let Some(pc) = low_pc(dwarf, unit, e) {
        return Some(pc);
    }
    if e.attr_value(gimli::DW_AT_declaration).ok().flatten().is_some() {
        return None;
    }
    let mut ranges = dwarf.die_ranges(unit, e).ok()?;
    ranges.next().ok().flatten().map(|r| r.begin)
}

/// The DIE a DIE takes its name and type from (its abstract origin or specification), in
/// whichever unit holds it: link-time optimization refers to the units compiled from.
fn abstract_origin<'s, 'a>(
    units: &'s Units<'a>,
    unit: &'s Unit<'a>,
    e: &gimli::DebuggingInformationEntry<R<'a>>,
) -> Option<(&'s Unit<'a>, UnitOffset)> {
    for at in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
        if let Ok(Some(v)) = e.attr_value(at) {
            return units.die(unit, v);
        }
    }
    None
}

/// A DIE's name, its own or its abstract origin's.
pub(super) fn name<'a>(
    units: &Units<'a>,
    unit: &Unit<'a>,
    e: &gimli::DebuggingInformationEntry<R<'a>>,
) -> Option<String> {
    let text = |unit: &Unit<'a>, v| units.dwarf.attr_string(unit, v).ok().map(|s| s.to_string_lossy().into_owned());
    if let Ok(Some(v)) = e.attr_value(gimli::DW_AT_name) {
        return text(unit, v);
    }
    let (mut unit, mut at) = abstract_origin(units, unit, e)?;
    for _ in 0..4 {
        let e = unit.entry(at).ok()?;
        if let Ok(Some(v)) = e.attr_value(gimli::DW_AT_name) {
            return text(unit, v);
        }
        (unit, at) = abstract_origin(units, unit, &e)?;
    }
    None
}

/// The type of the DIE at `at`, its own or its abstract origin's, by its `.debug_info` offset.
pub(super) fn type_of<'a>(units: &Units<'a>, unit: &Unit<'a>, at: UnitOffset) -> Option<UnitOffset> {
    let (mut unit, mut at) = (unit, at);
    for _ in 0..4 {
        let e = unit.entry(at).ok()?;
        if let Ok(Some(v)) = e.attr_value(gimli::DW_AT_type) {
            let (u, o) = units.die(unit, v)?;
            return Some(global(u, o));
        }
        (unit, at) = abstract_origin(units, unit, &e)?;
    }
    None
}

type Found<'a> = (String, bool, Option<UnitOffset>, Option<gimli::AttributeValue<R<'a>>>, Option<u64>);

/// The parameters and the variables in scope at `pc` under `node`, outer first: the lexical
/// blocks and the inlined calls that cover it (as `perf probe` walks them), so an inner
/// variable that shadows an outer one comes after it.
pub(super) fn collect<'a>(
    units: &Units<'a>,
    unit: &Unit<'a>,
    node: gimli::EntriesTreeNode<'_, '_, '_, R<'a>>,
    pc: u64,
    out: &mut Vec<Found<'a>>,
) -> Result<(), String> {
    let mut children = node.children();
    while let Some(child) = children.next().map_err(|e| e.to_string())? {
        let e = child.entry();
        match e.tag() {
            gimli::DW_TAG_formal_parameter | gimli::DW_TAG_variable => {
                let Some(n) = name(units, unit, e) else { continue };
                let ty = type_of(units, unit, e.offset());
                let loc = e.attr_value(gimli::DW_AT_location).ok().flatten();
                let konst = match e.attr_value(gimli::DW_AT_const_value).ok().flatten() {
                    Some(gimli::AttributeValue::Sdata(v)) => Some(v as u64),
                    Some(v) => v.udata_value(),
                    None => None,
                };
                out.push((n, e.tag() == gimli::DW_TAG_formal_parameter, ty, loc, konst));
            }
            gimli::DW_TAG_lexical_block | gimli::DW_TAG_inlined_subroutine => {
                let mut ranges = units.dwarf.die_ranges(unit, e).map_err(|e| e.to_string())?;
                let mut inside = false;
                while let Ok(Some(r)) = ranges.next() {
                    inside |= r.begin <= pc && pc < r.end;
                }
                if inside {
                    collect(units, unit, child, pc, out)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The location expression of a variable at `pc`: None when no entry of its list covers it.
pub(super) fn expression_at<'a>(
    dwarf: &gimli::Dwarf<R<'a>>,
    unit: &gimli::Unit<R<'a>>,
    attr: gimli::AttributeValue<R<'a>>,
    pc: u64,
) -> Result<Option<gimli::Expression<R<'a>>>, String> {
    if let gimli::AttributeValue::Exprloc(e) = attr {
        return Ok(Some(e));
    }
    let Some(offset) = dwarf.attr_locations_offset(unit, attr).map_err(|e| e.to_string())? else {
        return Err("its location has a form this version does not read".into());
    };
    let mut list = dwarf.locations(unit, offset).map_err(|e| e.to_string())?;
    while let Some(entry) = list.next().map_err(|e| e.to_string())? {
        if entry.range.begin <= pc && pc < entry.range.end {
            return Ok(Some(entry.data));
        }
    }
    Ok(None)
}

/// `(NAMES it has: a, b)`, the likeliest first.
pub(super) fn closest(wanted: &str, have: &[String], what: &str) -> String {
    if have.is_empty() {
        return format!(" (it has no {what})");
    }
    let mut ranked: Vec<&String> = have.iter().collect();
    let common = |s: &str| s.bytes().zip(wanted.bytes()).take_while(|(a, b)| a == b).count();
    ranked.sort_by_key(|s| std::cmp::Reverse(common(s)));
    let list: Vec<&str> = ranked.iter().take(10).map(|s| s.as_str()).collect();
    let more = if have.len() > 10 { ", ..." } else { "" };
    format!(" ({what}: {}{more})", list.join(", "))
}
