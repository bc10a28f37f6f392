//! Probe specs as given in `--param probes=SPEC[,SPEC...]`, and the exit table. Pure.

use core::fmt;

/// Where one probe goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `0xHEX` (optionally `+OFF`): a run-time address.
    Address(u64),
    /// `SYMBOL`, `MODULE:SYMBOL`, either with `+OFF`: passed to the runtime as
    /// `symbol_name` and `offset`.
    Symbol { name: String, offset: u64 },
}

/// One probe: the spec as the user wrote it (for the table) and what it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub text: String,
    pub target: Target,
}

/// Splits a comma-separated list; blanks around specs and empty items are ignored.
pub fn parse_list(list: &str) -> Result<Vec<Spec>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|text| {
            let target = parse_target(text).map_err(|why| format!("bad probe spec '{text}': {why}"))?;
            Ok(Spec { text: text.to_owned(), target })
        })
        .collect()
}

fn parse_target(text: &str) -> Result<Target, &'static str> {
    if text.contains(char::is_whitespace) {
        return Err("contains whitespace");
    }
    // A `+` followed by something other than a number belongs to a module name
    // (`libstdc++.so.6:sym`); one left in the symbol part is a bad offset.
    let (base, offset) =
        text.rsplit_once('+').and_then(|(base, off)| Some((base, parse_number(off)?))).unwrap_or((text, 0));
    if let Some(hex) = hex_digits(base) {
        let addr = parse_hex(hex).ok_or("address is not 0x-hex that fits in 64 bits")?;
        return addr.checked_add(offset).map(Target::Address).ok_or("address + offset overflows");
    }
    let symbol = base.rsplit_once(':').map_or(base, |(_, symbol)| symbol);
    if symbol.contains('+') {
        return Err("offset after '+' is not a decimal or 0x-hex number that fits in 64 bits");
    }
    if symbol.is_empty() || base.starts_with(':') {
        return Err("expected SYMBOL, SYMBOL+OFF, MODULE:SYMBOL[+OFF] or 0xADDRESS");
    }
    if base.contains('\0') {
        return Err("contains a NUL byte");
    }
    Ok(Target::Symbol { name: base.to_owned(), offset })
}

/// Decimal, or hex after `0x`/`0X`.
fn parse_number(s: &str) -> Option<u64> {
    match hex_digits(s) {
        Some(hex) => parse_hex(hex),
        None if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
        None => None,
    }
}

/// What follows a `0x`/`0X` prefix.
fn hex_digits(s: &str) -> Option<&str> {
    s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))
}

/// Hex digits only (`from_str_radix` alone would take a sign).
fn parse_hex(digits: &str) -> Option<u64> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Width of the PROBE column.
const SPEC_WIDTH: usize = 40;

/// `count: PROBE ... ADDRESS ... HITS`
pub fn write_header(w: &mut impl fmt::Write) -> fmt::Result {
    write!(w, "count: {:<SPEC_WIDTH$} {:<18} {:>5}", "PROBE", "ADDRESS", "HITS")
}

/// `count: SPEC 0x%016lx HITS`: exactly three fields after `count: `.
pub fn write_row(w: &mut impl fmt::Write, spec: &str, address: u64, hits: u64) -> fmt::Result {
    write!(w, "count: {spec:<SPEC_WIDTH$} 0x{address:016x} {hits:>5}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn symbol(name: &str, offset: u64) -> Target {
        Target::Symbol { name: name.to_owned(), offset }
    }

    fn targets(list: &str) -> Vec<Target> {
        parse_list(list).unwrap().into_iter().map(|s| s.target).collect()
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(
            targets("main, work+4,libc.so.6:puts+0x10 ,0x401000,0X10+0x2,libstdc++.so.6:f"),
            [
                symbol("main", 0),
                symbol("work", 4),
                symbol("libc.so.6:puts", 16),
                Target::Address(0x401000),
                Target::Address(0x12),
                symbol("libstdc++.so.6:f", 0),
            ]
        );
    }

    #[test]
    fn keeps_the_text_as_written_and_skips_empty_items() {
        let specs = parse_list(" main ,, work+0x4,").unwrap();
        let texts: Vec<_> = specs.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(texts, ["main", "work+0x4"]);
        assert!(parse_list(" , ").unwrap().is_empty());
    }

    #[test]
    fn refuses_malformed_specs() {
        for bad in [
            "+4",
            "main+",
            "0x+5",
            "main+0x+5",
            ":main",
            "libc.so.6:",
            "main+0xzz",
            "0xnothex",
            "a b",
            "main+99999999999999999999",
            "0xffffffffffffffff+1",
        ] {
            let err = parse_list(bad).unwrap_err();
            assert!(err.starts_with(&format!("bad probe spec '{bad}': ")), "{err}");
        }
    }

    #[test]
    fn table_matches_the_documented_layout() {
        let mut out = String::new();
        write_header(&mut out).unwrap();
        assert_eq!(out, "count: PROBE                                    ADDRESS             HITS");
        out.clear();
        write_row(&mut out, "main", 0x55d0_c0a0_1139, 1).unwrap();
        assert_eq!(out, "count: main                                     0x000055d0c0a01139     1");
        out.clear();
        write_row(&mut out, "a_rather_long_symbol_name_that_is_wider_than_the_column", 0, 1234567).unwrap();
        let fields: Vec<_> = out.split_whitespace().collect();
        assert_eq!(
            fields,
            ["count:", "a_rather_long_symbol_name_that_is_wider_than_the_column", "0x0000000000000000", "1234567"]
        );
    }
}
