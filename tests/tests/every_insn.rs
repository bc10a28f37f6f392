//! A probe on every instruction boundary of 30 functions (jump tables, indirect calls,
//! recursion, SSE, cmov, tail calls, string loops, RIP-relative loads and stores): the program's
//! output is byte-identical to the unprobed run, and every probe's count equals the number of
//! times the instruction executed, as measured independently with kernel uprobes
//! (tests/fixtures/every_insn.counts, made by gen_counts.sh).

use uprobe_tests::*;

fn expected() -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(workspace_root().join("tests/fixtures/every_insn.counts")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (spec, count) = l.split_once(' ').unwrap();
            (spec.to_string(), count.parse().unwrap())
        })
        .collect()
}

#[test]
fn every_instruction_counts_exactly_and_output_is_unchanged() {
    let prog = gcc("every_insn", &["fixtures/every_insn.s"], &[]);
    let plain = run_plain(&prog, &[]);
    assert!(plain.status.success());
    let expected = expected();
    assert_eq!(expected.len(), 827);
    let specs: Vec<&str> = expected.iter().map(|(s, _)| s.as_str()).collect();
    let count = artefact("libcount.so");
    let run = run_uprobe(&[
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        &format!("probes={}", specs.join(",")),
        prog.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    assert_eq!(run.stdout.as_bytes(), plain.stdout.as_slice(), "stdout differs from the unprobed run");
    assert_eq!(run.stderr.as_bytes(), plain.stderr.as_slice());
    let got = count_table(&run);
    let mismatches: Vec<String> = expected
        .iter()
        .zip(&got)
        .filter(|(e, g)| e != g)
        .map(|(e, g)| format!("{}: expected {}, got {} ({})", e.0, e.1, g.1, g.0))
        .collect();
    assert_eq!(got.len(), expected.len(), "{}", run.output);
    assert!(mismatches.is_empty(), "{} probes miscounted:\n{}", mismatches.len(), mismatches.join("\n"));
    assert!(!run.output.contains("ran no handler"), "{}", run.output);
}
