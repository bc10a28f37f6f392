//! Fetchargs: `[NAME=]FETCHARG[:TYPE]`, as the kernel's probe tracers take them
//! (`kernel/trace/trace_probe.c`), parsed into a [`FetchArg`]. Pure: text in, tree out.
//!
//! - `%REG` (`%di`, `%ax`, ... as the kernel names them; `%rdi` is taken too), `$stackN`,
//!   `$stack`, `$retval`, `$comm`, `$argN`, `$optimized_out` (no value: what `uprobe-run`
//!   writes for a DWARF variable that is not live at the probe), `@ADDR`, `@+OFFSET` (a file offset in the probed
//!   file), `\IMM`, `\"STRING"`, and `+|-OFFS(FETCHARG)`, which reads memory and nests;
//!   beyond the kernel, `+|-OFFS(%BASE,%INDEX,SCALE)` reads memory at an x86 indexed address
//!   (what a USDT argument spec such as `8@16(%rsp,%rax,8)` names);
//! - beyond the kernel, `%xmm0`..`%xmm15`: the low 8 bytes of a vector register (`float`
//!   and `double` arguments and return values), read from the vector state the hit saved;
//!   `$retval:f32` and `$retval:f64` are the return value as such a number, `%xmm0`'s;
//! - types `u8..u64`, `s8..s64`, `x8..x64`, `f32`, `f64` (beyond the kernel), `char`, `string`, `ustring`, `symbol`, bitfields
//!   `b<width>@<offset>/<container>`, and arrays `TYPE[N]` of memory. Without a type a value is
//!   `x64`, as the kernel shows it; `$comm` is a string;
//! - beyond the kernel, an integer type followed by an enum's enumerators,
//!   `u32{RED=0,GREEN=5,BLUE=6}`: read and compared as the integer, shown by the name of its
//!   value (`RED`), or as the integer where no enumerator has it; and `bool`, a `u8` shown
//!   as `false` (0) or `true` (1), any other value as its number.
//!
//! A string is read *at* the address its last dereference computes (`+0(%si):string` is the
//! string %si points to); in an array of strings that address holds the `char *` pointers.

use thiserror::Error;

/// A register of `struct pt_regs`, by its index in 8-byte words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reg(pub u8);

/// The kernel's x86-64 register names and their `struct pt_regs` word.
const REGS: [(&str, u8); 21] = [
    ("r15", 0),
    ("r14", 1),
    ("r13", 2),
    ("r12", 3),
    ("bp", 4),
    ("bx", 5),
    ("r11", 6),
    ("r10", 7),
    ("r9", 8),
    ("r8", 9),
    ("ax", 10),
    ("cx", 11),
    ("dx", 12),
    ("si", 13),
    ("di", 14),
    ("orig_ax", 15),
    ("ip", 16),
    ("cs", 17),
    ("flags", 18),
    ("sp", 19),
    ("ss", 20),
];

/// Where a value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// `%REG`: a register.
    Reg(Reg),
    /// `%xmmN` (0..15): the low 8 bytes of a vector register, where the System V ABI passes
    /// and returns `float` and `double` (the kernel's uprobes cannot read them).
    Xmm(u8),
    /// `$stackN`: the Nth word on the stack.
    Stack(u32),
    /// `$stack`: the stack pointer.
    StackPointer,
    /// `$retval`: the return value (return events only).
    Retval,
    /// `$comm`: the thread's name.
    Comm,
    /// `$argN`, 1-based: the System V argument registers, then the stack.
    Arg(u32),
    /// `$ustack` or `$ustack:DEPTH`: the user stack at the hit, at most DEPTH frames
    /// ([`MAX_STACK_DEPTH`] when none is given), innermost first.
    Ustack(u8),
    /// `@ADDR`: memory at an address.
    Memory(u64),
    /// `@+OFFSET`: memory at a file offset of the probed file.
    FileOffset(u64),
    /// `\IMM`: an immediate number.
    Immediate(u64),
    /// `$optimized_out`: a value the program does not keep at the probe (a variable its debug
    /// information says is not live there). Records nothing; shown as `(optimized out)`.
    OptimizedOut,
    /// `\"TEXT"`: an immediate string.
    ImmediateString(Vec<u8>),
    /// `%BASE,%INDEX,SCALE` inside a dereference: base + index * scale.
    Indexed {
        /// The base register.
        base: Reg,
        /// The index register.
        index: Reg,
        /// 1, 2, 4 or 8.
        scale: u8,
    },
    /// `+|-OFFS(FETCHARG)`: memory at the inner value plus the offset.
    Deref {
        /// OFFS, added to the inner value.
        offset: i64,
        /// The address's fetcharg.
        inner: Box<Fetch>,
    },
}

