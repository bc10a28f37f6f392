//! Every launch option with `--pid`: definitions streamed (`-e`, `--events`; text, JSON,
//! Chrome), `--count --by`, `--hist`, `--lhist`, `--latency`, `--interval`, `--lenient` and
//! `-l --pid`, on a fixture that waits for a line before its work (`gated.c`), so that the
//! attach lands before it: the counts, buckets and records equal those of a launch of the same
//! fixture. A definition that does not resolve, or an option that cannot apply, is one line
//! with status 2 and the process runs on untouched; a second session starts from zero.
//!
//! Every test needs ptrace: where it is not permitted, the test says `SKIPPED` and returns.

use std::path::PathBuf;
use std::process::ExitStatus;

use serde_json::Value;
use uprobe_tests::attach::*;
use uprobe_tests::*;

fn gated() -> PathBuf {
    fixture("gated", &["-O1", "-g", "-fno-inline", "-Wall", "-Wextra"])
}

/// `p GATED:FUNCTION ARGS`.
fn def(kind: &str, function: &str, args: &str) -> String {
    format!("{kind} {}:{function} {args}", gated().display()).trim_end().to_string()
}

/// The output without uprobe-run's own lines (`--verbose` adds some to an attach), as text
/// or as JSON messages.
fn without_own_lines(text: &str) -> String {
    let own = |l: &str| l.starts_with("uprobe-run: ") || l.starts_with("{\"kind\":\"message\"");
    text.lines().filter(|l| !own(l)).map(|l| format!("{l}\n")).collect()
}

/// A launch of the fixture with `args` (its gate opens at once: stdin is empty).
fn launched(args: &[&str]) -> Run {
    let g = gated();
    let r = run_uprobe(&[args, &[path(&g)]].concat());
    assert!(r.status.success(), "{args:?}: {}\n{}", r.stderr, r.output);
    assert!(r.stdout.contains("done"), "{}", r.stdout);
    r
}

/// What an attach session with `args` wrote (`-o`), its status and uprobe-run's own lines:
/// the session attaches to the fixture waiting at its gate, the gate opens, the fixture does
/// its work and exits, which ends the session.
fn attached(args: &[&str]) -> (ExitStatus, String, Vec<String>) {
    attached_to(Target::start(&gated(), &[]), args)
}

/// [`attached`], to a fixture already started (and perhaps attached to before).
fn attached_to(mut target: Target, args: &[&str]) -> (ExitStatus, String, Vec<String>) {
    let out = tempfile("attach-events");
    let mut session = Session::start(target.pid, &[&["-o", path(&out)], args].concat());
    target.send("go");
    target.out.expect("done");
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0), "the fixture");
    let (status, _) = session.wait();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    (status, text, session.own_lines())
}

#[test]
fn counts_and_histograms_of_an_attach_equal_a_launchs() {
    need_ptrace!();
    let sized = def("p", "sized", "size=%di:s64");
    let value = def("p", "value", "v=%di:s64");
    let tick = def("p", "tick", "");
    let cases: Vec<Vec<&str>> = vec![
        vec!["--count", "-e", &tick, "-e", &sized],
        vec!["--count", "--by", "size", "-e", &sized],
        vec!["--count", "--by", "size", "--top", "3", "--format", "json", "-e", &sized],
        vec!["--hist", "sized.size", "--hist", "value.v", "-e", &sized, "-e", &value],
        vec!["--lhist", "value.v,0,1000,100", "--format", "json", "-e", &value],
    ];
    for args in cases {
        let launch = without_own_lines(&launched(&args).output);
        let (status, attach, own) = attached(&args);
        assert_eq!(status.code(), Some(0), "{args:?}: {own:?}");
        assert!(!launch.is_empty(), "{args:?}: an empty report");
        let attach = without_own_lines(&attach);
        // JSON reports carry the process's id and a time stamp: compared without them.
        let plain = |text: &str| -> Vec<Value> {
            text.lines()
                .map(|l| match serde_json::from_str::<Value>(l) {
                    Ok(Value::Object(mut o)) => {
                        o.remove("pid");
                        o.remove("ts");
                        Value::Object(o)
                    }
                    _ => Value::String(l.to_string()),
                })
                .collect()
        };
        assert_eq!(plain(&attach), plain(&launch), "{args:?}");
    }
}

