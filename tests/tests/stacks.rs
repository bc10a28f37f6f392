//! User stacks as keys (`--count --by ustack[:DEPTH]`), unwound in the process with each
//! module's call-frame information: fixtures built `-O2 -fomit-frame-pointer` (no frame
//! pointers) with known call chains. Each test asserts the exact frames, and where gdb is
//! installed, that the program's own frames are those gdb's `bt` shows for the same hit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use uprobe_tests::attach::{Session, Target};
use uprobe_tests::{compile, gcc, need_ptrace, run_uprobe, tempfile, Run};

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
    "blocker",
];

/// The stacks of the text report of `count EVENT by ...`, as function names (module and
/// offset left out; `FILE+0xOFF` frames as they are), with their counts.
fn stacks_of(run: &Run, event: &str) -> BTreeMap<Vec<String>, u64> {
    whole_stacks(&run.output, event, &run.stderr)
        .into_iter()
        .map(|(s, n)| (s.iter().map(|f| function(f)).collect(), n))
        .collect()
}

/// The stacks of the text report `text` of `count EVENT by ...`, frames as printed.
fn whole_stacks(text: &str, event: &str, stderr: &str) -> BTreeMap<Vec<String>, u64> {
    let mut out = BTreeMap::new();
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&format!("count {event} by ")));
    lines.next().unwrap_or_else(|| panic!("no report of {event}:\n{stderr}{text}"));
    let mut frames = Vec::new();
    for line in lines {
        if line == "@[" {
            frames.clear();
        } else if let Some(count) = line.strip_prefix("]: ") {
            out.insert(std::mem::take(&mut frames), count.parse().unwrap());
        } else if let Some(frame) = line.strip_prefix("    ") {
            frames.push(frame.to_string());
        } else {
            break;
        }
    }
    out
}

/// `name+0xoff (module) at FILE:LINE` -> `name`; `FILE+0xoff` stays.
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
    assert!(rows[0].starts_with("    leaf+0x0 (stacks) at ") && rows[0].contains("stacks.c:"), "{text}");
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
    assert!(frames[0].starts_with("leaf+0x0 (stacks) at "), "{frames:?}");
    assert!(frames[1].starts_with("f6+0x") && frames[1].contains(" (stacks) at "), "{frames:?}");
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

/// A frame `name+0xoff (module) at FILE:LINE` as (name, offset, place).
fn parts(frame: &str) -> (&str, u64, Option<&str>) {
    let (named, place) = frame.split_once(" at ").map_or((frame, None), |(n, p)| (n, Some(p)));
    let named = named.split(" (").next().unwrap();
    let (name, off) = named.rsplit_once("+0x").unwrap_or_else(|| panic!("{frame}"));
    (name, u64::from_str_radix(off, 16).unwrap(), place)
}

/// What `addr2line -e FILE` says of link-time address `addr`: `FILE:LINE`.
fn addr2line(file: &Path, addr: u64) -> String {
    let out = Command::new("addr2line").arg("-e").arg(file).arg(format!("{addr:#x}")).output().expect("addr2line");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().unwrap_or("").split(" (discriminator").next().unwrap().to_string()
}

/// The link-time address of function `name` in the ELF file `file` (a debug file too), as
/// `nm` gives it.
fn address_of(file: &Path, name: &str) -> u64 {
    let out = Command::new("nm").arg(file).output().expect("nm");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| {
        l.split(' ').nth(2).map(|n| n.split('@').next().unwrap()) == Some(name)
            && matches!(l.split(' ').nth(1), Some("T" | "t"))
    });
    let line = line.unwrap_or_else(|| panic!("{}: no function {name}", file.display()));
    u64::from_str_radix(line.split(' ').next().unwrap(), 16).unwrap()
}

/// What gdb's `info line *ADDR` says of link-time address `addr` of `file`: `FILE:LINE`
/// (FILE relative to its compilation directory).
fn gdb_line(file: &Path, addr: u64) -> String {
    let out = Command::new("gdb").args(["-nx", "-batch", "-ex", &format!("info line *{addr:#x}")]).arg(file).output();
    let text = String::from_utf8_lossy(&out.expect("gdb").stdout).into_owned();
    let line = text.lines().find_map(|l| l.strip_prefix("Line ")).unwrap_or_else(|| panic!("{text}"));
    let (n, rest) = line.split_once(" of \"").unwrap();
    format!("{}:{n}", rest.split('"').next().unwrap().trim_start_matches("./").trim_start_matches("../"))
}

