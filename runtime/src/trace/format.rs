//! Records as text, JSON lines and Chrome trace events. Pure: a record's bytes and what is
//! known of its thread in, bytes out.
//!
//! Text is laid out as the kernel's trace shows an event (`comm-tid [cpu] seconds: EVENT:
//! (sym+off) name=value`, a return `(caller <- func)`), each value as the kernel prints its
//! type (`%u`, `%d`, `0x%x`, `'%c'`, `"%s"`, `{a,b}` for arrays); a string that could not be
//! read is `(fault)`, a number that could not be read is 0, as the kernel shows them. JSON
//! gives numbers for `u`/`s` types and bitfields, `"0x..."` strings for `x` types, strings
//! for strings, characters and symbols, and `null` for a value that could not be read or is
//! `$optimized_out` (in text `(optimized out)`, as gdb says it).

use core::fmt::Write;

use crate::trace::chain;
use crate::trace::def::Kind;
use crate::trace::digits::{pad_left, pad_right, zero_pad, Digits};
use crate::trace::fetch::{Base, Fetch, FetchArg, Named, Type};
use crate::trace::record::{CALLER, COMM, FAULT, HEADER_LEN};

/// A fetched value, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// As read (a number of its type's size, or a bitfield's container).
    Num(u64),
    Str(Vec<u8>),
    /// `$comm`: the drain thread knows the thread's name.
    Comm,
    Fault,
    /// `$optimized_out`: the variable has no value at the probe.
    OptimizedOut,
    Array(Vec<Value>),
}

/// A record's fixed part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub event: u32,
    pub clock: u64,
    pub addr: u64,
    pub caller: u64,
    pub cpu: u32,
    pub faults: u32,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

pub fn header(rec: &[u8]) -> Option<Header> {
    let word = u32_at(rec, 24)?;
    let has_caller = (word >> 16) as u16 & CALLER != 0;
    Some(Header {
        event: u32_at(rec, 4)?,
        clock: u64_at(rec, 8)?,
        addr: u64_at(rec, 16)?,
        caller: if has_caller { u64_at(rec, HEADER_LEN)? } else { 0 },
        cpu: word & 0xffff,
        faults: u32_at(rec, 28)?,
    })
}

/// Where a record's fetchargs start: after the fixed part, and the caller word if any.
fn args_start(rec: &[u8]) -> Option<usize> {
    let flags = (u32_at(rec, 24)? >> 16) as u16;
    Some(if flags & CALLER != 0 { HEADER_LEN + 8 } else { HEADER_LEN })
}

/// The fetched values of a record of an event with `args`.
pub fn decode(args: &[FetchArg], rec: &[u8]) -> Option<Vec<Value>> {
    let faults = u32_at(rec, 28)?;
    let mut at = args_start(rec)?;
    let mut out = Vec::with_capacity(args.len());
    for (i, arg) in args.iter().enumerate() {
        if arg.fetch == Fetch::OptimizedOut {
            out.push(Value::OptimizedOut);
            continue;
        }
        if arg.is_stack() {
            out.push(Value::Array(chain::decode(rec, &mut at)?.into_iter().map(Value::Num).collect()));
            continue;
        }
        let faulted = faults & (1 << i) != 0;
        let one = |at: &mut usize| -> Option<Value> {
            if arg.ty.is_string() {
                let len = u32_at(rec, *at)?;
                *at += 4;
                return Some(match len {
                    FAULT => Value::Fault,
                    COMM => Value::Comm,
                    n => {
                        let s = rec.get(*at..*at + n as usize)?.to_vec();
                        *at += n as usize;
                        Value::Str(s)
                    }
                });
            }
            let v = u64_at(rec, *at)?;
            *at += 8;
            Some(if faulted { Value::Fault } else { Value::Num(v) })
        };
        let v = match arg.ty.count {
            Some(n) => Value::Array((0..n).map(|_| one(&mut at)).collect::<Option<Vec<_>>>()?),
            None => one(&mut at)?,
        };
        out.push(v);
    }
    Some(out)
}

