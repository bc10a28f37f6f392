//! USDT (SystemTap SDT) markers: the `.note.stapsdt` notes a program built with
//! `<sys/sdt.h>` carries, and the argument specs each note holds (`8@%rbx`, `-4@-20(%rbp)`,
//! `8@$5`), parsed. Pure: bytes and text in, values out.
//!
//! A note (type 3, owner `stapsdt`) describes one marker: the address of its `nop`, the
//! link-time address of the `.stapsdt.base` section, the address of its semaphore (0: none),
//! then provider, name and argument specs as NUL-terminated strings. A prelinked file moved
//! its sections after the notes were written: the difference between the address
//! `.stapsdt.base` has now and the one the note records moves the marker and its semaphore.
//!
//! An argument spec is `[-]SIZE@OPERAND` (a negative size: signed), the operand in AT&T
//! syntax as the compiler wrote it for the `nop`'s asm: a register (`%eax`), memory
//! (`-20(%rbp)`, `sym(%rip)`, `16(%rsp,%rax,8)`) or an immediate (`$5`). Old notes have no
//! `SIZE@`: the register's width then gives the size.

use thiserror::Error;

/// `NT_STAPSDT`.
const NT_STAPSDT: u32 = 3;

/// One marker, as its note says (addresses already moved for prelink).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    /// The provider (`python`).
    pub provider: String,
    /// The marker's name within its provider (`function__entry`).
    pub name: String,
    /// Link-time address of the marker's `nop`.
    pub pc: u64,
    /// Link-time address of its semaphore (a `unsigned short`), 0 when it has none.
    pub semaphore: u64,
    /// The argument specs as written, blank-separated.
    pub args: String,
}

/// The markers of a `.note.stapsdt` section. `base` is the address `.stapsdt.base` has in
/// the file (None: no such section, nothing to adjust). Notes that are not SDT notes, or are
/// cut short, are skipped.
pub fn markers(section: &[u8], base: Option<u64>) -> Vec<Marker> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let u32_at = |i: usize| section.get(i..i + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    while let (Some(namesz), Some(descsz), Some(kind)) = (u32_at(at), u32_at(at + 4), u32_at(at + 8)) {
        let name_at = at + 12;
        let Some(desc_at) = align4(namesz as usize).and_then(|n| name_at.checked_add(n)) else { break };
        let Some(next) = align4(descsz as usize).and_then(|n| desc_at.checked_add(n)) else { break };
        let (Some(name), Some(desc)) =
            (section.get(name_at..name_at + namesz as usize), section.get(desc_at..desc_at + descsz as usize))
        else {
            break;
        };
        if kind == NT_STAPSDT && name == b"stapsdt\0" {
            if let Some(m) = marker(desc, base) {
                out.push(m);
            }
        }
        at = next;
    }
    out
}