/// Each frame of `module`'s place equals what `tool` says of its address in `file` (the
/// call's, before a return address), FILE the module or its debug file: how many.
fn places_as(frames: &[String], module: &str, file: &Path, tool: fn(&Path, u64) -> String) -> usize {
    let mut compared = 0;
    for (i, f) in frames.iter().enumerate() {
        if !f.contains(&format!(" ({module})")) || f.starts_with("_start+") {
            continue;
        }
        let (name, off, place) = parts(f);
        let addr = address_of(file, name) + off - u64::from(i > 0);
        let expected = tool(file, addr);
        let place = place.unwrap_or_else(|| panic!("frame {i} has no place: {f}"));
        assert!(place == expected || place.ends_with(&format!("/{expected}")), "frame {i}: {f}, expected {expected}");
        compared += 1;
    }
    compared
}

/// gdb's `bt` at the first stop at `function`: the `FILE:LINE` of each frame of the program's
/// own (None when gdb is not installed).
fn gdb_places(program: &Path, function: &str, args: &[&str]) -> Option<Vec<String>> {
    let out = Command::new("gdb")
        .args(["-nx", "-batch", "-iex", "set debuginfod enabled off", "-ex", "set pagination off"])
        .args(["-ex", &format!("break {function}"), "-ex", "run", "-ex", "bt", "-ex", "kill", "--args"])
        .arg(program)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let places = text
        .lines()
        .filter(|l| l.starts_with('#') && l.contains(" at ") && l.contains("stacks.c:"))
        .map(|l| l.rsplit_once(" at ").unwrap().1.to_string())
        .collect();
    Some(places)
}

/// The build-ID debug file of the module at `path`, if installed (Debian's libc6-dbg).
fn debug_file(path: &Path) -> Option<PathBuf> {
    let out = Command::new("readelf").arg("-n").arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let id = text.lines().find_map(|l| l.trim().strip_prefix("Build ID: "))?.trim().to_string();
    Some(PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]))).filter(|p| p.exists())
}

/// The libc the fixture runs with.
fn libc_of(run_maps_of: &Path) -> PathBuf {
    let out = Command::new("ldd").arg(run_maps_of).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("libc.so.6 => ")).unwrap();
    PathBuf::from(line.split(" => ").nth(1).unwrap().split(" (").next().unwrap())
}

#[test]
fn frames_carry_their_source_lines_as_addr2line_and_gdb_give_them() {
    let p = stacks();
    let run = count(&p, &[&format!("p:leaf {}:leaf", p.display())], "ustack", &["chain", "1", "0"]);
    let stacks = whole_stacks(&run.output, "leaf", &run.stderr);
    let stack = stacks.keys().next().unwrap();
    // The program's own frames, leaf to main, each with a place in the fixture's source.
    assert_eq!(places_as(stack, "stacks", &p, addr2line), 9, "{stack:#?}");
    let ours: Vec<&str> = stack[..9].iter().map(|f| parts(f).2.unwrap()).collect();
    assert!(ours.iter().all(|p| p.contains("/tests/fixtures/stacks.c:")), "{ours:?}");
    if let Some(gdb) = gdb_places(&p, "leaf", &["chain", "1", "0"]) {
        assert_eq!(gdb.len(), 9, "{gdb:?}");
        for (ours, gdb) in ours.iter().zip(&gdb) {
            assert!(ours == gdb || ours.ends_with(&format!("/{gdb}")), "ours {ours}, gdb {gdb}");
        }
    } else {
        eprintln!("gdb is not installed: the comparison with gdb's bt is skipped");
    }
    // glibc's frames, named and placed from its debug file where it is installed.
    let libc = libc_of(&p);
    match debug_file(&libc) {
        Some(debug) => {
            // __libc_start_call_main is not exported: named from the debug file's symbols.
            let below: Vec<String> = stack[9..].iter().map(|f| function(f)).collect();
            assert_eq!(strs(&below), ["__libc_start_call_main", "__libc_start_main", "_start"]);
            // binutils' addr2line names the wrong file for glibc's inlined code: gdb's word.
            if Command::new("gdb").arg("--version").output().is_ok() {
                assert_eq!(places_as(stack, "libc.so.6", &debug, gdb_line), 2, "{stack:#?}");
            } else {
                assert!(stack[9..11]
                    .iter()
                    .all(|f| parts(f).2.is_some_and(|p| p.contains(".c:") || p.contains(".h:"))));
            }
        }
        None => println!("SKIPPED (glibc's part): no debug file of {} (Debian: libc6-dbg)", libc.display()),
    }
}

