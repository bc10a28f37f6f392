//! The results: derived figures (cost over the baseline, rate, ratio to uprobe-run's int3
//! row), the table on stdout, `hitcost.json` and the `hitcost.svg` bar chart.

use crate::attach::{self, AttachRow};
use crate::engines::uprobe_run::{errno_name, HandlerReport, RuntimeStats};
use crate::engines::{Engine, Failure, Kind};
use crate::json::Json;
use crate::machine::Machine;
use crate::stats::Summary;
use std::fmt::Write as _;

/// One hit-cost row: every run of one (engine, kind, function, threads).
#[derive(Clone, Debug)]
pub struct HitRow {
    pub engine: Engine,
    pub kind: Kind,
    pub function: &'static str,
    pub threads: u32,
    /// Calls (or traps) per thread in each run.
    pub hits_per_run: u64,
    /// Wall ns per call of one thread, one value per run.
    pub samples: Vec<f64>,
    /// VmRSS at the end of each run.
    pub rss_kb: Vec<u64>,
    /// The probe strategy uprobe-run reported, for its rows.
    pub strategy: Option<String>,
    pub failure: Option<Failure>,
}

impl HitRow {
    pub fn new(engine: Engine, kind: Kind, function: &'static str, threads: u32) -> HitRow {
        HitRow {
            engine,
            kind,
            function,
            threads,
            hits_per_run: 0,
            samples: Vec::new(),
            rss_kb: Vec::new(),
            strategy: None,
            failure: None,
        }
    }

    /// What uprobe-run did differently from what the row's engine names, if anything.
    fn strategy_note(&self) -> Option<&str> {
        let s = self.strategy.as_deref()?;
        let expected = match self.engine {
            Engine::Int3 => "int3",
            Engine::Jump => "jump",
            _ => return None,
        };
        (s.split_whitespace().next() != Some(expected)).then_some(s)
    }

    fn function_label(&self) -> &str {
        if self.kind == Kind::Trap {
            "-"
        } else {
            self.function
        }
    }
}

/// One start-up row: whole-process wall time of `hitloop idle`.
#[derive(Clone, Debug)]
pub struct StartupRow {
    pub label: String,
    /// Wall ms per run.
    pub samples_ms: Vec<f64>,
    pub rss_kb: Vec<u64>,
    /// What the handler reported on the last run (None for the unprobed program).
    pub handler: Option<HandlerReport>,
    /// The runtime's counters on the last run (placement time, system calls, traps).
    pub stats: Option<RuntimeStats>,
    pub failure: Option<Failure>,
}

/// uprobe-run's int3 entry cost on one function against the bare SIGTRAP round trip.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SigtrapRatio {
    pub function: &'static str,
    pub ns_per_hit: f64,
    pub ns_per_hit_min: f64,
    /// Median over median.
    pub ratio: f64,
    /// Fastest run over fastest run: the figure least disturbed by other load.
    pub ratio_of_mins: f64,
}

/// Figures derived from a [`HitRow`] that has samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Derived {
    /// ns per call, as measured.
    pub raw: Summary,
    /// ns per call of the matching unprobed run (0 for sigtrap; None for the baseline itself).
    pub baseline: Option<f64>,
    /// ns per hit over the baseline (for `none`: the call itself).
    pub per_hit: Summary,
    /// Calls completed per second, all threads together.
    pub hits_per_sec: f64,
    /// per_hit / per_hit of uprobe-run's int3 row of the same kind, function and threads.
    pub ratio: Option<f64>,
}

pub struct Report {
    pub machine: Machine,
    pub runs: usize,
    pub target_ms: f64,
    pub rows: Vec<HitRow>,
    pub startup: Vec<StartupRow>,
    /// Attach and detach rows (see `attach`).
    pub attach: Vec<AttachRow>,
}

fn median_u64(v: &[u64]) -> Option<u64> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

