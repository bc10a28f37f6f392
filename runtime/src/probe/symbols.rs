//! The process as the registry sees it: the address space and the symbols of every loaded
//! module, read once and kept while the dynamic loader's generation (its count of objects
//! loaded and unloaded) is unchanged, so a batch of thousands of probes reads
//! `/proc/self/maps` once and each ELF file once.
//!
//! Normal context, under the registry lock. File access is by raw system calls.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::base::elf::{self, ElfInfo, LoadedModule, ProbeSpec};
use crate::base::maps::{self, Mapping};
use crate::base::sys;
use crate::insn::vecfree::Touches;
use crate::probe::error::RegisterError;
use crate::probe::nosymbol;
use crate::probe::table::{ProbePoint, INT3, MAX_PATCH};
use crate::probe::traps;

/// The address space and the ELF files behind it.
#[derive(Default)]
pub struct View {
    elf: BTreeMap<String, Option<Arc<ElfInfo>>>,
    /// The address space as last read, its modules, and the loader's generation then.
    maps: Option<Arc<Vec<Mapping>>>,
    modules: Option<Arc<Vec<LoadedModule>>>,
    generation: (u64, u64),
    main_path: Option<String>,
    /// Every probe point made, by address (to find those inside a function's bytes).
    points: BTreeMap<usize, &'static ProbePoint>,
    /// The run-time addresses of the functions of `traps`, per libc module path.
    trap_unsafe: BTreeMap<String, BTreeMap<usize, (&'static str, &'static str)>>,
    /// Functions without a symbol, by their FDEs (`nosymbol`).
    pub(crate) nosym: nosymbol::Known,
    /// Handlers read for vector state, by address (`vectors`), while the modules stay.
    pub(crate) handler_code: BTreeMap<usize, Result<(), Touches>>,
}

/// The dynamic loader's counts of objects loaded and unloaded so far.
fn loader_generation() -> (u64, u64) {
    extern "C" fn first(info: *mut libc::dl_phdr_info, _size: usize, out: *mut libc::c_void) -> libc::c_int {
        // SAFETY: the loader passes a valid dl_phdr_info; `out` is the (u64, u64) we passed.
        unsafe { *(out as *mut (u64, u64)) = ((*info).dlpi_adds, (*info).dlpi_subs) };
        1
    }
    let mut generation = (0u64, 0u64);
    // SAFETY: the callback matches dl_iterate_phdr's signature and writes only `generation`.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut generation as *mut (u64, u64) as *mut libc::c_void) };
    generation
}

/// The code of one function, as it was before any probe.
pub struct FunctionCode {
    pub name: String,
    pub start: usize,
    pub bytes: Vec<u8>,
    /// The bytes between the function's end and the next symbol (at most 16).
    pub padding: Vec<u8>,
    /// Its extent comes from its FDE: no sized symbol covers it (see `nosymbol`).
    pub from_cfi: bool,
}

impl View {
    /// Remembers a new probe point (see [`View::unpatch`]).
    pub fn note_point(&mut self, pp: &'static ProbePoint) {
        self.points.insert(pp.addr, pp);
    }

    /// Puts back the original bytes of every armed probe point inside `bytes` (read at
    /// `start`): the first byte of an `int3`, the whole range of a jump.
    pub fn unpatch(&self, bytes: &mut [u8], start: usize) {
        let from = start.saturating_sub(MAX_PATCH);
        for (&addr, pp) in self.points.range(from..start + bytes.len()).filter(|(_, pp)| pp.is_armed()) {
            let jump = pp.jump.as_ref().ok().filter(|_| pp.jump_active.load(Ordering::SeqCst));
            let (orig, len): (&[u8], usize) = match jump {
                Some(prep) => (&prep.orig, prep.patch_len),
                None if addr >= start && bytes[addr - start] == INT3 => (&pp.orig, 1),
                None => continue,
            };
            for (k, &b) in orig[..len].iter().enumerate() {
                if let Some(slot) = (addr + k).checked_sub(start).and_then(|i| bytes.get_mut(i)) {
                    *slot = b;
                }
            }
        }
    }