#[test]
fn a_stripped_programs_frames_are_file_plus_offset_without_lines() {
    let p = stacks();
    let stripped = p.with_file_name("stacks_stripped");
    let status = Command::new("strip").arg("-o").arg(&stripped).arg(&p).status().expect("strip");
    assert!(status.success());
    let data = std::fs::read(&p).unwrap();
    let offset = |name: &str| uprobe_contracts::elf::function(&data, name).unwrap().file_offset;
    let def = format!("p:leaf {}:{:#x}", stripped.display(), offset("leaf"));
    let run = count(&stripped, &[&def], "ustack", &["chain", "1", "0"]);
    let stacks = whole_stacks(&run.output, "leaf", &run.stderr);
    let stack = stacks.keys().next().unwrap();
    assert_eq!(stack[0], format!("stacks_stripped+{:#x}", offset("leaf")), "{stack:#?}");
    assert_eq!(stack[1], format!("stacks_stripped+{:#x}", offset("f6") + 5), "{stack:#?}");
    let own = stack.iter().filter(|f| f.starts_with("stacks_stripped+0x")).count();
    assert_eq!(own, 10, "leaf to main, and _start: {stack:#?}");
}

#[test]
fn a_thread_waiting_in_a_relocated_syscall_is_shown_in_the_probed_function() {
    let p = stacks();
    // The probe on blocker's syscall instruction: the thread waits in the runtime's copy of
    // it (a jump probe's stub, or the out-of-line slot of an int3) when SIGALRM comes.
    let dis = Command::new("objdump").args(["-d", "--no-show-raw-insn"]).arg(&p).output().expect("objdump");
    let dis = String::from_utf8_lossy(&dis.stdout);
    let body = &dis[dis.find("<blocker>:").unwrap()..];
    let line = body.lines().find(|l| l.trim_end().ends_with("syscall")).unwrap();
    let at = u64::from_str_radix(line.trim().split(':').next().unwrap(), 16).unwrap();
    let off = at - address_of(&p, "blocker");
    let leaf = format!("p:leaf {}:leaf", p.display());
    let sys = format!("p:sys {}:blocker+{off:#x}", p.display());
    let run = count(&p, &[&leaf, &sys], "ustack", &["blocked"]);
    let got = whole_stacks(&run.output, "leaf", &run.stderr);
    assert_eq!(got.values().copied().collect::<Vec<_>>(), [1]);
    let stack = got.keys().next().unwrap();
    let names: Vec<String> = stack.iter().map(|f| function(f)).collect();
    assert_eq!(strs(&names[..2]), ["leaf", "on_alarm"], "{stack:#?}");
    assert!(names[2].starts_with("libc.so.6+0x") || names[2] == "__restore_rt", "{stack:#?}");
    // Interrupted just past the syscall, as it would be in the function itself.
    assert_eq!(parts(&stack[3]).0, "blocker", "{stack:#?}");
    assert_eq!(parts(&stack[3]).1, off + 2, "{stack:#?}");
    assert_eq!(names[4], "main", "{stack:#?}");
    ends_at_start(&names);
    same_as_gdb(&names, &p, "leaf", &["blocked"]);
}

/// Attaches `uprobe-run --pid PID -o FILE ARGS` to the fixture held at its gate (`gated 2 1`),
/// lets it run its calls and end, and gives what the session wrote (`name`: the file's).
fn attach_gated(p: &Path, name: &str, args: &[&str]) -> String {
    let mut target = Target::start(p, &["gated", "2", "1"]);
    let out = tempfile(name);
    let mut all = vec!["-o", out.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut session = Session::start(target.pid, &all);
    target.send("go");
    target.out.expect("done");
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0), "the fixture");
    let (status, _) = session.wait();
    assert!(status.success(), "{:?}", session.own_lines());
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    text
}

