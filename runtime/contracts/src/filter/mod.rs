//! Predicates in the kernel's event-filter grammar (`Documentation/trace/events.rst`, "Event
//! filtering"; `kernel/trace/trace_events_filter.c`), compiled by `uprobe-run` against an
//! event's fields into a [`Program`] that the runtime runs at each hit.
//!
//! ```text
//! EXPR := EXPR || EXPR | EXPR && EXPR | !EXPR | ( EXPR ) | FIELD OP VALUE
//! numbers:  == != < <= > >= &     (signed or unsigned as the field's type says)
//! strings:  == != ~               (~: a glob, "sq*", "*.db", "[ab]?")
//! ```
//!
//! `!` binds tightest, then `&&`, then `||`, as in the kernel. FIELD is one of the event's
//! fetchargs by name, `$retval` (return events), `comm`, `tid` (or `common_pid`) or `cpu`
//! (or `common_cpu`); a fetcharg of that name comes first. VALUE is a number (decimal, `0x`
//! hex, `0` octal, as `kstrtoll` reads it) or a string, quoted with `"` or `'` or a bare word.

mod program;

use thiserror::Error;

pub use program::{compare_string, glob, Field, Fields, Node, NumOp, Program, StrOp, MAX_NODES, MAX_STRING};

use crate::def::{Definition, Kind};
use crate::fetch::{Base, Fetch, Named};

/// What is wrong, and at which byte of the filter's text.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("at column {}: expected {what}", .at + 1)]
pub struct FilterError {
    /// The byte of the filter's text where the error is.
    pub at: usize,
    /// What was expected there.
    pub what: String,
}

/// What a field holds, for the comparisons it allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    /// A number read as unsigned (every type but `s` ones, and a signed bitfield).
    Unsigned,
    /// A number of a signed type (`s8`..`s64`, not a bitfield).
    Signed,
    /// A string (`string`, `ustring`, `$comm`, an immediate string; `comm`).
    String,
    /// An array fetcharg: no comparison takes it.
    Array,
    /// A floating-point number, or a value that is not there (`$optimized_out`): no
    /// comparison takes it either.
    Other,
}

/// A name a predicate may use on an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldInfo {
    /// The name the predicate uses.
    pub name: String,
    /// What a comparison on it reads.
    pub field: Field,
    /// What its value is.
    pub ty: FieldType,
    /// The type as the user wrote or got it (`u64`, `s32`, `string`), for messages.
    pub shown: String,
    /// The width of a number in bits (a bitfield's width): the range its constants must fit.
    pub bits: u8,
    /// Names a constant may give its value by (an enum's enumerators, `false` and `true` of
    /// a `bool`), each with the number a comparison takes.
    pub names: Vec<(String, u64)>,
}

/// The fields of events made from `def`: its fetchargs, `$retval` on a return event, and the
/// common fields. Return events do not carry their entry's fetchargs (a definition names
/// one probe; nothing pairs an `r:` event with a `p:` one).
pub fn fields_of(def: &Definition) -> Vec<FieldInfo> {
    let mut out = Vec::new();
    for (i, a) in def.args.iter().enumerate() {
        let ty = if a.ty.count.is_some() {
            FieldType::Array
        } else if a.ty.base == Base::Float || a.fetch == Fetch::OptimizedOut {
            FieldType::Other
        } else if a.ty.is_string() || matches!(a.fetch, Fetch::Comm | Fetch::ImmediateString(_)) {
            FieldType::String
        } else if a.ty.base == Base::Signed && a.ty.bitfield.is_none() {
            FieldType::Signed
        } else {
            FieldType::Unsigned
        };
        let bits = a.ty.bitfield.map_or(a.ty.size.saturating_mul(8), |b| b.width);
        let number = |v: u64| if ty == FieldType::Signed { a.ty.sign_extend(v) as u64 } else { v };
        let names = match (&a.named, ty) {
            (Some(Named::Enum(values)), FieldType::Signed | FieldType::Unsigned) => {
                values.iter().map(|(v, n)| (n.clone(), number(*v))).collect()
            }
            (Some(Named::Bool), FieldType::Unsigned) => vec![("false".into(), 0), ("true".into(), 1)],
            _ => Vec::new(),
        };
        out.push(FieldInfo { name: a.name.clone(), field: Field::Arg(i as u8), ty, shown: type_name(a), bits, names });
    }
    if def.kind == Kind::Return {
        // `$retval` is the value as a fetcharg of it types it, else a 64-bit word.
        let typed = def.args.iter().position(|a| a.fetch == Fetch::Retval && a.ty.count.is_none());
        let info = match typed {
            Some(i) => FieldInfo { name: "$retval".into(), ..out[i].clone() },
            None => FieldInfo {
                name: "$retval".into(),
                field: Field::Retval,
                ty: FieldType::Unsigned,
                shown: "x64".into(),
                bits: 64,
                names: Vec::new(),
            },
        };
        out.push(info);
    }
    for (name, field, ty, shown, bits) in [
        ("comm", Field::Comm, FieldType::String, "string", 0),
        ("tid", Field::Tid, FieldType::Signed, "s32", 32),
        ("common_pid", Field::Tid, FieldType::Signed, "s32", 32),
        ("cpu", Field::Cpu, FieldType::Unsigned, "u32", 32),
        ("common_cpu", Field::Cpu, FieldType::Unsigned, "u32", 32),
    ] {
        out.push(FieldInfo { name: name.into(), field, ty, shown: shown.into(), bits, names: Vec::new() });
    }
    out
}

