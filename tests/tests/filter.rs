//! Predicates (`if EXPR`, `--filter`, `--latency WHERE if EXPR`): the hits a filter keeps are
//! exactly those that the same expression, applied afterwards to the unfiltered stream of
//! the same run, keeps (every operator, strings and numbers, signed and unsigned, `!`, `&&`
//! and `||` precedence); the kernel's tracefs `filter` keeps as many on the same probes; a
//! bad pointer neither passes nor harms the program; aggregations count only what passes;
//! refusals are one line and exit 2 before the program starts; `--max-events` stops the
//! stream.

use std::path::{Path, PathBuf};
use std::process::Command;

use uprobe_tests::{fixture, run_uprobe, tracefs};

fn target() -> PathBuf {
    fixture("filter", &["-O1", "-g", "-fno-inline", "-Wall", "-Wextra"])
}

const CALLS: usize = 400;

/// One `take` hit: size, delta, name (None: a fault), flags.
#[derive(Clone, Debug, PartialEq)]
struct Take {
    size: u64,
    delta: i64,
    name: Option<String>,
    flags: u64,
}

fn take_def(program: &Path, event: &str) -> String {
    format!("p:f/{event} {}:take size=%di:u64 delta=%si:s32 name=+0(%dx):string flags=%cx:u32", program.display())
}

/// The records of event `event` in a text stream.
fn records<'a>(output: &'a str, event: &str) -> Vec<&'a str> {
    let tag = format!(" {event}: (");
    output.lines().filter(|l| l.contains(&tag)).map(|l| l.split_once(") ").map_or("", |(_, a)| a)).collect()
}

fn parse_take(args: &str) -> Take {
    let field = |name: &str| -> &str {
        let at = args.find(&format!("{name}=")).unwrap_or_else(|| panic!("{name} in {args}")) + name.len() + 1;
        let rest = &args[at..];
        if let Some(q) = rest.strip_prefix('"') {
            return &q[..q.find('"').unwrap()];
        }
        rest.split(' ').next().unwrap()
    };
    let name = match field("name") {
        "(fault)" => None,
        n => Some(n.to_string()),
    };
    Take {
        size: field("size").parse().unwrap(),
        delta: field("delta").parse().unwrap(),
        name,
        flags: field("flags").parse().unwrap(),
    }
}

fn glob(p: &str, s: &str) -> bool {
    // Only the forms the cases below use: a trailing '*', a leading '*', or '?' anywhere.
    if let Some(prefix) = p.strip_suffix('*') {
        return s.starts_with(prefix);
    }
    if let Some(suffix) = p.strip_prefix('*') {
        return s.ends_with(suffix);
    }
    p.len() == s.len() && p.chars().zip(s.chars()).all(|(a, b)| a == '?' || a == b)
}

type Check = fn(&Take) -> bool;

/// Each case: an expression, and the same in Rust, applied to the unfiltered stream.
fn cases() -> Vec<(&'static str, Check)> {
    vec![
        ("size == 4950", |t| t.size == 4950),
        ("size != 4950", |t| t.size != 4950),
        ("size < 30000", |t| t.size < 30000),
        ("size <= 30000", |t| t.size <= 30000),
        ("size > 70000", |t| t.size > 70000),
        ("size >= 0x8000000000000000", |t| t.size >= 1 << 63),
        ("size & 0x100", |t| t.size & 0x100 != 0),
        ("delta < 0", |t| t.delta < 0),
        ("delta <= -500", |t| t.delta <= -500),
        ("delta > 500", |t| t.delta > 500),
        ("delta >= -1", |t| t.delta >= -1),
        ("delta == -919", |t| t.delta == -919),
        ("delta != -919", |t| t.delta != -919),
        ("flags & 3", |t| t.flags & 3 != 0),
        ("name == \"wal\"", |t| t.name.as_deref() == Some("wal")),
        ("name != 'wal'", |t| t.name.as_deref() != Some("wal")),
        ("name ~ \"main*\"", |t| t.name.as_deref().is_some_and(|n| glob("main*", n))),
        ("name ~ \"*DB\"", |t| t.name.as_deref().is_some_and(|n| glob("*DB", n))),
        ("name ~ \"te?p\"", |t| t.name.as_deref().is_some_and(|n| glob("te?p", n))),
        ("size < 50000 || delta > 0 && flags & 1", |t| t.size < 50000 || (t.delta > 0 && t.flags & 1 != 0)),
        ("(size < 50000 || delta > 0) && flags & 1", |t| (t.size < 50000 || t.delta > 0) && t.flags & 1 != 0),
        ("!size < 50000 && name == \"wal\"", |t| t.size >= 50000 && t.name.as_deref() == Some("wal")),
        ("!(size < 50000 && name == \"wal\")", |t| !(t.size < 50000 && t.name.as_deref() == Some("wal"))),
        ("comm == filter && tid != 0 && cpu >= 0", |_| true),
        ("comm ~ \"x*\"", |_| false),
    ]
}