#[test]
fn latency_of_an_attach_times_every_call_as_a_launch() {
    need_ptrace!();
    let g = gated();
    let nap = format!("{}:nap", g.display());
    let args = ["--latency", nap.as_str(), "--format", "json"];
    let calls = |text: &str| -> Vec<(String, u64)> {
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|o| o["kind"] == "latency")
            .map(|o| (o["function"].as_str().unwrap_or("").to_string(), o["count"].as_u64().unwrap()))
            .collect()
    };
    let launch = calls(&launched(&args).output);
    let (status, attach, own) = attached(&args);
    assert_eq!(status.code(), Some(0), "{own:?}");
    assert_eq!(launch, [("nap".to_string(), 5)]);
    assert_eq!(calls(&attach), launch);
    // Every call slept 200 us: the buckets' counts add up to the calls, none below 128 us.
    let objects: Vec<Value> = attach.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let latency = objects.iter().find(|o| o["kind"] == "latency").unwrap();
    assert!(latency["min_ns"].as_u64().unwrap() >= 200_000, "{latency}");
}

#[test]
fn a_session_after_one_with_no_optimize_takes_jumps_and_says_so() {
    need_ptrace!();
    if int3_only() {
        println!("SKIPPED: every session of this run has --no-optimize, so none takes a jump");
        return;
    }
    let g = gated();
    let nap = format!("{}:nap", g.display());
    let target = Target::start(&g, &[]);
    // A first session keeps its probe on the int3, as asked, and says so.
    let (status, err) = attach_once(target.pid, &["-v", "--no-optimize", "--duration", "0.3", "--latency", &nap]);
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("(nap+0x0): int3 (jump probes disabled (--no-optimize))"), "{err}");
    assert!(err.contains("(an int3 probe: each time includes the return from its trap"), "{err}");
    // The next one, without the option, takes the jump; its report, written once the probe
    // is gone, still says how it was hit.
    let (status, text, own) = attached_to(target, &["--latency", &nap, "--format", "json"]);
    assert_eq!(status.code(), Some(0), "{own:?}");
    assert!(own.iter().any(|l| l.contains(": 0 handler libraries, 1 probe (1 jump);")), "{own:?}");
    let latency: Value =
        text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|o| o["kind"] == "latency").unwrap();
    assert_eq!((latency["probe"].as_str(), latency["count"].as_u64()), (Some("jump"), Some(5)), "{latency}");
}

/// The records of a JSON stream without what differs from run to run (time, process, CPU).
fn records(text: &str) -> Vec<Value> {
    without_own_lines(text)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let mut o: serde_json::Map<String, Value> = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            for field in ["ts", "pid", "tid", "cpu"] {
                o.remove(field);
            }
            Value::Object(o)
        })
        .collect()
}

