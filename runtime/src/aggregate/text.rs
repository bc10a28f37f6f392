//! Reports as text. Pure.
//!
//! ```text
//! interval 2: 1.000-2.000 s                      (interval reports only)
//! EVENT          COUNT                           --count
//! malloc          1532
//! count malloc by size: 1532 hits, 57 keys      --count --by size
//!   size         COUNT
//!   32            5011
//!   (47 more keys: 230 hits)                     (left out by --top)
//! hist malloc.size: 1532 values                  --hist, --lhist: bpftrace's layout
//! [0]                    3 |@@                     |
//! latency work: 12 calls, total 18020334 ns, min 1500123 ns, mean 1501694 ns, max 1510000 ns
//! [1M, 2M)              12 |@@@@@@@@@@@@@@@@@@@@@@@|
//! (3 calls did not return: 3 left by longjmp or an exception)
//! filter malloc: 1532 hits, 12 passed               (events with a filter)
//! ```
//!
//! Sections are separated by a blank line.

use core::fmt::Write;

use crate::aggregate::buckets::{self, Scale};
use crate::aggregate::merge::{Latency, Snapshot};
use crate::aggregate::plan::Plans;
use crate::aggregate::split;
use crate::aggregate::tables::{self, plural, EventView, Frame, Left, Names};

/// The whole report.
pub fn write(
    out: &mut String,
    plans: &Plans,
    events: &[EventView],
    snap: &Snapshot,
    frame: &Frame,
    left: &[Left],
    names: &mut dyn Names,
) {
    if let Some(i) = frame.interval {
        let end = if frame.end { " (end of run)" } else { "" };
        let cumulative = if i.cumulative { " (cumulative)" } else { "" };
        let seconds = |ns: u64| format!("{}.{:03}", ns / 1_000_000_000, ns % 1_000_000_000 / 1_000_000);
        let _ = writeln!(out, "interval {}{cumulative}: {}-{} s{end}", i.index, seconds(i.from_ns), seconds(i.to_ns));
    }
    if plans.request.asked.count {
        for (i, p) in plans.events.iter().enumerate() {
            if p.latency.is_some() || !p.count_by_key {
                continue;
            }
            if p.key.is_some() && names.skipped(i) {
                let by = plans.by.as_ref().map_or("", |b| b.name.as_str());
                let _ = writeln!(out, "count {} by {by}: skipped\n", events[i].name);
            } else if p.key.is_some() && tables::shown(plans, i, snap.counts[i]) {
                keyed(out, plans, events, snap, i, names);
            }
        }
        let whole = plans.events.iter().any(|p| p.latency.is_none() && p.key.is_none());
        if whole {
            counts(out, plans, events, snap, names);
        }
        let idle = tables::idle(plans, snap, false);
        if idle > 0 && !whole {
            let _ = writeln!(out, "({idle} more {} of globs, not hit)\n", if idle == 1 { "event" } else { "events" });
        }
    }
    for (h, plan) in plans.hists.iter().enumerate() {
        let values: u64 = snap.hists[h].iter().sum();
        let kind = if plan.scale == Scale::Log2 { "hist" } else { "lhist" };
        let title = tables::hist_title(&plan.name, &plan.scale);
        if names.skipped(plan.event) {
            let _ = writeln!(out, "{kind} {title}: skipped\n");
            continue;
        }
        if plan.keyed {
            let k = split::hist(plans, snap, events, h, names);
            let by = plans.by.as_ref().map_or("", |b| b.name.as_str());
            let keys = plural(k.keys as u64, "key", "keys");
            let _ = writeln!(out, "{kind} {title} by {by}: {}, {keys}", plural(values, "value", "values"));
            let stack_parts = stack_parts(plans, plan.event);
            for (i, (r, v)) in k.rows.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                bpftrace_key(out, &r.cells, &stack_parts);
                let _ = writeln!(out, ": {}", plural(r.count, "value", "values"));
                buckets::write(out, &plan.scale, &v.buckets);
            }
            split_rest(out, plans, k.rest, k.not_split, "value", "values");
        } else {
            let _ = writeln!(out, "{kind} {title}: {}", plural(values, "value", "values"));
            buckets::write(out, &plan.scale, &snap.hists[h]);
        }
        if snap.faults[h] > 0 {
            let _ = writeln!(out, "({} could not be read)", plural(snap.faults[h], "value", "values"));
        }
        not_kept(out, "", snap.unblocked[plan.event], "values");
        out.push('\n');
    }
    for (l, plan) in plans.latencies.iter().enumerate() {
        let lat = &snap.latencies[l];
        if names.skipped(plan.event) {
            let _ = writeln!(out, "latency {}: skipped\n", names.function(plan.event));
            continue;
        }
        if !tables::shown(plans, plan.event, lat.entered.max(lat.calls)) {
            continue;
        }
        let function = names.function(plan.event);
        if plans.events[plan.event].key.is_some() {
            let k = split::latency(plans, snap, events, l, names);
            let by = plans.by.as_ref().map_or("", |b| b.name.as_str());
            let keys = plural(k.keys as u64, "key", "keys");
            let _ = writeln!(out, "latency {function} by {by}: {}, {keys}", numbers(lat));
            let stack_parts = stack_parts(plans, plan.event);
            for (i, (r, v)) in k.rows.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                bpftrace_key(out, &r.cells, &stack_parts);
                let _ = writeln!(out, ": {}", numbers(v));
                buckets::write(out, &Scale::Log2, &v.hist);
            }
            split_rest(out, plans, k.rest, k.not_split, "call", "calls");
        } else {
            let _ = writeln!(out, "latency {function}: {}", numbers(lat));
            buckets::write(out, &Scale::Log2, &lat.hist);
        }
        if names.trapped(plan.event) {
            out.push_str("(an int3 probe: each time includes the return from its trap; see --verbose)\n");
        }
        if let Some(left) = left.get(l).filter(|_| frame.end) {
            not_returned(out, left);
        }
        not_kept(out, "", snap.unblocked[plan.event], "calls");
        out.push('\n');
    }
    let idle = tables::idle(plans, snap, true);
    if idle > 0 {
        let _ =
            writeln!(out, "({idle} more {} of globs, not called)\n", if idle == 1 { "function" } else { "functions" });
    }
    let filtered = tables::filtered(plans, snap);
    for &(i, hits, passed) in &filtered {
        let _ = writeln!(out, "filter {}: {}, {passed} passed", events[i].name, plural(hits, "hit", "hits"));
    }
    if !filtered.is_empty() {
        out.push('\n');
    }
}

