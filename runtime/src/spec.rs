//! What `uprobe-run` passes to the runtime: the `UPROBE_RUN_SPEC` environment variable,
//! newline-separated `KEY<TAB>VALUE` records.

use thiserror::Error;

pub const ENV_SPEC: &str = "UPROBE_RUN_SPEC";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    /// Handler libraries, in command-line order.
    pub handlers: Vec<String>,
    /// `--param NAME=VALUE` pairs; a later one with the same name wins.
    pub params: Vec<(String, String)>,
    /// Where the runtime writes; None is stderr.
    pub output: Option<String>,
    /// Switches given with `option<TAB>NAME`: `no-optimize`, `verbose`.
    pub options: Vec<String>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("record {0:?} has no tab between key and value")]
    NoTab(String),
    #[error("param record {0:?} has no '='")]
    ParamWithoutValue(String),
    #[error("unknown record key {0:?}")]
    UnknownKey(String),
}

impl Spec {
    pub fn parse(text: &str) -> Result<Spec, SpecError> {
        let mut spec = Spec::default();
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (key, value) = line.split_once('\t').ok_or_else(|| SpecError::NoTab(line.into()))?;
            match key {
                "handlers" => spec.handlers.push(value.into()),
                "param" => {
                    let (name, v) = value.split_once('=').ok_or_else(|| SpecError::ParamWithoutValue(value.into()))?;
                    spec.params.retain(|(n, _)| n != name);
                    spec.params.push((name.into(), v.into()));
                }
                "output" => spec.output = Some(value.into()),
                "option" => spec.options.push(value.into()),
                _ => return Err(SpecError::UnknownKey(key.into())),
            }
        }
        Ok(spec)
    }

    pub fn has_option(&self, name: &str) -> bool {
        self.options.iter().any(|o| o == name)
    }

    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `LD_PRELOAD` without the entries that name `lib` (by path or file name).
pub fn preload_without(preload: &str, lib: &str) -> String {
    let base = lib.rsplit('/').next().unwrap_or(lib);
    preload
        .split([':', ' '])
        .filter(|e| !e.is_empty() && *e != lib && e.rsplit('/').next() != Some(base))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_records_in_order() {
        let s = Spec::parse("handlers\t/a.so\nparam\tv=1\nhandlers\t/b.so\nparam\tv=2=3\noutput\t/o\n").unwrap();
        assert_eq!(s.handlers, ["/a.so", "/b.so"]);
        assert_eq!(s.param("v"), Some("2=3"));
        assert_eq!(s.output.as_deref(), Some("/o"));
        assert_eq!(s.param("w"), None);
    }

    #[test]
    fn rejects_malformed_records() {
        assert_eq!(Spec::parse("handlers /a.so"), Err(SpecError::NoTab("handlers /a.so".into())));
        assert_eq!(Spec::parse("param\tv"), Err(SpecError::ParamWithoutValue("v".into())));
        assert_eq!(Spec::parse("x\ty"), Err(SpecError::UnknownKey("x".into())));
    }

    #[test]
    fn removes_only_our_preload_entry() {
        assert_eq!(preload_without("/x/libuprobe.so", "/x/libuprobe.so"), "");
        assert_eq!(preload_without("/u/a.so:/x/libuprobe.so", "/x/libuprobe.so"), "/u/a.so");
        assert_eq!(preload_without("/u/a.so /y/libuprobe.so b.so", "/x/libuprobe.so"), "/u/a.so:b.so");
    }
}
