//! A variable access as `perf probe` writes it, `[NAME=]VAR{->FIELD|.FIELD|[N]}[:TYPE]`, and
//! its translation into a fetcharg with the function's types. Pure: the parse is text in,
//! steps out; the translation reads only the [`Function`](super::Function) found.

use gimli::UnitOffset;

use super::location::{memory, Loc};
use super::types::{Table, Ty};

/// A variable available at an address: its name, its type's name and its place.
#[derive(Clone, Debug)]
pub struct Variable {
    pub name: String,
    pub type_name: String,
    /// Whether it is a parameter (`$params`) or a local.
    pub param: bool,
    /// Its place at the address, or why it cannot be read there.
    pub loc: Result<Loc, String>,
    pub ty: Option<UnitOffset>,
}

/// One step from a value to a part of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `->FIELD`: through a pointer.
    Arrow(String),
    /// `.FIELD`: in place.
    Dot(String),
    /// `[N]`: an element of an array, or through a pointer.
    Index(u64),
}

/// `[NAME=]VAR{STEP}[:TYPE]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    pub name: Option<String>,
    pub var: String,
    pub steps: Vec<Step>,
    pub ty: Option<String>,
}

fn ident(s: &str) -> usize {
    s.bytes()
        .enumerate()
        .take_while(|&(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()))
        .count()
}

/// Whether a fetcharg's body names a DWARF variable (or `$params`, `$vars`).
pub fn is_dwarf(word: &str) -> bool {
    let body = match word.split_once('=') {
        Some((n, b)) if ident(n) == n.len() && !n.is_empty() => b,
        _ => word,
    };
    body.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') || body == "$params" || body == "$vars"
}

impl Access {
    /// Parses an access, or says what is wrong.
    pub fn parse(word: &str) -> Result<Access, String> {
        let (name, body) = match word.split_once('=') {
            Some((n, b)) if ident(n) == n.len() && !n.is_empty() => (Some(n.to_string()), b),
            _ => (None, word),
        };
        let (body, ty) = match body.split_once(':') {
            Some((b, t)) => (b, Some(t.to_string())),
            None => (body, None),
        };
        let n = ident(body);
        if n == 0 {
            return Err(format!("'{word}': a variable name first"));
        }
        let (var, mut rest) = (body[..n].to_string(), &body[n..]);
        let mut steps = Vec::new();
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("->").or_else(|| rest.strip_prefix('.')) {
                let arrow = rest.starts_with("->");
                let n = ident(r);
                if n == 0 {
                    return Err(format!("'{word}': a field name after {}", if arrow { "->" } else { "." }));
                }
                steps.push(if arrow { Step::Arrow(r[..n].into()) } else { Step::Dot(r[..n].into()) });
                rest = &r[n..];
            } else if let Some(r) = rest.strip_prefix('[') {
                let close = r.find(']').ok_or(format!("'{word}': ']' after the index"))?;
                let i = r[..close].parse().map_err(|_| format!("'{word}': a number from 0 in [...]"))?;
                steps.push(Step::Index(i));
                rest = &r[close + 1..];
            } else {
                return Err(format!("'{word}': ->FIELD, .FIELD or [N] after {var}, not {rest:?}"));
            }
        }
        Ok(Access { name, var, steps, ty })
    }

    /// The event field's name: as given, else the last name written (`perf probe` names
    /// `b->data` `data`).
    pub fn field_name(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        let mut last = self.var.clone();
        for s in &self.steps {
            if let Step::Arrow(f) | Step::Dot(f) = s {
                last = f.clone();
            }
        }
        last
    }
}

