//! Events from `-e` definitions: the same definitions given to the kernel's tracefs
//! `uprobe_events` and to uprobe-run record the same events with the same values on each
//! thread; every fetcharg form and type; a bad pointer; a full buffer (records written +
//! dropped = hits); two threads; each refusal; JSON and Chrome output read by a JSON parser.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use uprobe_tests::{fixture, nm_address, run_uprobe, uprobe_run};

fn target() -> PathBuf {
    fixture("trace_target", &["-O1", "-g", "-fno-inline", "-pthread", "-Wall", "-Wextra"])
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// The kernel's definitions of the parity events: PATH:OFFSET (in a PIE built by gcc, a
/// function's file offset is its `nm` address), fetchargs the kernel's uprobes accept.
fn parity_definitions(program: &Path, group: &str) -> Vec<String> {
    let p = path_str(program);
    let off = |f: &str| format!("{p}:{:#x}", nm_address(program, f));
    let counter = nm_address(program, "global_counter");
    vec![
        format!("p:{group}/add {} %di %si:s32 b=%si:x32 c=%si:u16 d=%di:s8 e=%si:x8", off("add")),
        format!("r:{group}/add_ret {} $retval r=$retval:s64", off("add")),
        format!("p:{group}/greet {} who=+0(%di):string n=%si:s32 first=+0(%di):char", off("greet")),
        format!("r:{group}/greet_ret {} $retval:s32", off("greet")),
        format!(
            "p:{group}/area {} x=+0(%di):s32 y=+4(%di):s32 n=+0(+8(%di)):string f=+16(%di):b4@4/32 \
             arr=+0(%di):s32[2] xa=+0(%di):x8[3] u=+16(%di):u32 sa=+8(%di):string[1] g=@+{counter:#x}:u32",
            off("area")
        ),
        format!("p:{group}/touch {} bad=+0(%di):u64 s=+0(%di):string h=+16(%di):x16", off("touch")),
    ]
}

/// Per thread, in order: "event args" (the part after the location).
type PerThread = Vec<Vec<String>>;

/// Parses trace lines (the kernel's or ours): the event name and what follows the location.
fn per_thread(text: &str) -> PerThread {
    let mut threads: BTreeMap<usize, (String, Vec<String>)> = BTreeMap::new();
    let mut order = 0;
    for line in text.lines().filter(|l| !l.starts_with('#') && l.contains("]")) {
        let Some((who, rest)) = line.split_once(" [") else { continue };
        let tid = who.trim().rsplit('-').next().unwrap_or("").to_string();
        let Some((_, after_ts)) = rest.split_once(": ") else { continue };
        let Some((event, after_event)) = after_ts.split_once(": (") else { continue };
        let args = after_event.split_once(')').map_or("", |(_, a)| a.trim());
        let entry = threads.values_mut().find(|(t, _)| *t == tid);
        match entry {
            Some((_, list)) => list.push(format!("{event} {args}")),
            None => {
                threads.insert(order, (tid, vec![format!("{event} {args}")]));
                order += 1;
            }
        }
    }
    let mut out: PerThread = threads.into_values().map(|(_, l)| l).collect();
    out.sort();
    out
}

struct Tracefs(PathBuf);

impl Tracefs {
    fn open() -> Result<Tracefs, String> {
        let root = PathBuf::from("/sys/kernel/tracing");
        if !root.join("uprobe_events").exists() {
            let _ = Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]).status();
        }
        if !root.join("uprobe_events").exists() {
            return Err("tracefs is not mounted at /sys/kernel/tracing and cannot be".into());
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(root.join("uprobe_events"))
            .map_err(|e| format!("cannot write uprobe_events: {e}"))?;
        Ok(Tracefs(root))
    }

    fn write(&self, file: &str, text: &str) -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(self.0.join(file))?;
        f.write_all(format!("{text}\n").as_bytes())
    }

    /// Runs `program args` with the definitions enabled and returns the trace.
    fn record(&self, group: &str, defs: &[String], program: &Path, args: &[&str]) -> Result<String, String> {
        for d in defs {
            self.write("uprobe_events", d).map_err(|e| format!("the kernel refused {d:?}: {e}"))?;
        }
        let enable = format!("events/{group}/enable");
        self.write(&enable, "1").map_err(|e| e.to_string())?;
        std::fs::write(self.0.join("trace"), "").map_err(|e| e.to_string())?;
        let out = Command::new(program).args(args).output().map_err(|e| e.to_string())?;
        assert!(out.status.success());
        let trace = std::fs::read_to_string(self.0.join("trace")).map_err(|e| e.to_string())?;
        Ok(trace)
    }

    fn remove(&self, group: &str, defs: &[String]) {
        let _ = self.write(&format!("events/{group}/enable"), "0");
        for d in defs {
            let name = d.split_whitespace().next().unwrap_or("").split_once(':').map_or("", |(_, n)| n);
            let _ = self.write("uprobe_events", &format!("-:{name}"));
        }
    }
}

