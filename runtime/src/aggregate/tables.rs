//! What a report shows, worked out from a snapshot: counts sorted largest first and cut to
//! `--top`, each key as text and as JSON (a thread's name for `--by comm`, whose threads of
//! one name count together; a symbol for a caller), and what became of timed calls that did
//! not return. Pure, given [`Names`] for what only the process knows.

use std::collections::BTreeMap;

use crate::aggregate::merge::{KeyId, Latency, Snapshot};
use crate::aggregate::plan::{Key, KeyPart, Plans};
use crate::probe::stacks::CORRUPT;
use crate::trace::fetch::FetchArg;
use crate::trace::format::{self, json_string, Symbols, Value};

/// What the process knows and a report needs.
pub trait Names: Symbols {
    /// Thread `tid`'s name (`comm`).
    fn comm(&mut self, tid: i32) -> String;
    /// The function timed by event `event`.
    fn function(&mut self, event: usize) -> String;
    /// Whether event `event`'s probe is an `int3` (a timed call then includes the return
    /// from its trap).
    fn trapped(&mut self, event: usize) -> bool;
    /// A stack frame's code address: `symbol+0xoff (module)`, or `FILE+0xoff`; a `caller`'s
    /// is a return address, named by the call before it (a call that does not return may
    /// end its function).
    fn frame(&mut self, addr: u64, _caller: bool) -> String {
        self.symbolize(addr)
    }
    /// A stack frame's source place, `file:line`, where its module has line tables (the
    /// call's, for a `caller`'s return address).
    fn place(&mut self, _addr: u64, _caller: bool) -> Option<String> {
        None
    }
    /// The module file mapped at `addr`, for a profile's mappings.
    fn module(&mut self, _addr: u64) -> Option<Module> {
        None
    }
    /// Whether event `event` was skipped (`--lenient`: its probe could not be placed):
    /// reports show it as skipped, never as a count.
    fn skipped(&mut self, _event: usize) -> bool {
        false
    }
}

/// A module mapped at an address, as a pprof profile's mappings describe it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Module {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub path: String,
    /// In hex; empty if unknown.
    pub build_id: String,
}

/// An event as reports name it.
#[derive(Clone, Copy)]
pub struct EventView<'a> {
    pub name: &'a str,
    pub group: &'a str,
    pub args: &'a [FetchArg],
}

/// The names that reports with one name per event show: `GROUP:EVENT` (as perf spells an
/// event) for an event whose name another group's event shares, the name alone otherwise.
pub fn labels(events: &[EventView]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            if events.iter().any(|o| o.name == e.name && o.group != e.group) {
                format!("{}:{}", e.group, e.name)
            } else {
                e.name.to_string()
            }
        })
        .collect()
}

/// One counted key: its parts as text (one column each), the whole as JSON (one value, or
/// an object with a member per part).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub cells: Vec<String>,
    pub json: String,
    pub count: u64,
}

impl Row {
    /// The key as one text (its parts separated by blanks).
    pub fn text(&self) -> String {
        self.cells.join("  ")
    }
}

/// An event's counts by key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keyed {
    pub event: usize,
    pub total: u64,
    /// Distinct keys, and the rows kept (`--top`): the largest first.
    pub keys: usize,
    pub rows: Vec<Row>,
    /// Keys left out by `--top`, and their hits.
    pub rest: (usize, u64),
    pub dropped: u64,
    pub unblocked: u64,
}

/// What became of a timed function's calls that did not return (the end of the run):
/// pending on the thread that ended the run, left by `longjmp` or an exception, at thread
/// exit, in children that exec'd, and the rest (still running on other threads, or in
/// processes that ended). `missed`: calls not timed at all, for lack of room
/// (`maxactive`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Left {
    pub pending: u64,
    pub gone: u64,
    pub thread_exit: u64,
    pub children: u64,
    pub elsewhere: u64,
    pub missed: u64,
}

impl Left {
    /// `counted` as the runtime's return probes counted them, the rest from the calls that
    /// entered and did not return.
    pub fn of(lat: &Latency, counted: Left) -> Left {
        let known = counted.pending + counted.gone + counted.thread_exit + counted.children;
        let not_returned = lat.entered.saturating_sub(lat.calls);
        Left { elsewhere: not_returned.saturating_sub(known), ..counted }
    }

    pub fn total(&self) -> u64 {
        self.pending + self.gone + self.thread_exit + self.children + self.elsewhere
    }
}

