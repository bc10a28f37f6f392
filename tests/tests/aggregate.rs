//! Aggregation: `--count` (per key with `--by`, cut with `--top`), `--hist`/`--lhist` and
//! `--latency`, reported at the end and every `--interval`. Counts equal the fixture's own
//! and the kernel's uprobe counts for the same definitions; every value lands in its bucket;
//! a function that sleeps lands where its own clock says; recursion, longjmp and C++
//! exceptions through timed frames; two threads; intervals; each refusal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use uprobe_tests::{compile, fixture, int3_only, nm_address, run_uprobe, tempfile, tracefs, Run};

fn program() -> PathBuf {
    fixture("aggregate", &["-O1", "-g", "-fno-inline", "-pthread", "-Wall", "-Wextra"])
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

fn run(args: &[String]) -> Run {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run_uprobe(&refs);
    assert!(r.status.success(), "{args:?}: {}\n{}", r.stderr, r.output);
    r
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The report's JSON objects, each parsed by a real JSON parser.
fn objects(r: &Run) -> Vec<Value> {
    r.output
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn the<'a>(objects: &'a [Value], kind: &str, field: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o[field] == name && o.get("key").is_none())
        .unwrap_or_else(|| panic!("no {kind} {name} in {objects:?}"))
}

/// What the fixture printed about itself: "WORD NUMBER" pairs.
fn own_counts(stdout: &str) -> BTreeMap<String, u64> {
    let words: Vec<&str> = stdout.split_whitespace().collect();
    words.chunks(2).filter_map(|p| Some((p[0].to_string(), p.get(1)?.parse().ok()?))).collect()
}

/// Counts of the same probes by the kernel: tracefs uprobe events on a copy of the fixture
/// (other tests run the fixture meanwhile), counted in `uprobe_profile`, their records
/// filtered out so that the trace stays clean.
fn kernel_counts(program: &Path, probes: &[(&str, &str)], mode: &str) -> Result<BTreeMap<String, u64>, String> {
    let root = tracefs()?;
    let copy = tempfile("aggregate_kernel");
    uprobe_tests::copy_program(program, &copy);
    let group = format!("uprag{}", std::process::id());
    let append = |file: &str, line: &str| -> Result<(), String> {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(root.join(file))
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
            .map_err(|e| format!("{file}: {e}"))
    };
    let defs: Vec<String> = probes
        .iter()
        .map(|(kind, f)| format!("{kind}:{group}/{kind}_{f} {}:{:#x}", copy.display(), nm_address(&copy, f)))
        .collect();
    let result = (|| {
        for d in &defs {
            append("uprobe_events", d)?;
        }
        append(&format!("events/{group}/filter"), "common_pid == 0")?;
        append(&format!("events/{group}/enable"), "1")?;
        let out = std::process::Command::new(&copy).arg(mode).output().map_err(|e| e.to_string())?;
        append(&format!("events/{group}/enable"), "0")?;
        if !out.status.success() {
            return Err(format!("the copy failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let profile = std::fs::read_to_string(root.join("uprobe_profile")).map_err(|e| e.to_string())?;
        let copy_name = copy.display().to_string();
        Ok(profile
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && f[0] == copy_name).then(|| (f[1].to_string(), f[2].parse().unwrap_or(0)))
            })
            .collect())
    })();
    let _ = append(&format!("events/{group}/enable"), "0");
    for d in &defs {
        let name = d.split_whitespace().next().unwrap_or("").split_once(':').map_or("", |(_, n)| n);
        let _ = append("uprobe_events", &format!("-:{name}"));
    }
    let _ = std::fs::remove_file(&copy);
    result
}

#[test]
fn counts_equal_the_programs_own_and_the_kernels() {
    let p = path_str(&program());
    let r = run(&args(&[
        "--count",
        "--format",
        "json",
        "-e",
        &format!("p:agg/tick {p}:tick"),
        "-e",
        &format!("p:agg/sized {p}:sized"),
        "-e",
        &format!("r:agg/value_ret {p}:value"),
        &p,
        "counts",
    ]));
    let own = own_counts(&r.stdout);
    assert_eq!((own["tick"], own["sized"], own["value"]), (1000, 210, 1004), "{}", r.stdout);
    let o = objects(&r);
    assert_eq!(o.len(), 3, "{}", r.output);
    let ours: BTreeMap<String, u64> =
        o.iter().map(|o| (o["event"].as_str().unwrap().to_string(), o["count"].as_u64().unwrap())).collect();
    assert_eq!(ours["tick"], own["tick"]);
    assert_eq!(ours["sized"], own["sized"]);
    assert_eq!(ours["value_ret"], own["value"]);
    assert!(o.iter().all(|o| o["group"] == "agg" && o["pid"].as_i64().unwrap() > 0));

    // The same, as text: one table, largest first.
    let r = run(&args(&["--count", "-e", &format!("p {p}:tick"), "-e", &format!("p {p}:sized"), &p, "counts"]));
    assert_eq!(r.output, "EVENT        COUNT\ntick          1000\nsized          210\n\n");

    let kernel = match kernel_counts(&program(), &[("p", "tick"), ("p", "sized"), ("r", "value")], "counts") {
        Ok(k) => k,
        Err(why) => {
            println!("SKIPPED: kernel parity: {why}");
            return;
        }
    };
    assert_eq!(kernel.get("p_tick"), Some(&ours["tick"]), "kernel: {kernel:?}");
    assert_eq!(kernel.get("p_sized"), Some(&ours["sized"]), "kernel: {kernel:?}");
    assert_eq!(kernel.get("r_value"), Some(&ours["value_ret"]), "kernel: {kernel:?}");
}

#[test]
fn events_of_two_groups_that_share_a_name_are_told_apart() {
    let p = path_str(&program());
    let r =
        run(&args(&["--count", "-e", &format!("p:a/ev {p}:tick"), "-e", &format!("p:b/ev {p}:sized"), &p, "counts"]));
    let table: Vec<&str> = r.output.lines().skip_while(|l| !l.starts_with("EVENT")).take(3).collect();
    assert_eq!(table, ["EVENT        COUNT", "a:ev          1000", "b:ev           210"], "{}", r.output);
}

#[test]
fn counts_by_an_argument_follow_its_distribution() {
    let p = path_str(&program());
    let def = format!("p {p}:sized size=%di:u32");
    let r = run(&args(&["--count", "--by", "size", "--format", "json", "-e", &def, &p, "counts"]));
    let o = objects(&r);
    let total = the(&o, "count", "event", "sized");
    assert_eq!(
        (total["count"].as_u64(), total["keys"].as_u64(), total["by"].as_str()),
        (Some(210), Some(20), Some("size"))
    );
    let rows: Vec<(u64, u64)> = o
        .iter()
        .filter(|o| o.get("key").is_some())
        .map(|o| (o["key"].as_u64().unwrap(), o["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(rows, (1..=20).rev().map(|v| (v, v)).collect::<Vec<_>>(), "each size v is passed v times");

    // An event without the argument is counted as a whole.
    let tick = format!("p {p}:tick");
    let r = run(&args(&["--count", "--by", "size", "--top", "3", "-e", &def, "-e", &tick, &p, "counts"]));
    assert_eq!(
        r.output,
        "count sized by size: 210 hits, 20 keys\n  size        COUNT\n  20             20\n  19             19\n  18             18\n  (17 more keys: 153 hits)\n\n\
         EVENT        COUNT\ntick          1000\n\n"
    );

    // The caller: every call comes from one place in main.
    let r = run(&args(&["--count", "--by", "caller", "--format", "json", "-e", &format!("p {p}:tick"), &p, "counts"]));
    let row = objects(&r).into_iter().find(|o| o.get("key").is_some()).unwrap();
    assert!(row["key"].as_str().unwrap().starts_with("main+0x"), "{row}");
    assert_eq!(row["count"], 1000);

    // A string argument.
    let t = fixture("trace_target", &["-O1", "-g", "-fno-inline", "-pthread", "-Wall", "-Wextra"]);
    let t = path_str(&t);
    let r = run(&args(&["--count", "--by", "who", "-e", &format!("p {t}:greet who=+0(%di):string"), &t, "basic"]));
    assert!(r.output.contains("count greet by who: 3 hits, 1 key\n"), "{}", r.output);
    assert!(r.output.contains("\n  hello            3\n"), "{}", r.output);
}

/// The log2 bucket ([low, high)) of a value, as bpftrace's hist() has it.
fn log2_bounds(v: i64) -> (Option<i64>, Option<i64>) {
    match v {
        v if v < 0 => (None, Some(0)),
        0 => (Some(0), Some(1)),
        v => {
            let k = 63 - v.leading_zeros();
            (Some(1 << k), Some(1 << (k + 1)))
        }
    }
}

fn buckets(o: &Value) -> Vec<(Option<i64>, Option<i64>, u64)> {
    o["buckets"].as_array().unwrap().iter().map(|b| (b[0].as_i64(), b[1].as_i64(), b[2].as_u64().unwrap())).collect()
}

#[test]
fn histograms_hold_every_value_in_its_bucket() {
    let p = path_str(&program());
    let r = run(&args(&[
        "--format",
        "json",
        "--hist",
        "value.v",
        "--lhist",
        "value.v,0,500,100",
        "-e",
        &format!("p {p}:value v=%di:s64"),
        &p,
        "counts",
    ]));
    let values: Vec<i64> = (-3..=1000).collect();
    let o = objects(&r);
    let hists: Vec<&Value> = o.iter().filter(|o| o["kind"] == "hist").collect();
    assert_eq!(hists.len(), 2, "{}", r.output);
    for h in &hists {
        assert_eq!(h["count"].as_u64(), Some(values.len() as u64), "the total is the count: {h}");
        assert_eq!(h["faults"], 0);
        assert_eq!(buckets(h).iter().map(|b| b.2).sum::<u64>(), values.len() as u64);
    }
    let mut expected: BTreeMap<(Option<i64>, Option<i64>), u64> = BTreeMap::new();
    for &v in &values {
        *expected.entry(log2_bounds(v)).or_default() += 1;
    }
    let log2: BTreeMap<(Option<i64>, Option<i64>), u64> =
        buckets(hists[0]).into_iter().filter(|b| b.2 > 0).map(|(l, h, c)| ((l, h), c)).collect();
    assert_eq!(log2, expected);
    assert_eq!(
        buckets(hists[1]),
        [
            (None, Some(0), 3),
            (Some(0), Some(100), 100),
            (Some(100), Some(200), 100),
            (Some(200), Some(300), 100),
            (Some(300), Some(400), 100),
            (Some(400), Some(500), 100),
            (Some(500), None, 501)
        ]
    );
    assert_eq!(
        (hists[1]["min"].as_i64(), hists[1]["max"].as_i64(), hists[1]["step"].as_i64()),
        (Some(0), Some(500), Some(100))
    );

    // As text, bpftrace's layout.
    let r = run(&args(&["--lhist", "value.v,0,500,100", "-e", &format!("p {p}:value v=%di:s64"), &p, "counts"]));
    let bar = |n: usize| format!("|{:<52}|", "@".repeat(n));
    let expected = format!(
        "lhist value.v,0,500,100: 1004 values\n\
         (..., 0)               3 {}\n\
         [0, 100)             100 {}\n\
         [100, 200)           100 {}\n\
         [200, 300)           100 {}\n\
         [300, 400)           100 {}\n\
         [400, 500)           100 {}\n\
         [500, ...)           501 {}\n\n",
        bar(0),
        bar(10),
        bar(10),
        bar(10),
        bar(10),
        bar(10),
        bar(52)
    );
    assert_eq!(r.output, expected);
}

#[test]
fn latency_of_a_sleeping_function_lands_in_its_bucket() {
    let p = path_str(&program());
    let calls = 8;
    let r = run(&args(&["--format", "json", "--latency", &format!("{p}:nap"), &p, "nap", &calls.to_string(), "1200"]));
    // The call as the function measures itself (from its first statement to its last) and
    // as its caller does (around the call): the probes' time lies between the two.
    let spans: Vec<(u64, u64)> = r
        .stdout
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].parse().unwrap(), f[3].parse().unwrap())
        })
        .collect();
    assert_eq!(spans.len(), calls);
    let o = objects(&r);
    let lat = the(&o, "latency", "function", "nap");
    assert_eq!(lat["probe"], if int3_only() { "int3" } else { "jump" }, "{lat}");
    assert_eq!(lat["count"].as_u64(), Some(calls as u64), "{lat}");
    assert_eq!(lat["entered"].as_u64(), Some(calls as u64));
    assert_eq!(lat["not_returned"]["total"], 0);
    let (min, max, total) =
        (lat["min_ns"].as_u64().unwrap(), lat["max_ns"].as_u64().unwrap(), lat["total_ns"].as_u64().unwrap());
    assert!(min >= spans.iter().map(|s| s.0).min().unwrap() && min >= 1_200_000, "{lat} {spans:?}");
    assert!(max <= spans.iter().map(|s| s.1).max().unwrap(), "{lat} {spans:?}");
    let (inner, outer): (u64, u64) = (spans.iter().map(|s| s.0).sum(), spans.iter().map(|s| s.1).sum());
    assert!(inner <= total && total <= outer, "{inner} <= {total} <= {outer}");
    assert_eq!(lat["mean_ns"].as_u64(), Some(total / calls as u64));
    let b = buckets(lat);
    assert_eq!(b.iter().map(|b| b.2).sum::<u64>(), calls as u64);
    for (low, high, count) in b {
        let (low, high) = (low.unwrap() as u64, high.unwrap() as u64);
        let surely = spans.iter().filter(|s| low <= s.0 && s.1 < high).count() as u64;
        let maybe = spans.iter().filter(|s| s.0 < high && s.1 >= low).count() as u64;
        assert!(surely <= count && count <= maybe, "[{low}, {high}): {count} not in {surely}..={maybe}: {spans:?}");
    }
    // 1.2 ms is in [1M, 2M) = [1048576, 2097152) ns unless the machine stalled the sleep.
    let typical = spans.iter().filter(|s| s.1 < 2_097_152).count();
    if typical == calls {
        assert_eq!(buckets(lat), [(Some(1 << 20), Some(1 << 21), calls as u64)]);
    }

    let r = run(&args(&["--latency", &format!("{p}:nap"), &p, "nap", "2", "1200"]));
    let first = r.output.lines().next().unwrap();
    assert!(first.starts_with("latency nap: 2 calls, total ") && first.ends_with(" ns"), "{first}");
}

