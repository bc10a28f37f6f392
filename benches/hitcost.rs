//! `cargo bench --bench hitcost`: what one probe hit costs under uprobe-run, ptrace-based
//! breakpoint engines and kernel uprobes, next to no probe and the bare SIGTRAP round trip.
//! Measures and reports; asserts nothing about speed. See benches/README.md.
//!
//! Environment:
//!   HITCOST_RUNS  runs per row (default 5); the median is reported
//!   HITCOST_MS    target length of one run in ms (default 250; ptrace rows 4x, ptrace-ool 2x):
//!                 hits per run are sized from a short calibration run of each row
//!   HITCOST_N     fixed hits per run for every row instead (per thread)
//!   HITCOST_NO_BUILD=1  measure target/release/uprobe-run and libuprobe.so as they are,
//!                 without running `cargo build --release` first
//!   HITCOST_ONLY  comma-separated engines to run (sigtrap, int3, jump, kernel, ptrace-ool,
//!                 ptrace, ptrace-xcpu), `startup`, `attach` and/or `trace` (an event with a
//!                 register and a string fetcharg: uprobe-run -e against the kernel's trace
//!                 event) and/or `aggregate` (uprobe-run --count and --latency against the
//!                 counting handler, an entry+return probe with empty handlers and kernel
//!                 uprobes) and/or `fork` (what a forked child's life costs with the runtime:
//!                 fork, _exit, waitpid) and/or `stacks` (a stack of depth 8 and 30 as a key:
//!                 uprobe-run --count --by ustack against --count, perf record --call-graph
//!                 dwarf and bpftrace's @[ustack]); the baseline rows always run

use std::fs;
use std::str::FromStr;
use uprobe_bench::attach::{self, AttachRow};
use uprobe_bench::engines::kernel::KernelProbes;
use uprobe_bench::engines::uprobe_run::UprobeRun;
use uprobe_bench::engines::{plain, Engine, Engines, Failure, Job, Kind, Measurement};
use uprobe_bench::fixture::{self, Paths, FUNCTIONS, GENERATED_FUNCTIONS};
use uprobe_bench::machine::Machine;
use uprobe_bench::report::{fmt_ns, HitRow, Report, StartupRow};
use uprobe_bench::stats;
use uprobe_contracts::elf;

fn env_or<T: FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("hitcost: ignoring {name}={v}: not a number");
            default
        }),
        Err(_) => default,
    }
}

struct Settings {
    runs: usize,
    target_ms: f64,
    fixed_hits: Option<u64>,
    only: Option<Vec<String>>,
}

impl Settings {
    fn from_env() -> Settings {
        Settings {
            runs: env_or("HITCOST_RUNS", 5usize).max(1),
            target_ms: env_or("HITCOST_MS", 250.0f64).max(1.0),
            fixed_hits: std::env::var("HITCOST_N").ok().and_then(|v| v.trim().parse().ok()).filter(|n| *n > 0),
            only: std::env::var("HITCOST_ONLY")
                .ok()
                .map(|v| v.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()),
        }
    }

    fn wanted(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|only| only.iter().any(|o| o == name))
    }

    fn target_ns(&self, engine: Engine) -> f64 {
        let scale = match engine {
            Engine::Ptrace | Engine::PtraceXcpu => 4.0,
            Engine::PtraceOol => 2.0,
            _ => 1.0,
        };
        self.target_ms * 1e6 * scale
    }
}

/// The hit-cost rows, in report order.
fn plan(settings: &Settings) -> Vec<HitRow> {
    let mut rows = Vec::new();
    if settings.wanted("sigtrap") {
        rows.push(HitRow::new(Engine::Sigtrap, Kind::Trap, "-", 1));
    }
    for f in FUNCTIONS {
        rows.push(HitRow::new(Engine::None, Kind::Call, f, 1));
    }
    let probed = [Engine::Int3, Engine::Jump, Engine::Kernel, Engine::PtraceOol, Engine::Ptrace, Engine::PtraceXcpu];
    for f in FUNCTIONS {
        for kind in Kind::PROBES {
            for engine in probed {
                // The cross-CPU variant only shows what placement costs: entry rows suffice.
                let shown = engine != Engine::PtraceXcpu || kind == Kind::Entry;
                if shown && settings.wanted(engine.name()) {
                    rows.push(HitRow::new(engine, kind, f, 1));
                }
            }
        }
    }
    // Signal delivery itself slows down when threads of one process trap at once: the bare
    // round trip with 2 threads tells that apart from what a probe engine adds.
    if settings.wanted("sigtrap") {
        rows.push(HitRow::new(Engine::Sigtrap, Kind::Trap, "-", 2));
    }
    rows.push(HitRow::new(Engine::None, Kind::Call, "f_push", 2));
    for engine in [Engine::Int3, Engine::Jump, Engine::Kernel] {
        if settings.wanted(engine.name()) {
            rows.push(HitRow::new(engine, Kind::Entry, "f_push", 2));
        }
    }
    rows
}