fn events_args(defs: &[String]) -> Vec<String> {
    defs.iter().flat_map(|d| ["-e".to_string(), d.clone()]).collect()
}

fn run(args: &[String]) -> uprobe_tests::Run {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    run_uprobe(&refs)
}

#[test]
fn the_same_definitions_record_the_same_events_as_the_kernels_tracefs() {
    let program = target();
    let group = format!("uprt{}", std::process::id());
    let defs = parity_definitions(&program, &group);
    let mut args = events_args(&defs);
    args.extend([path_str(&program), "basic".into()]);
    let ours = run(&args);
    assert!(ours.status.success(), "{}{}", ours.stderr, ours.output);
    assert_eq!(ours.stdout, "done\n");
    let mine = per_thread(&ours.output);
    assert_eq!(mine.len(), 2, "two threads recorded:\n{}", ours.output);
    // Our own expectations, independent of the kernel.
    let main = &mine.iter().find(|t| t.len() > 10).expect("the main thread's events");
    assert_eq!(main[0], "add arg1=0x0 arg2=0 b=0x0 c=0 d=0 e=0x0");
    assert!(main.contains(&"add arg1=0x2 arg2=-2 b=0xfffffffe c=65534 d=2 e=0xfe".to_string()), "{main:?}");
    assert!(main.contains(&"greet who=\"hello\" n=0 first='h'".to_string()), "{main:?}");
    assert!(main.contains(&"touch bad=0 s=(fault) h=0x0".to_string()), "{main:?}");
    let area = main.iter().find(|l| l.starts_with("area ")).unwrap();
    assert!(area.starts_with("area x=3 y=-4 n=\"pt\" f=10 arr={3,-4} xa={0x3,0x0,0x0} u=165 sa={\"pt\"} g="), "{area}");

    let tracefs = match Tracefs::open() {
        Ok(t) => t,
        Err(why) => {
            println!("SKIPPED: kernel parity: {why}");
            return;
        }
    };
    // The kernel's events go on a copy of the program (a file of its own): tracefs events
    // apply to every process running their file, and other tests run trace_target meanwhile.
    let copy = uprobe_tests::tempfile("trace_target_kernel");
    uprobe_tests::copy_program(&program, &copy);
    let kernel_defs = parity_definitions(&copy, &group);
    let kernel = tracefs.record(&group, &kernel_defs, &copy, &["basic"]);
    tracefs.remove(&group, &kernel_defs);
    let _ = std::fs::remove_file(&copy);
    let kernel = match kernel {
        Ok(k) => k,
        Err(why) => {
            println!("SKIPPED: kernel parity: {why}");
            return;
        }
    };
    let theirs = per_thread(&kernel);
    if theirs.is_empty() {
        println!("SKIPPED: kernel parity: the kernel's uprobes recorded nothing on this machine");
        return;
    }
    assert_eq!(mine, theirs, "ours:\n{}\nkernel:\n{kernel}", ours.output);
}

