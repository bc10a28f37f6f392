//! Source places of code addresses (`file.c:42`), from a module's DWARF line tables: the
//! module file's own `.debug_*` sections, or a separate debug file found by the module's
//! build ID under `/usr/lib/debug/.build-id/xx/yyyy.debug` (Debian's `*-dbg` and `*-dbgsym`
//! packages). zlib-compressed sections (`SHF_COMPRESSED`, as Debian ships them) are
//! inflated.
//!
//! One piece for whoever names frames after the fact (the runtime's reports, uprobe-run):
//! an address comes as the module's path and the file offset of the code (the
//! `FILE+OFFSET` form tracefs takes), and files are read through the caller's function (the
//! crate makes no system call). Modules are kept, tables made, per path: at most
//! [`Lines::new`]'s number of modules at a time (the least recently used is dropped), and a
//! file over [`MAX_FILE`] bytes is not read. Bad input (not ELF, corrupt DWARF, a debug file
//! of another build) gives no place, never a panic.

use std::io::Read;
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

/// The largest file (module or debug file) read for its line tables.
pub const MAX_FILE: usize = 512 << 20;

/// Where the debug files of distribution packages are, by build ID.
pub const DEBUG_DIR: &str = "/usr/lib/debug";

type Reader = gimli::EndianArcSlice<gimli::RunTimeEndian>;

/// A source place: the file as the compiler recorded it (joined with its compilation
/// directory) and the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    /// The source file's path.
    pub file: String,
    /// The line, from 1.
    pub line: u32,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// A file's bytes, as the caller holds them (read, or mapped).
pub type Bytes = Box<dyn AsRef<[u8]>>;

/// One module: its loadable segments (file offset to address) and its line tables, if any.
struct Module {
    path: String,
    id: u64,
    /// (file offset, file size, address) of each PT_LOAD segment.
    segments: Vec<(u64, u64, u64)>,
    /// (address, size, name) of each function symbol, by address.
    symbols: Vec<(u64, u64, String)>,
    context: Option<addr2line::Context<Reader>>,
    /// The module's build ID (empty: none).
    build_id: Vec<u8>,
}

/// The modules read so far, most recently used last.
pub struct Lines {
    modules: Vec<Module>,
    max: usize,
}

impl Lines {
    /// Keeps the tables of at most `max` modules (at least 1).
    pub fn new(max: usize) -> Lines {
        Lines { modules: Vec::new(), max: max.max(1) }
    }

    /// The source place of the code at file offset `offset` of the module at `path`, `id`
    /// telling apart files that had the same path (e.g. an inode); `read` gives a file's
    /// bytes (None: not there, or not to be trusted, e.g. a module whose file was replaced
    /// since it was loaded).
    pub fn place(
        &mut self,
        path: &str,
        id: u64,
        offset: u64,
        read: &mut dyn FnMut(&str) -> Option<Bytes>,
    ) -> Option<Place> {
        let m = self.module(path, id, read);
        let loc = m.context.as_ref()?.find_location(m.address(offset)?).ok()??;
        Some(Place { file: loc.file?.to_string(), line: loc.line.filter(|&l| l != 0)? })
    }

    /// The function symbol around file offset `offset` of the module at `path` and the
    /// offset into it, from the symbol table of the module or of its debug file: a name for
    /// a function the loaded module does not export (as [`Lines::place`]).
    pub fn symbol(
        &mut self,
        path: &str,
        id: u64,
        offset: u64,
        read: &mut dyn FnMut(&str) -> Option<Bytes>,
    ) -> Option<(String, u64)> {
        let m = self.module(path, id, read);
        let addr = m.address(offset)?;
        let i = m.symbols.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (start, size, name) = &m.symbols[i];
        (*size == 0 || addr - start < *size).then(|| (name.clone(), addr - start))
    }