    pub const fn new() -> View {
        View {
            elf: BTreeMap::new(),
            maps: None,
            modules: None,
            generation: (0, 0),
            main_path: None,
            points: BTreeMap::new(),
            trap_unsafe: BTreeMap::new(),
            nosym: nosymbol::Known::new(),
            handler_code: BTreeMap::new(),
        }
    }

    /// The address space, re-read only when the loader mapped or unmapped a module since the
    /// last read, or when `addr` is not in known executable memory.
    pub fn maps(&mut self, addr: Option<usize>) -> Arc<Vec<Mapping>> {
        let generation = loader_generation();
        let fresh = self.maps.as_ref().filter(|maps| {
            generation == self.generation && addr.is_none_or(|a| maps::find(maps, a).is_some_and(|m| m.exec))
        });
        if let Some(maps) = fresh {
            return maps.clone();
        }
        self.refresh(generation)
    }

    /// Reads the address space again, whatever the loader says.
    pub fn reread(&mut self) -> Arc<Vec<Mapping>> {
        self.refresh(loader_generation())
    }

    fn refresh(&mut self, generation: (u64, u64)) -> Arc<Vec<Mapping>> {
        let mut maps = maps::current();
        crate::insn::patch::true_protections(&mut maps);
        let maps = Arc::new(maps);
        self.modules = Some(Arc::new(elf::loaded_modules(&maps)));
        self.maps = Some(maps.clone());
        self.generation = generation;
        self.handler_code.clear();
        maps
    }

    /// The loaded modules with code, as of the last read of the address space.
    pub fn modules(&mut self) -> Arc<Vec<LoadedModule>> {
        self.maps(None);
        self.modules.clone().unwrap_or_default()
    }

    /// The mapping holding `addr`.
    pub fn mapping(&mut self, addr: usize) -> Option<Mapping> {
        maps::find(&self.maps(Some(addr)), addr).cloned()
    }

    /// The protection of the page holding `addr`.
    pub fn prot_at(&mut self, addr: usize) -> i32 {
        self.mapping(addr).map_or(libc::PROT_READ | libc::PROT_EXEC, |m| maps::prot(&m))
    }

    pub fn elf(&mut self, path: &str) -> Option<Arc<ElfInfo>> {
        if let Some(info) = self.elf.get(path) {
            return info.clone();
        }
        let info = CString::new(path)
            .ok()
            .and_then(|c| sys::map_file(&c).ok())
            .and_then(|file| ElfInfo::parse(file.bytes()).ok())
            .map(Arc::new);
        self.elf.insert(path.to_string(), info.clone());
        info
    }

    /// The main program's path.
    pub fn main_path(&mut self) -> Option<String> {
        if self.main_path.is_none() {
            self.main_path = sys::readlink(c"/proc/self/exe").ok();
        }
        self.main_path.clone()
    }

    /// Whether the main program is written in Go (it has Go's build-info section or runtime).
    pub fn main_is_go(&mut self) -> bool {
        let Some(path) = self.main_path() else { return false };
        self.elf(&path).is_some_and(|info| info.is_go())
    }

    /// The module holding code address `addr`, with its ELF symbols and load bias.
    pub fn module_at(&mut self, addr: usize) -> Option<(LoadedModule, Arc<ElfInfo>, usize)> {
        self.maps(Some(addr));
        let module = self.modules.as_ref()?.iter().find(|m| m.holds(addr))?.clone();
        let info = self.elf(&module.path)?;
        let bias = info.bias(module.first_start, module.first_offset)?;
        Some((module, info, bias))
    }

    /// Whether `addr`, inside `f` (a function a sized symbol gives), is a USDT marker's `nop`:
    /// a place inside a function that may take a jump (see `insn::jump::plan_at`).
    pub fn is_marker(&mut self, addr: usize, f: &FunctionCode) -> bool {
        let Some((_, info, bias)) = self.module_at(addr).filter(|_| !f.from_cfi) else { return false };
        info.markers().iter().any(|m| bias.wrapping_add(m.pc as usize) == addr)
    }

