//! Reports as JSON lines (`--format json`), one object a line. Pure.
//!
//! Every object has `kind` (`count`, `hist` or `latency`) and `pid`; interval reports add
//! `interval` (from 1) and `ts` (CLOCK_MONOTONIC ns, the clock of the events' `ts`).
//!
//! ```text
//! {"kind":"count","event":"malloc","group":"uprobes","count":1532}
//! {"kind":"count","event":"malloc","group":"uprobes","by":"size","count":1532,"keys":57,"dropped":0,"unblocked":0}
//! {"kind":"count","event":"malloc","group":"uprobes","by":"size","key":32,"count":5011}
//! {"kind":"hist","event":"malloc","group":"uprobes","arg":"size","count":1532,"faults":0,"sum":...,
//!  "buckets":[[0,1,3],[2,4,1],...]}                  [low, high, count], high excluded; sum as the type
//! {"kind":"latency","function":"work","event":"work__return","probe":"jump","count":12,"total_ns":...,
//!  "min_ns":...,"max_ns":...,"mean_ns":...,"buckets":[[1048576,2097152,12]]}
//! {"kind":"filter","event":"malloc","group":"uprobes","hits":1532,"passed":12}
//! ```
//!
//! A bucket's open end is `null`. Keys are written as the event shows the argument (numbers,
//! `"0x..."` for `x` types, strings), `null` for a value that could not be read. The last
//! report of the run adds, to each latency, `entered` and `not_returned` (`pending`,
//! `left`, `thread_exit`, `children`, `elsewhere`) and `missed`.

use core::fmt::Write;