fn type_name(a: &crate::fetch::FetchArg) -> String {
    let t = &a.ty;
    let base = match t.base {
        _ if t.bitfield.is_some() => format!("b{}", t.bitfield.map_or(0, |b| b.width)),
        Base::Unsigned => format!("u{}", t.size * 8),
        Base::Signed => format!("s{}", t.size * 8),
        Base::Hex => format!("x{}", t.size * 8),
        Base::Char => "char".into(),
        Base::String => "string".into(),
        Base::Symbol => "symbol".into(),
        Base::Float => format!("f{}", t.size * 8),
    };
    match (t.count, &a.fetch) {
        (Some(n), _) => format!("{base}[{n}]"),
        (None, Fetch::Comm | Fetch::ImmediateString(_)) => "string".into(),
        _ => base,
    }
}

/// Whether every comparison of `program` reads a field that `fields` has, of its kind: what
/// the runtime checks of a program it did not compile itself.
pub fn fits(program: &Program, fields: &[FieldInfo]) -> bool {
    program.nodes.iter().all(|n| match *n {
        Node::Num { field, signed, .. } => fields
            .iter()
            .any(|f| f.field == field && f.ty == if signed { FieldType::Signed } else { FieldType::Unsigned }),
        Node::Str { field, pattern, .. } => {
            usize::from(pattern) < program.patterns.len()
                && fields.iter().any(|f| f.field == field && f.ty == FieldType::String)
        }
        _ => true,
    })
}

