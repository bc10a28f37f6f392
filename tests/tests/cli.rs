//! The command line: refusals (one clear line, non-zero exit, the program never runs), exit
//! status and death by signal passed through, the config file.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use uprobe_tests::*;

/// Asserts a refusal: exit status 2, nothing on stdout, exactly `line` on stderr.
fn assert_refused(out: &Output, line: &str) {
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert_eq!(String::from_utf8_lossy(&out.stderr), format!("{line}\n"));
}

/// A shell command line that would leave `marker` behind if it ran.
fn marker_program(marker: &Path) -> [String; 3] {
    ["/bin/sh".into(), "-c".into(), format!("echo ran > {}", marker.display())]
}

fn executable(path: &Path, bytes: &[u8]) -> PathBuf {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_path_buf()
}

#[test]
fn refuses_a_missing_program() {
    let out = uprobe_run_raw(&[]);
    assert_refused(&out, "uprobe-run: no program given (usage: uprobe-run [OPTIONS] [--] PROGRAM [ARGS...])");
    let out = uprobe_run_raw(&["./does-not-exist"]);
    assert_refused(&out, "uprobe-run: ./does-not-exist: no such file");
}

#[test]
fn refuses_a_static_program() {
    let src = tempfile("static").with_extension("c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let prog = tempfile("static");
    let built = Command::new("gcc").arg("-static").arg("-o").arg(&prog).arg(&src).output().unwrap();
    if !built.status.success() {
        eprintln!(
            "SKIPPED: gcc -static does not work here (no static libc): {}",
            String::from_utf8_lossy(&built.stderr)
        );
        return;
    }
    let out = uprobe_run_raw(&[prog.to_str().unwrap()]);
    assert_refused(
        &out,
        &format!(
            "uprobe-run: {}: static executable (no PT_INTERP): the runtime is loaded through LD_PRELOAD, which static programs ignore",
            prog.display()
        ),
    );
}

#[test]
fn refuses_setuid_and_setgid_programs() {
    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    for (bit, kind) in [(0o4755, "setuid"), (0o2755, "setgid")] {
        let copy = tempfile(kind);
        uprobe_tests::copy_program(&prog, &copy);
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(bit)).unwrap();
        let out = uprobe_run_raw(&[copy.to_str().unwrap()]);
        assert_refused(
            &out,
            &format!(
                "uprobe-run: {}: {kind} program: the dynamic loader ignores LD_PRELOAD for setuid/setgid programs",
                copy.display()
            ),
        );
    }
}

#[test]
fn refuses_programs_that_are_not_x86_64_elf() {
    let text = executable(&tempfile("text"), b"hello\n");
    assert_refused(
        &uprobe_run_raw(&[text.to_str().unwrap()]),
        &format!("uprobe-run: {}: not an ELF file", text.display()),
    );
    let script = executable(&tempfile("script"), b"#!/bin/sh\necho ran\n");
    assert_refused(
        &uprobe_run_raw(&[script.to_str().unwrap()]),
        &format!(
            "uprobe-run: {}: script (#!/bin/sh), not an ELF program: run its interpreter under uprobe-run instead",
            script.display()
        ),
    );
    // A 32-bit ELF header: ELFCLASS32, little-endian, ET_EXEC, EM_386.
    let mut elf32 = vec![0u8; 52];
    elf32[..7].copy_from_slice(&[0x7f, b'E', b'L', b'F', 1, 1, 1]);
    elf32[16] = 2;
    elf32[18] = 3;
    let elf32 = executable(&tempfile("elf32"), &elf32);
    assert_refused(
        &uprobe_run_raw(&[elf32.to_str().unwrap()]),
        &format!("uprobe-run: {}: 32-bit ELF (ELFCLASS32): only ELF64 x86-64 is supported", elf32.display()),
    );
}

#[test]
fn refuses_bad_handler_libraries_before_the_program_runs() {
    let marker = tempfile("marker");
    let program = marker_program(&marker);
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let mut args = vec!["--handlers", "./no-such-handler.so", "--"];
    args.extend(&program);
    assert_refused(&uprobe_run_raw(&args), "uprobe-run: ./no-such-handler.so: no such file");
    let not_elf = executable(&tempfile("handler"), b"not a library\n");
    let mut args = vec!["--handlers", not_elf.to_str().unwrap(), "--"];
    args.extend(&program);
    assert_refused(&uprobe_run_raw(&args), &format!("uprobe-run: {}: not an ELF file", not_elf.display()));
    let mut args = vec!["--param", "novalue", "--"];
    args.extend(&program);
    assert_refused(&uprobe_run_raw(&args), "uprobe-run: --param 'novalue': expected NAME=VALUE");
    assert!(!marker.exists(), "the program ran");
}

