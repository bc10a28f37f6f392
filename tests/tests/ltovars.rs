//! DWARF variables of a link-time optimized program (`gcc -g -O2 -flto`, `fixtures/ltovars.c`
//! and `ltovars_lib.c`), whose names and types lie in other units than its code's: a struct
//! parameter's fields at a function's entry and at a line, the parameters of a static
//! function of the other unit inlined into it, `--vars` at both; the same values as the
//! kernel's uprobes read through `perf probe`. Then Debian's python3.11 (built with LTO) with
//! its debug file, against `perf probe` there, where both are installed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use uprobe_tests::{gcc, kernel_run, run_plain, run_uprobe, tempfile, tracefs, uprobe_run};

/// The kernel's uprobes that perf places are in the file, for every process that runs it:
/// the tests of this file run one at a time.
static ONE: Mutex<()> = Mutex::new(());

fn one() -> MutexGuard<'static, ()> {
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn prog() -> PathBuf {
    gcc("ltovars", &["fixtures/ltovars.c", "fixtures/ltovars_lib.c"], &["-g", "-O2", "-flto", "-Wall", "-Wextra"])
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const ENTRY: &str = "id=it->id price=it->price name=it->name:string total=it->total qty";
/// In `lib_weigh`, inlined from ltovars_lib.c with `weigh`.
const INLINED: &str = "eid=entry->id ename=entry->name:string count n";
const LINE: &str = "w total=it->total name=it->name:string";

#[test]
fn fields_at_the_entry_and_at_a_line_print_their_c_values() {
    let _one = one();
    let prog = prog();
    assert_eq!(String::from_utf8_lossy(&run_plain(&prog, &[]).stdout), "sum=213\n");
    let run = run_uprobe(&[
        "-e",
        &format!("p account {ENTRY}"),
        "-e",
        &format!("p ltovars_lib.c:14 {INLINED}"),
        "-e",
        &format!("p ltovars.c:14 {LINE}"),
        s(&prog),
    ]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, "sum=213\n");
    assert_eq!(
        run.records("account"),
        [
            r#"id=7 price=120 name="bolt" total=0 qty=1"#,
            r#"id=8 price=-40 name="nut" total=0 qty=2"#,
            r#"id=9 price=5 name="washer" total=0 qty=3"#,
        ]
    );
    assert_eq!(
        run.records("ltovars_lib_L14"),
        [
            r#"eid=7 ename="bolt" count=1 n=1"#,
            r#"eid=8 ename="nut" count=2 n=2"#,
            r#"eid=9 ename="washer" count=3 n=3"#
        ]
    );
    // w = price * qty * 3 + id, before it is added to the total.
    assert_eq!(
        run.records("ltovars_L14"),
        [r#"w=367 total=0 name="bolt""#, r#"w=-232 total=0 name="nut""#, r#"w=54 total=0 name="washer""#]
    );
}

/// `uprobe-run --vars PLACE` of the fixture.
fn vars(place: &str) -> String {
    let out = Command::new(uprobe_run()).args(["--vars", place, s(&prog())]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn vars_lists_the_variables_of_every_unit() {
    let _one = one();
    assert_eq!(
        vars("account"),
        "Available variables at account\n\t@<account+0>\n\t\tstruct item*\tit\t%di:x64\n\
         \t\tint\tqty\t%si:s32\n\t\tlong int\tw\t(optimized out)\n"
    );
    // The inlined functions' parameters, named and typed in ltovars_lib.c's unit.
    let text = vars("ltovars_lib.c:14");
    let lines: Vec<&str> = text.lines().collect();
    for want in [
        "\t\tstruct item*\tit\t%di:x64",
        "\t\tstruct item*\tentry\t%di:x64",
        "\t\tint\tcount\t%si:s32",
        "\t\tint\tn\t%si:s32",
        "\t\tconst struct item*\tthing\t(optimized out)",
    ] {
        assert!(lines.contains(&want), "{want:?} not in\n{text}");
    }
    let text = vars("ltovars.c:14");
    assert!(text.contains("\t\tstruct item*\tit\t%di:x64\n"), "{text}");
    assert!(text.contains("\t\tlong int\tw\t%dx:s64\n"), "{text}");
}

/// The `NAME=VALUE` words of `event`'s records in the trace, unsigned hex made decimal.
fn traced(trace: &str, event: &str) -> Vec<String> {
    let number = |v: &str| match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).map_or(v.to_string(), |n| n.to_string()),
        None => v.to_string(),
    };
    trace
        .lines()
        .filter(|l| l.contains(&format!(" {event}: (")))
        .map(|l| {
            let args = l.split_once(") ").map_or("", |(_, a)| a);
            let words: Vec<String> = args
                .split(' ')
                .map(|kv| kv.split_once('=').map_or(kv.to_string(), |(k, v)| format!("{k}={}", number(v))))
                .collect();
            words.join(" ")
        })
        .collect()
}

/// Adds perf probe events (`NAME=PLACE ARGS`) to `group`, runs `run` with them enabled and
/// gives the trace; None (said) where perf or tracefs cannot.
fn with_perf(prog: &str, group: &str, specs: &[(String, String)], run: impl FnOnce()) -> Option<String> {
    let Ok(tracing) = tracefs() else {
        eprintln!("skipped: no writable tracefs (needs root)");
        return None;
    };
    if Command::new("perf").arg("--version").output().is_err() {
        eprintln!("skipped: perf is not installed");
        return None;
    }
    let delete = || {
        for (e, _) in specs {
            let _ = Command::new("perf").args(["probe", "-d", &format!("{group}:{e}")]).output();
        }
    };
    for (e, spec) in specs {
        let added = Command::new("perf").args(["probe", "-x", prog, "-a", &format!("{e}={spec}")]).output().unwrap();
        if !added.status.success() {
            delete();
            eprintln!("skipped: perf probe could not add {spec}: {}", String::from_utf8_lossy(&added.stderr));
            return None;
        }
    }
    let events: Vec<&str> = specs.iter().map(|(e, _)| e.as_str()).collect();
    let ((), trace) = kernel_run(&tracing, group, &events, run);
    delete();
    Some(trace)
}

#[test]
fn values_equal_what_perf_probe_reads_with_the_kernel() {
    let _one = one();
    let prog = prog();
    let id = std::process::id();
    let (entry, inlined, line) = (format!("lto{id}"), format!("ltoi{id}"), format!("ltol{id}"));
    let specs = [
        (entry.clone(), format!("account {ENTRY}")),
        (inlined.clone(), format!("ltovars_lib.c:14 {INLINED}")),
        (line.clone(), format!("ltovars.c:14 {LINE}")),
    ];
    let Some(trace) = with_perf(s(&prog), "probe_ltovars", &specs, || {
        assert!(run_plain(&prog, &[]).status.success());
    }) else {
        return;
    };
    let ours = run_uprobe(&[
        "-e",
        &format!("p:t/{entry} account {ENTRY}"),
        "-e",
        &format!("p:t/{inlined} ltovars_lib.c:14 {INLINED}"),
        "-e",
        &format!("p:t/{line} ltovars.c:14 {LINE}"),
        s(&prog),
    ]);
    assert!(ours.status.success(), "{}", ours.stderr);
    assert_eq!(traced(&trace, &entry).len(), 3, "{trace}");
    assert_eq!(ours.records(&entry), traced(&trace, &entry), "{trace}");
    assert_eq!(ours.records(&inlined), traced(&trace, &inlined), "{trace}");
    assert_eq!(ours.records(&line), traced(&trace, &line), "{trace}");
}

const PYTHON: &str = "/usr/bin/python3.11";

/// Whether Debian's python3.11 and its debug file are installed (`--vars` finds its DWARF).
fn python_debug() -> bool {
    let out = Command::new(uprobe_run()).args(["--vars", "list_append", PYTHON]).output().unwrap();
    if !out.status.success() {
        eprintln!("skipped: {PYTHON} with its debug file: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    out.status.success()
}

/// A short script that appends to lists.
fn script() -> PathBuf {
    let path = tempfile("lto.py");
    std::fs::write(&path, "a = []\nfor i in range(3):\n    a.append(i)\na.append('x')\nprint(len(a))\n").unwrap();
    path
}

/// python3.11 is built with link-time optimization: `list_append` (static in listobject.c)
/// is `list_append.lto_priv.0` in its symbols, which the stripped program does not have; it
/// is placed at its file offset and named as perf probe names it.
#[test]
fn python_list_append_as_perf_probe_reads_it() {
    let _one = one();
    if !python_debug() {
        return;
    }
    let listed = Command::new(uprobe_run()).args(["--vars", "list_append", PYTHON]).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        "Available variables at list_append\n\t@<list_append+0>\n\t\tPyListObject*\tself\t%di:x64\n\
         \t\tPyObject*\tobject\t%si:x64\n"
    );
    let args = "size=self->ob_base.ob_size tp=object->ob_type->tp_name:string refs=object->ob_refcnt";
    let script = script();
    let ours = run_uprobe(&["-e", &format!("p list_append {args}"), PYTHON, s(&script)]);
    assert!(ours.status.success(), "{}", ours.stderr);
    assert_eq!(ours.stdout, "4\n");
    let mine = ours.records("list_append");
    // The script's own appends, last: to a list of 0, 1, 2 items, then 3.
    let tail: Vec<&str> = mine.iter().rev().take(4).rev().map(|r| r.split(" refs=").next().unwrap()).collect();
    assert_eq!(tail, [r#"size=0 tp="int""#, r#"size=1 tp="int""#, r#"size=2 tp="int""#, r#"size=3 tp="str""#]);
    // Without a variable, the function is placed by the DWARF as well, entry and return.
    let plain = run_uprobe(&["--count", "-e", "p list_append", "-e", "r list_append", PYTHON, s(&script)]);
    assert!(plain.status.success(), "{}", plain.stderr);
    let counts: Vec<&str> = plain.output.lines().filter(|l| l.starts_with("list_append")).collect();
    let n = mine.len();
    assert_eq!(counts.len(), 2, "{}", plain.output);
    for line in counts {
        assert!(line.ends_with(&format!(" {n}")), "{n} calls: {}", plain.output);
    }
    let event = format!("pyla{}", std::process::id());
    let Some(trace) = with_perf(PYTHON, "probe_python3", &[(event.clone(), format!("list_append {args}"))], || {
        assert!(run_plain(Path::new(PYTHON), &[s(&script)]).status.success());
    }) else {
        return;
    };
    let _ = std::fs::remove_file(&script);
    assert_eq!(mine, traced(&trace, &event), "{trace}");
}
