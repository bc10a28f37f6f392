use super::*;
use crate::def;

fn fields(text: &str) -> Vec<FieldInfo> {
    fields_of(&def::parse(text).unwrap())
}

fn entry() -> Vec<FieldInfo> {
    fields("p t:f size=%di:u64 delta=%si:s32 name=+0(%dx):string flags=%cx:x16 v=+0(%di):u8[2]")
}

fn ok(text: &str) -> Program {
    compile(text, &entry()).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn bad(text: &str) -> FilterError {
    compile(text, &entry()).expect_err(text)
}

/// Evaluates `p` on one hit's values (size, delta, name, flags, tid).
struct Hit(u64, i64, &'static str, u64, i32);
impl Fields for Hit {
    fn number(&mut self, f: Field) -> Option<u64> {
        Some(match f {
            Field::Arg(0) => self.0,
            Field::Arg(1) => self.1 as u64,
            Field::Arg(3) => self.3,
            Field::Tid => self.4 as i64 as u64,
            Field::Cpu => 1,
            _ => return None,
        })
    }
    fn string(&mut self, f: Field, buf: &mut [u8]) -> Option<usize> {
        let s = match f {
            Field::Arg(2) => self.2,
            Field::Comm => "sqlite3",
            _ => return None,
        };
        buf[..s.len()].copy_from_slice(s.as_bytes());
        Some(s.len())
    }
}

fn passes(text: &str, hit: Hit) -> bool {
    ok(text).passes(&mut { hit })
}

#[test]
fn every_number_operator_signed_and_unsigned() {
    let h = || Hit(4096, -3, "main.db", 0x12, 77);
    for (expr, want) in [
        ("size == 4096", true),
        ("size != 4096", false),
        ("size < 4097", true),
        ("size <= 4096", true),
        ("size > 4096", false),
        ("size >= 4096", true),
        ("size & 0x1000", true),
        ("size & 0xfff", false),
        ("delta < 0", true),
        ("delta >= -3", true),
        ("delta > -3", false),
        ("delta == -3", true),
        ("flags == 022", true),
        ("flags == 0x12", true),
        ("tid == 77 && cpu == 1", true),
        ("common_pid != 77", false),
    ] {
        assert_eq!(passes(expr, h()), want, "{expr}");
    }
    // Unsigned: a huge value is large, not negative.
    assert!(passes("size > 0x7fffffffffffffff", Hit(u64::MAX, 0, "", 0, 0)));
    // Signed: -1 is below every positive number.
    assert!(passes("delta < 0x7fffffffffffffff", Hit(0, -1, "", 0, 0)));
    assert!(!passes("size < 0x7fffffffffffffff", Hit(u64::MAX, 0, "", 0, 0)));
}

#[test]
fn every_string_operator_quoted_or_bare() {
    let h = || Hit(0, 0, "main.db", 0, 0);
    for (expr, want) in [
        ("name == \"main.db\"", true),
        ("name == 'main.db'", true),
        ("name == main.db", true),
        ("name != \"main.db\"", false),
        ("name ~ \"*.db\"", true),
        ("name ~ \"m?in.*\"", true),
        ("name ~ \"[!m]*\"", false),
        ("comm == sqlite3", true),
        ("comm ~ sq*", true),
        ("name == \"\"", false),
    ] {
        assert_eq!(passes(expr, h()), want, "{expr}");
    }
}

#[test]
fn not_then_and_then_or_as_the_kernel_binds_them() {
    let h = || Hit(10, 0, "x", 0, 0);
    // && binds tighter than ||: true || (false && false).
    assert!(passes("size == 10 || size == 1 && size == 2", h()));
    assert!(!passes("(size == 10 || size == 1) && size == 2", h()));
    // ! binds tighter than &&.
    assert!(passes("!size == 1 && size == 10", h()));
    assert!(!passes("!(size == 10 && size == 10)", h()));
    assert!(passes("!!(size == 10)", h()));
    assert!(passes("size==10&&name==x", h()));
    let p = ok("size == 1 || size == 2 && size == 3");
    assert!(matches!(p.nodes.last(), Some(Node::Or(..))));
}

#[test]
fn return_events_have_retval_and_their_own_fetchargs() {
    let r = fields("r t:f ret=$retval:s32");
    let p = compile("$retval < 0 && ret > -5", &r).unwrap();
    assert_eq!(p.nodes[0], Node::Num { field: Field::Arg(0), op: NumOp::Lt, signed: true, value: 0 });
    let plain = fields("r t:f");
    let p = compile("$retval == 0x10", &plain).unwrap();
    assert_eq!(p.nodes[0], Node::Num { field: Field::Retval, op: NumOp::Eq, signed: false, value: 16 });
    let e = compile("size > 1", &plain).unwrap_err();
    assert_eq!(e.at, 0);
    assert!(e.what.starts_with("a field of this event, not size (its fields: $retval, comm"), "{}", e.what);
    let e = compile("$retval > 1", &entry()).unwrap_err();
    assert_eq!(e.what, "a field of this event: $retval is only at a return (r: or %return)");
}

#[test]
fn refusals_name_the_column_and_the_field() {
    let e = bad("size >= 1 && zzz == 2");
    assert_eq!((e.at, e.to_string().starts_with("at column 14: expected a field of this event, not zzz")), (13, true));
    let e = bad("name < \"a\"");
    assert_eq!(e.at, 5);
    assert_eq!(e.what, "==, != or ~ for name, a string (< compares numbers)");
    let e = bad("size ~ \"4*\"");
    assert_eq!(e.what, "==, !=, <, <=, >, >= or & for size, a number (u64): ~ is a glob on strings");
    assert_eq!(bad("size == \"4\"").what, "a number for size (u64), not a string");
    assert_eq!(bad("size == -1").what, "an unsigned 64-bit number for size (u64), not -1");
    assert_eq!(
        bad("delta == 9223372036854775808").what.split(',').next(),
        Some("a signed 64-bit number for delta (s32)")
    );
    assert_eq!(bad("v == 1").what, "one value, not v, an array (u8[2])");
    assert_eq!(bad("size = 1").at, 5);
    assert_eq!(bad("(size == 1").what, "')'");
    assert_eq!(bad("size == 1 size").what, "'&&', '||' or the end of the expression");
    assert_eq!(bad("size").what, "an operator (==, !=, <, <=, >, >=, & or ~) after the field");
    assert_eq!(bad("size ==").at, 7);
    assert_eq!(bad("").what, "an expression (FIELD OP VALUE)");
    assert!(bad("name == \"abc").what.starts_with("a closing"));
    let many = vec!["size == 1"; 40].join(" || ");
    assert!(bad(&many).what.starts_with("at most 64"));
}

#[test]
fn compiled_programs_survive_the_spec() {
    let p = ok("(size >= 65536 || name ~ \"*.db\") && !(comm == sqlite3) && delta < -1");
    assert_eq!(Program::decode(&p.encode()), Ok(p));
}

#[test]
fn programs_are_checked_against_the_event_they_arrive_for() {
    let p = ok("size > 1 && name ~ \"a*\" && delta < 0");
    assert!(fits(&p, &entry()));
    assert!(!fits(&p, &fields("p t:f size=%di:u64")), "no fetchargs 1 and 2 there");
    assert!(!fits(&p, &fields("p t:f size=%di:u64 delta=%si:s32 name=%dx:u64")), "name is a number there");
    assert!(!fits(&p, &fields("p t:f size=%di:s64 delta=%si:s32 name=+0(%dx):string")), "size is signed there");
    let both = p.clone().and(&ok("comm == x || !(tid == 3)"));
    assert!(fits(&both, &entry()));
    assert_eq!(Program::decode(&both.encode()), Ok(both.clone()));
    assert!(both.passes(&mut Hit(2, -1, "ab", 0, 4)));
    assert!(!both.passes(&mut Hit(2, -1, "ab", 0, 3)));
    assert!(!both.passes(&mut Hit(2, 1, "ab", 0, 4)));
}
