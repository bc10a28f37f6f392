//! The table the benchmark prints on stdout: every row, derived figures, scaling, start-up,
//! memory and attach rows.

use crate::attach;
use crate::engines::Failure;
use crate::report::{errno_list, fmt_ns, fmt_rate, fmt_ratio, group_of, Report};
use crate::stats::Summary;
use std::fmt::Write as _;

impl Report {
    /// The whole table, as printed.
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
}
