//! Symbols of ELF files, for `uprobe-run`, the tests and the benches (the runtime reads its
//! own tables where it runs): link-time address, size and file offset of a symbol, and the
//! list of exported functions of a library. Pure: bytes in, values out.

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use std::collections::HashSet;

/// A symbol of an ELF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncSym {
    /// Its name.
    pub name: String,
    /// Link-time address (st_value).
    pub vaddr: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Offset of the first byte in the file: what kernel uprobes take.
    pub file_offset: u64,
    /// The lowest PT_LOAD address, page aligned: `load base + vaddr - this` is the run-time
    /// address when the file is mapped at `load base`.
    pub image_start: u64,
}

impl FuncSym {
    /// Run-time address when the mapping of file offset 0 starts at `map_start`.
    pub fn runtime_address(&self, map_start: u64) -> u64 {
        map_start + (self.vaddr - self.image_start)
    }
}

fn parse(data: &[u8]) -> Result<object::File<'_>, String> {
    object::File::parse(data).map_err(|e| format!("not an ELF file: {e}"))
}

/// The defined function `name`: the dynamic symbols first (what the file exports), then the
/// symbol table. An error for data that is not ELF or a name that is not there.
pub fn function(data: &[u8], name: &str) -> Result<FuncSym, String> {
    find(data, name, true)?.ok_or_else(|| format!("no function {name}"))
}

/// The defined symbol `name` of any kind (a function, a variable), looked up as [`function`].
pub fn symbol(data: &[u8], name: &str) -> Result<FuncSym, String> {
    find(data, name, false)?.ok_or_else(|| format!("no symbol {name}"))
}

/// The one lookup: `functions` keeps to code symbols. An error for data that is not ELF or
/// a symbol in no loaded segment.
pub fn find(data: &[u8], name: &str, functions: bool) -> Result<Option<FuncSym>, String> {
    let file = parse(data)?;
    let Some(sym) = file.dynamic_symbols().chain(file.symbols()).find(|s| {
        s.name() == Ok(name) && if functions { s.is_definition() && s.kind() == SymbolKind::Text } else { defined(s) }
    }) else {
        return Ok(None);
    };
    let vaddr = sym.address();
    let mut image_start = u64::MAX;
    let mut file_offset = None;
    for seg in file.segments() {
        image_start = image_start.min(seg.address() & !0xfff);
        let (off, len) = seg.file_range();
        if vaddr >= seg.address() && vaddr < seg.address() + len {
            file_offset = Some(off + (vaddr - seg.address()));
        }
    }
    Ok(Some(FuncSym {
        name: name.to_owned(),
        vaddr,
        size: sym.size(),
        file_offset: file_offset.ok_or_else(|| format!("{name} is in no loaded segment"))?,
        image_start,
    }))
}

/// Whether `s` is defined here as nm shows it: in a section, and not the name of a section or
/// a file (a label written in assembly has no type, and object does not count it a definition).
fn defined<'data>(s: &impl ObjectSymbol<'data>) -> bool {
    !s.is_undefined() && s.section_index().is_some() && !matches!(s.kind(), SymbolKind::Section | SymbolKind::File)
}

/// Names of the functions a library exports (.dynsym, defined, non-zero size), one per
/// address (aliases dropped) and one per name (older symbol versions dropped), sorted.
pub fn exported_functions(data: &[u8]) -> Result<Vec<String>, String> {
    let file = parse(data)?;
    let mut seen_addr = HashSet::new();
    let mut seen_name = HashSet::new();
    let mut syms: Vec<(u64, String)> = file
        .dynamic_symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.is_definition())
        .filter_map(|s| Some((s.address(), s.name().ok()?.to_owned())))
        .collect();
    // Prefer the public spelling of an alias: fewer leading underscores first.
    syms.sort_by(|a, b| {
        let underscores = |s: &str| s.len() - s.trim_start_matches('_').len();
        (a.0, underscores(&a.1), &a.1).cmp(&(b.0, underscores(&b.1), &b.1))
    });
    let mut names: Vec<String> = syms
        .into_iter()
        .filter(|(addr, name)| seen_addr.insert(*addr) && seen_name.insert(name.clone()))
        .map(|(_, name)| name)
        .collect();
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn own_exe() -> Vec<u8> {
        std::fs::read(std::env::current_exe().unwrap()).unwrap()
    }

    #[test]
    fn finds_a_function_of_this_test_binary() {
        let data = own_exe();
        let f = function(&data, "main").unwrap();
        assert!(f.vaddr > 0);
        assert!(f.file_offset > 0);
        assert!(f.image_start <= f.vaddr);
        assert_eq!(f.runtime_address(0x1000_0000), 0x1000_0000 + f.vaddr - f.image_start);
    }

    #[test]
    fn unknown_symbols_and_non_elf_data_are_errors() {
        assert!(function(&own_exe(), "no_such_symbol_here").is_err());
        assert!(function(b"not elf", "main").is_err());
        assert_eq!(find(&own_exe(), "no_such_symbol_here", false), Ok(None));
        assert_eq!(
            find(&own_exe(), "main", false).unwrap().unwrap().vaddr,
            function(&own_exe(), "main").unwrap().vaddr
        );
    }

    #[test]
    fn libc_exports_many_functions_without_aliases() {
        let Some(libc) =
            ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"].iter().find(|p| Path::new(p).exists())
        else {
            eprintln!("skipped: no libc.so.6 at the usual paths");
            return;
        };
        let names = exported_functions(&std::fs::read(libc).unwrap()).unwrap();
        assert!(names.len() > 1000, "{}", names.len());
        assert!(names.iter().any(|n| n == "malloc"));
        let unique: HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
    }
}
