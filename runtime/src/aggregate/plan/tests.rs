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
    assert_eq!((&p.events[0].key, &p.events[1].key, &p.events[2].key), (&tid, &tid, &tid));
    assert!(p.hists.iter().all(|h| h.keyed), "the histograms are split by tid, as the timed calls");
    assert_eq!(p.events[2].latency, Some(0));
    let l = p.layout;
    assert_eq!((l.counts, l.dropped), (HEADER_WORDS, HEADER_WORDS + 3));
    assert_eq!((l.failed, p.hists[0].at), (HEADER_WORDS + 6, HEADER_WORDS + 9));
    assert_eq!(p.hists[1].at, p.hists[0].at + LOG2_BUCKETS + 2);
    assert_eq!(p.latencies[0].at, p.hists[1].sum + 1);
    // A slot holds the largest values split by key: a timed call's.
    assert_eq!((l.key_words, l.values, l.value_words, l.slot_words), (1, 3, LATENCY_WORDS, 3 + LATENCY_WORDS));
    assert_eq!((l.key_slots, l.stacks), (KEY_SLOTS, l.keys + KEY_SLOTS * l.slot_words));
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
    let f = [info("f__return", &[], true)];
    r.asked.by = Some("arg2,ustack:3".into());
    let parts = [(Key::Reg(1), 0), (Key::Ustack(3), 1)].map(|(key, at)| KeyPart { key, at });
    assert_eq!(build(&f, &r).unwrap().events[0].key.as_deref(), Some(&parts[..]));
    r.asked.by = Some("size".into());
    assert_eq!(
        build(&f, &r).unwrap_err().to_string(),
        "--by 'size': --latency cannot split calls by size: a timed call's key is tid, comm, caller, \
         ustack[:DEPTH] or arg1 to arg6 (the function's arguments at its entry)"
    );
    let both = build(&[info("malloc", &a, false), info("f__return", &[], true)], &r).unwrap();
    assert_eq!(both.events[1].key, None, "size is malloc's: f is timed as a whole");
    r.asked.by = Some("arg7".into());
    assert!(matches!(build(&f, &r), Err(PlanError::LatencyKey { .. })));
    let timed = EventInfo { definition: "r:latency/ t:f x=%ax", ..info("f__return", &a, true) };
    let e = build(&[timed], &request()).unwrap_err();
    assert_eq!(e.to_string(), "--latency 't:f': WHERE only (a function or a glob), no fetchargs");
}
