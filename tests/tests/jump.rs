//! Trap-free jump probes: the strategy chosen per probe, registers preserved on the jump path
//! and through the return trampoline, a short function that borrows its padding, a branch
//! into the patched bytes (int3 fallback), live registration while threads run the code, and
//! the share of libc's function entries that take a jump.

use uprobe_tests::*;

fn jump_probe() -> std::path::PathBuf {
    gcc("jump_probe", &["fixtures/jump_probe.c", "fixtures/jump_asm.S"], &["-O2", "-g"])
}

/// `(symbol, strategy line)` pairs of a `--verbose` run.
fn strategies(run: &Run) -> Vec<(String, String)> {
    run.lines_with("uprobe-run: probe at ")
        .iter()
        .filter_map(|l| {
            let (_, rest) = l.split_once(" (")?;
            let (sym, strategy) = rest.split_once("): ")?;
            // Other lines about probes (hits that ran no handler) are not strategies.
            (strategy == "jump" || strategy.starts_with("int3 (")).then(|| (sym.to_string(), strategy.to_string()))
        })
        .collect()
}

#[test]
fn registers_are_preserved_and_strategies_reported() {
    let prog = jump_probe();
    let seen = test_handler("regs_seen");
    let count = artefact("libcount.so");
    let run = run_uprobe(&[
        "-v",
        "--handlers",
        seen.to_str().unwrap(),
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        "probes=regcheck_site,tiny,loop_head",
        prog.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, "regcheck: ok\nregcheck: ok\nregcheck: ok\ntiny sum = 55\nloop_head sum = 35\n");
    assert!(run.output.contains("regs_seen: 3 hits, 3 returns, 0 mismatches\n"), "{}", run.output);
    assert_eq!(
        count_table(&run),
        [("regcheck_site".to_string(), 3), ("tiny".to_string(), 10), ("loop_head".to_string(), 7)]
    );
    let got = strategies(&run);
    let of = |sym: &str| got.iter().find(|(s, _)| s == sym).map(|(_, st)| st.clone()).unwrap();
    if int3_only() {
        assert!(got.iter().all(|(_, st)| st == "int3 (jump probes disabled (--no-optimize))"), "{got:#?}");
    } else {
        assert_eq!(of("regcheck_site+0x0"), "jump");
        // 4 bytes, followed by alignment nops: the jump borrows the padding.
        assert_eq!(of("tiny+0x0"), "jump");
        let loop_head = of("loop_head+0x0");
        assert!(
            loop_head.starts_with("int3 (branch at 0x") && loop_head.contains("lands in the patched bytes"),
            "{loop_head}"
        );
    }
}

#[test]
fn full_vector_state_keeps_ymm_registers_a_handler_writes() {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if !cpuinfo.split_whitespace().any(|f| f == "avx2") {
        eprintln!("SKIPPED: this processor has no AVX2, which the fixture and the handler use");
        return;
    }
    let prog = jump_probe();
    let clobber = test_handler("ymm_clobber");
    let run =
        run_uprobe(&["--full-vector-state", "--handlers", clobber.to_str().unwrap(), prog.to_str().unwrap(), "ymm"]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, "ymmcheck: ok\nymmcheck: ok\nymmcheck: ok\n", "{}", run.output);
}

#[test]
fn function_entries_of_every_insn_count_exactly() {
    let prog = gcc("every_insn", &["fixtures/every_insn.s"], &[]);
    let plain = run_plain(&prog, &[]);
    let counts = std::fs::read_to_string(workspace_root().join("tests/fixtures/every_insn.counts")).unwrap();
    let entries: Vec<(String, u64)> = counts
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .filter(|(spec, _)| spec.ends_with("+0x0"))
        .map(|(spec, n)| (spec.to_string(), n.parse().unwrap()))
        .collect();
    assert_eq!(entries.len(), 30);
    let specs: Vec<&str> = entries.iter().map(|(s, _)| s.as_str()).collect();
    let count = artefact("libcount.so");
    let run = run_uprobe(&[
        "-v",
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        &format!("probes={}", specs.join(",")),
        prog.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout.as_bytes(), plain.stdout.as_slice());
    assert_eq!(count_table(&run), entries);
    let jumps = strategies(&run).iter().filter(|(_, st)| st == "jump").count();
    // classify has a jump table; classify.cold (3 bytes) borrows the alignment padding after it.
    assert_eq!(jumps, if int3_only() { 0 } else { 29 }, "{}", run.output);
}

#[test]
fn live_registration_while_threads_run_the_code() {
    let prog = gcc("hammer", &["fixtures/hammer.c"], &["-O2", "-g", "-fno-inline", "-pthread"]);
    let toggle = gcc("toggle.so", &["handlers/toggle.c"], &["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-pthread"]);
    let next = instructions(&prog, "work").get(1).expect("work has a second instruction").0;
    let run = run_uprobe(&[
        "--handlers",
        toggle.to_str().unwrap(),
        "--param",
        &format!("next={next}"),
        prog.to_str().unwrap(),
        "2",
    ]);
    assert!(run.status.success(), "{}\n{}", run.stderr, run.output);
    let calls: u64 = run.stdout.strip_prefix("calls=").unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(run.stdout.ends_with(" results correct\n"), "{}", run.stdout);
    let line = run.lines_with("toggle: ").pop().unwrap();
    let field = |name: &str| -> u64 {
        line.split_whitespace().find_map(|f| f.strip_prefix(&format!("{name}="))).unwrap().parse().unwrap()
    };
    assert_eq!((field("rounds"), field("failures")), (1000, 0), "{line}");
    // The probe that stayed registered counts every call; the toggled ones see some of them.
    assert_eq!(field("inner"), calls, "{line}");
    assert!(field("work") > 0 && field("work") <= calls, "{line}");
    assert!(field("next") <= calls, "{line}");
}

/// Probes every exported function entry of `module` (a library `program` loads) with
/// `--verbose`: (entries that take a jump, entries probed, reasons for the rest).
fn jump_coverage(module: &str, program: &std::path::Path) -> (usize, usize, std::collections::BTreeMap<String, usize>) {
    let (list, _) = function_list(module);
    let coverage = test_handler("coverage");
    let run = run_uprobe(&[
        "-v",
        "--handlers",
        coverage.to_str().unwrap(),
        "--param",
        &format!("list={}", list.display()),
        "--param",
        &format!("module={module}"),
        program.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{:?}\n{}\n{}", run.status, run.stderr, run.output);
    let got = strategies(&run);
    let jumps = got.iter().filter(|(_, st)| st == "jump").count();
    let mut reasons = std::collections::BTreeMap::<String, usize>::new();
    for (_, st) in got.iter().filter(|(_, st)| st != "jump") {
        *reasons.entry(st.split(" at 0x").next().unwrap().to_string()).or_default() += 1;
    }
    eprintln!(
        "{module}: {jumps} of {} probed function entries take a jump ({:.1}%); the rest: {reasons:#?}",
        got.len(),
        jumps as f64 * 100.0 / got.len() as f64
    );
    (jumps, got.len(), reasons)
}

#[test]
fn most_function_entries_of_libc_and_libstdcxx_take_a_jump() {
    if int3_only() {
        eprintln!("SKIPPED in --no-optimize runs: this measures the jump strategy itself");
        return;
    }
    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    let (jumps, total, reasons) = jump_coverage("libc.so.6", &prog);
    assert!(total > 1000);
    assert!(jumps * 100 >= total * 95, "{jumps} of {total}: {reasons:#?}");
    // A larger body of code: the C++ runtime, loaded by the exceptions fixture.
    let dir = fixtures_dir();
    compile("g++", "libexcept_lib.so", &["fixtures/except_lib.cc"], &["-O2", "-g", "-fPIC", "-shared"]);
    let cxx = compile(
        "g++",
        "except",
        &["fixtures/except.cc"],
        &["-O2", "-g", "-fno-inline", &format!("-L{}", dir.display()), "-lexcept_lib", "-Wl,-rpath,$ORIGIN"],
    );
    let (jumps, total, reasons) = jump_coverage("libstdc++.so.6", &cxx);
    assert!(total > 1000);
    assert!(jumps * 100 >= total * 90, "{jumps} of {total}: {reasons:#?}");
}

#[test]
fn the_runtime_calls_no_libc_function_while_it_places_probes() {
    // Placement writes code with raw system calls and its own routines: probes on the libc
    // functions that writing code would need (syscall, mprotect) are never hit by the
    // runtime, which would show as hits that ran no handler.
    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    let count = artefact("libcount.so");
    let run = run_uprobe(&[
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        "probes=libc.so.6:syscall,libc.so.6:mprotect,myfunc",
        prog.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{:?} {}", run.status, run.output);
    assert_eq!(
        count_table(&run),
        [("libc.so.6:syscall".to_string(), 0), ("libc.so.6:mprotect".to_string(), 0), ("myfunc".to_string(), 5)]
    );
    assert!(!run.output.contains("ran no handler"), "{}", run.output);
}
