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
//! keys        key_slots slots of [tag, count, key words, values] (`blocks::Block::slot`)
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
/// The most words of a thread's key table when its slots hold histograms (4 MiB): fewer
/// slots then (a log2 histogram's slot takes 71 words, a timed call's 82, a linear
/// histogram of 1000 buckets about 1000).
pub const KEY_TABLE_WORDS: usize = 512 * 1024;
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
    /// The key's parts, in `--by`'s order: its count (`count_by_key`), its histograms and
    /// its timed calls are split by it.
    pub key: Option<Vec<KeyPart>>,
    pub count_by_key: bool,
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
    /// Split by its event's key: each key's buckets, faults and sum are the values of its
    /// slot in the key table, at the same offsets from `at` as below from the slot's values;
    /// the words below keep the values whose key found no room.
    pub keyed: bool,
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
    /// Words of a key slot: tag, count, key, values (`values` from the slot's start, of
    /// `value_words`: a keyed histogram's buckets, faults and sum, or a keyed timed
    /// function's LATENCY_WORDS; 0 when nothing is split by key but counts).
    pub slot_words: usize,
    pub values: usize,
    pub value_words: usize,
    /// Slots of the key table: KEY_SLOTS, fewer when slots are large (KEY_TABLE_WORDS).
    pub key_slots: usize,
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
    #[error(
        "--by '{key}': --latency cannot split calls by {key}: a timed call's key is tid, comm, caller, ustack[:DEPTH] or arg1 to arg6 (the function's arguments at its entry)"
    )]
    LatencyKey { key: String },
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
            count_by_key: false,
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
                keyed: false,
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
    // `--by` splits the counts (`--count`), the histograms and the timed calls.
    let keyed = request.asked.count || !request.hists.is_empty();
    if let (true, Some(b)) = (keyed, by.as_mut()) {
        'events: for &i in &counted {
            let e = &events[i];
            let mut parts = Vec::new();
            let mut at = 0;
            for name in &b.parts.clone() {
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
                        "caller" if e.kind != Kind::Return && !e.at_entry => {
                            return Err(PlanError::CallerUnknown { event: e.name.to_string() })
                        }
                        p => match special(b, p)? {
                            Some(key) => key,
                            // An event without the argument is counted as a whole.
                            None => continue 'events,
                        },
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
            plans[i].count_by_key = request.asked.count;
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
    for h in hists.iter_mut() {
        h.keyed = plans[h.event].key.is_some();
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
        if let Some(b) = by.as_mut() {
            plans[i].key = latency_key(b, events, &counted)?;
        }
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

/// A part of `--by` that is not an argument of the event: `tid`, `comm`, `caller`,
/// `ustack[:DEPTH]`; None for any other name.
fn special(b: &mut By, part: &str) -> Result<Option<Key>, PlanError> {
    Ok(Some(match part {
        "tid" => Key::Tid,
        "comm" => {
            b.comm = true;
            Key::Comm
        }
        "caller" => Key::Caller,
        p if p.starts_with("ustack") => {
            Key::Ustack(request::ustack_depth(p).map_err(|what| PlanError::BadKey { by: b.name.clone(), what })?)
        }
        _ => return Ok(None),
    }))
}

/// The key of a timed function's calls, taken at its entry: `tid`, `comm`, `caller`,
/// `ustack[:DEPTH]`, and `argN`, its Nth argument (N from 1 to 6, the registers of the
/// x86-64 calling convention). None: timed as a whole, for a part that only the counted
/// events have (as an event without the argument is counted as a whole).
fn latency_key(b: &mut By, events: &[EventInfo], counted: &[usize]) -> Result<Option<Vec<KeyPart>>, PlanError> {
    let mut parts = Vec::new();
    for (at, name) in b.parts.clone().iter().enumerate() {
        let register = name.strip_prefix("arg").and_then(|n| n.parse::<u8>().ok()).filter(|n| (1..=6).contains(n));
        let key = match (special(b, name)?, register) {
            (Some(key), _) => key,
            (None, Some(n)) => Key::Reg(n - 1),
            (None, None) if counted.iter().any(|&i| events[i].args.iter().any(|a| &a.name == name)) => return Ok(None),
            (None, None) => return Err(PlanError::LatencyKey { key: name.clone() }),
        };
        parts.push(KeyPart { key, at });
    }
    Ok(Some(parts))
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
    let hist_values = hists.iter().filter(|h| h.keyed).map(|h| h.scale.buckets() + 2);
    let timed_values = latencies.iter().filter(|l| plans[l.event].key.is_some()).map(|_| LATENCY_WORDS);
    let value_words = hist_values.chain(timed_values).max().unwrap_or(0);
    let values = 2 + key_words;
    let slot_words = values + value_words;
    // A power of two: a slot is found by a mask.
    let key_slots = KEY_SLOTS.min(1 << (KEY_TABLE_WORDS / slot_words).ilog2());
    let stacks = keys + if keyed { key_slots * slot_words } else { 0 };
    let depths = plans.iter().filter_map(|p| p.key.as_ref()).flatten().filter_map(|p| p.key.depth());
    let stack_words = depths.max().map_or(0, |d| 2 + d);
    let words = stacks + stack_words * STACK_SLOTS;
    Layout {
        counts,
        dropped,
        failed,
        keys,
        key_words,
        slot_words,
        values,
        value_words,
        key_slots,
        stacks,
        stack_words,
        words,
    }
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
mod tests;
