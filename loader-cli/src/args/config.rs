//! The `--config FILE` format. Pure: text and base directory in, settings out.
//!
//! ```text
//! # comment
//! handlers ../handlers/libcount.so
//! param    probes=main,work+4
//! output   count.out
//! follow-exec
//! option   no-follow-fork
//! ```
//!
//! One directive per line, then blanks, then its argument (the rest of the line, trimmed).
//! Relative paths are taken from the config file's directory.

use std::path::{Path, PathBuf};
use thiserror::Error;

/// The directives without an argument, also written `option NAME`; each is the command-line
/// option of the same name.
pub const SWITCHES: [&str; 8] =
    ["no-optimize", "verbose", "full-vector-state", "follow-exec", "no-follow-fork", "stats", "lenient", "raw-address"];

/// What a config file asks for, in file order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Config {
    pub handlers: Vec<PathBuf>,
    pub params: Vec<String>,
    /// The last `output` line, if any.
    pub output: Option<PathBuf>,
    /// Switches, in file order (see [`SWITCHES`]).
    pub options: Vec<String>,
}

/// A line that could not be understood. The caller adds the file name.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{line}: {reason}")]
pub struct ConfigError {
    pub line: usize,
    pub reason: String,
}

pub fn parse(text: &str, base: &Path) -> Result<Config, ConfigError> {
    let mut config = Config::default();
    for (index, raw) in text.lines().enumerate() {
        let fail = |reason: String| ConfigError { line: index + 1, reason };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (directive, arg) = line.split_once(char::is_whitespace).map_or((line, ""), |(d, a)| (d, a.trim()));
        match directive {
            "handlers" | "output" | "param" if arg.is_empty() => {
                let what = if directive == "param" { "NAME=VALUE" } else { "PATH" };
                return Err(fail(format!("'{directive}' needs a {what}")));
            }
            switch if SWITCHES.contains(&switch) && !arg.is_empty() => {
                return Err(fail(format!("'{switch}' takes no argument")));
            }
            switch if SWITCHES.contains(&switch) => config.options.push(switch.to_owned()),
            "option" if SWITCHES.contains(&arg) => config.options.push(arg.to_owned()),
            "option" => return Err(fail(format!("unknown option '{arg}' (expected {})", SWITCHES.join(", ")))),
            "handlers" => config.handlers.push(base.join(arg)),
            "output" if arg == "-" => config.output = Some(PathBuf::from("-")),
            "output" => config.output = Some(base.join(arg)),
            "param" => {
                check_param(arg).map_err(|why| fail(format!("param '{arg}': {why}")))?;
                config.params.push(arg.to_owned());
            }
            other => {
                return Err(fail(format!(
                    "unknown directive '{other}' (expected handlers, param, output, option or a switch: {})",
                    SWITCHES.join(", ")
                )))
            }
        }
    }
    Ok(config)
}

/// A parameter is `NAME=VALUE` with a non-empty NAME; VALUE may be empty or contain `=`.
/// Shared by `--param` and the config file's `param`.
pub fn check_param(param: &str) -> Result<(), &'static str> {
    match param.split_once('=') {
        None => Err("expected NAME=VALUE"),
        Some(("", _)) => Err("empty NAME in NAME=VALUE"),
        Some(_) if param.contains('\n') => Err("contains a newline"),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_etc(text: &str) -> Result<Config, ConfigError> {
        parse(text, Path::new("/etc/probes"))
    }

    #[test]
    fn reads_every_directive_in_order() {
        let text = "\
# handlers first
handlers ../lib/libcount.so
  handlers\t/abs/libtrace.so  

param probes=main,work+4
param empty=
param eq=a=b
output out/count.txt
output last.txt
";
        let config = parse_in_etc(text).unwrap();
        assert_eq!(
            config,
            Config {
                handlers: vec![PathBuf::from("/etc/probes/../lib/libcount.so"), PathBuf::from("/abs/libtrace.so"),],
                params: vec!["probes=main,work+4".to_owned(), "empty=".to_owned(), "eq=a=b".to_owned(),],
                output: Some(PathBuf::from("/etc/probes/last.txt")),
                ..Config::default()
            }
        );
    }

    #[test]
    fn empty_file_is_empty_config() {
        assert_eq!(parse_in_etc(""), Ok(Config::default()));
        assert_eq!(parse_in_etc("# nothing\n\n   \n"), Ok(Config::default()));
    }

    #[test]
    fn unknown_directive_names_the_line() {
        let err = parse_in_etc("handlers a.so\n\nprobe main\n").unwrap_err();
        assert_eq!(err.line, 3);
        assert_eq!(
            err.to_string(),
            "3: unknown directive 'probe' (expected handlers, param, output, option or a switch: no-optimize, verbose, full-vector-state, follow-exec, no-follow-fork, stats, lenient, raw-address)"
        );
    }

    #[test]
    fn refuses_missing_arguments_and_bad_params() {
        assert_eq!(parse_in_etc("handlers\n").unwrap_err().to_string(), "1: 'handlers' needs a PATH");
        assert_eq!(parse_in_etc("output   \n").unwrap_err().to_string(), "1: 'output' needs a PATH");
        assert_eq!(
            parse_in_etc("# x\nparam probes\n").unwrap_err().to_string(),
            "2: param 'probes': expected NAME=VALUE"
        );
        assert_eq!(parse_in_etc("param =x\n").unwrap_err().to_string(), "1: param '=x': empty NAME in NAME=VALUE");
    }

    #[test]
    fn reads_switches_bare_or_as_options() {
        let config = parse_in_etc("follow-exec\noption no-follow-fork\nno-optimize\noption verbose\n").unwrap();
        assert_eq!(config.options, ["follow-exec", "no-follow-fork", "no-optimize", "verbose"]);
        assert_eq!(parse_in_etc("follow-exec yes\n").unwrap_err().to_string(), "1: 'follow-exec' takes no argument");
        assert_eq!(
            parse_in_etc("option follow-fork\n").unwrap_err().to_string(),
            "1: unknown option 'follow-fork' (expected no-optimize, verbose, full-vector-state, follow-exec, no-follow-fork, stats, lenient, raw-address)"
        );
    }

    #[test]
    fn directives_are_whole_words() {
        assert!(parse_in_etc("handlersx a.so").is_err());
        assert!(parse_in_etc("Handlers a.so").is_err());
    }
}
