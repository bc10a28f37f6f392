//! Symbols: probe specifications (`[module:]symbol[+offset]` or `0xADDR`), ELF symbol tables
//! (`.symtab` and `.dynsym`) and the load bias of each mapped module. Parsing is pure; the
//! caller supplies the file bytes and the mappings.

use std::collections::HashMap;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SectionFlags, SymbolFlags, SymbolKind};
use thiserror::Error;

use crate::base::maps::Mapping;

/// A parsed probe specification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeSpec<'a> {
    Address(u64),
    Symbol { module: Option<&'a str>, name: &'a str, offset: u64 },
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("empty probe specification")]
    Empty,
    #[error("bad number {0:?}")]
    BadNumber(String),
}

/// Parses a decimal or `0x` hexadecimal number.
pub fn parse_number(text: &str) -> Result<u64, SpecError> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| SpecError::BadNumber(text.into()))
}

/// Parses `0xADDR`, `sym`, `sym+off` or `module:sym[+off]`.
pub fn parse_spec(spec: &str) -> Result<ProbeSpec<'_>, SpecError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(SpecError::Empty);
    }
    if spec.starts_with("0x") || spec.starts_with("0X") {
        return parse_number(spec).map(ProbeSpec::Address);
    }
    let (module, rest) = match spec.split_once(':') {
        Some((m, r)) => (Some(m), r),
        None => (None, spec),
    };
    let (name, offset) = match rest.split_once('+') {
        Some((n, off)) => (n, parse_number(off)?),
        None => (rest, 0),
    };
    if name.is_empty() {
        return Err(SpecError::Empty);
    }
    Ok(ProbeSpec::Symbol { module, name, offset })
}

/// Whether `module` (as a user writes it) names the file at `path`: the full path, the file
/// name, or the file name without its version suffix (`libc` and `libc.so` for `libc.so.6`).
pub fn module_matches(path: &str, module: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    path == module
        || base == module
        || base.strip_prefix(module).is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
}

/// A function-like symbol of an ELF file, at its link-time address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    pub value: u64,
    pub size: u64,
    /// STT_GNU_IFUNC: `value` is the resolver, not the implementation.
    pub ifunc: bool,
    /// A function (or code label), not data.
    pub code: bool,
}

/// What the runtime needs from one ELF file.
#[derive(Debug, Default)]
pub struct ElfInfo {
    /// Sorted by address.
    symbols: Vec<Symbol>,
    by_name: HashMap<String, usize>,
    /// (file offset, link-time address) of each loadable segment.
    segments: Vec<(u64, u64)>,
    /// (file offset, link-time address, size in the file) of each loadable segment.
    file_ranges: Vec<(u64, u64, u64)>,
    go: bool,
    /// The size of the largest code symbol: how far back a symbol holding an address may start.
    max_code_size: u64,
}

const STT_GNU_IFUNC: u8 = 10;

impl ElfInfo {
    /// Reads the code symbols of both symbol tables and the loadable segments.
    pub fn parse(data: &[u8]) -> Result<ElfInfo, object::Error> {
        let file = object::File::parse(data)?;
        // A global symbol without a type in executable code (hand-written assembly without
        // `.type`/`.size`) names code too: nm shows it as `T`. Its extent is unknown.
        let in_code = |s: &object::Symbol| {
            s.section_index()
                .and_then(|i| file.section_by_index(i).ok())
                .is_some_and(|sec| matches!(sec.flags(), SectionFlags::Elf { sh_flags } if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0))
        };
        let untyped_code = |s: &object::Symbol| s.kind() == SymbolKind::Unknown && s.is_global() && in_code(s);
        let mut symbols: Vec<Symbol> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| {
                (matches!(s.kind(), SymbolKind::Text | SymbolKind::Data) || untyped_code(s))
                    && !s.is_undefined()
                    && s.address() != 0
            })
            .filter_map(|s| {
                let ifunc = matches!(s.flags(), SymbolFlags::Elf { st_info, .. } if st_info & 0xf == STT_GNU_IFUNC);
                let code = s.kind() != SymbolKind::Data;
                let name = s.name().ok()?;
                (!name.is_empty()).then(|| Symbol {
                    name: name.to_string(),
                    value: s.address(),
                    size: s.size(),
                    ifunc,
                    code,
                })
            })
            .collect();
        symbols.sort_by(|a, b| (a.value, &a.name).cmp(&(b.value, &b.name)));
        symbols.dedup_by(|a, b| a.value == b.value && a.name == b.name);
        let mut by_name = HashMap::new();
        for (i, s) in symbols.iter().enumerate() {
            by_name.entry(s.name.clone()).or_insert(i);
        }
        let segments = file.segments().map(|s| (s.file_range().0, s.address())).collect();
        let file_ranges = file.segments().map(|s| (s.file_range().0, s.address(), s.file_range().1)).collect();
        let go = file.section_by_name(".go.buildinfo").is_some() || by_name.contains_key("runtime.main");
        let max_code_size = symbols.iter().filter(|s| s.code).map(|s| s.size).max().unwrap_or(0);
        Ok(ElfInfo { symbols, by_name, segments, file_ranges, go, max_code_size })
    }

    /// Whether this is a Go program.
    pub fn is_go(&self) -> bool {
        self.go
    }

    pub fn symbol(&self, name: &str) -> Option<&Symbol> {
        self.by_name.get(name).map(|&i| &self.symbols[i])
    }

    /// The sized function symbol whose range holds the link-time address `vaddr` (the smallest if
    /// several overlap).
    pub fn containing(&self, vaddr: u64) -> Option<&Symbol> {
        let end = self.symbols.partition_point(|s| s.value <= vaddr);
        self.symbols[..end]
            .iter()
            .rev()
            .take_while(|s| vaddr - s.value < self.max_code_size)
            .filter(|s| s.code && s.size > 0 && vaddr < s.value + s.size)
            .min_by_key(|s| s.size)
    }

    /// The address of the first symbol that starts after `vaddr`.
    pub fn next_symbol_after(&self, vaddr: u64) -> Option<u64> {
        let i = self.symbols.partition_point(|s| s.value <= vaddr);
        self.symbols[i..].iter().find(|s| s.code).map(|s| s.value)
    }

    pub fn symbols(&self) -> &[Symbol] {
        &self.symbols
    }

    /// The link-time address of file offset `offset` (as tracefs's `PATH:OFFSET` names code).
    pub fn vaddr_of_offset(&self, offset: u64) -> Option<u64> {
        self.file_ranges.iter().find(|&&(o, _, len)| o <= offset && offset < o + len).map(|&(o, v, _)| v + (offset - o))
    }

    /// The file offset of link-time address `vaddr`.
    pub fn offset_of_vaddr(&self, vaddr: u64) -> Option<u64> {
        self.file_ranges.iter().find(|&&(_, v, len)| v <= vaddr && vaddr < v + len).map(|&(o, v, _)| o + (vaddr - v))
    }

    /// The load bias of a module whose mapping of file offset `offset` starts at `start`.
    pub fn bias(&self, start: usize, offset: usize) -> Option<usize> {
        let page = |v: u64| v & !0xfff;
        self.segments
            .iter()
            .find(|(off, _)| page(*off) == offset as u64)
            .map(|(_, vaddr)| start.wrapping_sub(page(*vaddr) as usize))
    }
}

