//! A program's DWARF, read once into what line places need: each compilation unit's line
//! table (sorted by address), its files as full paths, and its functions (with their
//! declared lines, address ranges and inlined calls). The DWARF comes from the program, or
//! from its separate debug file `/usr/lib/debug/.build-id/NN/REST.debug` found by build id
//! (with its `.gnu_debugaltlink` supplementary file for shared strings).
//!
//! The files are hostile input: every read is checked, a unit that does not parse is
//! skipped, nothing is trusted to be sorted or in range.

use std::borrow::Cow;
use std::fs;
use std::path::{Path, PathBuf};

use gimli::{AttributeValue, EndianSlice, LittleEndian};
use object::Object;

use crate::plan::debugfile;

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// `(file, line)`: the file as an index into [`Unit::files`].
pub type FileLine = (usize, u32);

/// One line-table row.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub addr: u64,
    pub file: usize,
    pub line: u32,
    /// `is_stmt`: a place the compiler marks as the start of a statement.
    pub stmt: bool,
}

/// A call inlined into a function.
#[derive(Clone, Debug)]
pub struct Inline {
    /// The inlined function's name.
    pub name: String,
    /// 1: directly in the function (perhaps inside lexical blocks); 2: inside another inline.
    pub depth: u32,
    /// `DW_AT_call_file` / `DW_AT_call_line`.
    pub call: Option<FileLine>,
    /// The inlined function's declaration.
    pub decl: Option<FileLine>,
    pub entry: Option<u64>,
    pub ranges: Vec<(u64, u64)>,
}

/// A function with code (a concrete `DW_TAG_subprogram`).
#[derive(Clone, Debug)]
pub struct Func {
    pub name: String,
    pub decl: Option<FileLine>,
    pub entry: u64,
    pub ranges: Vec<(u64, u64)>,
    /// In the order of the DIEs, outer calls before the calls inlined into them.
    pub inlines: Vec<Inline>,
}

impl Func {
    pub fn contains(&self, addr: u64) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= addr && addr < hi)
    }
}

/// One compilation unit.
#[derive(Debug, Default)]
pub struct Unit {
    /// Full paths (the comp dir joined where relative); indexes are this table's own.
    pub files: Vec<String>,
    /// Sorted by address, rows of one address in their table order; no end-of-sequence rows.
    pub rows: Vec<Row>,
    pub funcs: Vec<Func>,
    /// Every function defined here (name, declaration), with code or inlined only.
    pub defs: Vec<(String, FileLine)>,
}

/// The DWARF of a program.
#[derive(Debug)]
pub struct Debug {
    /// The file the DWARF was read from (the program, or its debug file).
    pub from: PathBuf,
    pub units: Vec<Unit>,
}

/// Why a program has no usable DWARF, in words for a refusal.
pub fn load(program: &Path) -> Result<Debug, String> {
    let data = fs::read(program).map_err(|e| format!("{}: cannot read: {e}", program.display()))?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: not an ELF file: {e}", program.display()))?;
    if file.section_by_name(".debug_info").is_some() {
        return parse(program, &file);
    }
    let Some(debug) = debugfile::separate(&file, program) else {
        return Err(format!(
            "{} has no DWARF (not built with -g) and no debug file (by build id or .gnu_debuglink)",
            program.display()
        ));
    };
    let debug_data = fs::read(&debug).map_err(|e| format!("{}: cannot read: {e}", debug.display()))?;
    let debug_file =
        object::File::parse(&*debug_data).map_err(|e| format!("{}: not an ELF file: {e}", debug.display()))?;
    if debug_file.section_by_name(".debug_info").is_none() {
        return Err(format!("{} has no DWARF, nor has its debug file {}", program.display(), debug.display()));
    }
    parse(&debug, &debug_file)
}

fn load_sections<'a>(file: &object::File<'a>) -> Result<gimli::DwarfSections<Cow<'a, [u8]>>, String> {
    gimli::DwarfSections::load(|id| debugfile::section(file, id.name()))
}

