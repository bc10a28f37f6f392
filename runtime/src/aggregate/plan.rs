//! What a hit of each event does, and where in a thread's block it counts: made once at
//! start-up from the run's events and what was asked of them ([`build`], pure), checked there
//! (an event or argument that does not exist, a histogram of a string, an event left unused
//! is one line refusing the run), then published for the hit path ([`publish`], [`get`]).
//!
//! A thread's block, in 8-byte words:
//!
//! ```text
//! header      HEADER_WORDS (owner, claims, the last owners' names: `blocks`)
//! counts      one word per event: hits
//! dropped     one word per event: hits whose key found no room in the thread's table
//! failed      one word per event: hits that failed its filter (neither counted nor timed)
//! histograms  per histogram: its buckets, then the values that could not be read
//! latencies   per timed function: LATENCY_WORDS (see the offsets below)
//! keys        KEY_SLOTS slots of [tag, count, key words] (`blocks::Block::count_key`)
//! ```

use core::sync::atomic::{AtomicPtr, Ordering};

use thiserror::Error;

use crate::aggregate::buckets::{Scale, LOG2_BUCKETS};
pub use crate::aggregate::key::{Key, KeyPart, STRING_KEY};
use crate::aggregate::request::{self, Request, STACK_SLOTS};
use crate::probe::stacks::MAX_DEPTH;
use crate::trace::def::Kind;
use crate::trace::fetch::{Base, Fetch, FetchArg};
use crate::trace::names::glob;

pub const HEADER_WORDS: usize = 32;
/// Distinct keys one thread can count (over all events); more are counted as dropped.
pub const KEY_SLOTS: usize = 4096;
/// The most parts a key may have (`--by caller,size,...`), and the most words they take.
pub const MAX_KEY_PARTS: usize = 8;
pub const MAX_KEY_WORDS: usize = 32;

/// A timed function's words: calls that returned, their total, min and max ns, calls that
/// entered, two interval sets of (epoch tag, min, max), and a log2 histogram of ns.
pub const CALLS: usize = 0;
pub const TOTAL: usize = 1;
pub const MIN: usize = 2;
pub const MAX: usize = 3;
pub const ENTERED: usize = 4;
pub const SETS: usize = 5;
pub const LAT_HIST: usize = 11;
pub const LATENCY_WORDS: usize = LAT_HIST + LOG2_BUCKETS;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventPlan {
    /// The event's word in `counts`.
    pub count: usize,
    /// Only counted: no key and no histogram (the hit path's shortest way).
    pub simple: bool,
    /// The key's parts, in `--by`'s order.
    pub key: Option<Vec<KeyPart>>,
    /// Indices into [`Plans::hists`].
    pub hists: Vec<usize>,
    /// Index into [`Plans::latencies`] for a `--latency` event.
    pub latency: Option<usize>,
    /// One of several events of one definition (a glob): text reports leave it out while it
    /// has nothing to show.
    pub shared: bool,
    /// It has a filter (set by `setup` from the event).
    pub filtered: bool,
    /// Its hits go through the event's gate first (`trace::filter::admit`): a filter,
    /// triggers, or switched on and off by one.
    pub gated: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistPlan {
    pub event: usize,
    pub arg: usize,
    /// `EVENT.ARG`, for reports.
    pub name: String,
    pub scale: Scale,
    /// First bucket's word; the faults word follows the last bucket, then the sum of the
    /// values (two's complement: signed values wrap).
    pub at: usize,
    pub faults: usize,
    pub sum: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyPlan {
    pub event: usize,
    /// First word of its LATENCY_WORDS.
    pub at: usize,
}

/// Word offsets of a block's parts, and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub counts: usize,
    pub dropped: usize,
    pub failed: usize,
    pub keys: usize,
    /// Words of a key: 1, or STRING_KEY / 8 when some key is a string.
    pub key_words: usize,
    /// Words of a key slot: tag, count, key.
    pub slot_words: usize,
    /// The stack store (`stacks`) and its slots' words (0: no stack is kept).
    pub stacks: usize,
    pub stack_words: usize,
    pub words: usize,
}

/// The `--by` key as asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct By {
    /// As written (`caller,size`).
    pub name: String,
    /// Its parts' names.
    pub parts: Vec<String>,
    /// A part is `comm`: thread ids are shown, and merged, by their threads' names.
    pub comm: bool,
}

