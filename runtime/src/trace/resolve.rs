//! Where a definition's probes go: its WHERE (a symbol, a glob, `module:symbol`, an address,
//! `PATH:OFFSET`) resolved against the modules loaded now, with the refusal naming what
//! exists where nothing matches.
//!
//! Context: start-up (and an attach session's start), normal context.

use crate::base::elf::{self, ElfInfo, LoadedModule};
use crate::probe::symbols::View;
use crate::trace::def::{self, DefError, Definition, Place};
use crate::trace::fetch::Fetch;
use crate::trace::libpath;
use crate::trace::names::{demangle, glob, without_parameters};

/// The column of WHERE in a definition.
pub fn where_at(def: &Definition) -> usize {
    let head = def.text.split_whitespace().next().unwrap_or("");
    def.text[head.len()..].find(|c: char| !c.is_whitespace()).map_or(0, |i| head.len() + i)
}

pub type Found = Vec<(String, Option<String>, usize)>;

pub fn resolve(view: &mut View, modules: &[LoadedModule], d: &Definition) -> Result<Found, DefError> {
    let at = where_at(d);
    let fail = |what: String| DefError { at, what };
    let named = |default: String| d.event.clone().unwrap_or(default);
    let needs_entry = d.args.iter().any(|a| uses_arg(&a.fetch));
    match &d.place {
        Place::Address(a) => {
            if needs_entry && view.function_code(*a as usize).is_none_or(|f| f.start != *a as usize) {
                return Err(fail(format!("a function's entry for $argN, not {a:#x}")));
            }
            Ok(vec![(named(d.default_name(None)), None, *a as usize)])
        }
        Place::Sdt { .. } => Err(fail(
            "a place uprobe-run has translated (a USDT marker by name is given with -e to uprobe-run, which \
             finds it; here: PATH:OFFSET(REF_CTR_OFFSET))"
                .into(),
        )),
        Place::FileOffset { path, offset, .. } => {
            let canonical = std::fs::canonicalize(path).ok().map(|p| p.display().to_string());
            let module =
                modules.iter().find(|m| Some(&m.path) == canonical.as_ref() || elf::module_matches(&m.path, path));
            let file = module.map(|m| m.path.clone()).or(canonical.clone());
            let Some(file) = file else { return Err(fail(format!("a loaded module or an existing file, not {path}"))) };
            let info = view.elf(&file).ok_or_else(|| fail(format!("an ELF file: {file}")))?;
            let vaddr =
                info.vaddr_of_offset(*offset).ok_or_else(|| fail(format!("an offset inside a segment of {file}")))?;
            let entry = info.containing(vaddr).is_some_and(|s| s.value == vaddr);
            if needs_entry && !entry {
                return Err(fail(format!("a function's entry for $argN, not offset {offset:#x} of {file}")));
            }
            let name = named(d.default_name(None));
            if let Some(m) = module {
                let bias = info.bias(m.first_start, m.first_offset).ok_or_else(|| fail(format!("{file} mapped")))?;
                return Ok(vec![(name, None, bias.wrapping_add(vaddr as usize))]);
            }
            // Not loaded yet: named by the function that holds it, to be armed at its load.
            let sym = info.containing(vaddr).ok_or_else(|| {
                fail(format!("a function at offset {offset:#x} of {file}, which is not loaded yet (none covers it)"))
            })?;
            Ok(vec![(name, Some(format!("{file}:{}+{:#x}", sym.name, vaddr - sym.value)), 0)])
        }
        Place::Symbol { module, name, offset } => {
            let candidates: Vec<&LoadedModule> = match module {
                Some(m) => {
                    // A relative path names the file it leads to, as for PATH:OFFSET.
                    let canonical = m.contains('/').then(|| std::fs::canonicalize(m).ok()).flatten();
                    let canonical = canonical.map(|p| p.display().to_string());
                    modules
                        .iter()
                        .filter(|x| elf::module_matches(&x.path, m) || Some(&x.path) == canonical.as_ref())
                        .collect()
                }
                None if def::is_glob(name) => modules.iter().take(1).collect(),
                None => modules.iter().collect(),
            };
            if candidates.is_empty() {
                let m = module.as_deref().unwrap_or("");
                if def::is_glob(name) {
                    return Err(fail(format!("a glob over a loaded module ({m} is not loaded at start-up)")));
                }
                // Waiting for a module only makes sense if there is one to wait for.
                if let Err(close) = libpath::findable(m, modules) {
                    let close = match close.is_empty() {
                        true => String::new(),
                        false => format!(" (closest: {})", close.join(", ")),
                    };
                    return Err(fail(format!(
                        "a library that exists, not {m:?}: no such file on the loader's search path or as given{close}"
                    )));
                }
                // Armed when the module is loaded, by the name given.
                return Ok(vec![(named(d.default_name(None)), Some(format!("{m}:{name}+{offset:#x}")), 0)]);
            }
            let mut found: Found = Vec::new();
            for m in candidates {
                let Some(info) = view.elf(&m.path) else { continue };
                for (mangled, shown) in matching(&info, name) {
                    let event = match &d.event {
                        Some(e) if !def::is_glob(name) => e.clone(),
                        _ => d.default_name(Some(&shown)),
                    };
                    let spec = format!("{}:{mangled}+{offset:#x}", m.path);
                    if !found.iter().any(|f| f.1.as_deref() == Some(&spec)) {
                        found.push((event, Some(spec), 0));
                    }
                }
                if !found.is_empty() && !def::is_glob(name) {
                    break;
                }
            }
            if d.event.is_some() && def::is_glob(name) {
                return Err(fail("no EVENT name with a glob (each match is named after its function)".into()));
            }
            match found.len() {
                0 if def::is_glob(name) => Err(fail(format!("a glob that matches a function, not {name:?}"))),
                0 => Err(fail(format!(
                    "a function named {name:?} in {}",
                    module.as_deref().unwrap_or("a loaded module")
                ))),
                n if n > 1 && !def::is_glob(name) => Err(fail(format!(
                    "one function named {name:?}, not {n}: give the parameter list (see uprobe-run --list)"
                ))),
                _ if needs_entry && *offset != 0 => Err(fail("a function's entry for $argN (no +OFFSET)".into())),
                _ => Ok(found),
            }
        }
    }
}

fn uses_arg(f: &Fetch) -> bool {
    match f {
        Fetch::Arg(_) => true,
        Fetch::Deref { inner, .. } => uses_arg(inner),
        _ => false,
    }
}

/// The functions of `info` that `name` names: (mangled name, shown name).
fn matching(info: &ElfInfo, name: &str) -> Vec<(String, String)> {
    if !def::is_glob(name) {
        if let Some(s) = info.symbol(name).filter(|s| s.code) {
            let shown = demangle(&s.name).map_or(s.name.clone(), |d| without_parameters(&d).to_string());
            return vec![(s.name.clone(), shown)];
        }
    }
    let mut out: Vec<(String, String)> = Vec::new();
    let mut seen: Vec<u64> = Vec::new();
    for s in info.symbols().iter().filter(|s| s.code && s.size > 0) {
        let demangled = demangle(&s.name);
        let short = demangled.as_deref().map(without_parameters);
        let hit = if def::is_glob(name) {
            glob(name, &s.name)
                || demangled.as_deref().is_some_and(|d| glob(name, d))
                || short.is_some_and(|d| glob(name, d))
        } else {
            demangled.as_deref() == Some(name) || short == Some(name)
        };
        if hit && !seen.contains(&s.value) {
            seen.push(s.value);
            out.push((s.name.clone(), short.map_or(s.name.clone(), str::to_string)));
        }
    }
    out
}