/// A mapped ELF module: its path, and the file offset/start of its first mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedModule {
    pub path: String,
    pub inode: u64,
    pub first_start: usize,
    pub first_offset: usize,
    /// The executable ranges of the module.
    pub text: Vec<(usize, usize)>,
}

impl LoadedModule {
    pub fn holds(&self, addr: usize) -> bool {
        self.text.iter().any(|&(s, e)| s <= addr && addr < e)
    }
}

/// The file-backed modules with executable code, in mapping order (the main program first).
pub fn loaded_modules(maps: &[Mapping]) -> Vec<LoadedModule> {
    let mut modules: Vec<LoadedModule> = Vec::new();
    for m in maps.iter().filter(|m| m.is_file()) {
        // Compared by inode, not path: this runs at every registration, and string compares
        // call memcmp, which may itself be probed.
        match modules.iter_mut().find(|x| x.inode == m.inode && x.path.len() == m.path.len()) {
            Some(x) => {
                if (m.offset as usize) < x.first_offset {
                    x.first_offset = m.offset as usize;
                    x.first_start = m.start as usize;
                }
                if m.exec {
                    x.text.push((m.start as usize, m.end as usize));
                }
            }
            None => modules.push(LoadedModule {
                path: m.path.clone(),
                inode: m.inode,
                first_start: m.start as usize,
                first_offset: m.offset as usize,
                text: if m.exec { vec![(m.start as usize, m.end as usize)] } else { vec![] },
            }),
        }
    }
    modules.retain(|m| !m.text.is_empty());
    modules
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert_eq!(parse_spec("0x401136"), Ok(ProbeSpec::Address(0x401136)));
        assert_eq!(parse_spec("main"), Ok(ProbeSpec::Symbol { module: None, name: "main", offset: 0 }));
        assert_eq!(parse_spec("fib+0x4"), Ok(ProbeSpec::Symbol { module: None, name: "fib", offset: 4 }));
        assert_eq!(
            parse_spec("libc:malloc+16"),
            Ok(ProbeSpec::Symbol { module: Some("libc"), name: "malloc", offset: 16 })
        );
        assert_eq!(parse_spec(""), Err(SpecError::Empty));
        assert_eq!(parse_spec("f+zz"), Err(SpecError::BadNumber("zz".into())));
        assert_eq!(parse_spec("libc:"), Err(SpecError::Empty));
    }

    #[test]
    fn matches_modules_by_path_name_and_stem() {
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        assert!(module_matches(libc, libc));
        assert!(module_matches(libc, "libc.so.6"));
        assert!(module_matches(libc, "libc"));
        assert!(module_matches(libc, "libc.so"));
        assert!(!module_matches(libc, "lib"));
        assert!(!module_matches(libc, "libcrypt"));
        assert!(module_matches("/opt/libfoo-1.2.so", "libfoo"));
    }

    #[test]
    fn reads_symbols_of_a_real_library() {
        let data = std::fs::read("/proc/self/exe").unwrap();
        let info = ElfInfo::parse(&data).unwrap();
        let sym = info.symbol("main").expect("the test binary has main");
        assert!(sym.size > 0);
        assert_eq!(info.containing(sym.value + 1).map(|s| s.value), Some(sym.value));
        assert!(!info.segments.is_empty());
        let offset = info.offset_of_vaddr(sym.value).expect("main lies in a segment");
        assert_eq!(info.vaddr_of_offset(offset), Some(sym.value));
    }

    #[test]
    fn groups_mappings_into_modules() {
        let maps = crate::base::maps::parse(
            "1000-2000 r--p 00000000 fe:01 7 /bin/p\n2000-3000 r-xp 00001000 fe:01 7 /bin/p\n\
             5000-6000 r--p 00000000 fe:01 8 /lib/d.so\n9000-a000 r-xp 00000000 00:00 0 [vdso]\n",
        );
        let mods = loaded_modules(&maps);
        assert_eq!(mods.len(), 1);
        assert_eq!((mods[0].first_start, mods[0].first_offset), (0x1000, 0));
        assert!(mods[0].holds(0x2800) && !mods[0].holds(0x1800));
    }
}
