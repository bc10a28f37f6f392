//! A compiled predicate: a fixed array of nodes, children before their parents, the root
//! last; its one-line text form (what travels in the run spec); and its evaluation, which
//! runs at the hit: no allocation, no lock, no system call, recursion bounded by
//! [`MAX_NODES`], every value read through [`Fields`] (the runtime's fault-safe fetch).
//!
//! A comparison whose value cannot be read (a bad pointer) does not decide anything: the
//! whole predicate fails, whatever `!` or `||` surround it, unless short-circuiting never
//! reached it.

use super::FilterError;

/// The most nodes a program may have (comparisons and operators together).
pub const MAX_NODES: usize = 64;
/// The longest string a comparison reads, and the longest literal it compares with; a longer
/// string is compared by its first `MAX_STRING` bytes.
pub const MAX_STRING: usize = 255;

/// What a comparison reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// The event's fetcharg, by index.
    Arg(u8),
    /// The return value (`$retval`, %ax at a return event).
    Retval,
    /// The thread id (`tid`, `common_pid`).
    Tid,
    /// The CPU the hit runs on (`cpu`).
    Cpu,
    /// The thread's name (`comm`).
    Comm,
}

/// A comparison of numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `&`: some bit in common.
    Band,
}

/// A comparison of strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `~`: a glob (`*`, `?`, `[...]`).
    Glob,
}

/// One node of a [`Program`]: a comparison, or an operator on earlier nodes (by index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// A number compared with a constant; `signed`: both as i64.
    Num {
        /// What is read.
        field: Field,
        /// How it is compared.
        op: NumOp,
        /// Whether both sides are signed.
        signed: bool,
        /// The constant.
        value: u64,
    },
    /// A string compared with `patterns[pattern]`.
    Str {
        /// What is read.
        field: Field,
        /// How it is compared.
        op: StrOp,
        /// The index of the pattern in [`Program::patterns`].
        pattern: u16,
    },
    /// `&&` of two earlier nodes.
    And(u16, u16),
    /// `||` of two earlier nodes.
    Or(u16, u16),
    /// `!` of an earlier node.
    Not(u16),
}

/// A compiled predicate (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    /// Children before parents; the last is the root.
    pub nodes: Vec<Node>,
    /// The string literals the [`Node::Str`] comparisons name.
    pub patterns: Vec<Vec<u8>>,
}

/// How a hit's values are read: numbers as their fetcharg's type says (bitfields extracted,
/// signed types sign-extended to 64 bits), strings copied into `buf`. None: the value could
/// not be read.
pub trait Fields {
    /// The number, as its fetcharg's type says; None: it could not be read.
    fn number(&mut self, field: Field) -> Option<u64>;
    /// The string's length in `buf` (`buf.len()` when it is longer).
    fn string(&mut self, field: Field, buf: &mut [u8]) -> Option<usize>;
    /// Whether string `field` compares to `pattern` as `op` says; None: it could not be
    /// read. By default [`compare_string`]; an implementation may run that elsewhere (the
    /// runtime's, with the vector registers saved: the compiler clears its buffer with them).
    fn compare_string(&mut self, field: Field, op: StrOp, pattern: &[u8]) -> Option<bool>
    where
        Self: Sized,
    {
        compare_string(self, field, op, pattern)
    }
}

/// Whether string `field` of `f`, copied into a buffer of `MAX_STRING` bytes, compares to
/// `pattern` as `op` says; None: it could not be read.
pub fn compare_string(f: &mut impl Fields, field: Field, op: StrOp, pattern: &[u8]) -> Option<bool> {
    let mut buf = [0u8; MAX_STRING + 1];
    let n = f.string(field, &mut buf[..MAX_STRING])?.min(MAX_STRING);
    let s = &buf[..n];
    Some(match op {
        StrOp::Eq => s == pattern,
        StrOp::Ne => s != pattern,
        StrOp::Glob => glob(pattern, s),
    })
}

impl Program {
    /// Whether the hit passes (false when a value it needed could not be read).
    #[inline(always)]
    pub fn passes(&self, fields: &mut impl Fields) -> bool {
        // One comparison (the common case) is evaluated here, without a call.
        match self.nodes.last() {
            Some(&Node::Num { field, op, signed, value }) => compare(fields.number(field), op, signed, value),
            Some(_) => self.eval(self.nodes.len() - 1, fields) == Some(true),
            None => false,
        }
    }

