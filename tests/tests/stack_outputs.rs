//! Stacks as profiles people already read: `--format folded` (stackcollapse's lines),
//! `--flamegraph FILE.svg` and `--pprof FILE` (pprof's gzipped `profile.proto`), on the fixture of `stacks.rs` (`-O2 -fomit-frame-pointer`, known
//! call chains), with exact counts.

use std::path::PathBuf;

use uprobe_contracts::pprof::{self, Profile, ValueType};
use uprobe_tests::{gcc, run_uprobe, tempfile, Run};

const FLAGS: &[&str] = &["-O2", "-g", "-fomit-frame-pointer", "-Wall", "-Wextra", "-pthread", "-ldl"];

fn stacks() -> PathBuf {
    gcc("stacks", &["fixtures/stacks.c", "fixtures/stacks_corrupt.S"], FLAGS)
}

fn leaf(p: &std::path::Path) -> String {
    format!("p:leaf {}:leaf", p.display())
}

/// The folded lines of a run: (frames, outermost first; count).
fn folded(run: &Run) -> Vec<(Vec<String>, u64)> {
    run.output
        .lines()
        .map(|l| {
            let (stack, n) = l.rsplit_once(' ').unwrap_or_else(|| panic!("not a folded line: {l:?}"));
            (stack.split(';').map(str::to_string).collect(), n.parse().unwrap_or_else(|_| panic!("{l:?}")))
        })
        .collect()
}

/// The frames from `main` on.
fn from_main(stack: &[String]) -> Vec<&str> {
    let main = stack.iter().position(|f| f == "main").unwrap_or_else(|| panic!("no main in {stack:?}"));
    stack[main..].iter().map(String::as_str).collect()
}