fn job(row: &HitRow, hits: u64) -> Job {
    Job { engine: row.engine, kind: row.kind, function: row.function, threads: row.threads, hits }
}

fn describe(row: &HitRow) -> String {
    format!(
        "{} {} {}{}",
        row.engine.name(),
        row.kind.name(),
        row.function,
        if row.threads > 1 { format!(" x{}", row.threads) } else { String::new() }
    )
}

/// Sizes every row with a short run, then makes `runs` passes over all rows (interleaved, so
/// that slow drift of the machine spreads over every row alike).
fn measure(engines: &Engines, rows: &mut [HitRow], settings: &Settings) {
    for row in rows.iter_mut() {
        if let Some(reason) = engines.unavailable(row.engine) {
            row.failure = Some(Failure::Unavailable(reason));
            continue;
        }
        if let Some(n) = settings.fixed_hits {
            row.hits_per_run = n;
            continue;
        }
        match engines.run(&job(row, row.engine.calibration_hits())) {
            Ok(m) => {
                row.hits_per_run = stats::hits_for(settings.target_ns(row.engine), m.ns_per_call(), 1_000, 500_000_000);
            }
            Err(f) => {
                eprintln!("hitcost: {}: {}", describe(row), f.reason());
                row.failure = Some(f);
            }
        }
    }
    for pass in 1..=settings.runs {
        for row in rows.iter_mut().filter(|r| r.failure.is_none()) {
            match engines.run(&job(row, row.hits_per_run)) {
                Ok(m) => {
                    eprintln!(
                        "hitcost: [{pass}/{}] {:<30} {:>12} ns/call  ({} calls)",
                        settings.runs,
                        describe(row),
                        fmt_ns(m.ns_per_call()),
                        row.hits_per_run
                    );
                    row.samples.push(m.ns_per_call());
                    row.rss_kb.push(m.rss_kb);
                    row.strategy = m.strategy;
                }
                Err(f) => {
                    eprintln!("hitcost: {}: {}", describe(row), f.reason());
                    row.failure = Some(f);
                }
            }
        }
    }
}

/// The path of the libc.so.6 this process runs with.
fn libc_path() -> Option<String> {
    let maps = fs::read_to_string("/proc/self/maps").ok()?;
    uprobe_contracts::maps::parse(&maps).into_iter().map(|m| m.path).find(|p| p.ends_with("/libc.so.6"))
}

/// Writes the probe list for "every function of libc.so.6" and returns (path, count).
fn libc_probe_file(engines: &Engines) -> Result<(String, usize), String> {
    let libc = libc_path().ok_or("libc.so.6 not found in /proc/self/maps")?;
    let data = fs::read(&libc).map_err(|e| format!("{libc}: {e}"))?;
    let names = elf::exported_functions(&data).map_err(|e| format!("{libc}: {e}"))?;
    let list: String = names.iter().map(|n| format!("libc.so.6:{n}\n")).collect();
    let path = engines.scratch.join("libc-probes.txt");
    fs::write(&path, list).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((path.display().to_string(), names.len()))
}