/// The supplementary file `.gnu_debugaltlink` names (dwz), when it exists.
fn alt_file(file: &object::File<'_>) -> Option<Vec<u8>> {
    let (path, _) = file.gnu_debugaltlink().ok().flatten()?;
    fs::read(Path::new(std::str::from_utf8(path).ok()?)).ok()
}

fn parse(from: &Path, file: &object::File<'_>) -> Result<Debug, String> {
    let sections = load_sections(file).map_err(|e| format!("{}: {e}", from.display()))?;
    let mut dwarf = sections.borrow(|s| EndianSlice::new(s, LittleEndian));
    let alt = alt_file(file);
    let alt_parsed = alt.as_deref().and_then(|d| object::File::parse(d).ok());
    let alt_sections = alt_parsed.as_ref().and_then(|f| load_sections(f).ok());
    if let Some(s) = &alt_sections {
        dwarf.set_sup(s.borrow(|s| EndianSlice::new(s, LittleEndian)));
    }
    // Pass 1: what each subprogram DIE says of itself, by its offset in .debug_info, so that
    // a concrete function whose DW_AT_abstract_origin lies in another unit (LTO) is named.
    let mut facts = Facts::new();
    let mut headers = dwarf.units();
    while let Ok(Some(header)) = headers.next() {
        let Ok(unit) = dwarf.unit(header) else { continue };
        let _ = collect(&dwarf, &unit, &mut facts);
    }
    facts.sort_unstable_by_key(|f| f.0);
    let mut units = Vec::new();
    let mut headers = dwarf.units();
    while let Ok(Some(header)) = headers.next() {
        let Ok(unit) = dwarf.unit(header) else { continue };
        if let Ok(u) = read_unit(&dwarf, &unit, &facts) {
            units.push(u);
        }
    }
    if units.iter().all(|u| u.rows.is_empty()) {
        return Err(format!("{} has DWARF but no line table", from.display()));
    }
    Ok(Debug { from: from.into(), units })
}

/// What a subprogram DIE says of itself: its name, declaration (file path, line), whether it
/// is only a declaration, and the DIE it refers to (abstract origin or specification).
#[derive(Clone, Debug, Default)]
struct Fact {
    name: Option<String>,
    decl_file: Option<String>,
    decl_line: Option<u32>,
    declaration: bool,
    next: Option<usize>,
}

/// Facts by `.debug_info` offset, sorted.
type Facts = Vec<(usize, Fact)>;

/// The `.debug_info` offset a reference attribute names.
fn global_ref(unit: &gimli::Unit<Slice<'_>>, v: Option<AttributeValue<Slice<'_>>>) -> Option<usize> {
    match v? {
        AttributeValue::UnitRef(off) => off.to_debug_info_offset(&unit.header).map(|o| o.0),
        AttributeValue::DebugInfoRef(off) => Some(off.0),
        _ => None,
    }
}

/// The full path of file `index` of a unit's line program.
fn file_path(dwarf: &gimli::Dwarf<Slice<'_>>, unit: &gimli::Unit<Slice<'_>>, index: u64) -> Option<String> {
    let header = unit.line_program.as_ref()?.header();
    let entry = header.file(index)?;
    let text = |v: Option<AttributeValue<Slice<'_>>>| -> String {
        v.and_then(|v| dwarf.attr_string(unit, v).ok()).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    };
    let comp_dir = unit.comp_dir.map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = text(entry.directory(header));
    let mut path = PathBuf::from(&comp_dir);
    // DWARF 5's directory 0 is the compilation directory itself: a relative one (glibc's
    // `./malloc`) is not joined to itself.
    if dir != comp_dir {
        path.push(dir);
    }
    path.push(text(Some(entry.path_name())));
    Some(clean(&path))
}

/// A path without `.` and `dir/..` parts (as `perf probe` shows them, and so that a file
/// named from two compilation directories, `/b/x/build/../Objects/a.c` and
/// `./build/../Objects/a.c`, ends the same).
fn clean(path: &Path) -> String {
    use std::path::Component;
    let mut parts: Vec<Component<'_>> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(parts.last(), Some(Component::Normal(_))) => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    parts.iter().collect::<PathBuf>().display().to_string()
}