#[test]
fn stacks_of_an_attach_equal_a_launchs() {
    need_ptrace!();
    let p = stacks();
    let def = format!("p:leaf {}:leaf", p.display());
    let launched = count(&p, &[&def], "ustack", &["chain", "2", "1"]);
    let launched = whole_stacks(&launched.output, "leaf", &launched.stderr);

    let text = attach_gated(&p, "stacks-attach", &["--count", "--by", "ustack", "-e", &def]);
    let attached = whole_stacks(&text, "leaf", "");
    // The same stacks, frame for frame up to main (whose call sites differ), with places.
    let upto_main = |all: &BTreeMap<Vec<String>, u64>| -> BTreeMap<Vec<String>, u64> {
        all.iter().map(|(s, n)| (s[..8].to_vec(), *n)).collect()
    };
    assert_eq!(upto_main(&attached), upto_main(&launched), "{text}");
    assert_eq!(attached.values().copied().collect::<Vec<_>>().iter().sum::<u64>(), 3);
    for stack in attached.keys() {
        assert!(stack[..8].iter().all(|f| f.contains(" (stacks) at ") && f.contains("stacks.c:")), "{stack:#?}");
        let names: Vec<String> = stack.iter().map(|f| function(f)).collect();
        assert_eq!(names[8], "main");
        ends_at_start(&names);
    }
}

/// The keys of a split report's section `title`: each key (a stack's function names, or the
/// key's text) with its line after `]: ` or `]: ` and its bucket lines.
fn split_keys(text: &str, title: &str) -> BTreeMap<Vec<String>, (String, Vec<String>)> {
    let mut out = BTreeMap::new();
    let mut lines = text.lines().skip_while(|l| !l.starts_with(title));
    lines.next().unwrap_or_else(|| panic!("no {title}:\n{text}"));
    let (mut key, mut head, mut buckets) = (Vec::new(), String::new(), Vec::new());
    for line in lines {
        if line == "@[" {
            key.clear();
        } else if let Some(frame) = line.strip_prefix("    ") {
            key.push(function(frame));
        } else if let Some(rest) = line.strip_prefix("]: ") {
            head = rest.to_string();
        } else if let Some((k, rest)) = line.strip_prefix("@[").and_then(|l| l.split_once("]: ")) {
            key = vec![k.to_string()];
            head = rest.to_string();
        } else if line.starts_with('[') || line.starts_with('(') && line.contains('|') {
            buckets.push(line.split(" |").next().unwrap().split_whitespace().collect::<Vec<_>>().join(" "));
        } else if line.is_empty() && !key.is_empty() {
            out.insert(std::mem::take(&mut key), (std::mem::take(&mut head), std::mem::take(&mut buckets)));
        } else {
            break;
        }
    }
    if !key.is_empty() {
        out.insert(key, (head, buckets));
    }
    out
}

fn run_ok(args: &[&str]) -> Run {
    let run = run_uprobe(args);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    assert_eq!(run.stdout, "done\n");
    run
}

#[test]
fn histograms_split_by_stack_count_each_paths_values_exactly() {
    let p = stacks();
    let def = format!("p:leaf {}:leaf n=%di:s32", p.display());
    let prog = p.to_str().unwrap();
    let run = run_ok(&["-e", &def, "--hist", "leaf.n", "--by", "ustack:9", prog, "chain", "3", "5"]);
    let got = split_keys(&run.output, "hist leaf.n by ustack:9: 8 values, 2 keys");
    let chain = ["leaf", "f6", "f5", "f4", "f3", "f2", "f1"];
    // path_a passes 0, 1, 2; path_b 0 to 4; the most values first.
    let expected = [
        ("path_b", "5 values", vec!["[0] 1", "[1] 1", "[2, 4) 2", "[4, 8) 1"]),
        ("path_a", "3 values", vec!["[0] 1", "[1] 1", "[2, 4) 1"]),
    ];
    assert_eq!(got.len(), 2, "{}", run.output);
    for (path, head, buckets) in expected {
        let (stack, (h, b)) = got.iter().find(|(s, _)| s[7] == path).unwrap();
        assert_eq!((strs(&stack[..7]), stack[8].as_str()), (chain.to_vec(), "main"));
        assert_eq!((h.as_str(), strs(b)), (head, buckets));
    }
    let b_first = run.output.find("path_b+").unwrap() < run.output.find("path_a+").unwrap();
    assert!(b_first, "{}", run.output);

    // A linear histogram, with the thread beside the stack, kept to the first key (--top).
    let run =
        run_ok(&["-e", &def, "--lhist", "leaf.n,0,4,2", "--by", "tid,ustack:8", "--top", "1", prog, "chain", "3", "5"]);
    assert!(run.output.contains("lhist leaf.n,0,4,2 by tid,ustack:8: 8 values, 2 keys\n@["), "{}", run.output);
    assert!(run.output.contains("]: 5 values\n[0, 2)                 2 |"), "{}", run.output);
    assert!(run.output.contains("[4, ...)               1 |"), "{}", run.output);
    assert!(run.output.ends_with("(1 more key: 3 values)\n\n"), "{}", run.output);
}

