//! USDT markers by name: `-e 'p sdt:PROVIDER:NAME'` (also `MODULE:sdt:PROVIDER:NAME` and
//! `%PROVIDER:NAME`) translated, before the program starts, into the kernel's
//! `PATH:OFFSET(REF_CTR_OFFSET)` definitions the runtime places, one per site of the marker,
//! with the marker's arguments as fetchargs (`argN`, typed from their specs) and its
//! semaphore's file offset. The runtime then only places probes and raises semaphores.
//!
//! Without a MODULE, the program is searched first, then the libraries it needs (its
//! `DT_NEEDED` closure, found on its `RUNPATH`, `LD_LIBRARY_PATH` and the default
//! directories); a MODULE is a path, or a file name or stem found the same way (a library
//! the program loads with `dlopen` later is found by name in those directories).

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};

use object::read::elf::{Dyn, FileHeader};
use object::{Object, ObjectSection, ObjectSymbol};
use uprobe_contracts::def::{self, module_matches, Place};
use uprobe_contracts::filter::glob;
use uprobe_contracts::sdt::{self, Marker};

use crate::base::elf::Segments;
use crate::base::error::Error;

/// A file's markers, and what turns its addresses into file offsets.
pub struct Module {
    pub path: PathBuf,
    pub markers: Vec<Marker>,
    /// Where its loadable segments lie, for file offsets.
    segments: Segments,
    symbols: Vec<(String, u64)>,
}

impl Module {
    pub fn read(path: &Path) -> Option<Module> {
        let data = fs::read(path).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let section = file.section_by_name(".note.stapsdt");
        let notes = section.and_then(|s| s.data().ok()).unwrap_or(&[]);
        let base = file.section_by_name(".stapsdt.base").map(|s| s.address());
        let segments = Segments::of(&file);
        let symbols = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter_map(|s| Some((s.name().ok()?.to_string(), s.address())))
            .collect();
        Some(Module { path: path.into(), markers: sdt::markers(notes, base), segments, symbols })
    }

    /// The file offset of link-time address `vaddr`.
    pub fn offset_of(&self, vaddr: u64) -> Option<u64> {
        self.segments.offset_of(vaddr)
    }

    /// The fetcharg and type of each argument of `m`, or why one cannot be read.
    pub fn arguments(&self, m: &Marker) -> Result<Vec<(String, String)>, String> {
        let args = sdt::parse_args(&m.args).map_err(|e| e.to_string())?;
        let rip = |symbol: Option<&str>, disp: i64| {
            let at = match symbol {
                Some(name) => self.symbols.iter().find(|(n, a)| n == name && *a != 0)?.1,
                // %rip is the address after the marker's 1-byte nop.
                None => m.pc + 1,
            };
            self.offset_of(at.wrapping_add(disp as u64))
        };
        args.iter()
            .enumerate()
            .map(|(i, a)| {
                a.fetcharg(rip).map(|f| (f, a.type_name())).map_err(|why| {
                    let spec = m.args.split_whitespace().nth(i).unwrap_or("");
                    format!("argument arg{} ({spec}) of {}:{} cannot be read: {why}", i + 1, m.provider, m.name)
                })
            })
            .collect()
    }
}

/// The modules the program loads at start-up: itself, then its `DT_NEEDED` closure in
/// breadth-first order, as the loader orders them.
pub fn startup_modules(program: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = vec![program.into()];
    let mut queue: VecDeque<PathBuf> = VecDeque::from([program.to_path_buf()]);
    while let Some(path) = queue.pop_front() {
        let Ok(data) = fs::read(&path) else { continue };
        let (needed, runpath) = dynamic(&data);
        let origin = path.parent().map(|p| p.display().to_string()).unwrap_or_default();
        let dirs: Vec<PathBuf> = runpath
            .iter()
            .flat_map(|r| r.split(':'))
            .map(|d| PathBuf::from(d.replace("$ORIGIN", &origin).replace("${ORIGIN}", &origin)))
            .chain(search_dirs())
            .collect();
        for name in needed {
            let found = dirs.iter().map(|d| d.join(&name)).find(|p| p.is_file());
            if let Some(p) = found.map(|p| fs::canonicalize(&p).unwrap_or(p)) {
                if !out.contains(&p) {
                    out.push(p.clone());
                    queue.push_back(p);
                }
            }
        }
    }
    out
}

