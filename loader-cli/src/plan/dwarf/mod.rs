//! DWARF variables by name at a function's entry (`-e 'p prog:parse len b->data:string'`) and
//! its return (`$retval`), as `perf probe` takes them, translated before the program starts
//! into the fetcharg language the runtime reads (`%si:s32`, `+0(+8(%di)):string`), as [`usdt`]
//! translates markers. The debug information is the program's own or its separate debug file
//! (`/usr/lib/debug/.build-id/xx/rest.debug`, `.gnu_debuglink`).
//!
//! A value is read where the variable's location (or location list) says it is at the
//! probe's address; a variable no location covers there is `$optimized_out`, never a guess.
//!
//! [`usdt`]: super::usdt

mod access;
mod dies;
mod location;
mod types;
mod units;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use gimli::{EndianSlice, LittleEndian, UnitOffset, UnwindSection};
use object::{Object, ObjectSection, ObjectSymbol};
use uprobe_contracts::def::{self, Kind, Place};

use crate::base::elf::Segments;
use crate::base::error::Error;
use crate::plan::debugfile;
pub use access::Variable;
use dies::{closest, collect, entry_pc, expression_at, name, ops, type_of};
pub use location::Loc;
use types::Table;
use units::{Unit, Units};

type R<'a> = EndianSlice<'a, LittleEndian>;

/// A module's debug information, loaded.
pub struct Module {
    /// Where the DWARF was read from (the module, or its separate debug file).
    pub debug_path: PathBuf,
    sections: HashMap<gimli::SectionId, Vec<u8>>,
    /// `.eh_frame` of the module: (its address, its bytes).
    eh_frame: Option<(u64, Vec<u8>)>,
    /// Where its loadable segments lie, for file offsets.
    segments: Segments,
    /// The names of the functions its own symbol tables define, where a probe is placed by
    /// name (a stripped program has only its exported ones).
    symbols: HashSet<String>,
}

impl Module {
    /// The debug information of `path`, or why there is none.
    pub fn load(path: &Path) -> Result<Module, String> {
        let data = fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file = object::File::parse(&*data).map_err(|e| format!("{}: not an ELF file ({e})", path.display()))?;
        let segments = Segments::of(&file);
        let symbols = file
            .dynamic_symbols()
            .chain(file.symbols())
            .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
            .filter_map(|s| s.name().ok().map(str::to_string))
            .collect();
        let eh_frame = file.section_by_name(".eh_frame").and_then(|s| Some((s.address(), s.data().ok()?.to_vec())));
        let (debug_path, sections) = match file.section_by_name(".debug_info") {
            Some(_) => (path.to_path_buf(), sections_of(&file)?),
            None => {
                let debug = debugfile::separate(&file, path).ok_or_else(|| {
                    format!(
                        "{} has no DWARF debug information (built without -g, or stripped; no debug file in /usr/lib/debug)",
                        path.display()
                    )
                })?;
                let bytes = fs::read(&debug).map_err(|e| format!("{}: {e}", debug.display()))?;
                let dfile = object::File::parse(&*bytes).map_err(|e| format!("{}: {e}", debug.display()))?;
                (debug.clone(), sections_of(&dfile)?)
            }
        };
        Ok(Module { debug_path, sections, eh_frame, segments, symbols })
    }

