//! User stacks as keys (`--count --by ustack[:DEPTH]`), unwound in the process with each
//! module's call-frame information: fixtures built `-O2 -fomit-frame-pointer` (no frame
//! pointers) with known call chains. Each test asserts the exact frames, and where gdb is
//! installed, that the program's own frames are those gdb's `bt` shows for the same hit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use uprobe_tests::{compile, gcc, run_uprobe, Run};

const FLAGS: &[&str] = &["-O2", "-g", "-fomit-frame-pointer", "-Wall", "-Wextra", "-pthread", "-ldl"];

fn stacks() -> PathBuf {
    gcc("stacks", &["fixtures/stacks.c", "fixtures/stacks_corrupt.S"], FLAGS)
}

/// The fixture's own functions: the frames compared with gdb's.
const OWN: &[&str] = &[
    "leaf",
    "f1",
    "f2",
    "f3",
    "f4",
    "f5",
    "f6",
    "path_a",
    "path_b",
    "rec",
    "on_alarm",
    "spin",
    "thread_main",
    "main",
    "lib_inner",
    "lib_chain",
    "cleanup_leaf",
    "ns::Guard::~Guard",
    "thrower",
    "middle",
    "outer",
    "corrupt_caller",
];

/// The stacks of the text report of `count EVENT by ...`, as function names (module and
/// offset left out; `FILE+0xOFF` frames as they are), with their counts.
fn stacks_of(run: &Run, event: &str) -> BTreeMap<Vec<String>, u64> {
    let mut out = BTreeMap::new();
    let mut lines = run.output.lines().skip_while(|l| !l.starts_with(&format!("count {event} by ")));
    lines.next().unwrap_or_else(|| panic!("no report of {event}:\n{}{}", run.stderr, run.output));
    let mut frames = Vec::new();
    for line in lines {
        if line == "@[" {
            frames.clear();
        } else if let Some(count) = line.strip_prefix("]: ") {
            out.insert(std::mem::take(&mut frames), count.parse().unwrap());
        } else if let Some(frame) = line.strip_prefix("    ") {
            frames.push(function(frame));
        } else {
            break;
        }
    }
    out
}

