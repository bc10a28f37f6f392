//! Handlers that change registers: a skipped function (changed rip), a changed argument at
//! entry, a changed return value at the `ret` instruction.

use uprobe_tests::*;

#[test]
fn handler_changes_are_seen_by_the_program() {
    let prog = fixture("regs_change", &["-O2", "-g", "-fno-inline"]);
    let plain = run_plain(&prog, &[]);
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        "add(1, 10) = 11\nadd(2, 10) = 12\nadd(3, 10) = 13\nsum = 36, twice = 72\n"
    );
    let ret = instructions(&prog, "add").into_iter().find(|(_, m)| m == "ret").expect("add has a ret").0;
    let handler = test_handler("regs");
    let run = run_uprobe(&[
        "--handlers",
        handler.to_str().unwrap(),
        "--param",
        "entry=add",
        "--param",
        &format!("ret=add+{ret:#x}"),
        prog.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", run.stderr);
    // Call 1 returns 7 without running; call 2 gets a = 100 (gcc's interprocedural register
    // allocation knows add() keeps %edi, so main prints the changed register); call 3 returns 1000.
    assert_eq!(run.stdout, "add(1, 10) = 7\nadd(100, 10) = 110\nadd(3, 10) = 1000\nsum = 1117, twice = 2234\n");
    assert_eq!(run.output, "regs: entry hits 3, ret hits 2\n");
}