#[test]
fn every_fetcharg_form_and_type() {
    let program = target();
    let p = path_str(&program);
    let defs = [
        format!("p:t/seven {p}:seven a1=$arg1 a7=$arg7:s32 ret=$stack0:symbol sp=$stack s1=$stack1 cm=$comm"),
        format!("p:t/greet {p}:greet u=+0(%di):ustring im=\\42 is=\\\"lit\" rdi=%rdi:x8"),
        format!("p:t/area {p}:area nested=+0(+8(%di)):x8[2] ch=+0(+8(%di)):char[2] off=+0x10(%di):u8"),
        format!("r:t/seven_ret {p}:seven $retval:s32 sp=$stack:x8"),
        format!("p {p}:touch+0x0 arg=%di"),
    ];
    let mut args = events_args(&defs);
    args.extend([p.clone(), "basic".into()]);
    let r = run(&args);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    let lines: Vec<&str> = r.output.lines().collect();
    let first = |prefix: &str| -> String {
        lines
            .iter()
            .find_map(|l| l.split_once(&format!(": {prefix}: ")).map(|(_, rest)| rest.to_string()))
            .unwrap_or_else(|| panic!("no {prefix} in:\n{}", r.output))
    };
    let seven = first("seven");
    assert!(seven.starts_with("(seven+0x0) a1=0x1 a7=7 ret=calls+0x"), "{seven}");
    assert!(seven.ends_with(" cm=\"trace_target\""), "{seven}");
    assert!(first("greet").contains("u=\"hello\" im=0x2a is=\"lit\" rdi=0x"), "{}", first("greet"));
    assert!(first("area").ends_with("nested={0x70,0x74} ch={'p','t'} off=165"), "{}", first("area"));
    let sret = first("seven_ret");
    assert!(sret.starts_with("(calls+0x") && sret.contains(" <- seven+0x0) arg1=28 sp=0x"), "{sret}");
    // No name given: the function's, as perf probe names it.
    assert!(r.output.contains(": touch: (touch+0x0) arg=0x10\n"), "{}", r.output);
}

#[test]
fn a_full_buffer_drops_records_and_counts_them_exactly() {
    let program = target();
    let n = 200_000;
    let r = run(&[
        "--buffer-size".into(),
        "4K".into(),
        "-e".into(),
        format!("p:t/add {}:add a=%di b=%si:s32", path_str(&program)),
        path_str(&program),
        "loop".into(),
        n.to_string(),
    ]);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    let written = r.output.lines().filter(|l| l.contains(": add: (add+0x0) a=0x0 b=")).count();
    let dropped: usize = r
        .output
        .lines()
        .find_map(|l| l.strip_prefix("uprobe-run: event add: ").and_then(|x| x.split_whitespace().next()?.parse().ok()))
        .unwrap_or(0);
    assert!(dropped > 0, "a 4K buffer must overflow with {n} hits:\n{}", &r.output[..r.output.len().min(2000)]);
    assert_eq!(written + dropped, n, "written {written} + dropped {dropped}");
}

/// A record names the CPU its thread ran on: the fixture pins itself to each CPU it may use,
/// in turn and back, and passes that CPU's number. Records take it from the thread's rseq
/// area, which glibc registers, or with `rdpid` where glibc is told not to
/// (`glibc.pthread.rseq=0`); `--verbose` says which.
#[test]
fn each_record_names_the_cpu_its_thread_ran_on() {
    let program = target();
    let def = format!("p:t/add {}:add cpu=%di:s32 round=%si:s32", path_str(&program));
    for (tunables, source) in
        [("", "the CPU from the thread's rseq area"), ("glibc.pthread.rseq=0", "the CPU from rdpid")]
    {
        let r = uprobe_tests::run_uprobe_env(
            &["--verbose", "-e", &def, &path_str(&program), "cpus"],
            &[("GLIBC_TUNABLES", tunables)],
        );
        assert!(r.status.success(), "{}{}", r.stderr, r.output);
        if !r.output.contains("records timed with rdtsc") {
            eprintln!("skipped ({tunables:?}): records are not timed with the TSC here, no CPU source to check");
            continue;
        }
        assert!(r.output.contains(source), "{tunables:?}: expected {source:?} in\n{}", r.output);
        let mut seen = Vec::new();
        for line in r.output.lines().filter(|l| l.contains(": add: (add+0x0) cpu=")) {
            let field = line.split('[').nth(1).and_then(|x| x.split(']').next()).expect("a [CPU] field");
            let cpu: i64 = field.trim().parse().expect("a CPU number");
            let arg: i64 =
                line.split("cpu=").nth(1).and_then(|x| x.split_whitespace().next()).unwrap().parse().unwrap();
            assert_eq!(cpu, arg, "{tunables:?}: {line}");
            seen.push(cpu);
        }
        let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(seen.len(), 2 * allowed, "{tunables:?}: one record per CPU and round\n{}", r.output);
        if allowed < 2 {
            eprintln!("one CPU only: the records cannot show a move between CPUs");
        }
    }
}

