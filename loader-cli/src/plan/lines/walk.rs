//! Which lines have code, and where, as `perf probe` decides it (tools/perf/util/dwarf-aux.c
//! `die_walk_lines`, probe-finder.c): the line table's statement rows, plus each function's
//! declared line at its entry and each inlined call's line at the call's entry. A line whose
//! address belongs to another line (the first statement row at that address, or a function's
//! declared line at its entry) is not that line's: perf refuses it, and so do we.
//!
//! Pure: the unit's tables in, lists of `(file, line, address)` out.

use super::debug::{FileLine, Func, Unit};

/// `(file, line, address)` as the walk finds them.
pub type Spot = (usize, u32, u64);

/// Every line of a unit with its addresses (`die_walk_lines` on a compilation unit).
pub fn unit_lines(unit: &Unit) -> Vec<Spot> {
    let mut out: Vec<Spot> = unit.rows.iter().filter(|r| r.stmt).map(|r| (r.file, r.line, r.addr)).collect();
    for f in &unit.funcs {
        func_lines(f, true, &mut out);
    }
    out
}

/// The lines of one function, without those of the functions inlined into it (the walk
/// `perf probe -L FUNC` makes).
pub fn function_lines(unit: &Unit, func: &Func) -> Vec<Spot> {
    let mut out = Vec::new();
    let Some((decl_file, decl_line)) = func.decl else { return out };
    for r in unit.rows.iter().filter(|r| r.stmt && func.contains(r.addr)) {
        // The innermost inlined call that covers the address.
        let inner = func
            .inlines
            .iter()
            .filter(|i| i.ranges.iter().any(|&(lo, hi)| lo <= r.addr && r.addr < hi))
            .max_by_key(|i| i.depth);
        if let Some(i) = inner {
            let at_call = i.call.is_some_and(|(f, l)| same_file(&unit.files[f], &unit.files[decl_file]) && l == r.line);
            let same_decl = i.decl.is_some_and(|(f, l)| f == decl_file && l == decl_line);
            if !at_call && !same_decl {
                continue;
            }
        }
        out.push((r.file, r.line, r.addr));
    }
    func_lines(func, false, &mut out);
    out
}

/// The declared line at the entry, and the inlined calls' lines at their entries (with
/// `recursive`, calls inlined into inlined calls too, and their declared lines).
fn func_lines(func: &Func, recursive: bool, out: &mut Vec<Spot>) {
    if let Some((file, line)) = func.decl {
        out.push((file, line, func.entry));
    }
    for i in &func.inlines {
        if !recursive && i.depth > 1 {
            continue;
        }
        let Some(entry) = i.entry else { continue };
        if let Some((file, line)) = i.call {
            out.push((file, line, entry));
        }
        if let (true, Some((file, line))) = (recursive, i.decl) {
            out.push((file, line, entry));
        }
    }
}

/// The line an address belongs to (perf's `cu_find_lineinfo`): a function's declared line
/// at its entry, else the first statement row at exactly that address (or the last row
/// before it, when that one is a statement).
pub fn line_of(unit: &Unit, addr: u64) -> Option<FileLine> {
    if let Some(f) = unit.funcs.iter().find(|f| f.contains(addr) && f.entry == addr) {
        return f.decl;
    }
    let upto = unit.rows.partition_point(|r| r.addr <= addr);
    let last = unit.rows.get(upto.checked_sub(1)?)?;
    if last.addr != addr {
        return last.stmt.then_some((last.file, last.line));
    }
    let first = unit.rows.partition_point(|r| r.addr < addr);
    unit.rows[first..upto].iter().find(|r| r.stmt).map(|r| (r.file, r.line))
}

/// Whether `spot`'s address is its own line's (perf lists and probes only such lines).
pub fn reversible(unit: &Unit, spot: Spot) -> Result<(), FileLine> {
    match line_of(unit, spot.2) {
        Some((f, l)) if same_file(&unit.files[f], &unit.files[spot.0]) && l != spot.1 => Err((f, l)),
        _ => Ok(()),
    }
}