impl Report {
    fn find(&self, engine: Engine, kind: Kind, function: &str, threads: u32) -> Option<&HitRow> {
        self.rows.iter().find(|r| {
            r.engine == engine
                && r.kind == kind
                && r.function == function
                && r.threads == threads
                && r.failure.is_none()
        })
    }

    fn raw(row: &HitRow) -> Option<Summary> {
        if row.failure.is_some() {
            return None;
        }
        Summary::of(&row.samples)
    }

    /// The unprobed ns per call that `row` is measured against.
    fn baseline(&self, row: &HitRow) -> Option<Option<f64>> {
        match row.engine {
            Engine::None => Some(None),
            Engine::Sigtrap => Some(Some(0.0)),
            _ => {
                let base = self.find(Engine::None, Kind::Call, row.function, row.threads)?;
                Some(Some(Self::raw(base)?.median))
            }
        }
    }

    fn per_hit(&self, row: &HitRow) -> Option<Summary> {
        let raw = Self::raw(row)?;
        Some(match self.baseline(row)? {
            Some(b) => raw.minus(b),
            None => raw,
        })
    }

    pub fn derived(&self, row: &HitRow) -> Option<Derived> {
        let raw = Self::raw(row)?;
        let baseline = self.baseline(row)?;
        let per_hit = self.per_hit(row)?;
        let ratio = match row.engine {
            Engine::None | Engine::Sigtrap => None,
            _ => self
                .find(Engine::Int3, row.kind, row.function, row.threads)
                .and_then(|r| self.per_hit(r))
                .filter(|s| s.median > 0.0)
                .map(|s| per_hit.median / s.median),
        };
        Some(Derived { raw, baseline, per_hit, hits_per_sec: f64::from(row.threads) * 1e9 / raw.median, ratio })
    }

    /// uprobe-run's int3 entry cost on each function against the bare SIGTRAP round trip.
    /// (function, int3 ns/hit median, its min, median/median ratio, min/min ratio). The
    /// min/min ratio is the one least disturbed by other load on the machine.
    pub fn sigtrap_ratios(&self) -> Vec<SigtrapRatio> {
        let Some(trap) = self.rows.iter().find(|r| r.engine == Engine::Sigtrap).and_then(|r| self.per_hit(r)) else {
            return Vec::new();
        };
        crate::fixture::FUNCTIONS
            .iter()
            .filter_map(|f| {
                let row = self.find(Engine::Int3, Kind::Entry, f, 1)?;
                let cost = self.per_hit(row)?;
                Some(SigtrapRatio {
                    function: f,
                    ns_per_hit: cost.median,
                    ns_per_hit_min: cost.min,
                    ratio: cost.median / trap.median,
                    ratio_of_mins: cost.min / trap.min,
                })
            })
            .collect()
    }

    /// (engine, kind, function, ns/hit with 1 thread, with 2 threads) where both exist.
    pub fn scaling(&self) -> Vec<(Engine, Kind, &'static str, f64, f64)> {
        self.rows
            .iter()
            .filter(|r| r.threads == 2)
            .filter_map(|r2| {
                let r1 = self.find(r2.engine, r2.kind, r2.function, 1)?;
                Some((r2.engine, r2.kind, r2.function, self.per_hit(r1)?.median, self.per_hit(r2)?.median))
            })
            .collect()
    }

    fn startup_base_ms(&self) -> Option<f64> {
        let first = self.startup.first()?;
        if first.handler.is_some() || first.failure.is_some() {
            return None;
        }
        Some(Summary::of(&first.samples_ms)?.median)
    }

    fn startup_base_rss(&self) -> Option<u64> {
        let first = self.startup.first()?;
        if first.handler.is_some() {
            return None;
        }
        median_u64(&first.rss_kb)
    }

