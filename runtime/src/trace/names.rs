//! Function names as people write them: C++ and Rust symbols demangled, and globs. Pure.

/// The demangled form of a C++ (`_Z...`) or Rust (`_R...`, legacy `_ZN...h<hash>E`) symbol,
/// or None for a plain C name. Rust names lose their hash, as in backtraces.
pub fn demangle(name: &str) -> Option<String> {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return Some(format!("{d:#}"));
    }
    if name.starts_with("_Z") {
        let sym = cpp_demangle::Symbol::new(name).ok()?;
        return sym.demangle(&cpp_demangle::DemangleOptions::default()).ok();
    }
    None
}

/// A demangled name without its parameter list (`ns::f(int)` -> `ns::f`).
pub fn without_parameters(name: &str) -> &str {
    let mut depth = 0i32;
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth == 0 && i > 0 && !name[..i].ends_with("operator") => return &name[..i],
            _ => {}
        }
    }
    name
}

/// Whether `name` matches the glob `pattern`: `*` any run, `?` one character, `[abc]` and
/// `[a-z]` a class (`[!...]` negated).
pub fn glob(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ni));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    ni += 1;
                    continue;
                }
                '[' => {
                    if let Some((matched, next)) = class(&p, pi, n[ni]) {
                        if matched {
                            pi = next;
                            ni += 1;
                            continue;
                        }
                    } else if n[ni] == '[' {
                        pi += 1;
                        ni += 1;
                        continue;
                    }
                }
                c if c == n[ni] => {
                    pi += 1;
                    ni += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, sn)) => {
                pi = sp + 1;
                ni = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Matches `c` against the class starting at `p[at] == '['`: (matched, index after `]`).
fn class(p: &[char], at: usize, c: char) -> Option<(bool, usize)> {
    let mut i = at + 1;
    let negate = p.get(i) == Some(&'!');
    if negate {
        i += 1;
    }
    let mut matched = false;
    let start = i;
    while i < p.len() && (p[i] != ']' || i == start) {
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            matched |= p[i] <= c && c <= p[i + 2];
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
    fn demangles_cpp_and_rust() {
        assert_eq!(demangle("_ZN2ns4workEi").as_deref(), Some("ns::work(int)"));
        assert_eq!(demangle("_ZN4core3fmt5write17h0123456789abcdefE").as_deref(), Some("core::fmt::write"));
        assert_eq!(demangle("malloc"), None);
        assert_eq!(without_parameters("ns::work(int, char const*)"), "ns::work");
        assert_eq!(without_parameters("std::vector<int>::push_back(int&&)"), "std::vector<int>::push_back");
        assert_eq!(without_parameters("ns::operator()(int)"), "ns::operator()");
    }

    #[test]
    fn globs() {
        assert!(glob("str*", "strlen") && glob("str*", "str") && !glob("str*", "memstr"));
        assert!(glob("*len", "strlen") && glob("s?r*", "strlen") && !glob("s?r", "strlen"));
        assert!(glob("[a-c]dd", "add") && !glob("[!a]dd", "add") && glob("*::work*", "ns::work(int)"));
        assert!(glob("*", "") && !glob("a", ""));
    }
}