/// How a value is shown, and compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    /// `u8`..`u64`: an unsigned number.
    Unsigned,
    /// `s8`..`s64`: a signed number.
    Signed,
    /// `x8`..`x64`: hexadecimal.
    Hex,
    /// `char`: a character.
    Char,
    /// `string`, `ustring`: the text at the address.
    String,
    /// `symbol`: the value as `sym+0xoff`.
    Symbol,
    /// `f32`, `f64`: an IEEE 754 floating-point number.
    Float,
}

/// A bitfield `b<width>@<offset>/<container>`, in bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bitfield {
    /// How many bits.
    pub width: u8,
    /// From which bit of the container.
    pub offset: u8,
}

/// A fetcharg's type: `:TYPE` as written, or [`Type::DEFAULT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Type {
    /// How it is shown.
    pub base: Base,
    /// Size in bytes of one element as read from memory (strings: 8, the pointer).
    pub size: u8,
    /// A bitfield of the element, if one.
    pub bitfield: Option<Bitfield>,
    /// `TYPE[N]`.
    pub count: Option<u32>,
}

impl Type {
    /// The type of a fetcharg written without one: `x64`.
    pub const DEFAULT: Type = Type { base: Base::Hex, size: 8, bitfield: None, count: None };
    const STRING: Type = Type { base: Base::String, size: 8, bitfield: None, count: None };
    /// The type of `$ustack`: frame addresses, shown as symbols.
    pub const STACK: Type = Type { base: Base::Symbol, size: 8, bitfield: None, count: None };

    /// Whether the value is a string (read at its address).
    pub fn is_string(&self) -> bool {
        self.base == Base::String
    }

    /// A value as read, cut to the type's size or extracted from its bitfield.
    pub fn bits(&self, v: u64) -> u64 {
        let mask = |bits: u32| if bits >= 64 { u64::MAX } else { (1 << bits) - 1 };
        match self.bitfield {
            Some(b) => (v >> b.offset) & mask(u32::from(b.width)),
            None => v & mask(u32::from(self.size) * 8),
        }
    }

    /// A value of a signed type, sign-extended from its size.
    pub fn sign_extend(&self, v: u64) -> i64 {
        let bits = u32::from(self.size.clamp(1, 8)) * 8;
        ((v << (64 - bits)) as i64) >> (64 - bits)
    }
}

/// Names a number is shown by, instead of its digits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Named {
    /// `bool`: 0 is `false`, 1 `true`.
    Bool,
    /// An enum's enumerators (`TYPE{NAME=VALUE,...}`), each value cut to the type's size.
    Enum(Vec<(u64, String)>),
}

impl Named {
    /// The name of `v` (cut to its type's size), if one.
    pub fn name_of(&self, ty: &Type, v: u64) -> Option<&str> {
        match self {
            Named::Bool => [(0, "false"), (1, "true")].iter().find(|(n, _)| *n == ty.bits(v)).map(|(_, s)| *s),
            Named::Enum(values) => values.iter().find(|(n, _)| *n == ty.bits(v)).map(|(_, s)| s.as_str()),
        }
    }
}

/// The most enumerators a type names (a bigger enum's values are shown as numbers).
pub const MAX_ENUMERATORS: usize = 512;

/// One parsed fetcharg.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchArg {
    /// NAME, or `argN` for the Nth fetcharg written without one.
    pub name: String,
    /// Where the value comes from.
    pub fetch: Fetch,
    /// How it is read and shown.
    pub ty: Type,
    /// Names of its values, if any.
    pub named: Option<Named>,
}