#[test]
fn latency_under_recursion_times_every_level() {
    let p = path_str(&program());
    let r = run(&args(&["--format", "json", "--latency", &format!("{p}:rnap"), &p, "recurse", "3", "4"]));
    assert_eq!(r.stdout, "rnap 16\n");
    let o = objects(&r);
    let lat = the(&o, "latency", "function", "rnap");
    assert_eq!((lat["count"].as_u64(), lat["entered"].as_u64()), (Some(16), Some(16)), "{lat}");
    assert!(lat["min_ns"].as_u64().unwrap() >= 300_000, "every level holds the sleep at the bottom: {lat}");
    assert_eq!(lat["not_returned"]["total"], 0);
}

#[test]
fn calls_left_by_longjmp_or_an_exception_are_reported_not_timed() {
    let p = path_str(&program());
    let r = run(&args(&["--format", "json", "--latency", &format!("{p}:jumper"), &p, "jump", "5"]));
    assert_eq!(r.stdout, "jumper returned 5 jumped 5\n");
    let lat = the(&objects(&r), "latency", "function", "jumper").clone();
    assert_eq!((lat["count"].as_u64(), lat["entered"].as_u64()), (Some(5), Some(10)), "{lat}");
    let left = &lat["not_returned"];
    assert_eq!(left["total"], 5, "{lat}");
    assert_eq!(left["left"].as_u64().unwrap() + left["pending"].as_u64().unwrap(), 5, "{lat}");
    assert_eq!(lat["buckets"].as_array().unwrap().iter().map(|b| b[2].as_u64().unwrap()).sum::<u64>(), 5);

    let x = compile(
        "g++",
        "aggregate_except",
        &["fixtures/aggregate_except.cc"],
        &["-O1", "-g", "-fno-inline", "-Wall", "-Wextra"],
    );
    let x = path_str(&x);
    let mut a = vec!["--format".to_string(), "json".into()];
    for f in ["thrower", "catcher", "outer"] {
        a.extend(["--latency".to_string(), format!("{x}:{f}")]);
    }
    a.push(x.clone());
    let r = run(&a);
    assert_eq!(r.stdout, "thrower 6 catcher 6 outer 3 caught 3\n");
    let o = objects(&r);
    for (f, returned, left) in [("thrower", 6, 6), ("catcher", 6, 0), ("outer", 3, 3)] {
        let lat = the(&o, "latency", "function", f);
        assert_eq!(lat["count"].as_u64(), Some(returned), "{lat}");
        assert_eq!(lat["entered"].as_u64(), Some(returned + left), "{lat}");
        assert_eq!(lat["not_returned"]["total"].as_u64(), Some(left), "{lat}");
        assert_eq!(lat["not_returned"]["left"].as_u64(), Some(left), "{lat}");
    }
    let r = run(&args(&["--latency", &format!("{x}:outer"), &x]));
    assert!(r.output.contains("\n(3 calls did not return: 3 left by longjmp or an exception)\n"), "{}", r.output);

    // A call still running on another thread when the process ends.
    let r = run(&args(&["--latency", &format!("{p}:stuck"), &p, "stuck"]));
    assert_eq!(r.stdout, "stuck 1\n");
    let trap =
        if int3_only() { "(an int3 probe: each time includes the return from its trap; see --verbose)\n" } else { "" };
    assert_eq!(
        r.output,
        format!(
            "latency stuck: 0 calls, total 0 ns, min -, mean -, max -\n{trap}\
             (1 call did not return: 1 still running on other threads or in processes that ended)\n\n"
        )
    );
}

