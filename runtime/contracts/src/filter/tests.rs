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
    assert!(passes("delta < 0x7fffffff", Hit(0, -1, "", 0, 0)));
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
    assert_eq!(bad("size == -1").what, "an unsigned 64-bit number (0 to 18446744073709551615) for size (u64), not -1");
    assert_eq!(
        bad("delta == 9223372036854775808").what,
        "a signed 32-bit number (-2147483648 to 2147483647) for delta (s32), not 9223372036854775808"
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

#[test]
fn constants_are_checked_against_the_width_of_their_field() {
    let f = fields("p t:f a=%di:u8 b=%si:s8 c=%dx:u16 d=%cx:s16 e=%r8:u32 g=%r9:s64 h=%ax:b4@4/32 x=%bx:x8");
    let c = |text: &str| compile(text, &f);
    for good in [
        "a == 255",
        "a == 0xff",
        "b == -128",
        "b == 127",
        "c == 65535",
        "d == -32768",
        "e == 4294967295",
        "g == -9223372036854775808",
        "h == 15",
        "x == 0xff",
        "tid == 2147483647",
        "tid == -1",
        "cpu == 4294967295",
    ] {
        assert!(c(good).is_ok(), "{good}: {:?}", c(good));
    }
    for (text, what) in [
        ("a == 256", "an unsigned 8-bit number (0 to 255) for a (u8), not 256"),
        ("b == 200", "a signed 8-bit number (-128 to 127) for b (s8), not 200"),
        ("b == -129", "a signed 8-bit number (-128 to 127) for b (s8), not -129"),
        ("b == 0xff", "a signed 8-bit number (-128 to 127) for b (s8), not 0xff"),
        ("c == 65536", "an unsigned 16-bit number (0 to 65535) for c (u16), not 65536"),
        ("d == 32768", "a signed 16-bit number (-32768 to 32767) for d (s16), not 32768"),
        ("e == 0x100000000", "an unsigned 32-bit number (0 to 4294967295) for e (u32), not 0x100000000"),
        ("h == 16", "an unsigned 4-bit number (0 to 15) for h (b4), not 16"),
        ("x == 0x100", "an unsigned 8-bit number (0 to 255) for x (x8), not 0x100"),
        ("tid == 99999999999", "a signed 32-bit number (-2147483648 to 2147483647) for tid (s32), not 99999999999"),
        ("tid == abc", "a signed 32-bit number (-2147483648 to 2147483647) for tid (s32), not abc"),
        ("cpu == -1", "an unsigned 32-bit number (0 to 4294967295) for cpu (u32), not -1"),
        ("cpu == 4294967296", "an unsigned 32-bit number (0 to 4294967295) for cpu (u32), not 4294967296"),
    ] {
        let e = c(text).expect_err(text);
        assert_eq!((e.at, e.what.as_str()), (text.find("== ").unwrap() + 3, what), "{text}");
    }
    // The check is per comparison: a wide field beside a narrow one keeps its own range.
    let e = c("g == 300 && a == 300").unwrap_err();
    assert_eq!(e.at, 17);
    let r = fields("r t:f ret=$retval:u16");
    assert!(compile("$retval == 70000", &r).unwrap_err().what.starts_with("an unsigned 16-bit number"));
    assert!(compile("$retval == 0xffffffffffffffff", &fields("r t:f")).is_ok());
}

#[test]
fn enumerators_and_bools_compare_by_name_or_number() {
    let fields = fields("p t:f c=%di:s32{RED=0,GREEN=5,DOWN=-1} ok=%si:bool n=%dx:u8{A=200}");
    let program = |text: &str| compile(text, &fields).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(program("c == GREEN"), program("c == 5"));
    assert_eq!(program("c == DOWN"), program("c == -1"), "a signed enumerator as the sign-extended number");
    assert_eq!(program("ok == true && n != A"), program("ok == 1 && n != 200"));
    let e = compile("c == PURPLE", &fields).unwrap_err();
    assert_eq!(
        e.what,
        "a signed 32-bit number (-2147483648 to 2147483647) or one of its names (RED, GREEN, DOWN) for c (s32), not PURPLE"
    );
    assert!(compile("n == true", &fields).is_err(), "a name of another field");
}
