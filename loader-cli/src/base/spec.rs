//! The run specification, `UPROBE_RUN_SPEC`: what uprobe-run asks of the runtime, built here
//! as a typed `uprobe_contracts::spec::Spec` and encoded there (the runtime decodes it with
//! the same crate). A launch hands it over in the environment, an attach over the session's
//! socket.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use uprobe_contracts::spec::{self, Spec};

use crate::base::error::Error;

/// `rest` with what a launch and an attach session both pass: the handler libraries, the
/// `--param` pairs, the output and the runtime switches by name. Paths must be absolute
/// and free of newlines (see [`path`]); a spec carries UTF-8 only.
pub fn run_spec(
    handlers: &[PathBuf],
    params: &[(String, String)],
    output: Option<&Path>,
    switches: &[&str],
    mut rest: Spec,
) -> Result<Spec, Error> {
    rest.handlers = handlers.iter().map(|h| spec_text(h)).collect::<Result<_, _>>()?;
    rest.params = params.to_vec();
    rest.output = output.map(spec_text).transpose()?;
    for name in switches {
        rest.options.set(name).map_err(Error::Spec)?;
    }
    Ok(rest)
}

/// A path as a spec record carries it.
pub fn spec_text(path: &Path) -> Result<String, Error> {
    path.to_str().map(str::to_owned).ok_or_else(|| Error::UnusablePath {
        path: path.into(),
        reason: "is not UTF-8, which UPROBE_RUN_SPEC cannot carry",
    })
}

/// `UPROBE_RUN_SPEC`: the spec's text.
pub fn encode(spec: &Spec) -> Result<OsString, Error> {
    spec::encode(spec).map(OsString::from).map_err(Error::Spec)
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
        let rest = Spec { events: vec!["p t:add a=%di".into()], ..Spec::default() };
        let params = [("probes".to_string(), "main,work+4".to_string()), ("x".to_string(), String::new())];
        let spec = run_spec(
            &["/h/libcount.so".into(), "/h/libtrace.so".into()],
            &params,
            Some(Path::new("/tmp/out")),
            &["follow-exec"],
            rest,
        )
        .unwrap();
        let text = encode(&spec).unwrap().into_string().unwrap();
        let (records, end) = text.rsplit_once('\n').unwrap();
        assert_eq!(
            records,
            "handlers\t/h/libcount.so\nhandlers\t/h/libtrace.so\n\
             param\tprobes=main,work+4\nparam\tx=\noutput\t/tmp/out\noption\tfollow-exec\nevent\tp t:add a=%di"
        );
        assert!(end.starts_with("end\t"));
        assert_eq!(spec::decode(&text), Ok(spec));
        let refused = run_spec(&[], &[], None, &["fast"], Spec::default()).unwrap_err();
        assert!(refused.to_string().contains("unknown option \"fast\""), "{refused}");
    }
}
