//! Stacks counted by `--by ustack` as a pprof profile (`--pprof FILE`): one sample per key
//! with its hits (sample type `hits`, unit `count`), its stack's frames as locations (the
//! address, the module's mapping, the function as reports name it, the source line where
//! the module has line tables), the key's other parts as labels (`tid`: `1496`), and the
//! event's name as the label `event` when several events are counted by stack. The whole
//! run's keys, `--top` or not. Encoded by `uprobe_contracts::pprof`, gzipped here; the
//! profile is made when the run ends, like the flame graph, never at a hit.

use std::collections::BTreeMap;

use uprobe_contracts::pprof::{Line, Location, Mapping, Profile, Sample, ValueType};

use crate::aggregate::folded;
use crate::aggregate::merge::Snapshot;
use crate::aggregate::plan::Plans;
pub use crate::aggregate::tables::Module;
use crate::aggregate::tables::{self, EventView, Names};
use crate::probe::stacks::CORRUPT;

/// The profile of the stacks counted in `snap`.
pub fn profile(plans: &Plans, events: &[EventView], snap: &Snapshot, names: &mut dyn Names) -> Profile {
    let mut p =
        Profile { sample_types: vec![ValueType { kind: "hits".into(), unit: "count".into() }], ..Profile::default() };
    let has_stack = |e: &usize| plans.events[*e].key.iter().flatten().any(|k| k.key.depth().is_some());
    let stacked: Vec<usize> = (0..plans.events.len()).filter(has_stack).collect();
    let part_names = plans.by.as_ref().map_or(&[][..], |b| b.parts.as_slice());
    // pprof names a profile after its first mapping: the program's goes first (the module
    // that holds the program's entry point), then the others as frames find them.
    let entry = crate::base::sys::auxv(libc::AT_ENTRY).unwrap_or(0);
    if let Some(m) = names.module(entry).filter(|_| entry != 0) {
        add_mapping(&mut p, m);
    }
    let mut locations: BTreeMap<(u64, bool), u64> = BTreeMap::new();
    for &event in &stacked {
        let parts = plans.events[event].key.as_deref().unwrap_or_default();
        let first = snap.keys.iter().filter(|(id, _)| id.event == event);
        for (id, &count) in first {
            let mut sample = Sample { values: vec![count as i64], ..Sample::default() };
            if stacked.len() > 1 {
                sample.labels.push(("event".into(), events[event].name.to_string()));
            }
            for (i, part) in parts.iter().enumerate() {
                let words = &id.words[part.at..part.at + part.key.words()];
                let name = part_names.get(i).map_or("", String::as_str);
                if id.faults & (1 << i) != 0 {
                    sample.labels.push((name.into(), "(fault)".into()));
                } else if part.key.depth().is_some() {
                    let frames = snap.stacks.get(&words[0]).map_or(&[][..], Vec::as_slice);
                    for (depth, &addr) in frames.iter().enumerate() {
                        let caller = depth > 0;
                        let loc = match locations.get(&(addr, caller)) {
                            Some(&loc) => loc,
                            None => {
                                let loc = location(&mut p, addr, caller, names);
                                *locations.entry((addr, caller)).or_insert(loc)
                            }
                        };
                        sample.locations.push(loc);
                    }
                } else {
                    let (text, _) = tables::show_part(part.key, words, events[event].args, &snap.stacks, names);
                    sample.labels.push((name.into(), text));
                }
            }
            p.samples.push(sample);
        }
    }
    p
}

/// Adds the location of frame `addr` (a `caller`'s return address, named by its call).
fn location(p: &mut Profile, addr: u64, caller: bool, names: &mut dyn Names) -> u64 {
    if addr == CORRUPT {
        let function = p.function("[stack unreadable from here]", "");
        return p.location(Location { mapping: 0, address: 0, lines: vec![Line { function, line: 0 }] });
    }
    let name = folded::function(&names.frame(addr, caller));
    let place = names.place(addr, caller);
    let (file, line) = place
        .as_deref()
        .and_then(|pl| pl.rsplit_once(':'))
        .and_then(|(f, l)| Some((f.to_string(), l.parse::<i64>().ok()?)))
        .unwrap_or_default();
    let mapping = match names.module(addr - u64::from(caller)) {
        Some(m) => {
            let id = add_mapping(p, m);
            let kept = &mut p.mappings[id as usize - 1];
            kept.has_filenames |= !file.is_empty();
            kept.has_line_numbers |= line != 0;
            id
        }
        None => 0,
    };
    let function = p.function(&name, &file);
    p.location(Location { mapping, address: addr, lines: vec![Line { function, line }] })
}

/// The id of module `m`'s mapping in `p`, added if it is new.
fn add_mapping(p: &mut Profile, m: Module) -> u64 {
    p.mapping(Mapping {
        start: m.start,
        limit: m.end,
        offset: m.offset,
        file: m.path,
        build_id: m.build_id,
        has_functions: true,
        ..Mapping::default()
    })
}

/// `profile` encoded and gzipped, written to `path`; the error to tell otherwise.
pub fn write(path: &str, profile: &Profile) -> Result<(), String> {
    let bytes = gzip(&profile.encode()).map_err(|e| format!("--pprof {path}: {e}"))?;
    std::fs::write(path, bytes).map_err(|e| format!("--pprof {path}: {e}"))
}

/// `bytes` gzipped, as pprof files are.
pub fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(bytes)?;
    z.finish()
}

/// A hex string of `bytes` (a build ID as pprof spells it).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_round_trips_and_build_ids_are_hex() {
        use std::io::Read;
        let z = gzip(b"profile").unwrap();
        assert_eq!(&z[..2], [0x1f, 0x8b]);
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&z[..]).read_to_end(&mut out).unwrap();
        assert_eq!(out, b"profile");
        assert_eq!(hex(&[0x0a, 0xbc]), "0abc");
        let _ = uprobe_contracts::pprof::decode(&Profile::default().encode()).unwrap();
    }
}
