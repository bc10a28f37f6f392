//! The runtime's numbers as Prometheus metrics: the feed's JSON report lines (see
//! `runtime/src/aggregate/feed.rs` and `json.rs`) turned into metric families, encoded in
//! the text exposition format by the `prometheus` crate. Pure: no socket, no clock.
//!
//! - `uprobe_hits_total{pid,event,group[,KEY...]}`: counts; with `--by`, one series per key,
//!   one label per part of the key. Keys past the bound are not served: their hits go to
//!   `uprobe_hits_cut_total` and their number to `uprobe_keys_cut`. Which keys are served is
//!   decided once (the first ones seen), so every served counter only grows.
//! - `uprobe_hits_dropped_total`: hits whose key found no room in its thread's table;
//!   `uprobe_hits_unkeyed_total`: hits of threads that had no block (counted, no key).
//! - `uprobe_arg_value{pid,event,group,arg}`: `--hist`/`--lhist` as histograms, `_sum` the
//!   sum of the values (NaN from a runtime that does not send it);
//!   `uprobe_arg_faults_total`: values that could not be read.
//! - `uprobe_latency_seconds{pid,function,event}`: `--latency` as histograms.
//! - `uprobe_events`, `uprobe_events_placed`, `uprobe_program_running`,
//!   `uprobe_start_time_seconds`: the session's health.
//!
//! Buckets: the runtime's are `[low, high)` of integers, so a bucket's `le` is `high - 1`
//! (in seconds for latencies): exact, not rounded. A bucket once seen stays in the series.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use prometheus::proto::{Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType};
use serde_json::Value;

/// The default bound on the keys served (`--serve-keys`).
pub const DEFAULT_KEYS: usize = 10_000;

/// Labels every series has; a key part of the same name is prefixed `key_`.
const FIXED: [&str; 6] = ["pid", "event", "group", "function", "arg", "le"];

/// A label name by Prometheus's rules (`[a-zA-Z_][a-zA-Z0-9_]*`, no leading `__`), made from
/// a key's name: other characters become `_`, a clash with a fixed label or a reserved name
/// gets the prefix `key_`.
pub fn label_name(name: &str) -> String {
    let mut out: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if out.is_empty()
        || out.starts_with(|c: char| c.is_ascii_digit())
        || out.starts_with("__")
        || FIXED.contains(&out.as_str())
    {
        out.insert_str(0, "key_");
    }
    out
}

/// A key part's value as a label value: strings as they are (the encoder escapes them),
/// numbers as written, an unreadable value as the text report shows it.
fn label_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "(fault)".into(),
        other => other.to_string(),
    }
}

/// A served key: event, group, labels.
type Served = (String, String, Vec<(String, String)>);

/// What the session keeps from one answer to the next.
pub struct Store {
    bound: usize,
    /// The keys served (event, group, labels), at most `bound`.
    served: HashSet<Served>,
    /// Each histogram series' bucket ends seen so far (`high`, excluded).
    ends: BTreeMap<String, BTreeSet<i128>>,
    /// When the session started (seconds since the epoch).
    start: f64,
}

/// One answer, as metric families.
#[derive(Debug, Default)]
pub struct Families {
    pub list: Vec<MetricFamily>,
}

#[derive(Default)]
struct Builder {
    families: BTreeMap<&'static str, MetricFamily>,
}

impl Builder {
    fn family(&mut self, name: &'static str, help: &str, kind: MetricType) -> &mut MetricFamily {
        self.families.entry(name).or_insert_with(|| {
            let mut f = MetricFamily::default();
            f.set_name(name.into());
            f.set_help(help.into());
            f.set_field_type(kind);
            f
        })
    }

    fn counter(&mut self, name: &'static str, help: &str, labels: &[(String, String)], v: u64) {
        let mut c = Counter::default();
        c.set_value(v as f64);
        let mut m = metric(labels);
        m.set_counter(c);
        self.family(name, help, MetricType::COUNTER).mut_metric().push(m);
    }

