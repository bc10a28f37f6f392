//! USDT markers: `sdt:PROVIDER:NAME`, `%PROVIDER:NAME`, `MODULE:sdt:...` and the kernel's
//! `PATH:OFFSET(REF_CTR_OFFSET)` count every hit of a marker in the main thread, in threads
//! and in a forked child, with the arguments typed from the marker's specs; the semaphore
//! reads 0 without probes and one per probe while they are placed, in the child too, and in a
//! library at each of its loads; `-l` lists the markers; bad names are refused with what
//! exists. Python's own markers count what the kernel counts (bpftrace).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use uprobe_tests::{gcc, int3_only, run_plain, run_uprobe, uprobe_run, Run};

fn usdt() -> PathBuf {
    gcc("usdt", &["fixtures/usdt.c", "fixtures/usdt_plain.c"], &["-O2", "-g", "-pthread", "-Wall", "-Wextra", "-ldl"])
}

fn library() -> PathBuf {
    gcc("libusdt_lib.so", &["fixtures/usdt_lib.c"], &["-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra"])
}

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// The fields of the records of `event`: one map of NAME=VALUE per record.
fn records(run: &Run, event: &str) -> Vec<BTreeMap<String, String>> {
    let tag = format!(" {event}: (");
    run.output
        .lines()
        .filter_map(|l| l.split_once(&tag))
        .map(|(_, rest)| {
            let args = rest.split_once(") ").map_or("", |(_, a)| a);
            args.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect()
        })
        .collect()
}

/// The ticks the fixture makes: (i, name) in each process and thread.
fn expected_ticks() -> Vec<(i64, String)> {
    let names = ["alpha", "beta", "gamma"];
    let mut all: Vec<(i64, String)> = (0..10).map(|i| (i, "alpha".to_string())).collect();
    for t in 1..=3i64 {
        all.extend((0..10).map(|k| (1000 * t + k, names[(t % 3) as usize].to_string())));
    }
    all.extend((100..105).map(|i| (i, "alpha".to_string())));
    all.sort();
    all
}

#[test]
fn markers_count_in_threads_and_after_fork_with_their_arguments_and_raise_the_semaphore() {
    let prog = usdt();
    let plain = run_plain(&prog, &[]);
    assert!(plain.status.success());
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "start sem=0\nchild sem=0 computed=0\nend sem=0 computed=0\n");
    let run = run_uprobe(&["-e", "p sdt:app:tick arg1 arg2 name=+0(arg3):string", "-e", "p sdt:app:plain", s(&prog)]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert_eq!(run.stdout, "start sem=1\nchild sem=1 computed=5\nend sem=1 computed=40\n");
    let ticks = records(&run, "tick");
    let mut got: Vec<(i64, String)> = ticks
        .iter()
        .map(|r| {
            let i: i64 = r["arg1"].parse().unwrap();
            // arg2 is -i*i, a signed 8-byte argument: read with its sign.
            assert_eq!(r["arg2"].parse::<i64>().unwrap(), -i * i, "{r:?}");
            (i, r["name"].clone())
        })
        .collect();
    got.sort();
    assert_eq!(got, expected_ticks());
    let mut plains: Vec<(i64, i64)> =
        records(&run, "plain").iter().map(|r| (r["arg2"].parse().unwrap(), r["arg1"].parse().unwrap())).collect();
    plains.sort();
    let mut want: Vec<(i64, i64)> =
        expected_ticks().iter().map(|(i, _)| (*i, if *i >= 1000 { *i / 1000 } else { 0 })).collect();
    want.sort();
    assert_eq!(plains, want);
}