    /// (label, VmRSS kB, kB added over the same program without the runtime).
    pub fn memory(&self) -> Vec<(String, u64, Option<i64>)> {
        let mut out = Vec::new();
        let idle = self.startup_base_rss();
        for s in &self.startup {
            if let (None, Some(rss)) = (&s.failure, median_u64(&s.rss_kb)) {
                let added = idle.filter(|_| s.handler.is_some()).map(|b| rss as i64 - b as i64);
                out.push((format!("idle, {}", s.label), rss, added));
            }
        }
        let loop_rss = |engine| {
            self.find(engine, if engine == Engine::None { Kind::Call } else { Kind::Entry }, "f_push", 1)
                .and_then(|r| median_u64(&r.rss_kb))
        };
        if let Some(plain) = loop_rss(Engine::None) {
            out.push(("hit loop, no probe".into(), plain, None));
            if let Some(probed) = loop_rss(Engine::Int3) {
                out.push(("hit loop, uprobe-run int3 entry probe".into(), probed, Some(probed as i64 - plain as i64)));
            }
        }
        out
    }

    pub fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "hitcost on {} (load average at start: {})", self.machine.summary(), self.machine.load);
        let _ = writeln!(
            t,
            "{} runs per row, median (min..max); ns/hit is over the unprobed call of the same \
             function and thread count; ratio is to uprobe-run's int3 row of the same kind",
            self.runs
        );
        let _ = writeln!(t);
        let header = format!(
            "{:<11} {:<12} {:<8} {:>3} {:>10} {:>21} {:>9} {:>8}",
            "engine", "kind", "function", "thr", "ns/hit", "(min..max)", "hits/s", "vs int3"
        );
        let _ = writeln!(t, "{header}");
        let _ = writeln!(t, "{}", "-".repeat(header.len()));
        let mut last_group: Option<String> = None;
        for row in &self.rows {
            let group = group_of(row);
            if last_group.as_ref().is_some_and(|g| *g != group) {
                let _ = writeln!(t);
            }
            last_group = Some(group);
            let lead = format!(
                "{:<11} {:<12} {:<8} {:>3}",
                row.engine.name(),
                row.kind.name(),
                row.function_label(),
                row.threads
            );
            match (&row.failure, self.derived(row)) {
                (Some(Failure::Unavailable(why)), _) => {
                    let _ = writeln!(t, "{lead}  unavailable: {why}");
                }
                (Some(Failure::Invalid(why)), _) => {
                    let _ = writeln!(t, "{lead}  invalid: {why}");
                }
                (None, None) => {
                    let _ = writeln!(t, "{lead}  no result (baseline missing)");
                }
                (None, Some(d)) => {
                    let range = if d.baseline.is_none() {
                        "baseline".to_owned()
                    } else {
                        format!("({}..{})", fmt_ns(d.per_hit.min), fmt_ns(d.per_hit.max))
                    };
                    let ratio = d.ratio.map_or("-".to_owned(), fmt_ratio);
                    let note = row.strategy_note().map_or(String::new(), |s| format!("  runtime chose {s}"));
                    let _ = writeln!(
                        t,
                        "{lead} {:>10} {:>21} {:>9} {:>8}{note}",
                        fmt_ns(d.per_hit.median),
                        range,
                        fmt_rate(d.hits_per_sec),
                        ratio
                    );
                }
            }
        }

        let ratios = self.sigtrap_ratios();
        if !ratios.is_empty() {
            let _ = writeln!(
                t,
                "\nint3 entry probe against the bare in-process SIGTRAP round trip (medians; fastest runs):"
            );
            for r in ratios {
                let _ = writeln!(
                    t,
                    "  {:<8} {:>10} ns/hit = {} the round trip;  fastest run {:>10} ns/hit = {}",
                    r.function,
                    fmt_ns(r.ns_per_hit),
                    fmt_ratio(r.ratio),
                    fmt_ns(r.ns_per_hit_min),
                    fmt_ratio(r.ratio_of_mins)
                );
            }
        }
        let scaling = self.scaling();
        if !scaling.is_empty() {
            let _ = writeln!(t, "\nScaling, 2 threads hitting the same probe (ns/hit per thread):");
            for (e, k, f, one, two) in scaling {
                let _ = writeln!(
                    t,
                    "  {:<10} {:<6} {:<8} 1 thread {:>9}   2 threads {:>9}   {}",
                    e.name(),
                    k.name(),
                    f,
                    fmt_ns(one),
                    fmt_ns(two),
                    if one > 0.0 { fmt_ratio(two / one) } else { "-".into() }
                );
            }
        }

        if !self.startup.is_empty() {
            let _ = writeln!(
                t,
                "\nStart-up (whole run of `hitloop idle`, median of {}; +: over the program alone):",
                self.runs
            );
            let base = self.startup_base_ms();
            for s in &self.startup {
                let _ = write!(t, "  {:<50}", s.label);
                if let Some(f) = &s.failure {
                    let kind = if matches!(f, Failure::Unavailable(_)) { "unavailable" } else { "invalid" };
                    let _ = writeln!(t, " {kind}: {}", f.reason());
                    continue;
                }
                let Some(ms) = Summary::of(&s.samples_ms) else {
                    let _ = writeln!(t, " no result");
                    continue;
                };
                let _ = write!(t, " {:>9.2} ms", ms.median);
                match (base, &s.handler) {
                    (Some(b), Some(_)) => {
                        let _ = write!(t, "  {:>+9.2} ms", ms.median - b);
                    }
                    (_, Some(_)) => {
                        let _ = write!(t, "{:14}", "");
                    }
                    _ => {}
                }
                if let Some(h) = &s.handler {
                    let _ = write!(t, "  registered {}", h.registered);
                    if h.failed > 0 {
                        let _ = write!(t, ", failed {} ({})", h.failed, errno_list(&h.failed_by_errno));
                    }
                }
                if let Some(r) = &s.stats {
                    let kinds = if r.syscalls_by_kind.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", r.syscalls_by_kind)
                    };
                    let _ = write!(
                        t,
                        "\n  {:<50}   placement {:.2} ms, {} syscalls{kinds}, {} maps read{}, {} SIGTRAPs in the runtime",
                        "",
                        r.placement_ms,
                        r.syscalls,
                        r.maps_reads,
                        if r.maps_reads == 1 { "" } else { "s" },
                        r.traps_in_runtime
                    );
                }
                let _ = writeln!(t);
            }
        }
        t.push_str(&attach::table(&self.attach, self.runs));
        let memory = self.memory();
        if !memory.is_empty() {
            let _ = writeln!(t, "\nResident memory at exit (VmRSS):");
            for (label, rss, added) in memory {
                let added = added.map_or(String::new(), |a| format!("  {a:+} kB with the runtime"));
                let _ = writeln!(t, "  {label:<56} {rss:>7} kB{added}");
            }
        }
        t
    }

    pub fn to_json(&self) -> Json {
        let rows = self.rows.iter().map(|r| self.row_json(r)).collect();
        let base = self.startup_base_ms();
        let startup = self
            .startup
            .iter()
            .map(|s| {
                let ms = Summary::of(&s.samples_ms);
                let mut o = vec![("label", Json::str(&s.label)), ("status", Json::str(status(&s.failure)))];
                if let Some(f) = &s.failure {
                    o.push(("unavailable", Json::Bool(matches!(f, Failure::Unavailable(_)))));
                    o.push(("reason", Json::str(f.reason())));
                }
                o.push(("wall_ms", Json::opt_num(ms.map(|m| m.median))));
                o.push(("wall_ms_min", Json::opt_num(ms.map(|m| m.min))));
                o.push(("wall_ms_max", Json::opt_num(ms.map(|m| m.max))));
                o.push((
                    "over_unprobed_ms",
                    Json::opt_num(match (&s.handler, ms, base) {
                        (Some(_), Some(m), Some(b)) => Some(m.median - b),
                        _ => None,
                    }),
                ));
                o.push(("rss_kb", median_u64(&s.rss_kb).map_or(Json::Null, |v| Json::Int(v as i64))));
                if let Some(h) = &s.handler {
                    o.push(("registered", Json::Int(h.registered as i64)));
                    o.push(("failed", Json::Int(h.failed as i64)));
                    o.push((
                        "failed_by_errno",
                        Json::Obj(
                            h.failed_by_errno.iter().map(|(e, n)| (errno_name(*e), Json::Int(*n as i64))).collect(),
                        ),
                    ));
                    o.push(("hits_during_run", Json::Int(h.others as i64)));
                }
                if let Some(r) = &s.stats {
                    o.push(("placement_ms", Json::Num(r.placement_ms)));
                    o.push(("placement_syscalls", Json::Int(r.syscalls as i64)));
                    o.push(("placement_syscalls_by_kind", Json::str(&r.syscalls_by_kind)));
                    o.push(("maps_reads", Json::Int(r.maps_reads as i64)));
                    o.push(("sigtraps_in_runtime", Json::Int(r.traps_in_runtime as i64)));
                    o.push(("points_armed", Json::Int(r.points as i64)));
                    o.push(("jumps", Json::Int(r.jumps as i64)));
                }
                Json::obj(o)
            })
            .collect();
        let memory = self
            .memory()
            .into_iter()
            .map(|(label, rss, added)| {
                Json::obj([
                    ("label", Json::str(label)),
                    ("rss_kb", Json::Int(rss as i64)),
                    ("added_kb", added.map_or(Json::Null, Json::Int)),
                ])
            })
            .collect();
        let sigtrap = self
            .sigtrap_ratios()
            .into_iter()
            .map(|r| {
                Json::obj([
                    ("function", Json::str(r.function)),
                    ("int3_entry_ns_per_hit", Json::num(r.ns_per_hit)),
                    ("int3_entry_ns_per_hit_min", Json::num(r.ns_per_hit_min)),
                    ("ratio_to_sigtrap", Json::num(r.ratio)),
                    ("ratio_of_fastest_runs", Json::num(r.ratio_of_mins)),
                ])
            })
            .collect();
        let scaling = self
            .scaling()
            .into_iter()
            .map(|(e, k, f, one, two)| {
                Json::obj([
                    ("engine", Json::str(e.name())),
                    ("kind", Json::str(k.name())),
                    ("function", Json::str(f)),
                    ("ns_per_hit_1_thread", Json::num(one)),
                    ("ns_per_hit_2_threads", Json::num(two)),
                ])
            })
            .collect();
        Json::obj([
            ("machine", self.machine.to_json()),
            (
                "settings",
                Json::obj([
                    ("runs_per_row", Json::Int(self.runs as i64)),
                    ("target_ms_per_run", Json::num(self.target_ms)),
                ]),
            ),
            ("rows", Json::Arr(rows)),
            ("int3_vs_sigtrap", Json::Arr(sigtrap)),
            ("scaling", Json::Arr(scaling)),
            ("startup", Json::Arr(startup)),
            ("attach", attach::to_json(&self.attach)),
            ("memory", Json::Arr(memory)),
        ])
    }

    fn row_json(&self, r: &HitRow) -> Json {
        let mut o = vec![
            ("engine", Json::str(r.engine.name())),
            ("kind", Json::str(r.kind.name())),
            ("function", Json::str(r.function_label())),
            ("threads", Json::Int(i64::from(r.threads))),
            ("status", Json::str(status(&r.failure))),
        ];
        if let Some(f) = &r.failure {
            o.push(("unavailable", Json::Bool(matches!(f, Failure::Unavailable(_)))));
            o.push(("reason", Json::str(f.reason())));
        }
        let d = self.derived(r);
        o.push(("ns_per_hit", Json::opt_num(d.map(|d| d.per_hit.median))));
        o.push(("ns_per_hit_min", Json::opt_num(d.map(|d| d.per_hit.min))));
        o.push(("ns_per_hit_max", Json::opt_num(d.map(|d| d.per_hit.max))));
        o.push(("hits_per_sec", Json::opt_num(d.map(|d| d.hits_per_sec.round()))));
        o.push(("ratio_to_int3", Json::opt_num(d.and_then(|d| d.ratio))));
        o.push(("raw_ns_per_call", Json::opt_num(d.map(|d| d.raw.median))));
        o.push(("baseline_ns_per_call", Json::opt_num(d.and_then(|d| d.baseline))));
        o.push(("hits_per_run", Json::Int(r.hits_per_run as i64)));
        o.push(("runs", Json::Int(r.samples.len() as i64)));
        o.push(("rss_kb", median_u64(&r.rss_kb).map_or(Json::Null, |v| Json::Int(v as i64))));
        if let Some(s) = &r.strategy {
            o.push(("strategy", Json::str(s)));
        }
        Json::obj(o)
    }

    /// Horizontal bars of ns per hit on a log axis; rows without a number are written out.
    pub fn svg(&self) -> String {
        const LABEL_W: f64 = 300.0;
        const BAR_W: f64 = 560.0;
        const ROW_H: f64 = 18.0;
        const TOP: f64 = 64.0;
        const WIDTH: f64 = 1080.0;
        let x0 = LABEL_W + 10.0;
        let values: Vec<f64> =
            self.rows.iter().filter_map(|r| self.derived(r)).map(|d| d.per_hit.median).filter(|v| *v > 0.0).collect();
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min).max(0.1);
        let hi = values.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
        let (lo_exp, hi_exp) =
            if values.is_empty() { (0, 6) } else { (lo.log10().floor() as i32, hi.log10().ceil() as i32) };
        let span = f64::from((hi_exp - lo_exp).max(1));
        let x_of = |v: f64| x0 + BAR_W * ((v.max(10f64.powi(lo_exp)).log10() - f64::from(lo_exp)) / span);
        let (offsets, rows_h) = row_offsets(&self.rows, ROW_H, 8.0);
        let height = TOP + rows_h + 50.0;

        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{x0}" y="20" font-size="15" font-weight="bold">ns per probe hit over an unprobed call (log scale)</text>"#
        );
        let _ = writeln!(s, r##"<text x="{x0}" y="38" fill="#555">{}</text>"##, xml_escape(&self.machine.summary()));
        let axis_bottom = TOP + rows_h;
        for e in lo_exp..=hi_exp {
            let x = x_of(10f64.powi(e));
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{axis_bottom:.1}" stroke="#ddd"/>"##,
                TOP - 6.0
            );
            let _ = writeln!(
                s,
                r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
                axis_bottom + 16.0,
                fmt_decade(e)
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">ns per hit</text>"##,
            x0 + BAR_W / 2.0,
            axis_bottom + 34.0
        );
        for (i, row) in self.rows.iter().enumerate() {
            let y = TOP + offsets[i];
            let label = format!(
                "{} {} {}{}",
                row.engine.name(),
                if row.kind == Kind::Trap { "(bare int3 round trip)" } else { row.kind.name() },
                if row.kind == Kind::Trap { "" } else { row.function },
                if row.threads > 1 { format!(" ×{}", row.threads) } else { String::new() }
            );
            let _ = writeln!(
                s,
                r#"<text x="{LABEL_W}" y="{:.1}" text-anchor="end">{}</text>"#,
                y + 13.0,
                xml_escape(&label)
            );
            match (&row.failure, self.derived(row)) {
                (None, Some(d)) => {
                    let v = d.per_hit.median;
                    let x1 = x_of(v);
                    let _ = writeln!(
                        s,
                        r#"<rect x="{x0}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                        y + 2.0,
                        (x1 - x0).max(1.0),
                        ROW_H - 4.0,
                        engine_color(row.engine)
                    );
                    let note = if d.baseline.is_none() { " (plain call)" } else { "" };
                    let _ = writeln!(
                        s,
                        r#"<text x="{:.1}" y="{:.1}">{} ns{note}</text>"#,
                        x1.max(x0) + 4.0,
                        y + 13.0,
                        fmt_ns(v)
                    );
                }
                (failure, _) => {
                    let text = match failure {
                        Some(Failure::Unavailable(r)) => format!("unavailable: {r}"),
                        Some(Failure::Invalid(r)) => format!("invalid: {r}"),
                        None => "no result".into(),
                    };
                    let text: String = text.chars().take(110).collect();
                    let _ = writeln!(
                        s,
                        r##"<text x="{:.1}" y="{:.1}" fill="#888" font-style="italic">{}</text>"##,
                        x0 + 4.0,
                        y + 13.0,
                        xml_escape(&text)
                    );
                }
            }
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Rows that are shown together: the baselines, one (function, kind), the 2-thread rows.
fn group_of(row: &HitRow) -> String {
    if row.threads > 1 {
        "scaling".to_owned()
    } else if matches!(row.engine, Engine::None | Engine::Sigtrap) {
        "base".to_owned()
    } else {
        format!("{} {}", row.function, row.kind.name())
    }
}

/// Top of each row in the chart, with a gap between groups; and the total height used.
fn row_offsets(rows: &[HitRow], row_h: f64, gap: f64) -> (Vec<f64>, f64) {
    let mut y = 0.0;
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        if i > 0 && group_of(&rows[i - 1]) != group_of(row) {
            y += gap;
        }
        out.push(y);
        y += row_h;
    }
    (out, y)
}

fn status(f: &Option<Failure>) -> &'static str {
    match f {
        None => "ok",
        Some(Failure::Unavailable(_)) => "unavailable",
        Some(Failure::Invalid(_)) => "invalid",
    }
}