    /// `symbol+0xoff` for a run-time code address, where a symbol covers it.
    pub fn symbolize(&mut self, addr: usize) -> Option<String> {
        let (module, info, bias) = self.module_at(addr)?;
        match info.containing(addr.wrapping_sub(bias) as u64) {
            Some(sym) => Some(format!("{}+{:#x}", sym.name, addr - bias.wrapping_add(sym.value as usize))),
            // An IFUNC implementation without a symbol: by the IFUNC's name.
            None => {
                let (start, _) = self.fde_at(&module.path, addr.wrapping_sub(bias) as u64)?;
                let start = bias.wrapping_add(start as usize);
                let name = self.nosym.ifuncs.get(&start)?;
                Some(format!("{name}+{:#x}", addr - start))
            }
        }
    }

    /// What messages call the code at `addr`: [`View::symbolize`]'s `symbol+0xoff`, else
    /// `FILE+0xADDR` with the module's own address (as `nm` and `objdump` number it), else
    /// the address.
    pub fn name_of(&mut self, addr: usize) -> String {
        if let Some(name) = self.symbolize(addr) {
            return name;
        }
        match self.module_at(addr) {
            Some((module, _, bias)) => {
                let file = module.path.rsplit('/').next().unwrap_or_default();
                format!("{file}+{:#x}", addr.wrapping_sub(bias))
            }
            None => format!("{addr:#x}"),
        }
    }

    /// The function at `start` (in the module holding `addr`) if glibc runs it with every
    /// signal blocked (`traps`), with where; IFUNCs count by the implementation chosen.
    pub fn trap_unsafe(&mut self, addr: usize, start: usize) -> Option<(&'static str, &'static str)> {
        self.maps(Some(addr));
        let module = self.modules.as_ref()?.iter().find(|m| m.holds(addr))?.clone();
        if !traps::is_libc(&module.path) {
            return None;
        }
        if !self.trap_unsafe.contains_key(&module.path) {
            let mut at = BTreeMap::new();
            for &(name, why) in traps::list() {
                if let Some(a) = self.symbol_in(&module, name) {
                    at.entry(a).or_insert((name, why));
                }
            }
            self.trap_unsafe.insert(module.path.clone(), at);
        }
        self.trap_unsafe.get(&module.path)?.get(&start).copied()
    }

    /// The names of every symbol of the module holding `addr` that starts exactly there
    /// (aliases: `_setjmp` and `setjmp` may share code).
    pub fn names_at(&mut self, addr: usize) -> Vec<String> {
        let Some((_, info, bias)) = self.module_at(addr) else { return Vec::new() };
        let value = addr.wrapping_sub(bias) as u64;
        let symbols = info.symbols();
        let first = symbols.partition_point(|s| s.value < value);
        symbols[first..].iter().take_while(|s| s.value == value).map(|s| s.name.clone()).collect()
    }

    /// The run-time address of `name` in `module`, following IFUNCs to their implementation.
    fn symbol_in(&mut self, module: &LoadedModule, name: &str) -> Option<usize> {
        let info = self.elf(&module.path)?;
        let sym = info.symbol(name)?;
        let bias = info.bias(module.first_start, module.first_offset)?;
        let addr = bias.wrapping_add(sym.value as usize);
        // An IFUNC's own address is its resolver: probe the implementation the loader chose,
        // or the resolver where the loader does not say (private symbols).
        if !sym.ifunc {
            return Some(addr);
        }
        let Some(target) = ifunc_target(module, name) else { return Some(addr) };
        self.nosym.ifuncs.entry(target).or_insert_with(|| name.to_string());
        Some(target)
    }

    /// The run-time address a probe specification names.
    pub fn resolve(&mut self, spec: &ProbeSpec) -> Result<usize, RegisterError> {
        let (module, name, offset) = match *spec {
            ProbeSpec::Address(a) => return Ok(a as usize),
            ProbeSpec::Symbol { module, name, offset } => (module, name, offset as usize),
        };
        let modules = self.modules();
        let candidates: Vec<&LoadedModule> = match module {
            Some(m) => {
                let found: Vec<_> = modules.iter().filter(|x| elf::module_matches(&x.path, m)).collect();
                if found.is_empty() {
                    return Err(RegisterError::UnknownModule { module: m.into(), symbol: name.into() });
                }
                found
            }
            None => modules.iter().collect(),
        };
        candidates
            .into_iter()
            .find_map(|m| self.symbol_in(m, name))
            .map(|a| a.wrapping_add(offset))
            .ok_or_else(|| RegisterError::UnknownSymbol(name.into()))
    }

