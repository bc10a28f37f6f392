//! No silent no-ops: every mistake that used to be accepted and then did nothing is refused
//! with one line, or reported where it matters (at the end of the run, and with `-v` when it
//! happens).

use std::path::Path;
use std::process::Output;

use uprobe_tests::*;

/// Asserts a refusal by uprobe-run itself: status 2, exactly `line` on stderr, and the
/// program never ran.
fn assert_refused(out: &Output, line: &str, marker: &Path) {
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), format!("{line}\n"));
    assert!(!marker.exists(), "the program ran");
}

fn marker_program(marker: &Path) -> String {
    format!("echo ran > {}", marker.display())
}

#[test]
fn a_run_with_nothing_to_do_is_refused() {
    let marker = tempfile("marker");
    let script = marker_program(&marker);
    let out = uprobe_run_raw(&["/bin/sh", "-c", &script]);
    assert_refused(
        &out,
        "uprobe-run: nothing to do: give a handler library (--handlers LIB.so), an event definition \
         (-e DEF, --events FILE) or --latency WHERE; uprobe-run --help shows examples",
        &marker,
    );
}

#[test]
fn a_library_without_entry_points_is_refused() {
    let empty = test_handler("empty");
    let marker = tempfile("marker");
    let script = marker_program(&marker);
    let out = uprobe_run_raw(&["--handlers", empty.to_str().unwrap(), "/bin/sh", "-c", &script]);
    assert_refused(
        &out,
        &format!(
            "uprobe-run: {}: exports neither uprobe_init nor uprobe_exit, so it can neither place a probe \
             nor report (a handler library defines at least one; see uprobe.h)",
            empty.display()
        ),
        &marker,
    );
}

#[test]
fn a_probe_whose_module_never_loads_is_reported() {
    let prog = fixture("endings", &["-O2", "-g", "-fno-inline"]);
    let count = artefact("libcount.so");
    let waits = "uprobe-run: probe c:malloc waits for a module named \"c\": it is placed when one is loaded";
    let never = "uprobe-run: probe c:malloc was never placed: no module named \"c\" was loaded while the program ran";
    for verbose in [false, true] {
        let mut args = vec!["--handlers", count.to_str().unwrap(), "--param", "probes=c:malloc,work"];
        if verbose {
            args.push("-v");
        }
        args.push(prog.to_str().unwrap());
        let run = run_uprobe(&args);
        assert!(run.status.success(), "{:?}", run.status);
        assert_eq!(run.output.lines().filter(|l| *l == never).count(), 1, "{}", run.output);
        assert_eq!(run.output.lines().any(|l| l == waits), verbose, "{}", run.output);
        assert_eq!(count_table(&run), vec![("c:malloc".to_string(), 0), ("work".to_string(), 3)]);
    }
}

#[test]
fn an_offset_past_the_end_of_its_function_is_refused() {
    let prog = fixture("endings", &["-O2", "-g", "-fno-inline"]);
    let count = artefact("libcount.so");
    let run =
        run_uprobe(&["--handlers", count.to_str().unwrap(), "--param", "probes=work+1000", prog.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(127));
    assert_eq!(run.stdout, "", "the program ran");
    let size = instructions(&prog, "work").len();
    assert!(size > 0);
    let first = run.output.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("uprobe-run: register_uprobe(work+0x3e8): work+0x3e8 lies past the end of work, which is "),
        "{}",
        run.output
    );
    assert!(run.output.contains("count: cannot probe work+1000: EINVAL (-22)"), "{}", run.output);
}

