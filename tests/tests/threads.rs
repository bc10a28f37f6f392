//! Threads hitting one probe at the same time (exact totals), probes placed and removed while
//! threads run the code (hits within the bounds the timing allows), and reentrancy.

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

#[test]
fn probes_registered_and_removed_while_threads_run_the_code() {
    let prog = fixture("threads_stress", &["-O2", "-g", "-fno-inline", "-pthread"]);
    for threads in ["2", "3"] {
        let run = run_uprobe(&[prog.to_str().unwrap(), "1000", threads]);
        assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
        assert_eq!(
            run.stdout,
            format!(
                "before: hits within bounds\nwork: hits within bounds\nafter: hits within bounds\ncycles=1000 threads={threads}\n"
            )
        );
        // No hit ran without its handler, and nothing else was said.
        assert_eq!(run.output, "");
    }
}

#[test]
fn a_handler_on_malloc_that_calls_malloc_neither_recurses_nor_deadlocks() {
    let prog = fixture("reentrancy", &["-O2", "-g"]);
    let handler = test_handler("malloc_reenter");
    let run = run_uprobe(&["--handlers", handler.to_str().unwrap(), prog.to_str().unwrap()]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert_eq!(run.stdout, "reentrancy: 10 blocks\n");
    let lines: Vec<&str> = run.output.lines().collect();
    assert_eq!(
        lines[..2],
        ["malloc_reenter: first marked call, handler's own malloc done", "malloc_reenter: marked=10 inner=OK"]
    );
    // Each handler's own malloc hit the probe once more, and ran no handler.
    assert!(
        lines[2].starts_with("uprobe-run: probe at 0x")
            && lines[2].ends_with(
                "(malloc+0x0): 10 hits ran no handler (they came from a handler or from the runtime itself)"
            ),
        "{}",
        run.output
    );
    assert_eq!(lines.len(), 3, "{}", run.output);
}
