//! Property tests of the spec's encoding, on generated specs (see `testgen`).

use super::super::*;
use crate::testgen::{cuts, Rng, VALUE_CHARS};

const CASES: u64 = 3000;

fn value(rng: &mut Rng) -> String {
    rng.text(VALUE_CHARS, 12)
}

fn values(rng: &mut Rng) -> Vec<String> {
    (0..rng.below(3)).map(|_| value(rng)).collect()
}

fn some<T>(rng: &mut Rng, make: impl FnOnce(&mut Rng) -> T) -> Option<T> {
    (!rng.chance(2)).then(|| make(rng))
}

fn spec(rng: &mut Rng) -> Spec {
    let mut options = Options::default();
    for (name, _) in Options::ALL {
        if rng.chance(3) {
            options.set(name).unwrap();
        }
    }
    let name_chars: Vec<char> = VALUE_CHARS.iter().copied().filter(|&c| c != '=').collect();
    Spec {
        handlers: values(rng),
        // Distinct names: a later param of the same name replaces an earlier one.
        params: (0..rng.below(4)).map(|i| (format!("{}{i}", rng.text(&name_chars, 6)), value(rng))).collect(),
        output: some(rng, value),
        options,
        events: values(rng),
        event_files: values(rng),
        filters: (0..rng.below(3)).map(|_| (rng.number() as usize, value(rng))).collect(),
        max_events: some(rng, Rng::number),
        triggers: values(rng),
        format: some(rng, |r| *r.pick(&Format::ALL[..])),
        buffer_size: some(rng, |r| r.number() as usize),
        list: some(rng, value),
        aggregate: Aggregate {
            count: rng.chance(2),
            by: some(rng, value),
            top: some(rng, |r| r.number() as usize),
            hists: values(rng),
            lhists: values(rng),
            latency: values(rng),
            interval_ns: some(rng, Rng::number),
            cumulative: rng.chance(2),
            feed: some(rng, |r| (r.number() % (i32::MAX as u64 + 1)) as i32),
            flamegraph: some(rng, value),
            pprof: some(rng, value),
        },
    }
}

#[test]
fn every_spec_survives_the_trip() {
    for seed in 0..CASES {
        let spec = spec(&mut Rng::new(seed));
        let text = encode(&spec).unwrap();
        assert_eq!(decode(&text), Ok(spec), "seed {seed}: {text:?}");
    }
}

#[test]
fn a_spec_cut_short_is_refused() {
    for seed in 0..CASES / 10 {
        let text = encode(&spec(&mut Rng::new(seed))).unwrap();
        for cut in cuts(&text) {
            assert!(decode(cut).is_err(), "seed {seed}: {cut:?} was read");
        }
    }
}

#[test]
fn a_spec_changed_anywhere_is_refused() {
    for seed in 0..CASES {
        let mut rng = Rng::new(seed);
        let text = encode(&spec(&mut rng)).unwrap();
        for _ in 0..20 {
            let changed = rng.changed(&text);
            assert!(decode(&changed).is_err(), "seed {seed}: {changed:?} was read");
        }
    }
}

/// Records of any key with any value, sealed with a good check: the decoder reads each
/// record or refuses, never panics, and what it reads encodes back to a spec it reads the same.
#[test]
fn any_records_decode_or_are_refused_without_panic() {
    let keys = [
        "handlers",
        "param",
        "output",
        "option",
        "event",
        "events",
        "filter",
        "max-events",
        "trigger",
        "format",
        "buffer-size",
        "list",
        "count",
        "by",
        "top",
        "hist",
        "lhist",
        "latency",
        "interval",
        "cumulative",
        "feed",
        "flamegraph",
        "pprof",
        "end",
        "",
        "x",
    ];
    let mut read = 0;
    for seed in 0..CASES * 3 {
        let mut rng = Rng::new(seed);
        let mut body = String::new();
        for _ in 0..rng.below(4) {
            let key = *rng.pick::<&str>(&keys[..]);
            body.push_str(key);
            if !rng.chance(8) {
                body.push('\t');
            }
            let v = match rng.below(3) {
                0 => rng.number().to_string(),
                1 => rng.pick(&["follow-exec", "json", "-1", "x=1", "3\tn", "lenient"][..]).to_string(),
                _ => value(&mut rng),
            };
            body.push_str(&v);
            body.push('\n');
        }
        let text = format!("{body}{END}{:016x}", check(body.as_bytes()));
        if let Ok(spec) = decode(&text) {
            read += 1;
            assert_eq!(decode(&encode(&spec).unwrap()), Ok(spec), "seed {seed}: {text:?}");
        }
    }
    assert!(read > CASES as usize / 10, "only {read} generated texts were specs");
}

#[test]
fn values_a_record_cannot_carry_are_refused_when_encoding() {
    let with = |f: fn(&mut Spec)| {
        let mut spec = Spec::default();
        f(&mut spec);
        encode(&spec)
    };
    assert!(matches!(with(|s| s.handlers.push("/a\n/b".into())), Err(SpecError::Unencodable { key: "handlers", .. })));
    assert!(matches!(with(|s| s.params.push(("a=b".into(), "c".into()))), Err(SpecError::Unencodable { .. })));
    assert!(matches!(with(|s| s.events.push("p t:f\0".into())), Err(SpecError::Unencodable { .. })));
    assert!(matches!(with(|s| s.aggregate.feed = Some(-1)), Err(SpecError::Unencodable { .. })));
    assert_eq!(decode(&with(|_| ()).unwrap()), Ok(Spec::default()));
}