/// `name+0xoff (module)` -> `name`; `FILE+0xoff` stays.
fn function(frame: &str) -> String {
    match frame.split_once(" (") {
        Some((named, _)) => named.rsplit_once('+').map_or(named, |(n, _)| n).to_string(),
        None => frame.to_string(),
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn count(program: &Path, events: &[&str], by: &str, args: &[&str]) -> Run {
    let mut all: Vec<&str> = Vec::new();
    for e in events {
        all.extend(["-e", e]);
    }
    all.extend(["--count", "--by", by, program.to_str().unwrap()]);
    all.extend(args);
    let run = run_uprobe(&all);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    assert_eq!(run.stdout, "done\n");
    run
}

/// The program's own functions of gdb's `bt` at the first stop at `function` (None when gdb
/// is not installed).
fn gdb_bt(program: &Path, function: &str, args: &[&str]) -> Option<Vec<String>> {
    let out = Command::new("gdb")
        .args(["-nx", "-batch", "-iex", "set debuginfod enabled off", "-ex", "set pagination off"])
        .args(["-ex", &format!("break {function}"), "-ex", "run", "-ex", "bt", "-ex", "kill", "--args"])
        .arg(program)
        .args(args)
        .output();
    let Ok(out) = out else {
        eprintln!("gdb is not installed: the comparison with gdb's bt is skipped");
        return None;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let frames: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            let rest = l.split_once(char::is_whitespace).map_or("", |(_, r)| r.trim_start());
            let rest = rest.split_once(" in ").filter(|(a, _)| a.starts_with("0x")).map_or(rest, |(_, r)| r);
            let name = rest.split(" (").next().unwrap_or(rest);
            name.split('(').next().unwrap_or(name).to_string()
        })
        .filter(|n| OWN.contains(&n.as_str()))
        .collect();
    assert!(!frames.is_empty(), "gdb stopped nowhere:\n{text}{}", String::from_utf8_lossy(&out.stderr));
    Some(frames)
}

/// Our stack's own frames equal gdb's for the same place.
fn same_as_gdb(ours: &[String], program: &Path, function: &str, args: &[&str]) {
    if let Some(gdb) = gdb_bt(program, function, args) {
        let own: Vec<&str> = ours.iter().map(String::as_str).filter(|f| OWN.contains(f)).collect();
        assert_eq!(own, strs(&gdb), "ours: {ours:?}");
    }
}

/// The frames below `main`: glibc's start, ending with the program's `_start`.
fn ends_at_start(stack: &[String]) {
    let main = stack.iter().position(|f| f == "main").unwrap_or_else(|| panic!("no main in {stack:?}"));
    assert_eq!(stack.last().map(String::as_str), Some("_start"), "{stack:?}");
    assert!(stack.len() - main <= 4, "{stack:?}");
}

#[test]
fn a_chain_reached_from_two_paths_counts_each_stack_exactly() {
    let p = stacks();
    let run = count(&p, &[&format!("p:leaf {}:leaf", p.display())], "ustack", &["chain", "3", "5"]);
    let got = stacks_of(&run, "leaf");
    assert_eq!(got.len(), 2, "{}", run.output);
    let chain = ["leaf", "f6", "f5", "f4", "f3", "f2", "f1"];
    for (path, n) in [("path_a", 3), ("path_b", 5)] {
        let (stack, count) = got.iter().find(|(s, _)| s.get(7).map(String::as_str) == Some(path)).unwrap();
        assert_eq!(*count, n, "{stack:?}");
        assert_eq!(strs(&stack[..7]), chain);
        assert_eq!(stack[8], "main");
        ends_at_start(stack);
    }
    let a = got.keys().find(|s| s[7] == "path_a").unwrap();
    same_as_gdb(a, &p, "leaf", &["chain", "1", "0"]);
}

#[test]
fn deep_recursion_stops_at_the_depth_asked_and_at_127() {
    let p = stacks();
    let def = format!("p:leaf {}:leaf", p.display());
    let whole = stacks_of(&count(&p, &[&def], "ustack", &["recurse", "3"]), "leaf");
    let stack = whole.keys().next().unwrap();
    assert_eq!(strs(&stack[..6]), ["leaf", "rec", "rec", "rec", "rec", "main"]);
    ends_at_start(stack);
    same_as_gdb(stack, &p, "leaf", &["recurse", "3"]);

    let deep = stacks_of(&count(&p, &[&def], "ustack", &["recurse", "300"]), "leaf");
    let stack = deep.keys().next().unwrap();
    assert_eq!(stack.len(), 127);
    assert_eq!(stack[0], "leaf");
    assert!(stack[1..].iter().all(|f| f == "rec"), "{stack:?}");

    let five = stacks_of(&count(&p, &[&def], "ustack:5", &["recurse", "300"]), "leaf");
    assert_eq!(
        five.into_iter().collect::<Vec<_>>(),
        [(["leaf", "rec", "rec", "rec", "rec"].map(String::from).to_vec(), 1)]
    );
}

#[test]
fn a_signal_handlers_stack_continues_into_the_interrupted_function() {
    let p = stacks();
    let run = count(&p, &[&format!("p:leaf {}:leaf", p.display())], "ustack", &["signal"]);
    let got = stacks_of(&run, "leaf");
    let stack = got.keys().next().unwrap();
    // The signal frame (glibc's __restore_rt, which has no symbol) between the handler and
    // the code it interrupted.
    assert_eq!(strs(&stack[..2]), ["leaf", "on_alarm"], "{stack:?}");
    assert!(stack[2].starts_with("libc.so.6+0x") || stack[2] == "__restore_rt", "{stack:?}");
    assert_eq!(strs(&stack[3..5]), ["spin", "main"], "{stack:?}");
    ends_at_start(stack);
    same_as_gdb(stack, &p, "leaf", &["signal"]);
}

#[test]
fn a_return_probed_frame_shows_its_real_caller() {
    let p = stacks();
    let leaf = format!("p:leaf {}:leaf", p.display());
    let ret = format!("r:f3 {}:f3", p.display());
    let run = count(&p, &[&leaf, &ret], "ustack", &["chain", "2", "0"]);
    let got = stacks_of(&run, "leaf");
    let stack = got.keys().next().unwrap();
    assert_eq!(got.values().copied().collect::<Vec<_>>(), [2]);
    assert_eq!(strs(&stack[..9]), ["leaf", "f6", "f5", "f4", "f3", "f2", "f1", "path_a", "main"]);
    ends_at_start(stack);
    // The return itself: where f3 returned to.
    let returned = stacks_of(&run, "f3");
    let stack = returned.keys().next().unwrap();
    assert_eq!(strs(&stack[..4]), ["f2", "f1", "path_a", "main"], "{stack:?}");
}

#[test]
fn frames_of_a_dlopened_library_and_of_a_thread() {
    let p = stacks();
    let lib =
        gcc("libstacks_lib.so", &["fixtures/stacks_lib.c"], &["-O2", "-g", "-fomit-frame-pointer", "-shared", "-fPIC"]);
    let lib = lib.to_str().unwrap();
    let inner = format!("p:inner {lib}:lib_inner");
    let leaf = format!("p:leaf {}:leaf", p.display());
    let run = count(&p, &[&inner, &leaf], "ustack", &["dlopen", lib]);
    let stack = stacks_of(&run, "leaf").into_keys().next().unwrap();
    assert_eq!(strs(&stack[..4]), ["leaf", "lib_inner", "lib_chain", "main"], "{stack:?}");
    ends_at_start(&stack);
    let stack = stacks_of(&run, "inner").into_keys().next().unwrap();
    assert_eq!(strs(&stack[..3]), ["lib_inner", "lib_chain", "main"], "{stack:?}");

    let run = count(&p, &[&leaf], "ustack", &["thread"]);
    let stack = stacks_of(&run, "leaf").into_keys().next().unwrap();
    assert_eq!(strs(&stack[..8]), ["leaf", "f6", "f5", "f4", "f3", "f2", "f1", "thread_main"], "{stack:?}");
    // Then glibc's thread start and clone, whose outermost frame ends the stack.
    assert!(stack.len() <= 10 && !stack.iter().any(|f| f.starts_with('[')), "{stack:?}");
    same_as_gdb(&stack, &p, "leaf", &["thread"]);
}

#[test]
fn a_cxx_exception_in_flight() {
    let flags = ["-O2", "-g", "-fomit-frame-pointer"];
    let p = compile("g++", "stacks_except", &["fixtures/stacks_except.cc"], &flags);
    let leaf = format!("p:leaf {}:cleanup_leaf", p.display());
    let personality = "p:pers libstdc++.so.6:__gxx_personality_v0";
    let run = count(&p, &[&leaf, personality], "ustack", &["3"]);
    // A destructor run by the unwinder, the exception still in flight.
    let got = stacks_of(&run, "leaf");
    assert_eq!(got.values().copied().collect::<Vec<_>>(), [3]);
    let stack = got.keys().next().unwrap();
    assert_eq!(strs(&stack[..5]), ["cleanup_leaf", "ns::Guard::~Guard", "middle", "outer", "main"]);
    ends_at_start(stack);
    same_as_gdb(stack, &p, "cleanup_leaf", &["1"]);
    // The personality routine called by libgcc's unwinder, through __cxa_throw.
    let throwing = stacks_of(&run, "pers");
    let (stack, _) = throwing.iter().find(|(s, _)| s.iter().any(|f| f == "__cxa_throw")).unwrap();
    let at = stack.iter().position(|f| f == "__cxa_throw").unwrap();
    assert_eq!(strs(&stack[at..at + 5]), ["__cxa_throw", "thrower", "middle", "outer", "main"], "{stack:?}");
    assert!(stack[..at].iter().any(|f| f == "_Unwind_RaiseException"), "{stack:?}");
    ends_at_start(stack);
}

#[test]
fn stack_keys_combine_with_other_parts_and_come_as_arrays_in_json() {
    let p = stacks();
    let def = format!("p:leaf {}:leaf", p.display());
    let run = count(&p, &[&def], "tid,ustack:3", &["chain", "2", "0"]);
    let text = &run.output[run.output.find("count leaf by tid,ustack:3: 2 hits, 1 key\n").expect(&run.output)..];
    let tid = text.lines().nth(1).unwrap();
    assert!(tid.starts_with("@[") && tid.ends_with(", "), "{text}");
    let rows: Vec<&str> = text.lines().skip(2).take(4).collect();
    assert_eq!(rows[0], "    leaf+0x0 (stacks)");
    assert!(rows[1].starts_with("    f6+0x") && rows[2].starts_with("    f5+0x"), "{text}");
    assert_eq!(rows[3], "]: 2");

    let json = run_uprobe(&[
        "-e",
        &def,
        "--count",
        "--by",
        "ustack:2",
        "--format",
        "json",
        p.to_str().unwrap(),
        "chain",
        "1",
        "0",
    ]);
    let line = json.output.lines().find(|l| l.contains("\"key\"")).expect(&json.output);
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let frames: Vec<&str> = v["key"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0], "leaf+0x0 (stacks)");
    assert!(frames[1].starts_with("f6+0x") && frames[1].ends_with(" (stacks)"), "{frames:?}");
}

