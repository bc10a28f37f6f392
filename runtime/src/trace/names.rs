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

/// Whether `name` matches the glob `pattern`: `*` any run, `?` one byte, `[abc]` and
/// `[a-z]` a class (`[!...]` negated).
pub fn glob(pattern: &str, name: &str) -> bool {
    // One matcher for names and for filters: the kernel's `glob_match`, byte by byte.
    uprobe_contracts::filter::glob(pattern.as_bytes(), name.as_bytes())
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