fn errno_list(v: &[(i32, u64)]) -> String {
    v.iter().map(|(e, n)| format!("{} x{n}", errno_name(*e))).collect::<Vec<_>>().join(", ")
}

fn engine_color(e: Engine) -> &'static str {
    match e {
        Engine::None => "#9e9e9e",
        Engine::Sigtrap => "#8c564b",
        Engine::Int3 => "#1f77b4",
        Engine::Jump => "#17becf",
        Engine::Kernel => "#2ca02c",
        Engine::PtraceOol => "#ff7f0e",
        Engine::Ptrace => "#d62728",
        Engine::PtraceXcpu => "#7f1d1d",
    }
}

fn fmt_decade(e: i32) -> String {
    match e {
        i32::MIN..=-1 => format!("{}", 10f64.powi(e)),
        0..=6 => group_thousands(10u64.pow(e as u32)),
        _ => format!("1e{e}"),
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// 0.42, 3.1, 42.5, 1,234
pub fn fmt_ns(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let a = x.abs();
    if a < 10.0 {
        format!("{x:.2}")
    } else if a < 100.0 {
        format!("{x:.1}")
    } else {
        let g = group_thousands(a.round() as u64);
        if x < 0.0 {
            format!("-{g}")
        } else {
            g
        }
    }
}

/// 806 k, 1.25 M
pub fn fmt_rate(x: f64) -> String {
    let (v, unit) = if x >= 1e9 {
        (x / 1e9, " G")
    } else if x >= 1e6 {
        (x / 1e6, " M")
    } else if x >= 1e3 {
        (x / 1e3, " k")
    } else {
        (x, "")
    };
    if v >= 100.0 {
        format!("{v:.0}{unit}")
    } else if v >= 10.0 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.2}{unit}")
    }
}