#[test]
fn an_attached_stream_has_the_records_of_a_launch() {
    need_ptrace!();
    let greet = def("p", "greet", "who=+0(%di):string");
    let nap = def("r", "nap", "ret=$retval:s64");
    let value = def("p", "value", "v=%di:s64 if v >= 998");
    // JSON lines: the same records in the same order.
    let args = ["--format", "json", "-e", &greet, "-e", &nap, "-e", &value];
    let launch = records(&launched(&args).output);
    let (status, attach, own) = attached(&args);
    assert_eq!(status.code(), Some(0), "{own:?}");
    assert_eq!(launch.len(), 3 + 5 + 3, "{launch:?}");
    assert_eq!(records(&attach), launch);
    // Text: the kernel's trace lines, the same after their time stamps.
    let text = ["-e", &greet, "-e", &nap];
    let after_time = |t: &str| -> Vec<String> {
        without_own_lines(t).lines().map(|l| l.split_once("]").map_or(l, |(_, r)| r).trim().to_string()).collect()
    };
    let after_stamp = |lines: Vec<String>| -> Vec<String> {
        lines.iter().map(|l| l.split_once(": ").map_or(l.as_str(), |(_, r)| r).to_string()).collect()
    };
    let launch = after_stamp(after_time(&launched(&text).output));
    let (status, attach, own) = attached(&text);
    assert_eq!(status.code(), Some(0), "{own:?}");
    assert_eq!(launch.len(), 8, "{launch:?}");
    assert_eq!(after_stamp(after_time(&attach)), launch);
    // Chrome: one JSON document, the same events; the runtime's lines stay out of it.
    let chrome = ["--format", "chrome", "-e", &greet, "-e", &nap];
    let (status, attach, own) = attached(&chrome);
    assert_eq!(status.code(), Some(0), "{own:?}");
    let doc: Value = serde_json::from_str(&attach).unwrap_or_else(|e| panic!("{e}: {attach}"));
    let names: Vec<&str> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] != "M")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["greet", "greet", "greet", "nap__return", "nap__return", "nap__return", "nap__return", "nap__return"]
    );
}

#[test]
fn a_burst_streamed_over_the_session_loses_nothing_uncounted() {
    need_ptrace!();
    const HITS: u64 = 300_000;
    let value = def("p", "value", "v=%di:s64");
    for buffer in [None, Some("64K")] {
        let mut target = Target::start(&gated(), &[]);
        let out = tempfile("attach-burst");
        let mut args = vec!["-o", path(&out), "--format", "json", "-e", &value];
        args.extend(buffer.iter().flat_map(|b| ["--buffer-size", b]));
        let mut session = Session::start(target.pid, &args);
        target.send(&format!("burst {HITS}"));
        target.out.expect("done");
        let (status, _) = target.finish();
        assert_eq!(status.code(), Some(0));
        let (status, _) = session.wait();
        assert_eq!(status.code(), Some(0), "{:?}", session.own_lines());
        let text = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        let objects: Vec<Value> = without_own_lines(&text)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        let records = objects.iter().filter(|o| o["event"] == "value" && o.get("args").is_some()).count() as u64;
        let dropped: u64 =
            objects.iter().filter(|o| o["kind"] == "dropped").map(|o| o["dropped"].as_u64().unwrap()).sum();
        assert_eq!(records + dropped, HITS, "{buffer:?}: {records} records, {dropped} dropped");
        // Records come in the order of the hits: each value follows the one before.
        let values: Vec<i64> = objects.iter().filter_map(|o| o["args"]["v"].as_i64()).collect();
        assert!(values.windows(2).all(|w| w[0] < w[1]), "{buffer:?}: out of order");
        println!("{buffer:?}: {records} records, {dropped} dropped");
    }
}

#[test]
fn an_events_file_and_lenient_work_as_in_a_launch() {
    need_ptrace!();
    let file = tempfile("events");
    std::fs::write(&file, format!("# counted\n{}\n\n{}\n", def("p", "tick", ""), def("p", "sized", "s=%di"))).unwrap();
    let nosuch = def("p", "nosuch", "");
    let args = ["--count", "--lenient", "--events", path(&file), "-e", &nosuch];
    let launch = without_own_lines(&launched(&args).output);
    let (status, attach, own) = attached(&args);
    let _ = std::fs::remove_file(&file);
    assert_eq!(status.code(), Some(0), "{own:?}");
    assert_eq!(without_own_lines(&attach), launch);
    assert!(launch.contains("tick") && launch.contains("1000") && launch.contains("210"), "{launch}");
    assert!(
        attach.contains("uprobe-run: -e '") && attach.contains("nosuch") && attach.contains("; skipped"),
        "{attach}"
    );
}