    /// The build ID of the module at `path` (as [`Lines::place`]), empty if it has none.
    pub fn build_id(&mut self, path: &str, id: u64, read: &mut dyn FnMut(&str) -> Option<Bytes>) -> Vec<u8> {
        self.module(path, id, read).build_id.clone()
    }

    /// The module at `path`, read now if it is not kept.
    fn module(&mut self, path: &str, id: u64, read: &mut dyn FnMut(&str) -> Option<Bytes>) -> &Module {
        match self.modules.iter().position(|m| m.path == path && m.id == id) {
            Some(i) => {
                let m = self.modules.remove(i);
                self.modules.push(m);
            }
            None => {
                if self.modules.len() >= self.max {
                    self.modules.remove(0);
                }
                self.modules.push(load(path, id, read));
            }
        }
        &self.modules[self.modules.len() - 1]
    }
}

impl Module {
    /// The link-time address of file offset `offset`.
    fn address(&self, offset: u64) -> Option<u64> {
        let &(file_off, _, addr) = self.segments.iter().find(|&&(o, len, _)| o <= offset && offset - o < len)?;
        addr.checked_add(offset - file_off)
    }
}

/// The module at `path`, with the line tables and symbols of its own file or of its debug
/// file.
fn load(path: &str, id: u64, read: &mut dyn FnMut(&str) -> Option<Bytes>) -> Module {
    let mut m = Module {
        path: path.to_string(),
        id,
        segments: Vec::new(),
        symbols: Vec::new(),
        context: None,
        build_id: Vec::new(),
    };
    let Some(data) = read(path).filter(|d| (**d).as_ref().len() <= MAX_FILE) else { return m };
    let Ok(obj) = object::File::parse((*data).as_ref()) else { return m };
    m.segments = obj
        .segments()
        .map(|s| {
            let (off, len) = s.file_range();
            (off, len, s.address())
        })
        .collect();
    m.symbols = symbols(&obj);
    m.build_id = obj.build_id().ok().flatten().map(<[u8]>::to_vec).unwrap_or_default();
    if obj.section_by_name(".debug_line").is_some() {
        m.context = context(&obj);
    }
    if m.context.is_some() && obj.section_by_name(".symtab").is_some() {
        return m;
    }
    let Some(id) = obj.build_id().ok().flatten().filter(|id| id.len() >= 2) else { return m };
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let debug = format!("{DEBUG_DIR}/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
    let Some(data) = read(&debug).filter(|d| (**d).as_ref().len() <= MAX_FILE) else { return m };
    let Ok(dobj) = object::File::parse((*data).as_ref()) else { return m };
    // A debug file of another build would give wrong names and lines.
    if dobj.build_id().ok().flatten() != Some(id) {
        return m;
    }
    if m.context.is_none() {
        m.context = context(&dobj);
    }
    if obj.section_by_name(".symtab").is_none() {
        m.symbols = symbols(&dobj);
    }
    m
}

/// The defined function symbols of `obj` (its symbol table, else its dynamic symbols),
/// sorted by address: (address, size, name).
fn symbols(obj: &object::File<'_>) -> Vec<(u64, u64, String)> {
    let mut all: Vec<(u64, u64, String)> = obj
        .symbols()
        .chain(obj.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.is_definition() && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok().filter(|n| !n.is_empty())?.to_string())))
        .collect();
    all.sort_unstable_by(|a, b| (a.0, a.1 == 0, &a.2).cmp(&(b.0, b.1 == 0, &b.2)));
    // One name an address: the first, sized ones first.
    all.dedup_by_key(|s| s.0);
    all
}

/// The line tables of `obj`'s DWARF sections.
fn context(obj: &object::File<'_>) -> Option<addr2line::Context<Reader>> {
    let endian = if obj.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
    use gimli::SectionId::*;
    let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
        // What line lookups read (not the variables' locations, often as big again).
        let needed = matches!(
            id,
            DebugAbbrev
                | DebugAddr
                | DebugAranges
                | DebugInfo
                | DebugLine
                | DebugLineStr
                | DebugRanges
                | DebugRngLists
                | DebugStr
                | DebugStrOffsets
        );
        let section = obj.section_by_name(id.name()).filter(|_| needed);
        let data = section.and_then(|s| section_data(&s)).unwrap_or_default();
        Ok(Reader::new(Arc::from(data), endian))
    };
    let dwarf = gimli::Dwarf::load(load).ok()?;
    addr2line::Context::from_dwarf(dwarf).ok()
}