#[test]
fn a_library_that_fails_to_load_stops_the_run_before_main() {
    // A valid ELF shared object whose load fails: RTLD_NOW cannot resolve one of its symbols.
    let src2 = tempfile("undefined").with_extension("c");
    std::fs::write(
        &src2,
        "extern int no_such_symbol_anywhere(void);\nint uprobe_init(void) { return no_such_symbol_anywhere(); }\n",
    )
    .unwrap();
    let lib2 = tempfile("undefined").with_extension("so");
    let built = Command::new("gcc").args(["-shared", "-fPIC", "-o"]).arg(&lib2).arg(&src2).output().unwrap();
    assert!(built.status.success());
    let marker = tempfile("marker");
    let program = marker_program(&marker);
    let out = uprobe_run_raw(&["--handlers", lib2.to_str().unwrap(), "--", &program[0], &program[1], &program[2]]);
    assert_eq!(out.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(&format!("uprobe-run: {}: ", lib2.display())), "{stderr}");
    assert!(stderr.contains("undefined symbol: no_such_symbol_anywhere"), "{stderr}");
    assert!(!marker.exists(), "the program ran");
}

#[test]
fn exit_status_and_signals_are_the_programs() {
    let quiet = test_handler("quiet");
    let quiet = quiet.to_str().unwrap();
    let out = uprobe_run_raw(&["--handlers", quiet, "/bin/sh", "-c", "echo out; echo err >&2; exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    let out = uprobe_run_raw(&["--handlers", quiet, "/bin/sh", "-c", "kill -SEGV $$"]);
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{out:?}");
}

#[test]
fn config_file_names_handlers_and_parameters() {
    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    let example = artefact("uprobe_example.so");
    let out_file = tempfile("config-out");
    let config = tempfile("run").with_extension("conf");
    std::fs::write(
        &config,
        format!(
            "# the classic example, by symbol\nhandlers {}\nparam symbol=myfunc\n\noutput {}\n",
            example.display(),
            out_file.display()
        ),
    )
    .unwrap();
    let out = uprobe_run_raw(&["--config", config.to_str().unwrap(), prog.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert!(text.ends_with("Probepoint was hit 5 times\n"), "{text}");
    std::fs::write(&config, "probe myfunc\n").unwrap();
    let out = uprobe_run_raw(&["--config", config.to_str().unwrap(), prog.to_str().unwrap()]);
    assert_refused(
        &out,
        &format!(
            "uprobe-run: {}:1: unknown directive 'probe' (expected handlers, param, output, option or a switch: no-optimize, verbose, full-vector-state, follow-exec, no-follow-fork, stats, lenient, raw-address)",
            config.display()
        ),
    );
}

#[test]
fn help_ends_with_examples_of_every_bundled_handler() {
    let out = uprobe_run_raw(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let examples = help.split("\nExamples:\n").nth(1).expect("an Examples section");
    let (examples, bundled) = examples.split_once("\nBundled handlers").expect("a Bundled handlers section");
    for (short, handler) in [
        ("uprobe_example", "uprobe_example.so"),
        ("uretprobe_example", "uretprobe_example.so"),
        ("count", "libcount.so"),
    ] {
        // By the short name, which works wherever uprobe-run is installed.
        assert!(examples.contains(&format!("--handlers {short} ")), "no example of {short}:\n{examples}");
        assert!(bundled.contains(short), "{short} not named:\n{bundled}");
        // Each one named is one the build makes.
        artefact(handler);
    }
    assert!(examples.contains("uprobe-run -e '"), "no event example:\n{examples}");
    assert!(examples.contains("uprobe-run --pid "), "no attach example:\n{examples}");
}

#[test]
fn version_names_the_runtime() {
    let out = uprobe_run_raw(&["--version"]);
    assert!(out.status.success());
    let runtime = artefact("libuprobe.so");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("uprobe-run {}\nruntime: {} (beside uprobe-run)\n", env!("CARGO_PKG_VERSION"), runtime.display())
    );
}