#[derive(Debug)]
pub struct Plans {
    pub events: Vec<EventPlan>,
    pub hists: Vec<HistPlan>,
    pub latencies: Vec<LatencyPlan>,
    pub by: Option<By>,
    pub request: Request,
    pub layout: Layout,
}

/// What plans are made from: one of the run's events.
pub struct EventInfo<'a> {
    pub name: &'a str,
    pub group: &'a str,
    /// The definition as written (for messages).
    pub definition: &'a str,
    pub kind: Kind,
    pub args: &'a [FetchArg],
    /// A `--latency` event: its probe times calls.
    pub latency: bool,
    /// Its probe is at a function's first instruction (where the caller is known).
    pub at_entry: bool,
}

/// Why what was asked does not fit the run's events.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("{option} '{text}': no event named {pattern} (events: {known})")]
    NoEvent { option: &'static str, text: String, pattern: String, known: String },
    #[error("{option} '{text}': event {event} has no argument {arg} (its arguments: {has})")]
    NoArg { option: &'static str, text: String, event: String, arg: String, has: String },
    #[error(
        "--by '{key}': no event has an argument {key} (event {event} has none), and {key} is not tid, comm, caller or ustack"
    )]
    NoKey { key: String, event: String },
    #[error("{option} '{text}': argument {arg} of event {event} is {what}: a histogram needs a number")]
    NotNumber { option: &'static str, text: String, event: String, arg: String, what: &'static str },
    #[error("--by '{key}': argument {key} of event {event} is an array: a key is one number or string")]
    ArrayKey { key: String, event: String },
    #[error("--by '{key}': argument {key} of event {event} has no value at the probe (optimized out)")]
    OptimizedOutKey { key: String, event: String },
    #[error(
        "--by '{key}': argument {key} of event {event} is a floating-point number: a key is an integer or a string"
    )]
    FloatKey { key: String, event: String },
    #[error("--by '{by}': expected {what}")]
    BadKey { by: String, what: String },
    #[error("--by caller: event {event} is not at a function's entry or return, where the caller is known")]
    CallerUnknown { event: String },
    #[error(
        "event {event} ('{definition}') is neither counted nor in a histogram: add --count, or --hist {event}.ARG"
    )]
    Unused { event: String, definition: String },
    #[error("{option}: no key of --by is a stack (ustack[:DEPTH], or an argument $ustack)")]
    NoStack { option: &'static str },
    #[error("--latency '{place}': WHERE only (a function or a glob), no fetchargs")]
    LatencyArgs { place: String },
}

fn arg_names(args: &[FetchArg]) -> String {
    if args.is_empty() {
        return "none".into();
    }
    args.iter().map(|a| a.name.as_str()).collect::<Vec<_>>().join(", ")
}

/// What an argument holds, when it is not one number: None for a number.
fn not_a_number(arg: &FetchArg) -> Option<&'static str> {
    if arg.is_stack() {
        Some("a stack")
    } else if arg.ty.count.is_some() {
        Some("an array")
    } else if arg.fetch == Fetch::OptimizedOut {
        Some("a variable with no value at the probe (optimized out)")
    } else if arg.ty.base == Base::Float {
        Some("a floating-point number")
    } else if arg.ty.is_string() || matches!(arg.fetch, Fetch::Comm | Fetch::ImmediateString(_)) {
        Some("a string")
    } else {
        None
    }
}