#[derive(Clone, Debug, PartialEq)]
enum Tok<'a> {
    Word(&'a str),
    Str(Vec<u8>),
    Op(&'static str),
    Open,
    Close,
    Not,
    AndAnd,
    OrOr,
}

fn lex(text: &str) -> Result<Vec<(usize, Tok<'_>)>, FilterError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let err = |at: usize, what: &str| Err(FilterError { at, what: what.to_string() });
    while i < b.len() {
        let c = b[i];
        let two = b.get(i..i + 2).unwrap_or(&[]);
        let (tok, len) = match c {
            b' ' | b'\t' => {
                i += 1;
                continue;
            }
            b'(' => (Tok::Open, 1),
            b')' => (Tok::Close, 1),
            _ if two == b"&&" => (Tok::AndAnd, 2),
            _ if two == b"||" => (Tok::OrOr, 2),
            _ if two == b"==" => (Tok::Op("=="), 2),
            _ if two == b"!=" => (Tok::Op("!="), 2),
            _ if two == b"<=" => (Tok::Op("<="), 2),
            _ if two == b">=" => (Tok::Op(">="), 2),
            b'<' => (Tok::Op("<"), 1),
            b'>' => (Tok::Op(">"), 1),
            b'&' => (Tok::Op("&"), 1),
            b'~' => (Tok::Op("~"), 1),
            b'!' => (Tok::Not, 1),
            b'=' => return err(i, "'==' (a single '=' is not a comparison)"),
            b'|' => return err(i, "'||'"),
            b'"' | b'\'' => {
                let Some(end) = b[i + 1..].iter().position(|&q| q == c) else {
                    return err(b.len(), &format!("a closing {}", c as char));
                };
                let s = b[i + 1..i + 1 + end].to_vec();
                if s.len() > MAX_STRING {
                    return err(i, &format!("a string of at most {MAX_STRING} bytes"));
                }
                (Tok::Str(s), end + 2)
            }
            _ => {
                let end = b[i..]
                    .iter()
                    .position(|&c| {
                        matches!(c, b' ' | b'\t' | b'(' | b')' | b'=' | b'!' | b'<' | b'>' | b'&' | b'|' | b'~')
                    })
                    .map_or(b.len(), |n| i + n);
                (Tok::Word(&text[i..end]), end - i)
            }
        };
        out.push((i, tok));
        i += len;
    }
    Ok(out)
}

struct Parser<'a, 'f> {
    toks: Vec<(usize, Tok<'a>)>,
    pos: usize,
    end: usize,
    fields: &'f [FieldInfo],
    program: Program,
    depth: usize,
}

/// Parses `text` and compiles it against `fields` (see [`fields_of`]).
pub fn compile(text: &str, fields: &[FieldInfo]) -> Result<Program, FilterError> {
    let toks = lex(text)?;
    if toks.is_empty() {
        return Err(FilterError { at: 0, what: "an expression (FIELD OP VALUE)".into() });
    }
    let mut p = Parser { toks, pos: 0, end: text.trim_end().len(), fields, program: Program::default(), depth: 0 };
    p.or()?;
    if let Some((at, _)) = p.toks.get(p.pos) {
        return Err(FilterError { at: *at, what: "'&&', '||' or the end of the expression".into() });
    }
    Ok(p.program)
}

impl Parser<'_, '_> {
    fn at(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |t| t.0)
    }

    fn fail<T>(&self, what: impl Into<String>) -> Result<T, FilterError> {
        Err(FilterError { at: self.at(), what: what.into() })
    }

    fn push(&mut self, node: Node) -> Result<u16, FilterError> {
        if self.program.nodes.len() == MAX_NODES {
            return self.fail(format!("at most {MAX_NODES} comparisons and operators"));
        }
        self.program.nodes.push(node);
        Ok((self.program.nodes.len() - 1) as u16)
    }

    fn or(&mut self) -> Result<u16, FilterError> {
        let mut left = self.and()?;
        while matches!(self.toks.get(self.pos), Some((_, Tok::OrOr))) {
            self.pos += 1;
            let right = self.and()?;
            left = self.push(Node::Or(left, right))?;
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<u16, FilterError> {
        let mut left = self.unary()?;
        while matches!(self.toks.get(self.pos), Some((_, Tok::AndAnd))) {
            self.pos += 1;
            let right = self.unary()?;
            left = self.push(Node::And(left, right))?;
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<u16, FilterError> {
        self.depth += 1;
        if self.depth > MAX_NODES {
            return self.fail(format!("at most {MAX_NODES} levels of nesting"));
        }
        let node = match self.toks.get(self.pos).map(|t| t.1.clone()) {
            Some(Tok::Not) => {
                self.pos += 1;
                let c = self.unary()?;
                self.push(Node::Not(c))
            }
            Some(Tok::Open) => {
                self.pos += 1;
                let inner = self.or()?;
                if !matches!(self.toks.get(self.pos), Some((_, Tok::Close))) {
                    return self.fail("')'");
                }
                self.pos += 1;
                Ok(inner)
            }
            Some(Tok::Word(w)) => self.comparison(w),
            _ => self.fail("a FIELD, '!' or '('"),
        };
        self.depth -= 1;
        node
    }

    fn comparison(&mut self, name: &str) -> Result<u16, FilterError> {
        let field_at = self.at();
        let Some(field) = self.fields.iter().find(|f| f.name == name).cloned() else {
            let known: Vec<&str> = self.fields.iter().map(|f| f.name.as_str()).collect();
            let what = if name == "$retval" {
                "a field of this event: $retval is only at a return (r: or %return)".to_string()
            } else {
                format!("a field of this event, not {name} (its fields: {})", known.join(", "))
            };
            return self.fail(what);
        };
        self.pos += 1;
        let op_at = self.at();
        let Some((_, Tok::Op(op))) = self.toks.get(self.pos).cloned() else {
            return self.fail("an operator (==, !=, <, <=, >, >=, & or ~) after the field");
        };
        self.pos += 1;
        let value_at = self.at();
        let value = match self.toks.get(self.pos).cloned() {
            Some((_, Tok::Word(w))) => Ok(w.as_bytes().to_vec()),
            Some((_, Tok::Str(s))) => Err(s),
            _ => return self.fail("a value after the operator"),
        };
        self.pos += 1;
        let err = |at: usize, what: String| Err(FilterError { at, what });
        let (ty, shown) = (field.ty, &field.shown);
        match ty {
            FieldType::Array => err(field_at, format!("one value, not {name}, an array ({shown})")),
            FieldType::Other => err(field_at, format!("an integer or a string, not {name} ({shown})")),
            FieldType::String => {
                let op = match op {
                    "==" => StrOp::Eq,
                    "!=" => StrOp::Ne,
                    "~" => StrOp::Glob,
                    _ => return err(op_at, format!("==, != or ~ for {name}, a string ({op} compares numbers)")),
                };
                let bytes = value.unwrap_or_else(|s| s);
                self.program.patterns.push(bytes);
                let pattern = (self.program.patterns.len() - 1) as u16;
                self.push(Node::Str { field: field.field, op, pattern })
            }
            FieldType::Signed | FieldType::Unsigned => {
                let op = match op {
                    "==" => NumOp::Eq,
                    "!=" => NumOp::Ne,
                    "<" => NumOp::Lt,
                    "<=" => NumOp::Le,
                    ">" => NumOp::Gt,
                    ">=" => NumOp::Ge,
                    "&" => NumOp::Band,
                    _ => {
                        return err(
                            op_at,
                            format!("==, !=, <, <=, >, >= or & for {name}, a number ({shown}): ~ is a glob on strings"),
                        )
                    }
                };
                let text = match &value {
                    Ok(w) => String::from_utf8_lossy(w).into_owned(),
                    Err(_) => return err(value_at, format!("a number for {name} ({shown}), not a string")),
                };
                let signed = ty == FieldType::Signed;
                let bits = field.bits.clamp(1, 64);
                let named = field.names.iter().find(|(n, _)| *n == text).map(|&(_, v)| v);
                let Some(v) = named.or_else(|| number(&text, signed).filter(|&v| fits_in(v, signed, bits))) else {
                    let range = if signed {
                        let max = (1u64 << (bits - 1)) - 1;
                        format!("a signed {bits}-bit number (-{} to {max})", max + 1)
                    } else {
                        format!("an unsigned {bits}-bit number (0 to {})", u64::MAX >> (64 - bits))
                    };
                    let mut names: Vec<&str> = field.names.iter().map(|(n, _)| n.as_str()).take(8).collect();
                    if field.names.len() > names.len() {
                        names.push("...");
                    }
                    let names = if names.is_empty() {
                        String::new()
                    } else {
                        format!(" or one of its names ({})", names.join(", "))
                    };
                    return err(value_at, format!("{range}{names} for {name} ({shown}), not {text}"));
                };
                self.push(Node::Num { field: field.field, op, signed, value: v })
            }
        }
    }
}

/// Whether `v` (as [`number`] gave it) is in the range of a `bits`-wide field: `0..2^bits`
/// unsigned, `-2^(bits-1)..2^(bits-1)` signed. A constant outside it could never equal the
/// field's value, so it is a mistake (`size=%di:u8 if size == 256`).
fn fits_in(v: u64, signed: bool, bits: u8) -> bool {
    if bits >= 64 {
        return true;
    }
    if signed {
        let v = v as i64;
        let half = 1i64 << (bits - 1);
        (-half..half).contains(&v)
    } else {
        v >> bits == 0
    }
}

/// A number as `kstrtoll`/`kstrtoull` with base 0 read it: `0x` hex, a leading `0` octal,
/// else decimal; a sign only for signed fields.
fn number(text: &str, signed: bool) -> Option<u64> {
    let (neg, t) = match text.strip_prefix('-') {
        Some(rest) if signed => (true, rest),
        Some(_) => return None,
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let v = if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()?
    } else if t.len() > 1 && t.starts_with('0') {
        u64::from_str_radix(&t[1..], 8).ok()?
    } else {
        t.parse::<u64>().ok()?
    };
    if !signed {
        return Some(v);
    }
    let v = if neg { 0i64.checked_sub_unsigned(v)? } else { i64::try_from(v).ok()? };
    Some(v as u64)
}

#[cfg(test)]
mod tests;