#[test]
fn two_threads_count_their_own_calls() {
    let p = path_str(&program());
    let tick = format!("p {p}:tick");
    let r = run(&args(&[
        "--count",
        "--by",
        "tid",
        "--format",
        "json",
        "-e",
        &tick,
        "--latency",
        &format!("{p}:nap"),
        &p,
        "threads",
        "1000",
    ]));
    assert_eq!(r.stdout, "tick 3000 nap 4\n");
    let o = objects(&r);
    let keyed = |kind: &str| -> Vec<&serde_json::Value> {
        o.iter().filter(|o| o["kind"] == kind && o.get("key").is_some()).collect()
    };
    let mut per_thread: Vec<u64> = keyed("count").iter().map(|o| o["count"].as_u64().unwrap()).collect();
    per_thread.sort();
    assert_eq!(per_thread, [1000, 2000]);
    assert!(keyed("count").iter().all(|o| o["key"].as_i64().unwrap() > 0));
    // The timed calls are split by thread too.
    assert_eq!(keyed("latency").iter().map(|o| o["count"].as_u64().unwrap()).sum::<u64>(), 4);
    assert!(keyed("latency").iter().all(|o| o["key"].as_i64().unwrap() > 0));
    assert_eq!(the(&o, "count", "event", "tick")["count"], 3000);
    let nap = the(&o, "latency", "function", "nap");
    assert_eq!((nap["count"].as_u64(), nap["entered"].as_u64()), (Some(4), Some(4)));
    assert!(nap["min_ns"].as_u64().unwrap() >= 200_000);

    // By name: the threads are gone when the report is written, their names are not.
    let r = run(&args(&["--count", "--by", "comm", "-e", &tick, &p, "threads", "1000"]));
    assert_eq!(r.output, "count tick by comm: 3000 hits, 2 keys\n  comm           COUNT\n  agg-two         2000\n  agg-one         1000\n\n");
}