/// A section's bytes, inflated when zlib-compressed; None when it cannot be read.
fn section_data(s: &object::Section<'_, '_>) -> Option<Vec<u8>> {
    let c = s.compressed_data().ok()?;
    match c.format {
        object::CompressionFormat::None => Some(c.data.to_vec()),
        object::CompressionFormat::Zlib => {
            let size = usize::try_from(c.uncompressed_size).ok().filter(|&n| n <= MAX_FILE)?;
            let mut out = Vec::with_capacity(size);
            flate2::read::ZlibDecoder::new(c.data).take(size as u64).read_to_end(&mut out).ok()?;
            (out.len() == size).then_some(out)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_elf_or_has_no_lines_gives_no_place_and_no_panic() {
        let mut lines = Lines::new(2);
        let mut read = |p: &str| -> Option<Bytes> {
            match p {
                "/junk" => Some(Box::new(vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0xff, 0xff])),
                "/empty" => Some(Box::new(Vec::new())),
                _ => None,
            }
        };
        for path in ["/junk", "/empty", "/missing", "/junk"] {
            assert_eq!(lines.place(path, 1, 0x1000, &mut read), None);
            assert_eq!(lines.symbol(path, 1, 0x1000, &mut read), None);
        }
        assert!(lines.modules.len() <= 2);
    }

    #[test]
    fn a_function_of_this_test_is_placed_in_this_file() {
        let addr = a_place_prints_as_file_colon_line as *const () as usize as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let m = crate::maps::parse(&maps).into_iter().find(|m| m.contains(addr)).unwrap();
        let mut read = |p: &str| std::fs::read(p).ok().map(|d| Box::new(d) as Bytes);
        let mut lines = Lines::new(1);
        let place = lines.place(&m.path, m.inode, addr - m.start + m.offset, &mut read).unwrap();
        assert!(place.file.ends_with("lines.rs") && place.line > 0, "{place}");
        let (name, off) = lines.symbol(&m.path, m.inode, addr - m.start + m.offset, &mut read).unwrap();
        assert!(name.contains("a_place_prints_as_file_colon_line") && off == 0, "{name}+{off}");
    }

    #[test]
    fn corrupt_dwarf_gives_no_place_and_no_panic() {
        let addr = a_place_prints_as_file_colon_line as *const () as usize as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let m = crate::maps::parse(&maps).into_iter().find(|m| m.contains(addr)).unwrap();
        let exe = std::fs::read(&m.path).unwrap();
        let obj = object::File::parse(&*exe).unwrap();
        let ranges: Vec<(u64, u64)> = [".debug_info", ".debug_line", ".debug_abbrev"]
            .iter()
            .filter_map(|n| obj.section_by_name(n)?.file_range())
            .collect();
        drop(obj);
        for fill in [0x00u8, 0xff, 0x7f] {
            let mut bad = exe.clone();
            for &(at, len) in &ranges {
                // Every 7th byte changed: headers and programs half right.
                for b in bad[at as usize..(at + len) as usize].iter_mut().step_by(7) {
                    *b = fill;
                }
            }
            let mut read = |_: &str| Some(Box::new(bad.clone()) as Bytes);
            let mut lines = Lines::new(1);
            // Any answer, or none, but no panic.
            let _ = lines.place("/bad", u64::from(fill), addr - m.start + m.offset, &mut read);
        }
    }

    #[test]
    fn a_place_prints_as_file_colon_line() {
        assert_eq!(Place { file: "/src/a.c".into(), line: 42 }.to_string(), "/src/a.c:42");
    }
}