#[test]
fn every_spelling_of_a_marker_raises_the_semaphore_once_per_probe() {
    let prog = usdt();
    // The kernel's form, with the offsets -l gives.
    let list = Command::new(uprobe_run()).args(["-l", "sdt:app:tick", s(&prog)]).output().unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    let line = text.lines().find(|l| l.starts_with("usdt:sdt:app:tick")).unwrap_or_else(|| panic!("{text}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    let (offset, semaphore) = (f[1], f[f.iter().position(|w| *w == "semaphore").unwrap() + 1]);
    let kernel = format!("p:k/kt {}:{offset}({semaphore}) i=%cx:s32", s(&prog));
    let module = format!("p:m/mt {}:sdt:app:tick", s(&prog));
    let run = run_uprobe(&["--count", "-e", &kernel, "-e", "p:p/pt %app:tick", "-e", &module, s(&prog)]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert_eq!(run.stdout, "start sem=3\nchild sem=3 computed=5\nend sem=3 computed=40\n");
    let table: Vec<Vec<&str>> = run
        .output
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| !f.is_empty())
        .collect();
    assert_eq!(table, [["kt", "45"], ["pt", "45"], ["mt", "45"]], "{}", run.output);
}

#[test]
fn counts_histograms_and_filters_use_the_marker_arguments() {
    let prog = usdt();
    let run = run_uprobe(&["--count", "--by", "name", "-e", "p sdt:app:tick name=+0(arg3):string", s(&prog)]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    let by: Vec<String> = run.output.lines().filter(|l| l.starts_with("  ")).map(|l| l.trim().to_string()).collect();
    assert_eq!(
        by[1..].iter().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect::<Vec<_>>(),
        ["alpha 25", "beta 10", "gamma 10"]
    );
    // A filter on an argument the fetchargs do not name brings it in.
    let run = run_uprobe(&["-e", "p sdt:app:tick name=+0(arg3):string if arg1 >= 1001 && arg1 < 1004", s(&prog)]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    let got: Vec<(String, String)> =
        records(&run, "tick").iter().map(|r| (r["arg1"].clone(), r["name"].clone())).collect();
    assert_eq!(got, [("1001".into(), "beta".into()), ("1002".into(), "beta".into()), ("1003".into(), "beta".into())]);
    let run = run_uprobe(&["--hist", "tick.arg1", "-e", "p sdt:app:tick", s(&prog)]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert!(run.output.contains("hist tick.arg1: 45 values"), "{}", run.output);
}

#[test]
fn a_library_loaded_later_gets_its_semaphore_raised_at_each_load() {
    let (prog, lib) = (usdt(), library());
    let plain = run_plain(&prog, &["dl", s(&lib)]);
    assert!(String::from_utf8_lossy(&plain.stdout).starts_with("round 0: lib sem=0\nlib_hit 1 sem=0\n"));
    let def = format!("p {}:sdt:lib:hit n=arg1", s(&lib));
    let run = run_uprobe(&["-e", &def, s(&prog), "dl", s(&lib)]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    let want: String = (0..2)
        .map(|r| {
            let hits: String = (1..=3).map(|n| format!("lib_hit {} sem=1\n", n + 10 * r)).collect();
            format!("round {r}: lib sem=1\n{hits}")
        })
        .collect();
    assert_eq!(run.stdout, want);
    let ns: Vec<String> = records(&run, "hit").iter().map(|r| r["n"].clone()).collect();
    assert_eq!(ns, ["3", "6", "9", "33", "36", "39"]);
}

#[test]
fn the_listing_shows_each_marker_with_its_semaphore_and_arguments() {
    let prog = usdt();
    let out = Command::new(uprobe_run())
        .args(int3_only().then_some("--no-optimize"))
        .args(["-l", "sdt:app:*", s(&prog)])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Vec<&str>> = text.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0][0], "usdt:sdt:app:tick");
    assert!(text.contains("semaphore 0x"), "{text}");
    assert!(lines[0].ends_with(&["-4@%ecx", "-8@%rax", "8@(%rsi,%rdx,8)"]), "{text}");
    // The marker's nop sits inside work(), and takes a jump unless jumps are off.
    assert_eq!(lines[0][3], if int3_only() { "int3" } else { "jump" }, "{text}");
    assert_eq!(lines[1][0], "usdt:sdt:app:plain");
    assert!(text.contains("no semaphore  -4@%edi -4@%esi"), "{text}");
}

#[test]
fn unknown_markers_and_arguments_are_refused_with_what_exists() {
    let prog = usdt();
    let refused = |def: &str| {
        let run = run_uprobe(&["-e", def, s(&prog)]);
        assert_eq!(run.status.code(), Some(2), "{def}: {}", run.stderr);
        assert_eq!(run.stdout, "", "the program must not start");
        run.stderr
    };
    let p = s(&prog);
    assert_eq!(
        refused("p sdt:app:tock"),
        format!(
            "uprobe-run: -e 'p sdt:app:tock': no USDT marker app:tock in {p} or the libraries it loads \
             (markers it has: app:tick, app:plain)\n"
        )
    );
    assert_eq!(
        refused("p sdt:app:tick x=+0(arg4):string"),
        "uprobe-run: -e 'p sdt:app:tick x=+0(arg4):string': marker app:tick has 3 arguments (arg1..arg3), not arg4\n"
    );
    assert_eq!(
        refused("p nosuchlib:sdt:app:tick"),
        "uprobe-run: -e 'p nosuchlib:sdt:app:tick': no module \"nosuchlib\": not the program, none of its \
         libraries, no such library file\n"
    );
    assert!(refused("r sdt:app:tick").contains("a marker is not a function: no return"));
}

/// Python's `function__return` counted by bpftrace (the kernel's uprobes, which raise the
/// semaphore too) and by uprobe-run, on the same script: the same total and the same count
/// for each function name.
#[test]
fn python_function_returns_count_as_the_kernel_counts_them() {
    let python = "/usr/bin/python3.11";
    let skip = |why: &str| eprintln!("skipped: {why}");
    if !std::path::Path::new(python).exists() {
        return skip("no /usr/bin/python3.11");
    }
    if Command::new("bpftrace").arg("--version").output().is_err() {
        return skip("no bpftrace");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("bpftrace needs root");
    }
    let script = uprobe_tests::workspace_root().join("tests/fixtures/usdt_script.py");
    let command = format!("{python} -I {}", s(&script));
    let bpf = Command::new("bpftrace")
        .args(["-q", "-e", &format!("usdt:{python}:python:function__return {{ @[str(arg1)] = count(); }}"), "-c"])
        .arg(&command)
        .env("PYTHONHASHSEED", "0")
        .output()
        .unwrap();
    if !bpf.status.success() {
        return skip(&format!("bpftrace failed: {}", String::from_utf8_lossy(&bpf.stderr)));
    }
    let mut kernel: BTreeMap<String, u64> = BTreeMap::new();
    for line in String::from_utf8_lossy(&bpf.stdout).lines() {
        if let Some((k, n)) = line.strip_prefix("@[").and_then(|l| l.split_once("]: ")) {
            kernel.insert(k.to_string(), n.trim().parse().unwrap());
        }
    }
    let run = uprobe_tests::run_uprobe_env(
        &["--count", "--by", "fn", "-e", "p sdt:python:function__return fn=+0(arg2):string", python, "-I", s(&script)],
        &[("PYTHONHASHSEED", "0")],
    );
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    let mut ours: BTreeMap<String, u64> = BTreeMap::new();
    for line in run.output.lines().skip_while(|l| !l.trim_start().starts_with("fn ")).skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 2 {
            ours.insert(f[0].to_string(), f[1].parse().unwrap());
        }
    }
    assert!(kernel.values().sum::<u64>() > 10_000, "{kernel:?}");
    assert_eq!(ours.values().sum::<u64>(), kernel.values().sum::<u64>());
    assert_eq!(ours, kernel);
}

#[test]
fn an_events_file_names_markers_too() {
    let prog = usdt();
    let file = std::env::temp_dir().join(format!("usdt-events-{}.txt", std::process::id()));
    std::fs::write(&file, "# markers\np sdt:app:tick arg1\np:x/pl sdt:app:plain\n").unwrap();
    let run = run_uprobe(&["--events", s(&file), "--filter", "tick: arg1 < 3", "-e", "p usdt:work", s(&prog)]);
    let _ = std::fs::remove_file(&file);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert_eq!(run.stdout, "start sem=1\nchild sem=1 computed=5\nend sem=1 computed=40\n");
    let ticks: Vec<String> = records(&run, "tick").iter().map(|r| r["arg1"].clone()).collect();
    assert_eq!(ticks, ["0", "1", "2"]);
    assert_eq!(records(&run, "pl").len(), 45);
    assert_eq!(records(&run, "work").len(), 45);
}

/// An attach session raises a marker's semaphore while its probes are placed and lowers it
/// when it ends: the program reads 0 before, 2 with two probes on the marker (and computes
/// the arguments, which the records show), 0 again after, and stops computing.
#[test]
fn an_attach_session_raises_the_semaphore_while_armed_and_lowers_it_after() {
    uprobe_tests::need_ptrace!();
    use uprobe_tests::attach::{Session, Target};
    let prog = gcc("usdt_gate", &["fixtures/usdt_gate.c"], &["-O2", "-g", "-Wall", "-Wextra"]);
    let mut target = Target::start(&prog, &[]);
    target.send("sem");
    assert_eq!(target.out.expect("sem="), "sem=0");
    let out = uprobe_tests::tempfile("usdt-attach");
    let mut session = Session::start(
        target.pid,
        &["-o", s(&out), "-e", "p sdt:gate:hit", "-e", &format!("p:again/hit {}:sdt:gate:hit", s(&prog))],
    );
    target.send("work");
    assert_eq!(target.out.expect("computed="), "computed=10");
    assert_eq!(target.out.expect("sem="), "sem=2");
    // SAFETY: kill(2) with our own child's pid: SIGINT ends the session (detach).
    unsafe { libc::kill(session.child.id() as i32, libc::SIGINT) };
    let (status, _) = session.wait();
    assert!(status.success(), "{status:?}: {:?}", session.own_lines());
    target.send("work");
    assert_eq!(target.out.expect("computed="), "computed=10");
    assert_eq!(target.out.expect("sem="), "sem=0");
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0));
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let args: Vec<String> = records_of(&text, "hit").iter().map(|r| r["arg1"].clone()).collect();
    let want: Vec<String> = (0..10).flat_map(|i| [(i * 3).to_string(), (i * 3).to_string()]).collect();
    assert_eq!(args, want, "{text}");
}

/// [`records`] of a session's output text.
fn records_of(text: &str, event: &str) -> Vec<BTreeMap<String, String>> {
    let run = Run {
        status: std::process::ExitStatus::default(),
        stdout: String::new(),
        stderr: String::new(),
        output: text.into(),
    };
    records(&run, event)
}