    fn eval(&self, i: usize, f: &mut impl Fields) -> Option<bool> {
        match self.nodes[i] {
            Node::Num { field, op, signed, value } => {
                let v = f.number(field)?;
                Some(compare(Some(v), op, signed, value))
            }
            Node::Str { field, op, pattern } => {
                f.compare_string(field, op, self.patterns[usize::from(pattern)].as_slice())
            }
            Node::And(l, r) => Some(self.eval(l.into(), f)? && self.eval(r.into(), f)?),
            Node::Or(l, r) => Some(self.eval(l.into(), f)? || self.eval(r.into(), f)?),
            Node::Not(c) => Some(!self.eval(c.into(), f)?),
        }
    }

    /// Both programs: a hit passes when it passes each (`--filter` on an event that has
    /// `if` already).
    pub fn and(mut self, other: &Program) -> Program {
        let (base, strings) = (self.nodes.len() as u16, self.patterns.len() as u16);
        let left = base - 1;
        self.patterns.extend(other.patterns.iter().cloned());
        self.nodes.extend(other.nodes.iter().map(|n| match *n {
            Node::Str { field, op, pattern } => Node::Str { field, op, pattern: pattern + strings },
            Node::And(l, r) => Node::And(l + base, r + base),
            Node::Or(l, r) => Node::Or(l + base, r + base),
            Node::Not(c) => Node::Not(c + base),
            num => num,
        }));
        let right = self.nodes.len() as u16 - 1;
        self.nodes.push(Node::And(left, right));
        self
    }

    /// The fields the program reads.
    pub fn fields(&self) -> impl Iterator<Item = (Field, bool)> + '_ {
        self.nodes.iter().filter_map(|n| match *n {
            Node::Num { field, .. } => Some((field, false)),
            Node::Str { field, .. } => Some((field, true)),
            _ => None,
        })
    }

    /// The program as one line of words (no tab, no newline): `n,FIELD,OP,s|u,VALUE`,
    /// `s,FIELD,OP,HEX`, `and,L,R`, `or,L,R`, `not,C`.
    pub fn encode(&self) -> String {
        let mut words = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            words.push(match *n {
                Node::Num { field, op, signed, value } => {
                    format!("n,{},{},{},{value}", field_name(field), num_op(op), if signed { "s" } else { "u" })
                }
                Node::Str { field, op, pattern } => {
                    let hex: String = self.patterns[usize::from(pattern)].iter().map(|b| format!("{b:02x}")).collect();
                    format!("s,{},{},{hex}", field_name(field), str_op(op))
                }
                Node::And(l, r) => format!("and,{l},{r}"),
                Node::Or(l, r) => format!("or,{l},{r}"),
                Node::Not(c) => format!("not,{c}"),
            });
        }
        words.join(" ")
    }

    /// Reads [`Program::encode`]'s text, checking every index (children before parents, so
    /// evaluation ends) and limit.
    pub fn decode(text: &str) -> Result<Program, FilterError> {
        let mut p = Program::default();
        let bad = |at: usize, what: &str| FilterError { at, what: what.to_string() };
        let mut at = 0;
        for word in text.split(' ') {
            let here = p.nodes.len();
            let parts: Vec<&str> = word.split(',').collect();
            let child = |s: &str| match s.parse::<u16>() {
                Ok(c) if usize::from(c) < here => Ok(c),
                _ => Err(bad(at, "a node number below its parent's")),
            };
            let node = match parts.as_slice() {
                ["n", f, o, s, v] => Node::Num {
                    field: parse_field(f).ok_or_else(|| bad(at, "a field"))?,
                    op: parse_num_op(o).ok_or_else(|| bad(at, "a number operator"))?,
                    signed: match *s {
                        "s" => true,
                        "u" => false,
                        _ => return Err(bad(at, "s or u")),
                    },
                    value: v.parse().map_err(|_| bad(at, "a value"))?,
                },
                ["s", f, o, hex] => {
                    if hex.len() % 2 != 0 || hex.len() / 2 > MAX_STRING {
                        return Err(bad(at, "a string of hex digit pairs"));
                    }
                    let bytes = (0..hex.len() / 2)
                        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
                        .collect::<Result<Vec<u8>, _>>()
                        .map_err(|_| bad(at, "a string of hex digit pairs"))?;
                    p.patterns.push(bytes);
                    Node::Str {
                        field: parse_field(f).ok_or_else(|| bad(at, "a field"))?,
                        op: parse_str_op(o).ok_or_else(|| bad(at, "a string operator"))?,
                        pattern: (p.patterns.len() - 1) as u16,
                    }
                }
                ["and", l, r] => Node::And(child(l)?, child(r)?),
                ["or", l, r] => Node::Or(child(l)?, child(r)?),
                ["not", c] => Node::Not(child(c)?),
                _ => return Err(bad(at, "a node")),
            };
            p.nodes.push(node);
            if p.nodes.len() > MAX_NODES {
                return Err(bad(at, "at most 64 nodes"));
            }
            at += word.len() + 1;
        }
        Ok(p)
    }
}