/// The fetcharg (`NAME=FETCH:TYPE`) of `a` at the function whose variables are `vars`.
pub fn fetcharg(a: &Access, vars: &[Variable], types: &Table, func: &str) -> Result<String, String> {
    // The innermost of the same name: the variables come outer scope first.
    let var = vars.iter().rev().find(|v| v.name == a.var).ok_or_else(|| {
        let names: Vec<&str> = vars.iter().map(|v| v.name.as_str()).collect();
        format!(
            "no variable {} at {func} (it has: {})",
            a.var,
            if names.is_empty() { "none".into() } else { names.join(", ") }
        )
    })?;
    let mut loc = var.loc.clone().map_err(|why| format!("{} cannot be read at {func}: {why}", a.var))?;
    let mut ty = var.ty;
    let mut bits = None;
    let mut path = a.var.clone();
    for step in &a.steps {
        if bits.is_some() {
            return Err(format!("{path} is a bitfield: nothing to take from it"));
        }
        let t = types.strip(ty);
        let (base, field) = match (step, t) {
            (Step::Arrow(f), Some(Ty::Pointer { to })) => {
                path = format!("{path}->{f}");
                (loc.pointee().map(|p| Loc::Mem(p, 0)), (f, *to))
            }
            (Step::Dot(f), Some(Ty::Struct { .. })) => {
                path = format!("{path}.{f}");
                (Some(loc.clone()), (f, ty))
            }
            (Step::Index(i), Some(Ty::Array { elem, count })) => {
                if count.is_some_and(|c| *i >= c) {
                    return Err(format!("{path}[{i}]: {path} has {} elements", count.unwrap_or(0)));
                }
                let size = types.size(*elem).ok_or(format!("{path}: elements of unknown size"))?;
                path = format!("{path}[{i}]");
                loc = index(&loc, (*i * size) as i64, &path)?;
                ty = *elem;
                continue;
            }
            (Step::Index(i), Some(Ty::Pointer { to })) => {
                let size = types.size(*to).ok_or(format!("{path}: points to a type of unknown size"))?;
                path = format!("{path}[{i}]");
                loc = match loc.pointee() {
                    Some(p) => Loc::Mem(p, (*i * size) as i64),
                    None => Loc::OptimizedOut,
                };
                ty = *to;
                continue;
            }
            (Step::Arrow(_), Some(Ty::Struct { .. })) => return Err(format!("{path} is a struct: use '.'")),
            (Step::Arrow(_), _) => return Err(format!("{path} (of type {}) is not a pointer", types.name(ty))),
            (Step::Dot(_), Some(Ty::Pointer { .. })) => return Err(format!("{path} is a pointer: use '->'")),
            (Step::Dot(_), _) => return Err(format!("{path} (of type {}) is not a struct", types.name(ty))),
            (Step::Index(_), _) => {
                return Err(format!("{path} (of type {}) is not an array or a pointer", types.name(ty)))
            }
        };
        let (f, sty) = field;
        let Some(Ty::Struct { members, .. }) = types.strip(sty) else {
            return Err(format!("{path}: {} is not a struct", types.name(sty)));
        };
        let m = members.iter().find(|m| &m.name == f).ok_or_else(|| {
            let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
            format!("no field {f} in {} (it has: {})", types.name(sty), names.join(", "))
        })?;
        loc = match base {
            None | Some(Loc::OptimizedOut) => Loc::OptimizedOut,
            Some(b) => index(&b, m.offset as i64, &path)?,
        };
        ty = m.ty;
        bits = m.bits;
    }
    let name = a.field_name();
    if loc == Loc::OptimizedOut {
        return Ok(format!("{name}=$optimized_out"));
    }
    let t = types.strip(ty);
    let fetch = loc.fetcharg();
    let typed = match (a.ty.as_deref(), t) {
        (Some("string" | "ustring"), Some(Ty::Pointer { .. })) => {
            let p = loc.pointee().ok_or(format!("{path}: no pointer to read"))?;
            format!("{}:string", memory(&p, 0))
        }
        (Some("string" | "ustring"), Some(Ty::Array { .. })) if matches!(loc, Loc::Mem(..)) => {
            format!("{fetch}:string")
        }
        (Some("string" | "ustring"), _) => {
            return Err(format!("{path} (of type {}): :string reads a char pointer or array", types.name(ty)))
        }
        (Some(user), _) => format!("{fetch}:{user}"),
        (None, _) if bits.is_some() => {
            let (w, off) = bits.unwrap_or((0, 0));
            if off == u8::MAX {
                return Err(format!("{path} is a bitfield described the old way (DW_AT_bit_offset)"));
            }
            let container = types.size(ty).unwrap_or(4) * 8;
            format!("{fetch}:b{w}@{off}/{container}")
        }
        (None, Some(t @ (Ty::Int { .. } | Ty::Enum { .. }))) => format!("{fetch}:{}", integer(t, None)),
        (None, Some(Ty::Pointer { .. })) => match loc.pointee().filter(|_| types.is_char_pointer(ty)) {
            // A `char *` is the text it points to; `:x64` written by hand gives the pointer.
            Some(p) => format!("{}:string", memory(&p, 0)),
            None => format!("{fetch}:x64"),
        },
        (None, Some(Ty::Array { elem, count: Some(n) })) if matches!(loc, Loc::Mem(..)) => match types.strip(*elem) {
            Some(Ty::Int { size: 1, .. }) => format!("{fetch}:string"),
            Some(t @ (Ty::Int { .. } | Ty::Enum { .. })) if *n <= 64 => format!("{fetch}:{}", integer(t, Some(*n))),
            Some(Ty::Pointer { .. }) if *n <= 64 => format!("{fetch}:x64[{n}]"),
            _ => return Err(format!("{path} (of type {}): name an element ({path}[0])", types.name(ty))),
        },
        (None, Some(Ty::Float { size: size @ (4 | 8) })) => format!("{fetch}:f{}", size * 8),
        (None, Some(Ty::Float { .. })) => {
            return Err(format!("{path} (of type {}): only float and double are read", types.name(ty)))
        }
        (None, Some(Ty::Struct { members, .. })) => {
            let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
            return Err(format!("{path} (of type {}): name a field ({})", types.name(ty), names.join(", ")));
        }
        (None, _) => return Err(format!("{path} (of type {}) has no value to show", types.name(ty))),
    };
    Ok(format!("{name}={typed}"))
}