/// A stack's frames (`$ustack`).
pub fn frames(v: &Value) -> Vec<u64> {
    let items = if let Value::Array(items) = v { items.as_slice() } else { &[] };
    items.iter().filter_map(|i| if let Value::Num(a) = i { Some(*a) } else { None }).collect()
}

/// A value as read, cut to its type's size or extracted from its bitfield.
pub fn bits_of(ty: &Type, v: u64) -> u64 {
    ty.bits(v)
}

/// A value of a signed type, sign-extended from its size.
pub fn signed(ty: &Type, v: u64) -> i64 {
    ty.sign_extend(v)
}

/// An `f32`/`f64` from its bits, as the shortest text that reads back the same number of
/// its type: positional from 1e-7 up to 1e21 (as JavaScript shows numbers), with an
/// exponent outside (`5e-324`, `1e300`); `NaN`, `inf`, `-inf`. Whether it is finite.
pub fn float(ty: &Type, v: u64) -> (String, bool) {
    fn text<F: core::fmt::Display + core::fmt::LowerExp>(x: F, size: f64) -> (String, bool) {
        let positional = size == 0.0 || !size.is_finite() || (1e-7..1e21).contains(&size);
        (if positional { format!("{x}") } else { format!("{x:e}") }, size.is_finite())
    }
    if ty.size == 4 {
        let x = f32::from_bits(v as u32);
        text(x, f64::from(x).abs())
    } else {
        let x = f64::from_bits(v);
        text(x, x.abs())
    }
}

/// The name `named` gives a number, if one.
fn name_of<'a>(ty: &Type, named: Option<&'a Named>, v: &Value) -> Option<&'a str> {
    match v {
        Value::Num(raw) => named?.name_of(ty, *raw),
        _ => None,
    }
}

/// How values are shown: symbols need the process's symbol tables.
pub trait Symbols {
    fn symbolize(&mut self, addr: u64) -> String;
}

/// One value as the kernel prints it, or by its name where `named` has one.
pub fn text_value(out: &mut Vec<u8>, ty: &Type, named: Option<&Named>, v: &Value, syms: &mut dyn Symbols) {
    if let Some(name) = name_of(ty, named, v) {
        return out.extend_from_slice(name.as_bytes());
    }
    match v {
        Value::Array(items) => {
            out.push(b'{');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                text_value(out, ty, named, item, syms);
            }
            out.push(b'}');
        }
        Value::Str(s) => {
            out.push(b'"');
            out.extend_from_slice(s);
            out.push(b'"');
        }
        Value::Fault if ty.is_string() => out.extend_from_slice(b"(fault)"),
        Value::Comm => out.extend_from_slice(b"\"\""),
        Value::OptimizedOut => out.extend_from_slice(b"(optimized out)"),
        Value::Fault => text_value(out, ty, None, &Value::Num(0), syms),
        Value::Num(raw) => {
            let v = bits_of(ty, *raw);
            let mut digits = Digits::new();
            match ty.base {
                _ if ty.bitfield.is_some() => out.extend_from_slice(digits.of(v, false)),
                Base::Unsigned => out.extend_from_slice(digits.of(v, false)),
                Base::Signed => {
                    let n = signed(ty, v);
                    out.extend_from_slice(digits.of(n.unsigned_abs(), n < 0));
                }
                Base::Hex => {
                    out.extend_from_slice(b"0x");
                    out.extend_from_slice(digits.hex(v));
                }
                Base::Char => out.extend_from_slice(&[b'\'', v as u8, b'\'']),
                Base::Symbol => out.extend_from_slice(syms.symbolize(v).as_bytes()),
                Base::Float => out.extend_from_slice(float(ty, v).0.as_bytes()),
                Base::String => {}
            }
        }
    }
}