/// Makes the plans for `events` and checks `request` against them.
pub fn build(events: &[EventInfo], request: &Request) -> Result<Plans, PlanError> {
    let counted: Vec<usize> = (0..events.len()).filter(|&i| !events[i].latency).collect();
    let mut plans: Vec<EventPlan> = (0..events.len())
        .map(|i| EventPlan {
            count: 0,
            simple: true,
            key: None,
            hists: Vec::new(),
            latency: None,
            shared: events.iter().filter(|e| e.definition == events[i].definition).count() > 1,
            filtered: false,
            gated: false,
        })
        .collect();
    let mut hists = Vec::new();
    for h in &request.hists {
        let matched: Vec<usize> = counted
            .iter()
            .copied()
            .filter(|&i| {
                let e = &events[i];
                glob(&h.event, e.name) || glob(&h.event, &format!("{}/{}", e.group, e.name))
            })
            .collect();
        if matched.is_empty() {
            let known = counted.iter().map(|&i| events[i].name).collect::<Vec<_>>().join(", ");
            let known = if known.is_empty() { "none".into() } else { known };
            return Err(PlanError::NoEvent { option: h.option, text: h.text.clone(), pattern: h.event.clone(), known });
        }
        for i in matched {
            let e = &events[i];
            let Some(arg) = e.args.iter().position(|a| a.name == h.arg) else {
                return Err(PlanError::NoArg {
                    option: h.option,
                    text: h.text.clone(),
                    event: e.name.to_string(),
                    arg: h.arg.clone(),
                    has: arg_names(e.args),
                });
            };
            if let Some(what) = not_a_number(&e.args[arg]) {
                return Err(PlanError::NotNumber {
                    option: h.option,
                    text: h.text.clone(),
                    event: e.name.to_string(),
                    arg: h.arg.clone(),
                    what,
                });
            }
            plans[i].hists.push(hists.len());
            plans[i].simple = false;
            hists.push(HistPlan {
                event: i,
                arg,
                name: format!("{}.{}", e.name, h.arg),
                scale: h.scale,
                at: 0,
                faults: 0,
                sum: 0,
            });
        }
    }
    let mut by = match &request.asked.by {
        Some(k) => Some(parse_by(k)?),
        None => None,
    };
    if let (true, Some(b)) = (request.asked.count, by.as_mut()) {
        'events: for &i in &counted {
            let e = &events[i];
            let mut parts = Vec::new();
            let mut at = 0;
            for name in &b.parts {
                let key = match e.args.iter().position(|a| &a.name == name) {
                    Some(a) if e.args[a].ty.count.is_some() => {
                        return Err(PlanError::ArrayKey { key: name.clone(), event: e.name.to_string() });
                    }
                    Some(a) if e.args[a].fetch == Fetch::OptimizedOut => {
                        return Err(PlanError::OptimizedOutKey { key: name.clone(), event: e.name.to_string() });
                    }
                    Some(a) if e.args[a].ty.base == Base::Float => {
                        return Err(PlanError::FloatKey { key: name.clone(), event: e.name.to_string() });
                    }
                    // A `$ustack` argument counts as `--by ustack:DEPTH` does.
                    Some(a) if e.args[a].is_stack() => match e.args[a].fetch {
                        Fetch::Ustack(depth) => Key::Ustack(usize::from(depth)),
                        _ => Key::Ustack(MAX_DEPTH),
                    },
                    Some(a) if not_a_number(&e.args[a]).is_some() => Key::String(a),
                    Some(a) => Key::Arg(a),
                    None => match name.as_str() {
                        "tid" => Key::Tid,
                        "comm" => {
                            b.comm = true;
                            Key::Comm
                        }
                        "caller" if e.kind == Kind::Return || e.at_entry => Key::Caller,
                        "caller" => return Err(PlanError::CallerUnknown { event: e.name.to_string() }),
                        p if p.starts_with("ustack") => Key::Ustack(
                            request::ustack_depth(p).map_err(|what| PlanError::BadKey { by: b.name.clone(), what })?,
                        ),
                        // An event without the argument is counted as a whole.
                        _ => continue 'events,
                    },
                };
                parts.push(KeyPart { key, at });
                at += key.words();
            }
            if at > MAX_KEY_WORDS {
                let what = format!("a key of at most {MAX_KEY_WORDS} words (a string takes {})", STRING_KEY / 8);
                return Err(PlanError::BadKey { by: b.name.clone(), what });
            }
            plans[i].key = Some(parts);
            plans[i].simple = false;
        }
        if let Some(&first) = counted.first().filter(|_| counted.iter().all(|&i| plans[i].key.is_none())) {
            let has = |p: &String| counted.iter().any(|&i| events[i].args.iter().any(|a| &a.name == p));
            let special = |p: &str| ["tid", "comm", "caller"].contains(&p) || p.starts_with("ustack");
            let missing = b.parts.iter().find(|p| !special(p) && !has(p));
            let key = missing.unwrap_or(&b.name).clone();
            return Err(PlanError::NoKey { key, event: events[first].name.to_string() });
        }
    }
    if !request.asked.count {
        if let Some(&i) = counted.iter().find(|&&i| plans[i].hists.is_empty()) {
            let e = &events[i];
            return Err(PlanError::Unused { event: e.name.to_string(), definition: e.definition.to_string() });
        }
    }
    let mut latencies = Vec::new();
    for (i, e) in events.iter().enumerate().filter(|(_, e)| e.latency) {
        if !e.args.is_empty() {
            let place = e.definition.split_whitespace().nth(1).unwrap_or(e.definition).to_string();
            return Err(PlanError::LatencyArgs { place });
        }
        plans[i].latency = Some(latencies.len());
        plans[i].simple = false;
        latencies.push(LatencyPlan { event: i, at: 0 });
    }
    let stacked = plans.iter().flat_map(|p| p.key.iter().flatten()).any(|p| p.key.depth().is_some());
    let asked = &request.asked;
    let files = [(asked.flamegraph.is_some(), "--flamegraph"), (asked.pprof.is_some(), "--pprof")];
    if let Some(option) = [(request.folded, "--format folded")]
        .into_iter()
        .chain(files)
        .find_map(|(asked, option)| (asked && !stacked).then_some(option))
    {
        return Err(PlanError::NoStack { option });
    }
    let layout = lay_out(events.len(), &mut plans, &mut hists, &mut latencies);
    Ok(Plans { events: plans, hists, latencies, by, request: request.clone(), layout })
}