#[test]
fn an_address_outside_every_function_needs_raw_address() {
    let prog = fixture("bare", &["-O2", "-no-pie"]);
    let count = artefact("libcount.so");
    let bare = nm_address(&prog, "bare");
    let count_at = |spec: &str, raw: bool| {
        let probes = format!("probes={spec}");
        let mut args = vec!["--handlers", count.to_str().unwrap(), "--param", &probes, prog.to_str().unwrap()];
        if raw {
            args.insert(0, "--raw-address");
        }
        run_uprobe(&args)
    };
    // The symbol itself is fine: it says where the code starts.
    let by_name = count_at("bare", false);
    assert!(by_name.status.success(), "{}", by_name.output);
    assert_eq!(count_table(&by_name), vec![("bare".to_string(), 3)]);

    // An address (or an offset into it) is not known to be code without --raw-address.
    let ret = format!("{:#x}", bare + 3);
    for spec in [format!("{bare:#x}"), ret.clone(), "bare+3".to_string()] {
        let refused = count_at(&spec, false);
        assert_eq!(refused.status.code(), Some(127), "{spec}: {}", refused.output);
        assert_eq!(refused.stdout, "");
        assert!(refused.output.contains("--raw-address to probe it anyway"), "{spec}: {}", refused.output);
        assert!(refused.output.contains(&format!("count: cannot probe {spec}: EINVAL (-22)")), "{}", refused.output);
        let allowed = count_at(&spec, true);
        assert!(allowed.status.success(), "{spec}: {}", allowed.output);
        assert_eq!(allowed.stdout, "sum 6\n");
        assert_eq!(count_table(&allowed), vec![(spec.clone(), 3)], "{}", allowed.output);
    }
    let padding = refused_line(&count_at(&ret, false));
    assert_eq!(
        padding,
        format!(
            "uprobe-run: register_uprobe({ret}): {ret} is outside every function symbol (padding or data \
             between functions?): give a function's address or name, or run with --raw-address to probe it anyway"
        )
    );
}

fn refused_line(run: &Run) -> String {
    run.output.lines().next().unwrap_or_default().to_string()
}

#[test]
fn a_pie_programs_nm_address_gets_a_hint() {
    let prog = gcc("myprog_pie", &["fixtures/myprog.c"], &["-O0", "-g", "-fPIE", "-pie"]);
    let addr = nm_address(&prog, "myfunc");
    let run = run_example(&prog, addr, &[]);
    assert_eq!(run.status.code(), Some(127));
    let line = run.output.lines().find(|l| l.starts_with("uprobe-run: register_uprobe(")).expect(&run.output);
    let start = format!(
        "uprobe-run: register_uprobe({addr:#x}): {addr:#x} is not in executable code: it is myfunc's address \
         in the program's file, as nm shows it, but the program is position-independent and runs at another \
         address: probe it by name (symbol_name \"myfunc\"; --param symbol=myfunc for uprobe_example.so) or at \
         its run-time address 0x"
    );
    assert!(line.starts_with(&start), "{line}");
    let runtime = u64::from_str_radix(&line[start.len()..], 16).unwrap();
    assert_eq!(runtime & 0xfff, addr & 0xfff);
}

#[test]
fn an_oversized_parameter_names_the_variable_and_the_limit() {
    let count = artefact("libcount.so");
    let list = vec!["work"; 16_000].join(",");
    let (probes, other) = (format!("probes={list}"), format!("other={list}"));
    let marker = tempfile("marker");
    let script = marker_program(&marker);
    let out = uprobe_run_raw(&[
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        &probes,
        "--param",
        &other,
        "/bin/sh",
        "-c",
        &script,
    ]);
    // handlers\tPATH \n param\tprobes=... \n param\tother=... \n end\tCHECK (16 hex digits); then
    // NAME=, and the NUL.
    let records = ["handlers\t".len() + count.to_str().unwrap().len(), 6 + probes.len(), 6 + other.len()];
    let spec_len = records.iter().sum::<usize>() + 3 + "end\t".len() + 16;
    assert_refused(
        &out,
        &format!(
            "uprobe-run: UPROBE_RUN_SPEC would be {} bytes, over the kernel's limit of 131072 bytes for one \
             environment string (MAX_ARG_STRLEN): its largest part is --param probes ({} bytes); pass long \
             lists in a file the handler reads (libcount.so: --param probes-file=FILE)",
            "UPROBE_RUN_SPEC=".len() + spec_len + 1,
            6 + probes.len(),
        ),
        &marker,
    );
}

#[test]
fn a_long_probe_list_goes_in_a_file() {
    let prog = fixture("endings", &["-O2", "-g", "-fno-inline"]);
    let count = artefact("libcount.so");
    let list = tempfile("probes");
    std::fs::write(&list, "# probes\nwork\nmain\n").unwrap();
    let run = run_uprobe(&[
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        &format!("probes-file={}", list.display()),
        prog.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", run.output);
    assert_eq!(count_table(&run), vec![("work".to_string(), 3), ("main".to_string(), 1)]);
}