/// The fetcharg of `$retval` (as `NAME=` when `name` is given) typed from the function's
/// return type `ret` (None: `void`), by the System V ABI: integers, enums and pointers in
/// %rax, `float` and `double` in %xmm0, a `char *` as the text it points to.
pub fn retval(name: Option<&str>, ret: Option<UnitOffset>, types: &Table, func: &str) -> Result<String, String> {
    let what = types.name(ret);
    let fetch = match types.strip(ret) {
        None if ret.is_none() => return Err(format!("{func} returns void: it has no $retval")),
        // A type DWARF does not describe (the assembler's `DW_TAG_unspecified_type` of a
        // function written in assembly): the kernel's `$retval`, a 64-bit word.
        None => "$retval".to_string(),
        Some(t @ (Ty::Int { size: 1 | 2 | 4 | 8, .. } | Ty::Enum { size: 1 | 2 | 4 | 8, .. })) => {
            format!("$retval:{}", integer(t, None))
        }
        Some(Ty::Pointer { .. }) if types.is_char_pointer(ret) => "+0($retval):string".to_string(),
        Some(Ty::Pointer { .. }) => "$retval:x64".to_string(),
        Some(Ty::Float { size: size @ (4 | 8) }) => format!("$retval:f{}", size * 8),
        Some(Ty::Float { .. }) => {
            return Err(format!(
                "{func} returns {what}, which is returned in %st0: probes do not read the x87 registers"
            ))
        }
        Some(Ty::Struct { size, .. }) if *size <= 16 => {
            return Err(format!(
                "{func} returns {what} by value ({size} bytes, in registers): $retval is one register; \
                 read the parts by hand (%ax, %dx, %xmm0, %xmm1)"
            ))
        }
        // Returned in memory the caller gave: %rax holds its address.
        Some(Ty::Struct { .. }) => "$retval:x64".to_string(),
        _ => return Err(format!("{func} returns {what}, which $retval cannot show")),
    };
    Ok(match name {
        Some(n) => format!("{n}={fetch}"),
        None => fetch,
    })
}

/// The fetcharg type of an integer or an enum (`s32`, `u8[4]`), an enum's with its
/// enumerators (`u32{RED=0,GREEN=5}`) so its values show by name, except an enum too big to
/// carry them (its values show as numbers).
fn integer(t: &Ty, count: Option<u64>) -> String {
    let (size, signed, values) = match t {
        Ty::Int { size: 1, boolean: true, .. } => {
            return format!("bool{}", count.map_or(String::new(), |n| format!("[{n}]")))
        }
        Ty::Int { size, signed, .. } => (*size, *signed, &[][..]),
        Ty::Enum { size, signed, values } => (*size, *signed, &values[..]),
        _ => return String::new(),
    };
    let mut out = format!("{}{}", if signed { 's' } else { 'u' }, u32::from(size) * 8);
    if let Some(n) = count {
        out.push_str(&format!("[{n}]"));
    }
    if !values.is_empty() && values.len() <= uprobe_contracts::fetch::MAX_ENUMERATORS {
        let items: Vec<String> = values.iter().map(|(n, v)| format!("{n}={v}")).collect();
        out.push_str(&format!("{{{}}}", items.join(",")));
    }
    out
}

/// `loc` moved `by` bytes: only a value in memory has parts at offsets.
fn index(loc: &Loc, by: i64, path: &str) -> Result<Loc, String> {
    match loc {
        Loc::Mem(a, off) => Ok(Loc::Mem(a.clone(), off + by)),
        Loc::OptimizedOut => Ok(Loc::OptimizedOut),
        Loc::Reg(r) if by == 0 && !r.starts_with("xmm") => Ok(Loc::Reg(r)),
        Loc::Reg(r) => Err(format!("{path}: the value is in %{r}, not in memory, so its parts have no address")),
        Loc::Const(_) => Err(format!("{path}: the value is a constant, not in memory")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_parse() {
        let a = Access::parse("d=b->data:string").unwrap();
        assert_eq!(a.name.as_deref(), Some("d"));
        assert_eq!(a.var, "b");
        assert_eq!(a.steps, vec![Step::Arrow("data".into())]);
        assert_eq!(a.ty.as_deref(), Some("string"));
        let a = Access::parse("b->in.s").unwrap();
        assert_eq!(a.steps, vec![Step::Arrow("in".into()), Step::Dot("s".into())]);
        assert_eq!(a.field_name(), "s");
        let a = Access::parse("b->arr[2]").unwrap();
        assert_eq!(a.steps, vec![Step::Arrow("arr".into()), Step::Index(2)]);
        assert_eq!(a.field_name(), "arr");
        assert!(Access::parse("b->").unwrap_err().contains("a field name after ->"));
        assert!(Access::parse("b[x]").unwrap_err().contains("a number"));
        assert!(Access::parse("b+1").unwrap_err().contains("->FIELD"));
    }

    #[test]
    fn dwarf_words_are_told_from_fetchargs() {
        for w in ["len", "n=b->len", "$params", "$vars", "_x", "s=b->data:string"] {
            assert!(is_dwarf(w), "{w}");
        }
        for w in ["%di", "x=%di:u32", "+8(%di)", "$retval", "@0x10", "\\3", "c=$comm", "$arg1"] {
            assert!(!is_dwarf(w), "{w}");
        }
    }
}