/// A JSON string, escaped (bytes that are not UTF-8 become U+FFFD).
pub fn json_string(out: &mut String, bytes: &[u8]) {
    out.push('"');
    for c in String::from_utf8_lossy(bytes).chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// One value as JSON (a named value as its name's string).
pub fn json_value(out: &mut String, ty: &Type, named: Option<&Named>, v: &Value, syms: &mut dyn Symbols) {
    match (name_of(ty, named, v), named) {
        (Some(name), Some(Named::Bool)) => return out.push_str(name),
        (Some(name), _) => return json_string(out, name.as_bytes()),
        (None, _) => {}
    }
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_value(out, ty, named, item, syms);
            }
            out.push(']');
        }
        Value::Fault | Value::OptimizedOut => out.push_str("null"),
        Value::Str(s) => json_string(out, s),
        Value::Comm => out.push_str("\"\""),
        Value::Num(raw) => {
            let v = bits_of(ty, *raw);
            let _ = match ty.base {
                _ if ty.bitfield.is_some() => write!(out, "{v}"),
                Base::Unsigned => write!(out, "{v}"),
                Base::Signed => write!(out, "{}", signed(ty, v)),
                Base::Hex => write!(out, "\"{v:#x}\""),
                Base::Char => {
                    json_string(out, &[v as u8]);
                    Ok(())
                }
                Base::Symbol => {
                    json_string(out, syms.symbolize(v).as_bytes());
                    Ok(())
                }
                Base::Float => match float(ty, v) {
                    (text, true) => write!(out, "{text}"),
                    _ => write!(out, "null"),
                },
                Base::String => Ok(()),
            };
        }
    }
}

/// What a record says, decoded and with its thread known.
pub struct Line<'a> {
    pub name: &'a str,
    pub group: &'a str,
    pub kind: Kind,
    pub args: &'a [FetchArg],
    pub values: &'a [Value],
    pub ns: u64,
    pub pid: i32,
    pub tid: i32,
    pub cpu: u32,
    pub comm: &'a [u8],
    /// The probe (entry events) or the function (return events), as sym+off.
    pub probe: &'a str,
    /// Return events: where the function returns to, as sym+off.
    pub caller: &'a str,
}

