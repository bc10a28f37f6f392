//! The command line's reference comes from its definitions, never from a copy: every option
//! that `uprobe-run --help` shows is in the man page and in the bash, zsh and fish
//! completions that `uprobe-run --write-reference DIR` writes.

use std::path::{Path, PathBuf};
use std::process::Command;

use uprobe_tests::uprobe_run;

/// The options `--help` shows: (long name, short letter).
fn options_in_help() -> Vec<(String, Option<char>)> {
    let out = Command::new(uprobe_run()).arg("--help").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).unwrap();
    // An option's line: `  -o, --output <FILE>` or `      --handlers <LIB.so>` (what
    // describes it stands further in).
    help.lines()
        .filter(|l| l.trim_start().starts_with('-') && l.len() - l.trim_start().len() <= 6)
        .map(|line| {
            let flags: Vec<&str> = line.split([' ', ',']).filter(|w| w.starts_with('-')).take(2).collect();
            let long =
                flags.iter().find_map(|f| f.strip_prefix("--")).unwrap_or_else(|| panic!("no long name: {line}"));
            let short = flags.iter().find(|f| f.len() == 2 && !f.starts_with("--")).and_then(|f| f.chars().nth(1));
            (long.to_string(), short)
        })
        .collect()
}

/// `uprobe-run --write-reference` into a directory of its own; the files it says it wrote.
fn write_reference(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uprobe-reference-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(uprobe_run()).arg("--write-reference").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8(out.stdout).unwrap();
    for file in ["uprobe-run.1", "uprobe-run.bash", "_uprobe-run", "uprobe-run.fish"] {
        let path = dir.join(file);
        assert!(said.lines().any(|l| Path::new(l) == path), "{} not said among:\n{said}", path.display());
        assert!(std::fs::metadata(&path).is_ok_and(|m| m.len() > 0), "{} not written", path.display());
    }
    dir
}

/// The words of `text` that could name an option (`--output`, `-o`, `output`), in order.
fn words(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_')).filter(|w| !w.is_empty()).collect()
}

#[test]
fn the_man_page_and_the_completions_name_every_option() {
    let options = options_in_help();
    // Every group of options is there: a reading of --help that found nothing proves nothing.
    for named in ["handlers", "no-optimize", "event", "count", "serve", "pid", "list", "version", "help"] {
        assert!(options.iter().any(|(long, _)| long == named), "--{named} not in --help: {options:?}");
    }
    assert!(options.len() >= 35, "{options:?}");
    assert!(!options.iter().any(|(long, _)| long == "write-reference"), "the generator shows in --help");

    let dir = write_reference("all");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    // roff writes a dash as `\-` and bold as `\fB...\fR`.
    let man = read("uprobe-run.1").replace("\\-", "-").replace("\\fB", " ").replace("\\fR", " ");
    for section in
        [".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH OPTIONS", ".SH AGGREGATIONS", ".SH \"EXAMPLES\""]
    {
        assert!(man.contains(section), "the man page has no {section}");
    }
    let (bash, zsh, fish) = (read("uprobe-run.bash"), read("_uprobe-run"), read("uprobe-run.fish"));
    let (man_words, bash_words, zsh_words, fish_words) = (words(&man), words(&bash), words(&zsh), words(&fish));
    // fish names an option `-l output` or `-s o`.
    let fish_has = |flag: &str, name: &str| fish_words.windows(2).any(|w| w == [flag, name]);
    for (long, short) in &options {
        let dashed = format!("--{long}");
        assert!(man_words.contains(&dashed.as_str()), "the man page lacks {dashed}");
        assert!(bash_words.contains(&dashed.as_str()), "the bash completion lacks {dashed}");
        assert!(zsh_words.contains(&dashed.as_str()), "the zsh completion lacks {dashed}");
        assert!(fish_has("-l", long), "the fish completion lacks {dashed}");
        if let Some(c) = short {
            let dashed = format!("-{c}");
            assert!(man_words.contains(&dashed.as_str()), "the man page lacks {dashed}");
            assert!(bash_words.contains(&dashed.as_str()), "the bash completion lacks {dashed}");
            assert!(zsh_words.contains(&dashed.as_str()), "the zsh completion lacks {dashed}");
            assert!(fish_has("-s", &c.to_string()), "the fish completion lacks {dashed}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_man_page_reads_and_keeps_its_examples_whole() {
    let dir = write_reference("man");
    let page = dir.join("uprobe-run.1");
    // Formatted as man(1) would, 200 columns wide so that no line of it need break.
    let formatted = Command::new("groff").args(["-man", "-Tutf8", "-rLL=200n", "-ww"]).arg(&page).output();
    let formatted = match formatted {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("skipped: no groff here to format the man page");
            return;
        }
        formatted => formatted.unwrap(),
    };
    let stderr = String::from_utf8_lossy(&formatted.stderr);
    assert!(formatted.status.success() && stderr.is_empty(), "groff: {stderr}");
    // groff marks its bold and underlined letters with backspaces: without them, the text.
    let text = String::from_utf8_lossy(&formatted.stdout).replace("\u{8}", "");
    let help = Command::new(uprobe_run()).arg("--help").output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let examples = help.split("\nExamples:\n").nth(1).unwrap().split("\n\n").next().unwrap();
    // Each example line as written in --help, unfilled and unbroken.
    for line in examples.lines() {
        assert!(text.lines().any(|l| l.trim_end().ends_with(line)), "not whole in the man page: {line}\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_completions_are_scripts_their_shells_read() {
    let dir = write_reference("shells");
    for (shell, file) in [("bash", "uprobe-run.bash"), ("zsh", "_uprobe-run"), ("fish", "uprobe-run.fish")] {
        match Command::new(shell).arg("-n").arg(dir.join(file)).output() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => eprintln!("skipped: no {shell} here to read {file}"),
            checked => {
                let checked = checked.unwrap();
                assert!(checked.status.success(), "{shell} -n {file}: {}", String::from_utf8_lossy(&checked.stderr));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_that_cannot_be_made_is_one_line() {
    let out = Command::new(uprobe_run()).args(["--write-reference", "/proc/uprobe-run-reference"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("uprobe-run: /proc/uprobe-run-reference: cannot write the reference there: "),
        "{stderr}"
    );
}