#[test]
fn refusals_are_one_line_and_leave_the_process_as_it_was() {
    need_ptrace!();
    let g = gated();
    let sized = def("p", "sized", "size=%di:s64");
    let nosuch = def("p", "nosuch", "");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["-e", &nosuch],
            format!("-e '{nosuch}': at column 3: expected a function named \"nosuch\" in {}", g.display()),
        ),
        (vec!["--hist", "nosuch.v", "-e", &sized], "--hist 'nosuch.v': no event named nosuch (events: sized)".into()),
        (vec!["--count", "-e", &sized, "-e", "p libnosuch.so:f"], "libnosuch.so".into()),
    ];
    let target = Target::start(&g, &[]);
    let before = target.maps();
    for (args, why) in cases {
        let (status, err) = attach_once(target.pid, &args);
        assert_eq!(status.code(), Some(2), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line: {err}");
        let head = format!("uprobe-run: process {}: ", target.pid);
        assert!(lines[0].starts_with(&head) && lines[0].contains(&why), "{args:?}: {err}");
    }
    // Options that cannot apply to an attach: named, before anything is done.
    for (args, option) in [
        (vec!["--follow-exec", "-e", &sized], "--follow-exec"),
        (vec!["--no-follow-fork", "--count", "-e", &sized], "--no-follow-fork"),
    ] {
        let (status, err) = attach_once(target.pid, &args);
        assert_eq!(status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(option), "{args:?}: {err}");
    }
    // No probe is left: the work runs unprobed and a later session counts it all.
    let after = target.maps();
    let code = |maps: &[String]| -> Vec<String> {
        maps.iter().filter(|l| l.contains(path(&g)) && l.contains("x")).cloned().collect()
    };
    assert_eq!(code(&after), code(&before));
    let (status, text, own) = attached_to(target, &["--count", "-e", &sized]);
    assert_eq!(status.code(), Some(0), "{own:?}");
    assert!(
        without_own_lines(&text).lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["sized", "210"]),
        "{text}"
    );
}