/// `DT_NEEDED` names and `DT_RUNPATH`/`DT_RPATH` of an ELF64 file.
fn dynamic(data: &[u8]) -> (Vec<String>, Option<String>) {
    let mut needed = Vec::new();
    let mut runpath = None;
    let Ok(header) = object::elf::FileHeader64::<object::Endianness>::parse(data) else { return (needed, None) };
    let Ok(endian) = header.endian() else { return (needed, None) };
    let Ok(sections) = header.sections(endian, data) else { return (needed, None) };
    let Ok(Some((dyns, link))) = sections.dynamic(endian, data) else { return (needed, None) };
    let Ok(strings) = sections.strings(endian, data, link) else { return (needed, None) };
    for d in dyns {
        let text = || d.string(endian, strings).ok().map(|s| String::from_utf8_lossy(s).into_owned());
        match d.tag32(endian) {
            Some(object::elf::DT_NEEDED) => needed.extend(text()),
            Some(object::elf::DT_RUNPATH | object::elf::DT_RPATH) => runpath = text(),
            _ => {}
        }
    }
    (needed, runpath)
}

/// `LD_LIBRARY_PATH`, then the default directories of Debian's x86-64 loader.
fn search_dirs() -> Vec<PathBuf> {
    let env = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let defaults = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"];
    env.split(':').filter(|d| !d.is_empty()).chain(defaults).map(PathBuf::from).collect()
}

/// The file a MODULE names: a path as given, one of the start-up modules, or a library of
/// that name in the search directories (one the program may `dlopen`).
pub fn module_file(module: &str, startup: &[PathBuf]) -> Option<PathBuf> {
    if module.contains('/') {
        return Path::new(module).is_file().then(|| module.into());
    }
    let matches = |p: &Path| module_matches(&p.display().to_string(), module);
    if let Some(p) = startup.iter().find(|p| matches(p)) {
        return Some(p.clone());
    }
    for dir in search_dirs() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        let mut names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| matches(p)).collect();
        names.sort();
        if let Some(p) = names.into_iter().find(|p| p.is_file()) {
            return Some(p);
        }
    }
    None
}

/// The file a MODULE names for a probe of `program` (see [`module_file`]).
pub fn module_path(module: &str, program: &Path) -> Option<PathBuf> {
    module_file(module, &startup_modules(program))
}

/// Whether a definition names a USDT marker by name.
pub fn names_a_marker(text: &str) -> bool {
    def::parse(text).is_ok_and(|d| matches!(d.place, Place::Sdt { .. }))
}

/// When an `--events` file names a marker, every file's definitions join the `-e` ones (in
/// the order the runtime numbers them: `-e`, then each file's), to be translated with them.
pub fn inline_files(events: &mut Vec<String>, files: &mut Vec<PathBuf>) -> Result<(), Error> {
    let mut texts = Vec::with_capacity(files.len());
    for f in files.iter() {
        let text = fs::read_to_string(f).map_err(|source| Error::EventsFile { path: f.clone(), source })?;
        texts.push(text);
    }
    if !texts.iter().any(|t| def::file_lines(t).any(|(_, l)| names_a_marker(l))) {
        return Ok(());
    }
    for t in &texts {
        events.extend(def::file_lines(t).map(|(_, l)| l.to_string()));
    }
    files.clear();
    Ok(())
}

/// The `-e` definitions with each USDT marker by name replaced by the definitions of its
/// sites; the others unchanged (a definition that does not parse is left to the runtime,
/// which refuses it with its column).
pub fn translate(defs: &[String], program: &Path) -> Result<Vec<String>, Error> {
    let mut out = Vec::with_capacity(defs.len());
    let mut startup: Option<Vec<PathBuf>> = None;
    for text in defs {
        let Ok(d) = def::parse(text) else {
            out.push(text.clone());
            continue;
        };
        let Place::Sdt { module, provider, name } = &d.place else {
            out.push(text.clone());
            continue;
        };
        let refuse = |reason: String| Error::Usdt { def: text.clone(), reason };
        let startup = startup.get_or_insert_with(|| startup_modules(program));
        let files: Vec<PathBuf> = match module {
            Some(m) => vec![module_file(m, startup).ok_or_else(|| {
                refuse(format!("no module {m:?}: not the program, none of its libraries, no such library file"))
            })?],
            None => startup.clone(),
        };
        // The first module that has the marker (the program before its libraries).
        let mut found: Option<(Module, Vec<Marker>)> = None;
        let mut seen: Vec<String> = Vec::new();
        for f in &files {
            let Some(m) = Module::read(f) else { continue };
            for marker in &m.markers {
                let id = format!("{}:{}", marker.provider, marker.name);
                if !seen.contains(&id) {
                    seen.push(id);
                }
            }
            let sites: Vec<Marker> = m
                .markers
                .iter()
                .filter(|k| &k.provider == provider && glob(name.as_bytes(), k.name.as_bytes()))
                .cloned()
                .collect();
            if !sites.is_empty() {
                found = Some((m, sites));
                break;
            }
        }
        let Some((module, sites)) = found else {
            let whom = match module {
                Some(_) => files[0].display().to_string(),
                None => format!("{} or the libraries it loads", program.display()),
            };
            let close = closest(&format!("{provider}:{name}"), &seen);
            return Err(refuse(format!("no USDT marker {provider}:{name} in {whom}{close}")));
        };
        out.extend(site_definitions(text, &module, &sites).map_err(refuse)?);
    }
    Ok(out)
}