#[test]
fn a_depth_over_127_is_refused_before_the_program_starts() {
    let p = stacks();
    let def = format!("p:leaf {}:leaf", p.display());
    for (by, what) in [("ustack:128", "from 1 to 127, not ustack:128"), ("ustack:0", "not ustack:0"), ("ustackx", "")] {
        let run = run_uprobe(&["-e", &def, "--count", "--by", by, p.to_str().unwrap(), "chain", "1", "0"]);
        assert_eq!(run.status.code(), Some(2), "{by}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "the program did not start");
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{}", run.stderr);
        assert!(
            lines[0].starts_with(&format!("uprobe-run: --by '{by}': expected ")) && lines[0].contains(what),
            "{}",
            run.stderr
        );
    }
}

#[test]
fn a_module_without_call_frame_information_is_followed_by_its_frame_pointers() {
    let p = stacks();
    let flags = ["-O2", "-g", "-fno-omit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"];
    let lib = gcc("libstacks_fp.so", &["fixtures/stacks_lib.c"], &[&flags[..], &["-shared", "-fPIC"]].concat());
    let lib = lib.to_str().unwrap();
    let run = count(&p, &[&format!("p:leaf {}:leaf", p.display())], "ustack", &["dlopen", lib]);
    let stack = stacks_of(&run, "leaf").into_keys().next().unwrap();
    assert_eq!(strs(&stack[..4]), ["leaf", "lib_inner", "lib_chain", "main"], "{stack:?}");
    ends_at_start(&stack);
    let said = format!("uprobe-run: stacks: {lib} has no call-frame information (.eh_frame): its frames are followed by frame pointers");
    let told = run.stderr.lines().chain(run.output.lines()).filter(|l| *l == said).count();
    assert_eq!(told, 1, "{}{}", run.stderr, run.output);
}

#[test]
fn a_frame_that_cannot_be_followed_ends_the_stack_with_a_marker() {
    let p = stacks();
    let run = count(&p, &[&format!("p:leaf {}:leaf", p.display())], "ustack", &["corrupt"]);
    let got = stacks_of(&run, "leaf");
    let stack = got.keys().next().unwrap();
    assert_eq!(strs(stack), ["leaf", "corrupt_caller", "[stack unreadable from here]"]);
    assert_eq!(got.values().copied().collect::<Vec<_>>(), [1]);
}