#[test]
fn every_operator_keeps_what_the_same_test_keeps_in_the_unfiltered_stream() {
    let program = target();
    let mut args = vec!["--buffer-size".to_string(), "64M".into(), "-e".into(), take_def(&program, "all")];
    for (i, (expr, _)) in cases().iter().enumerate() {
        args.extend(["-e".into(), format!("{} if {expr}", take_def(&program, &format!("c{i}")))]);
    }
    args.extend([program.display().to_string(), CALLS.to_string(), "clean".into()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run_uprobe(&refs);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    assert_eq!(r.stdout, "done\n");
    assert!(!r.output.contains("dropped"), "{}", r.output);
    let all: Vec<Take> = records(&r.output, "all").into_iter().map(parse_take).collect();
    assert_eq!(all.len(), CALLS);
    for (i, (expr, check)) in cases().iter().enumerate() {
        let want: Vec<Take> = all.iter().filter(|t| check(t)).cloned().collect();
        let got: Vec<Take> = records(&r.output, &format!("c{i}")).into_iter().map(parse_take).collect();
        assert_eq!(got, want, "{expr}");
        let line = format!("uprobe-run: event c{i}: {CALLS} hits, {} passed its filter", want.len());
        assert!(r.output.contains(&line), "{expr}: no {line:?} in the output");
    }
    // The cases are not all trivial: most keep some hits and drop others.
    let mixed = cases().iter().filter(|(_, c)| all.iter().any(c) && !all.iter().all(c)).count();
    assert!(mixed >= 20, "{mixed}");
}

#[test]
fn return_values_and_filter_options_and_events_files() {
    let program = target();
    let p = program.display().to_string();
    let file = uprobe_tests::tempfile("filter_events");
    std::fs::write(
        &file,
        format!("# return values\nr:f/neg {p}:check ret=$retval:s32 if ret < 0\n\nr:f/raw {p}:check\n"),
    )
    .unwrap();
    let r = run_uprobe(&[
        "-e",
        &format!("r:f/rets {p}:check ret=$retval:s32"),
        "--events",
        file.to_str().unwrap(),
        "--filter",
        "raw: $retval == 0xfffffffffffffffd || $retval == 3",
        "--filter",
        "f/ne*: ret != -1",
        &p,
        "70",
        "clean",
    ]);
    let _ = std::fs::remove_file(&file);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    let rets: Vec<i64> =
        records(&r.output, "rets").iter().map(|a| a.trim_start_matches("ret=").parse().unwrap()).collect();
    assert_eq!(rets, (0..70).map(|i| i % 7 - 3).collect::<Vec<i64>>());
    // `if` and --filter together: both must pass.
    let neg = records(&r.output, "neg").len();
    assert_eq!(neg, rets.iter().filter(|&&v| v < 0 && v != -1).count());
    // $retval of a definition that fetches nothing is the whole register: check()'s -3 is
    // 0x...fffd only in its low 32 bits, so only 3 matches.
    assert_eq!(records(&r.output, "raw").len(), rets.iter().filter(|&&v| v == 3).count());
    assert!(r.output.contains("uprobe-run: event raw: 70 hits, 10 passed its filter"), "{}", r.output);
}

#[test]
fn a_bad_pointer_neither_passes_nor_harms_the_program() {
    let program = target();
    let mut args = Vec::new();
    for (i, expr) in
        ["name == \"x\"", "name != \"x\"", "!(name == \"x\")", "name ~ \"*\" || size == 4096"].iter().enumerate()
    {
        args.extend(["-e".to_string(), format!("{} if {expr}", take_def(&program, &format!("b{i}")))]);
    }
    args.extend([program.display().to_string(), "3".into()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run_uprobe(&refs);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    assert_eq!(r.stdout, "done\n");
    assert!(!r.output.contains("(fault)"), "the bad pointer's hit passed a filter:\n{}", r.output);
    assert_eq!(records(&r.output, "b0").len(), 0);
    assert_eq!(records(&r.output, "b1").len(), 3);
    assert_eq!(records(&r.output, "b2").len(), 3);
    // `||` decides on its left side first: the bad pointer is read, fails, and the hit fails.
    assert_eq!(records(&r.output, "b3").len(), 3);
    assert!(r.output.contains("event b1: 4 hits, 3 passed its filter"), "{}", r.output);
}

fn count_of(output: &str, event: &str) -> u64 {
    output
        .lines()
        .find_map(|l| l.strip_prefix(event).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no count of {event} in:\n{output}"))
}

#[test]
fn aggregations_count_and_time_only_what_passes() {
    let program = target();
    let p = program.display().to_string();
    let whole = take_def(&program, "whole");
    let big = format!("{} if size >= 50000", take_def(&program, "big"));
    let r = run_uprobe(&[
        "-e",
        &whole,
        "-e",
        &big,
        "--count",
        "--hist",
        "big.size",
        "--latency",
        &format!("{p}:check if comm == nobody"),
        "--latency",
        &format!("{p}:take if tid > 0"),
        &p,
        &CALLS.to_string(),
        "clean",
    ]);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    // The same run's values, recorded.
    let s = run_uprobe(&["-e", &whole, &p, &CALLS.to_string(), "clean"]);
    let all: Vec<Take> = records(&s.output, "whole").into_iter().map(parse_take).collect();
    let want = all.iter().filter(|t| t.size >= 50000).count() as u64;
    assert_eq!(count_of(&r.output, "whole "), CALLS as u64);
    assert_eq!(count_of(&r.output, "big "), want);
    assert!(r.output.contains(&format!("hist big.size: {want} values")), "{}", r.output);
    assert!(r.output.contains(&format!("filter big: {CALLS} hits, {want} passed")), "{}", r.output);
    assert!(r.output.contains("latency check: 0 calls"), "{}", r.output);
    assert!(r.output.contains(&format!("filter check__return: {CALLS} hits, 0 passed")), "{}", r.output);
    assert!(r.output.contains(&format!("latency take: {CALLS} calls")), "{}", r.output);
}

#[test]
fn bad_filters_are_one_line_and_exit_2_before_the_program_starts() {
    let program = target();
    let p = program.display().to_string();
    let def = take_def(&program, "t");
    let refused = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend([p.as_str(), "3"]);
        let r = run_uprobe(&all);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}{}", r.stderr, r.output);
        assert_eq!(r.stdout, "", "the program ran");
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        r.stderr
    };
    let col = def.len() + 5;
    let e = refused(&["-e", &format!("{def} if sise > 1")]);
    assert!(
        e.contains(&format!(
            "at column {col}: expected a field of this event, not sise (its fields: size, delta, name, flags"
        )),
        "{e}"
    );
    let e = refused(&["-e", &format!("{def} if name < \"a\"")]);
    assert!(
        e.ends_with(&format!("at column {}: expected ==, != or ~ for name, a string (< compares numbers)\n", col + 5)),
        "{e}"
    );
    let e = refused(&["-e", &def, "--filter", "t: size ~ \"4*\""]);
    assert!(e.contains("--filter 't: size ~ \"4*\"' on -e"), "{e}");
    assert!(
        e.ends_with(
            "at column 9: expected ==, !=, <, <=, >, >= or & for size, a number (u64): ~ is a glob on strings\n"
        ),
        "{e}"
    );
    let e = refused(&["-e", &format!("r:f/r {p}:check ret=$retval:s32"), "--filter", "r: size > 3"]);
    assert!(e.contains("expected a field of this event, not size (its fields: ret, $retval, comm"), "{e}");
    let e = refused(&["-e", &format!("{def} if $retval > 3")]);
    assert!(e.contains("$retval is only at a return (r: or %return)"), "{e}");
    let e = refused(&["-e", &def, "--filter", "nosuch: tid == 1"]);
    assert_eq!(e, "uprobe-run: --filter 'nosuch: tid == 1': no event named nosuch (events: t)\n");
    let e = refused(&["-e", &def, "--filter", "size > 1"]);
    assert_eq!(e, "uprobe-run: --filter 'size > 1': expected EVENT: EXPR\n");
    // A constant the field's own type cannot hold could never compare true: refused by its range.
    let e = refused(&["-e", &format!("{def} if delta == 3000000000")]);
    assert!(
        e.ends_with(&format!(
            "at column {}: expected a signed 32-bit number (-2147483648 to 2147483647) for delta (s32), not 3000000000\n",
            col + 9
        )),
        "{e}"
    );
    let e = refused(&["-e", &format!("p:f/u {p}:take size=%di:u8 if size == 256")]);
    assert!(e.ends_with("expected an unsigned 8-bit number (0 to 255) for size (u8), not 256\n"), "{e}");
    let e = refused(&["-e", &def, "--filter", "t: tid == 99999999999"]);
    assert!(
        e.ends_with(
            "at column 11: expected a signed 32-bit number (-2147483648 to 2147483647) for tid (s32), not 99999999999\n"
        ),
        "{e}"
    );
    let e = refused(&["-e", &def, "--filter", "t: cpu == -1"]);
    assert!(
        e.ends_with("at column 11: expected an unsigned 32-bit number (0 to 4294967295) for cpu (u32), not -1\n"),
        "{e}"
    );
}

#[test]
fn max_events_stops_the_stream_and_says_so() {
    let program = target();
    let r =
        run_uprobe(&["-e", &take_def(&program, "t"), "--max-events", "25", program.to_str().unwrap(), "100", "clean"]);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    assert_eq!(records(&r.output, "t").len(), 25);
    assert!(
        r.output
            .contains("uprobe-run: --max-events 25: recording stopped after 25 records; 75 later hits not recorded"),
        "{}",
        r.output
    );
}

/// The kernel's tracefs, with the same definitions and filters, on a copy of the program.
#[test]
fn the_kernels_filter_keeps_as_many_hits() {
    let root = match tracefs() {
        Ok(r) => r,
        Err(why) => {
            println!("SKIPPED: kernel filter parity: {why}");
            return;
        }
    };
    let program = target();
    let copy = uprobe_tests::tempfile("filter_kernel");
    uprobe_tests::copy_program(&program, &copy);
    let group = format!("uprf{}", std::process::id());
    let offset = uprobe_tests::nm_address(&program, "take");
    let kernel_def = |event: &str, path: &Path| {
        format!(
            "p:{group}/{event} {}:{offset:#x} size=%di:u64 delta=%si:s32 name=+0(%dx):string flags=%cx:u32",
            path.display()
        )
    };
    let append = |file: &Path, text: &str| -> std::io::Result<()> {
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(file)?.write_all(format!("{text}\n").as_bytes())
    };
    let exprs: Vec<&str> =
        cases().iter().map(|(e, _)| *e).filter(|e| !e.contains("tid") && !e.contains("cpu")).collect();
    let mut written = Vec::new();
    let mut kernel_counts = Vec::new();
    let result = (|| -> Result<Result<(), String>, String> {
        for (i, expr) in exprs.iter().enumerate() {
            let event = format!("k{i}");
            append(&root.join("uprobe_events"), &kernel_def(&event, &copy))
                .map_err(|e| format!("uprobe_events: {e}"))?;
            written.push(event.clone());
            let dir = root.join("events").join(&group).join(&event);
            append(&dir.join("filter"), expr).map_err(|e| format!("the kernel refused filter {expr:?}: {e}"))?;
        }
        append(&root.join("events").join(&group).join("enable"), "1").map_err(|e| e.to_string())?;
        std::fs::write(root.join("trace"), "").map_err(|e| e.to_string())?;
        let out = Command::new(&copy).args([CALLS.to_string(), "clean".into()]).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            // Not a skip: the events are removed below, then this fails the test.
            return Ok(Err(format!("the fixture failed under the kernel's probes: {}", out.status)));
        }
        let trace = std::fs::read_to_string(root.join("trace")).map_err(|e| e.to_string())?;
        for i in 0..exprs.len() {
            kernel_counts.push(records(&trace, &format!("k{i}")).len());
        }
        Ok(Ok(()))
    })();
    let _ = append(&root.join("events").join(&group).join("enable"), "0");
    for event in &written {
        let _ = append(&root.join("uprobe_events"), &format!("-:{group}/{event}"));
    }
    let _ = std::fs::remove_file(&copy);
    match result {
        Err(why) => {
            println!("SKIPPED: kernel filter parity: {why}");
            return;
        }
        Ok(Err(failure)) => panic!("{failure}"),
        Ok(Ok(())) => {}
    }
    if kernel_counts.iter().all(|&n| n == 0) {
        println!("SKIPPED: kernel filter parity: the kernel's uprobes recorded nothing on this machine");
        return;
    }
    let mut args = vec!["--buffer-size".to_string(), "64M".into()];
    for (i, expr) in exprs.iter().enumerate() {
        args.extend(["-e".into(), format!("{} if {expr}", take_def(&program, &format!("k{i}")))]);
    }
    args.extend([program.display().to_string(), CALLS.to_string(), "clean".into()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run_uprobe(&refs);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    for (i, expr) in exprs.iter().enumerate() {
        assert_eq!(records(&r.output, &format!("k{i}")).len(), kernel_counts[i], "{expr}");
    }
    println!("kernel filter parity: {} filters, hits kept {kernel_counts:?}", exprs.len());
}

#[test]
fn triggers_switch_events_on_and_off() {
    let program = target();
    let p = program.display().to_string();
    let on = format!("p:f/on {p}:check i=%di:s32 if i == 10");
    let off = format!("p:f/off {p}:check i=%di:s32 if i == 20");
    let def = take_def(&program, "t");
    let stream = run_uprobe(&["-e", &def, "-e", &on, "-e", &off, &p, "40", "clean"]);
    let all: Vec<Take> = records(&stream.output, "t").into_iter().map(parse_take).collect();
    assert_eq!(all.len(), 40);
    // take(i) runs before check(i): check(10) switches t on for take(11) to take(20).
    let want: Vec<Take> = all[11..=20].to_vec();
    let triggered = ["--trigger", "on:enable=t", "--trigger", "f/off:disable=t"];
    let mut args = vec!["-e", &def, "-e", &on, "-e", &off];
    args.extend(triggered);
    args.extend([p.as_str(), "40", "clean"]);
    let r = run_uprobe(&args);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    let got: Vec<Take> = records(&r.output, "t").into_iter().map(parse_take).collect();
    assert_eq!(got, want);
    assert_eq!((records(&r.output, "on").len(), records(&r.output, "off").len()), (1, 1));
    // The same in a count, with a filter on the switched event too.
    let big = format!("{def} if size >= 50000");
    let mut args = vec!["-e", &big, "-e", &on, "-e", &off, "--count"];
    args.extend(triggered);
    args.extend([p.as_str(), "40", "clean"]);
    let c = run_uprobe(&args);
    assert!(c.status.success(), "{}{}", c.stderr, c.output);
    let n = want.iter().filter(|t| t.size >= 50000).count();
    assert_eq!(count_of(&c.output, "t "), n as u64, "{}", c.output);
    assert!(c.output.contains(&format!("filter t: 10 hits, {n} passed")), "{}", c.output);
    let e = run_uprobe(&["-e", &def, "--trigger", "t:enable=nosuch", &p, "3"]);
    assert_eq!(e.status.code(), Some(2));
    assert_eq!(e.stdout, "");
    assert_eq!(e.stderr, "uprobe-run: --trigger 't:enable=nosuch': no event named nosuch (events: t)\n");
    // An event only its own hits enable would start off and never be hit; an empty name.
    for (trigger, said) in [
        (
            "t:enable=t",
            "only t itself enables t, which then starts off and is never hit (an event some trigger enables waits \
             for another event to enable it)",
        ),
        ("t:enable=", "expected an event name after enable="),
    ] {
        let e = run_uprobe(&["-e", &def, "--trigger", trigger, &p, "3"]);
        assert_eq!(e.status.code(), Some(2));
        assert_eq!(e.stdout, "");
        assert_eq!(e.stderr, format!("uprobe-run: --trigger '{trigger}': {said}\n"));
    }
}