/// How one start-up row runs `hitloop idle`.
enum Launch {
    /// The program alone.
    Plain,
    /// Under uprobe-run with bench_handler.so and these parameters; `true`: `--no-optimize`.
    UprobeRun(Vec<(&'static str, String)>, bool),
    /// Not at all (the row carries why).
    Never,
}

fn measure_startup(engines: &Engines, settings: &Settings) -> Vec<StartupRow> {
    let new_row = |label: String| StartupRow {
        label,
        samples_ms: Vec::new(),
        rss_kb: Vec::new(),
        handler: None,
        stats: None,
        failure: None,
    };
    // With a trap-free path, registration does more work (decoding whole functions): the
    // largest sets are also timed with int3 only.
    let int3_too = engines.uprobe_run.as_ref().is_ok_and(|u| u.no_optimize);
    let mut configs = vec![
        (new_row("program alone".into()), Launch::Plain),
        (new_row("uprobe-run, no probe".into()), Launch::UprobeRun(vec![], false)),
    ];
    for n in [1, 100, GENERATED_FUNCTIONS] {
        let label = format!("uprobe-run, {n} probe{}", if n == 1 { "" } else { "s" });
        let params = vec![("probes", n.to_string())];
        if n == GENERATED_FUNCTIONS && int3_too {
            configs.push((new_row(format!("{label}, --no-optimize")), Launch::UprobeRun(params.clone(), true)));
        }
        configs.push((new_row(label), Launch::UprobeRun(params, false)));
    }
    match libc_probe_file(engines) {
        Ok((path, count)) => {
            let label = format!("uprobe-run, libc.so.6: {count} probes");
            let params = vec![("probe_file", path)];
            if int3_too {
                configs.push((new_row(format!("{label}, --no-optimize")), Launch::UprobeRun(params.clone(), true)));
            }
            configs.push((new_row(label), Launch::UprobeRun(params, false)));
        }
        Err(e) => {
            let mut row = new_row("uprobe-run, libc.so.6: every function".into());
            row.failure = Some(Failure::Unavailable(e));
            configs.push((row, Launch::Never));
        }
    }
    let stdout = engines.scratch.join("run.stdout");
    for pass in 1..=settings.runs {
        for (row, launch) in configs.iter_mut() {
            if row.failure.is_some() {
                continue;
            }
            let result = match launch {
                Launch::Never => continue,
                Launch::Plain => {
                    plain::run_idle(&engines.fixture, &stdout).map(|(wall, m)| (wall, m.rss_kb, None, None))
                }
                Launch::UprobeRun(params, no_optimize) => match &engines.uprobe_run {
                    Err(e) => Err(Failure::Unavailable(e.clone())),
                    Ok(u) => u
                        .run_idle(&engines.fixture, params, *no_optimize, &engines.scratch)
                        .map(|r| (r.wall, r.rss_kb, Some(r.handler), r.stats)),
                },
            };
            match result {
                Ok((wall, rss, handler, stats)) => {
                    let ms = wall.as_secs_f64() * 1e3;
                    eprintln!("hitcost: [{pass}/{}] start-up {:<38} {ms:>9.2} ms", settings.runs, row.label);
                    row.samples_ms.push(ms);
                    row.rss_kb.push(rss);
                    row.handler = handler;
                    row.stats = stats;
                }
                Err(f) => {
                    eprintln!("hitcost: start-up {}: {}", row.label, f.reason());
                    row.failure = Some(f);
                }
            }
        }
    }
    configs.into_iter().map(|(row, _)| row).collect()
}

/// The event rows: (label, ns per hit over the plain call, median) for a counting jump probe,
/// then for each event (two fetchargs, then one) uprobe-run's and the kernel's trace event
/// with the same definition.
fn measure_trace(engines: &Engines, settings: &Settings) -> Vec<(String, Result<f64, String>)> {
    use uprobe_bench::engines::trace::{self, Args};
    let median = |f: &dyn Fn() -> Result<Measurement, Failure>| median_of(settings.runs, f);
    let job = |engine, hits| Job { engine, kind: Kind::Entry, function: "f_push", threads: 1, hits };
    let baseline = median(&|| engines.run(&job(Engine::None, 5_000_000)));
    let over = |r: Result<f64, String>| match (&baseline, r) {
        (Ok(b), Ok(v)) => Ok(v - b),
        (Err(e), _) => Err(e.clone()),
        (_, Err(e)) => Err(e),
    };
    let counting = over(median(&|| engines.run(&job(Engine::Jump, 5_000_000))));
    let mut rows = vec![("jump probe, counting handler (bench_handler.so)".into(), counting)];
    for (args, what) in [(Args::RegisterAndString, "a register and a string"), (Args::Register, "one register")] {
        let ours = over(match &engines.uprobe_run {
            Ok(u) => median(&|| trace::run_uprobe_run(&u.bin, &engines.fixture, args, 1_000_000, &engines.scratch)),
            Err(e) => Err(e.clone()),
        });
        let kernel = over(median(&|| trace::run_kernel(&engines.fixture, args, 200_000, &engines.scratch)));
        rows.push((format!("uprobe-run -e, {what} (jump probe)"), ours));
        rows.push((format!("kernel uprobe trace event, {what} (tracefs)"), kernel));
    }
    rows
}

fn print_trace(rows: &[(String, Result<f64, String>)], runs: usize, defs: &[String]) {
    println!("\nEvents: {}\n(ns/hit over the plain call, median of {runs})", defs.join("\n        "));
    let value = |i: usize| rows.get(i).and_then(|r| r.1.as_ref().ok().copied());
    for (i, (label, r)) in rows.iter().enumerate() {
        match r {
            Ok(ns) => {
                // Rows: the counting probe, then uprobe-run's and the kernel's of each event.
                let ratio = match i {
                    0 => None,
                    i if i % 2 == 1 => value(0).map(|c| format!("  {:.2}x the counting jump probe", ns / c)),
                    i => value(i - 1).map(|o| format!("  {:.1}x uprobe-run's event", ns / o)),
                };
                println!("  {label:<62} {:>10}{}", fmt_ns(*ns), ratio.unwrap_or_default());
            }
            Err(e) => println!("  {label:<62} unavailable: {e}"),
        }
    }
}

/// The attach rows: 1, 100 and every libc function entry (and the last with int3 only).
fn plan_attach(engines: &Engines) -> Vec<AttachRow> {
    let int3_too = engines.uprobe_run.as_ref().is_ok_and(|u| u.no_optimize);
    let mut rows = Vec::new();
    for n in [1, 100] {
        let label = format!("{n} probe{}", if n == 1 { "" } else { "s" });
        rows.push(AttachRow::new(label, vec![("probes", n.to_string())], false));
    }
    match libc_probe_file(engines) {
        Ok((path, count)) => {
            let label = format!("libc.so.6: {count} probes");
            if int3_too {
                rows.push(AttachRow::new(format!("{label}, --no-optimize"), vec![("probe_file", path.clone())], true));
            }
            rows.push(AttachRow::new(label, vec![("probe_file", path)], false));
        }
        Err(e) => {
            let mut row = AttachRow::new("libc.so.6: every function".into(), vec![], false);
            row.failure = Some(Failure::Unavailable(e));
            rows.push(row);
        }
    }
    rows
}

/// The fork rows: (label, µs per fork, `_exit` and `waitpid` of `hitloop forks`, median): the
/// program alone, with the runtime and no probe, and with every libc function probed. Under
/// uprobe-run each child ends as a process does, with its handlers' report; the row checks that
/// every child wrote one.
fn measure_forks(engines: &Engines, settings: &Settings) -> Vec<(String, Result<f64, String>)> {
    const FORKS: u64 = 300;
    let forks = FORKS.to_string();
    let args = ["forks", forks.as_str()];
    let stdout = engines.scratch.join("run.stdout");
    let us = |r: Result<f64, String>| r.map(|ns| ns / 1e3);
    let mut rows = vec![(
        "program alone".to_string(),
        us(median_of(settings.runs, &|| plain::run_mode(&engines.fixture, &args, &stdout).map(|(_, m)| m))),
    )];
    let under = |params: Vec<(&'static str, String)>| -> Result<f64, String> {
        let u = engines.uprobe_run.as_ref().map_err(Clone::clone)?;
        us(median_of(settings.runs, &|| {
            let (run, m) = u.run_mode(&engines.fixture, &params, false, &args, &engines.scratch)?;
            if run.reports as u64 != FORKS + 1 {
                return Err(Failure::Invalid(format!(
                    "{} handler reports for {FORKS} children and their parent",
                    run.reports
                )));
            }
            Ok(m)
        }))
    };
    rows.push(("uprobe-run, no probe".into(), under(vec![])));
    match libc_probe_file(engines) {
        Ok((path, count)) => {
            rows.push((format!("uprobe-run, libc.so.6: {count} probes"), under(vec![("probe_file", path)])))
        }
        Err(e) => rows.push(("uprobe-run, libc.so.6: every function".into(), Err(e))),
    }
    rows
}

fn print_forks(rows: &[(String, Result<f64, String>)], runs: usize) {
    println!("\nA child's life: fork, _exit(0), waitpid (µs per child, median of {runs})");
    let alone = rows.first().and_then(|r| r.1.as_ref().ok().copied());
    for (label, r) in rows {
        match r {
            Ok(us) => {
                let over = alone.filter(|_| !label.starts_with("program")).map(|a| format!("  +{:.0} µs", us - a));
                println!("  {label:<40} {us:>8.0} µs{}", over.unwrap_or_default());
            }
            Err(e) => println!("  {label:<40} unavailable: {e}"),
        }
    }
}

/// The median over `runs` runs of `f`'s ns per call.
fn median_of(runs: usize, f: &dyn Fn() -> Result<Measurement, Failure>) -> Result<f64, String> {
    let mut samples = Vec::new();
    for _ in 0..runs {
        samples.push(f().map_err(|e| e.reason().to_string())?.ns_per_call());
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// The aggregation rows: (label, ns per hit over the plain call, median), in the order
/// [`print_aggregate`] compares them.
fn measure_aggregate(engines: &Engines, settings: &Settings) -> Vec<(String, Result<f64, String>)> {
    use uprobe_bench::engines::aggregate;
    let runs = settings.runs;
    let job = |engine, kind, hits| Job { engine, kind, function: "f_push", threads: 1, hits };
    let baseline = median_of(runs, &|| engines.run(&job(Engine::None, Kind::Call, 5_000_000)));
    let over = |r: Result<f64, String>| match (&baseline, r) {
        (Ok(b), Ok(v)) => Ok(v - b),
        (Err(e), _) => Err(e.clone()),
        (_, Err(e)) => Err(e),
    };
    let ours = |f: &dyn Fn(&UprobeRun) -> Result<Measurement, Failure>| match &engines.uprobe_run {
        Ok(u) => over(median_of(runs, &|| f(u))),
        Err(e) => Err(e.clone()),
    };
    let (fixture, scratch) = (&engines.fixture, &engines.scratch);
    vec![
        (
            "jump probe, counting handler (bench_handler.so)".into(),
            over(median_of(runs, &|| engines.run(&job(Engine::Jump, Kind::Entry, 5_000_000)))),
        ),
        ("uprobe-run --count (jump probe)".into(), ours(&|u| aggregate::run_count(u, fixture, 5_000_000, scratch))),
        (
            "entry+return probe, empty handlers (bench_handler.so empty=1)".into(),
            ours(&|u| aggregate::run_empty(u, fixture, 2_000_000, scratch)),
        ),
        ("uprobe-run --latency (jump probe)".into(), ours(&|u| aggregate::run_latency(u, fixture, 2_000_000, scratch))),
        (
            "kernel uprobe, counted by perf".into(),
            over(median_of(runs, &|| engines.run(&job(Engine::Kernel, Kind::Entry, 200_000)))),
        ),
        (
            "kernel uprobe + uretprobe, counted by perf".into(),
            over(median_of(runs, &|| engines.run(&job(Engine::Kernel, Kind::EntryReturn, 200_000)))),
        ),
        (
            "jump probe, counting handler declared vector-free (novec=1)".into(),
            ours(&|u| aggregate::run_entry(u, fixture, "novec=1", 5_000_000, scratch)),
        ),
        (
            "uprobe-run --count, a one-comparison filter fails".into(),
            ours(&|u| aggregate::run_filtered(u, fixture, 5_000_000, false, scratch)),
        ),
        (
            "uprobe-run --count, a one-comparison filter passes".into(),
            ours(&|u| aggregate::run_filtered(u, fixture, 5_000_000, true, scratch)),
        ),
        (
            "uprobe-run --count --by tid,caller (a two-part key)".into(),
            ours(&|u| aggregate::run_two_part_key(u, fixture, 5_000_000, scratch)),
        ),
        (
            "jump probe, counting handler that adds a double (fp=1)".into(),
            ours(&|u| aggregate::run_entry(u, fixture, "fp=1", 5_000_000, scratch)),
        ),
        (
            "jump probe, empty handler without a locked add (empty=1)".into(),
            ours(&|u| aggregate::run_entry(u, fixture, "empty=1", 5_000_000, scratch)),
        ),
    ]
}

fn print_aggregate(rows: &[(String, Result<f64, String>)], runs: usize) {
    println!("\nAggregation on f_push (ns/hit over the plain call, median of {runs})");
    let value = |i: usize| rows.get(i).and_then(|r| r.1.as_ref().ok().copied());
    for (i, (label, r)) in rows.iter().enumerate() {
        match r {
            Ok(ns) => {
                let ratio = match i {
                    1 => value(0).map(|c| format!("  {:.2}x the counting handler", ns / c)),
                    3 => value(2).map(|e| format!("  {:.2}x the empty entry+return probe", ns / e)),
                    4 => value(1).map(|c| format!("  {:.1}x uprobe-run --count", ns / c)),
                    5 => value(3).map(|l| format!("  {:.1}x uprobe-run --latency", ns / l)),
                    6 => value(0).map(|c| format!("  {:.2}x the counting handler", ns / c)),
                    7..=9 => value(1).map(|c| format!("  {:.2}x uprobe-run --count", ns / c)),
                    10 | 11 => value(0).map(|c| format!("  {:.2}x the counting handler", ns / c)),
                    _ => None,
                };
                println!("  {label:<56} {:>10}{}", fmt_ns(*ns), ratio.unwrap_or_default());
            }
            Err(e) => println!("  {label:<56} unavailable: {e}"),
        }
    }
}

/// One stack row: its label and, per depth of [`stacks::DEPTHS`], CPU ns per hit over the
/// plain call through the same chain (median) and what the tool said of its stacks.
type StackRow = (String, Vec<Result<(f64, Option<String>), String>>);

/// The stack rows, for each depth: `--count`, `--count --by ustack`, perf and bpftrace.
fn measure_stacks(engines: &Engines, settings: &Settings) -> Vec<StackRow> {
    use uprobe_bench::engines::stacks::{self, StackRun};
    let (fixture, scratch) = (&engines.fixture, &engines.scratch);
    let median = |f: &dyn Fn() -> Result<StackRun, Failure>| -> Result<(f64, Option<String>), String> {
        let mut samples = Vec::new();
        let mut note = None;
        for _ in 0..settings.runs {
            let run = f().map_err(|e| e.reason().to_string())?;
            samples.push(run.cpu_ns_per_call);
            note = run.note;
        }
        samples.sort_by(f64::total_cmp);
        Ok((samples[samples.len() / 2], note))
    };
    let labels = [
        "uprobe-run --count (jump probe)",
        "uprobe-run --count --by ustack (jump probe)",
        "kernel uprobe, perf record --call-graph dwarf",
        "kernel uprobe, bpftrace @[ustack] = count()",
    ];
    let mut rows: Vec<StackRow> = labels.iter().map(|l| (l.to_string(), Vec::new())).collect();
    for depth in stacks::DEPTHS {
        let chain = match &engines.uprobe_run {
            Ok(u) => stacks::chain_for(u, fixture, depth, scratch).map_err(|e| e.reason().to_string()),
            Err(e) => Err(e.clone()),
        };
        let chain = match chain {
            Ok(c) => c,
            Err(e) => {
                rows.iter_mut().for_each(|r| r.1.push(Err(e.clone())));
                continue;
            }
        };
        eprintln!("hitcost: stacks of depth {depth}: {chain} chain functions");
        let base = median(&|| stacks::run_plain(fixture, 2_000_000, chain, scratch));
        let ours = |f: &dyn Fn(&UprobeRun) -> Result<StackRun, Failure>| match &engines.uprobe_run {
            Ok(u) => median(&|| f(u)),
            Err(e) => Err(e.clone()),
        };
        let results = [
            ours(&|u| stacks::run_count(u, fixture, 1_000_000, chain, scratch)),
            ours(&|u| stacks::run_ustack(u, fixture, 1_000_000, chain, depth, scratch)),
            median(&|| stacks::run_perf(fixture, 5_000, chain, scratch)),
            median(&|| stacks::run_bpftrace(fixture, 100_000, chain, scratch)),
        ];
        for (row, r) in rows.iter_mut().zip(results) {
            let over = match (&base, r) {
                (Ok(b), Ok((v, note))) => Ok((v - b.0, note)),
                (Err(e), _) => Err(e.clone()),
                (_, Err(e)) => Err(e),
            };
            if let Err(e) = &over {
                eprintln!("hitcost: {} at depth {depth}: {e}", row.0);
            }
            row.1.push(over);
        }
    }
    rows
}

fn print_stacks(rows: &[StackRow], runs: usize) {
    use uprobe_bench::engines::stacks::DEPTHS;
    println!(
        "\nStacks on f_push under a chain of calls built -fomit-frame-pointer\n\
         (CPU ns/hit of the looping thread over the plain call through the same chain, median of {runs})"
    );
    let header: String = DEPTHS.iter().map(|d| format!("{:>12}", format!("depth {d}"))).collect();
    println!("  {:<48}{header}", "");
    for (label, cells) in rows {
        let shown: String = cells
            .iter()
            .map(|c| match c {
                Ok((ns, _)) => format!("{:>12}", fmt_ns(*ns)),
                Err(_) => format!("{:>12}", "n/a"),
            })
            .collect();
        println!("  {label:<48}{shown}");
        for (depth, cell) in DEPTHS.iter().zip(cells) {
            match cell {
                Ok((_, Some(note))) => println!("      depth {depth}: {note}"),
                Err(e) => println!("      depth {depth}: unavailable: {e}"),
                Ok((_, None)) => {}
            }
        }
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs bench targets without it,
    // and a test run is no place for minutes of measurements.
    if !std::env::args().any(|a| a == "--bench") {
        println!("hitcost: measures only under `cargo bench --bench hitcost`; nothing to test");
        return;
    }
    let settings = Settings::from_env();
    let machine = Machine::probe();
    let paths = Paths::discover();
    eprintln!("hitcost: building the fixture into {}", paths.fixtures.display());
    let fixture = match fixture::build(&paths) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("hitcost: {e}");
            std::process::exit(1);
        }
    };
    let skip_build = std::env::var_os("HITCOST_NO_BUILD").is_some_and(|v| v != "0" && !v.is_empty());
    let uprobe_run = UprobeRun::prepare(&paths, &fixture, skip_build);
    if let Err(e) = &uprobe_run {
        eprintln!("hitcost: uprobe-run rows unavailable: {e}");
    }
    let engines = Engines { scratch: paths.fixtures.clone(), fixture, uprobe_run, kernel: KernelProbes::discover() };

    let mut rows = plan(&settings);
    measure(&engines, &mut rows, &settings);
    let startup = if settings.wanted("startup") { measure_startup(&engines, &settings) } else { Vec::new() };
    let trace_rows = if settings.wanted("trace") { measure_trace(&engines, &settings) } else { Vec::new() };
    let mut attach = Vec::new();
    if settings.wanted("attach") {
        attach = plan_attach(&engines);
        attach::measure(&engines.uprobe_run, &engines.fixture, &mut attach, settings.runs, &engines.scratch);
    }
    let aggregate_rows = if settings.wanted("aggregate") { measure_aggregate(&engines, &settings) } else { Vec::new() };
    let fork_rows = if settings.wanted("fork") { measure_forks(&engines, &settings) } else { Vec::new() };
    let stack_rows = if settings.wanted("stacks") { measure_stacks(&engines, &settings) } else { Vec::new() };

    let report_fixture = engines.fixture.clone();
    let report = Report { machine, runs: settings.runs, target_ms: settings.target_ms, rows, startup, attach };
    print!("{}", report.table());
    if !trace_rows.is_empty() {
        use uprobe_bench::engines::trace::{definition, Args};
        let defs =
            [Args::RegisterAndString, Args::Register].map(|args| definition(&report_fixture, args).unwrap_or_default());
        print_trace(&trace_rows, settings.runs, &defs);
    }
    if !aggregate_rows.is_empty() {
        print_aggregate(&aggregate_rows, settings.runs);
    }
    if !fork_rows.is_empty() {
        print_forks(&fork_rows, settings.runs);
    }
    if !stack_rows.is_empty() {
        print_stacks(&stack_rows, settings.runs);
    }
    let json_path = paths.target.join("hitcost.json");
    let svg_path = paths.target.join("hitcost.svg");
    for (path, text) in [(&json_path, uprobe_bench::json::pretty(&report.to_json())), (&svg_path, report.svg())] {
        match fs::write(path, text) {
            Ok(()) => println!("wrote {}", path.display()),
            Err(e) => eprintln!("hitcost: cannot write {}: {e}", path.display()),
        }
    }
}