fn field_name(f: Field) -> String {
    match f {
        Field::Arg(i) => format!("a{i}"),
        Field::Retval => "ret".into(),
        Field::Tid => "tid".into(),
        Field::Cpu => "cpu".into(),
        Field::Comm => "comm".into(),
    }
}

fn parse_field(s: &str) -> Option<Field> {
    Some(match s {
        "ret" => Field::Retval,
        "tid" => Field::Tid,
        "cpu" => Field::Cpu,
        "comm" => Field::Comm,
        _ => Field::Arg(s.strip_prefix('a')?.parse().ok()?),
    })
}

const NUM_OPS: [(NumOp, &str); 7] = [
    (NumOp::Eq, "eq"),
    (NumOp::Ne, "ne"),
    (NumOp::Lt, "lt"),
    (NumOp::Le, "le"),
    (NumOp::Gt, "gt"),
    (NumOp::Ge, "ge"),
    (NumOp::Band, "band"),
];
const STR_OPS: [(StrOp, &str); 3] = [(StrOp::Eq, "eq"), (StrOp::Ne, "ne"), (StrOp::Glob, "glob")];

fn num_op(op: NumOp) -> &'static str {
    NUM_OPS.iter().find(|(o, _)| *o == op).map_or("", |(_, n)| n)
}
fn str_op(op: StrOp) -> &'static str {
    STR_OPS.iter().find(|(o, _)| *o == op).map_or("", |(_, n)| n)
}
fn parse_num_op(s: &str) -> Option<NumOp> {
    NUM_OPS.iter().find(|(_, n)| *n == s).map(|(o, _)| *o)
}
fn parse_str_op(s: &str) -> Option<StrOp> {
    STR_OPS.iter().find(|(_, n)| *n == s).map(|(o, _)| *o)
}

/// A number comparison: false when the value could not be read.
#[inline(always)]
fn compare(v: Option<u64>, op: NumOp, signed: bool, value: u64) -> bool {
    let Some(v) = v else { return false };
    match (op, signed) {
        (NumOp::Eq, _) => v == value,
        (NumOp::Ne, _) => v != value,
        (NumOp::Band, _) => v & value != 0,
        (NumOp::Lt, false) => v < value,
        (NumOp::Le, false) => v <= value,
        (NumOp::Gt, false) => v > value,
        (NumOp::Ge, false) => v >= value,
        (NumOp::Lt, true) => (v as i64) < value as i64,
        (NumOp::Le, true) => (v as i64) <= value as i64,
        (NumOp::Gt, true) => (v as i64) > value as i64,
        (NumOp::Ge, true) => (v as i64) >= value as i64,
    }
}