fn counts(out: &mut String, plans: &Plans, events: &[EventView], snap: &Snapshot, names: &mut dyn Names) {
    let (mut rows, (rest, rest_hits)) = tables::counts(plans, snap, false);
    // Skipped events are named after the counted ones, never with a count.
    let skipped: Vec<usize> = rows.iter().map(|&(i, _)| i).filter(|&i| names.skipped(i)).collect();
    rows.retain(|(i, _)| !skipped.contains(i));
    let width = rows.iter().map(|&(i, _)| i).chain(skipped.iter().copied()).map(|i| events[i].name.len()).max();
    let width = width.unwrap_or(0).max(5);
    let _ = writeln!(out, "{:<width$} {:>12}", "EVENT", "COUNT");
    for (i, n) in rows {
        let _ = writeln!(out, "{:<width$} {n:>12}", events[i].name);
    }
    for i in skipped {
        let _ = writeln!(out, "{:<width$} {:>12}", events[i].name, "skipped");
    }
    if rest > 0 {
        let _ = writeln!(
            out,
            "({rest} more {}: {})",
            if rest == 1 { "event" } else { "events" },
            plural(rest_hits, "hit", "hits")
        );
    }
    let idle = tables::idle(plans, snap, false);
    if idle > 0 {
        let _ = writeln!(out, "({idle} more {} of globs, not hit)", if idle == 1 { "event" } else { "events" });
    }
    out.push('\n');
}

fn keyed(out: &mut String, plans: &Plans, events: &[EventView], snap: &Snapshot, event: usize, names: &mut dyn Names) {
    let k = tables::keyed(plans, snap, events, event, names);
    let by = plans.by.as_ref().map_or("", |b| b.name.as_str());
    let _ = writeln!(
        out,
        "count {} by {by}: {}, {}",
        events[event].name,
        plural(k.total, "hit", "hits"),
        plural(k.keys as u64, "key", "keys")
    );
    let parts = plans.events[event].key.iter().flatten();
    let stack_parts: Vec<bool> = parts.map(|p| p.key.depth().is_some()).collect();
    if stack_parts.contains(&true) {
        for r in &k.rows {
            bpftrace_row(out, &r.cells, &stack_parts, r.count);
        }
    } else {
        // One column per part of the key, each as wide as its widest cell or its name.
        let heads: Vec<&str> = plans.by.as_ref().map_or(vec![by], |b| b.parts.iter().map(String::as_str).collect());
        let widths: Vec<usize> = (0..heads.len())
            .map(|c| {
                k.rows.iter().filter_map(|r| r.cells.get(c)).map(String::len).max().unwrap_or(0).max(heads[c].len())
            })
            .collect();
        let line = |out: &mut String, cells: &[&str], count: &str| {
            out.push_str("  ");
            for (c, w) in cells.iter().zip(&widths) {
                let _ = write!(out, "{c:<w$} ");
            }
            let _ = writeln!(out, "{count:>12}");
        };
        line(out, &heads, "COUNT");
        for r in &k.rows {
            let cells: Vec<&str> = r.cells.iter().map(String::as_str).collect();
            line(out, &cells, &r.count.to_string());
        }
    }
    if k.rest.0 > 0 {
        let _ = writeln!(
            out,
            "  ({} more {}: {})",
            k.rest.0,
            if k.rest.0 == 1 { "key" } else { "keys" },
            plural(k.rest.1, "hit", "hits")
        );
    }
    if k.dropped > 0 {
        let _ = writeln!(
            out,
            "  ({} not counted by {by}: their thread had {} keys already)",
            plural(k.dropped, "hit", "hits"),
            plans.layout.key_slots
        );
    }
    not_kept(out, "  ", k.unblocked, "hits");
    out.push('\n');
}