#[test]
fn timed_calls_split_by_stack_and_by_argument() {
    let p = stacks();
    let prog = p.to_str().unwrap();
    let f5 = format!("{prog}:f5");
    let run = run_ok(&["--latency", &f5, "--by", "ustack:6", "--format", "json", prog, "chain", "3", "5"]);
    let lines: Vec<serde_json::Value> = run.output.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        (lines.len(), &lines[0]["keys"], &lines[0]["count"], &lines[0]["not_split"]),
        (3, &2.into(), &8.into(), &0.into())
    );
    let mut got: Vec<(String, u64, u64)> = lines[1..]
        .iter()
        .map(|o| {
            let frames: Vec<String> =
                o["key"].as_array().unwrap().iter().map(|f| function(f.as_str().unwrap())).collect();
            assert_eq!(strs(&frames[..4]), ["f5", "f4", "f3", "f2"]);
            let in_buckets: u64 = o["buckets"].as_array().unwrap().iter().map(|b| b[2].as_u64().unwrap()).sum();
            (frames[5].clone(), o["count"].as_u64().unwrap(), in_buckets)
        })
        .collect();
    got.sort();
    assert_eq!(got, [("path_a".into(), 3, 3), ("path_b".into(), 5, 5)]);
    assert!(lines[1..].iter().all(|o| o["entered"] == o["count"] && o["min_ns"].as_u64() <= o["max_ns"].as_u64()));

    // arg1: the function's first argument at its entry (f5(n): 0, 1, 2 then 0 to 4).
    let run = run_ok(&["--latency", &f5, "--by", "arg1", prog, "chain", "3", "5"]);
    let got = split_keys(&run.output, "latency f5 by arg1: 8 calls");
    let calls: Vec<(String, String)> =
        got.iter().map(|(k, (h, _))| (k[0].clone(), h.split(',').next().unwrap().to_string())).collect();
    let expected = [("0", "2 calls"), ("1", "2 calls"), ("2", "2 calls"), ("3", "1 call"), ("4", "1 call")];
    assert_eq!(calls, expected.map(|(k, c)| (k.to_string(), c.to_string())), "{}", run.output);

    // An interval report: each key's and the whole function's min and max of that interval.
    let run = run_ok(&["--interval", "10", "--latency", &f5, "--by", "arg1", prog, "chain", "3", "5"]);
    assert!(run.output.starts_with("interval 1: "), "{}", run.output);
    let heads: Vec<&str> = run.output.lines().filter(|l| l.starts_with("latency ") || l.starts_with("@[")).collect();
    assert_eq!(heads.len(), 6, "{}", run.output);
    assert!(heads.iter().all(|h| h.contains(", total ") && !h.contains("min -")), "{}", run.output);
}

#[test]
fn a_key_a_timed_call_cannot_give_is_refused_before_the_program_starts() {
    let p = stacks();
    let prog = p.to_str().unwrap();
    let run = run_uprobe(&["--latency", &format!("{prog}:f5"), "--by", "size", prog, "chain", "1", "0"]);
    assert_eq!(run.status.code(), Some(2));
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr,
        "uprobe-run: --by 'size': --latency cannot split calls by size: a timed call's key is tid, comm, caller, \
         ustack[:DEPTH] or arg1 to arg6 (the function's arguments at its entry)\n"
    );
}

#[test]
fn timed_calls_split_by_stack_in_an_attach() {
    need_ptrace!();
    let p = stacks();
    let f5 = format!("{}:f5", p.display());
    let text = attach_gated(&p, "stacks-attach-latency", &["--latency", &f5, "--by", "ustack:6"]);
    let got = split_keys(&text, "latency f5 by ustack:6: 3 calls");
    let calls: Vec<(&str, &str)> =
        got.iter().map(|(k, (h, _))| (k[5].as_str(), h.split(',').next().unwrap())).collect();
    assert_eq!(calls, [("path_a", "2 calls"), ("path_b", "1 call")], "{text}");
    assert!(got.keys().all(|k| strs(&k[..5]) == ["f5", "f4", "f3", "f2", "f1"]), "{text}");
}