/// Which report this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub pid: i32,
    pub interval: Option<Interval>,
    /// The run's last report (calls that did not return are told then).
    pub end: bool,
    /// CLOCK_MONOTONIC ns at the report (the clock of the events' `ts`).
    pub ts: u64,
}

/// An interval report: its number (from 1), when it began and ended (ns since the run's
/// start), and whether its numbers count from the start of the run (`--cumulative`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    pub index: u64,
    pub from_ns: u64,
    pub to_ns: u64,
    pub cumulative: bool,
}

/// The filtered events' hits, and how many passed (were counted, or timed): (event, hits,
/// passed).
pub fn filtered(plans: &Plans, snap: &Snapshot) -> Vec<(usize, u64, u64)> {
    let passed = |i: usize| match plans.events[i].latency {
        Some(l) => snap.latencies[l].entered,
        None => snap.counts[i],
    };
    (0..plans.events.len())
        .filter(|&i| plans.events[i].filtered)
        .map(|i| (i, passed(i) + snap.failed[i], passed(i)))
        .collect()
}

/// `n` and a noun, in the singular for one.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A histogram as named in reports: `EVENT.ARG`, and a linear one's range and step.
pub fn hist_title(name: &str, scale: &crate::aggregate::buckets::Scale) -> String {
    match scale {
        crate::aggregate::buckets::Scale::Log2 => name.to_string(),
        crate::aggregate::buckets::Scale::Linear { min, max, step } => format!("{name},{min},{max},{step}"),
    }
}

/// The counts of the events not counted by key, largest first: (event, hits), and the events
/// left out by `--top`.
/// `all`: also the events of a glob that were not hit (else they are left out).
pub fn counts(plans: &Plans, snap: &Snapshot, all: bool) -> (Vec<(usize, u64)>, (usize, u64)) {
    let mut rows: Vec<(usize, u64)> = (0..plans.events.len())
        .filter(|&i| plans.events[i].latency.is_none() && plans.events[i].key.is_none())
        .filter(|&i| all || shown(plans, i, snap.counts[i]))
        .map(|i| (i, snap.counts[i]))
        .collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top(rows, plans.request.asked.top, |r| r.1)
}

/// Whether text reports show event `i`, with `n` to show: events of a glob only when they
/// have something.
pub fn shown(plans: &Plans, i: usize, n: u64) -> bool {
    !plans.events[i].shared || n > 0
}

/// How many events of globs (counted ones, or timed ones) a text report leaves out for
/// having nothing to show.
pub fn idle(plans: &Plans, snap: &Snapshot, timed: bool) -> usize {
    (0..plans.events.len())
        .filter(|&i| plans.events[i].latency.is_some() == timed)
        .filter(|&i| {
            let n = match plans.events[i].latency {
                Some(l) => snap.latencies[l].entered.max(snap.latencies[l].calls),
                None => snap.counts[i],
            };
            !shown(plans, i, n)
        })
        .count()
}

pub fn top<T>(mut rows: Vec<T>, n: Option<usize>, count: impl Fn(&T) -> u64) -> (Vec<T>, (usize, u64)) {
    let keep = n.unwrap_or(usize::MAX).min(rows.len());
    let rest: Vec<T> = rows.split_off(keep);
    let hits = rest.iter().map(&count).sum();
    (rows, (rest.len(), hits))
}

/// Event `event`'s counts by key.
pub fn keyed(plans: &Plans, snap: &Snapshot, events: &[EventView], event: usize, names: &mut dyn Names) -> Keyed {
    let parts = plans.events[event].key.as_deref().unwrap_or_default();
    let part_names = plans.by.as_ref().map_or(&[][..], |b| b.parts.as_slice());
    let mut rows: Vec<Row> = Vec::new();
    for (id, &count) in snap.keys.range(first_of(event)..).take_while(|(id, _)| id.event == event) {
        let (cells, json) = show_key(parts, part_names, id, events[event].args, &snap.stacks, names);
        match rows.iter_mut().find(|r| r.cells == cells) {
            Some(r) => r.count += count,
            None => rows.push(Row { cells, json, count }),
        }
    }
    // Stable: equal counts stay in the keys' order.
    rows.sort_by_key(|r| core::cmp::Reverse(r.count));
    let keys = rows.len();
    let (rows, rest) = top(rows, plans.request.asked.top, |r| r.count);
    Keyed {
        event,
        total: snap.counts[event],
        keys,
        rows,
        rest,
        dropped: snap.dropped[event],
        unblocked: snap.unblocked[event],
    }
}

