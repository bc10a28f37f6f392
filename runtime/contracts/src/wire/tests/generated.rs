//! Property tests of the wire messages, on generated messages (see `testgen`).

use super::super::*;
use crate::testgen::{cuts, Rng, VALUE_CHARS};

const CASES: u64 = 3000;

fn text(rng: &mut Rng) -> String {
    let mut chars = VALUE_CHARS.to_vec();
    chars.extend(['\n', '\0']);
    rng.text(&chars, 16)
}

fn from_agent(rng: &mut Rng) -> FromAgent {
    let n = |rng: &mut Rng| rng.number() as usize;
    match rng.below(8) {
        0 => FromAgent::Hello {
            pid: 1 + (rng.number() % i32::MAX as u64) as i32,
            tid: 1 + (rng.number() % i32::MAX as u64) as i32,
            preloaded: rng.chance(2),
        },
        1 => FromAgent::Stop,
        2 => FromAgent::Restop,
        3 => FromAgent::Resume,
        4 => FromAgent::Ready { libraries: n(rng), probes: n(rng), jumps: n(rng) },
        5 => FromAgent::Failed { line: text(rng) },
        6 => FromAgent::Detached { probes: n(rng), notes: (0..rng.below(3)).map(|_| text(rng)).collect() },
        _ => FromAgent::Exiting,
    }
}

fn to_agent(rng: &mut Rng) -> ToAgent {
    match rng.below(5) {
        0 => ToAgent::Spec(text(rng)),
        1 => ToAgent::Stopped((0..rng.below(4)).map(|_| rng.number() as usize).collect()),
        2 => ToAgent::Unstoppable(text(rng)),
        3 => ToAgent::Resumed,
        _ => ToAgent::Detach,
    }
}

/// What the other side reads of `m`: free text made one field.
fn sent_from(m: FromAgent) -> FromAgent {
    match m {
        FromAgent::Failed { line } => FromAgent::Failed { line: one_line(&line) },
        FromAgent::Detached { probes, notes } => {
            FromAgent::Detached { probes, notes: notes.iter().map(|n| one_line(n)).collect() }
        }
        m => m,
    }
}

fn sent_to(m: ToAgent) -> ToAgent {
    match m {
        ToAgent::Spec(records) => ToAgent::Spec(records.replace('\0', " ")),
        ToAgent::Unstoppable(why) => ToAgent::Unstoppable(one_line(&why)),
        m => m,
    }
}

#[test]
fn every_message_survives_the_trip_and_no_cut_is_read() {
    for seed in 0..CASES {
        let mut rng = Rng::new(seed);
        let (from, to) = (from_agent(&mut rng), to_agent(&mut rng));
        let (from_text, to_text) = (from.encode(), to.encode());
        assert_eq!(FromAgent::decode(&from_text), Some(sent_from(from)), "seed {seed}");
        assert_eq!(ToAgent::decode(&to_text), Some(sent_to(to)), "seed {seed}");
        for cut in cuts(&from_text) {
            assert_eq!(FromAgent::decode(cut), None, "seed {seed}: {cut:?}");
        }
        for cut in cuts(&to_text) {
            assert_eq!(ToAgent::decode(cut), None, "seed {seed}: {cut:?}");
        }
    }
}

/// Whatever arrives, decoding never panics, and what it reads is what `encode` writes for
/// it, byte for byte: no other text stands for the same message.
#[test]
fn only_exact_encodings_are_read() {
    let verbs = [
        "hello",
        "stop",
        "restop",
        "resume",
        "ready",
        "failed",
        "detached",
        "exiting",
        "stopped",
        "unstoppable",
        "resumed",
        "detach",
        "spec\n",
        "",
    ];
    let mut read = 0;
    for seed in 0..CASES * 5 {
        let mut rng = Rng::new(seed);
        let mut msg = if rng.chance(2) {
            let both = [from_agent(&mut rng).encode(), to_agent(&mut rng).encode()];
            let m = rng.pick(&both).clone();
            if m.is_empty() {
                m
            } else {
                rng.changed(&m)
            }
        } else {
            let mut m = rng.pick(&verbs[..]).to_string();
            for _ in 0..rng.below(4) {
                m.push(*rng.pick(&['\t', ',']));
                m.push_str(&match rng.below(3) {
                    0 => rng.number().to_string(),
                    1 => format!("{:x}", rng.number()),
                    _ => text(&mut rng),
                });
            }
            m
        };
        if rng.chance(4) {
            msg.pop();
        } else if !rng.chance(4) {
            msg.push('\0');
        }
        if let Some(m) = FromAgent::decode(&msg) {
            read += 1;
            assert_eq!(m.encode(), msg, "seed {seed}");
        }
        if let Some(m) = ToAgent::decode(&msg) {
            read += 1;
            assert_eq!(m.encode(), msg, "seed {seed}");
        }
        let mut rips = Vec::with_capacity(4);
        if parse_stopped(msg.as_bytes(), &mut rips) == Some(true) {
            assert_eq!(ToAgent::Stopped(rips).encode(), msg, "seed {seed}");
        }
    }
    assert!(read > CASES as usize / 4, "only {read} generated messages were read");
}
