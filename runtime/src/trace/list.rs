//! `uprobe-run --list`: the functions that can be probed, in the program and every module
//! loaded with it, each with the strategy a probe on its entry would get, found by the same
//! analysis placement uses. The runtime lists from start-up, before the program's
//! constructors and `main`, and the process ends there; attach can call [`list`] in a
//! running process the same way.
//!
//! One line a function: `MODULE:SYMBOL` (pastes into `-e`; C++ and Rust names demangled),
//! the file offset (what tracefs takes), the size, and `jump`, `int3 (why not a jump)` or
//! `refused (why)`. An IFUNC (`strlen`) is listed as what a probe on it gets: the
//! implementation the loader chose in this process, `libc.so.6:strlen -> __strlen_avx2` (its
//! address where the library keeps no symbol for it), with that code's offset, size (from
//! its FDE) and strategy.
//!
//! Then each USDT marker (`.note.stapsdt`) of the module: `MODULE:sdt:PROVIDER:NAME` (pastes
//! into `-e`), the file offset of its `nop`, `-` for a size, the strategy a probe on it gets,
//! its semaphore's file offset (or `no semaphore`) and its argument specs.
//!
//! Context: start-up (or attach), normal context.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::base::elf::{self, ElfInfo, LoadedModule, ProbeSpec};
use crate::base::sys;
use crate::probe::place::{self, Strategy};
use crate::probe::registry;
use crate::probe::symbols::View;
use crate::trace::names::{demangle, glob, without_parameters};
use crate::trace::record;

/// Writes the list of the functions matching `pattern` (a glob on `SYMBOL` or
/// `MODULE:SYMBOL`, mangled or demangled; None: all) to `fd`; returns how many were listed.
pub fn list(pattern: Option<&str>, fd: i32) -> usize {
    let own = record::on_entry as *const () as usize;
    let mut out = String::new();
    let mut count = 0;
    registry::with_view(|view| {
        let modules: Vec<LoadedModule> = view.modules().iter().filter(|m| !m.holds(own)).cloned().collect();
        let _ = writeln!(out, "{:<48} {:>10} {:>7}  STRATEGY", "FUNCTION", "OFFSET", "SIZE");
        for m in &modules {
            let Some(info) = view.elf(&m.path) else { continue };
            let Some(bias) = info.bias(m.first_start, m.first_offset) else { continue };
            let file = m.path.rsplit('/').next().unwrap_or(&m.path);
            // One line per name, sorted by address; aliases share the analysis of their address.
            let mut strategies: BTreeMap<usize, String> = BTreeMap::new();
            for s in info.symbols().iter().filter(|s| s.code && s.size > 0) {
                let shown = demangle(&s.name).unwrap_or_else(|| s.name.clone());
                let full = format!("{file}:{shown}");
                let names = |p: &str| glob(p, &s.name) || glob(p, &shown) || glob(p, without_parameters(&shown));
                let wanted = pattern.is_none_or(|p| {
                    names(p)
                        || glob(p, &full)
                        || glob(p, &format!("{file}:{}", s.name))
                        // MODULE:SYMBOL with the module named as in a definition (`libc`).
                        || module_part(p).is_some_and(|(module, sym)| elf::module_matches(&m.path, module) && names(sym))
                });
                if !wanted {
                    continue;
                }
                let mut addr = bias.wrapping_add(s.value as usize);
                let (mut full, mut size, mut vaddr) = (full, s.size, s.value);
                if s.ifunc {
                    // What a probe on it gets: the implementation the loader chose.
                    let spec = ProbeSpec::Symbol { module: Some(&m.path), name: &s.name, offset: 0 };
                    if let Some(target) = view.resolve(&spec).ok().filter(|&t| t != addr) {
                        let code = view.function_code(target).filter(|f| f.start == target);
                        let own = view.names_at(target).into_iter().next();
                        full = format!("{full} -> {}", own.unwrap_or_else(|| format!("{target:#x}")));
                        size = code.map_or(0, |f| f.bytes.len() as u64);
                        vaddr = target.wrapping_sub(bias) as u64;
                        addr = target;
                    }
                }
                let strategy = strategies
                    .entry(addr)
                    .or_insert_with(|| match place::assess(view, addr) {
                        Ok(Strategy::Jump) => "jump".to_string(),
                        Ok(Strategy::Int3(why)) => format!("int3 ({why})"),
                        Ok(Strategy::Original) => "int3".to_string(),
                        Err(e) => format!("refused ({e})"),
                    })
                    .clone();
                let offset = info.offset_of_vaddr(vaddr).map_or("-".to_string(), |o| format!("{o:#x}"));
                let _ = writeln!(out, "{full:<48} {offset:>10} {size:>7}  {strategy}");
                count += 1;
                if out.len() > 1 << 16 {
                    let _ = sys::write_all(fd, out.as_bytes());
                    out.clear();
                }
            }
            count += markers(view, m, &info, bias, pattern, &mut out);
        }
    });
    let _ = sys::write_all(fd, out.as_bytes());
    count
}

/// The module's USDT markers matching `pattern` (on `MODULE:sdt:PROVIDER:NAME`,
/// `sdt:PROVIDER:NAME` or `PROVIDER:NAME`), one line each; how many.
fn markers(
    view: &mut View,
    m: &LoadedModule,
    info: &ElfInfo,
    bias: usize,
    pattern: Option<&str>,
    out: &mut String,
) -> usize {
    let file = m.path.rsplit('/').next().unwrap_or(&m.path);
    let mut count = 0;
    for k in info.markers() {
        let short = format!("sdt:{}:{}", k.provider, k.name);
        let wanted = pattern.is_none_or(|p| {
            glob(p, &short)
                || glob(p, &format!("{}:{}", k.provider, k.name))
                || glob(p, &format!("{file}:{short}"))
                || p.find(":sdt:").is_some_and(|i| elf::module_matches(&m.path, &p[..i]) && glob(&p[i + 1..], &short))
        });
        if !wanted {
            continue;
        }
        let strategy = match place::assess(view, bias.wrapping_add(k.pc as usize)) {
            Ok(Strategy::Jump) => "jump".to_string(),
            Ok(Strategy::Int3(why)) => format!("int3 ({why})"),
            Ok(Strategy::Original) => "int3".to_string(),
            Err(e) => format!("refused ({e})"),
        };
        let at = |v: u64| info.offset_of_vaddr(v).map_or("-".to_string(), |o| format!("{o:#x}"));
        let semaphore = match k.semaphore {
            0 => "no semaphore".to_string(),
            s => format!("semaphore {}", at(s)),
        };
        let args = if k.args.is_empty() { "no arguments" } else { &k.args };
        let _ = writeln!(
            out,
            "{:<48} {:>10} {:>7}  {strategy}  {semaphore}  {args}",
            format!("{file}:{short}"),
            at(k.pc),
            "-"
        );
        count += 1;
    }
    count
}

/// A pattern's `MODULE:` part and the rest, where it has one (a `::` belongs to a C++ name).
fn module_part(pattern: &str) -> Option<(&str, &str)> {
    let at = pattern.find(':')?;
    let (module, rest) = (&pattern[..at], &pattern[at + 1..]);
    (!module.is_empty() && !rest.starts_with(':')).then_some((module, rest))
}