    fn gauge(&mut self, name: &'static str, help: &str, labels: &[(String, String)], v: f64) {
        let mut g = Gauge::default();
        g.set_value(v);
        let mut m = metric(labels);
        m.set_gauge(g);
        self.family(name, help, MetricType::GAUGE).mut_metric().push(m);
    }
}

fn metric(labels: &[(String, String)]) -> Metric {
    let mut m = Metric::default();
    m.set_label(
        labels
            .iter()
            .map(|(n, v)| {
                let mut l = LabelPair::default();
                l.set_name(n.clone());
                l.set_value(v.clone());
                l
            })
            .collect(),
    );
    m
}

fn text(line: &Value, field: &str) -> String {
    line.get(field).and_then(Value::as_str).unwrap_or("").to_string()
}

fn number(line: &Value, field: &str) -> u64 {
    line.get(field).and_then(Value::as_u64).unwrap_or(0)
}

impl Store {
    pub fn new(bound: usize, start: f64) -> Store {
        Store { bound, served: HashSet::new(), ends: BTreeMap::new(), start }
    }

    /// The metric families of one answer (JSON lines); a line that is not JSON is an error.
    pub fn update(&mut self, answer: &str) -> Result<Families, serde_json::Error> {
        let mut b = Builder::default();
        let mut end = false;
        let mut pid = String::new();
        // Per keyed event: (keys cut, their hits).
        let mut cut: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for line in answer.lines().filter(|l| !l.trim().is_empty()) {
            let line: Value = serde_json::from_str(line)?;
            if let Some(p) = line.get("pid").and_then(Value::as_i64) {
                pid = p.to_string();
            }
            let base = |more: &[(&str, String)]| -> Vec<(String, String)> {
                std::iter::once(("pid".to_string(), pid.clone()))
                    .chain(more.iter().map(|(n, v)| (n.to_string(), v.clone())))
                    .collect()
            };
            let event = [("event", text(&line, "event")), ("group", text(&line, "group"))];
            match line.get("kind").and_then(Value::as_str).unwrap_or("") {
                "feed" => {
                    end = line.get("end").and_then(Value::as_bool).unwrap_or(false);
                    let labels = base(&[]);
                    b.gauge("uprobe_events", "Events defined in the session.", &labels, number(&line, "events") as f64);
                    b.gauge(
                        "uprobe_events_placed",
                        "Events whose probe is placed (the others wait for their library or were skipped).",
                        &labels,
                        number(&line, "placed") as f64,
                    );
                }
                "count" => match (line.get("key"), line.get("keys")) {
                    (Some(key), _) => {
                        let mut labels = base(&event);
                        match key {
                            Value::Object(parts) => {
                                labels.extend(parts.iter().map(|(n, v)| (label_name(n), label_value(v))));
                            }
                            v => labels.push((label_name(&text(&line, "by")), label_value(v))),
                        }
                        let id = (event[0].1.clone(), event[1].1.clone(), labels.clone());
                        if self.served.contains(&id) || self.served.len() < self.bound {
                            self.served.insert(id);
                            b.counter("uprobe_hits_total", HITS, &labels, number(&line, "count"));
                        } else {
                            let c = cut.entry((event[0].1.clone(), event[1].1.clone())).or_default();
                            c.0 += 1;
                            c.1 += number(&line, "count");
                        }
                    }
                    (None, Some(_)) => {
                        let labels = base(&event);
                        cut.entry((event[0].1.clone(), event[1].1.clone())).or_default();
                        b.counter(
                            "uprobe_hits_dropped_total",
                            "Hits whose key found no room in its thread's table (counted, key lost).",
                            &labels,
                            number(&line, "dropped"),
                        );
                        b.counter(
                            "uprobe_hits_unkeyed_total",
                            "Hits of threads that had no counter block (counted, key lost).",
                            &labels,
                            number(&line, "unblocked"),
                        );
                    }
                    (None, None) => b.counter("uprobe_hits_total", HITS, &base(&event), number(&line, "count")),
                },
                "hist" => {
                    let labels = base(&[event[0].clone(), event[1].clone(), ("arg", text(&line, "arg"))]);
                    let sum = line.get("sum").and_then(Value::as_f64).unwrap_or(f64::NAN);
                    let h = self.histogram(&labels, &line, 1.0, sum);
                    let mut m = metric(&labels);
                    m.set_histogram(h);
                    b.family("uprobe_arg_value", "An argument's values (--hist, --lhist).", MetricType::HISTOGRAM)
                        .mut_metric()
                        .push(m);
                    b.counter(
                        "uprobe_arg_faults_total",
                        "Values that could not be read.",
                        &labels,
                        number(&line, "faults"),
                    );
                }
                "latency" => {
                    let labels = base(&[("function", text(&line, "function")), ("event", text(&line, "event"))]);
                    let sum = number(&line, "total_ns") as f64 / 1e9;
                    let h = self.histogram(&labels, &line, 1e-9, sum);
                    let mut m = metric(&labels);
                    m.set_histogram(h);
                    b.family(
                        "uprobe_latency_seconds",
                        "Time of the calls that returned (--latency).",
                        MetricType::HISTOGRAM,
                    )
                    .mut_metric()
                    .push(m);
                }
                _ => {}
            }
        }
        for ((event, group), (keys, hits)) in cut {
            let labels = vec![("pid".into(), pid.clone()), ("event".into(), event), ("group".into(), group)];
            b.counter("uprobe_hits_cut_total", "Hits of keys past the --serve-keys bound (not served).", &labels, hits);
            b.gauge("uprobe_keys_cut", "Keys past the --serve-keys bound (not served).", &labels, keys as f64);
        }
        let labels = vec![("pid".to_string(), pid)];
        b.gauge(
            "uprobe_program_running",
            "1 while the probed program runs, 0 after its end.",
            &labels,
            if end { 0.0 } else { 1.0 },
        );
        b.gauge(
            "uprobe_start_time_seconds",
            "When the session started, in seconds since the epoch.",
            &labels,
            self.start,
        );
        Ok(Families { list: b.families.into_values().collect() })
    }