impl FetchArg {
    /// The vector register it reads, if it reads one: `%xmmN`, or a `float` or `double`
    /// `$retval` (returned in `%xmm0`, never in `%rax`).
    pub fn xmm(&self) -> Option<u8> {
        match self.fetch {
            Fetch::Xmm(n) => Some(n),
            Fetch::Retval if self.ty.base == Base::Float => Some(0),
            _ => None,
        }
    }

    /// Whether it is `$ustack`: a record holds its frames (a u32 count, then the frames),
    /// and it is shown as a call chain, not as one value.
    pub fn is_stack(&self) -> bool {
        matches!(self.fetch, Fetch::Ustack(_))
    }
}

/// What was wrong, and where (a byte offset into the fetcharg's text).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{what}")]
pub struct ArgError {
    /// The byte of the fetcharg's text where the error is.
    pub at: usize,
    /// What is wrong.
    pub what: String,
}

fn err<T>(at: usize, what: impl Into<String>) -> Result<T, ArgError> {
    Err(ArgError { at, what: what.into() })
}

/// Where the probe sits, which decides what the fetchargs may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// An entry event (`p`), at a function's entry or any instruction: no `$retval`.
    Entry,
    /// A return event (`r`): `$retval`, and no `$argN`.
    Return,
}

/// Parses a decimal or `0x` number, signed or not.
pub fn number(text: &str) -> Option<i128> {
    let (neg, t) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() => u64::from_str_radix(hex, 16).ok()?,
        Some(_) => return None,
        None if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t.parse::<u64>().ok()?,
        None => return None,
    };
    Some(if neg { -(v as i128) } else { v as i128 })
}

/// The deepest stack `$ustack:DEPTH` takes.
pub const MAX_STACK_DEPTH: u8 = 127;

/// `$ustack` or `$ustack:DEPTH` (`at`: where the body starts); None for any other body.
fn ustack(body: &str, at: usize) -> Option<Result<Fetch, ArgError>> {
    let rest = body.strip_prefix("$ustack")?;
    Some(match rest.strip_prefix(':') {
        None if rest.is_empty() => Ok(Fetch::Ustack(MAX_STACK_DEPTH)),
        None => return None,
        Some(depth) => match depth.parse::<u8>() {
            Ok(d) if (1..=MAX_STACK_DEPTH).contains(&d) => Ok(Fetch::Ustack(d)),
            _ => err(at + 8, format!("a depth from 1 to {MAX_STACK_DEPTH} after $ustack:, not {depth:?}")),
        },
    })
}

/// Parses `[NAME=]FETCHARG[:TYPE]`; `index` (1-based) names it `argN` when no NAME is given
/// (`ustack` for `$ustack`).
pub fn parse(text: &str, index: usize, site: Site) -> Result<FetchArg, ArgError> {
    // An enum's enumerators (`{RED=0}`) hold '=' too.
    let head = text.split('{').next().unwrap_or(text);
    let (name, body, body_at) = match head.find('=').filter(|&i| is_name(&text[..i])) {
        Some(i) => (text[..i].to_string(), &text[i + 1..], i + 1),
        None if head.contains('=') && !text.starts_with('\\') && !text.starts_with('+') && !text.starts_with('-') => {
            return err(0, "a NAME made of letters, digits and '_' before '='");
        }
        None => (format!("arg{index}"), text, 0),
    };
    if body.is_empty() {
        return err(body_at, "a fetcharg after the name");
    }
    // A stack takes no type: its `:DEPTH` is no type.
    if let Some(fetch) = ustack(body, body_at) {
        let name = if name == format!("arg{index}") && !text.starts_with(&format!("arg{index}=")) {
            "ustack".to_string()
        } else {
            name
        };
        return Ok(FetchArg { name, fetch: fetch?, ty: Type::STACK, named: None });
    }
    // The type follows the last ':' outside of a quoted string.
    let (value, ty_text) = match split_type(body) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let fetch = parse_value(value, body_at, site)?;
    let ty_at = body_at + value.len() + 1;
    let (ty_text, named) = match ty_text.and_then(|t| t.split_once('{')) {
        Some((t, table)) => (Some(t), Some(enumerators(table, ty_at + t.len())?)),
        None => (ty_text, None),
    };
    let ty = match ty_text {
        Some(t) => parse_type(t, ty_at)?,
        None if matches!(fetch, Fetch::Comm | Fetch::ImmediateString(_)) => Type::STRING,
        None => Type::DEFAULT,
    };
    check(&fetch, &ty, body_at, ty_at)?;
    let named = match named {
        Some(values) if matches!(ty.base, Base::Unsigned | Base::Signed | Base::Hex) && ty.bitfield.is_none() => {
            Some(Named::Enum(values.into_iter().map(|(v, n)| (ty.bits(v as u64), n)).collect()))
        }
        Some(_) => return err(ty_at, "enumerators {NAME=VALUE,...} only after an integer type (u32, s32, x32...)"),
        None if ty_text.is_some_and(|t| t.split('[').next() == Some("bool")) => Some(Named::Bool),
        None => None,
    };
    Ok(FetchArg { name, fetch, ty, named })
}