    fn dwarf(&self) -> gimli::Dwarf<R<'_>> {
        let load = |id: gimli::SectionId| -> Result<R<'_>, gimli::Error> {
            Ok(EndianSlice::new(self.sections.get(&id).map_or(&[][..], |v| &v[..]), LittleEndian))
        };
        gimli::Dwarf::load(load).expect("loading from memory cannot fail")
    }

    fn units(&self) -> Result<Units<'_>, String> {
        Units::new(self.dwarf())
    }

    /// The file offset of link-time address `vaddr`.
    pub fn offset_of(&self, vaddr: u64) -> Option<u64> {
        self.segments.offset_of(vaddr)
    }

    /// The CFA at `pc` as a register and an offset, from `.eh_frame`.
    fn cfa(&self, pc: u64) -> Result<(&'static str, i64), String> {
        let (addr, bytes) =
            self.eh_frame.as_ref().ok_or("the module has no .eh_frame to find the frame at the probe")?;
        let eh = gimli::EhFrame::new(bytes, LittleEndian);
        let bases = gimli::BaseAddresses::default().set_eh_frame(*addr);
        let mut ctx = Box::new(gimli::UnwindContext::new());
        let row = eh
            .unwind_info_for_address(&bases, &mut ctx, pc, gimli::EhFrame::cie_from_offset)
            .map_err(|e| format!("no call frame information at {pc:#x} ({e})"))?;
        match row.cfa() {
            gimli::CfaRule::RegisterAndOffset { register, offset } => Ok((location::general(*register)?, *offset)),
            gimli::CfaRule::Expression(_) => Err(format!("the frame at {pc:#x} is given by an expression")),
        }
    }

    /// The names of the functions with code in this module (for a refusal).
    fn function_names(&self) -> Vec<String> {
        let Ok(units) = self.units() else { return Vec::new() };
        let mut out = Vec::new();
        for unit in units.iter() {
            let mut entries = unit.entries();
            while let Ok(Some((_, e))) = entries.next_dfs() {
                if e.tag() == gimli::DW_TAG_subprogram && entry_pc(&units.dwarf, unit, e).is_some() {
                    if let Some(n) = name(&units, unit, e) {
                        out.push(n);
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The function named `func`, with the variables available `offset` bytes into it.
    pub fn function(&self, func: &str, offset: u64) -> Result<Function, String> {
        let units = self.units()?;
        for unit in units.iter() {
            let mut entries = unit.entries();
            while let Some((_, e)) = entries.next_dfs().map_err(|e| e.to_string())? {
                if e.tag() != gimli::DW_TAG_subprogram || name(&units, unit, e).as_deref() != Some(func) {
                    continue;
                }
                let Some(entry) = entry_pc(&units.dwarf, unit, e) else { continue };
                return self.function_at(&units, unit, e.offset(), func, entry, entry + offset);
            }
        }
        let names = self.function_names();
        Err(format!(
            "no function {func} in the DWARF of {}{}",
            self.debug_path.display(),
            closest(func, &names, "functions it has")
        ))
    }

    /// The variables available at link-time address `pc` of this module, in the function
    /// whose code covers it (for line places and `--vars FUNC:LINE`).
    pub fn variables_at(&self, pc: u64) -> Result<Function, String> {
        let units = self.units()?;
        for unit in units.iter() {
            let mut entries = unit.entries();
            while let Some((_, e)) = entries.next_dfs().map_err(|e| e.to_string())? {
                if e.tag() != gimli::DW_TAG_subprogram {
                    continue;
                }
                let Some(entry) = entry_pc(&units.dwarf, unit, e) else { continue };
                let mut ranges = units.dwarf.die_ranges(unit, e).map_err(|e| e.to_string())?;
                let mut inside = false;
                while let Ok(Some(r)) = ranges.next() {
                    inside |= r.begin <= pc && pc < r.end;
                }
                if inside {
                    let func = name(&units, unit, e).unwrap_or_default();
                    return self.function_at(&units, unit, e.offset(), &func, entry, pc);
                }
            }
        }
        Err(format!("no function's code covers {pc:#x} in the DWARF of {}", self.debug_path.display()))
    }

    fn function_at<'a>(
        &self,
        units: &Units<'a>,
        unit: &Unit<'a>,
        at: UnitOffset,
        func: &str,
        entry: u64,
        pc: u64,
    ) -> Result<Function, String> {
        let dwarf = &units.dwarf;
        let die = unit.entry(at).map_err(|e| e.to_string())?;
        let frame_ops = match die.attr_value(gimli::DW_AT_frame_base).ok().flatten() {
            Some(gimli::AttributeValue::Exprloc(e)) => ops(&e, unit.encoding()),
            _ => Vec::new(),
        };
        let frame_base = location::frame_base(&frame_ops, self.cfa(pc)).and_then(|fb| {
            // Without optimization, the frame pointer and the parameters' stack slots are set
            // up by the prologue: at the entry they hold what was there before.
            match pc == entry && fb.0 != "sp" {
                true => Err(format!(
                    "at the entry of {func}, its frame base (%{}) is not set up yet (a program built without optimization)",
                    fb.0
                )),
                false => Ok(fb),
            }
        });
        let file_offset = |a: u64| self.offset_of(a);
        let mut vars = Vec::new();
        let mut tree = unit.entries_tree(Some(at)).map_err(|e| e.to_string())?;
        collect(units, unit, tree.root().map_err(|e| e.to_string())?, pc, &mut vars)?;
        let mut types = Table::read(dwarf, unit);
        // A link-time optimized function's variables, its return type, and their types'
        // parts may be typed in the units it was compiled from: those are read too.
        let mut read = vec![unit.header.offset()];
        let mut wanted: Vec<UnitOffset> = vars.iter().filter_map(|v| v.2).collect();
        wanted.extend(type_of(units, unit, at));
        while !wanted.is_empty() {
            for at in std::mem::take(&mut wanted) {
                let Some((u, _)) = units.holding(at.0).filter(|_| !types.has(at)) else { continue };
                if !read.contains(&u.header.offset()) {
                    read.push(u.header.offset());
                    types.add(dwarf, u);
                    wanted = types.missing();
                }
            }
        }
        let variables = vars
            .into_iter()
            .map(|(name, param, ty, attr, konst)| {
                let size = types.size(ty).unwrap_or(8);
                let cx = location::Context {
                    frame_base: frame_base.clone(),
                    at_entry: pc == entry,
                    file_offset: &file_offset,
                    size,
                };
                let loc = match (attr, konst) {
                    (Some(attr), _) => match expression_at(dwarf, unit, attr, pc) {
                        Ok(Some(e)) => {
                            let inner = |r: &R<'a>| Some(ops(&gimli::Expression(*r), unit.encoding()));
                            location::place(&ops(&e, unit.encoding()), &cx, &inner)
                        }
                        Ok(None) => Ok(Loc::OptimizedOut),
                        Err(e) => Err(e),
                    },
                    (None, Some(v)) => Ok(Loc::Const(v)),
                    (None, None) => Ok(Loc::OptimizedOut),
                };
                Variable { name, type_name: types.name(ty), param, loc, ty }
            })
            .collect();
        Ok(Function { name: func.into(), entry, variables, ret: type_of(units, unit, at), types })
    }
}

/// A function found, with its variables at the probe.
pub struct Function {
    pub name: String,
    /// The link-time address of its entry.
    pub entry: u64,
    pub variables: Vec<Variable>,
    /// Its return type (None: `void`).
    ret: Option<UnitOffset>,
    types: Table,
}

/// The sections of DWARF, uncompressed.
fn sections_of(file: &object::File<'_>) -> Result<HashMap<gimli::SectionId, Vec<u8>>, String> {
    let mut out = HashMap::new();
    for id in [
        gimli::SectionId::DebugAbbrev,
        gimli::SectionId::DebugAddr,
        gimli::SectionId::DebugInfo,
        gimli::SectionId::DebugLine,
        gimli::SectionId::DebugLineStr,
        gimli::SectionId::DebugLoc,
        gimli::SectionId::DebugLocLists,
        gimli::SectionId::DebugRanges,
        gimli::SectionId::DebugRngLists,
        gimli::SectionId::DebugStr,
        gimli::SectionId::DebugStrOffsets,
    ] {
        if file.section_by_name(id.name()).is_some() {
            out.insert(id, debugfile::section(file, id.name())?.into_owned());
        }
    }
    Ok(out)
}

/// The fetcharg words of a definition (after WHERE, before `if`).
fn fetch_words(text: &str) -> Vec<&str> {
    def::words(text).into_iter().skip(2).map(|(_, w)| w).take_while(|&w| w != "if").collect()
}

/// Whether a definition names DWARF variables.
pub fn names_variables(text: &str) -> bool {
    fetch_words(text).iter().any(|w| access::is_dwarf(w))
}

/// `$retval` written without a type (`$retval`, `NAME=$retval`): Some(NAME given).
fn untyped_retval(word: &str) -> Option<Option<&str>> {
    match word.split_once('=') {
        Some((n, "$retval")) => Some(Some(n)),
        None if word == "$retval" => Some(None),
        _ => None,
    }
}

/// Whether a definition is a return event at a function that reads `$retval` without a
/// type, which the function's DWARF (when it has some) types.
pub fn types_retval(text: &str) -> bool {
    let words = def::words(text);
    let [(_, head), (_, place), ..] = words.as_slice() else { return false };
    let at_function = def::parse(&format!("{head} {place}"))
        .is_ok_and(|p| p.kind == Kind::Return && matches!(p.place, Place::Symbol { .. }));
    at_function && fetch_words(text).iter().any(|w| untyped_retval(w).is_some())
}

/// Whether a definition is a plain probe at one named function (`p FUNC`, `r MODULE:FUNC`),
/// with no DWARF name to translate: placed by the DWARF only where the module's symbols do
/// not name the function (see [`placed`]).
pub fn plain_function(text: &str) -> bool {
    let words = def::words(text);
    let [(_, head), (_, place), ..] = words.as_slice() else { return false };
    def::parse(&format!("{head} {place}"))
        .is_ok_and(|p| matches!(&p.place, Place::Symbol { name, .. } if !def::is_glob(name)))
}

/// Whether `path`'s symbol tables define function `name` (None: the file cannot be read).
fn names_function(path: &Path, name: &str) -> Option<bool> {
    let data = fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let defines = |s: &object::Symbol| {
        s.is_definition() && s.kind() == object::SymbolKind::Text && s.name_bytes().ok() == Some(name.as_bytes())
    };
    Some(file.dynamic_symbols().any(|s| defines(&s)) || file.symbols().any(|s| defines(&s)))
}

/// The definitions with each DWARF name replaced by its fetcharg, and `$retval` typed from
/// the function's return type where the DWARF has the function; the others unchanged.
/// `program` is where a function without a MODULE is looked up.
pub fn translate(defs: &[String], program: &Path) -> Result<Vec<String>, Error> {
    let mut loaded: HashMap<PathBuf, Module> = HashMap::new();
    let mut out = Vec::with_capacity(defs.len());
    for text in defs {
        let names = names_variables(text);
        let plain = !names && !types_retval(text) && plain_function(text);
        if !names && !types_retval(text) && !plain {
            out.push(text.clone());
            continue;
        }
        // `$retval` alone stays the kernel's x64 where no DWARF tells its type.
        let keep = !names;
        let refuse = |reason: String| Error::Usdt { def: text.clone(), reason };
        let words = def::words(text);
        let (head, place) = match words.as_slice() {
            [(_, h), (_, p), ..] => (*h, *p),
            _ => return Err(refuse("p FUNC, then the variables".into())),
        };
        let probe = def::parse(&format!("{head} {place}")).map_err(|e| refuse(e.to_string()))?;
        let Place::Symbol { module, name, offset } = &probe.place else {
            return Err(refuse("DWARF variables are read at a function: WHERE is FUNC[+OFFSET] or MODULE:FUNC".into()));
        };
        if def::is_glob(name) && keep {
            out.push(text.clone());
            continue;
        }
        if def::is_glob(name) {
            return Err(refuse(format!("DWARF variables are read at one function, not a glob ({name})")));
        }
        let file = match (module, keep) {
            (None, _) => program.to_path_buf(),
            (Some(m), _) => match super::usdt::module_path(m, program) {
                Some(f) => f,
                None if keep => {
                    out.push(text.clone());
                    continue;
                }
                None => return Err(refuse(format!("no module {m:?}: not the program, none of its libraries"))),
            },
        };
        if plain {
            // A function the symbols name is placed by them, as always; only one they do
            // not name (static in a stripped program) is looked for in the DWARF.
            if names_function(&file, name) != Some(false) {
                out.push(text.clone());
                continue;
            }
        }
        if !loaded.contains_key(&file) {
            match Module::load(&file) {
                Ok(m) => loaded.insert(file.clone(), m),
                Err(_) if keep => {
                    out.push(text.clone());
                    continue;
                }
                Err(why) => return Err(refuse(why)),
            };
        }
        let m = &loaded[&file];
        let f = match m.function(name, *offset) {
            Ok(f) => f,
            Err(_) if keep => {
                out.push(text.clone());
                continue;
            }
            Err(why) => return Err(refuse(why)),
        };
        let args = fetchargs(text, &f, &f.name, probe.kind == Kind::Return).map_err(&refuse)?;
        let line = with_args(text, &placed(m, &file, &probe, head, place, &f, *offset).map_err(&refuse)?, &args);
        out.push(line);
    }
    Ok(out)
}

/// `HEAD WHERE` of a function found in the DWARF: as written where the module's symbols name
/// it, else its file offset, named as the function (a static function of a stripped program,
/// or one whose symbol link-time optimization renamed, `list_append.lto_priv.0`).
fn placed(
    m: &Module,
    file: &Path,
    probe: &def::Definition,
    head: &str,
    place: &str,
    f: &Function,
    offset: u64,
) -> Result<String, String> {
    if m.symbols.contains(&f.name) {
        return Ok(format!("{head} {place}"));
    }
    let at = m.offset_of(f.entry + offset).ok_or_else(|| format!("{} lies outside the file's segments", f.name))?;
    let shown = file.display().to_string();
    if shown.contains(char::is_whitespace) {
        return Err(format!("{shown}: a path with blanks cannot be written in a definition"));
    }
    let head = match (&probe.event, head.ends_with('/')) {
        (Some(_), _) => head.to_string(),
        (None, true) => format!("{head}{}", probe.default_name(None)),
        (None, false) => format!("{head}:{}", probe.default_name(None)),
    };
    Ok(format!("{head} {shown}:{at:#x}"))
}

/// The fetchargs of a definition's words after WHERE: each DWARF name translated with the
/// variables of `f` (`at` names the place in a refusal), the others kept.
pub fn fetchargs(text: &str, f: &Function, at: &str, ret: bool) -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    for w in fetch_words(text) {
        if let Some(name) = untyped_retval(w).filter(|_| ret) {
            args.push(access::retval(name, f.ret, &f.types, at)?);
            continue;
        }
        if !access::is_dwarf(w) {
            args.push(w.to_string());
            continue;
        }
        if ret {
            return Err(format!("{w}: at a return only $retval can be read (the parameters' registers are not kept)"));
        }
        let body = w.split_once('=').map_or(w, |(_, b)| b);
        match body {
            "$params" | "$vars" => {
                for v in f.variables.iter().filter(|v| v.param || body == "$vars") {
                    let a = access::Access { name: None, var: v.name.clone(), steps: Vec::new(), ty: None };
                    // Those that cannot be shown (a struct by value, a float) are left out, as
                    // `perf probe` leaves them.
                    if let Ok(arg) = access::fetcharg(&a, &f.variables, &f.types, at) {
                        args.push(arg);
                    }
                }
            }
            _ => {
                let a = access::Access::parse(w)?;
                args.push(access::fetcharg(&a, &f.variables, &f.types, at)?);
            }
        }
    }
    Ok(args)
}

/// `HEAD WHERE`, then `args`, then the definition's filter (`if ...`) as written.
pub fn with_args(text: &str, head_where: &str, args: &[String]) -> String {
    let mut line = head_where.to_string();
    for a in args {
        line.push(' ');
        line.push_str(a);
    }
    if let Some(&(at, _)) = def::words(text).iter().find(|&&(_, w)| w == "if") {
        line.push(' ');
        line.push_str(&text[at..]);
    }
    line
}

/// `--vars FUNC[+OFFSET]`: the variables available there, as `perf probe -V` shows them.
pub fn list(place: &str, program: &Path) -> Result<String, String> {
    let (module, func) = match place.rsplit_once(':') {
        Some((m, f)) => (Some(m), f),
        None => (None, place),
    };
    let (func, offset) = match func.split_once('+') {
        Some((f, o)) => (
            f,
            uprobe_contracts::fetch::number(o).filter(|&v| v >= 0).ok_or(format!("{place}: an offset after '+'"))?
                as u64,
        ),
        None => (func, 0),
    };
    let file = match module {
        None => program.to_path_buf(),
        Some(m) => super::usdt::module_path(m, program)
            .ok_or(format!("no module {m:?}: not the program, none of its libraries"))?,
    };
    let m = Module::load(&file)?;
    let f = m.function(func, offset)?;
    Ok(format!("Available variables at {func}\n{}", shown(&f, offset)))
}

/// `\t@<FUNC+OFFSET>` and a line for each variable available there (its type, name and
/// fetcharg, or why it cannot be read), as `perf probe -V` shows a probe point.
pub fn shown(f: &Function, offset: u64) -> String {
    let mut out = format!("\t@<{}+{offset}>\n", f.name);
    for v in &f.variables {
        let access = access::Access { name: None, var: v.name.clone(), steps: Vec::new(), ty: None };
        let note = match (&v.loc, access::fetcharg(&access, &f.variables, &f.types, &f.name)) {
            (Ok(Loc::OptimizedOut), _) => "\t(optimized out)".to_string(),
            (Err(why), _) => format!("\t(cannot be read: {why})"),
            (_, Ok(arg)) => format!("\t{}", arg.split_once('=').map_or("", |(_, f)| f)),
            (_, Err(why)) => format!("\t({why})"),
        };
        out.push_str(&format!("\t\t{}\t{}{note}\n", v.type_name, v.name));
    }
    out
}