use crate::aggregate::buckets::Scale;
use crate::aggregate::merge::{Latency, Snapshot};
use crate::aggregate::plan::Plans;
use crate::aggregate::split;
use crate::aggregate::tables::{self, EventView, Frame, Left, Names};
use crate::trace::fetch::Base;
use crate::trace::format::json_string;

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
    let start = |out: &mut String, kind: &str| {
        let _ = write!(out, "{{\"kind\":\"{kind}\",\"pid\":{}", frame.pid);
        if let Some(i) = frame.interval {
            let _ = write!(out, ",\"interval\":{},\"ts\":{}", i.index, frame.ts);
        }
    };
    let event = |out: &mut String, i: usize| {
        out.push_str(",\"event\":");
        json_string(out, events[i].name.as_bytes());
        out.push_str(",\"group\":");
        json_string(out, events[i].group.as_bytes());
    };
    if plans.request.asked.count {
        let by = plans.by.as_ref().map(|b| b.name.clone());
        for (i, p) in plans.events.iter().enumerate().filter(|(_, p)| p.latency.is_none()) {
            // An event whose key splits only its histograms is counted as a whole.
            let key = p.key.as_ref().filter(|_| p.count_by_key);
            if names.skipped(i) {
                start(out, "count");
                event(out, i);
                if let (Some(by), Some(_)) = (&by, key) {
                    let _ = write!(out, ",\"by\":{}", quoted(by));
                }
                out.push_str(",\"skipped\":true}\n");
                continue;
            }
            match (&by, key) {
                (Some(by), Some(_)) => {
                    let k = tables::keyed(plans, snap, events, i, names);
                    start(out, "count");
                    event(out, i);
                    let _ = writeln!(
                        out,
                        ",\"by\":{},\"count\":{},\"keys\":{},\"dropped\":{},\"unblocked\":{}}}",
                        quoted(by),
                        k.total,
                        k.keys,
                        k.dropped,
                        k.unblocked
                    );
                    for r in &k.rows {
                        start(out, "count");
                        event(out, i);
                        let _ = writeln!(out, ",\"by\":{},\"key\":{},\"count\":{}}}", quoted(by), r.json, r.count);
                    }
                }
                _ => {
                    start(out, "count");
                    event(out, i);
                    let _ = writeln!(out, ",\"count\":{}}}", snap.counts[i]);
                }
            }
        }
    }
    for (h, plan) in plans.hists.iter().enumerate() {
        start(out, "hist");
        event(out, plan.event);
        let arg = plan.name.rsplit('.').next().unwrap_or("");
        if names.skipped(plan.event) {
            let _ = writeln!(out, ",\"arg\":{},\"skipped\":true}}", quoted(arg));
            continue;
        }
        let values: u64 = snap.hists[h].iter().sum();
        let _ = write!(out, ",\"arg\":{},\"count\":{values},\"faults\":{}", quoted(arg), snap.faults[h]);
        let ty = events.get(plan.event).and_then(|e| e.args.get(plan.arg)).map(|a| &a.ty);
        let signed = ty.is_some_and(|ty| ty.base == Base::Signed && ty.bitfield.is_none());
        if signed {
            let _ = write!(out, ",\"sum\":{}", snap.sums[h] as i64);
        } else {
            let _ = write!(out, ",\"sum\":{}", snap.sums[h]);
        }
        let linear = |out: &mut String| {
            if let Scale::Linear { min, max, step } = plan.scale {
                let _ = write!(out, ",\"min\":{min},\"max\":{max},\"step\":{step}");
            }
        };
        linear(out);
        let split = plan.keyed.then(|| split::hist(plans, snap, events, h, names));
        if let (Some(k), Some(by)) = (&split, &plans.by) {
            let _ = write!(out, ",\"by\":{},\"keys\":{},\"not_split\":{}", quoted(&by.name), k.keys, k.not_split);
        }
        out.push_str(",\"buckets\":");
        buckets(out, &plan.scale, &snap.hists[h]);
        out.push_str("}\n");
        for ((r, v), by) in split.iter().flat_map(|k| &k.rows).zip(core::iter::repeat(plans.by.as_ref())) {
            start(out, "hist");
            event(out, plan.event);
            let by = by.map_or("", |b| b.name.as_str());
            let sum = if signed { (v.sum as i64).to_string() } else { v.sum.to_string() };
            let _ = write!(
                out,
                ",\"arg\":{},\"by\":{},\"key\":{},\"count\":{},\"faults\":{},\"sum\":{sum}",
                quoted(arg),
                quoted(by),
                r.json,
                r.count,
                v.faults
            );
            linear(out);
            out.push_str(",\"buckets\":");
            buckets(out, &plan.scale, &v.buckets);
            out.push_str("}\n");
        }
    }
    for (i, hits, passed) in tables::filtered(plans, snap) {
        start(out, "filter");
        event(out, i);
        let _ = writeln!(out, ",\"hits\":{hits},\"passed\":{passed}}}");
    }
    for (l, plan) in plans.latencies.iter().enumerate() {
        let lat = &snap.latencies[l];
        start(out, "latency");
        out.push_str(",\"function\":");
        json_string(out, names.function(plan.event).as_bytes());
        out.push_str(",\"event\":");
        json_string(out, events[plan.event].name.as_bytes());
        if names.skipped(plan.event) {
            out.push_str(",\"skipped\":true}\n");
            continue;
        }
        let probe = if names.trapped(plan.event) { ",\"probe\":\"int3\"" } else { ",\"probe\":\"jump\"" };
        out.push_str(probe);
        let split = plans.events[plan.event].key.is_some().then(|| split::latency(plans, snap, events, l, names));
        let by = plans.by.as_ref().map_or(String::new(), |b| quoted(&b.name));
        if let Some(k) = &split {
            let _ = write!(out, ",\"by\":{by},\"keys\":{},\"not_split\":{}", k.keys, k.not_split);
        }
        timed(out, lat);
        if let Some(left) = left.get(l).filter(|_| frame.end) {
            let _ = write!(
                out,
                ",\"entered\":{},\"not_returned\":{{\"total\":{},\"pending\":{},\"left\":{},\"thread_exit\":{},\
                 \"children\":{},\"elsewhere\":{}}},\"missed\":{}",
                lat.entered,
                left.total(),
                left.pending,
                left.gone,
                left.thread_exit,
                left.children,
                left.elsewhere,
                left.missed
            );
        }
        out.push_str("}\n");
        let function = names.function(plan.event);
        for (r, v) in split.iter().flat_map(|k| &k.rows) {
            start(out, "latency");
            out.push_str(",\"function\":");
            json_string(out, function.as_bytes());
            out.push_str(",\"event\":");
            json_string(out, events[plan.event].name.as_bytes());
            let _ = write!(out, "{probe},\"by\":{by},\"key\":{}", r.json);
            timed(out, v);
            let _ = writeln!(out, ",\"entered\":{}}}", v.entered);
        }
    }
}