/// A timed function's calls, their total, min, mean and max.
fn numbers(lat: &Latency) -> String {
    let ns = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{v} ns"));
    let mean = (lat.calls > 0).then(|| lat.total / lat.calls);
    let calls = plural(lat.calls, "call", "calls");
    format!("{calls}, total {} ns, min {}, mean {}, max {}", lat.total, ns(lat.min), ns(mean), ns(lat.max))
}

/// Which parts of event `event`'s key are stacks.
fn stack_parts(plans: &Plans, event: usize) -> Vec<bool> {
    plans.events[event].key.iter().flatten().map(|p| p.key.depth().is_some()).collect()
}

/// The keys of a split histogram or timed function left out by `--top`, and the values
/// that no key holds.
fn split_rest(out: &mut String, plans: &Plans, rest: (usize, u64), not_split: u64, one: &str, many: &str) {
    let by = plans.by.as_ref().map_or("", |b| b.name.as_str());
    if rest.0 > 0 {
        let keys = if rest.0 == 1 { "key" } else { "keys" };
        let _ = writeln!(out, "({} more {keys}: {})", rest.0, plural(rest.1, one, many));
    }
    if not_split > 0 {
        let _ = writeln!(
            out,
            "({} not split by {by}: their thread had {} keys or {} stacks already)",
            plural(not_split, one, many),
            plans.layout.key_slots,
            crate::aggregate::request::STACK_SLOTS
        );
    }
}

/// A row with a stack as bpftrace prints `@[ustack, ...] = count()`: the parts separated by
/// commas, a stack's frames one a line, indented.
fn bpftrace_row(out: &mut String, cells: &[String], stack_parts: &[bool], count: u64) {
    bpftrace_key(out, cells, stack_parts);
    let _ = writeln!(out, ": {count}");
}

/// A key as bpftrace prints it, `@[...]`, with no line end.
fn bpftrace_key(out: &mut String, cells: &[String], stack_parts: &[bool]) {
    out.push_str("@[");
    for (i, cell) in cells.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        if stack_parts.get(i) == Some(&true) {
            out.push('\n');
            for f in cell.lines() {
                let _ = writeln!(out, "    {f}");
            }
        } else {
            out.push_str(cell);
        }
    }
    out.push(']');
}

fn not_kept(out: &mut String, indent: &str, n: u64, what: &str) {
    if n > 0 {
        let _ = writeln!(
            out,
            "{indent}({n} {what} not kept: their threads found no counters free ({} threads had them))",
            crate::aggregate::blocks::THREADS
        );
    }
}