    /// A histogram from a line's `[[low, high, count], ...]` (high excluded, null: open), its
    /// bucket ends scaled by `unit`.
    fn histogram(&mut self, labels: &[(String, String)], line: &Value, unit: f64, sum: f64) -> Histogram {
        let id = format!("{labels:?}");
        let ends = self.ends.entry(id).or_default();
        let mut counts: Vec<(Option<i128>, u64)> = Vec::new();
        for b in line.get("buckets").and_then(Value::as_array).into_iter().flatten() {
            let high = b.get(1).and_then(|h| h.as_i64().map(i128::from).or_else(|| h.as_u64().map(i128::from)));
            let count = b.get(2).and_then(Value::as_u64).unwrap_or(0);
            if let Some(h) = high {
                ends.insert(h);
            }
            counts.push((high, count));
        }
        let total: u64 = counts.iter().map(|c| c.1).sum();
        let buckets = ends
            .iter()
            .map(|&end| {
                let mut bucket = Bucket::default();
                bucket.set_upper_bound((end - 1) as f64 * unit);
                bucket.set_cumulative_count(
                    counts.iter().filter(|(h, _)| h.is_some_and(|h| h <= end)).map(|c| c.1).sum(),
                );
                bucket
            })
            .collect();
        let mut h = Histogram::default();
        h.set_bucket(buckets);
        h.set_sample_count(total);
        h.set_sample_sum(sum);
        h
    }
}

const HITS: &str = "Hits of the event (per key with --by).";

