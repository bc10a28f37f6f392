//! A handler that faults: one line naming the probe, the handler library and the faulting
//! address, then the default action. The program's own SIGSEGV handler keeps getting the
//! program's own faults.

use std::os::unix::process::ExitStatusExt;

use uprobe_tests::*;

const FLAGS: &[&str] = &["-O2", "-g", "-fno-inline"];

#[test]
fn the_programs_own_segv_handler_gets_its_own_faults() {
    let prog = fixture("segv", FLAGS);
    let plain = run_plain(&prog, &[]);
    assert!(plain.status.success());
    let count = artefact("libcount.so");
    let run = run_uprobe(&["--handlers", count.to_str().unwrap(), "--param", "probes=work", prog.to_str().unwrap()]);
    assert!(run.status.success(), "{:?}", run.status);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout));
    assert!(run.stdout.starts_with("recovered 3 faults, last at 0x18\n"), "{}", run.stdout);
    assert_eq!(count_table(&run), vec![("work".to_string(), 5)]);
}

#[test]
fn a_faulting_handler_is_named_and_the_default_action_follows() {
    let prog = fixture("segv", FLAGS);
    let handler = test_handler("fault");
    let run = run_uprobe(&["--handlers", handler.to_str().unwrap(), prog.to_str().unwrap()]);
    assert_eq!(run.status.signal(), Some(libc::SIGSEGV), "{:?}", run.status);
    // The program's handler, which would have jumped back into the program, is not called.
    assert_eq!(run.stdout, "recovered 3 faults, last at 0x18\nwork(0) = 1\nwork(1) = 2\n");
    let addr = nm_address(&prog, "work");
    let probe_field = run.output.strip_prefix("uprobe-run: handler for probe at ").and_then(|r| r.split(' ').next());
    let probe = probe_field.expect(&run.output).to_string();
    let runtime_addr = u64::from_str_radix(probe.trim_start_matches("0x"), 16).unwrap();
    assert_eq!(runtime_addr & 0xfff, addr & 0xfff, "{}", run.output);
    assert_eq!(
        run.output,
        format!(
            "uprobe-run: handler for probe at {probe} (work+0x0) in {} faulted: SIGSEGV at 0x10\n",
            handler.display()
        )
    );
}