/// A timed function's (or key's) numbers: count, total, min, max, mean and buckets.
fn timed(out: &mut String, lat: &Latency) {
    let number = |v: Option<u64>| v.map_or("null".to_string(), |v| v.to_string());
    let mean = (lat.calls > 0).then(|| lat.total / lat.calls);
    let _ = write!(
        out,
        ",\"count\":{},\"total_ns\":{},\"min_ns\":{},\"max_ns\":{},\"mean_ns\":{},\"buckets\":",
        lat.calls,
        lat.total,
        number(lat.min),
        number(lat.max),
        number(mean)
    );
    buckets(out, &Scale::Log2, &lat.hist);
}

fn quoted(s: &str) -> String {
    let mut out = String::new();
    json_string(&mut out, s.as_bytes());
    out
}

/// `[[low, high, count], ...]` from the first non-empty bucket to the last.
fn buckets(out: &mut String, scale: &Scale, counts: &[u64]) {
    out.push('[');
    if let Some(first) = counts.iter().position(|&c| c > 0) {
        let last = counts.iter().rposition(|&c| c > 0).unwrap_or(first);
        for (i, &c) in counts.iter().enumerate().take(last + 1).skip(first) {
            let (low, high) = scale.bounds(i);
            let end = |v: Option<i128>| v.map_or("null".to_string(), |v| v.to_string());
            if i > first {
                out.push(',');
            }
            let _ = write!(out, "[{},{},{c}]", end(low), end(high));
        }
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::merge::{KeyId, KeyedHist};
    use crate::aggregate::plan::{build, EventInfo};
    use crate::aggregate::request::{parse_lhist, Request};
    use crate::aggregate::tables::PlainNames as Fake;
    use crate::base::spec::Aggregate;
    use crate::trace::fetch::{parse, Site};

    #[test]
    fn one_object_a_line_with_the_fields_named() {
        let args = vec![parse("flags=%di:x8", 1, Site::Entry).unwrap()];
        let info = [EventInfo::entry("f", &args), EventInfo::timed_return("w__return")];
        let request = Request {
            asked: Aggregate { count: true, by: Some("flags".into()), ..Aggregate::default() },
            hists: vec![parse_lhist("f.flags,0,20,10").unwrap()],
            json: true,
            folded: false,
        };
        let plans = build(&info, &request).unwrap();
        let snap = Snapshot {
            counts: vec![3, 0],
            dropped: vec![0, 0],
            unblocked: vec![0, 0],
            hists: vec![vec![0, 2, 0, 1]],
            faults: vec![0],
            sums: vec![30],
            latencies: vec![Latency { hist: vec![0; 66], ..Latency::default() }],
            keys: [(KeyId::new(0, &[0x1f]), 3)].into_iter().collect(),
            keyed_hists: [((0, KeyId::new(0, &[0x1f])), KeyedHist { buckets: vec![0, 2, 0, 1], faults: 0, sum: 30 })]
                .into_iter()
                .collect(),
            ..Snapshot::default()
        };
        let views: Vec<EventView> =
            info.iter().map(|e| EventView { name: e.name, group: e.group, args: e.args }).collect();
        let frame = Frame { pid: 9, interval: None, end: false, ts: 0 };
        let mut out = String::new();
        write(&mut out, &plans, &views, &snap, &frame, &[], &mut Fake);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                r#"{"kind":"count","pid":9,"event":"f","group":"g","by":"flags","count":3,"keys":1,"dropped":0,"unblocked":0}"#,
                r#"{"kind":"count","pid":9,"event":"f","group":"g","by":"flags","key":"0x1f","count":3}"#,
                r#"{"kind":"hist","pid":9,"event":"f","group":"g","arg":"flags","count":3,"faults":0,"sum":30,"min":0,"max":20,"step":10,"by":"flags","keys":1,"not_split":0,"buckets":[[0,10,2],[10,20,0],[20,null,1]]}"#,
                r#"{"kind":"hist","pid":9,"event":"f","group":"g","arg":"flags","by":"flags","key":"0x1f","count":3,"faults":0,"sum":30,"min":0,"max":20,"step":10,"buckets":[[0,10,2],[10,20,0],[20,null,1]]}"#,
                r#"{"kind":"latency","pid":9,"function":"work","event":"w__return","probe":"jump","count":0,"total_ns":0,"min_ns":null,"max_ns":null,"mean_ns":null,"buckets":[]}"#,
            ]
        );
    }
}