/// `--by`'s parts: names separated by commas, each once.
fn parse_by(text: &str) -> Result<By, PlanError> {
    let bad = |what: String| PlanError::BadKey { by: text.to_string(), what };
    let parts: Vec<String> = text.split(',').map(|p| p.trim().to_string()).collect();
    let name = |p: &str| p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || p.starts_with("ustack:");
    if parts.iter().any(|p| p.is_empty() || !name(p)) {
        return Err(bad("names separated by commas (an argument, tid, comm, caller or ustack[:DEPTH])".into()));
    }
    if parts.len() > MAX_KEY_PARTS {
        return Err(bad(format!("at most {MAX_KEY_PARTS} parts")));
    }
    if let Some(p) = parts.iter().enumerate().find(|(i, p)| parts[..*i].contains(p)).map(|(_, p)| p) {
        return Err(bad(format!("each part once ({p} is twice)")));
    }
    Ok(By { name: text.to_string(), parts, comm: false })
}

/// Gives every part its words (see the module doc).
fn lay_out(events: usize, plans: &mut [EventPlan], hists: &mut [HistPlan], latencies: &mut [LatencyPlan]) -> Layout {
    let counts = HEADER_WORDS;
    let dropped = counts + events;
    let failed = dropped + events;
    let mut at = failed + events;
    for (i, p) in plans.iter_mut().enumerate() {
        p.count = counts + i;
    }
    for h in hists.iter_mut() {
        h.at = at;
        h.faults = at + h.scale.buckets();
        h.sum = h.faults + 1;
        at = h.sum + 1;
    }
    for l in latencies.iter_mut() {
        l.at = at;
        at += LATENCY_WORDS;
    }
    let key_words = plans.iter().filter_map(|p| p.key.as_ref()).map(|k| k.iter().map(|p| p.key.words()).sum()).max();
    let key_words = key_words.unwrap_or(1);
    let keyed = plans.iter().any(|p| p.key.is_some());
    let keys = (at + 7) & !7;
    let slot_words = 2 + key_words;
    let stacks = keys + if keyed { KEY_SLOTS * slot_words } else { 0 };
    let depths = plans.iter().filter_map(|p| p.key.as_ref()).flatten().filter_map(|p| p.key.depth());
    let stack_words = depths.max().map_or(0, |d| 2 + d);
    let words = stacks + stack_words * STACK_SLOTS;
    Layout { counts, dropped, failed, keys, key_words, slot_words, stacks, stack_words, words }
}