fn fact_of(
    dwarf: &gimli::Dwarf<Slice<'_>>,
    unit: &gimli::Unit<Slice<'_>>,
    entry: &gimli::DebuggingInformationEntry<'_, '_, Slice<'_>>,
) -> gimli::Result<Fact> {
    let name = entry
        .attr_value(gimli::DW_AT_name)?
        .and_then(|v| dwarf.attr_string(unit, v).ok())
        .map(|s| s.to_string_lossy().into_owned());
    let decl_file = entry
        .attr_value(gimli::DW_AT_decl_file)?
        .and_then(|f| match f {
            AttributeValue::FileIndex(i) => Some(i),
            other => other.udata_value(),
        })
        .and_then(|i| file_path(dwarf, unit, i));
    let decl_line = entry.attr_value(gimli::DW_AT_decl_line)?.and_then(|v| u32::try_from(v.udata_value()?).ok());
    let declaration = matches!(entry.attr_value(gimli::DW_AT_declaration)?, Some(AttributeValue::Flag(true)));
    let next = global_ref(unit, entry.attr_value(gimli::DW_AT_abstract_origin)?)
        .or(global_ref(unit, entry.attr_value(gimli::DW_AT_specification)?));
    Ok(Fact { name, decl_file, decl_line, declaration, next })
}

fn collect(dwarf: &gimli::Dwarf<Slice<'_>>, unit: &gimli::Unit<Slice<'_>>, facts: &mut Facts) -> gimli::Result<()> {
    let mut entries = unit.entries();
    while let Some((_, entry)) = entries.next_dfs()? {
        if entry.tag() == gimli::DW_TAG_subprogram {
            if let Some(at) = entry.offset().to_debug_info_offset(&unit.header) {
                facts.push((at.0, fact_of(dwarf, unit, entry)?));
            }
        }
    }
    Ok(())
}

/// A DIE's name and declaration, completed through the DIEs it refers to.
fn resolved(mut fact: Fact, facts: &Facts) -> Fact {
    let mut next = fact.next;
    for _ in 0..4 {
        let Some(at) = next else { break };
        let Ok(i) = facts.binary_search_by_key(&at, |f| f.0) else { break };
        let other = &facts[i].1;
        fact.name = fact.name.or_else(|| other.name.clone());
        if fact.decl_file.is_none() || fact.decl_line.is_none() {
            fact.decl_file = fact.decl_file.or_else(|| other.decl_file.clone());
            fact.decl_line = fact.decl_line.or(other.decl_line);
        }
        next = other.next;
    }
    fact
}

/// The index of `path` in the unit's file table, added when new.
fn intern(out: &mut Unit, path: &str) -> usize {
    match out.files.iter().position(|f| f == path) {
        Some(i) => i,
        None => {
            out.files.push(path.to_string());
            out.files.len() - 1
        }
    }
}