/// Whether `s` matches the glob `p`, as the kernel's `glob_match`: `*` any run, `?` one
/// byte, `[abc]`, `[a-z]` and `[!...]` classes. No allocation; one backtracking point.
pub fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        let step = match p.get(pi) {
            Some(b'*') => {
                star = Some((pi + 1, si));
                pi += 1;
                continue;
            }
            Some(b'?') => Some(pi + 1),
            Some(b'[') => match class(p, pi, s[si]) {
                Some((true, next)) => Some(next),
                Some((false, _)) => None,
                None if s[si] == b'[' => Some(pi + 1),
                None => None,
            },
            Some(&c) if c == s[si] => Some(pi + 1),
            _ => None,
        };
        match (step, star) {
            (Some(next), _) => {
                pi = next;
                si += 1;
            }
            (None, Some((sp, ss))) => {
                pi = sp;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            (None, None) => return false,
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// A `[...]` class at `p[at]` tried on `c`: (matched, the index after it), or None if the
/// class is not closed (then `[` is a plain byte).
fn class(p: &[u8], at: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = at + 1;
    let negate = matches!(p.get(i), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let first = i;
    while i < p.len() && (p[i] != b']' || i == first) {
        if p.get(i + 1) == Some(&b'-') && p.get(i + 2).is_some_and(|&e| e != b']') {
            matched |= (p[i]..=p[i + 2]).contains(&c);
            i += 3;
        } else {
            matched |= p[i] == c;
            i += 1;
        }
    }
    (i < p.len()).then_some((matched != negate, i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_as_the_kernel_matches_them() {
        let g = |p: &str, s: &str| glob(p.as_bytes(), s.as_bytes());
        assert!(g("*", "") && g("*", "abc") && g("a*", "abc") && g("*c", "abc") && g("*b*", "abc"));
        assert!(g("a?c", "abc") && !g("a?c", "ac") && g("[ab]x", "bx") && !g("[!ab]x", "bx"));
        assert!(g("[a-c]*.txt", "b1.txt") && !g("[a-c]*.txt", "d1.txt") && g("a[", "a["));
        assert!(!g("abc", "abcd") && !g("*.c", "x.h") && g("*a*a*a", "aaaa") && !g("*a*a*b", "aaaa"));
    }

    #[test]
    fn text_form_round_trips_and_is_checked() {
        let p = Program {
            nodes: vec![
                Node::Num { field: Field::Arg(2), op: NumOp::Ge, signed: false, value: 65536 },
                Node::Str { field: Field::Comm, op: StrOp::Glob, pattern: 0 },
                Node::Not(1),
                Node::Or(0, 2),
                Node::Num { field: Field::Retval, op: NumOp::Lt, signed: true, value: (-1i64) as u64 },
                Node::And(3, 4),
                Node::Num { field: Field::Tid, op: NumOp::Band, signed: false, value: 1 },
                Node::Num { field: Field::Cpu, op: NumOp::Ne, signed: false, value: 0 },
                Node::Str { field: Field::Arg(0), op: StrOp::Ne, pattern: 1 },
                Node::Or(7, 8),
                Node::Or(6, 9),
                Node::And(5, 10),
            ],
            patterns: vec![b"sq*".to_vec(), b"".to_vec()],
        };
        let text = p.encode();
        assert!(!text.contains(['\t', '\n']));
        assert_eq!(Program::decode(&text), Ok(p));
        assert_eq!(Program::decode("not,0").unwrap_err().what, "a node number below its parent's");
        assert!(Program::decode("n,a1,gt,u,x").is_err() && Program::decode("s,comm,eq,6").is_err());
        assert!(Program::decode("n,zz,eq,u,1").is_err() && Program::decode("x").is_err());
        let big = vec!["n,tid,eq,u,1"; MAX_NODES + 1].join(" ");
        assert!(Program::decode(&big).is_err());
    }

    struct Hit {
        size: u64,
        name: Option<&'static str>,
        reads: usize,
    }
    impl Fields for Hit {
        fn number(&mut self, f: Field) -> Option<u64> {
            self.reads += 1;
            match f {
                Field::Arg(0) => Some(self.size),
                _ => Some(7),
            }
        }
        fn string(&mut self, _: Field, buf: &mut [u8]) -> Option<usize> {
            self.reads += 1;
            let s = self.name?.as_bytes();
            let n = s.len().min(buf.len());
            buf[..n].copy_from_slice(&s[..n]);
            Some(n)
        }
    }

    #[test]
    fn a_fault_fails_the_predicate_and_or_short_circuits() {
        let p = Program::decode("n,a0,gt,u,10 s,a1,eq,6162 not,1 or,0,2").unwrap();
        let mut fault = Hit { size: 100, name: None, reads: 0 };
        assert!(p.passes(&mut fault), "the left side decides: the string is not read");
        assert_eq!(fault.reads, 1);
        let mut fault = Hit { size: 1, name: None, reads: 0 };
        assert!(!p.passes(&mut fault), "!(fault) does not pass");
        assert!(p.passes(&mut Hit { size: 1, name: Some("x"), reads: 0 }));
        assert!(!p.passes(&mut Hit { size: 1, name: Some("ab"), reads: 0 }));
        let signed = Program::decode(&format!("n,a0,lt,s,{}", (-5i64) as u64)).unwrap();
        assert!(signed.passes(&mut Hit { size: (-6i64) as u64, name: None, reads: 0 }));
        assert!(!signed.passes(&mut Hit { size: 3, name: None, reads: 0 }));
        assert!(!Program::default().passes(&mut Hit { size: 3, name: None, reads: 0 }));
    }
}