static PLANS: AtomicPtr<Plans> = AtomicPtr::new(core::ptr::null_mut());

/// Publishes the run's plans (start-up, before any probe of theirs is placed). A later
/// attach session's replace those of the session before, which are freed (as its events
/// are, see `trace::events::publish`).
pub fn publish(plans: Plans) {
    let old = PLANS.swap(Box::into_raw(Box::new(plans)), Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: made by Box::into_raw above; no hit, report or feed reads it any more.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// The run's plans, once published (signal-safe).
#[inline(always)]
pub fn plans() -> Option<&'static Plans> {
    // SAFETY: published before any probe of theirs is placed, never changed, and freed only
    // when a later attach session replaces them, once nothing reaches them (see `publish`).
    unsafe { PLANS.load(Ordering::Acquire).as_ref() }
}

/// Event `index`'s plan (hit path).
#[inline(always)]
pub fn get(index: u32) -> Option<(&'static Plans, &'static EventPlan)> {
    let p = plans()?;
    Some((p, p.events.get(index as usize)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::request::{parse_hist, parse_lhist};
    use crate::base::spec::Aggregate;
    use crate::trace::fetch::{parse, Site};

    fn args(list: &[&str]) -> Vec<FetchArg> {
        list.iter().enumerate().map(|(i, a)| parse(a, i + 1, Site::Entry).unwrap()).collect()
    }

    fn request() -> Request {
        Request::default()
    }

    fn info<'a>(name: &'a str, args: &'a [FetchArg], latency: bool) -> EventInfo<'a> {
        EventInfo { definition: "p x:f", latency, ..EventInfo::entry(name, args) }
    }

    #[test]
    fn counts_keys_histograms_and_latencies_get_their_words() {
        let a = args(&["size=%di:u64", "name=+0(%si):string"]);
        let none: Vec<FetchArg> = Vec::new();
        let events = [info("malloc", &a, false), info("free", &none, false), info("work__return", &none, true)];
        let mut r = request();
        r.asked.count = true;
        r.asked.by = Some("tid".into());
        r.hists = vec![parse_hist("malloc.size").unwrap(), parse_lhist("m*.size,0,100,10").unwrap()];
        let p = build(&events, &r).unwrap();
        assert_eq!(p.events[0].hists, [0, 1]);
        let tid = Some(vec![KeyPart { key: Key::Tid, at: 0 }]);
        assert_eq!((&p.events[0].key, &p.events[1].key, &p.events[2].key), (&tid, &tid, &None));
        assert_eq!(p.events[2].latency, Some(0));
        let l = p.layout;
        assert_eq!((l.counts, l.dropped), (HEADER_WORDS, HEADER_WORDS + 3));
        assert_eq!((l.failed, p.hists[0].at), (HEADER_WORDS + 6, HEADER_WORDS + 9));
        assert_eq!(p.hists[1].at, p.hists[0].at + LOG2_BUCKETS + 2);
        assert_eq!(p.latencies[0].at, p.hists[1].sum + 1);
        assert_eq!((l.key_words, l.slot_words), (1, 3));
        assert_eq!(l.words, l.keys + KEY_SLOTS * 3);
        assert_eq!(p.hists[1].name, "malloc.size");
        r.asked.by = Some("name".into());
        r.hists.clear();
        let s = build(&events[..1], &r).unwrap();
        assert_eq!((&s.events[0].key, s.layout.key_words), (&Some(vec![KeyPart { key: Key::String(1), at: 0 }]), 8));
        r.asked.by = Some("caller, name,size".into());
        let m = build(&events[..1], &r).unwrap();
        let parts = [(Key::Caller, 0), (Key::String(1), 1), (Key::Arg(0), 9)].map(|(key, at)| KeyPart { key, at });
        assert_eq!((m.events[0].key.as_deref(), m.layout.key_words), (Some(&parts[..]), 10));
        assert_eq!(m.by.as_ref().unwrap().parts, ["caller", "name", "size"]);
        r.asked.by = Some("name,comm,tid".into());
        let c = build(&events, &r).unwrap();
        assert!(c.by.as_ref().unwrap().comm);
        assert_eq!(c.events[1].key, None, "free has no name: counted as a whole");
        r.asked.by = Some("name,name".into());
        assert_eq!(
            build(&events, &r).unwrap_err().to_string(),
            "--by 'name,name': expected each part once (name is twice)"
        );
        r.asked.by = Some("name,".into());
        assert!(build(&events, &r).unwrap_err().to_string().starts_with("--by 'name,': expected names separated"));
        r.asked.by = Some("name,name2,name3,name4,name5".into());
        let five = args(&[
            "name=+0(%si):string",
            "name2=+0(%si):string",
            "name3=+0(%si):string",
            "name4=+0(%si):string",
            "name5=+0(%si):string",
        ]);
        let e = build(&[info("malloc", &five, false)], &r).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--by 'name,name2,name3,name4,name5': expected a key of at most 32 words (a string takes 8)"
        );
    }

    #[test]
    fn only_counted_events_are_simple() {
        let none: Vec<FetchArg> = Vec::new();
        let mut r = request();
        r.asked.count = true;
        let p = build(&[info("f", &none, false)], &r).unwrap();
        assert!(p.events[0].simple);
        assert_eq!(p.layout.words, p.layout.keys, "no key table without --by");
    }

    #[test]
    fn what_does_not_fit_is_refused_by_name() {
        let a = args(&["size=%di", "s=+0(%si):string", "v=+0(%di):u8[2]"]);
        let mut r = request();
        r.hists = vec![parse_hist("nosuch.size").unwrap()];
        let e = build(&[info("malloc", &a, false)], &r).unwrap_err();
        assert_eq!(e.to_string(), "--hist 'nosuch.size': no event named nosuch (events: malloc)");
        r.hists = vec![parse_hist("malloc.sz").unwrap()];
        let e = build(&[info("malloc", &a, false)], &r).unwrap_err();
        assert_eq!(e.to_string(), "--hist 'malloc.sz': event malloc has no argument sz (its arguments: size, s, v)");
        r.hists = vec![parse_hist("malloc.s").unwrap()];
        let e = build(&[info("malloc", &a, false)], &r).unwrap_err();
        assert!(e.to_string().ends_with("argument s of event malloc is a string: a histogram needs a number"), "{e}");
        r.hists.clear();
        let e = build(&[info("malloc", &a, false)], &r).unwrap_err();
        assert!(e.to_string().starts_with("event malloc ('p x:f') is neither counted nor in a histogram"), "{e}");
        r.asked.count = true;
        r.asked.by = Some("v".into());
        assert!(matches!(build(&[info("malloc", &a, false)], &r), Err(PlanError::ArrayKey { .. })));
        r.asked.by = Some("zz".into());
        let e = build(&[info("malloc", &a, false)], &r).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--by 'zz': no event has an argument zz (event malloc has none), and zz is not tid, comm, caller or ustack"
        );
        let none: Vec<FetchArg> = Vec::new();
        let two = build(
            &[info("malloc", &a, false), info("free", &none, false)],
            &Request { asked: Aggregate { by: Some("size".into()), ..r.asked.clone() }, ..r.clone() },
        )
        .unwrap();
        assert_eq!(
            (&two.events[0].key, &two.events[1].key),
            (&Some(vec![KeyPart { key: Key::Arg(0), at: 0 }]), &None),
            "free is counted as a whole"
        );
        r.asked.by = Some("caller".into());
        let mid = EventInfo { at_entry: false, ..info("mid", &a, false) };
        assert!(matches!(build(&[mid], &r), Err(PlanError::CallerUnknown { .. })));
        let timed = EventInfo { definition: "r:latency/ t:f x=%ax", ..info("f__return", &a, true) };
        let e = build(&[timed], &request()).unwrap_err();
        assert_eq!(e.to_string(), "--latency 't:f': WHERE only (a function or a glob), no fetchargs");
    }
}
