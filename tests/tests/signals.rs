//! Signals: the program's own SIGTRAP handler gets its own traps while probes stay the
//! runtime's; SIGTRAP blocked by the program, or a thread blocking every signal, loses no hit;
//! probes hit inside the program's signal handlers and on an alternate signal stack.

use std::os::unix::process::ExitStatusExt;

use uprobe_tests::*;

const FLAGS: &[&str] = &["-O2", "-g", "-fno-inline", "-pthread"];

const EXPECTED: &str = "\
sigaction reports the program's handler: yes
raise: traps=1 code=-6
int3: traps=2 code=128
blocked: reported blocked=1
raise while blocked: traps=2
after unblocking: traps=3 reported blocked=0
usr1 mask reported with SIGTRAP: 1
usr2 handler on the alternate stack: yes
ignored: traps=3, previous handler was SIG_IGN: yes
sum=28
";

#[test]
fn the_programs_signal_handling_is_its_own() {
    let prog = fixture("signals", FLAGS);
    let plain = run_plain(&prog, &[]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), EXPECTED, "the fixture itself");
    let count = artefact("libcount.so");
    let run = run_uprobe(&["--handlers", count.to_str().unwrap(), "--param", "probes=work", prog.to_str().unwrap()]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert_eq!(run.stdout, EXPECTED);
    assert_eq!(run.stderr, "");
    // 3 while SIGTRAP was blocked, 5 on the all-blocked thread, 2 + 1 in signal handlers.
    assert_eq!(count_table(&run), vec![("work".to_string(), 11)]);
    assert_eq!(run.output.lines().count(), 2, "{}", run.output);
}

#[test]
fn an_int3_of_the_program_without_a_handler_still_kills_it() {
    let prog = fixture("signals", FLAGS);
    let plain = run_plain(&prog, &["int3"]);
    assert_eq!(plain.status.signal(), Some(libc::SIGTRAP));
    let count = artefact("libcount.so");
    let run =
        run_uprobe(&["--handlers", count.to_str().unwrap(), "--param", "probes=work", prog.to_str().unwrap(), "int3"]);
    assert_eq!(run.status.signal(), Some(libc::SIGTRAP));
    assert_eq!(run.stdout, "int3 without a handler\n");
    assert!(run.output.starts_with("uprobe-run: SIGTRAP that is not a probe hit, near 0x"), "{}", run.output);
    // The report still comes, before the process dies of the trap.
    assert_eq!(count_table(&run), vec![("work".to_string(), 0)]);
    assert_eq!(run.output.lines().count(), 3, "{}", run.output);
}
