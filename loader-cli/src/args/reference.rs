//! The command line's reference, generated from its definitions (never copied by hand): the
//! man page (`clap_mangen`) and the bash, zsh and fish completions (`clap_complete`),
//! written by the hidden option `--write-reference DIR` for installs and packages.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use clap::{Command, CommandFactory};
use clap_complete::Shell;

use super::Cli;

/// The command's name, as the reference names it.
const NAME: &str = "uprobe-run";

/// Writes `uprobe-run.1` and the completions (`uprobe-run.bash`, `_uprobe-run`,
/// `uprobe-run.fish`) into `dir`, made if missing; returns the files written.
pub fn write(dir: &Path) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let mut command = Cli::command();
    let man = dir.join(format!("{NAME}.1"));
    fs::write(&man, man_page(&command)?)?;
    let mut written = vec![man];
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        written.push(clap_complete::generate_to(shell, &mut command, NAME, dir)?);
    }
    Ok(written)
}

/// clap_mangen's title, name, synopsis, description and options (a section per heading of
/// `--help`), then the paragraphs after the options (see [`closing_sections`]).
fn man_page(command: &Command) -> io::Result<Vec<u8>> {
    let version = format!("{NAME} {}", env!("CARGO_PKG_VERSION"));
    let man = clap_mangen::Man::new(command.clone()).source(version).manual("User Commands");
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    let after = command.get_after_help().map(|help| help.to_string()).unwrap_or_default();
    page.extend(closing_sections(&after).into_bytes());
    Ok(page)
}

/// The help's closing paragraphs as man page sections: each paragraph opens with its title
/// (`Examples:`, `Config file: one directive...`); its indented lines (examples, tables)
/// stay as written, the others are filled.
fn closing_sections(text: &str) -> String {
    let mut roff = String::new();
    for paragraph in text.split("\n\n") {
        let (first, rest) = paragraph.split_once('\n').unwrap_or((paragraph, ""));
        match first.split_once(':') {
            Some((title, body)) if !title.is_empty() && title.split(' ').count() <= 3 => {
                roff.push_str(&format!(".SH \"{}\"\n", escape(&title.to_uppercase())));
                let body = capitalized(body.trim_start());
                lines(&mut roff, std::iter::once(body.as_str()).chain(rest.lines()));
            }
            _ => {
                roff.push_str(".PP\n");
                lines(&mut roff, paragraph.lines());
            }
        }
    }
    roff
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// `lines` into `roff`: runs of indented lines unfilled, the others filled.
fn lines<'a>(roff: &mut String, lines: impl Iterator<Item = &'a str>) {
    let mut unfilled = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let indented = line.starts_with("  ");
        if indented != unfilled {
            roff.push_str(if indented { ".nf\n" } else { ".fi\n" });
            unfilled = indented;
        }
        roff.push_str(&escape(line));
        roff.push('\n');
    }
    if unfilled {
        roff.push_str(".fi\n");
    }
}

/// A line of text as roff reads it literally: backslashes and dashes escaped, a leading
/// `.` or `'` kept from being read as a request.
fn escape(line: &str) -> String {
    let text = line.replace('\\', "\\e").replace('-', "\\-");
    match text.starts_with(['.', '\'']) {
        true => format!("\\&{text}"),
        false => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_paragraphs_become_sections() {
        let roff = closing_sections("Exit status: zero or -1.\nmore\n\nExamples:\n  # one\n  a -b\nafter\n\n.plain");
        assert_eq!(
            roff,
            ".SH \"EXIT STATUS\"\nZero or \\-1.\nmore\n.SH \"EXAMPLES\"\n.nf\n  # one\n  a \\-b\n.fi\nafter\n.PP\n\\&.plain\n"
        );
    }
}