/// The JSON reports of a run, grouped by interval number (in order).
fn intervals(o: &[Value]) -> Vec<(u64, Vec<&Value>)> {
    let mut by: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for x in o {
        by.entry(x["interval"].as_u64().expect("interval reports carry their number")).or_default().push(x);
    }
    by.into_iter().collect()
}

#[test]
fn interval_reports_add_up_to_the_run() {
    let p = path_str(&program());
    let common = ["--format", "json", "--interval", "0.25", "--count", "-e"];
    let mut a = args(&common);
    a.extend([
        format!("p {p}:tick"),
        "--latency".into(),
        format!("{p}:tick"),
        p.clone(),
        "ticker".into(),
        "12".into(),
        "100".into(),
    ]);
    let r = run(&a);
    assert_eq!(r.stdout, "tick 12\n");
    let o = objects(&r);
    let reports = intervals(&o);
    assert!(reports.len() >= 3, "1.2 s in 0.25 s intervals: {}", r.output);
    assert_eq!(reports.iter().map(|(i, _)| *i).collect::<Vec<_>>(), (1..=reports.len() as u64).collect::<Vec<_>>());
    let count =
        |objs: &[&Value], kind: &str| objs.iter().find(|x| x["kind"] == kind).unwrap()["count"].as_u64().unwrap();
    assert_eq!(reports.iter().map(|(_, x)| count(x, "count")).sum::<u64>(), 12, "each interval its own: {}", r.output);
    assert_eq!(reports.iter().map(|(_, x)| count(x, "latency")).sum::<u64>(), 12);
    assert!(reports.iter().any(|(_, x)| count(x, "count") > 0 && count(x, "count") < 12));
    for (_, x) in &reports {
        let lat = x.iter().find(|x| x["kind"] == "latency").unwrap();
        let calls = lat["count"].as_u64().unwrap();
        assert_eq!(lat["min_ns"].is_null(), calls == 0, "{lat}");
        if calls > 0 {
            assert!(
                lat["min_ns"].as_u64() <= lat["max_ns"].as_u64() && lat["max_ns"].as_u64().unwrap() < 100_000_000,
                "{lat}"
            );
        }
    }

    let mut a = args(&common);
    a.insert(0, "--cumulative".to_string());
    a.extend([format!("p {p}:tick"), p.clone(), "ticker".into(), "12".into(), "100".into()]);
    let r = run(&a);
    let counts: Vec<u64> = intervals(&objects(&r)).iter().map(|(_, x)| count(x, "count")).collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "cumulative: {counts:?}");
    assert_eq!(counts.last(), Some(&12));

    let r = run(&args(&["--interval", "0.25", "--count", "-e", &format!("p {p}:tick"), &p, "ticker", "4", "100"]));
    let headers: Vec<&str> = r.output.lines().filter(|l| l.starts_with("interval ")).collect();
    assert!(headers.len() >= 2 && headers[0].starts_with("interval 1: 0.000-0.2"), "{}", r.output);
    assert!(headers.last().unwrap().ends_with(" s (end of run)"), "{}", r.output);
}