/// `(markers it has: a, b, c)`, the likeliest first, or nothing when it has none.
fn closest(wanted: &str, have: &[String]) -> String {
    if have.is_empty() {
        return " (it has no USDT markers)".into();
    }
    let mut ranked: Vec<&String> = have.iter().collect();
    let common = |s: &str| s.bytes().zip(wanted.bytes()).take_while(|(a, b)| a == b).count();
    ranked.sort_by_key(|s| std::cmp::Reverse(common(s)));
    let list: Vec<&str> = ranked.iter().take(8).map(|s| s.as_str()).collect();
    let more = if have.len() > 8 { ", ..." } else { "" };
    format!(" (markers it has: {}{more})", list.join(", "))
}

/// One definition per site: `p:GROUP/EVENT PATH:OFFSET(REF) FETCHARGS [if FILTER]`.
fn site_definitions(text: &str, module: &Module, sites: &[Marker]) -> Result<Vec<String>, String> {
    let words = def::words(text);
    let head = words[0].1;
    // `p:GRP/EVENT`, `p:EVENT`, `p:GRP/`: what the user named is kept.
    let (group, event) = match head.split_once(':') {
        Some((_, n)) => match n.split_once('/') {
            Some((g, e)) => (Some(g), (!e.is_empty()).then_some(e)),
            None => (None, Some(n)),
        },
        None => (None, None),
    };
    let rest: Vec<&str> = words[2..].iter().map(|&(_, w)| w).take_while(|&w| w != "if").collect();
    let filter = words.iter().find(|&&(_, w)| w == "if").map(|&(at, _)| &text[at..]);
    let mut out = Vec::new();
    let mut used: Vec<String> = Vec::new();
    for m in sites {
        let base = match event {
            Some(e) if !sites.iter().any(|o| o.name != m.name) => e.to_string(),
            _ => def::sanitize(&m.name),
        };
        let mut name = base.clone();
        let mut n = 0;
        while used.contains(&name) {
            n += 1;
            name = format!("{base}_{n}");
        }
        used.push(name.clone());
        let group = group.map_or_else(|| def::sanitize(&format!("sdt_{}", m.provider)), str::to_string);
        let offset = module
            .offset_of(m.pc)
            .ok_or(format!("marker {}:{} lies outside the file's segments", m.provider, m.name))?;
        let counter = match m.semaphore {
            0 => String::new(),
            s => format!("({:#x})", module.offset_of(s).ok_or("its semaphore lies outside the file's segments")?),
        };
        let args = module.arguments(m);
        let fetchargs: Vec<String> = if rest.is_empty() {
            args?.iter().enumerate().map(|(i, (f, t))| format!("arg{}={f}:{t}", i + 1)).collect()
        } else {
            let args = args.as_ref();
            let pick = |n: u32| args.ok().and_then(|a| a.get((n as usize).checked_sub(1)?).cloned());
            let count = args.map_or(0, Vec::len);
            rest.iter()
                .map(|w| {
                    sdt::substitute(w, pick).map_err(|n| match &args {
                        Err(why) if n as usize <= m.args.split_whitespace().count() => why.to_string(),
                        _ => format!(
                            "marker {}:{} has {count} arguments (arg1..arg{count}), not arg{n}",
                            m.provider, m.name
                        ),
                    })
                })
                .collect::<Result<_, _>>()?
        };
        let path = module.path.display().to_string();
        if path.contains(char::is_whitespace) {
            return Err(format!("{path}: a path with blanks cannot be written in a definition"));
        }
        let mut fetchargs = fetchargs;
        if let (Some(f), false) = (filter, rest.is_empty()) {
            // A filter on a marker argument the fetchargs do not name brings it in as a field.
            let named: Vec<String> = rest
                .iter()
                .enumerate()
                .map(|(i, w)| match w.split_once('=') {
                    Some((n, _)) if !n.is_empty() && !n.contains('(') => n.to_string(),
                    _ => format!("arg{}", i + 1),
                })
                .collect();
            for n in 1..=m.args.split_whitespace().count() {
                let field = format!("arg{n}");
                let mentioned = f.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(|w| w == field);
                if mentioned && !named.contains(&field) {
                    let (fetch, ty) = module.arguments(m)?.swap_remove(n - 1);
                    fetchargs.push(format!("{field}={fetch}:{ty}"));
                }
            }
        }
        let mut line = format!("p:{group}/{name} {path}:{offset:#x}{counter}");
        for f in fetchargs {
            line.push(' ');
            line.push_str(&f);
        }
        if let Some(f) = filter {
            line.push(' ');
            line.push_str(f);
        }
        out.push(line);
    }
    Ok(out)
}