#[test]
fn two_threads_each_record_their_own_calls_in_order() {
    let program = target();
    let n = 3000;
    let r = run(&[
        "-e".into(),
        format!("p:t/add {}:add a=%di:u8 b=%si:u32", path_str(&program)),
        path_str(&program),
        "threads".into(),
        n.to_string(),
    ]);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    let mut by_thread: BTreeMap<String, Vec<(u64, u32)>> = BTreeMap::new();
    let mut last_ts = 0.0f64;
    for line in r.output.lines().filter(|l| l.contains(": add: ")) {
        let (who, rest) = line.split_once(" [").unwrap();
        let ts: f64 = rest[5..].trim_start().split(':').next().unwrap().trim().parse().unwrap();
        assert!(ts >= last_ts, "records in time order: {line}");
        last_ts = ts;
        let a: u64 = line.split(" a=").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        let b: u32 = line.split(" b=").nth(1).unwrap().trim().parse().unwrap();
        by_thread.entry(who.trim().to_string()).or_default().push((a, b));
    }
    assert_eq!(by_thread.len(), 2, "{}", &r.output[..r.output.len().min(2000)]);
    let mut threads: Vec<u64> = by_thread.values().map(|calls| calls[0].0).collect();
    threads.sort();
    assert_eq!(threads, [1, 2]);
    for calls in by_thread.values() {
        let t = calls[0].0;
        assert_eq!(calls, &(0..n as u32).map(|i| (t, i)).collect::<Vec<_>>());
    }
}

#[test]
fn each_malformed_definition_is_refused_before_the_program_starts() {
    let program = target();
    let p = path_str(&program);
    let cases = [
        (format!("q {p}:add"), "at column 1: expected p or r"),
        (format!("p {p}:add x=%zz"), "at column "),
        (format!("p {p}:add $retval"), "expected $retval only on a return event"),
        (format!("p {p}:add x=%di:u12"), "expected a type (u8..u64"),
        (format!("p {p}:nosuch_*"), "expected a glob that matches a function"),
        (format!("p {p}:nosuch"), "expected a function named \"nosuch\""),
        (format!("p:a-b {p}:add"), "expected an event name"),
        (format!("p {p}:add x=%di:string"), "expected memory for a string"),
        (format!("p {p}:add+1"), "expected a place a probe can go"),
    ];
    for (def, expected) in cases {
        let r = run(&["-e".into(), def.clone(), p.clone(), "basic".into()]);
        assert_eq!(r.status.code(), Some(2), "{def}: {}", r.stderr);
        assert_eq!(r.stdout, "", "{def}: the program must not start");
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{def}: one line: {}", r.stderr);
        assert!(lines[0].starts_with(&format!("uprobe-run: -e '{def}': ")), "{}", lines[0]);
        assert!(lines[0].contains(expected), "{def}: {} lacks {expected:?}", lines[0]);
    }
    let r = run(&["-e".into(), format!("p {p}:add x=%zz"), p.clone(), "basic".into()]);
    assert!(r.stderr.contains(&format!("at column {}: expected a register", p.len() + 10)), "{}", r.stderr);
    // --lenient: a glob that matches nothing is skipped, the rest is recorded.
    let r = run(&[
        "--lenient".into(),
        "-e".into(),
        format!("p {p}:nosuch_*"),
        "-e".into(),
        format!("p {p}:add"),
        p.clone(),
        "basic".into(),
    ]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.output.lines().filter(|l| l.contains(": add: (add+0x0)")).count(), 3, "{}", r.output);
}

