//! dlopen/dlclose: a "module:symbol" probe on a library not loaded yet is accepted, armed at
//! every load and dropped at every unload; a library opened twice and closed once stays probed.

use uprobe_tests::*;

#[test]
fn a_library_loaded_and_unloaded_1000_times_is_probed_every_time() {
    let lib = gcc("libhazard_dl.so", &["fixtures/dl_lib.c"], &["-shared", "-fPIC", "-O2", "-g", "-fno-inline"]);
    let prog = fixture("dlopen", &["-O2", "-g"]);
    let plain = run_plain(&prog, &[lib.to_str().unwrap()]);
    assert!(plain.status.success());
    let count = artefact("libcount.so");
    let run = run_uprobe(&[
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        "probes=libhazard_dl:lib_func",
        prog.to_str().unwrap(),
        lib.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout));
    assert_eq!(run.stderr, "");
    assert_eq!(count_table(&run), vec![("libhazard_dl:lib_func".to_string(), 3 * 1000 + 2)]);
    assert_eq!(run.output.lines().count(), 2, "{}", run.output);
}

#[test]
fn dlopen_by_name_still_searches_the_programs_runpath() {
    // glibc finds a bare name through the RUNPATH of the object calling dlopen: the runtime's
    // dlopen must not make itself that caller.
    gcc("libhazard_dl.so", &["fixtures/dl_lib.c"], &["-shared", "-fPIC", "-O2", "-g", "-fno-inline"]);
    let prog = gcc("dlopen_runpath", &["fixtures/dlopen.c"], &["-O2", "-g", "-Wl,-rpath,$ORIGIN"]);
    let plain = run_plain(&prog, &["libhazard_dl.so", "10"]);
    assert!(plain.status.success(), "{plain:?}");
    let count = artefact("libcount.so");
    let run = run_uprobe(&[
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        "probes=libhazard_dl:lib_func",
        prog.to_str().unwrap(),
        "libhazard_dl.so",
        "10",
    ]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout));
    assert_eq!(count_table(&run), vec![("libhazard_dl:lib_func".to_string(), 3 * 10 + 2)]);
}
