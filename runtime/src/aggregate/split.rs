//! Histograms and timed calls split by the `--by` key, as bpftrace keeps `@h[ustack] =
//! hist(x)`: one histogram (or one timed function's numbers) per key, the keys with the most
//! values (calls) first, cut to `--top`, keys shown as counts show them. Pure, given
//! [`Names`].

use crate::aggregate::merge::{KeyId, KeyedHist, Latency, Snapshot};
use crate::aggregate::plan::Plans;
use crate::aggregate::tables::{self, show_key, EventView, Names, Row};

/// A histogram's or a timed function's keys: rows kept (`Row::count`: values, or calls),
/// distinct keys, those left out by `--top` (keys, values), and the values that no key
/// holds (their thread's key table was full, or its stack store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split<T> {
    pub rows: Vec<(Row, T)>,
    pub keys: usize,
    pub rest: (usize, u64),
    pub not_split: u64,
}

/// What a key holds: values that add up, and how many.
pub trait Held: Clone {
    fn add(&mut self, other: &Self);
    fn count(&self) -> u64;
}

impl Held for KeyedHist {
    fn add(&mut self, other: &Self) {
        for (x, y) in self.buckets.iter_mut().zip(&other.buckets) {
            *x += y;
        }
        self.faults += other.faults;
        self.sum = self.sum.wrapping_add(other.sum);
    }
    fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

impl Held for Latency {
    fn add(&mut self, other: &Self) {
        Latency::add(self, other);
    }
    fn count(&self) -> u64 {
        self.calls
    }
}

/// The rows of `items`, keys of event `event`; `not_split` holds the values of every key.
fn split<'a, T: Held + 'a>(
    plans: &Plans,
    snap: &Snapshot,
    events: &[EventView],
    event: usize,
    items: impl Iterator<Item = (&'a KeyId, &'a T)>,
    names: &mut dyn Names,
) -> Split<T> {
    let parts = plans.events[event].key.as_deref().unwrap_or_default();
    let part_names = plans.by.as_ref().map_or(&[][..], |b| b.parts.as_slice());
    let mut rows: Vec<(Row, T)> = Vec::new();
    let mut all = 0;
    for (id, value) in items {
        all += value.count();
        let (cells, json) = show_key(parts, part_names, id, events[event].args, &snap.stacks, names);
        match rows.iter_mut().find(|(r, _)| r.cells == cells) {
            Some((_, v)) => v.add(value),
            None => rows.push((Row { cells, json, count: 0 }, value.clone())),
        }
    }
    for (r, v) in rows.iter_mut() {
        r.count = v.count();
    }
    // Stable: equal counts stay in the keys' order.
    rows.sort_by_key(|(r, _)| core::cmp::Reverse(r.count));
    let keys = rows.len();
    let (rows, rest) = tables::top(rows, plans.request.asked.top, |(r, _)| r.count);
    Split { rows, keys, rest, not_split: all }
}

/// Histogram `h`'s keys.
pub fn hist(plans: &Plans, snap: &Snapshot, events: &[EventView], h: usize, names: &mut dyn Names) -> Split<KeyedHist> {
    let items = snap.keyed_hists.range((h, first())..).take_while(|((k, _), _)| *k == h).map(|((_, id), v)| (id, v));
    let k = split(plans, snap, events, plans.hists[h].event, items, names);
    Split { not_split: snap.hists[h].iter().sum::<u64>().saturating_sub(k.not_split), ..k }
}

/// Timed function `l`'s keys.
pub fn latency(
    plans: &Plans,
    snap: &Snapshot,
    events: &[EventView],
    l: usize,
    names: &mut dyn Names,
) -> Split<Latency> {
    let items =
        snap.keyed_latencies.range((l, first())..).take_while(|((k, _), _)| *k == l).map(|((_, id), v)| (id, v));
    let event = plans.latencies[l].event;
    let k = split(plans, snap, events, event, items, names);
    Split { not_split: snap.latencies[l].calls.saturating_sub(k.not_split), ..k }
}

fn first() -> KeyId {
    KeyId { event: 0, faults: 0, words: [0; crate::aggregate::plan::MAX_KEY_WORDS] }
}