fn not_returned(out: &mut String, left: &Left) {
    let total = left.total();
    if total > 0 {
        let parts: Vec<String> = [
            (left.gone, "left by longjmp or an exception"),
            (left.pending, "pending at the end"),
            (left.thread_exit, "at thread exit"),
            (left.children, "in children that exec'd"),
            (left.elsewhere, "still running on other threads or in processes that ended"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} {why}"))
        .collect();
        let _ = writeln!(out, "({} did not return: {})", plural(total, "call", "calls"), parts.join(", "));
    }
    if left.missed > 0 {
        let _ = writeln!(
            out,
            "({} not timed: more were pending on their thread than maxactive allows)",
            plural(left.missed, "call", "calls")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::merge::{KeyId, Latency};
    use crate::aggregate::plan::{build, EventInfo};
    use crate::aggregate::request::{parse_hist, Request};
    use crate::aggregate::tables::Interval;
    use crate::aggregate::tables::PlainNames as Fake;
    use crate::base::spec::Aggregate;
    use crate::trace::fetch::{parse, Site};

    #[test]
    fn stacks_print_as_bpftrace_prints_them_with_other_parts_beside() {
        let info = [EventInfo::entry("leaf", &[])];
        let asked = Aggregate { count: true, by: Some("tid,ustack:4".into()), ..Aggregate::default() };
        let request = Request { asked, ..Request::default() };
        let plans = build(&info, &request).unwrap();
        let (one, two) = (0x51, 0x53);
        let snap = Snapshot {
            counts: vec![5],
            dropped: vec![0],
            unblocked: vec![0],
            keys: [(KeyId::new(0, &[7, one]), 3), (KeyId::new(0, &[7, two]), 2)].into_iter().collect(),
            stacks: [(one, vec![0x1000, 0x2005]), (two, vec![0x1000, 0x3009, crate::probe::stacks::CORRUPT])]
                .into_iter()
                .collect(),
            ..Snapshot::default()
        };
        let views = [EventView { name: "leaf", group: "g", args: &[] }];
        let frame = Frame { pid: 1, interval: None, end: true, ts: 0 };
        let mut out = String::new();
        write(&mut out, &plans, &views, &snap, &frame, &[], &mut Fake);
        assert_eq!(
            out,
            "count leaf by tid,ustack:4: 5 hits, 2 keys\n\
             @[7, \n    0x1000\n    0x2005\n]: 3\n\
             @[7, \n    0x1000\n    0x3009\n    [stack unreadable from here]\n]: 2\n\n"
        );
        let k = tables::keyed(&plans, &snap, &views, 0, &mut Fake);
        assert_eq!(k.rows[0].json, r#"{"tid":7,"ustack:4":["0x1000","0x2005"]}"#);
    }

    #[test]
    fn a_report_with_every_section() {
        let args = vec![parse("size=%di:u32", 1, Site::Entry).unwrap()];
        let info =
            [EventInfo::entry("malloc", &args), EventInfo::entry("free", &[]), EventInfo::timed_return("work__return")];
        let request = Request {
            asked: Aggregate { count: true, interval_ns: Some(1), ..Aggregate::default() },
            hists: vec![parse_hist("malloc.size").unwrap()],
            ..Request::default()
        };
        let plans = build(&info, &request).unwrap();
        let mut hist = vec![0; 66];
        hist[3] = 2;
        let mut lat_hist = vec![0; 66];
        lat_hist[22] = 2;
        let snap = Snapshot {
            counts: vec![2, 5, 0],
            dropped: vec![0; 3],
            unblocked: vec![0; 3],
            hists: vec![hist],
            faults: vec![1],
            sums: vec![0],
            latencies: vec![Latency {
                calls: 2,
                total: 3_000_001,
                min: Some(1_500_000),
                max: Some(1_500_001),
                entered: 3,
                hist: lat_hist,
            }],
            ..Snapshot::default()
        };
        let views: Vec<EventView> =
            info.iter().map(|e| EventView { name: e.name, group: e.group, args: e.args }).collect();
        let frame = Frame {
            pid: 1,
            interval: Some(Interval { index: 2, from_ns: 1_000_000_000, to_ns: 2_500_000_000, cumulative: false }),
            end: true,
            ts: 0,
        };
        let left = [Left { gone: 1, ..Left::default() }];
        let mut out = String::new();
        write(&mut out, &plans, &views, &snap, &frame, &left, &mut Fake);
        let bar = "@".repeat(52);
        assert_eq!(
            out,
            format!(
                "interval 2: 1.000-2.500 s (end of run)\n\
                 EVENT         COUNT\n\
                 free              5\n\
                 malloc            2\n\
                 \n\
                 hist malloc.size: 2 values\n\
                 [2, 4)                 2 |{bar}|\n\
                 (1 value could not be read)\n\
                 \n\
                 latency work: 2 calls, total 3000001 ns, min 1500000 ns, mean 1500000 ns, max 1500001 ns\n\
                 [1M, 2M)               2 |{bar}|\n\
                 (1 call did not return: 1 left by longjmp or an exception)\n\
                 \n"
            )
        );
    }

    #[test]
    fn events_of_a_glob_that_were_not_hit_are_left_out() {
        let info: Vec<EventInfo> = ["str_a", "str_b", "str_c", "f"]
            .iter()
            .map(|n| EventInfo {
                definition: if n.starts_with("str") { "p x:str*" } else { "p x:f" },
                ..EventInfo::entry(n, &[])
            })
            .collect();
        let request = Request { asked: Aggregate { count: true, ..Aggregate::default() }, ..Request::default() };
        let plans = build(&info, &request).unwrap();
        let snap =
            Snapshot { counts: vec![0, 4, 0, 0], dropped: vec![0; 4], unblocked: vec![0; 4], ..Snapshot::default() };
        let views: Vec<EventView> =
            info.iter().map(|e| EventView { name: e.name, group: e.group, args: e.args }).collect();
        let frame = Frame { pid: 1, interval: None, end: true, ts: 0 };
        let mut out = String::new();
        write(&mut out, &plans, &views, &snap, &frame, &[], &mut Fake);
        assert_eq!(
            out,
            "EVENT        COUNT\nstr_b            4\nf                0\n(2 more events of globs, not hit)\n\n"
        );
    }
}