/// One note's description (ELF64): pc, base, semaphore, then three strings.
fn marker(desc: &[u8], base: Option<u64>) -> Option<Marker> {
    let word = |i: usize| desc.get(i * 8..i * 8 + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    let (pc, note_base, semaphore) = (word(0)?, word(1)?, word(2)?);
    let mut strings = desc.get(24..)?.split(|&b| b == 0);
    let mut text = || strings.next().and_then(|s| std::str::from_utf8(s).ok()).map(str::to_string);
    let (provider, name, args) = (text()?, text()?, text().unwrap_or_default());
    if provider.is_empty() || name.is_empty() {
        return None;
    }
    let shift = base.map_or(0, |b| b.wrapping_sub(note_base));
    let semaphore = if semaphore == 0 { 0 } else { semaphore.wrapping_add(shift) };
    Some(Marker { provider, name, pc: pc.wrapping_add(shift), semaphore, args })
}

/// Where an argument's value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loc {
    /// A register, by the kernel's fetcharg name (`ax`, `r12`).
    Reg(&'static str),
    /// Memory at `disp` (plus `symbol`'s address, when named) from a base register, plus an
    /// index register times a scale.
    Mem {
        /// The displacement.
        disp: i64,
        /// A symbol the displacement is relative to (`%rip`-relative operands only).
        symbol: Option<String>,
        /// The base register.
        base: &'static str,
        /// The index register and its scale (1, 2, 4 or 8).
        index: Option<(&'static str, u8)>,
    },
    /// An immediate value (`$5`).
    Imm(i64),
}

/// One argument: its size in bytes, its sign, and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arg {
    /// 1, 2, 4 or 8 bytes.
    pub size: u8,
    /// Whether the spec's size was negative.
    pub signed: bool,
    /// Where the value is.
    pub loc: Loc,
}

/// An argument spec that does not parse.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("argument spec {spec:?}: {what}")]
pub struct SpecError {
    /// The spec as written.
    pub spec: String,
    /// What was expected.
    pub what: &'static str,
}

/// The x86-64 registers as the compiler names them: (name, kernel fetcharg name, width).
const REGS: [(&str, &str, u8); 68] = [
    ("rax", "ax", 8),
    ("eax", "ax", 4),
    ("ax", "ax", 2),
    ("al", "ax", 1),
    ("rbx", "bx", 8),
    ("ebx", "bx", 4),
    ("bx", "bx", 2),
    ("bl", "bx", 1),
    ("rcx", "cx", 8),
    ("ecx", "cx", 4),
    ("cx", "cx", 2),
    ("cl", "cx", 1),
    ("rdx", "dx", 8),
    ("edx", "dx", 4),
    ("dx", "dx", 2),
    ("dl", "dx", 1),
    ("rsi", "si", 8),
    ("esi", "si", 4),
    ("si", "si", 2),
    ("sil", "si", 1),
    ("rdi", "di", 8),
    ("edi", "di", 4),
    ("di", "di", 2),
    ("dil", "di", 1),
    ("rbp", "bp", 8),
    ("ebp", "bp", 4),
    ("bp", "bp", 2),
    ("bpl", "bp", 1),
    ("rsp", "sp", 8),
    ("esp", "sp", 4),
    ("sp", "sp", 2),
    ("spl", "sp", 1),
    ("r8", "r8", 8),
    ("r8d", "r8", 4),
    ("r8w", "r8", 2),
    ("r8b", "r8", 1),
    ("r9", "r9", 8),
    ("r9d", "r9", 4),
    ("r9w", "r9", 2),
    ("r9b", "r9", 1),
    ("r10", "r10", 8),
    ("r10d", "r10", 4),
    ("r10w", "r10", 2),
    ("r10b", "r10", 1),
    ("r11", "r11", 8),
    ("r11d", "r11", 4),
    ("r11w", "r11", 2),
    ("r11b", "r11", 1),
    ("r12", "r12", 8),
    ("r12d", "r12", 4),
    ("r12w", "r12", 2),
    ("r12b", "r12", 1),
    ("r13", "r13", 8),
    ("r13d", "r13", 4),
    ("r13w", "r13", 2),
    ("r13b", "r13", 1),
    ("r14", "r14", 8),
    ("r14d", "r14", 4),
    ("r14w", "r14", 2),
    ("r14b", "r14", 1),
    ("r15", "r15", 8),
    ("r15d", "r15", 4),
    ("r15w", "r15", 2),
    ("r15b", "r15", 1),
    ("rip", "ip", 8),
    ("eip", "ip", 4),
    ("ip", "ip", 2),
    ("r8l", "r8", 1),
];

fn register(text: &str) -> Option<(&'static str, u8)> {
    let name = text.strip_prefix('%')?;
    REGS.iter().find(|(n, _, _)| *n == name).map(|&(_, k, w)| (k, w))
}

/// The argument specs of a marker (blank-separated).
pub fn parse_args(text: &str) -> Result<Vec<Arg>, SpecError> {
    text.split_whitespace().map(parse_arg).collect()
}

/// One argument spec.
pub fn parse_arg(spec: &str) -> Result<Arg, SpecError> {
    let bad = |what| SpecError { spec: spec.to_string(), what };
    let (size, operand) = match spec.split_once('@') {
        Some((n, op)) => match n.parse::<i8>() {
            Ok(n @ (-8 | -4 | -2 | -1 | 1 | 2 | 4 | 8)) => (Some(n), op),
            _ => return Err(bad("a size of 1, 2, 4 or 8 bytes (negative: signed) before '@'")),
        },
        None => (None, spec),
    };
    let sized = |width: u8, loc| match size {
        Some(n) => Arg { size: n.unsigned_abs(), signed: n < 0, loc },
        None => Arg { size: width, signed: false, loc },
    };
    if let Some(imm) = operand.strip_prefix('$') {
        return number(imm).map(|v| sized(8, Loc::Imm(v))).ok_or(bad("a number after '$'"));
    }
    if operand.starts_with('%') {
        return register(operand).map(|(k, w)| sized(w, Loc::Reg(k))).ok_or(bad("an x86-64 register"));
    }
    let open = operand.find('(').ok_or(bad("a register, (memory) or $immediate"))?;
    let inner = operand[open + 1..].strip_suffix(')').ok_or(bad("')' closing the memory operand"))?;
    let (disp, symbol) = displacement(&operand[..open]).ok_or(bad("a displacement like -20 or sym+8"))?;
    let mut parts = inner.split(',').map(str::trim);
    let base = register(parts.next().unwrap_or("")).ok_or(bad("a base register inside '()'"))?.0;
    let index = match parts.next() {
        None => None,
        Some(i) => {
            let reg = register(i).ok_or(bad("an index register"))?.0;
            let scale = match parts.next().map(|s| s.parse::<u8>()) {
                None => 1,
                Some(Ok(s @ (1 | 2 | 4 | 8))) => s,
                Some(_) => return Err(bad("a scale of 1, 2, 4 or 8")),
            };
            Some((reg, scale))
        }
    };
    if parts.next().is_some() {
        return Err(bad("at most base, index and scale inside '()'"));
    }
    if symbol.is_some() && base != "ip" {
        return Err(bad("a symbol only relative to %rip"));
    }
    Ok(sized(8, Loc::Mem { disp, symbol, base, index }))
}

/// `-20`, `0x10`, `sym`, `sym+8`, `sym-8`, or nothing.
fn displacement(text: &str) -> Option<(i64, Option<String>)> {
    if text.is_empty() {
        return Some((0, None));
    }
    if let Some(v) = number(text) {
        return Some((v, None));
    }
    let split = text[1..].find(['+', '-']).map(|i| i + 1);
    let (sym, off) = match split {
        Some(i) => (&text[..i], number(&text[i..])?),
        None => (text, 0),
    };
    let name_ok = sym.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'$');
    (name_ok && !sym.is_empty()).then(|| (off, Some(sym.to_string())))
}