fn first_of(event: usize) -> KeyId {
    KeyId { event, faults: 0, words: [0; crate::aggregate::plan::MAX_KEY_WORDS] }
}

/// A key as text (a cell per part) and as JSON: the part's value for a key of one part, else
/// an object with a member per part, named as `--by` names it.
pub fn show_key(
    parts: &[KeyPart],
    part_names: &[String],
    id: &KeyId,
    args: &[FetchArg],
    stacks: &BTreeMap<u64, Vec<u64>>,
    names: &mut dyn Names,
) -> (Vec<String>, String) {
    let mut cells = Vec::with_capacity(parts.len());
    let mut members = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let (text, json) = if id.faults & (1 << i) != 0 {
            ("(fault)".to_string(), "null".to_string())
        } else {
            show_part(part.key, &id.words[part.at..part.at + part.key.words()], args, stacks, names)
        };
        cells.push(text);
        members.push(json);
    }
    if members.len() == 1 {
        return (cells, members.remove(0));
    }
    let mut json = String::from("{");
    for (i, m) in members.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        json_string(&mut json, part_names.get(i).map_or("", String::as_str).as_bytes());
        json.push(':');
        json.push_str(m);
    }
    json.push('}');
    (cells, json)
}

/// One part of a key as text and as JSON (reports, and a profile's labels).
pub fn show_part(
    key: Key,
    words: &[u64],
    args: &[FetchArg],
    stacks: &BTreeMap<u64, Vec<u64>>,
    names: &mut dyn Names,
) -> (String, String) {
    let mut json = String::new();
    let text = match key {
        Key::Arg(a) => {
            let (ty, named) = (&args[a].ty, args[a].named.as_ref());
            let mut t = Vec::new();
            format::text_value(&mut t, ty, named, &Value::Num(words[0]), names);
            format::json_value(&mut json, ty, named, &Value::Num(words[0]), names);
            String::from_utf8_lossy(&t).into_owned()
        }
        Key::String(_) => {
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).take_while(|&b| b != 0).collect();
            json_string(&mut json, &bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Key::Comm => {
            let name = names.comm(words[0] as u32 as i32);
            json_string(&mut json, name.as_bytes());
            name
        }
        Key::Tid => {
            json = (words[0] as u32).to_string();
            json.clone()
        }
        Key::Reg(_) => {
            json = words[0].to_string();
            json.clone()
        }
        Key::Caller => {
            let name = names.symbolize(words[0]);
            json_string(&mut json, name.as_bytes());
            name
        }
        // One frame a line (the text report indents them); JSON: an array of frames.
        Key::Ustack(_) => {
            let frames: Vec<String> = stacks
                .get(&words[0])
                .map_or(&[][..], |f| f)
                .iter()
                .enumerate()
                .map(|(i, &a)| frame(a, i > 0, names))
                .collect();
            json.push('[');
            for (i, f) in frames.iter().enumerate() {
                if i > 0 {
                    json.push(',');
                }
                json_string(&mut json, f.as_bytes());
            }
            json.push(']');
            frames.join("\n")
        }
    };
    (text, json)
}

/// A stack's frame as reports show it.
fn frame(addr: u64, caller: bool, names: &mut dyn Names) -> String {
    if addr == CORRUPT {
        "[stack unreadable from here]".into()
    } else {
        let name = names.frame(addr, caller);
        match names.place(addr, caller) {
            Some(place) => format!("{name} at {place}"),
            None => name,
        }
    }
}

/// Events for the tests of every report module.
#[cfg(test)]
impl<'a> crate::aggregate::plan::EventInfo<'a> {
    /// An entry event of group `g` at a function's first instruction (for the tests).
    pub fn entry(name: &'a str, args: &'a [FetchArg]) -> Self {
        Self {
            name,
            group: "g",
            definition: "",
            kind: crate::trace::def::Kind::Entry,
            args,
            latency: false,
            at_entry: true,
        }
    }

    /// A `--latency` return event (for the tests).
    pub fn timed_return(name: &'a str) -> Self {
        Self { group: "latency", kind: crate::trace::def::Kind::Return, latency: true, ..Self::entry(name, &[]) }
    }
}

/// Names for tests: every address in hex, every function `work`, no thread names.
#[cfg(test)]
pub(crate) struct PlainNames;

#[cfg(test)]
impl Symbols for PlainNames {
    fn symbolize(&mut self, addr: u64) -> String {
        format!("{addr:#x}")
    }
}

#[cfg(test)]
impl Names for PlainNames {
    fn comm(&mut self, _: i32) -> String {
        String::new()
    }
    fn function(&mut self, _: usize) -> String {
        "work".into()
    }
    fn trapped(&mut self, _: usize) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::plan::{build, EventInfo};
    use crate::aggregate::request::Request;
    use crate::base::spec::Aggregate;
    use crate::trace::fetch::{parse, Site};

    struct Fake;
    impl Symbols for Fake {
        fn symbolize(&mut self, addr: u64) -> String {
            format!("main+{:#x}", addr - 0x1000)
        }
    }
    impl Names for Fake {
        fn comm(&mut self, tid: i32) -> String {
            if tid < 100 {
                "worker".into()
            } else {
                format!("t{tid}")
            }
        }
        fn function(&mut self, _: usize) -> String {
            "f".into()
        }
        fn trapped(&mut self, _: usize) -> bool {
            false
        }
    }

    fn request(by: &str, top: Option<usize>) -> Request {
        Request {
            asked: Aggregate { count: true, by: Some(by.into()), top, ..Aggregate::default() },
            ..Request::default()
        }
    }

    fn key(event: usize, w: u64) -> KeyId {
        KeyId::new(event, &[w])
    }

    #[test]
    fn keys_are_shown_as_their_type_says_and_sorted_largest_first() {
        let args = vec![parse("size=%di:s32", 1, Site::Entry).unwrap()];
        let info = [EventInfo::entry("m", &args)];
        let plans = build(&info, &request("size", Some(2))).unwrap();
        let snap = Snapshot {
            counts: vec![12],
            dropped: vec![1],
            unblocked: vec![0],
            keys: [(key(0, 5), 2), (key(0, 0xffff_ffff), 6), (key(0, 9), 3), (KeyId { faults: 1, ..key(0, 0) }, 1)]
                .into_iter()
                .collect(),
            ..Snapshot::default()
        };
        let views = [EventView { name: "m", group: "g", args: &args }];
        let k = keyed(&plans, &snap, &views, 0, &mut Fake);
        assert_eq!(
            k.rows,
            [
                Row { cells: vec!["-1".into()], json: "-1".into(), count: 6 },
                Row { cells: vec!["9".into()], json: "9".into(), count: 3 }
            ]
        );
        assert_eq!((k.keys, k.rest, k.total, k.dropped), (4, (2, 3), 12, 1));
    }

    #[test]
    fn threads_of_one_name_count_together_and_callers_are_symbols() {
        let info = [EventInfo::entry("m", &[])];
        let plans = build(&info, &request("comm", None)).unwrap();
        let snap = Snapshot {
            counts: vec![10],
            dropped: vec![0],
            unblocked: vec![0],
            keys: [(key(0, 7), 2), (key(0, 8), 3), (key(0, 200), 5)].into_iter().collect(),
            ..Snapshot::default()
        };
        let views = [EventView { name: "m", group: "g", args: &[] }];
        let rows = keyed(&plans, &snap, &views, 0, &mut Fake).rows;
        assert_eq!(
            rows.iter().map(|r| (r.json.as_str(), r.count)).collect::<Vec<_>>(),
            [("\"worker\"", 5), ("\"t200\"", 5)],
            "equal counts in the keys' order"
        );
        let plans = build(&info, &request("caller", None)).unwrap();
        let snap = Snapshot { keys: [(key(0, 0x1010), 4)].into_iter().collect(), ..snap };
        assert_eq!(keyed(&plans, &snap, &views, 0, &mut Fake).rows[0].text(), "main+0x10");
    }

    #[test]
    fn calls_that_did_not_return_add_up() {
        let lat = Latency { calls: 10, entered: 16, ..Latency::default() };
        let left = Left::of(&lat, Left { gone: 3, pending: 1, missed: 2, ..Left::default() });
        assert_eq!((left.elsewhere, left.total(), left.missed), (2, 6, 2));
    }

    #[test]
    fn events_that_share_a_name_are_shown_with_their_group() {
        let views = [
            EventView { name: "ev", group: "a", args: &[] },
            EventView { name: "ev", group: "b", args: &[] },
            EventView { name: "solo", group: "a", args: &[] },
        ];
        assert_eq!(labels(&views), ["a:ev", "b:ev", "solo"]);
    }
}
