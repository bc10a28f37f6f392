//! The run specification, `UPROBE_RUN_SPEC`: what uprobe-run asks of the runtime, as
//! `KEY<TAB>VALUE` records, one a line. A launch hands it over in the environment, an
//! attach over the session's socket; `runtime/src/base/spec.rs` reads it.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::base::error::Error;

/// `UPROBE_RUN_SPEC`: `KEY<TAB>VALUE` records, one a line. Paths must be absolute and,
/// like params, free of newlines (the caller checks).
pub fn run_spec(
    handlers: &[PathBuf],
    params: &[String],
    output: Option<&Path>,
    options: &[String],
    extra: &[(&str, OsString)],
) -> OsString {
    let mut records: Vec<Vec<u8>> = Vec::new();
    let mut record = |key: &str, value: &[u8]| {
        records.push([key.as_bytes(), b"\t", value].concat());
    };
    for handler in handlers {
        record("handlers", handler.as_os_str().as_bytes());
    }
    for param in params {
        record("param", param.as_bytes());
    }
    if let Some(output) = output {
        record("output", output.as_os_str().as_bytes());
    }
    for option in options {
        record("option", option.as_bytes());
    }
    for (key, value) in extra {
        record(key, value.as_bytes());
    }
    OsString::from_vec(records.join(&b'\n'))
}

/// `path` made absolute, if a record can carry it (no newline).
pub fn path(path: &Path) -> Result<PathBuf, Error> {
    if path.as_os_str().as_bytes().contains(&b'\n') {
        return Err(Error::UnusablePath {
            path: path.into(),
            reason: "contains a newline, which UPROBE_RUN_SPEC cannot carry",
        });
    }
    absolute(path)
}

/// `path` made absolute, against the current directory.
pub fn absolute(path: &Path) -> Result<PathBuf, Error> {
    std::path::absolute(path).map_err(|source| Error::Read { path: path.into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_records_in_order() {
        let spec = run_spec(
            &["/h/libcount.so".into(), "/h/libtrace.so".into()],
            &["probes=main,work+4".into(), "x=".into()],
            Some(Path::new("/tmp/out")),
            &["follow-exec".into()],
            &[("event", "p t:add a=%di".into())],
        );
        assert_eq!(
            spec,
            "handlers\t/h/libcount.so\nhandlers\t/h/libtrace.so\n\
             param\tprobes=main,work+4\nparam\tx=\noutput\t/tmp/out\noption\tfollow-exec\nevent\tp t:add a=%di"
        );
        assert_eq!(run_spec(&[], &[], None, &[], &[]), "");
    }
}
