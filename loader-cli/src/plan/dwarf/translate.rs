//! Definitions that name DWARF things, translated: each variable, field or element by its
//! fetcharg at the function's entry, `$retval` by the function's return type, and a function
//! only the DWARF names placed at its file offset; every other definition as written.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSymbol};
use uprobe_contracts::def::{self, Kind, Place};

use super::{access, Function, Module};
use crate::base::error::Error;

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
            (Some(m), _) => match crate::plan::usdt::module_path(m, program) {
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
