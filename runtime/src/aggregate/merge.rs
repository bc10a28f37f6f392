//! Every thread's block added up into a [`Snapshot`], and one interval's share of it
//! ([`since`]). Blocks are read while their threads go on counting: each word is read once,
//! whole; a report is a moment's picture, and the next one catches up.
//!
//! An interval's min and max cannot be told from two pictures: threads keep them per
//! interval (two sets that alternate), and [`extremes`] reads those of the interval that
//! closed.
//!
//! Context: reports (the interval thread, the end of the run). It allocates, with the
//! runtime's own allocator, and takes no lock.

use std::collections::BTreeMap;

use crate::aggregate::blocks::{self, Block};
use crate::aggregate::buckets::LOG2_BUCKETS;
use crate::aggregate::hit::{self, PART_FAULT_SHIFT, WHAT_SHIFT, WHAT_TIMED};
use crate::aggregate::plan::{Plans, CALLS, ENTERED, LAT_HIST, MAX, MAX_KEY_WORDS, MIN, SETS, TOTAL};
use crate::aggregate::stacks;

/// A counted key: its event, which of its parts could not be read (bit i: part i), and its
/// words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyId {
    pub event: usize,
    pub faults: u8,
    pub words: [u64; MAX_KEY_WORDS],
}

impl KeyId {
    /// Event `event`'s key of `words` (the rest zero), every part read.
    pub fn new(event: usize, words: &[u64]) -> KeyId {
        let mut all = [0; MAX_KEY_WORDS];
        all[..words.len()].copy_from_slice(words);
        KeyId { event, faults: 0, words: all }
    }
}

/// A timed function's numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    /// Calls that returned, and their total ns.
    pub calls: u64,
    pub total: u64,
    pub min: Option<u64>,
    pub max: Option<u64>,
    /// Calls that entered (returned or not).
    pub entered: u64,
    pub hist: Vec<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Per event: hits (those of threads without a block included).
    pub counts: Vec<u64>,
    /// Per event: hits whose key found no room in their thread's table.
    pub dropped: Vec<u64>,
    /// Per event: hits of threads that had no block (no key, no values kept).
    pub unblocked: Vec<u64>,
    /// Per event: hits that failed its filter (not in `counts`).
    pub failed: Vec<u64>,
    /// Per histogram: buckets, and values that could not be read.
    pub hists: Vec<Vec<u64>>,
    pub faults: Vec<u64>,
    /// Per histogram: the sum of its values, modulo 2^64 (a signed argument's as i64).
    pub sums: Vec<u64>,
    pub latencies: Vec<Latency>,
    pub keys: BTreeMap<KeyId, u64>,
    /// Histograms split by key: (histogram, key) -> its buckets, faults and sum (also in
    /// `hists`, `faults` and `sums`, which hold every value).
    pub keyed_hists: BTreeMap<(usize, KeyId), KeyedHist>,
    /// Timed calls split by key: (timed function, key) -> its numbers (also in `latencies`).
    pub keyed_latencies: BTreeMap<(usize, KeyId), Latency>,
    /// The stacks of `--by ustack`, by id: frame addresses, innermost first.
    pub stacks: BTreeMap<u64, Vec<u64>>,
    /// The blocks' recent owners and their names (thread ids of threads that may be gone).
    pub names: Vec<(i32, [u8; 16])>,
}

/// One key's histogram.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyedHist {
    pub buckets: Vec<u64>,
    pub faults: u64,
    pub sum: u64,
}

/// What a key slot's tag says: what the slot keeps (`hit::WHAT_SHIFT`), and the key.
fn decode(tag: u64, key: &[core::sync::atomic::AtomicU64]) -> (u64, KeyId) {
    let mut words = [0u64; MAX_KEY_WORDS];
    for (w, k) in words.iter_mut().zip(key) {
        *w = k.load(core::sync::atomic::Ordering::Relaxed);
    }
    let event = ((tag & 0xffff_ffff) - 1) as usize;
    let what = (tag >> WHAT_SHIFT) & 0x7fff;
    (what, KeyId { event, faults: (tag >> PART_FAULT_SHIFT) as u8, words })
}

/// A timed function's numbers from its words in `b`, from `at` on.
fn latency_at(b: Block, at: usize) -> Latency {
    let calls = b.get(at + CALLS);
    Latency {
        calls,
        total: b.get(at + TOTAL),
        min: (calls > 0).then(|| b.get(at + MIN)),
        max: (calls > 0).then(|| b.get(at + MAX)),
        entered: b.get(at + ENTERED),
        hist: (0..LOG2_BUCKETS).map(|k| b.get(at + LAT_HIST + k)).collect(),
    }
}

impl Latency {
    /// Adds `other`'s numbers to these.
    pub fn add(&mut self, other: &Latency) {
        self.calls += other.calls;
        self.total += other.total;
        self.entered += other.entered;
        if self.hist.len() < other.hist.len() {
            self.hist.resize(other.hist.len(), 0);
        }
        for (c, o) in self.hist.iter_mut().zip(&other.hist) {
            *c += o;
        }
        if let Some(m) = other.min {
            fold(&mut self.min, m, u64::min);
        }
        if let Some(m) = other.max {
            fold(&mut self.max, m, u64::max);
        }
    }