#[test]
fn folded_lines_give_each_stack_outermost_first_with_its_exact_count() {
    let p = stacks();
    let run = run_uprobe(&[
        "-e",
        &leaf(&p),
        "--count",
        "--by",
        "ustack",
        "--format",
        "folded",
        p.to_str().unwrap(),
        "chain",
        "3",
        "5",
    ]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    assert_eq!(run.stdout, "done\n");
    let lines = folded(&run);
    assert_eq!(lines.len(), 2, "{}", run.output);
    // Most hits first; every line from the program's _start to the probed leaf.
    for ((stack, n), (path, count)) in lines.iter().zip([("path_b", 5), ("path_a", 3)]) {
        assert_eq!(*n, count, "{}", run.output);
        assert_eq!(stack[0], "_start", "{}", run.output);
        assert_eq!(from_main(stack), ["main", path, "f1", "f2", "f3", "f4", "f5", "f6", "leaf"]);
    }

    // Other key parts come first, as the outermost frames; the depth cuts from the leaf.
    let run = run_uprobe(&[
        "-e",
        &leaf(&p),
        "--count",
        "--by",
        "tid,ustack:3",
        "--format",
        "folded",
        p.to_str().unwrap(),
        "chain",
        "2",
        "4",
    ]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    let lines = folded(&run);
    assert_eq!(lines.len(), 1, "{}", run.output);
    let (stack, n) = &lines[0];
    assert_eq!(*n, 6);
    assert!(stack[0].parse::<u32>().is_ok(), "a thread id first: {stack:?}");
    assert_eq!(&stack[1..], ["f5", "f6", "leaf"]);
}

#[test]
fn a_flamegraph_is_drawn_with_every_frame_named() {
    let p = stacks();
    let svg = tempfile("flame").with_extension("svg");
    let run = run_uprobe(&[
        "-e",
        &leaf(&p),
        "--count",
        "--by",
        "ustack",
        "--flamegraph",
        svg.to_str().unwrap(),
        p.to_str().unwrap(),
        "chain",
        "3",
        "5",
    ]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    // The text report as without it.
    assert!(run.output.contains("count leaf by ustack: 8 hits, 2 keys\n"), "{}", run.output);
    let text = std::fs::read_to_string(&svg).unwrap_or_else(|e| panic!("{}: {e}\n{}", svg.display(), run.stderr));
    let _ = std::fs::remove_file(&svg);
    assert!(text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"), "{text}");
    // Each frame is a box titled `NAME (N hits, P%)`, as flamegraph.pl titles them.
    // The two paths part at main: the chain's frames are drawn once on each.
    for (frame, hits) in [("_start", 8), ("main", 8), ("path_a", 3), ("path_b", 5)] {
        assert_eq!(text.matches(&format!("<title>{frame} (")).count(), 1, "{frame}");
        assert!(text.contains(&format!("<title>{frame} ({hits} hits, ")), "{frame} ({hits} hits) not drawn");
    }
    for frame in ["f1", "f2", "f3", "f4", "f5", "f6", "leaf"] {
        for hits in [3, 5] {
            assert!(text.contains(&format!("<title>{frame} ({hits} hits, ")), "{frame} ({hits} hits) not drawn");
        }
        assert_eq!(text.matches(&format!("<title>{frame} (")).count(), 2, "{frame}");
    }
}

/// The profile in the gzipped pprof file at `path`.
fn read_pprof(path: &std::path::Path) -> Profile {
    use std::io::Read;
    let gz = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut bytes).expect("gzip");
    pprof::decode(&bytes).expect("a profile")
}

/// The file offset of symbol `name`'s address in the ELF file `path`, and its build ID.
fn elf_facts(path: &std::path::Path, name: &str) -> (u64, String) {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let addr = file.symbols().find(|s| s.name() == Ok(name)).unwrap().address();
    let seg = file.segments().find(|s| s.address() <= addr && addr < s.address() + s.size()).unwrap();
    let id = file.build_id().unwrap().unwrap().iter().map(|b| format!("{b:02x}")).collect();
    (addr - seg.address() + seg.file_range().0, id)
}

#[test]
fn a_pprof_profile_has_each_stack_with_its_count_addresses_mappings_and_lines() {
    let p = stacks();
    let file = tempfile("profile").with_extension("pb.gz");
    let run = run_uprobe(&[
        "-e",
        &leaf(&p),
        "--count",
        "--by",
        "ustack",
        "--pprof",
        file.to_str().unwrap(),
        p.to_str().unwrap(),
        "chain",
        "3",
        "5",
    ]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    // The text report as without it.
    assert!(run.output.contains("count leaf by ustack: 8 hits, 2 keys\n"), "{}", run.output);
    let profile = read_pprof(&file);
    let _ = std::fs::remove_file(&file);
    assert_eq!(profile.sample_types, [ValueType { kind: "hits".into(), unit: "count".into() }]);
    assert_eq!(profile.samples.len(), 2, "{profile:?}");
    let mut samples: Vec<(Vec<&str>, i64)> = (0..2).map(|i| (profile.stack(i), profile.samples[i].values[0])).collect();
    samples.sort_by_key(|s| s.1);
    let src = std::fs::canonicalize("fixtures/stacks.c").unwrap();
    let (leaf_offset, build_id) = elf_facts(&p, "leaf");
    for ((stack, count), (path, hits, path_line, main_line)) in
        samples.iter().zip([("path_a", 3, 38, 94), ("path_b", 5, 39, 95)])
    {
        assert_eq!(*count, hits);
        assert_eq!(stack[..9], chain(path), "{stack:?}");
        assert_eq!(stack.last(), Some(&"_start"), "{stack:?}");
        let sample = profile.samples.iter().find(|s| s.values == [hits]).unwrap();
        // The program's frames: a line each, in the fixture's source, in its mapping.
        let lines = [28, 32, 33, 34, 35, 36, 37, path_line, main_line];
        for (&loc, line) in sample.locations.iter().zip(lines) {
            let loc = &profile.locations[loc as usize - 1];
            let function = &profile.functions[loc.lines[0].function as usize - 1];
            assert_eq!((function.file.as_str(), loc.lines[0].line), (src.to_str().unwrap(), line), "{function:?}");
            let m = &profile.mappings[loc.mapping as usize - 1];
            assert_eq!(m.file, p.to_str().unwrap());
            assert_eq!(m.build_id, build_id);
            assert!(m.start <= loc.address && loc.address < m.limit && m.has_functions && m.has_line_numbers);
        }
        // The leaf's address is the function's, at its file offset in the program.
        let leaf = &profile.locations[sample.locations[0] as usize - 1];
        let m = &profile.mappings[leaf.mapping as usize - 1];
        assert_eq!(leaf.address - m.start + m.offset, leaf_offset);
    }

    // Other key parts are labels; several stacked events are told apart by a label.
    let run = run_uprobe(&[
        "-e",
        &leaf(&p),
        "-e",
        &format!("p:f6 {}:f6", p.display()),
        "--count",
        "--by",
        "tid,ustack:3",
        "--pprof",
        file.to_str().unwrap(),
        p.to_str().unwrap(),
        "chain",
        "2",
        "4",
    ]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    let profile = read_pprof(&file);
    let _ = std::fs::remove_file(&file);
    let mut got: Vec<(Vec<&str>, i64, Vec<&str>)> = (0..profile.samples.len())
        .map(|i| {
            let s = &profile.samples[i];
            (profile.stack(i), s.values[0], s.labels.iter().map(|(k, _)| k.as_str()).collect())
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [(vec!["f6", "f5", "f4"], 6, vec!["event", "tid"]), (vec!["leaf", "f6", "f5"], 6, vec!["event", "tid"]),]
    );
    let labels = &profile.samples[0].labels;
    assert!(labels[1].1.parse::<u32>().is_ok(), "a thread id: {labels:?}");
}

#[test]
fn folded_stacks_and_flamegraphs_need_a_stack_key() {
    let p = stacks();
    let def = leaf(&p);
    let svg = tempfile("flame").with_extension("svg");
    let cases: [(&[&str], &str); 9] = [
        (
            &["--count", "--format", "folded"],
            "--format folded: folds the stacks of --count --by ustack or of --latency --by ustack",
        ),
        (
            &["--count", "--by", "tid", "--format", "folded"],
            "--format folded: no key of --by is a stack (ustack[:DEPTH], or an argument $ustack)",
        ),
        (
            &["--format", "folded"],
            "--format folded: folds the stacks of --count --by ustack or of --latency --by ustack",
        ),
        (
            &["--count", "--by", "ustack", "--hist", "leaf.x", "--format", "folded"],
            "--format folded: histograms have no stacks to fold",
        ),
        (&["--count", "--flamegraph", svg.to_str().unwrap()], "--flamegraph: draws the stacks of --count --by ustack"),
        (
            &["--count", "--by", "tid", "--flamegraph", svg.to_str().unwrap()],
            "--flamegraph: no key of --by is a stack (ustack[:DEPTH], or an argument $ustack)",
        ),
        (&["--count", "--pprof", svg.to_str().unwrap()], "--pprof: writes the stacks of --count --by ustack"),
        (
            &["--count", "--by", "tid", "--pprof", svg.to_str().unwrap()],
            "--pprof: no key of --by is a stack (ustack[:DEPTH], or an argument $ustack)",
        ),
        (
            &["--count", "--by", "ustack", "--latency", "leaf", "--pprof", svg.to_str().unwrap()],
            "--pprof: writes the stacks of counted hits, not of timed calls (--latency)",
        ),
    ];
    for (args, line) in cases {
        let mut all = vec!["-e", def.as_str()];
        all.extend_from_slice(args);
        all.extend([p.to_str().unwrap(), "chain", "1", "0"]);
        let run = run_uprobe(&all);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "the program did not start");
        assert_eq!(run.stderr, format!("uprobe-run: {line}\n"), "{args:?}");
    }
    assert!(!svg.exists());
}

/// `name+0xoff` -> `name`.
fn function(frame: &str) -> &str {
    frame.rsplit_once("+0x").map_or(frame, |(name, _)| name)
}

/// The chain from the leaf to `main` of a hit through `path`.
fn chain(path: &str) -> Vec<&str> {
    vec!["leaf", "f6", "f5", "f4", "f3", "f2", "f1", path, "main"]
}

#[test]
fn events_carry_their_stack_as_perf_script_prints_call_chains() {
    let p = stacks();
    let def = format!("p:leaf {}:leaf n=%di:s32 st=$ustack", p.display());
    let run = run_uprobe(&["-e", &def, p.to_str().unwrap(), "chain", "1", "1"]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    // Two records, each a line, its frames `\t    ADDR NAME`, and a blank line.
    let records: Vec<&str> = run.output.split_terminator("\n\n").collect();
    assert_eq!(records.len(), 2, "{}", run.output);
    for (record, path) in records.iter().zip(["path_a", "path_b"]) {
        let mut lines = record.lines();
        let head = lines.next().unwrap();
        assert!(head.ends_with(": leaf: (leaf+0x0) n=0"), "{head}");
        let frames: Vec<(u64, &str)> = lines
            .map(|l| {
                let (addr, name) = l.strip_prefix("\t    ").and_then(|f| f.split_once(' ')).expect(l);
                (u64::from_str_radix(addr, 16).expect(l), name)
            })
            .collect();
        let names: Vec<&str> = frames.iter().map(|(_, n)| function(n)).collect();
        assert_eq!(names[..9], chain(path), "{record}");
        assert_eq!(names.last(), Some(&"_start"), "{record}");
        assert_eq!(frames[0].1, "leaf+0x0");
    }

    // A depth; a depth over 127 is refused before the program starts.
    let five = format!("p:leaf {}:leaf $ustack:5", p.display());
    let run = run_uprobe(&["-e", &five, p.to_str().unwrap(), "chain", "1", "0"]);
    let frames: Vec<&str> = run.output.lines().skip(1).take_while(|l| !l.is_empty()).collect();
    assert_eq!(frames.len(), 5, "{}", run.output);
    let over = format!("p:leaf {}:leaf $ustack:128", p.display());
    let run = run_uprobe(&["-e", &over, p.to_str().unwrap(), "chain", "1", "0"]);
    assert_eq!(run.status.code(), Some(2));
    assert!(run.stdout.is_empty(), "the program did not start");
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.ends_with("expected a depth from 1 to 127 after $ustack:, not \"128\"\n"), "{}", run.stderr);
}

#[test]
fn call_graph_stacks_come_as_json_arrays_and_chrome_stack_frames() {
    let p = stacks();
    let def = format!("p:leaf {}:leaf", p.display());
    let run = run_uprobe(&["-g", "-e", &def, "--format", "json", p.to_str().unwrap(), "chain", "0", "2"]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    let lines: Vec<serde_json::Value> = run.output.lines().map(|l| serde_json::from_str(l).expect(l)).collect();
    assert_eq!(lines.len(), 2, "{}", run.output);
    for v in &lines {
        let frames: Vec<&str> = v["args"]["ustack"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        assert_eq!(frames.iter().map(|f| function(f)).take(9).collect::<Vec<_>>(), chain("path_b"));
    }

    let run =
        run_uprobe(&["-e", &format!("{def} $ustack"), "--format", "chrome", p.to_str().unwrap(), "chain", "1", "1"]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    let trace: serde_json::Value = serde_json::from_str(&run.output).expect(&run.output);
    let frames = &trace["stackFrames"];
    let hits: Vec<&serde_json::Value> =
        trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == "leaf").collect();
    assert_eq!(hits.len(), 2);
    for (hit, path) in hits.iter().zip(["path_a", "path_b"]) {
        // The event's stack: its frame, then each parent's.
        let mut names = Vec::new();
        let mut id = hit["sf"].as_str().expect("an sf").to_string();
        loop {
            let f = &frames[&id];
            names.push(function(f["name"].as_str().unwrap()).to_string());
            match f["parent"].as_str() {
                Some(parent) => id = parent.to_string(),
                None => break,
            }
        }
        assert_eq!(names.iter().map(String::as_str).take(9).collect::<Vec<_>>(), chain(path));
        assert_eq!(names.last().map(String::as_str), Some("_start"));
    }
}

#[test]
fn a_stack_fetcharg_counts_as_a_stack_key() {
    let p = stacks();
    let def = format!("p:leaf {}:leaf st=$ustack:3", p.display());
    let run = run_uprobe(&[
        "-e",
        &def,
        "--count",
        "--by",
        "st",
        "--format",
        "folded",
        p.to_str().unwrap(),
        "chain",
        "1",
        "2",
    ]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    assert_eq!(run.output, "f5;f6;leaf 3\n");
    let run = run_uprobe(&["-e", &def, "--hist", "leaf.st", p.to_str().unwrap(), "chain", "1", "2"]);
    assert_eq!(run.status.code(), Some(2));
    assert_eq!(
        run.stderr,
        "uprobe-run: --hist 'leaf.st': argument st of event leaf is a stack: a histogram needs a number\n"
    );
}

#[test]
fn timed_calls_fold_by_stack_weighed_by_their_total_ns() {
    let p = stacks();
    let prog = p.to_str().unwrap();
    let f5 = format!("{prog}:f5");
    let run = run_uprobe(&["--latency", &f5, "--by", "ustack", "--format", "folded", prog, "chain", "3", "5"]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    assert_eq!(run.stdout, "done\n");
    let lines: Vec<(&str, u64)> =
        run.output.lines().map(|l| l.rsplit_once(' ').map(|(s, n)| (s, n.parse().unwrap())).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{}", run.output);
    for path in ["path_a", "path_b"] {
        let (stack, ns) = lines.iter().find(|(s, _)| s.contains(path)).unwrap();
        assert!(stack.ends_with(&format!(";main;{path};f1;f2;f3;f4;f5")), "{stack}");
        // The calls' total: some ns each, far below a second even on a loaded machine.
        assert!(*ns > 0 && *ns < 1_000_000_000, "{ns}");
    }
    let whole = run_uprobe(&["--latency", &f5, "--by", "ustack", "--format", "json", prog, "chain", "3", "5"]);
    assert!(whole.output.contains("\"keys\":2"), "{}", whole.output);
    let refused =
        run_uprobe(&["-e", &leaf(&p), "--count", "--by", "ustack", "--latency", &f5, "--format", "folded", prog]);
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        refused.stderr,
        "uprobe-run: --format folded: folds counts or timed calls (total ns), not both in one report\n"
    );
}

#[test]
fn a_file_the_end_cannot_write_is_refused_before_the_program_starts() {
    let p = stacks();
    let def = leaf(&p);
    for option in ["--flamegraph", "--pprof"] {
        let path = "/nonexistent-dir/out.file";
        let run = run_uprobe(&[
            "-e",
            &def,
            "--count",
            "--by",
            "ustack",
            option,
            path,
            p.to_str().unwrap(),
            "chain",
            "1",
            "0",
        ]);
        assert_eq!(run.status.code(), Some(2), "{option}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{option}: the program did not start: {}", run.stdout);
        assert_eq!(run.stderr, format!("uprobe-run: {path}: cannot create output file: No such file or directory\n"));
    }
}
