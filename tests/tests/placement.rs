//! Batched placement: everything a handler library's `uprobe_init` registers is placed as one
//! batch, read from the address space once and written with one pass of the code-writing
//! protocol, without the runtime ever meeting a probe it places (`--stats` counts).

use uprobe_tests::*;

fn myprog() -> std::path::PathBuf {
    fixture("myprog", &["-O0", "-g", "-no-pie"])
}

/// Runs `program` with a probe on the entry of every function of libc listed in `list`.
fn run_libc_wide(list: &std::path::Path, program: &std::path::Path) -> Run {
    let coverage = test_handler("coverage");
    run_uprobe(&[
        "--stats",
        "--handlers",
        coverage.to_str().unwrap(),
        "--param",
        &format!("list={}", list.display()),
        "--param",
        "module=libc.so.6",
        program.to_str().unwrap(),
    ])
}

#[test]
fn every_libc_function_entry_is_placed_without_a_trap_and_one_read_of_the_address_space() {
    let prog = myprog();
    let plain = run_plain(&prog, &[]);
    let (all, n) = function_list("libc.so.6");
    assert!(n > 1500, "{n} functions in libc.so.6");
    let run = run_libc_wide(&all, &prog);
    assert!(run.status.success(), "{:?}\n{}", run.status, run.output);
    assert_eq!(run.stdout.as_bytes(), plain.stdout.as_slice());
    let wide = stats(&run);
    assert!(wide.points > 1500, "{wide:?}\n{}", run.output);
    assert_eq!(wide.traps_in_runtime, 0, "the runtime met its own probes: {wide:?}");
    assert_eq!(wide.batches, 1, "{wide:?}");

    // The same with ten probes: reading the address space does not grow with the probes.
    let few = tempfile("functions");
    std::fs::write(&few, "puts\nfputs\nfopen\nfclose\nqsort\natoi\nabs\nlabs\nstrtol\nrand\n").unwrap();
    let small = stats(&run_libc_wide(&few, &prog));
    assert_eq!(small.points, 10, "{small:?}");
    assert!(
        wide.maps_reads <= small.maps_reads + 2,
        "maps reads: {} probes {wide:?}, 10 probes {small:?}",
        wide.points
    );
    if int3_only() {
        // Only the functions glibc runs with every signal blocked take jumps then.
        assert!(wide.jumps < 40, "{wide:?}");
    } else {
        assert!(wide.jumps * 10 > wide.points * 9, "{wide:?}");
    }
    eprintln!("libc-wide placement: {wide:?}; ten probes: {small:?}");
}

#[test]
fn a_batch_with_bad_probes_places_the_good_ones_and_refuses_each_bad_one() {
    let prog = myprog();
    let handler = test_handler("batch_mix");
    let run = run_uprobe(&["--handlers", handler.to_str().unwrap(), "--param", "func=myfunc", prog.to_str().unwrap()]);
    assert!(run.status.success(), "{:?} {}", run.status, run.output);
    let results: Vec<String> =
        run.output.lines().filter(|l| !l.starts_with("uprobe-run: ")).map(String::from).collect();
    assert_eq!(results, ["func=0", "inside=-22", "main=0", "unknown=-2", "hits func=5", "hits main=1"]);
    let addr = nm_address(&prog, "myfunc");
    assert!(
        run.output.contains(&format!("register_uprobe(myfunc+0x2): {:#x} is not an instruction boundary", addr + 2)),
        "{}",
        run.output
    );
    assert!(run.output.contains("register_uprobe(no_such_function): symbol \"no_such_function\" not found"));
}

#[test]
fn a_probe_where_no_symbol_is_named_by_its_file_and_address() {
    // A stripped copy: myfunc has no symbol, its .eh_frame entry still makes it a function.
    let prog = myprog();
    let stripped = tempfile("myprog-stripped");
    let out = std::process::Command::new("strip").arg("-s").arg("-o").arg(&stripped).arg(&prog).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let vaddr = nm_address(&prog, "myfunc");
    // Not PIE: the file offset is the address less the first segment's 0x400000.
    let def = format!("p {}:{:#x}", stripped.display(), vaddr - 0x400000);
    let run = run_uprobe(&["-v", "-e", &def, stripped.to_str().unwrap()]);
    assert!(run.status.success(), "{}", run.stderr);
    let file = stripped.file_name().unwrap().to_str().unwrap();
    let how = if int3_only() { "int3 (jump probes disabled (--no-optimize))" } else { "jump" };
    let line = format!("uprobe-run: probe at {vaddr:#x} ({file}+{vaddr:#x}): {how}");
    assert!(run.output.lines().chain(run.stderr.lines()).any(|l| l == line), "{line}\n{}\n{}", run.output, run.stderr);
    let _ = std::fs::remove_file(&stripped);
}
