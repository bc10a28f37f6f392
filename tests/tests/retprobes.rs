//! Return probes: the classic example, recursion and tail calls, maxactive, longjmp, C++
//! exceptions across a shared library, backtrace(), pthread_exit, signal handlers, return
//! value override, and the refusals. Every run's program output must equal the unprobed run.

use std::path::Path;

use uprobe_tests::*;

const C_FLAGS: &[&str] = &["-O2", "-g", "-fno-inline", "-pthread"];

/// Per-function counters the `ret` test handler prints at exit.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    calls: u64,
    returns: u64,
    nmissed: u64,
    entries: Option<u64>,
    returns2: Option<u64>,
}

fn parse_counts(run: &Run, func: &str) -> Counts {
    let line = run
        .lines_with(&format!("ret: {func} "))
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no counts for {func} in:\n{}", run.output));
    let mut c = Counts::default();
    for field in line.split_whitespace() {
        let (k, v) = field.split_once('=').unwrap();
        let v: u64 = v.parse().unwrap();
        match k {
            "calls" => c.calls = v,
            "returns" => c.returns = v,
            "nmissed" => c.nmissed = v,
            "entries" => c.entries = Some(v),
            "returns2" => c.returns2 = Some(v),
            other => panic!("unexpected field {other} in {line}"),
        }
    }
    c
}

/// Runs `program` under the `ret` handler with `params`, checks the program behaved exactly as
/// without probes, and returns the run.
fn run_ret(program: &Path, params: &[&str]) -> Run {
    let plain = run_plain(program, &[]);
    let handler = test_handler("ret");
    let mut args = vec!["--handlers", handler.to_str().unwrap()];
    for p in params {
        args.extend(["--param", p]);
    }
    args.push(program.to_str().unwrap());
    let run = run_uprobe(&args);
    assert_eq!(run.status.code(), plain.status.code(), "{}", run.stderr);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout), "stdout differs from the unprobed run");
    assert_eq!(run.stderr, String::from_utf8_lossy(&plain.stderr));
    assert!(!run.output.contains("wrong_rip"), "{}", run.output);
    run
}

fn counts(calls: u64, returns: u64) -> Counts {
    Counts { calls, returns, ..Counts::default() }
}

#[test]
fn classic_uretprobe_example() {
    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    let addr = nm_address(&prog, "myfunc");
    let example = artefact("uretprobe_example.so");
    let run = run_uprobe(&["--handlers", example.to_str().unwrap(), "--param", "func=myfunc", prog.to_str().unwrap()]);
    assert!(run.status.success(), "{}", run.stderr);
    let mut expected = String::new();
    for value in [1, 2, 5, 10, 17] {
        expected += &format!("Function at {addr:#x} called\nFunction at {addr:#x} returns {value:#x}\n");
    }
    expected += "5 calls, 5 returns\n";
    assert_eq!(run.output, expected);
}

#[test]
fn recursion_mutual_recursion_and_tail_calls() {
    let prog = fixture("recurse", C_FLAGS);
    let run = run_ret(&prog, &["funcs=fib,is_even,is_odd,tail_a,tail_b", "entry=1"]);
    for func in ["fib", "is_even", "is_odd", "tail_a", "tail_b"] {
        let c = parse_counts(&run, func);
        assert!(c.calls > 0, "{func}: {c:?}");
        assert_eq!((c.returns, c.entries, c.nmissed), (c.calls, Some(c.calls), 0), "{func}");
    }
    // tail_a ends in `jmp tail_b`: one return serves both records.
    assert_eq!(parse_counts(&run, "tail_a"), Counts { entries: Some(10), ..counts(10, 10) });
    assert_eq!(parse_counts(&run, "tail_b"), Counts { entries: Some(10), ..counts(10, 10) });
}

#[test]
fn recursion_deeper_than_maxactive_counts_the_rest_as_missed() {
    let prog = fixture("recurse", C_FLAGS);
    let run = run_ret(&prog, &["funcs=chain", "maxactive=10", "entry=1"]);
    // chain(100) makes 101 calls; only 10 may be pending per thread.
    assert_eq!(
        parse_counts(&run, "chain"),
        Counts { calls: 10, returns: 10, nmissed: 91, entries: Some(101), returns2: None }
    );
}

#[test]
fn several_return_probes_and_an_entry_probe_on_one_function() {
    let prog = fixture("recurse", C_FLAGS);
    let run = run_ret(&prog, &["funcs=fib", "twice=1", "entry=1"]);
    let c = parse_counts(&run, "fib");
    assert_eq!((c.returns, c.returns2, c.entries), (c.calls, Some(c.calls), Some(c.calls)));
}

