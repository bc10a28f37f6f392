//! The registration API: deferred (un)registration from inside a handler, and the refusals
//! of register_uprobe with their errno values and messages.

use uprobe_tests::*;

#[test]
fn requests_from_handlers_are_deferred_and_called_back() {
    let prog = fixture("self_reg", &["-O2", "-g", "-fno-inline"]);
    let plain = run_plain(&prog, &[]);
    let handler = test_handler("self_reg");
    let run = run_uprobe(&["--handlers", handler.to_str().unwrap(), prog.to_str().unwrap()]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout.as_bytes(), plain.stdout.as_slice());
    assert_eq!(
        run.output,
        "tick hit 3: register_uprobe(other) = -115\n\
         callback: other reg=1 type=0 result=0\n\
         tick hit 4: register_uprobe(other) = -115\n\
         callback: other reg=1 type=0 result=-17\n\
         tick hit 10: unregister_uprobe(tick) queued\n\
         callback: tick reg=0 type=0 result=0\n\
         exit: tick=10 other=20\n"
    );
}

#[test]
fn refusals_return_the_documented_errno() {
    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    let handler = test_handler("errnos");
    let run = run_uprobe(&["--handlers", handler.to_str().unwrap(), "--param", "func=myfunc", prog.to_str().unwrap()]);
    assert!(run.status.success(), "{}", run.stderr);
    let results: Vec<String> =
        run.output.lines().filter(|l| !l.starts_with("uprobe-run: ")).map(String::from).collect();
    assert_eq!(
        results,
        [
            "ok=0",
            "again=-17",
            "inside=-22",
            "unknown=-2",
            "unknown_module=0",
            "other_pid=-3",
            "data=-22",
            "foreign=-16",
            "none=-22",
        ]
    );
    let messages = run.lines_with("uprobe-run: register_uprobe(");
    let addr = nm_address(&prog, "myfunc");
    let expect = [
        format!(
            "myfunc+0x2): {:#x} is not an instruction boundary of myfunc: {:#x} is inside the instruction at {:#x}",
            addr + 2,
            addr + 2,
            addr + 1
        ),
        "no_such_function): symbol \"no_such_function\" not found in any loaded module".to_string(),
    ];
    for e in &expect {
        assert!(messages.iter().any(|m| m == e), "missing {e:?} in {messages:#?}");
    }
    assert!(messages.iter().any(|m| m.contains("is not this process")), "{messages:#?}");
    assert!(messages.iter().any(|m| m.contains("is not in executable code")), "{messages:#?}");
    assert!(messages.iter().any(|m| m.contains("holds a breakpoint that is not ours")), "{messages:#?}");
    assert!(messages.iter().any(|m| m.ends_with("neither vaddr nor symbol_name is set")), "{messages:#?}");
}
