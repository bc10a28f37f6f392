//! The results: derived figures (cost over the baseline, rate, ratio to uprobe-run's int3
//! row), the table on stdout, `hitcost.json` and the `hitcost.svg` bar chart.

use crate::attach::{self, AttachRow};
use crate::engines::uprobe_run::{errno_name, HandlerReport, RuntimeStats};
use crate::engines::{Engine, Failure, Kind};
use crate::json::{num, obj, opt_num, text};
use crate::machine::Machine;
use crate::stats::Summary;
use serde_json::Value;

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
    pub(crate) fn strategy_note(&self) -> Option<&str> {
        let s = self.strategy.as_deref()?;
        let expected = match self.engine {
            Engine::Int3 => "int3",
            Engine::Jump => "jump",
            _ => return None,
        };
        (s.split_whitespace().next() != Some(expected)).then_some(s)
    }

    pub(crate) fn function_label(&self) -> &str {
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

    pub(crate) fn startup_base_ms(&self) -> Option<f64> {
        let first = self.startup.first()?;
        if first.handler.is_some() || first.failure.is_some() {
            return None;
        }
        Some(Summary::of(&first.samples_ms)?.median)
    }

    pub(crate) fn startup_base_rss(&self) -> Option<u64> {
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

    pub fn to_json(&self) -> Value {
        let rows = self.rows.iter().map(|r| self.row_json(r)).collect();
        let base = self.startup_base_ms();
        let startup = self
            .startup
            .iter()
            .map(|s| {
                let ms = Summary::of(&s.samples_ms);
                let mut o = vec![("label", text(&s.label)), ("status", text(status(&s.failure)))];
                if let Some(f) = &s.failure {
                    o.push(("unavailable", Value::Bool(matches!(f, Failure::Unavailable(_)))));
                    o.push(("reason", text(f.reason())));
                }
                o.push(("wall_ms", opt_num(ms.map(|m| m.median))));
                o.push(("wall_ms_min", opt_num(ms.map(|m| m.min))));
                o.push(("wall_ms_max", opt_num(ms.map(|m| m.max))));
                o.push((
                    "over_unprobed_ms",
                    opt_num(match (&s.handler, ms, base) {
                        (Some(_), Some(m), Some(b)) => Some(m.median - b),
                        _ => None,
                    }),
                ));
                o.push(("rss_kb", median_u64(&s.rss_kb).map_or(Value::Null, |v| Value::from(v as i64))));
                if let Some(h) = &s.handler {
                    o.push(("registered", Value::from(h.registered as i64)));
                    o.push(("failed", Value::from(h.failed as i64)));
                    o.push((
                        "failed_by_errno",
                        obj(h.failed_by_errno.iter().map(|(e, n)| (errno_name(*e), Value::from(*n as i64)))),
                    ));
                    o.push(("hits_during_run", Value::from(h.others as i64)));
                }
                if let Some(r) = &s.stats {
                    o.push(("placement_ms", num(r.placement_ms)));
                    o.push(("placement_syscalls", Value::from(r.syscalls as i64)));
                    o.push(("placement_syscalls_by_kind", text(&r.syscalls_by_kind)));
                    o.push(("maps_reads", Value::from(r.maps_reads as i64)));
                    o.push(("sigtraps_in_runtime", Value::from(r.traps_in_runtime as i64)));
                    o.push(("points_armed", Value::from(r.points as i64)));
                    o.push(("jumps", Value::from(r.jumps as i64)));
                }
                obj(o)
            })
            .collect();
        let memory = self
            .memory()
            .into_iter()
            .map(|(label, rss, added)| {
                obj([
                    ("label", text(label)),
                    ("rss_kb", Value::from(rss as i64)),
                    ("added_kb", added.map_or(Value::Null, Value::from)),
                ])
            })
            .collect();
        let sigtrap = self
            .sigtrap_ratios()
            .into_iter()
            .map(|r| {
                obj([
                    ("function", text(r.function)),
                    ("int3_entry_ns_per_hit", num(r.ns_per_hit)),
                    ("int3_entry_ns_per_hit_min", num(r.ns_per_hit_min)),
                    ("ratio_to_sigtrap", num(r.ratio)),
                    ("ratio_of_fastest_runs", num(r.ratio_of_mins)),
                ])
            })
            .collect();
        let scaling = self
            .scaling()
            .into_iter()
            .map(|(e, k, f, one, two)| {
                obj([
                    ("engine", text(e.name())),
                    ("kind", text(k.name())),
                    ("function", text(f)),
                    ("ns_per_hit_1_thread", num(one)),
                    ("ns_per_hit_2_threads", num(two)),
                ])
            })
            .collect();
        obj([
            ("machine", self.machine.to_json()),
            (
                "settings",
                obj([("runs_per_row", Value::from(self.runs as i64)), ("target_ms_per_run", num(self.target_ms))]),
            ),
            ("rows", Value::Array(rows)),
            ("int3_vs_sigtrap", Value::Array(sigtrap)),
            ("scaling", Value::Array(scaling)),
            ("startup", Value::Array(startup)),
            ("attach", attach::to_json(&self.attach)),
            ("memory", Value::Array(memory)),
        ])
    }

    fn row_json(&self, r: &HitRow) -> Value {
        let mut o = vec![
            ("engine", text(r.engine.name())),
            ("kind", text(r.kind.name())),
            ("function", text(r.function_label())),
            ("threads", Value::from(i64::from(r.threads))),
            ("status", text(status(&r.failure))),
        ];
        if let Some(f) = &r.failure {
            o.push(("unavailable", Value::Bool(matches!(f, Failure::Unavailable(_)))));
            o.push(("reason", text(f.reason())));
        }
        let d = self.derived(r);
        o.push(("ns_per_hit", opt_num(d.map(|d| d.per_hit.median))));
        o.push(("ns_per_hit_min", opt_num(d.map(|d| d.per_hit.min))));
        o.push(("ns_per_hit_max", opt_num(d.map(|d| d.per_hit.max))));
        o.push(("hits_per_sec", opt_num(d.map(|d| d.hits_per_sec.round()))));
        o.push(("ratio_to_int3", opt_num(d.and_then(|d| d.ratio))));
        o.push(("raw_ns_per_call", opt_num(d.map(|d| d.raw.median))));
        o.push(("baseline_ns_per_call", opt_num(d.and_then(|d| d.baseline))));
        o.push(("hits_per_run", Value::from(r.hits_per_run as i64)));
        o.push(("runs", Value::from(r.samples.len() as i64)));
        o.push(("rss_kb", median_u64(&r.rss_kb).map_or(Value::Null, |v| Value::from(v as i64))));
        if let Some(s) = &r.strategy {
            o.push(("strategy", text(s)));
        }
        obj(o)
    }
}

/// Rows that are shown together: the baselines, one (function, kind), the 2-thread rows.
pub(crate) fn group_of(row: &HitRow) -> String {
    if row.threads > 1 {
        "scaling".to_owned()
    } else if matches!(row.engine, Engine::None | Engine::Sigtrap) {
        "base".to_owned()
    } else {
        format!("{} {}", row.function, row.kind.name())
    }
}

fn status(f: &Option<Failure>) -> &'static str {
    match f {
        None => "ok",
        Some(Failure::Unavailable(_)) => "unavailable",
        Some(Failure::Invalid(_)) => "invalid",
    }
}

pub(crate) fn errno_list(v: &[(i32, u64)]) -> String {
    v.iter().map(|(e, n)| format!("{} x{n}", errno_name(*e))).collect::<Vec<_>>().join(", ")
}

pub(crate) fn group_thousands(n: u64) -> String {
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
        let json = crate::json::pretty(&r.to_json());
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
        assert_eq!(crate::svg::fmt_decade(3), "1,000");
        assert_eq!(crate::svg::fmt_decade(-1), "0.1");
    }
}