fn read_unit(dwarf: &gimli::Dwarf<Slice<'_>>, unit: &gimli::Unit<Slice<'_>>, facts: &Facts) -> gimli::Result<Unit> {
    let mut out = Unit::default();
    let Some(program) = unit.line_program.clone() else { return Ok(out) };
    // The line program's file index -> our file table.
    let index_of = |out: &mut Unit, index: u64| Some(intern(out, &file_path(dwarf, unit, index)?));
    let mut rows = program.rows();
    let mut file_cache: Vec<(u64, usize)> = Vec::new();
    while let Some((_, row)) = rows.next_row()? {
        if row.end_sequence() {
            continue;
        }
        let Some(line) = row.line() else { continue };
        let index = row.file_index();
        let file = match file_cache.iter().find(|(i, _)| *i == index) {
            Some(&(_, f)) => f,
            None => {
                let Some(f) = index_of(&mut out, index) else { continue };
                file_cache.push((index, f));
                f
            }
        };
        let line = u32::try_from(line.get()).unwrap_or(u32::MAX);
        out.rows.push(Row { addr: row.address(), file, line, stmt: row.is_stmt() });
    }
    out.rows.sort_by_key(|r| r.addr);

    // The DIEs: functions, their declarations and their inlined calls.
    let mut entries = unit.entries();
    let mut depth: isize = 0;
    // The open function (its depth) and the open inlined calls' depths.
    let mut open: Option<(isize, Func)> = None;
    let mut inline_depths: Vec<isize> = Vec::new();
    while let Some((delta, entry)) = entries.next_dfs()? {
        depth += delta;
        inline_depths.retain(|&d| d < depth);
        if open.as_ref().is_some_and(|(d, _)| *d >= depth) {
            out.funcs.push(open.take().expect("checked").1);
        }
        let tag = entry.tag();
        if tag != gimli::DW_TAG_subprogram && tag != gimli::DW_TAG_inlined_subroutine {
            continue;
        }
        // Name and declaration, through DW_AT_abstract_origin / DW_AT_specification.
        let fact = resolved(fact_of(dwarf, unit, entry)?, facts);
        let decl = match (&fact.decl_file, fact.decl_line) {
            (Some(f), Some(l)) => Some((intern(&mut out, f), l)),
            _ => None,
        };
        let declaration = fact.declaration;
        let name = fact.name.clone();
        let mut ranges = Vec::new();
        if let Ok(mut iter) = dwarf.die_ranges(unit, entry) {
            while let Ok(Some(r)) = iter.next() {
                if r.begin < r.end {
                    ranges.push((r.begin, r.end));
                }
            }
        }
        // The first range, in the DIE's order (perf's die_entrypc): a function split into a hot
        // and a cold part starts at its hot part, which may lie above the cold one.
        let low = ranges.first().map(|r| r.0);
        let entry_pc = match entry.attr_value(gimli::DW_AT_entry_pc)? {
            Some(AttributeValue::Udata(off)) => low.map(|l| l.wrapping_add(off)),
            Some(v) => dwarf.attr_address(unit, v).ok().flatten(),
            None => None,
        }
        .or_else(|| {
            entry
                .attr_value(gimli::DW_AT_low_pc)
                .ok()
                .flatten()
                .and_then(|v| dwarf.attr_address(unit, v).ok().flatten())
        })
        .or(low);
        if tag == gimli::DW_TAG_subprogram {
            let name = name.unwrap_or_default();
            // perf's die_is_func_def: not a declaration, and inline (abstract) or with code.
            let inline = entry.attr_value(gimli::DW_AT_inline)?.is_some();
            if !declaration && !name.is_empty() && (inline || entry_pc.is_some()) {
                if let Some(d) = decl {
                    out.defs.push((name.clone(), d));
                }
            }
            if let (false, Some(entry)) = (ranges.is_empty(), entry_pc) {
                if let Some((_, f)) = open.take() {
                    out.funcs.push(f);
                }
                open = Some((depth, Func { name, decl, entry, ranges, inlines: Vec::new() }));
                inline_depths.clear();
            }
        } else if let Some((_, f)) = open.as_mut() {
            let call_file = entry.attr_value(gimli::DW_AT_call_file)?.and_then(|f| match f {
                AttributeValue::FileIndex(i) => Some(i),
                other => other.udata_value(),
            });
            let call_line =
                entry.attr_value(gimli::DW_AT_call_line)?.and_then(|v| u32::try_from(v.udata_value()?).ok());
            let call = match (call_file.and_then(|i| index_of(&mut out, i)), call_line) {
                (Some(f), Some(l)) => Some((f, l)),
                _ => None,
            };
            let nesting = inline_depths.len() as u32 + 1;
            inline_depths.push(depth);
            // `f` borrows `open`, not `out`: the file table was updated above.
            f.inlines.push(Inline {
                name: name.unwrap_or_default(),
                depth: nesting,
                call,
                decl,
                entry: entry_pc,
                ranges,
            });
        }
    }
    if let Some((_, f)) = open.take() {
        out.funcs.push(f);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn paths_lose_dots_as_perf_shows_them() {
        let clean = |p: &str| super::clean(std::path::Path::new(p));
        assert_eq!(clean("/b/py/build-static/../Objects/list.c"), "/b/py/Objects/list.c");
        assert_eq!(clean("./build-static/../Objects/list.c"), "Objects/list.c");
        assert_eq!(clean("/src/./a/b.c"), "/src/a/b.c");
        assert_eq!(clean("../x.c"), "../x.c");
    }
}
