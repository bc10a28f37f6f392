//! Keys of several parts (`--count --by caller,size`): each combination counted as often as
//! the same run's stream has it, a column per part in the text report and an object with a
//! member per part in JSON; a part that cannot be read is shown as such, the others kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use uprobe_tests::{fixture, run_uprobe};

fn target() -> PathBuf {
    fixture("filter", &["-O1", "-g", "-fno-inline", "-Wall", "-Wextra"])
}

const CALLS: &str = "300";

fn take_def(program: &Path) -> String {
    format!("p:f/take {}:take size=%di:u64 delta=%si:s32 name=+0(%dx):string flags=%cx:u32", program.display())
}

/// `name=VALUE` of a record (a quoted string without its quotes).
fn field<'a>(record: &'a str, name: &str) -> &'a str {
    let at = record.find(&format!(" {name}=")).unwrap_or_else(|| panic!("{name} in {record}")) + name.len() + 2;
    let rest = &record[at..];
    match rest.strip_prefix('"') {
        Some(q) => &q[..q.find('"').unwrap()],
        None => rest.split(' ').next().unwrap(),
    }
}

/// The text report's rows of `count take by ...`: cells -> count.
fn table(output: &str) -> BTreeMap<Vec<String>, u64> {
    let mut rows = BTreeMap::new();
    let mut inside = false;
    for line in output.lines() {
        if line.starts_with("count take by ") {
            inside = true;
            continue;
        }
        if !inside || line.trim().is_empty() {
            inside = false;
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let (count, cells) = words.split_last().unwrap();
        if *count == "COUNT" {
            continue;
        }
        rows.insert(cells.iter().map(|c| c.to_string()).collect(), count.parse().unwrap());
    }
    rows
}

#[test]
fn every_combination_counts_as_the_stream_has_it() {
    let program = target();
    let p = program.display().to_string();
    let def = take_def(&program);
    let stream = run_uprobe(&["-e", &def, &p, CALLS]);
    assert!(stream.status.success(), "{}{}", stream.stderr, stream.output);
    let records: Vec<&str> = stream.output.lines().filter(|l| l.contains(" take: (")).collect();
    assert_eq!(records.len(), 301);
    let mut want: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    for r in &records {
        let name = field(r, "name");
        *want.entry(vec![name.to_string(), field(r, "flags").to_string()]).or_default() += 1;
    }
    assert!(want.len() > 100, "the key has many combinations: {}", want.len());

    let counted = run_uprobe(&["-e", &def, "--count", "--by", "name,flags", &p, CALLS]);
    assert!(counted.status.success(), "{}{}", counted.stderr, counted.output);
    assert!(counted.output.contains("  name            flags        COUNT\n"), "{}", counted.output);
    assert_eq!(table(&counted.output), want);
    assert_eq!(want.get(&vec!["(fault)".to_string(), "1".to_string()]), Some(&1), "the bad pointer's part");

    // Three parts, one of them the caller and one a filtered-in subset.
    let small = format!("{def} if size < 20000");
    let three = run_uprobe(&["-e", &small, "--count", "--by", "caller,name,comm", &p, CALLS, "clean"]);
    assert!(three.status.success(), "{}{}", three.stderr, three.output);
    let mut want3: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    for r in records.iter().filter(|r| field(r, "name") != "(fault)") {
        if field(r, "size").parse::<u64>().unwrap() < 20000 {
            *want3.entry(vec![field(r, "name").to_string()]).or_default() += 1;
        }
    }
    let got3: BTreeMap<Vec<String>, u64> = table(&three.output)
        .into_iter()
        .map(|(cells, n)| {
            assert!(cells[0].starts_with("main+0x"), "{cells:?}");
            assert_eq!(cells[2], "filter");
            (vec![cells[1].clone()], n)
        })
        .collect();
    assert_eq!(got3, want3);
}

#[test]
fn json_keys_are_objects_with_a_member_per_part() {
    let program = target();
    let p = program.display().to_string();
    let r = run_uprobe(&["-e", &take_def(&program), "--count", "--by", "tid,name,delta", "--format", "json", &p, "40"]);
    assert!(r.status.success(), "{}{}", r.stderr, r.output);
    let rows: Vec<serde_json::Value> = r
        .output
        .lines()
        .filter(|l| l.contains("\"key\":"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(rows.iter().map(|v| v["count"].as_u64().unwrap()).sum::<u64>(), 41);
    for v in &rows {
        let key = v["key"].as_object().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(key.keys().map(String::as_str).collect::<Vec<_>>(), ["delta", "name", "tid"], "{v}");
        assert!(key["tid"].as_u64().unwrap() > 0 && key["delta"].is_i64());
        assert_eq!(v["by"], "tid,name,delta");
    }
    assert!(rows.iter().any(|v| v["key"]["name"].is_null()), "the bad pointer's name is null");
}

#[test]
fn bad_keys_are_refused_by_name() {
    let program = target();
    let p = program.display().to_string();
    let refused = |by: &str| {
        let r = run_uprobe(&["-e", &take_def(&program), "--count", "--by", by, &p, "3"]);
        assert_eq!(r.status.code(), Some(2), "{by}: {}{}", r.stderr, r.output);
        assert_eq!(r.stdout, "");
        r.stderr
    };
    assert_eq!(refused("name,name"), "uprobe-run: --by 'name,name': expected each part once (name is twice)\n");
    assert!(refused("caller,,size").contains("expected names separated by commas"));
    assert!(refused("size,nosuch").contains("--by 'nosuch': no event has an argument nosuch"));
}
