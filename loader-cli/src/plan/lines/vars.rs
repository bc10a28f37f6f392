//! `--vars FUNC:LINE` and `--vars [MODULE:]FILE.c:LINE` (`perf probe -V FUNC:LINE`): the
//! variables available at each address of a source line, where they are there (location
//! lists and the frame taken at that address). Other places go to [`dwarf::list`].

use std::path::Path;

use super::{debug, line_addresses, parse_place, LinePlace};
use crate::plan::dwarf;

/// A `--vars` place that names a line: `MODULE:FUNC:N`, `[MODULE:]FILE.c:N`, or `FUNC:N`
/// (which `-e` reads as a module and an offset, but a function's name is never all digits).
pub fn line_place(place: &str) -> Option<(Option<&str>, LinePlace)> {
    if let Some(found) = parse_place(place) {
        return Some(found);
    }
    let (func, n) = place.rsplit_once(':')?;
    let ident = func.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && func.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let line = n.parse().ok().filter(|_| ident && n.bytes().all(|b| b.is_ascii_digit()))?;
    Some((None, LinePlace::Function { name: func.to_string(), line }))
}

/// The listing of `place` in `program` (or one of its modules), or why there is none.
pub fn list(place: &str, program: &Path) -> Result<String, String> {
    let Some((module, line)) = line_place(place) else {
        return dwarf::list(place, program);
    };
    let file = match module {
        None => program.to_path_buf(),
        Some(m) => crate::plan::usdt::module_path(m, program)
            .ok_or(format!("no module {m:?}: not the program, none of its libraries"))?,
    };
    let sites = line_addresses(&debug::load(&file)?, &line)?;
    let m = dwarf::Module::load(&file)?;
    let mut out = format!("Available variables at {line}\n");
    for site in &sites {
        let f = m.variables_at(site.addr)?;
        out.push_str(&dwarf::shown(&f, site.addr - f.entry));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_told_from_functions_and_offsets() {
        let func = |n: &str, l| Some(LinePlace::Function { name: n.into(), line: l });
        assert_eq!(line_place("classify:4").map(|p| p.1), func("classify", 4));
        assert_eq!(line_place("lines:classify:4"), Some((Some("lines"), func("classify", 4).unwrap())));
        let file = LinePlace::File { file: "lines.c".into(), line: 22 };
        assert_eq!(line_place("lines.c:22"), Some((None, file)));
        for not in ["classify", "classify+4", "lines:classify", "classify:0x4", "4:4", "libc.so.6:malloc"] {
            assert_eq!(line_place(not), None, "{not}");
        }
    }
}