/// `NAME=VALUE,...}` (after the `{`), `at` where the `{` is.
fn enumerators(table: &str, at: usize) -> Result<Vec<(i128, String)>, ArgError> {
    let Some(inner) = table.strip_suffix('}') else { return err(at + table.len() + 1, "'}' closing the enumerators") };
    let mut out = Vec::new();
    for item in inner.split(',').filter(|i| !i.is_empty()) {
        let value =
            item.split_once('=').filter(|(n, _)| is_name(n)).and_then(|(n, v)| Some((number(v)?, n.to_string())));
        match value {
            Some((v, n)) if out.len() < MAX_ENUMERATORS => out.push((v, n)),
            Some(_) => return err(at, format!("at most {MAX_ENUMERATORS} enumerators")),
            None => return err(at + 1, format!("enumerators NAME=VALUE separated by ',', not {item:?}")),
        }
    }
    Ok(out)
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') && !s.as_bytes()[0].is_ascii_digit()
}

fn split_type(body: &str) -> Option<usize> {
    let mut quoted = false;
    let mut last = None;
    for (i, c) in body.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ':' if !quoted => last = Some(i),
            _ => {}
        }
    }
    last
}

fn reg(name: &str) -> Option<Reg> {
    let plain = match name.strip_prefix('r') {
        Some(rest) if ["ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "ip"].contains(&rest) => rest,
        _ => name,
    };
    let plain = if plain == "eflags" { "flags" } else { plain };
    REGS.iter().find(|(n, _)| *n == plain).map(|&(_, i)| Reg(i))
}

fn parse_value(text: &str, at: usize, site: Site) -> Result<Fetch, ArgError> {
    if let Some(n) = text.strip_prefix("%xmm") {
        return match n.parse::<u8>() {
            Ok(n) if n < 16 => Ok(Fetch::Xmm(n)),
            _ => err(at, format!("a vector register from %xmm0 to %xmm15, not %xmm{n}")),
        };
    }
    if let Some(name) = text.strip_prefix('%') {
        return reg(name).map(Fetch::Reg).ok_or_else(|| ArgError {
            at,
            what: format!("a register (ax, bx, cx, dx, si, di, bp, sp, r8..r15, ip, flags), not %{name}"),
        });
    }
    if let Some(var) = text.strip_prefix('$') {
        return parse_variable(var, at, site);
    }
    if let Some(addr) = text.strip_prefix('@') {
        if let Some(off) = addr.strip_prefix('+') {
            return match number(off) {
                Some(v) if v >= 0 => Ok(Fetch::FileOffset(v as u64)),
                _ => err(at + 2, "a file offset after '@+'"),
            };
        }
        return match number(addr) {
            Some(v) if v >= 0 => Ok(Fetch::Memory(v as u64)),
            _ => err(at + 1, "an address after '@' (uprobes take no symbol there)"),
        };
    }
    if let Some(imm) = text.strip_prefix('\\') {
        if let Some(s) = imm.strip_prefix('"') {
            return match s.strip_suffix('"') {
                Some(inner) => Ok(Fetch::ImmediateString(inner.as_bytes().to_vec())),
                None => err(at + text.len(), "a closing '\"'"),
            };
        }
        return match number(imm) {
            Some(v) => Ok(Fetch::Immediate(v as u64)),
            None => err(at + 1, "a number or a \"string\" after '\\'"),
        };
    }
    if text.starts_with('+') || text.starts_with('-') {
        let open = text.find('(').ok_or(ArgError { at: at + text.len(), what: "'(' after the offset".into() })?;
        if !text.ends_with(')') {
            return err(at + text.len(), "')' closing the dereference");
        }
        let off_text = text[..open].replacen("+u", "+", 1).replacen("-u", "-", 1);
        let offset = number(&off_text).ok_or(ArgError { at, what: "an offset like +8 or -0x10 before '('".into() })?;
        let inside = &text[open + 1..text.len() - 1];
        let inner = match inside.starts_with('%') && inside.contains(',') {
            true => parse_indexed(inside, at + open + 1)?,
            false => parse_value(inside, at + open + 1, site)?,
        };
        if matches!(inner, Fetch::Comm | Fetch::ImmediateString(_)) {
            return err(at + open + 1, "a number to dereference, not a string");
        }
        return Ok(Fetch::Deref { offset: offset as i64, inner: Box::new(inner) });
    }
    err(at, "%REG, $VAR, @ADDR, @+OFFSET, \\IMM or +|-OFFS(FETCHARG)")
}

/// `%BASE,%INDEX[,SCALE]`.
fn parse_indexed(text: &str, at: usize) -> Result<Fetch, ArgError> {
    let mut parts = text.split(',');
    let mut register = |what: &str| {
        let t = parts.next().unwrap_or("");
        t.strip_prefix('%').and_then(reg).ok_or_else(|| ArgError { at, what: format!("{what} register, not {t:?}") })
    };
    let (base, index) = (register("a base")?, register("an index")?);
    let scale = match parts.next().map(str::parse::<u8>) {
        None => 1,
        Some(Ok(s @ (1 | 2 | 4 | 8))) => s,
        Some(_) => return err(at, "a scale of 1, 2, 4 or 8 after the index register"),
    };
    if parts.next().is_some() {
        return err(at, "%BASE,%INDEX,SCALE and nothing more");
    }
    Ok(Fetch::Indexed { base, index, scale })
}

fn parse_variable(var: &str, at: usize, site: Site) -> Result<Fetch, ArgError> {
    match var {
        "retval" if site == Site::Return => Ok(Fetch::Retval),
        "retval" => err(at, "$retval only on a return event (r: or %return)"),
        "comm" => Ok(Fetch::Comm),
        "stack" => Ok(Fetch::StackPointer),
        "optimized_out" => Ok(Fetch::OptimizedOut),
        _ => {
            if let Some(n) = var.strip_prefix("stack") {
                return n.parse().map(Fetch::Stack).or(err(at + 6, "a number after $stack"));
            }
            if let Some(n) = var.strip_prefix("arg") {
                return match n.parse::<u32>() {
                    Ok(0) | Err(_) => err(at + 4, "an argument number from 1 after $arg"),
                    Ok(_) if site == Site::Return => {
                        err(at, "$argN only on an entry event (at a return the argument registers are gone)")
                    }
                    Ok(n) => Ok(Fetch::Arg(n)),
                };
            }
            err(at, "$stack, $stackN, $retval, $comm, $argN, $ustack[:DEPTH] or $optimized_out")
        }
    }
}

/// Parses a type name.
pub fn parse_type(text: &str, at: usize) -> Result<Type, ArgError> {
    let (base_text, count) = match text.find('[') {
        Some(i) => {
            let Some(n) = text[i + 1..].strip_suffix(']') else {
                return err(at + text.len(), "']' closing the array length");
            };
            match n.parse::<u32>() {
                Ok(n) if (1..=64).contains(&n) => (&text[..i], Some(n)),
                _ => return err(at + i + 1, "an array length from 1 to 64"),
            }
        }
        None => (text, None),
    };
    let simple = |base, bits: u8| Type { base, size: bits / 8, bitfield: None, count };
    let ty = match base_text {
        "string" | "ustring" => Type { count, ..Type::STRING },
        "symbol" => simple(Base::Symbol, 64),
        "char" => simple(Base::Char, 8),
        "bool" => simple(Base::Unsigned, 8),
        "f32" => simple(Base::Float, 32),
        "f64" => simple(Base::Float, 64),
        t if t.starts_with('b') => return parse_bitfield(t, at).map(|ty| Type { count, ..ty }),
        t => {
            let base = match t.as_bytes().first() {
                Some(b'u') => Base::Unsigned,
                Some(b's') => Base::Signed,
                Some(b'x') => Base::Hex,
                _ => return err(at, unknown_type(t)),
            };
            match t[1..].parse::<u8>() {
                Ok(bits @ (8 | 16 | 32 | 64)) => simple(base, bits),
                _ => return err(at, unknown_type(t)),
            }
        }
    };
    Ok(ty)
}

fn unknown_type(t: &str) -> String {
    format!(
        "a type (u8..u64, s8..s64, x8..x64, f32, f64, char, bool, string, ustring, symbol, b<width>@<offset>/<container>), not {t:?}"
    )
}

fn parse_bitfield(t: &str, at: usize) -> Result<Type, ArgError> {
    let bad = || ArgError {
        at,
        what: format!("a bitfield b<width>@<offset>/<container> (container 8, 16, 32 or 64), not {t:?}"),
    };
    let (width, rest) = t[1..].split_once('@').ok_or_else(bad)?;
    let (offset, container) = rest.split_once('/').ok_or_else(bad)?;
    let (width, offset, container): (u8, u8, u8) =
        (width.parse().map_err(|_| bad())?, offset.parse().map_err(|_| bad())?, container.parse().map_err(|_| bad())?);
    if ![8, 16, 32, 64].contains(&container)
        || width == 0
        || u32::from(width) + u32::from(offset) > u32::from(container)
    {
        return Err(bad());
    }
    Ok(Type { base: Base::Unsigned, size: container / 8, bitfield: Some(Bitfield { width, offset }), count: None })
}

/// What the kernel refuses in the combination of a value and a type.
fn check(fetch: &Fetch, ty: &Type, at: usize, ty_at: usize) -> Result<(), ArgError> {
    let memory = matches!(fetch, Fetch::Deref { .. } | Fetch::Memory(_) | Fetch::FileOffset(_));
    if ty.count.is_some() && !memory {
        return err(ty_at, "an array type only on memory (+OFFS(...), @ADDR or @+OFFSET)");
    }
    match (ty.is_string(), fetch) {
        (true, Fetch::Comm | Fetch::ImmediateString(_)) if ty.count.is_none() => Ok(()),
        (true, Fetch::Comm | Fetch::ImmediateString(_)) => err(ty_at, "no array of $comm or of an immediate string"),
        (true, _) if memory => Ok(()),
        (true, _) => err(at, "memory for a string: +0(%REG):string reads the string %REG points to"),
        (false, Fetch::Comm | Fetch::ImmediateString(_)) => err(ty_at, "the type string for $comm or a \"string\""),
        (false, _) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> FetchArg {
        parse(text, 1, Site::Entry).unwrap_or_else(|e| panic!("{text}: {e} at {}", e.at))
    }

    fn bad(text: &str, site: Site) -> ArgError {
        parse(text, 1, site).expect_err(text)
    }

    #[test]
    fn stacks_take_a_depth_and_no_type() {
        let whole = ok("$ustack");
        assert_eq!((whole.name.as_str(), &whole.fetch, whole.ty), ("ustack", &Fetch::Ustack(127), Type::STACK));
        assert!(whole.is_stack() && !ok("%di").is_stack());
        assert_eq!(ok("$ustack:8").fetch, Fetch::Ustack(8));
        assert_eq!(ok("st=$ustack:3").name, "st");
        assert_eq!(bad("$ustack:128", Site::Entry).what, "a depth from 1 to 127 after $ustack:, not \"128\"");
        assert_eq!(bad("$ustack:0", Site::Entry).at, 8);
        assert!(parse("$ustack:x", 1, Site::Return).is_err() && parse("$ustackz", 1, Site::Entry).is_err());
        assert_eq!(parse("$ustack", 1, Site::Return).unwrap().fetch, Fetch::Ustack(127));
    }

    #[test]
    fn registers_and_variables() {
        assert_eq!(
            ok("%di"),
            FetchArg { name: "arg1".into(), fetch: Fetch::Reg(Reg(14)), ty: Type::DEFAULT, named: None }
        );
        assert_eq!(ok("x=%rax:s32").fetch, Fetch::Reg(Reg(10)));
        assert_eq!(ok("x=%rax:s32").ty, Type { base: Base::Signed, size: 4, bitfield: None, count: None });
        assert_eq!(ok("f=%flags").fetch, Fetch::Reg(Reg(18)));
        assert_eq!(ok("$stack3").fetch, Fetch::Stack(3));
        assert_eq!(ok("$stack").fetch, Fetch::StackPointer);
        assert_eq!(ok("$arg7").fetch, Fetch::Arg(7));
        assert_eq!(ok("c=$comm").ty, Type::STRING);
        assert_eq!(parse("$retval", 2, Site::Return).unwrap().name, "arg2");
        assert_eq!(ok("@0x1000:u8").fetch, Fetch::Memory(0x1000));
        assert_eq!(ok("@+0x2000:u32").fetch, Fetch::FileOffset(0x2000));
        assert_eq!(ok("\\42").fetch, Fetch::Immediate(42));
        assert_eq!(ok("total=$optimized_out").fetch, Fetch::OptimizedOut);
        assert_eq!(ok("x=%xmm1:f64").fetch, Fetch::Xmm(1));
        assert_eq!(ok("x=%xmm1:f32").ty, Type { base: Base::Float, size: 4, bitfield: None, count: None });
        assert_eq!(ok("x=%xmm1:f32").xmm(), Some(1));
        let retval = |text: &str| parse(text, 1, Site::Return).unwrap().xmm();
        assert_eq!((retval("$retval:f64"), retval("$retval:f32"), retval("$retval:s64")), (Some(0), Some(0), None));
        assert!(bad("%xmm16", Site::Entry).what.contains("%xmm0 to %xmm15"));
        assert!(bad("$optimized_out:string", Site::Entry).what.starts_with("memory for a string"));
        assert_eq!(ok("s=\\\"a:b\"").fetch, Fetch::ImmediateString(b"a:b".to_vec()));
    }

    #[test]
    fn dereferences_nest() {
        let a = ok("n=+0(+8(%di)):string");
        assert_eq!(
            a.fetch,
            Fetch::Deref {
                offset: 0,
                inner: Box::new(Fetch::Deref { offset: 8, inner: Box::new(Fetch::Reg(Reg(14))) })
            }
        );
        assert!(a.ty.is_string());
        assert_eq!(ok("-0x10(%bp):s64").fetch, Fetch::Deref { offset: -16, inner: Box::new(Fetch::Reg(Reg(4))) });
        assert_eq!(ok("+u8(%si)").fetch, Fetch::Deref { offset: 8, inner: Box::new(Fetch::Reg(Reg(13))) });
        assert_eq!(
            ok("+16(%sp,%ax,8):u64").fetch,
            Fetch::Deref { offset: 16, inner: Box::new(Fetch::Indexed { base: Reg(19), index: Reg(10), scale: 8 }) }
        );
        assert_eq!(
            ok("+0(%si,%dx)").fetch,
            Fetch::Deref { offset: 0, inner: Box::new(Fetch::Indexed { base: Reg(13), index: Reg(12), scale: 1 }) }
        );
        assert!(bad("+0(%si,%dx,3)", Site::Entry).what.starts_with("a scale"));
        assert!(bad("+0(%si,%zz,8)", Site::Entry).what.starts_with("an index register"));
    }

    #[test]
    fn values_cut_to_their_type() {
        let t = |s: &str| ok(s).ty;
        assert_eq!(t("+0(%di):u16").bits(0x1_2345), 0x2345);
        assert_eq!(t("+0(%di):b4@4/32").bits(0xabcd), 0xc);
        assert_eq!(t("%di:u64").bits(u64::MAX), u64::MAX);
        assert_eq!(t("%di:s8").sign_extend(0xfe), -2);
        assert_eq!(t("%di:s64").sign_extend(u64::MAX), -1);
    }

    #[test]
    fn types() {
        assert_eq!(ok("+0(%di):x8[3]").ty, Type { base: Base::Hex, size: 1, bitfield: None, count: Some(3) });
        assert_eq!(
            ok("+16(%di):b4@4/32").ty,
            Type { base: Base::Unsigned, size: 4, bitfield: Some(Bitfield { width: 4, offset: 4 }), count: None }
        );
        assert_eq!(ok("+8(%di):string[2]").ty.count, Some(2));
        assert_eq!(ok("%di:symbol").ty.base, Base::Symbol);
        assert_eq!(ok("+0(%di):char").ty.base, Base::Char);
        assert_eq!(ok("+0(%di):ustring").ty, Type::STRING);
    }

    #[test]
    fn enumerators_name_values_of_their_size() {
        let a = ok("c=%dx:u32{RED=0,GREEN=5,BLUE=-1}");
        assert_eq!(a.ty, Type { base: Base::Unsigned, size: 4, bitfield: None, count: None });
        let named = a.named.unwrap();
        assert_eq!(named, Named::Enum(vec![(0, "RED".into()), (5, "GREEN".into()), (0xffff_ffff, "BLUE".into())]));
        assert_eq!(named.name_of(&a.ty, 0x1_0000_0005), Some("GREEN"));
        assert_eq!(named.name_of(&a.ty, 7), None);
        assert_eq!(ok("+0(%di):s8[2]{A=0x1}").ty.count, Some(2));
        assert_eq!(parse("$retval:u8{A=1}", 3, Site::Return).unwrap().name, "arg3");
        assert_eq!(ok("%di:u8{}").named, Some(Named::Enum(Vec::new())));
        assert!(bad("%di:u8{A=1", Site::Entry).what.starts_with("'}'"));
        assert!(bad("%di:u8{A}", Site::Entry).what.starts_with("enumerators NAME=VALUE"));
        assert!(bad("%di:u8{1=2}", Site::Entry).what.starts_with("enumerators NAME=VALUE"));
        assert!(bad("+0(%di):string{A=1}", Site::Entry).what.starts_with("enumerators {NAME=VALUE,...} only"));
        assert!(bad("%di:f64{A=1}", Site::Entry).what.starts_with("enumerators"));
        let b = ok("ok=+40(%di):bool");
        assert_eq!(
            (b.ty, b.named.as_ref()),
            (Type { base: Base::Unsigned, size: 1, bitfield: None, count: None }, Some(&Named::Bool))
        );
        assert_eq!(
            (b.named.as_ref().unwrap().name_of(&b.ty, 0x101), Named::Bool.name_of(&b.ty, 2)),
            (Some("true"), None)
        );
        assert_eq!(ok("+0(%di):bool[2]").named, Some(Named::Bool));
    }

    #[test]
    fn refusals_say_where_and_what() {
        let e = bad("x=%zz", Site::Entry);
        assert_eq!(e.at, 2);
        assert!(e.what.contains("not %zz"), "{}", e.what);
        assert_eq!(bad("$retval", Site::Entry).what, "$retval only on a return event (r: or %return)");
        assert_eq!(bad("%di:u12", Site::Entry).at, 4);
        assert!(bad("%di:u12", Site::Entry).what.starts_with("a type"));
        assert!(bad("%di:string", Site::Entry).what.starts_with("memory for a string"));
        assert!(bad("%di:u8[2]", Site::Entry).what.starts_with("an array type"));
        assert!(bad("$arg1", Site::Return).what.starts_with("$argN only"));
        assert!(bad("+8(%di", Site::Entry).what.starts_with("')'"));
        assert!(bad("%di:b9@0/8", Site::Entry).what.starts_with("a bitfield"));
        assert!(bad("$comm:u8", Site::Entry).what.starts_with("the type string"));
        assert_eq!(bad("x=", Site::Entry).at, 2);
    }
}