#[test]
fn a_return_handler_overrides_the_return_value() {
    let prog = fixture("recurse", C_FLAGS);
    let handler = test_handler("ret");
    let run = run_uprobe(&[
        "--handlers",
        handler.to_str().unwrap(),
        "--param",
        "funcs=tail_b",
        "--param",
        "override=5",
        prog.to_str().unwrap(),
    ]);
    assert!(run.status.success());
    // tail_a(i) returns tail_b(i + 1): now 5 each, 10 calls.
    assert!(run.stdout.ends_with("tail total = 50\n"), "{}", run.stdout);
}

#[test]
fn longjmp_and_siglongjmp_out_of_probed_frames() {
    let prog = fixture("jumps", C_FLAGS);
    let run = run_ret(&prog, &["funcs=level1,level2,leaf"]);
    // level1 and level2 never return (10 rounds leave them by longjmp); leaf returns each time,
    // including the 10 calls made after the stale records were left behind.
    assert_eq!(parse_counts(&run, "level1"), counts(10, 0));
    assert_eq!(parse_counts(&run, "level2"), counts(10, 0));
    assert_eq!(parse_counts(&run, "leaf"), counts(20, 20));
}

#[test]
fn cxx_exceptions_through_probed_frames_and_a_shared_library() {
    let prog = except_program();
    let run = run_ret(&prog, &["funcs=outer,middle,catching,lib_check"]);
    // 11 calls of outer/middle/lib_check, 3 of which throw (3 and 6 in main, 3 in catching).
    assert_eq!(parse_counts(&run, "outer"), counts(11, 8));
    assert_eq!(parse_counts(&run, "middle"), counts(11, 8));
    assert_eq!(parse_counts(&run, "lib_check"), counts(11, 8));
    assert_eq!(parse_counts(&run, "catching"), counts(4, 4));
    assert!(run.stdout.contains("caught in main: multiple of three: 6\n"));
}

#[test]
fn backtrace_shows_the_real_callers() {
    let prog = fixture("bt", &["-O1", "-g", "-fno-inline", "-fno-optimize-sibling-calls", "-rdynamic"]);
    let run = run_ret(&prog, &["funcs=outer,inner,show"]);
    assert!(run.stdout.contains("  #1 inner+0x"), "{}", run.stdout);
    for func in ["outer", "inner", "show"] {
        assert_eq!(parse_counts(&run, func), counts(2, 2), "{func}");
    }
}

#[test]
fn threads_with_pending_returns_and_pthread_exit() {
    let prog = fixture("thread_exit", C_FLAGS);
    let run = run_ret(&prog, &["funcs=outer,inner"]);
    // Thread 2 leaves through pthread_exit from inside inner, called by outer.
    assert_eq!(parse_counts(&run, "outer"), counts(4, 3));
    assert_eq!(parse_counts(&run, "inner"), counts(4, 3));
    assert!(run.stdout.contains("thread 2: 200\n"));
}

#[test]
fn a_signal_handler_in_the_middle_of_a_probed_call() {
    let prog = fixture("sig_mid", C_FLAGS);
    let run = run_ret(&prog, &["funcs=slow,helper"]);
    assert_eq!(parse_counts(&run, "slow"), counts(5, 5));
    assert_eq!(parse_counts(&run, "helper"), counts(10, 10));
}

#[test]
fn return_probes_go_on_function_entries_only() {
    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    let handler = test_handler("ret");
    let run =
        run_uprobe(&["--handlers", handler.to_str().unwrap(), "--param", "funcs=myfunc+4", prog.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(127));
    assert_eq!(run.stdout, "");
    let addr = nm_address(&prog, "myfunc");
    assert_eq!(
        run.output,
        format!(
            "uprobe-run: register_uretprobe(myfunc+4): {:#x} is not the first instruction of myfunc (at {addr:#x}): return probes go on a function's entry\nret: cannot probe myfunc+4: -22\n",
            addr + 4
        )
    );
}

#[test]
fn return_probes_are_refused_in_go_programs() {
    let prog = fixture("fake_go", C_FLAGS);
    let handler = test_handler("ret");
    let run = run_uprobe(&["--handlers", handler.to_str().unwrap(), "--param", "funcs=work", prog.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(127));
    assert_eq!(
        run.output,
        format!("uprobe-run: {} is a Go program: return probes are not available in it (Go moves goroutine stacks and walks return addresses); entry probes work\n", prog.display())
            + "uprobe-run: register_uretprobe(work): return probes are refused in Go programs: Go moves goroutine stacks and walks return addresses, which a replaced return address breaks\nret: cannot probe work: -95\n"
    );
}