/// The families in the text exposition format.
pub fn encode(families: &[MetricFamily]) -> String {
    let mut out = String::new();
    // The families built above always have a name and a metric: nothing to refuse.
    let _ = prometheus::TextEncoder::new().encode_utf8(families, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_follow_the_rules() {
        assert_eq!(label_name("size"), "size");
        assert_eq!(label_name("r->len"), "r__len");
        assert_eq!(label_name("2nd"), "key_2nd");
        assert_eq!(label_name(""), "key_");
        assert_eq!(label_name("__name__"), "key___name__");
        assert_eq!(label_name("pid"), "key_pid");
        assert_eq!(label_name("le"), "key_le");
        assert_eq!(label_name("größe"), "gr__e");
    }

    fn answer(lines: &[&str]) -> String {
        let mut all = vec![r#"{"kind":"feed","pid":7,"end":false,"events":2,"placed":2}"#];
        all.extend_from_slice(lines);
        all.join("\n")
    }

    #[test]
    fn label_values_are_escaped_and_keys_become_labels() {
        let mut store = Store::new(10, 5.0);
        let text = answer(&[
            r#"{"kind":"count","pid":7,"event":"f","group":"g","by":"s","count":6,"keys":3,"dropped":0,"unblocked":0}"#,
            r#"{"kind":"count","pid":7,"event":"f","group":"g","by":"s","key":"a\"b\\c\nd","count":3}"#,
            r#"{"kind":"count","pid":7,"event":"f","group":"g","by":"s","key":null,"count":2}"#,
            r#"{"kind":"count","pid":7,"event":"f","group":"g","by":"s","key":{"tid":12,"r->len":"0x10"},"count":1}"#,
        ]);
        let out = encode(&store.update(&text).unwrap().list);
        let hits: Vec<&str> = out.lines().filter(|l| l.starts_with("uprobe_hits_total")).collect();
        assert_eq!(
            hits,
            [
                r#"uprobe_hits_total{pid="7",event="f",group="g",s="a\"b\\c\nd"} 3"#,
                r#"uprobe_hits_total{pid="7",event="f",group="g",s="(fault)"} 2"#,
                r#"uprobe_hits_total{pid="7",event="f",group="g",r__len="0x10",tid="12"} 1"#,
            ]
        );
        assert!(out.contains("# TYPE uprobe_hits_total counter\n"));
        assert!(out.contains(r#"uprobe_start_time_seconds{pid="7"} 5"#));
    }

    #[test]
    fn keys_past_the_bound_are_cut_and_counted_for_good() {
        let key = |k: u32, n: u32| {
            format!(r#"{{"kind":"count","pid":7,"event":"f","group":"g","by":"k","key":{k},"count":{n}}}"#)
        };
        let summary =
            r#"{"kind":"count","pid":7,"event":"f","group":"g","by":"k","count":0,"keys":0,"dropped":1,"unblocked":2}"#;
        let mut store = Store::new(2, 0.0);
        let first = answer(&[summary, &key(1, 5), &key(2, 4), &key(3, 3)]);
        let out = encode(&store.update(&first).unwrap().list);
        assert!(out.contains(r#"uprobe_hits_total{pid="7",event="f",group="g",k="1"} 5"#));
        assert!(out.contains(r#"uprobe_hits_total{pid="7",event="f",group="g",k="2"} 4"#));
        assert!(!out.contains(r#"k="3""#));
        assert!(out.contains(r#"uprobe_hits_cut_total{pid="7",event="f",group="g"} 3"#));
        assert!(out.contains(r#"uprobe_keys_cut{pid="7",event="f",group="g"} 1"#));
        assert!(out.contains(r#"uprobe_hits_dropped_total{pid="7",event="f",group="g"} 1"#));
        assert!(out.contains(r#"uprobe_hits_unkeyed_total{pid="7",event="f",group="g"} 2"#));
        // Key 3 overtakes: the served keys stay those first served, so counters only grow.
        let second = answer(&[summary, &key(3, 50), &key(1, 6), &key(2, 4), &key(4, 1)]);
        let out = encode(&store.update(&second).unwrap().list);
        assert!(out.contains(r#"k="1"} 6"#) && out.contains(r#"k="2"} 4"#) && !out.contains(r#"k="3""#));
        assert!(out.contains(r#"uprobe_hits_cut_total{pid="7",event="f",group="g"} 51"#));
        assert!(out.contains(r#"uprobe_keys_cut{pid="7",event="f",group="g"} 2"#));
    }

    #[test]
    fn buckets_are_exact_cumulative_and_stay() {
        let mut store = Store::new(10, 0.0);
        let lat = |buckets: &str| {
            answer(&[&format!(
                r#"{{"kind":"latency","pid":7,"function":"w","event":"w__return","probe":"jump","count":3,"total_ns":3000,"buckets":{buckets}}}"#
            )])
        };
        let out = encode(&store.update(&lat("[[512,1024,1],[1024,2048,2]]")).unwrap().list);
        let buckets: Vec<&str> = out.lines().filter(|l| l.contains("_bucket") || l.contains("_sum")).collect();
        assert_eq!(
            buckets,
            [
                r#"uprobe_latency_seconds_bucket{pid="7",function="w",event="w__return",le="0.000001023"} 1"#,
                r#"uprobe_latency_seconds_bucket{pid="7",function="w",event="w__return",le="0.000002047"} 3"#,
                r#"uprobe_latency_seconds_bucket{pid="7",function="w",event="w__return",le="+Inf"} 3"#,
                r#"uprobe_latency_seconds_sum{pid="7",function="w",event="w__return"} 0.000003"#,
            ]
        );
        // Later, only a higher bucket is in the line's range: the others stay, cumulative.
        let out = encode(&store.update(&lat("[[4096,8192,1]]")).unwrap().list);
        assert!(out.contains(r#"le="0.000001023"} 0"#) && out.contains(r#"le="0.000008191"} 1"#));
        let hist = answer(&[
            r#"{"kind":"hist","pid":7,"event":"f","group":"g","arg":"v","count":4,"faults":1,"sum":-3,"min":0,"max":20,"step":10,"buckets":[[null,0,1],[0,10,2],[10,20,0],[20,null,1]]}"#,
        ]);
        let out = encode(&store.update(&hist).unwrap().list);
        let arg: Vec<&str> = out.lines().filter(|l| l.starts_with("uprobe_arg_")).collect();
        assert_eq!(
            arg,
            [
                r#"uprobe_arg_faults_total{pid="7",event="f",group="g",arg="v"} 1"#,
                r#"uprobe_arg_value_bucket{pid="7",event="f",group="g",arg="v",le="-1"} 1"#,
                r#"uprobe_arg_value_bucket{pid="7",event="f",group="g",arg="v",le="9"} 3"#,
                r#"uprobe_arg_value_bucket{pid="7",event="f",group="g",arg="v",le="19"} 3"#,
                r#"uprobe_arg_value_bucket{pid="7",event="f",group="g",arg="v",le="+Inf"} 4"#,
                r#"uprobe_arg_value_sum{pid="7",event="f",group="g",arg="v"} -3"#,
                r#"uprobe_arg_value_count{pid="7",event="f",group="g",arg="v"} 4"#,
            ]
        );
    }

    #[test]
    fn the_end_and_bad_lines() {
        let mut store = Store::new(10, 0.0);
        let out = encode(&store.update(r#"{"kind":"feed","pid":7,"end":true,"events":1,"placed":0}"#).unwrap().list);
        assert!(out.contains(r#"uprobe_program_running{pid="7"} 0"#));
        assert!(out.contains(r#"uprobe_events_placed{pid="7"} 0"#));
        assert!(store.update("not json").is_err());
    }
}
