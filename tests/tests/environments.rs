//! Bad environments: a program that closes every descriptor keeps the run's output; a
//! process refusing writable code (W^X) runs unprobed with one warning; a Go program is
//! warned about return probes. (Static and setuid programs: see cli.rs.)

use std::process::{Command, Stdio};

use uprobe_tests::*;

const FLAGS: &[&str] = &["-O2", "-g", "-fno-inline"];

#[test]
fn closing_every_descriptor_keeps_the_output() {
    let prog = fixture("closefds", FLAGS);
    let count = artefact("libcount.so");
    let args = ["--handlers", count.to_str().unwrap(), "--param", "probes=work", prog.to_str().unwrap()];
    let run = run_uprobe(&args);
    assert!(run.status.success(), "{:?}", run.status);
    assert_eq!(run.stdout, "closing every descriptor\n");
    assert_eq!(count_table(&run), vec![("work".to_string(), 3)]);
    // The default output, stderr, survives the program closing its own stderr.
    let out = Command::new(uprobe_run()).args(args).stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.ends_with(" 3\n") && stderr.lines().count() == 2, "{stderr}");
}

#[test]
fn a_process_refusing_writable_code_runs_unprobed_with_one_warning() {
    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    let plain = run_plain(&prog, &[]);
    let handler = test_handler("mdwe");
    let run = run_uprobe(&["--handlers", handler.to_str().unwrap(), "--param", "func=myfunc", prog.to_str().unwrap()]);
    if run.output.starts_with("mdwe: unsupported") {
        eprintln!("SKIPPED: this kernel has no PR_SET_MDWE: {}", run.output);
        return;
    }
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout));
    let addr = nm_address(&prog, "myfunc");
    let page = addr & !0xfff;
    assert_eq!(
        run.output,
        format!(
            "uprobe-run: this process refuses to make its code writable (cannot patch {addr:#x}: mprotect({page:#x}) failed: Permission denied (os error 13); W^X, as with PR_SET_MDWE): the runtime is disabled and the program runs unprobed\nmdwe: register_uprobe=-1\n"
        )
    );
}