/// 1.00x, 0.39x, 124x
pub fn fmt_ratio(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}x")
    } else if r >= 10.0 {
        format!("{r:.1}x")
    } else {
        format!("{r:.2}x")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            kernel: "Linux 6.18".into(),
            cpu: "Test CPU".into(),
            cpus: 2,
            mem_gib: 24.0,
            compiler: "gcc".into(),
            load: "0.00 0.00 0.00".into(),
        }
    }

    fn row(engine: Engine, kind: Kind, f: &'static str, samples: &[f64]) -> HitRow {
        HitRow { samples: samples.to_vec(), hits_per_run: 1000, rss_kb: vec![1400], ..HitRow::new(engine, kind, f, 1) }
    }

    fn report() -> Report {
        let mut unavailable = HitRow::new(Engine::Kernel, Kind::Return, "f_push", 1);
        unavailable.failure = Some(Failure::Unavailable("no PMU <here>".into()));
        Report {
            machine: machine(),
            runs: 3,
            target_ms: 300.0,
            rows: vec![
                row(Engine::Sigtrap, Kind::Trap, "-", &[1200.0, 1250.0, 1300.0]),
                row(Engine::None, Kind::Call, "f_push", &[1.0, 1.2, 1.1]),
                row(Engine::Int3, Kind::Entry, "f_push", &[1301.1, 1401.1, 1351.1]),
                row(Engine::Kernel, Kind::Entry, "f_push", &[501.1, 491.1, 481.1]),
                unavailable,
            ],
            startup: vec![],
            attach: vec![],
        }
    }

    #[test]
    fn derived_figures_subtract_the_baseline_and_compare_to_int3() {
        let r = report();
        let base = r.derived(&r.rows[1]).unwrap();
        assert_eq!(base.baseline, None);
        assert!((base.per_hit.median - 1.1).abs() < 1e-9);
        let int3 = r.derived(&r.rows[2]).unwrap();
        assert!((int3.per_hit.median - 1350.0).abs() < 1e-9);
        assert!((int3.ratio.unwrap() - 1.0).abs() < 1e-12);
        let kernel = r.derived(&r.rows[3]).unwrap();
        assert!((kernel.per_hit.median - 490.0).abs() < 1e-9);
        assert!((kernel.ratio.unwrap() - 490.0 / 1350.0).abs() < 1e-9);
        assert!((kernel.hits_per_sec - 1e9 / 491.1).abs() < 1e-6);
        let trap = r.derived(&r.rows[0]).unwrap();
        assert_eq!(trap.per_hit.median, 1250.0);
        assert!(r.derived(&r.rows[4]).is_none());
        let ratios = r.sigtrap_ratios();
        assert_eq!(ratios.len(), 1);
        assert!((ratios[0].ratio - 1350.0 / 1250.0).abs() < 1e-9);
        assert!((ratios[0].ratio_of_mins - 1300.0 / 1200.0).abs() < 1e-9);
    }

    #[test]
    fn outputs_mention_every_row() {
        let r = report();
        let table = r.table();
        assert!(table.contains("unavailable: no PMU <here>"), "{table}");
        assert!(table.contains("1,350"), "{table}");
        assert!(table.contains("0.36x"), "{table}");
        let json = r.to_json().pretty();
        assert!(json.contains("\"reason\": \"no PMU <here>\""));
        assert!(json.contains("\"ns_per_hit\": 1350"));
        let svg = r.svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("no PMU &lt;here&gt;"));
        assert_eq!(svg.matches("<rect").count(), 1 + 4);
    }

    #[test]
    fn number_formats() {
        assert_eq!(fmt_ns(1.234), "1.23");
        assert_eq!(fmt_ns(42.34), "42.3");
        assert_eq!(fmt_ns(161234.4), "161,234");
        assert_eq!(fmt_ns(-0.5), "-0.50");
        assert_eq!(fmt_rate(806_000.0), "806 k");
        assert_eq!(fmt_rate(1_250_000.0), "1.25 M");
        assert_eq!(fmt_ratio(0.3629), "0.36x");
        assert_eq!(fmt_ratio(124.0), "124x");
        assert_eq!(fmt_decade(3), "1,000");
        assert_eq!(fmt_decade(-1), "0.1");
    }
}