/// Whether `perf probe -L` shows `spot`'s line as one a probe can go on: its address is
/// that line's, in that file (stricter than [`reversible`], which lets a line share its
/// address with another file's).
pub fn listed(unit: &Unit, spot: Spot) -> bool {
    match line_of(unit, spot.2) {
        Some((f, l)) => same_file(&unit.files[f], &unit.files[spot.0]) && l == spot.1,
        None => true,
    }
}

/// Whether the code at `addr` is `name`'s: the function it lies in, or a call inlined there
/// (perf's `find_best_scope` with a function named: a `FUNC:N` site elsewhere is dropped).
pub fn in_function(unit: &Unit, addr: u64, name: &str) -> bool {
    let covers = |ranges: &[(u64, u64)]| ranges.iter().any(|&(lo, hi)| lo <= addr && addr < hi);
    unit.funcs
        .iter()
        .filter(|f| f.contains(addr))
        .any(|f| f.name == name || f.inlines.iter().any(|i| i.name == name && covers(&i.ranges)))
}

/// Whether `a` and `b` name the same file as perf compares them (`strtailcmp`: one is a
/// tail of the other, `lines.c` matching `/src/lines.c`).
pub fn same_file(a: &str, b: &str) -> bool {
    a.ends_with(b) || b.ends_with(a)
}

#[cfg(test)]
mod tests {
    use super::super::debug::{Inline, Row};
    use super::*;

    /// A function at 0x10..0x40 declared on line 5 of file 0, a call to a function declared
    /// on line 1 inlined at 0x20..0x28 from line 7.
    fn unit() -> Unit {
        let row = |addr, line, stmt| Row { addr, file: 0, line, stmt };
        Unit {
            files: vec!["/src/a.c".into()],
            rows: vec![
                row(0x10, 6, true),
                row(0x18, 7, true),
                row(0x20, 7, true),
                row(0x20, 2, true),
                row(0x28, 8, true),
                row(0x28, 8, false),
                row(0x30, 9, false),
                row(0x38, 2, true),
            ],
            funcs: vec![Func {
                name: "f".into(),
                decl: Some((0, 5)),
                entry: 0x10,
                ranges: vec![(0x10, 0x40)],
                inlines: vec![Inline {
                    name: "g".into(),
                    depth: 1,
                    call: Some((0, 7)),
                    decl: Some((0, 1)),
                    entry: Some(0x20),
                    ranges: vec![(0x20, 0x28), (0x38, 0x40)],
                }],
            }],
            defs: vec![("f".into(), (0, 5)), ("g".into(), (0, 1))],
        }
    }

    #[test]
    fn an_address_belongs_to_its_first_statement_row_or_the_entry_to_the_declaration() {
        let u = unit();
        assert_eq!(line_of(&u, 0x10), Some((0, 5)));
        assert_eq!(line_of(&u, 0x20), Some((0, 7)));
        // Between rows: the last row before, when it is a statement (0x28's last is not).
        assert_eq!(line_of(&u, 0x1c), Some((0, 7)));
        assert_eq!(line_of(&u, 0x2c), None);
        assert_eq!(line_of(&u, 0x30), None);
        assert_eq!(reversible(&u, (0, 6, 0x10)), Err((0, 5)));
        assert_eq!(reversible(&u, (0, 2, 0x20)), Err((0, 7)));
        assert_eq!(reversible(&u, (0, 2, 0x38)), Ok(()));
        assert!(listed(&u, (0, 2, 0x38)) && !listed(&u, (0, 2, 0x20)) && listed(&u, (0, 9, 0x30)));
    }

    #[test]
    fn a_function_walk_skips_inlined_bodies_and_a_unit_walk_keeps_them() {
        let u = unit();
        let mut f = function_lines(&u, &u.funcs[0]);
        f.sort();
        assert_eq!(f, vec![(0, 5, 0x10), (0, 6, 0x10), (0, 7, 0x18), (0, 7, 0x20), (0, 7, 0x20), (0, 8, 0x28)]);
        let all = unit_lines(&u);
        assert!(all.contains(&(0, 2, 0x38)) && all.contains(&(0, 1, 0x20)));
        assert!(in_function(&u, 0x20, "g") && in_function(&u, 0x20, "f") && !in_function(&u, 0x18, "g"));
        assert!(same_file("/src/a.c", "a.c") && !same_file("/src/a.c", "b.c"));
    }
}