    /// What happened since `before`: min and max unknown.
    fn since(&self, b: &Latency) -> Latency {
        Latency {
            calls: self.calls.saturating_sub(b.calls),
            total: self.total.saturating_sub(b.total),
            min: None,
            max: None,
            entered: self.entered.saturating_sub(b.entered),
            hist: self
                .hist
                .iter()
                .enumerate()
                .map(|(i, &x)| x.saturating_sub(b.hist.get(i).copied().unwrap_or(0)))
                .collect(),
        }
    }
}

fn fold(into: &mut Option<u64>, v: u64, keep: fn(u64, u64) -> u64) {
    *into = Some(into.map_or(v, |m| keep(m, v)));
}

/// The blocks added up now.
pub fn take(plans: &Plans) -> Snapshot {
    let n = plans.events.len();
    let mut s = Snapshot {
        counts: (0..n).map(hit::unblocked).collect(),
        dropped: vec![0; n],
        unblocked: (0..n).map(hit::unblocked).collect(),
        failed: vec![0; n],
        hists: plans.hists.iter().map(|h| vec![0; h.scale.buckets()]).collect(),
        faults: vec![0; plans.hists.len()],
        sums: vec![0; plans.hists.len()],
        latencies: plans
            .latencies
            .iter()
            .map(|_| Latency { hist: vec![0; LOG2_BUCKETS], ..Latency::default() })
            .collect(),
        keys: BTreeMap::new(),
        keyed_hists: BTreeMap::new(),
        keyed_latencies: BTreeMap::new(),
        stacks: BTreeMap::new(),
        names: Vec::new(),
    };
    for b in blocks::used() {
        add_block(plans, b, &mut s);
        if plans.by.as_ref().is_some_and(|by| by.comm) {
            s.names.extend(b.owners());
        }
    }
    s
}

/// Each timed function's min and max over the calls that returned in interval `epoch` (see
/// `hit::interval_extremes`).
pub fn extremes(plans: &Plans, epoch: u64) -> Vec<(Option<u64>, Option<u64>)> {
    let mut out = vec![(None, None); plans.latencies.len()];
    for b in blocks::used() {
        for (l, plan) in plans.latencies.iter().enumerate() {
            for set in 0..2 {
                let tag_at = plan.at + SETS + 3 * set;
                if b.get_published(tag_at) == epoch + 1 {
                    fold(&mut out[l].0, b.get(tag_at + 1), u64::min);
                    fold(&mut out[l].1, b.get(tag_at + 2), u64::max);
                }
            }
        }
    }
    out
}

fn add_block(plans: &Plans, b: Block, s: &mut Snapshot) {
    let layout = &plans.layout;
    for i in 0..plans.events.len() {
        s.counts[i] += b.get(layout.counts + i);
        s.dropped[i] += b.get(layout.dropped + i);
        s.failed[i] += b.get(layout.failed + i);
    }
    for (h, plan) in plans.hists.iter().enumerate() {
        for (k, c) in s.hists[h].iter_mut().enumerate() {
            *c += b.get(plan.at + k);
        }
        s.faults[h] += b.get(plan.faults);
        s.sums[h] = s.sums[h].wrapping_add(b.get(plan.sum));
    }
    for (l, plan) in plans.latencies.iter().enumerate() {
        s.latencies[l].add(&latency_at(b, plan.at));
    }
    if plans.events.iter().any(|p| p.key.is_some()) {
        for (at, tag, count, key) in b.keys(layout) {
            let (what, id) = decode(tag, key);
            let values = at + layout.values;
            match what {
                0 if count > 0 => *s.keys.entry(id).or_insert(0) += count,
                0 => {}
                WHAT_TIMED => {
                    let Some(l) = plans.events.get(id.event).and_then(|p| p.latency) else { continue };
                    let lat = latency_at(b, values);
                    s.latencies[l].add(&lat);
                    s.keyed_latencies.entry((l, id)).or_default().add(&lat);
                }
                h => {
                    let h = (h - 2) as usize;
                    let Some(plan) = plans.hists.get(h) else { continue };
                    let n = plan.scale.buckets();
                    let k = s
                        .keyed_hists
                        .entry((h, id))
                        .or_insert_with(|| KeyedHist { buckets: vec![0; n], ..KeyedHist::default() });
                    for i in 0..n {
                        let c = b.get(values + i);
                        k.buckets[i] += c;
                        s.hists[h][i] += c;
                    }
                    let (faults, sum) = (b.get(values + n), b.get(values + n + 1));
                    k.faults += faults;
                    k.sum = k.sum.wrapping_add(sum);
                    s.faults[h] += faults;
                    s.sums[h] = s.sums[h].wrapping_add(sum);
                }
            }
        }
        stacks::gather(b, layout, &mut s.stacks);
    }
}