#[test]
fn json_and_chrome_output_parse_and_pair_entries_with_returns() {
    let program = target();
    let p = path_str(&program);
    let defs = [
        format!("p:t/greet {p}:greet who=+0(%di):string n=%si:s32 x=%si:x32"),
        format!("r:t/greet_ret {p}:greet len=$retval:s32"),
        format!("p:t/touch {p}:touch s=+0(%di):string"),
    ];
    let mut args = vec!["--format".to_string(), "json".into()];
    args.extend(events_args(&defs));
    args.extend([p.clone(), "basic".into()]);
    let r = run(&args);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    let records: Vec<serde_json::Value> =
        r.output.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 3 * 2 + 3 * 2, "{}", r.output);
    let first = &records[0];
    assert_eq!(first["event"], "greet");
    assert_eq!(first["probe"], "greet+0x0");
    assert_eq!(first["args"]["who"], "hello");
    assert_eq!(first["args"]["n"], 0);
    assert_eq!(first["args"]["x"], "0x0");
    assert_eq!(first["comm"], "trace_target");
    assert!(first["ts"].as_u64().unwrap() > 0 && first["tid"].as_i64().unwrap() > 0 && first["pid"] == first["tid"]);
    let ret = records.iter().find(|r| r["event"] == "greet_ret").unwrap();
    assert_eq!(ret["args"]["len"], 5);
    assert_eq!(ret["func"], "greet+0x0");
    assert!(ret["caller"].as_str().unwrap().starts_with("calls+0x"));
    let bad = records.iter().find(|r| r["event"] == "touch").unwrap();
    assert!(bad["args"]["s"].is_null(), "{bad}");

    let mut args = vec!["--format".to_string(), "chrome".into()];
    args.extend(events_args(&defs));
    args.extend([p.clone(), "basic".into()]);
    let r = run(&args);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    let trace: serde_json::Value = serde_json::from_str(&r.output).unwrap_or_else(|e| panic!("{e}:\n{}", r.output));
    let events = trace["traceEvents"].as_array().unwrap();
    let slices: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(slices.len(), 3, "one slice per greet call: {events:?}");
    for s in &slices {
        assert_eq!(s["name"], "greet");
        assert!(s["dur"].as_f64().unwrap() >= 0.0);
        assert_eq!(s["args"]["len"].as_i64().unwrap(), 5 + s["args"]["n"].as_i64().unwrap());
    }
    assert_eq!(events.iter().filter(|e| e["ph"] == "i" && e["name"] == "touch").count(), 6);
    assert!(events.iter().any(|e| e["ph"] == "M" && e["args"]["name"] == "trace_target"));
}

#[test]
fn list_shows_functions_with_their_offset_and_strategy() {
    let program = target();
    let out = Command::new(uprobe_run()).args(["-l", "add"]).arg(&program).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("trace_target:add ")).unwrap_or_else(|| panic!("{text}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[1], format!("{:#x}", nm_address(&program, "add")));
    assert_eq!(fields[3], "jump", "{line}");
    let all = Command::new(uprobe_run()).args(["-l", "--"]).arg(&program).output().unwrap();
    let all = String::from_utf8_lossy(&all.stdout);
    assert!(all.lines().any(|l| l.starts_with("libc.so.6:malloc ")), "libraries are listed too");
    let none = Command::new(uprobe_run()).args(["-l", "no_such_fn*"]).arg(&program).output().unwrap();
    assert_eq!(none.status.code(), Some(1));
}

/// Strings that end at an unreadable page, at every alignment the copy's byte and word loops
/// meet: one whose NUL is the page's last byte is read whole, one that runs on into the page
/// is a fault, and the program runs on.
#[test]
fn a_string_that_runs_into_an_unreadable_page_is_a_fault() {
    let program = target();
    let p = path_str(&program);
    let defs = [
        format!("p:edges/greet {p}:greet who=+0(%di):string n=%si:s32"),
        format!("p:edges/touch {p}:touch s=+0(%di):string"),
    ];
    let mut args = events_args(&defs);
    args.extend([p, "edges".into()]);
    let ours = run(&args);
    assert!(ours.status.success(), "{}{}", ours.stderr, ours.output);
    assert_eq!(ours.stdout, "done\n");
    let threads = per_thread(&ours.output);
    assert_eq!(threads.len(), 1, "{}", ours.output);
    let mut expected = Vec::new();
    for back in [1, 3, 8, 13, 24] {
        expected.push(format!("greet who=\"{}\" n={back}", "z".repeat(back - 1)));
        expected.push("touch s=(fault)".to_string());
    }
    assert_eq!(threads[0], expected);
}