    /// The function holding `addr` (its bytes as before any probe, and the padding after
    /// it); None where no sized symbol covers the address.
    pub fn function_code(&mut self, addr: usize) -> Option<FunctionCode> {
        let (module, info, bias) = self.module_at(addr)?;
        let vaddr = addr.wrapping_sub(bias) as u64;
        // A sized symbol, or else the FDE of a function the library keeps no symbol for.
        let (value, size, name, from_cfi) = match info.containing(vaddr) {
            Some(sym) => (sym.value, sym.size, sym.name.clone(), false),
            None => {
                let (lo, hi) = self.fde_at(&module.path, vaddr)?;
                (lo, hi - lo, self.nosym.name(bias.wrapping_add(lo as usize)), true)
            }
        };
        let start = bias.wrapping_add(value as usize);
        let maps = self.maps(Some(start));
        let text = maps::find(&maps, start).filter(|m| m.exec && start + size as usize <= m.end as usize)?;
        let end = start + size as usize;
        // The padding after the function: up to the next symbol (or FDE), at most 16 bytes,
        // same mapping.
        let mut next = info.next_symbol_after(value + size - 1).map_or(usize::MAX, |v| bias.wrapping_add(v as usize));
        if from_cfi {
            let fde = self.next_fde_after(&module.path, value + size - 1);
            next = next.min(fde.map_or(usize::MAX, |v| bias.wrapping_add(v as usize)));
        }
        let padding_end = next.min(end + 16).min(text.end as usize).max(end);
        // SAFETY: the function and its padding lie inside one executable (hence readable) mapping.
        let mut bytes = unsafe { crate::insn::patch::read_code(start, padding_end - start) };
        self.unpatch(&mut bytes, start);
        let padding = bytes.split_off(size as usize);
        Some(FunctionCode { name, start, bytes, padding, from_cfi })
    }
}

/// Functions without a symbol, known by their FDE (see `nosymbol`).
impl View {
    /// The FDE range holding link-time address `vaddr` of the module file at `path`.
    pub fn fde_at(&mut self, path: &str, vaddr: u64) -> Option<(u64, u64)> {
        crate::base::cfi::containing(&self.nosym.ranges(path), vaddr)
    }

    /// The start of the first FDE range after link-time address `vaddr`.
    fn next_fde_after(&mut self, path: &str, vaddr: u64) -> Option<u64> {
        let ranges = self.nosym.ranges(path);
        ranges.get(ranges.partition_point(|&(s, _)| s <= vaddr)).map(|&(s, _)| s)
    }

    /// A direct branch from another function into `start + 1 .. start + len`, where the
    /// function `start..start + size` has no symbol: `(from, to)`.
    pub fn branch_from_outside(&mut self, start: usize, size: usize, len: usize) -> Option<(u64, u64)> {
        let (module, info, bias) = self.module_at(start)?;
        self.nosym.branch_from_outside(&module.path, &info, bias, (start, size, len))
    }
}

/// The implementation an IFUNC symbol resolves to, as the dynamic loader chose it.
fn ifunc_target(module: &LoadedModule, name: &str) -> Option<usize> {
    let name = CString::new(name).ok()?;
    // The global definition, where it is this module's (the common case: libc's string
    // functions): one lookup, no handle to open.
    // SAFETY: dlsym with RTLD_DEFAULT and a C string.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
    if global != 0 && module.holds(global) {
        return Some(global);
    }
    let path = CString::new(module.path.as_str()).ok()?;
    // SAFETY: RTLD_NOLOAD only looks up a library that is already loaded; dlsym is given
    // NUL-terminated strings and a handle that dlopen returned, closed right after.
    unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if handle.is_null() {
            return None;
        }
        let addr = libc::dlsym(handle, name.as_ptr());
        libc::dlclose(handle);
        (!addr.is_null()).then_some(addr as usize)
    }
}
