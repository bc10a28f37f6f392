//! IFUNC symbols (glibc's `strlen`, `memcpy`, `strchr`, `memcmp`): a probe on the name goes
//! on the implementation the dynamic loader chose in the process (whose extent comes from its
//! FDE where the library keeps no symbol for it), counts every call exactly, counts what a
//! probe at the implementation's own address counts, and is listed with that implementation.

use std::path::PathBuf;
use std::process::Command;

use uprobe_tests::{fixture, int3_only, run_uprobe, uprobe_run};

fn program() -> PathBuf {
    fixture("ifunc", &["-O1", "-fno-builtin", "-Wall"])
}

const N: u64 = 1000;
/// Each function, and how many times the fixture calls it from its one call site.
const CALLS: [(&str, &str, u64); 4] = [
    ("strlen", "lengths+", N),
    ("memcpy", "copies+", N + 1),
    ("strchr", "finds+", N + 2),
    ("memcmp", "compares+", N + 3),
];

/// `(caller, count)` rows of the `count EVENT by caller` section of a text report.
fn by_caller(output: &str, event: &str) -> (u64, Vec<(String, u64)>) {
    let title = format!("count {event} by caller: ");
    let mut lines = output.lines().skip_while(|l| !l.starts_with(&title));
    let head = lines.next().unwrap_or_else(|| panic!("no {title:?} in:\n{output}"));
    let hits = head[title.len()..].split_whitespace().next().unwrap().parse().unwrap();
    let rows = lines
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let count = f.get(1)?.parse().ok()?;
            (f.len() == 2).then(|| (f[0].to_string(), count))
        })
        .collect();
    (hits, rows)
}

/// The `-l` line of `libc.so.6:NAME`.
fn listed(name: &str) -> String {
    let mut args = vec!["-l".to_string(), format!("libc.so.6:{name}")];
    if int3_only() {
        args.insert(0, "--no-optimize".into());
    }
    let out = Command::new(uprobe_run()).args(&args).arg(program()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let prefix = format!("libc.so.6:{name} ");
    text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{name} not listed:\n{text}")).to_string()
}

#[test]
fn ifunc_functions_are_probed_at_the_chosen_implementation_with_exact_counts() {
    let program = program();
    let n = N.to_string();
    let mut args: Vec<String> = vec!["--count".into(), "--by".into(), "caller".into()];
    for (name, _, _) in CALLS {
        args.extend(["-e".to_string(), format!("p libc.so.6:{name}")]);
    }
    args.extend([program.display().to_string(), n]);
    let run = run_uprobe(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(run.status.success(), "{:?}\n{}{}", run.status, run.stderr, run.output);
    for (name, caller, calls) in CALLS {
        let (_, rows) = by_caller(&run.output, name);
        let from_fixture: Vec<&(String, u64)> = rows.iter().filter(|(c, _)| c.starts_with(caller)).collect();
        assert_eq!(from_fixture.len(), 1, "{name}: {rows:?}");
        assert_eq!(from_fixture[0].1, calls, "{name}: {rows:?}\n{}", run.output);
    }
}

#[test]
fn ifunc_functions_are_listed_as_their_implementation_and_count_what_its_address_counts() {
    let program = program();
    let libc = std::fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    for (name, _, _) in CALLS {
        let line = listed(name);
        // `libc.so.6:strlen -> __strlen_avx2` (or its address), the offset, size, strategy.
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[1], "->", "{line}");
        let offset = fields[3];
        assert!(offset.starts_with("0x"), "{line}");
        assert!(fields[4].parse::<u64>().unwrap() > 0, "the implementation's size: {line}");
        let strategy = fields[5..].join(" ");
        assert!(strategy == "jump" || strategy.starts_with("int3 ("), "{line}");
        // The same count by name and at the implementation's file offset.
        let by_name = format!("p:by_name libc.so.6:{name}");
        let by_offset = format!("p:by_offset {}:{offset}", libc.display());
        let run = run_uprobe(&["--count", "-e", &by_name, "-e", &by_offset, program.to_str().unwrap(), "500"]);
        assert!(run.status.success(), "{}{}", run.stderr, run.output);
        let count = |event: &str| -> u64 {
            let row = run.output.lines().find(|l| l.split_whitespace().next() == Some(event));
            row.and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or_else(|| panic!("{event}: {}", run.output))
        };
        assert!(count("by_name") >= 500, "{name}: {}", run.output);
        assert_eq!(count("by_name"), count("by_offset"), "{name}: {}", run.output);
    }
}
