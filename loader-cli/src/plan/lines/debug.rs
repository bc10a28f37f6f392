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
use std::io::Read;
use std::path::{Path, PathBuf};

use gimli::{AttributeValue, EndianSlice, LittleEndian};
use object::{Object, ObjectSection};

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
    pub comp_dir: String,
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
    let build_id = file.build_id().ok().flatten().filter(|id| id.len() >= 2);
    let Some(id) = build_id else {
        return Err(format!(
            "{} has no DWARF (not built with -g) and no build id to find a debug file by",
            program.display()
        ));
    };
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let debug = PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]));
    let Ok(debug_data) = fs::read(&debug) else {
        return Err(format!(
            "{} has no DWARF (not built with -g) and no debug file {}",
            program.display(),
            debug.display()
        ));
    };
    let debug_file =
        object::File::parse(&*debug_data).map_err(|e| format!("{}: not an ELF file: {e}", debug.display()))?;
    if debug_file.section_by_name(".debug_info").is_none() {
        return Err(format!("{} has no DWARF, nor has its debug file {}", program.display(), debug.display()));
    }
    parse(&debug, &debug_file)
}

/// A section's bytes, inflated when compressed (`SHF_COMPRESSED` with zlib).
fn section<'a>(file: &object::File<'a>, name: &str) -> Result<Cow<'a, [u8]>, String> {
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

fn load_sections<'a>(file: &object::File<'a>) -> Result<gimli::DwarfSections<Cow<'a, [u8]>>, String> {
    gimli::DwarfSections::load(|id| section(file, id.name()))
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
    let mut units = Vec::new();
    let mut headers = dwarf.units();
    while let Ok(Some(header)) = headers.next() {
        let Ok(unit) = dwarf.unit(header) else { continue };
        if let Ok(u) = read_unit(&dwarf, &unit) {
            units.push(u);
        }
    }
    if units.iter().all(|u| u.rows.is_empty()) {
        return Err(format!("{} has DWARF but no line table", from.display()));
    }
    Ok(Debug { from: from.into(), units })
}

fn read_unit(dwarf: &gimli::Dwarf<Slice<'_>>, unit: &gimli::Unit<Slice<'_>>) -> gimli::Result<Unit> {
    let text = |v: Option<AttributeValue<Slice<'_>>>| -> String {
        v.and_then(|v| dwarf.attr_string(unit, v).ok()).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    };
    let mut out = Unit {
        comp_dir: unit.comp_dir.map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
        ..Unit::default()
    };
    let Some(program) = unit.line_program.clone() else { return Ok(out) };
    // The line program's file index -> our file table.
    let header = program.header().clone();
    let index_of = |out: &mut Unit, index: u64| -> Option<usize> {
        let entry = header.file(index)?;
        let name = text(Some(entry.path_name()));
        let dir = text(entry.directory(&header));
        let mut path = PathBuf::from(&out.comp_dir);
        path.push(dir);
        path.push(name);
        let path = path.display().to_string();
        Some(match out.files.iter().position(|f| *f == path) {
            Some(i) => i,
            None => {
                out.files.push(path);
                out.files.len() - 1
            }
        })
    };
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
        let (mut name, mut decl_file, mut decl_line) = (None, None, None);
        let mut declaration = false;
        let mut die = Some(entry.clone());
        for _ in 0..4 {
            let Some(d) = die.take() else { break };
            name = name.or(d.attr_value(gimli::DW_AT_name)?);
            decl_file = decl_file.or(d.attr_value(gimli::DW_AT_decl_file)?);
            decl_line = decl_line.or(d.attr_value(gimli::DW_AT_decl_line)?);
            if d.offset() == entry.offset() {
                declaration = matches!(d.attr_value(gimli::DW_AT_declaration)?, Some(AttributeValue::Flag(true)));
            }
            let next = d.attr_value(gimli::DW_AT_abstract_origin)?.or(d.attr_value(gimli::DW_AT_specification)?);
            if let Some(AttributeValue::UnitRef(off)) = next {
                die = unit.entry(off).ok();
            }
        }
        let file_line =
            |out: &mut Unit, file: Option<AttributeValue<Slice<'_>>>, line: Option<AttributeValue<Slice<'_>>>| {
                let file = file.and_then(|f| match f {
                    AttributeValue::FileIndex(i) => Some(i),
                    other => other.udata_value(),
                })?;
                let line = u32::try_from(line?.udata_value()?).ok()?;
                Some((index_of(out, file)?, line))
            };
        let decl = file_line(&mut out, decl_file, decl_line);
        let mut ranges = Vec::new();
        if let Ok(mut iter) = dwarf.die_ranges(unit, entry) {
            while let Ok(Some(r)) = iter.next() {
                if r.begin < r.end {
                    ranges.push((r.begin, r.end));
                }
            }
        }
        let low = ranges.iter().map(|r| r.0).min();
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
            let name = text(name);
            if !declaration && !name.is_empty() {
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
            let call = file_line(
                &mut out,
                entry.attr_value(gimli::DW_AT_call_file)?,
                entry.attr_value(gimli::DW_AT_call_line)?,
            );
            let nesting = inline_depths.len() as u32 + 1;
            inline_depths.push(depth);
            // `f` borrows `open`, not `out`: the file table was updated above.
            f.inlines.push(Inline { depth: nesting, call, decl, entry: entry_pc, ranges });
        }
    }
    if let Some((_, f)) = open.take() {
        out.funcs.push(f);
    }
    Ok(out)
}
