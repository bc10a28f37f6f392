//! The classic uprobe example, end to end: `nm` gives the address of `myfunc` in a non-PIE
//! program, `uprobe_example.so` probes it through `--param vaddr=...`.

use uprobe_tests::*;

fn myprog() -> std::path::PathBuf {
    fixture("myprog", &["-O0", "-g", "-no-pie"])
}

const PROGRAM_OUTPUT: &str = "myfunc(0) = 1\nmyfunc(1) = 2\nmyfunc(2) = 5\nmyfunc(3) = 10\nmyfunc(4) = 17\n";

#[test]
fn verbose_example_reports_every_hit() {
    let prog = myprog();
    let addr = nm_address(&prog, "myfunc");
    let run = run_example(&prog, addr, &["--param", "verbose=1"]);
    assert!(run.status.success(), "{run:?}", run = run.stderr);
    assert_eq!(run.stdout, PROGRAM_OUTPUT);
    let pid_line = run.output.lines().next().unwrap();
    let pid: i32 = pid_line.split_whitespace().nth(4).unwrap().trim_end_matches(',').parse().unwrap();
    let mut expected = format!("Registering uprobe on pid {pid}, vaddr {addr:#x}\n");
    for n in 1..=5 {
        expected += &format!("Hit #{n} on probepoint at {addr:#x}\n");
    }
    expected += "Probepoint was hit 5 times\n";
    assert_eq!(run.output, expected);
}

#[test]
fn quiet_example_counts_hits_by_symbol() {
    let prog = myprog();
    let example = artefact("uprobe_example.so");
    let run = run_uprobe(&[
        "--handlers",
        example.to_str().unwrap(),
        "--param",
        "symbol=myfunc",
        "--param",
        "verbose=0",
        prog.to_str().unwrap(),
    ]);
    assert!(run.status.success());
    assert_eq!(run.stdout, PROGRAM_OUTPUT);
    let lines: Vec<&str> = run.output.lines().collect();
    assert_eq!(lines.len(), 2, "{}", run.output);
    assert!(lines[0].starts_with("Registering uprobe on pid ") && lines[0].ends_with(", symbol myfunc"));
    assert_eq!(lines[1], "Probepoint was hit 5 times");
}

#[test]
fn uprobe_init_failure_stops_the_run_before_main() {
    let prog = myprog();
    // Not an instruction boundary: myfunc starts with push %rbp; mov %rsp,%rbp.
    let addr = nm_address(&prog, "myfunc") + 2;
    let run = run_example(&prog, addr, &[]);
    assert_eq!(run.stdout, "", "the program must not run");
    assert_eq!(run.status.code(), Some(127));
    assert!(run.output.contains("is not an instruction boundary of myfunc"), "{}", run.output);
    assert!(run.output.contains("register_uprobe() failed, returned -22"), "{}", run.output);
    let last = run.stderr.lines().last().unwrap_or("");
    assert!(last.contains("uprobe_example.so: uprobe_init() failed, returned -22"), "{}", run.stderr);
}