fn number(text: &str) -> Option<i64> {
    let (neg, t) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok()?,
        None if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t.parse::<u64>().ok()?,
        None => return None,
    };
    Some(if neg { (v as i64).wrapping_neg() } else { v as i64 })
}

impl Arg {
    /// The fetcharg type that reads it: `s32`, `u64`...
    pub fn type_name(&self) -> String {
        format!("{}{}", if self.signed { 's' } else { 'u' }, u32::from(self.size) * 8)
    }

    /// The fetcharg (without its type) that reads it at the marker. `rip_file_offset` turns
    /// a `%rip`-relative operand (its symbol, if any, and displacement) into the file offset
    /// of the memory it names, as `@+OFFSET` reads it; it gets the marker's own address as
    /// the value of %rip after the 1-byte `nop`.
    pub fn fetcharg(&self, rip_file_offset: impl Fn(Option<&str>, i64) -> Option<u64>) -> Result<String, &'static str> {
        match &self.loc {
            Loc::Reg("ip") => Err("%rip itself is not an argument a marker passes"),
            Loc::Reg(r) => Ok(format!("%{r}")),
            Loc::Imm(v) => Ok(format!("\\{v}")),
            Loc::Mem { disp, base, index: Some((index, scale)), .. } if *base != "ip" => {
                Ok(format!("{}{}(%{base},%{index},{scale})", if *disp < 0 { "-" } else { "+" }, disp.unsigned_abs()))
            }
            Loc::Mem { index: Some(_), .. } => Err("an index register with %rip"),
            Loc::Mem { disp, symbol, base: "ip", .. } => match rip_file_offset(symbol.as_deref(), *disp) {
                Some(off) => Ok(format!("@+{off:#x}")),
                None => Err("a %rip-relative operand whose symbol is not in the file"),
            },
            Loc::Mem { symbol: Some(_), .. } => Err("a symbol only relative to %rip"),
            Loc::Mem { disp, base, .. } if *disp < 0 => Ok(format!("-{}(%{base})", disp.unsigned_abs())),
            Loc::Mem { disp, base, .. } => Ok(format!("+{disp}(%{base})")),
        }
    }
}