#[test]
fn a_second_session_counts_only_its_own_window() {
    need_ptrace!();
    let g = gated();
    let tick = def("p", "tick", "");
    let sized = def("p", "sized", "size=%di:s64");
    let mut target = Target::start(&g, &[]);
    // A first session that sees no hit, ended by --duration, with a stream.
    let (status, err) = attach_once(target.pid, &["--duration", "0.3", "-e", &tick]);
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(err, "", "no hit, no record");
    // A second with counters, ended by SIGINT before the work: all zero.
    let session = Session::start(target.pid, &["--count", "--by", "size", "-e", &sized]);
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("count sized by size: 0 hits")), "{lines:?}");
    // A third, with another layout of counters, sees the work.
    let out = tempfile("second-session");
    let session = Session::start(target.pid, &["-o", path(&out), "--count", "-e", &tick, "-e", &sized]);
    target.send("go");
    target.out.expect("done");
    let session_end = session.end(libc::SIGINT);
    assert_eq!(session_end.0.code(), Some(0));
    let text = without_own_lines(&std::fs::read_to_string(&out).unwrap());
    let _ = std::fs::remove_file(&out);
    let table: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    assert!(table.contains(&vec!["tick", "1000"]) && table.contains(&vec!["sized", "210"]), "{text}");
    // Detached: the process runs on unprobed.
    assert!(target.alive());
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_listing_of_a_running_process_is_a_launchs_listing() {
    need_ptrace!();
    let g = gated();
    let pattern = "gated:*";
    let launch = run_uprobe(&["-l", pattern, path(&g)]);
    assert_eq!(launch.status.code(), Some(0), "{}", launch.stderr);
    let target = Target::start(&g, &[]);
    for args in
        [vec!["-l", pattern, "--pid", &target.pid.to_string()], vec!["--pid", &target.pid.to_string(), "-l", pattern]]
    {
        let out = std::process::Command::new(uprobe_run())
            .args(int3_only().then_some("--no-optimize"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        let listed = String::from_utf8_lossy(&out.stdout);
        assert_eq!(listed, launch.stdout, "{args:?}");
        for f in ["gated:tick ", "gated:sized ", "gated:nap "] {
            assert!(listed.lines().any(|l| l.starts_with(f)), "{f}: {listed}");
        }
    }
    let out = std::process::Command::new(uprobe_run())
        .args(["-l", "nomatch*", "--pid", &target.pid.to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no function matches nomatch*"));
    assert!(target.alive());
}

/// The anonymous memory of process `pid`, in kB.
fn anonymous_kb(pid: i32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let line = rollup.lines().find(|l| l.starts_with("Anonymous:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn libc_wide_sessions_in_a_row_leave_the_memory_where_it_was() {
    need_ptrace!();
    let target = Target::start(&gated(), &[]);
    let session = |args: &[&str]| {
        let (status, err) = attach_once(target.pid, &[&["--duration", "0.1", "--lenient"], args].concat());
        assert_eq!(status.code(), Some(0), "{err}");
    };
    let every = "p libc.so.6:*";
    // The first sessions load the runtime and make what it keeps (a stream's and a count's).
    session(&["-o", "/dev/null", "-e", every]);
    session(&["--count", "-o", "/dev/null", "-e", every]);
    let before = anonymous_kb(target.pid);
    for _ in 0..3 {
        session(&["-o", "/dev/null", "-e", every]);
        session(&["--count", "-o", "/dev/null", "-e", every]);
    }
    let after = anonymous_kb(target.pid);
    println!("anonymous memory: {before} kB after two sessions, {after} kB after six more");
    // Each session's ~2,000 events and their counters were once kept for good (1.3 MB).
    assert!(after <= before + 512, "{before} kB -> {after} kB over six libc-wide sessions");
    assert!(target.alive());
}

/// `GET /metrics` on the unix socket `path`: the body.
fn scrape(path: &std::path::Path) -> String {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n").map_or(text.clone(), |(_, body)| body.to_string())
}

/// The value of the series `name{labels}` whose labels include each of `labels`.
fn series(body: &str, name: &str, labels: &[&str]) -> Option<String> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string)
}

#[test]
fn an_attach_session_is_served_as_metrics() {
    need_ptrace!();
    let tick = def("p", "tick", "");
    let sized = def("p", "sized", "size=%di:s64");
    let socket = tempfile("attach-metrics.sock");
    let mut target = Target::start(&gated(), &[]);
    let session =
        Session::start(target.pid, &["--serve", path(&socket), "--count", "--by", "size", "-e", &tick, "-e", &sized]);
    target.send("go");
    target.out.expect("done");
    let body = scrape(&socket);
    let hits = |labels: &[&str]| series(&body, "uprobe_hits_total", labels);
    assert_eq!(hits(&["event=\"tick\""]).as_deref(), Some("1000"), "{body}");
    for v in 1..=20 {
        assert_eq!(hits(&["event=\"sized\"", &format!("size=\"{v}\"")]), Some(v.to_string()), "{body}");
    }
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("count sized by size: 210 hits")), "{lines:?}");
    assert!(!socket.exists(), "the socket file is removed at the end");
    assert!(target.alive());
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_zombie_is_refused_in_one_line() {
    need_ptrace!();
    // A child that exited and was not reaped: `sh -c` execs sleep, which never waits.
    let mut parent = std::process::Command::new("sh").args(["-c", "sleep 0 & exec sleep 30"]).spawn().unwrap();
    let pid = {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let children =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", parent.id())).unwrap_or_default();
            let zombie = children
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
                .find(|c| std::fs::read_to_string(format!("/proc/{c}/stat")).is_ok_and(|s| s.contains(") Z")));
            if let Some(z) = zombie {
                break z;
            }
            assert!(std::time::Instant::now() < deadline, "no zombie");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let (status, err) = attach_once(pid, &["--count", "-e", "p libc.so.6:malloc"]);
    let _ = parent.kill();
    let _ = parent.wait();
    assert_eq!(status.code(), Some(2));
    assert_eq!(err, format!("uprobe-run: process {pid} is a zombie (it has exited; its parent has not reaped it)\n"));
}

/// Source lines by name in an attach: the process's executable is the program whose DWARF
/// names them (`/proc/PID/exe`), and the counts equal a launch's.
#[test]
fn source_lines_in_an_attach_count_as_in_a_launch() {
    need_ptrace!();
    let sized = format!("p {}:sized:0", gated().display());
    let args = ["--count", "-e", "p gated.c:46", "-e", &sized];
    let launch = without_own_lines(&launched(&args).output);
    assert!(launch.contains("gated_L46") && launch.contains("1000") && launch.contains("210"), "{launch}");
    let (status, attach, own) = attached(&args);
    assert_eq!(status.code(), Some(0), "{own:?}");
    assert_eq!(without_own_lines(&attach), launch);
}

/// The stacks of the gzipped pprof profile at `path`, as function names innermost first,
/// with their counts, sorted.
fn pprof_stacks(path: &std::path::Path) -> Vec<(Vec<String>, i64)> {
    use std::io::Read;
    let gz = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut bytes).expect("gzip");
    let p = uprobe_contracts::pprof::decode(&bytes).expect("a profile");
    let mut stacks: Vec<(Vec<String>, i64)> = (0..p.samples.len())
        .map(|i| (p.stack(i).into_iter().map(str::to_string).collect(), p.samples[i].values[0]))
        .collect();
    stacks.sort();
    stacks
}

/// The boxes of a flame graph SVG (`<title>NAME (N hits, P%)</title>`), sorted.
fn flame_boxes(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut boxes: Vec<String> =
        text.split("<title>").skip(1).map(|t| t.split("</title>").next().unwrap_or("").to_string()).collect();
    boxes.sort();
    boxes
}

#[test]
fn an_attach_writes_the_flame_graph_and_profile_a_launch_writes() {
    need_ptrace!();
    let sized = def("p", "sized", "");
    let (svg, pb) = (tempfile("attach-flame").with_extension("svg"), tempfile("attach-prof").with_extension("pb.gz"));
    let args = ["--count", "--by", "ustack", "-e", &sized, "--flamegraph", path(&svg), "--pprof", path(&pb)];
    let _ = launched(&args);
    let (launch_boxes, launch_stacks) = (flame_boxes(&svg), pprof_stacks(&pb));
    let _ = (std::fs::remove_file(&svg), std::fs::remove_file(&pb));
    let (status, text, own) = attached(&args);
    assert_eq!(status.code(), Some(0), "{own:?}");
    assert!(text.contains("count sized by ustack: 210 hits, 1 key\n"), "{text}");
    let (boxes, stacks) = (flame_boxes(&svg), pprof_stacks(&pb));
    let _ = (std::fs::remove_file(&svg), std::fs::remove_file(&pb));
    // sized() is called 1 + 2 + ... + 20 times from one place of main.
    assert_eq!(stacks.len(), 1, "{stacks:?}");
    assert_eq!(stacks[0].1, 210);
    assert_eq!(stacks[0].0[..2], ["sized", "main"], "{stacks:?}");
    assert_eq!(stacks, launch_stacks);
    assert!(boxes.contains(&"sized (210 hits, 100.00%)".to_string()), "{boxes:?}");
    assert_eq!(&boxes[1..], &launch_boxes[1..], "the same boxes (the title's pid aside)");
}