impl Line<'_> {
    fn value_of<'v>(&self, v: &'v Value) -> std::borrow::Cow<'v, Value> {
        match v {
            Value::Comm => std::borrow::Cow::Owned(Value::Str(self.comm.to_vec())),
            Value::Array(items) if items.contains(&Value::Comm) => std::borrow::Cow::Owned(Value::Array(
                items
                    .iter()
                    .map(|i| if *i == Value::Comm { Value::Str(self.comm.to_vec()) } else { i.clone() })
                    .collect(),
            )),
            v => std::borrow::Cow::Borrowed(v),
        }
    }

    /// `comm-tid [cpu] seconds: EVENT: (where) name=value ...` and a newline, as
    /// `{comm:>16}-{tid:<7} [{cpu:03}] {s:5}.{us:06}: ` would write it (by hand: the drain
    /// writes millions of these).
    pub fn text(&self, out: &mut Vec<u8>, syms: &mut dyn Symbols) {
        let comm = String::from_utf8_lossy(self.comm);
        pad_left(out, comm.as_bytes(), 16);
        out.push(b'-');
        let mut digits = Digits::new();
        pad_right(out, digits.of(self.tid.unsigned_abs().into(), self.tid < 0), 7);
        out.extend_from_slice(b" [");
        zero_pad(out, u64::from(self.cpu), 3);
        out.extend_from_slice(b"] ");
        pad_left(out, digits.of(self.ns / 1_000_000_000, false), 5);
        out.push(b'.');
        zero_pad(out, self.ns % 1_000_000_000 / 1000, 6);
        out.extend_from_slice(b": ");
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(b": (");
        if self.kind == Kind::Return {
            out.extend_from_slice(self.caller.as_bytes());
            out.extend_from_slice(b" <- ");
        }
        out.extend_from_slice(self.probe.as_bytes());
        out.push(b')');
        let values = || self.args.iter().zip(self.values);
        for (arg, v) in values().filter(|(a, _)| !a.is_stack()) {
            out.push(b' ');
            out.extend_from_slice(arg.name.as_bytes());
            out.push(b'=');
            text_value(out, &arg.ty, arg.named.as_ref(), &self.value_of(v), syms);
        }
        out.push(b'\n');
        // Stacks under the line, as `perf script` prints call chains, and a blank line.
        for (_, v) in values().filter(|(a, _)| a.is_stack()) {
            chain::text(out, &frames(v), &mut |a| syms.symbolize(a));
            out.push(b'\n');
        }
    }

    /// The `args` object: name to value.
    pub fn json_args(&self, out: &mut String, syms: &mut dyn Symbols) {
        out.push('{');
        for (i, (arg, v)) in self.args.iter().zip(self.values).enumerate() {
            if i > 0 {
                out.push(',');
            }
            json_string(out, arg.name.as_bytes());
            out.push(':');
            match arg.is_stack() {
                true => {
                    let names = chain::names(&frames(v), &mut |a| syms.symbolize(a));
                    json_value(
                        out,
                        &arg.ty,
                        None,
                        &Value::Array(names.into_iter().map(|n| Value::Str(n.into())).collect()),
                        syms,
                    )
                }
                false => json_value(out, &arg.ty, arg.named.as_ref(), &self.value_of(v), syms),
            }
        }
        out.push('}');
    }

    /// One JSON object and a newline.
    pub fn json(&self, out: &mut Vec<u8>, syms: &mut dyn Symbols) {
        let mut s = String::new();
        let _ =
            write!(s, "{{\"ts\":{},\"pid\":{},\"tid\":{},\"cpu\":{},\"comm\":", self.ns, self.pid, self.tid, self.cpu);
        json_string(&mut s, self.comm);
        s.push_str(",\"event\":");
        json_string(&mut s, self.name.as_bytes());
        s.push_str(",\"group\":");
        json_string(&mut s, self.group.as_bytes());
        s.push_str(",\"probe\":");
        json_string(&mut s, self.probe.as_bytes());
        if self.kind == Kind::Return {
            s.push_str(",\"func\":");
            json_string(&mut s, self.probe.as_bytes());
            s.push_str(",\"caller\":");
            json_string(&mut s, self.caller.as_bytes());
        }
        s.push_str(",\"args\":");
        self.json_args(&mut s, syms);
        s.push_str("}\n");
        out.extend_from_slice(s.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::fetch::{parse, Site};

    struct NoSymbols;
    impl Symbols for NoSymbols {
        fn symbolize(&mut self, addr: u64) -> String {
            format!("f+{addr:#x}")
        }
    }

    fn args(list: &[&str]) -> Vec<FetchArg> {
        list.iter().enumerate().map(|(i, a)| parse(a, i + 1, Site::Entry).unwrap()).collect()
    }

    fn record(faults: u64, payload: &[u8]) -> Vec<u8> {
        let mut r = vec![0u8; HEADER_LEN];
        r[28..32].copy_from_slice(&(faults as u32).to_le_bytes());
        r.extend_from_slice(payload);
        r
    }

    fn text_of(list: &[&str], values: &[Value]) -> String {
        let args = args(list);
        let line = Line {
            name: "ev",
            group: "g",
            kind: Kind::Entry,
            args: &args,
            values,
            ns: 12_345_678_901,
            pid: 7,
            tid: 8,
            cpu: 1,
            comm: b"prog",
            probe: "add+0x0",
            caller: "",
        };
        let mut out = Vec::new();
        line.text(&mut out, &mut NoSymbols);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn decodes_numbers_strings_arrays_and_faults() {
        let a = args(&["%di", "s=+0(%si):string", "v=+0(%di):u8[2]", "c=$comm"]);
        let mut p = Vec::new();
        p.extend_from_slice(&5u64.to_le_bytes());
        p.extend_from_slice(&2u32.to_le_bytes());
        p.extend_from_slice(b"hi");
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&COMM.to_le_bytes());
        let v = decode(&a, &record(0b100, &p)).unwrap();
        assert_eq!(
            v,
            [Value::Num(5), Value::Str(b"hi".to_vec()), Value::Array(vec![Value::Fault, Value::Fault]), Value::Comm]
        );
        assert_eq!(decode(&a, &record(0, &p[..10])), None);
    }

    #[test]
    fn floats_are_the_shortest_text_of_their_type() {
        let f64s = [
            (2.5, "2.5"),
            (-1.125, "-1.125"),
            (0.0, "0"),
            (1e-7, "0.0000001"),
            (123456789.5, "123456789.5"),
            (1e21, "1e21"),
            (-2.5e-8, "-2.5e-8"),
            (f64::from_bits(1), "5e-324"),
            (f64::MAX, "1.7976931348623157e308"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (x, text) in f64s {
            let ty = parse("%xmm0:f64", 1, Site::Entry).unwrap().ty;
            assert_eq!(float(&ty, x.to_bits()), (text.to_string(), x.is_finite()), "{x:?}");
        }
        let ty = parse("%xmm0:f32", 1, Site::Entry).unwrap().ty;
        assert_eq!(float(&ty, u64::from(0.1f32.to_bits())).0, "0.1");
        assert_eq!(float(&ty, u64::from(3.4e38f32.to_bits())).0, "3.4e38");
        let line = text_of(&["d=%xmm0:f64"], &[Value::Num(f64::from_bits(1).to_bits())]);
        assert!(line.trim_end().ends_with(" d=5e-324"), "{line}");
    }

    #[test]
    fn text_prints_each_type_as_the_kernel_does() {
        let line = text_of(
            &[
                "%di",
                "u=%si:u8",
                "s=%si:s16",
                "x=%si:x32",
                "b=%si:b4@4/8",
                "c=%si:char",
                "n=+0(%di):string",
                "a=+0(%di):s32[2]",
            ],
            &[
                Value::Num(0x1f),
                Value::Num(0x1ff),
                Value::Num(0xffff),
                Value::Num(0x1_0000_00ab),
                Value::Num(0xa5),
                Value::Num(b'A' as u64),
                Value::Fault,
                Value::Array(vec![Value::Num(3), Value::Num(0xffff_fffc)]),
            ],
        );
        assert_eq!(
            line,
            "            prog-8       [001]    12.345678: ev: (add+0x0) arg1=0x1f u=255 s=-1 x=0xab b=10 c='A' n=(fault) a={3,-4}\n"
        );
    }

    #[test]
    fn json_gives_numbers_hex_strings_and_null() {
        let a = args(&["%di", "u=%si:u32", "s=%si:s8", "n=+0(%di):string", "m=+8(%di):u64", "y=%di:symbol"]);
        let values = [
            Value::Num(255),
            Value::Num(7),
            Value::Num(0xfe),
            Value::Str(b"a\"b\n".to_vec()),
            Value::Fault,
            Value::Num(0x10),
        ];
        let line = Line {
            name: "ev",
            group: "g",
            kind: Kind::Return,
            args: &a,
            values: &values,
            ns: 5,
            pid: 1,
            tid: 2,
            cpu: 0,
            comm: b"p",
            probe: "f+0x0",
            caller: "main+0x9",
        };
        let mut out = Vec::new();
        line.json(&mut out, &mut NoSymbols);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"ts\":5,\"pid\":1,\"tid\":2,\"cpu\":0,\"comm\":\"p\",\"event\":\"ev\",\"group\":\"g\",\"probe\":\"f+0x0\",\
             \"func\":\"f+0x0\",\"caller\":\"main+0x9\",\"args\":{\"arg1\":\"0xff\",\"u\":7,\"s\":-2,\
             \"n\":\"a\\\"b\\n\",\"m\":null,\"y\":\"f+0x10\"}}\n"
        );
    }
}