/// A fetcharg of a USDT definition (`[NAME=]BODY[:TYPE]`) with each `argN` in its body
/// replaced by what `arg` gives for N (1-based): `fn=+0(arg2):string` reads the string the
/// marker's second argument points to. A body that is `argN` alone takes the argument's
/// type when none is written (`arg` gives (fetcharg, type)). Err: the N that `arg` refused.
pub fn substitute(text: &str, arg: impl Fn(u32) -> Option<(String, String)>) -> Result<String, u32> {
    let name_end = text.find('=').filter(|&i| {
        let n = &text[..i];
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    });
    let (head, body) = match name_end {
        Some(i) => text.split_at(i + 1),
        None => ("", text),
    };
    let (value, ty) = match body.rfind(':').filter(|_| !body.contains('"')) {
        Some(i) => (&body[..i], Some(&body[i..])),
        None => (body, None),
    };
    if let Some(n) = value.strip_prefix("arg").and_then(|n| n.parse::<u32>().ok()) {
        let (fetch, own) = arg(n).ok_or(n)?;
        return Ok(format!("{head}{fetch}{}", ty.map_or(format!(":{own}"), str::to_string)));
    }
    let b = value.as_bytes();
    let mut out = String::with_capacity(text.len());
    out.push_str(head);
    let mut i = 0;
    while i < b.len() {
        let word_start = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b'$');
        if word_start && value[i..].starts_with("arg") {
            let digits = value[i + 3..].bytes().take_while(u8::is_ascii_digit).count();
            let end = i + 3 + digits;
            let word_end = b.get(end).is_none_or(|c| !(c.is_ascii_alphanumeric() || *c == b'_'));
            if digits > 0 && word_end {
                let n: u32 = value[i + 3..end].parse().map_err(|_| 0u32)?;
                out.push_str(&arg(n).ok_or(n)?.0);
                i = end;
                continue;
            }
        }
        let c = value[i..].chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
    out.push_str(ty.unwrap_or(""));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(provider: &str, name: &str, args: &str, pc: u64, base: u64, sem: u64) -> Vec<u8> {
        let mut desc = Vec::new();
        for w in [pc, base, sem] {
            desc.extend_from_slice(&w.to_le_bytes());
        }
        for s in [provider, name, args] {
            desc.extend_from_slice(s.as_bytes());
            desc.push(0);
        }
        let mut out = Vec::new();
        out.extend_from_slice(&8u32.to_le_bytes());
        out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        out.extend_from_slice(&NT_STAPSDT.to_le_bytes());
        out.extend_from_slice(b"stapsdt\0");
        out.extend_from_slice(&desc);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    #[test]
    fn notes_give_markers_and_skip_others() {
        let mut sec = note("python", "function__entry", "8@%rbp 8@%r12 -4@%eax", 0x4f20a1, 0x8cc5a0, 0xa84260);
        // A foreign note in between (GNU build-id) is skipped.
        sec.extend_from_slice(&4u32.to_le_bytes());
        sec.extend_from_slice(&4u32.to_le_bytes());
        sec.extend_from_slice(&3u32.to_le_bytes());
        sec.extend_from_slice(b"GNU\0abcd");
        sec.extend(note("app", "tick", "", 0x1139, 0x2000, 0));
        let m = markers(&sec, Some(0x8cc5a0));
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[0],
            Marker {
                provider: "python".into(),
                name: "function__entry".into(),
                pc: 0x4f20a1,
                semaphore: 0xa84260,
                args: "8@%rbp 8@%r12 -4@%eax".into()
            }
        );
        assert_eq!((m[1].name.as_str(), m[1].semaphore, m[1].args.as_str()), ("tick", 0, ""));
        // Cut short: what is whole is kept, the rest is not read past the end.
        assert_eq!(markers(&sec[..sec.len() - 3], None).len(), 1);
        assert!(markers(&[1, 2, 3], None).is_empty());
    }

    #[test]
    fn prelink_moves_marker_and_semaphore_by_the_base_difference() {
        let sec = note("p", "n", "", 0x1000, 0x3000, 0x5000);
        let m = &markers(&sec, Some(0x13000))[0];
        assert_eq!((m.pc, m.semaphore), (0x11000, 0x15000));
        let none = note("p", "n", "", 0x1000, 0x3000, 0);
        assert_eq!(markers(&none, Some(0x13000))[0].semaphore, 0);
        assert_eq!(markers(&sec, None)[0].pc, 0x1000);
    }

    #[test]
    fn argument_specs() {
        let a = |s: &str| parse_arg(s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a("8@%rbx"), Arg { size: 8, signed: false, loc: Loc::Reg("bx") });
        assert_eq!(a("-4@%eax"), Arg { size: 4, signed: true, loc: Loc::Reg("ax") });
        assert_eq!(a("-1@%r12b").loc, Loc::Reg("r12"));
        assert_eq!(
            a("-4@-20(%rbp)"),
            Arg { size: 4, signed: true, loc: Loc::Mem { disp: -20, symbol: None, base: "bp", index: None } }
        );
        assert_eq!(a("8@$5"), Arg { size: 8, signed: false, loc: Loc::Imm(5) });
        assert_eq!(a("-4@$-3").loc, Loc::Imm(-3));
        assert_eq!(a("8@16(%rsp,%rax,8)").loc, Loc::Mem { disp: 16, symbol: None, base: "sp", index: Some(("ax", 8)) });
        assert_eq!(
            a("4@counter+8(%rip)").loc,
            Loc::Mem { disp: 8, symbol: Some("counter".into()), base: "ip", index: None }
        );
        // Old notes: no size, the register's width.
        assert_eq!(a("%ax"), Arg { size: 2, signed: false, loc: Loc::Reg("ax") });
        assert_eq!(a("(%rdi)").loc, Loc::Mem { disp: 0, symbol: None, base: "di", index: None });
        assert_eq!(parse_args("8@%rbp 8@%r12 -4@%eax").unwrap().len(), 3);
        assert!(parse_args("").unwrap().is_empty());
        for bad in ["3@%rax", "8@%xmm0", "8@", "8@16(%rsp", "8@16(%rsp,%rax,3)", "8@x(%rbx)", "8@$"] {
            assert!(parse_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fetchargs_and_types() {
        let f = |s: &str| {
            let a = parse_arg(s).unwrap();
            (a.fetcharg(|sym, d| (sym == Some("counter")).then_some((0x3010 + d) as u64)), a.type_name())
        };
        assert_eq!(f("8@%rbx"), (Ok("%bx".into()), "u64".into()));
        assert_eq!(f("-4@%ebp"), (Ok("%bp".into()), "s32".into()));
        assert_eq!(f("-4@-20(%rbp)"), (Ok("-20(%bp)".into()), "s32".into()));
        assert_eq!(f("-4@112(%rsp)"), (Ok("+112(%sp)".into()), "s32".into()));
        assert_eq!(f("8@$5"), (Ok("\\5".into()), "u64".into()));
        assert_eq!(f("2@counter+4(%rip)"), (Ok("@+0x3014".into()), "u16".into()));
        assert!(f("8@other(%rip)").0.is_err());
        assert_eq!(f("8@16(%rsp,%rax,8)").0, Ok("+16(%sp,%ax,8)".into()));
        assert_eq!(f("8@(%rsi,%rdx,8)").0, Ok("+0(%si,%dx,8)".into()));
    }

    #[test]
    fn arguments_by_number_in_fetchargs() {
        let args = ["%bp:u64", "%r12:u64", "%ax:s32"];
        let arg = |n: u32| {
            let (f, t) = args.get(n as usize - 1)?.split_once(':')?;
            Some((f.to_string(), t.to_string()))
        };
        assert_eq!(substitute("fn=+0(arg2):string", arg), Ok("fn=+0(%r12):string".into()));
        assert_eq!(substitute("arg3", arg), Ok("%ax:s32".into()));
        assert_eq!(substitute("line=arg3:u8", arg), Ok("line=%ax:u8".into()));
        assert_eq!(substitute("arg1=+8(+0(arg1))", arg), Ok("arg1=+8(+0(%bp))".into()));
        assert_eq!(substitute("x=$arg1", arg), Ok("x=$arg1".into()));
        assert_eq!(substitute("x=+0(arg9)", arg), Err(9));
    }
}