/// Each timed function's min and max per key over the calls that returned in interval
/// `epoch` (as [`extremes`]).
pub fn keyed_extremes(plans: &Plans, epoch: u64) -> BTreeMap<(usize, KeyId), (Option<u64>, Option<u64>)> {
    let mut out = BTreeMap::new();
    if !plans.latencies.iter().any(|l| plans.events[l.event].key.is_some()) {
        return out;
    }
    let layout = &plans.layout;
    for b in blocks::used() {
        for (at, tag, _, key) in b.keys(layout) {
            let (what, id) = decode(tag, key);
            let Some(l) = plans.events.get(id.event).and_then(|p| p.latency).filter(|_| what == WHAT_TIMED) else {
                continue;
            };
            let e: &mut (Option<u64>, Option<u64>) = out.entry((l, id)).or_default();
            for set in 0..2 {
                let tag_at = at + layout.values + SETS + 3 * set;
                if b.get_published(tag_at) == epoch + 1 {
                    fold(&mut e.0, b.get(tag_at + 1), u64::min);
                    fold(&mut e.1, b.get(tag_at + 2), u64::max);
                }
            }
        }
    }
    out
}

/// What happened between `before` and `now` (both of the same plans): counts, buckets and
/// keys as differences; min and max are unknown (the interval's come from [`extremes`]).
pub fn since(now: &Snapshot, before: &Snapshot) -> Snapshot {
    let minus = |a: &[u64], b: &[u64]| -> Vec<u64> {
        a.iter().enumerate().map(|(i, &x)| x.saturating_sub(b.get(i).copied().unwrap_or(0))).collect()
    };
    let latencies = now
        .latencies
        .iter()
        .enumerate()
        .map(|(i, l)| l.since(&before.latencies.get(i).cloned().unwrap_or_default()))
        .collect();
    let keyed_latencies = now
        .keyed_latencies
        .iter()
        .map(|(k, l)| (*k, l.since(&before.keyed_latencies.get(k).cloned().unwrap_or_default())))
        .filter(|(_, l)| l.calls > 0 || l.entered > 0)
        .collect();
    let keyed_hists = now
        .keyed_hists
        .iter()
        .map(|(k, h)| {
            let b = before.keyed_hists.get(k).cloned().unwrap_or_default();
            let buckets = minus(&h.buckets, &b.buckets);
            (*k, KeyedHist { buckets, faults: h.faults.saturating_sub(b.faults), sum: h.sum.wrapping_sub(b.sum) })
        })
        .filter(|(_, h)| h.faults > 0 || h.buckets.iter().any(|&c| c > 0))
        .collect();
    let keys = now
        .keys
        .iter()
        .filter_map(|(k, &c)| {
            let d = c.saturating_sub(before.keys.get(k).copied().unwrap_or(0));
            (d > 0).then_some((*k, d))
        })
        .collect();
    Snapshot {
        counts: minus(&now.counts, &before.counts),
        dropped: minus(&now.dropped, &before.dropped),
        unblocked: minus(&now.unblocked, &before.unblocked),
        failed: minus(&now.failed, &before.failed),
        hists: now
            .hists
            .iter()
            .enumerate()
            .map(|(i, h)| minus(h, before.hists.get(i).map_or(&[][..], |v| v)))
            .collect(),
        faults: minus(&now.faults, &before.faults),
        // Sums wrap (signed values): the difference does too.
        sums: now
            .sums
            .iter()
            .enumerate()
            .map(|(i, &x)| x.wrapping_sub(before.sums.get(i).copied().unwrap_or(0)))
            .collect(),
        latencies,
        keys,
        keyed_hists,
        keyed_latencies,
        stacks: now.stacks.clone(),
        names: now.names.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_is_the_difference() {
        let key = KeyId::new(0, &[7]);
        let other = KeyId::new(0, &[8]);
        let before = Snapshot {
            counts: vec![10, 1],
            hists: vec![vec![0, 2, 3]],
            faults: vec![1],
            sums: vec![2],
            latencies: vec![Latency {
                calls: 4,
                total: 400,
                min: Some(90),
                max: Some(110),
                entered: 5,
                hist: vec![0, 4],
            }],
            keys: [(key, 5), (other, 1)].into_iter().collect(),
            ..Snapshot::default()
        };
        let now = Snapshot {
            counts: vec![15, 1],
            hists: vec![vec![1, 2, 5]],
            faults: vec![1],
            sums: vec![7],
            latencies: vec![Latency {
                calls: 6,
                total: 700,
                min: Some(80),
                max: Some(180),
                entered: 7,
                hist: vec![0, 6],
            }],
            keys: [(key, 9), (other, 1)].into_iter().collect(),
            ..Snapshot::default()
        };
        let d = since(&now, &before);
        assert_eq!(d.counts, [5, 0]);
        assert_eq!(d.hists, [vec![1, 0, 2]]);
        assert_eq!(d.faults, [0]);
        assert_eq!(d.sums, [5]);
        assert_eq!(
            d.latencies[0],
            Latency { calls: 2, total: 300, min: None, max: None, entered: 2, hist: vec![0, 2] }
        );
        assert_eq!(d.keys.into_iter().collect::<Vec<_>>(), [(key, 4)]);
        let idle = since(&now, &now);
        assert_eq!((idle.latencies[0].min, idle.latencies[0].calls), (None, 0));
    }
}