#[test]
fn what_does_not_fit_is_refused_before_the_program_starts() {
    let p = path_str(&program());
    let value = format!("p {p}:value v=%di");
    let cases: Vec<(Vec<String>, String)> = vec![
        (args(&["--hist", "nosuch.v", "-e", &value]), "uprobe-run: --hist 'nosuch.v': no event named nosuch (events: value)".into()),
        (args(&["--hist", "value.w", "-e", &value]), "uprobe-run: --hist 'value.w': event value has no argument w (its arguments: v)".into()),
        (args(&["--lhist", "value.v,0,10,3", "-e", &value]), "uprobe-run: --lhist 'value.v,0,10,3': expected a STEP above 0 that divides MAX - MIN".into()),
        (args(&["--count", "--by", "w", "-e", &value]), "uprobe-run: --by 'w': no event has an argument w (event value has none), and w is not tid, comm, caller or ustack".into()),
        (
            args(&["--hist", "value.v", "-e", &value, "-e", &format!("p {p}:tick")]),
            format!("uprobe-run: event tick ('p {p}:tick') is neither counted nor in a histogram: add --count, or --hist tick.ARG"),
        ),
        (args(&["--latency", &format!("{p}:nosuch")]), format!("uprobe-run: --latency '{p}:nosuch': at column 1: expected a function named \"nosuch\" in {p}")),
        (args(&["--count", "--top", "2", "--by", "tid"]), "uprobe-run: --count: no events to count (define them with -e or --events)".into()),
        (args(&["--by", "tid", "-e", &value]), "uprobe-run: --by: splits a report: it needs --count, --hist, --lhist or --latency".into()),
    ];
    for (mut a, expected) in cases {
        a.extend([p.clone(), "counts".into()]);
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        let r = run_uprobe(&refs);
        assert_eq!(r.status.code(), Some(2), "{a:?}: {}", r.stderr);
        assert_eq!(r.stdout, "", "{a:?}: the program must not start");
        assert_eq!(r.stderr, format!("{expected}\n"), "{a:?}");
    }
}
