//! Threads hitting one probe at the same time: the total is exact.

use uprobe_tests::*;

fn run_threads(threads: u32, calls: u32) {
    let prog = fixture("threads", &["-O2", "-g", "-fno-inline", "-pthread"]);
    let count = artefact("libcount.so");
    let args = [threads.to_string(), calls.to_string()];
    let plain = run_plain(&prog, &[&args[0], &args[1]]);
    let run = run_uprobe(&[
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        "probes=work",
        prog.to_str().unwrap(),
        &args[0],
        &args[1],
    ]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout.as_bytes(), plain.stdout.as_slice());
    assert_eq!(count_table(&run), vec![("work".to_string(), u64::from(threads * calls))]);
}

#[test]
fn two_threads() {
    run_threads(2, 20_000);
}

#[test]
fn eight_threads() {
    run_threads(8, 5_000);
}

#[test]
fn a_handler_calling_the_probed_function_is_not_re_entered() {
    let prog = fixture("threads", &["-O2", "-g", "-fno-inline", "-pthread"]);
    let handler = test_handler("nested");
    let run = run_uprobe(&["--handlers", handler.to_str().unwrap(), prog.to_str().unwrap(), "2", "1000"]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, "threads=2 calls=1000 total=2999000\n");
    let lines: Vec<&str> = run.output.lines().collect();
    assert_eq!(lines[0], "nested: hits=2000 wrong=0");
    assert!(
        lines[1].starts_with("uprobe-run: probe at 0x")
            && lines[1].ends_with(
                "(work+0x0): 2000 hits ran no handler (they came from a handler or from the runtime itself)"
            ),
        "{}",
        run.output
    );
    assert_eq!(lines.len(), 2);
}
