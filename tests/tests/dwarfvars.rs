//! DWARF variables by name (`-e 'p parse len b->data:string'`): parameters, struct fields
//! through pointers and dots, array elements, signed, unsigned, bool and enum values, a
//! constant and a variable not live at the entry (`(optimized out)`), in events and in
//! `--count --by`; `--vars FUNC`; the same places read by the kernel's uprobes through
//! `perf probe`; bad names refused before the program starts. Then the same at source lines
//! (`fixtures/linevars.c`): a variable on the stack found from the CFA at the line, one not
//! live at one line and live at the next, the values the program prints and those perf
//! probe reads with the kernel, `--vars FUNC:LINE` against `perf probe -V`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use uprobe_tests::{fixture, gcc, kernel_run, run_plain, run_uprobe, tracefs, uprobe_run, uprobe_run_raw};

fn prog() -> PathBuf {
    fixture("dwarfvars", &["-O2", "-g", "-Wall", "-Wextra"])
}

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

const PARSE: &str = "p parse len b->data:string flags b->arr[2] b->in.s b->in.c b->col b->ok name:string blen=b->len";

#[test]
fn parameters_fields_and_elements_print_their_c_values() {
    let prog = prog();
    let plain = run_plain(&prog, &[]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "r=103\n");
    let run = run_uprobe(&["-e", PARSE, "-e", "p classify sc flag c u", "-e", "p sum scaled n a[1] total", s(&prog)]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, "r=103\n");
    assert_eq!(
        run.records("parse"),
        [
            r#"len=2 data="hello" flags=16 arr=3 s=-5 c=200 col=BLUE ok=true name="other" blen=41"#,
            r#"len=3 data="hello" flags=32 arr=3 s=-5 c=200 col=BLUE ok=true name="second" blen=42"#,
            r#"len=4 data="hello" flags=48 arr=3 s=-5 c=200 col=BLUE ok=true name="other" blen=43"#,
        ]
    );
    assert_eq!(
        run.records("classify"),
        [
            "sc=-3 flag=true c=GREEN u=65535",
            "sc=4 flag=false c=BLUE u=1",
            "sc=0 flag=true c=BLUE u=2",
            "sc=127 flag=true c=RED u=3"
        ]
    );
    // `scaled` is computed in the body; gcc says `total` is 0 from the entry on.
    assert_eq!(run.records("sum"), ["scaled=(optimized out) n=4 a=-2 total=0"]);
}

#[test]
fn floats_and_doubles_come_from_the_vector_registers() {
    let prog = prog();
    let run = run_uprobe(&[
        "-e",
        "p scale x f n",
        "-e",
        "r scale r=%xmm0:f64",
        "-e",
        "p halve v",
        "-e",
        "r halve r=%xmm0:f32",
        "-e",
        "p:d/field parse d=b->d",
        s(&prog),
    ]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.records("scale"), ["x=1.5 f=2 n=3", "x=-0.25 f=0.5 n=-1"]);
    assert_eq!(run.records("scale__return"), ["r=6", "r=-1.125"]);
    assert_eq!(run.records("halve"), ["v=5"]);
    assert_eq!(run.records("halve__return"), ["r=2.5"]);
    assert_eq!(run.records("field"), ["d=2.5", "d=2.5", "d=2.5"]);
    // The whole vector state (XSAVE) keeps xmm0..15 where the legacy area has them.
    let run = run_uprobe(&["--full-vector-state", "-e", "p scale x f", "-e", "r scale r=%xmm0:f64", s(&prog)]);
    assert_eq!(run.records("scale"), ["x=1.5 f=2", "x=-0.25 f=0.5"], "{}", run.stderr);
    assert_eq!(run.records("scale__return"), ["r=6", "r=-1.125"]);
    // Counted events save the vectors too when they read one (a key of the others).
    let run = run_uprobe(&["--count", "--by", "n", "-e", "p scale x n", s(&prog), "3"]);
    assert!(run.output.contains("count scale by n: 6 hits, 2 keys"), "{}", run.output);
}

#[test]
fn retval_takes_the_functions_return_type() {
    let prog = prog();
    let run = run_uprobe(&[
        "-e",
        "r parse $retval",
        "-e",
        "p:d/cn color_name%return $retval",
        "-e",
        "r classify c=$retval",
        "-e",
        "r is_blue $retval",
        "-e",
        "r scale $retval",
        "-e",
        "r halve h=$retval",
        "-e",
        "r sum $retval",
        "-e",
        "r:d/hex parse $retval:x64",
        s(&prog),
    ]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, "r=103\n");
    assert_eq!(run.records("parse__return"), ["arg1=-18", "arg1=-28", "arg1=-36"]);
    assert_eq!(run.records("cn"), [r#"arg1="red""#, r#"arg1="green""#, r#"arg1="blue""#, r#"arg1="blue""#]);
    assert_eq!(run.records("classify__return"), ["c=GREEN", "c=RED", "c=BLUE", "c=RED"]);
    assert_eq!(run.records("is_blue__return"), ["arg1=false", "arg1=false", "arg1=true", "arg1=false"]);
    assert_eq!(run.records("scale__return"), ["arg1=6", "arg1=-1.125"]);
    assert_eq!(run.records("halve__return"), ["h=2.5"]);
    assert_eq!(run.records("sum__return"), ["arg1=168"]);
    // A type written by hand is kept (the int is in %eax: the upper half is zero).
    assert_eq!(run.records("hex")[0], "arg1=0xffffffee");
    // Without DWARF, $retval stays the kernel's x64.
    let nodebug = gcc("dwarfvars_nodebug", &["fixtures/dwarfvars.c"], &["-O2"]);
    let run = run_uprobe(&["-e", "r parse $retval", s(&nodebug)]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.records("parse__return")[0], "arg1=0xffffffee");
    // A floating-point $retval, typed by hand where no DWARF types it, is %xmm0's.
    let run = run_uprobe(&["-e", "r scale d=$retval:f64", "-e", "r halve f=$retval:f32", s(&nodebug)]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.records("scale__return"), ["d=6", "d=-1.125"]);
    assert_eq!(run.records("halve__return"), ["f=2.5"]);
}

#[test]
fn a_filter_never_compares_a_floating_point_retval_as_an_integer() {
    let prog = prog();
    // $retval of a double function is %xmm0's: a filter, which compares integers and strings,
    // refuses it instead of reading %rax.
    for def in ["r scale $retval if $retval > 2", "r scale $retval:f64 if $retval > 2"] {
        let out = uprobe_run_raw(&["-e", def, s(&prog)]);
        assert_eq!(out.status.code(), Some(2), "{def}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.ends_with("expected an integer or a string, not $retval (f64)\n"), "{def}: {err}");
    }
    let out = uprobe_run_raw(&["-e", "r halve h=$retval", "--filter", "halve__return: $retval == 0", s(&prog)]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).ends_with("not $retval (f32)\n"), "{out:?}");
}

#[test]
fn enums_show_their_enumerators_name() {
    let prog = prog();
    let run = run_uprobe(&["-e", "p is_blue c", "-e", "p:d/n is_blue n=c:u32", s(&prog)]);
    assert!(run.status.success(), "{}", run.stderr);
    // 7 is no enumerator's value: its number.
    assert_eq!(run.records("is_blue"), ["c=RED", "c=GREEN", "c=BLUE", "c=7"]);
    assert_eq!(run.records("n"), ["n=0", "n=5", "n=6", "n=7"], "a type by hand shows the number");
    let run = run_uprobe(&["--format", "json", "-e", "p is_blue c if c >= 5", s(&prog)]);
    let args: Vec<&str> = run.output.lines().filter_map(|l| l.split_once(r#""args":"#)).map(|(_, a)| a).collect();
    assert_eq!(args, [r#"{"c":"GREEN"}}"#, r#"{"c":"BLUE"}}"#, r#"{"c":7}}"#], "{}", run.output);
    // A filter names an enumerator as the program does.
    let run = run_uprobe(&["-e", "p is_blue c if c == GREEN || c == 7", s(&prog)]);
    assert_eq!(run.records("is_blue"), ["c=GREEN", "c=7"], "{}", run.stderr);
    let out = Command::new(uprobe_run()).args(["--vars", "is_blue", s(&prog)]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\t\tenum color\tc\t%di:u32{RED=0,GREEN=5,BLUE=6}\n"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn bools_and_char_pointers_by_default() {
    let prog = prog();
    let run = run_uprobe(&["-e", "p parse b->data name ok=b->ok", "-e", "p:d/ptr parse p=name:x64", s(&prog)]);
    assert!(run.status.success(), "{}", run.stderr);
    let want = [r#"data="hello" name="other" ok=true"#, r#"data="hello" name="second" ok=true"#];
    assert_eq!(run.records("parse")[..2], want);
    // `:x64` by hand still gives the pointer.
    assert!(run.records("ptr").iter().all(|r| r.starts_with("p=0x")), "{}", run.output);
    let run = run_uprobe(&["--format", "json", "-e", "p classify flag", s(&prog)]);
    let args: Vec<&str> = run.output.lines().filter_map(|l| l.split_once(r#""args":"#)).map(|(_, a)| a).collect();
    assert_eq!(args, [r#"{"flag":true}}"#, r#"{"flag":false}}"#, r#"{"flag":true}}"#, r#"{"flag":true}}"#]);
    let out = Command::new(uprobe_run()).args(["--vars", "parse", s(&prog)]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("\t\tconst char*\tname\t+0(%cx):string\n"));
}

#[test]
fn params_and_vars_expand_and_json_has_null_for_optimized_out() {
    let prog = prog();
    let run = run_uprobe(&["--format", "json", "-e", "p:d/p parse $params", "-e", "p:d/v sum $vars", s(&prog)]);
    assert!(run.status.success(), "{}", run.stderr);
    let p: Vec<&str> = run.output.lines().filter(|l| l.contains(r#""event":"p""#)).collect();
    assert_eq!(p.len(), 3, "{}", run.output);
    assert!(p[1].contains(r#""len":3,"flags":32,"name":"second"}"#), "{}", p[1]);
    let v: Vec<&str> = run.output.lines().filter(|l| l.contains(r#""event":"v""#)).collect();
    assert_eq!(v.len(), 1, "{}", run.output);
    assert!(v[0].contains(r#""n":4,"total":0,"scaled":null}"#), "{}", v[0]);
}

#[test]
fn counts_by_dwarf_names() {
    let prog = prog();
    let run = run_uprobe(&["--count", "--by", "flag,c", "-e", "p classify flag c", s(&prog), "2"]);
    assert!(run.status.success(), "{}", run.stderr);
    let table: Vec<&str> = run.output.lines().skip_while(|l| !l.starts_with("count classify")).collect();
    assert_eq!(table[0], "count classify by flag,c: 8 hits, 4 keys");
    let rows: BTreeMap<String, u64> = table[2..]
        .iter()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (format!("{} {}", w[0], w[1]), w[2].parse().unwrap())
        })
        .collect();
    let want: BTreeMap<String, u64> = [("false BLUE", 2), ("true RED", 2), ("true GREEN", 2), ("true BLUE", 2)]
        .iter()
        .map(|&(k, n)| (k.to_string(), n))
        .collect();
    assert_eq!(rows, want, "{}", run.output);
    let run = run_uprobe(&["--count", "--by", "scaled", "-e", "p sum scaled", s(&prog)]);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        run.stderr.contains("argument scaled of event sum has no value at the probe (optimized out)"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stdout, "", "refused before the program ran");
}

#[test]
fn vars_lists_what_is_available_at_the_entry() {
    let prog = prog();
    let out = Command::new(uprobe_run()).args(["--vars", "sum", s(&prog)]).output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Available variables at sum\n\t@<sum+0>\n\t\tconst int*\ta\t%di:x64\n\t\tint\tn\t%si:s32\n\
         \t\tlong int\ttotal\t\\0:s64\n\t\tint\tscaled\t(optimized out)\n"
    );
}

#[test]
fn bad_names_are_refused_with_what_exists() {
    let prog = prog();
    let nodebug = gcc("dwarfvars_nodebug", &["fixtures/dwarfvars.c"], &["-O2"]);
    let cases: [(&str, &str); 10] = [
        ("p parse lenx", "no variable lenx at parse (it has: b, len, flags, name, acc)"),
        ("p parse b->nope", "no field nope in struct buf (it has: len, data, arr, in, col, ok, d)"),
        ("p parse b.len", "b is a pointer: use '->'"),
        ("p parse b->arr[9]", "b->arr[9]: b->arr has 4 elements"),
        ("p parse b", ""),
        ("p nofunc x", "no function nofunc in the DWARF of"),
        ("r parse len", "at a return only $retval can be read"),
        ("p parse b->in.s:string", "b->in.s (of type short int): :string reads a char pointer or array"),
        ("r make_inner $retval", "make_inner returns struct inner by value (4 bytes, in registers)"),
        ("r touch x=$retval", "touch returns void: it has no $retval"),
    ];
    for (def, why) in cases {
        let run = run_uprobe(&["-e", def, s(&prog)]);
        if why.is_empty() {
            assert!(run.status.success(), "{def}: {}", run.stderr);
            continue;
        }
        assert_eq!(run.status.code(), Some(2), "{def}: {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{def}: {}", run.stderr);
        assert!(run.stderr.contains(why), "{def}: {}", run.stderr);
        assert_eq!(run.stdout, "", "{def}: the program must not start");
    }
    let run = run_uprobe(&["-e", "p parse len", s(&nodebug)]);
    assert_eq!(run.status.code(), Some(2));
    assert!(run.stderr.contains("has no DWARF debug information"), "{}", run.stderr);
}

/// perf probe's values of the same places, read by the kernel's uprobes on a plain run.
#[test]
fn values_equal_what_perf_probe_reads_with_the_kernel() {
    let prog = prog();
    let Ok(tracing) = tracefs() else {
        eprintln!("skipped: no writable tracefs (needs root)");
        return;
    };
    if Command::new("perf").arg("--version").output().is_err() {
        eprintln!("skipped: perf is not installed");
        return;
    }
    let event = format!("dv{}", std::process::id());
    let spec = format!("{event}=parse len flags b->arr[2] b->in.s b->in.c b->col b->ok b->data:string");
    let added = Command::new("perf").args(["probe", "-x", s(&prog), "-a", &spec]).output().unwrap();
    if !added.status.success() {
        eprintln!("skipped: perf probe could not add the event: {}", String::from_utf8_lossy(&added.stderr));
        return;
    }
    let group = format!("probe_{}", "dwarfvars");
    let (plain, trace) = kernel_run(&tracing, &group, &[&event], || run_plain(&prog, &[]));
    let _ = Command::new("perf").args(["probe", "-d", &format!("{group}:{event}")]).output();
    assert!(plain.status.success());
    let pid = format!("-{}", plain_pid(&trace, &event).unwrap_or_default());
    // perf shows unsigned values in hex: compare numbers.
    let number = |v: &str| -> String {
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).map_or(v.to_string(), |n| n.to_string()),
            None => v.to_string(),
        }
    };
    let normal = |args: &str| -> Vec<String> {
        args.split_whitespace()
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                // The kernel shows an enum's number (x32), ours its enumerator's name.
                let v = match (k, number(v).as_str()) {
                    ("col", "0") => "RED".to_string(),
                    ("col", "5") => "GREEN".to_string(),
                    ("col", "6") => "BLUE".to_string(),
                    ("ok", "1") => "true".to_string(),
                    (_, n) => n.to_string(),
                };
                format!("{k}={v}")
            })
            .collect()
    };
    let kernel: Vec<Vec<String>> = trace
        .lines()
        .filter(|l| l.contains(&pid) && l.contains(&format!(" {event}: (")))
        .map(|l| normal(l.split_once(") ").map_or("", |(_, a)| a)))
        .collect();
    assert_eq!(kernel.len(), 3, "{trace}");
    let ours = run_uprobe(&[
        "-e",
        &format!("p:t/{event} parse len flags b->arr[2] b->in.s b->in.c b->col b->ok b->data:string"),
        s(&prog),
    ]);
    assert!(ours.status.success(), "{}", ours.stderr);
    let ours: Vec<Vec<String>> = ours.records(&event).iter().map(|a| normal(a)).collect();
    assert_eq!(ours, kernel);
}

/// perf probe's `$retval` (x64, whatever the function returns) read by the kernel at the same
/// returns: the same values, ours typed (an int, an enum by name, a bool).
#[test]
fn retvals_equal_what_perf_probe_reads_with_the_kernel() {
    // A copy of its own: the kernel's breakpoints would meet the other tests' int3 probes.
    let prog = gcc("dwarfvars_rv", &["fixtures/dwarfvars.c"], &["-O2", "-g", "-Wall", "-Wextra"]);
    let Ok(tracing) = tracefs() else {
        eprintln!("skipped: no writable tracefs (needs root)");
        return;
    };
    if Command::new("perf").arg("--version").output().is_err() {
        eprintln!("skipped: perf is not installed");
        return;
    }
    let id = std::process::id();
    let funcs = ["parse", "classify", "is_blue"];
    let events: Vec<String> = funcs.iter().map(|f| format!("rv{f}{id}")).collect();
    let group = "probe_dwarfvars_rv";
    for (f, e) in funcs.iter().zip(&events) {
        let spec = format!("{e}={f}%return $retval");
        let added = Command::new("perf").args(["probe", "-x", s(&prog), "-a", &spec]).output().unwrap();
        if !added.status.success() {
            eprintln!("skipped: perf probe could not add {f}%return: {}", String::from_utf8_lossy(&added.stderr));
            return;
        }
    }
    // perf names a return event NAME__return.
    let kernel_events: Vec<String> = events.iter().map(|e| format!("{e}__return")).collect();
    let names: Vec<&str> = kernel_events.iter().map(String::as_str).collect();
    let (plain, trace) = kernel_run(&tracing, group, &names, || run_plain(&prog, &[]));
    for e in &kernel_events {
        let _ = Command::new("perf").args(["probe", "-d", &format!("{group}:{e}")]).output();
    }
    assert!(plain.status.success());
    let pid = plain_pid(&trace, &kernel_events[0]).unwrap_or_default();
    let ours = run_uprobe(&["-e", "r parse $retval", "-e", "r classify $retval", "-e", "r is_blue $retval", s(&prog)]);
    assert!(ours.status.success(), "{}", ours.stderr);
    for (f, e) in funcs.iter().zip(&kernel_events) {
        let kernel: Vec<String> = traced(&trace, e, &pid)
            .iter()
            .map(|a| {
                let raw = u64::from_str_radix(a.trim_start_matches("arg1=0x"), 16).unwrap_or(u64::MAX);
                match *f {
                    "parse" => format!("arg1={}", raw as u32 as i32),
                    "classify" => format!("arg1={}", ["RED", "", "", "", "", "GREEN", "BLUE"][raw as u32 as usize]),
                    _ => format!("arg1={}", raw as u8 == 1),
                }
            })
            .collect();
        assert_eq!(kernel.len(), if *f == "parse" { 3 } else { 4 }, "{trace}");
        assert_eq!(ours.records(&format!("{f}__return")), kernel, "{f}");
    }
}

/// The pid of the run that hit `event` in the trace (the `comm-PID` word).
fn plain_pid(trace: &str, event: &str) -> Option<String> {
    let line = trace.lines().find(|l| l.contains(&format!(" {event}: (")))?;
    let word = line.split_whitespace().next()?;
    Some(word.rsplit_once('-')?.1.to_string())
}

// Variables at source lines (`fixtures/linevars.c`, -g -O2): fill:6 is the line that computes
// `k` (not live yet), fill:7 = linevars.c:32 the line after (`k` live); `buf` is on the stack,
// found from the CFA at the line.

fn linevars() -> PathBuf {
    fixture("linevars", &["-O2", "-g", "-Wall", "-Wextra"])
}

/// fill's printed values: (id, name, n, buf[2], k), one a call.
fn printed(stdout: &str) -> Vec<(i64, String, i64, i64, i64)> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("fill "))
        .map(|l| {
            let v: BTreeMap<&str, &str> = l.split_whitespace().filter_map(|kv| kv.split_once('=')).collect();
            let n = |k: &str| v[k].parse::<i64>().unwrap();
            (n("id"), v["name"].to_string(), n("n"), n("buf2"), n("k"))
        })
        .collect()
}

const AT6: &str = "n b2=buf[2] b7=buf[7] k id=r->id r->name:string v1=r->vals[1]";
const AT32: &str = "n k b2=buf[2]";

#[test]
fn values_at_lines_are_the_programs_own() {
    let prog = linevars();
    let p = s(&prog);
    let plain = run_plain(&prog, &[]);
    let want = printed(&String::from_utf8_lossy(&plain.stdout));
    assert_eq!(want.len(), 3);
    let run = run_uprobe(&[
        "-e",
        &format!("p:l/six {p}:fill:6 {AT6}"),
        "-e",
        &format!("p:l/seven linevars.c:32 {AT32}"),
        "-e",
        &format!("p:l/all {p}:fill:7 $vars"),
        p,
    ]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout));
    let six: Vec<String> = want
        .iter()
        .map(|(id, name, n, b2, _)| {
            // buf[i] = id * 10 + i * n (the fixture's loop); vals[1] = 100 * id + 1.
            format!(
                r#"n={n} b2={b2} b7={} k=(optimized out) id={id} name="{name}" v1={}"#,
                id * 10 + 7 * n,
                100 * id + 1
            )
        })
        .collect();
    assert_eq!(run.records("six"), six, "{}", run.output);
    let seven: Vec<String> = want.iter().map(|(_, _, n, b2, k)| format!("n={n} k={k} b2={b2}")).collect();
    assert_eq!(run.records("seven"), seven, "{}", run.output);
    // $vars: those with a value there; `r` is only its entry value at this line (left out).
    let all: Vec<String> = want
        .iter()
        .map(|(id, _, n, _, k)| {
            let buf: Vec<String> = (0..8).map(|i| (id * 10 + i * n).to_string()).collect();
            format!("n={n} buf={{{}}} k={k}", buf.join(","))
        })
        .collect();
    assert_eq!(run.records("all"), all, "{}", run.output);
}

/// The records' `NAME=VALUE` words of `event` in the trace, of process `pid` only.
fn traced(trace: &str, event: &str, pid: &str) -> Vec<String> {
    trace
        .lines()
        .filter(|l| l.contains(&format!("-{pid} ")) && l.contains(&format!(" {event}: (")))
        .map(|l| l.split_once(") ").map_or("", |(_, a)| a).to_string())
        .collect()
}

/// perf probe's values at the same lines, read by the kernel's uprobes on a plain run.
#[test]
fn values_at_lines_equal_what_perf_probe_reads_with_the_kernel() {
    let prog = linevars();
    let p = s(&prog);
    let Ok(tracing) = tracefs() else {
        eprintln!("skipped: no writable tracefs (needs root)");
        return;
    };
    if Command::new("perf").arg("--version").output().is_err() {
        eprintln!("skipped: perf is not installed");
        return;
    }
    let (six, seven) = (format!("lsix{}", std::process::id()), format!("lseven{}", std::process::id()));
    let group = "probe_linevars";
    for spec in [format!("{six}=fill:6 {}", AT6.replace(" k ", " ")), format!("{seven}=linevars.c:32 {AT32}")] {
        let added = Command::new("perf").args(["probe", "-x", p, "-a", &spec]).output().unwrap();
        if !added.status.success() {
            let _ = Command::new("perf").args(["probe", "-d", &format!("{group}:{six}")]).output();
            eprintln!("skipped: perf probe could not add {spec}: {}", String::from_utf8_lossy(&added.stderr));
            return;
        }
    }
    let (plain, trace) = kernel_run(&tracing, group, &[&six, &seven], || run_plain(&prog, &[]));
    for e in [&six, &seven] {
        let _ = Command::new("perf").args(["probe", "-d", &format!("{group}:{e}")]).output();
    }
    assert!(plain.status.success());
    let pid = plain_pid(&trace, &six).unwrap_or_default();
    // perf refuses `k` where it has no location: ours says (optimized out) there.
    let ours = run_uprobe(&[
        "-e",
        &format!("p:t/{six} {p}:fill:6 {}", AT6.replace(" k ", " ")),
        "-e",
        &format!("p:t/{seven} linevars.c:32 {AT32}"),
        p,
    ]);
    assert!(ours.status.success(), "{}", ours.stderr);
    assert_eq!(ours.records(&six), traced(&trace, &six, &pid), "{trace}");
    assert_eq!(ours.records(&seven), traced(&trace, &seven, &pid), "{trace}");
    assert_eq!(ours.records(&seven).len(), 3);
    let refused = Command::new("perf").args(["probe", "-x", p, "-a", "fill:6 k"]).output().unwrap();
    assert!(!refused.status.success(), "perf probe placed k where it has no location");
}

/// The names `--vars PLACE` gives a value (type and name), and those it says are not live.
fn vars_listing(place: &str, prog: &str) -> (Vec<String>, Vec<String>) {
    let out = Command::new(uprobe_run()).args(["--vars", place, prog]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (mut live, mut not) = (Vec::new(), Vec::new());
    for l in text.lines().filter(|l| l.starts_with("\t\t")) {
        let w: Vec<&str> = l.trim_start().split('\t').collect();
        let named = format!("{}\t{}", w[0], w[1]);
        match w.get(2).is_some_and(|n| n.starts_with('(')) {
            true => not.push(named),
            false => live.push(named),
        }
    }
    (live, not)
}

#[test]
fn vars_at_a_line_lists_what_is_available_there() {
    let prog = linevars();
    let p = s(&prog);
    let out = Command::new(uprobe_run()).args(["--vars", "fill:6", p]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Available variables at fill:6\n\t@<fill+"), "{text}");
    assert!(text.contains("\t\tint[8]\tbuf\t+0(%sp):s32[8]\n"), "{text}");
    assert!(text.contains("\t\tlong int\tk\t(optimized out)\n"), "{text}");
    let (live6, not6) = vars_listing("fill:6", p);
    let (live7, not7) = vars_listing("fill:7", p);
    assert!(not6.contains(&"long int\tk".to_string()) && live7.contains(&"long int\tk".to_string()));
    assert_eq!(vars_listing(&format!("{p}:linevars.c:32"), p), (live7.clone(), not7.clone()));
    // An inlined call's parameters are there with its caller's (lines.c:22, twice(n)).
    let lines = gcc("lines", &["fixtures/lines.c"], &["-O2", "-g", "-Wall", "-Wextra"]);
    let (live, _) = vars_listing("classify:4", s(&lines));
    assert_eq!(live, ["int\tn", "int\tx"]);
    if Command::new("perf").arg("--version").output().is_err() {
        eprintln!("skipped the comparison with perf probe -V: perf is not installed");
        return;
    }
    // perf probe -V lists the same names (it spells an array as a pointer: names only).
    let perf = |place: &str, prog: &str| -> Vec<String> {
        let out = Command::new("perf").args(["probe", "-x", prog, "-V", place]).output().unwrap();
        let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("\t\t"))
            .map(|l| l.rsplit('\t').next().unwrap_or("").to_string())
            .collect();
        names.sort();
        names
    };
    let names = |v: &[String]| {
        let mut n: Vec<String> = v.iter().map(|t| t.rsplit('\t').next().unwrap_or("").to_string()).collect();
        n.sort();
        n
    };
    assert_eq!(perf("fill:6", p), names(&live6));
    assert_eq!(perf("fill:7", p), names(&live7));
    assert_eq!(perf("classify:4", s(&lines)), ["n", "x"]);
}

#[test]
fn a_variable_not_at_the_line_is_refused_with_those_that_are() {
    let prog = linevars();
    let p = s(&prog);
    let cases = [
        (format!("p {p}:fill:7 zz"), "no variable zz at fill:7 (it has: r, n, buf, k)"),
        (
            format!("p {p}:fill:7 r->id"),
            "r cannot be read at fill:7: its value is the one it had at the function's entry",
        ),
        ("p linevars.c:32 i".to_string(), "no variable i at linevars.c:32 (it has: r, n, buf, k)"),
        ("p linevars.c:32 buf->x".to_string(), "buf (of type int[8]) is not a pointer"),
    ];
    for (def, why) in &cases {
        let run = run_uprobe(&["-e", def, p]);
        assert_eq!(run.status.code(), Some(2), "{def}: {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{def}: {}", run.stderr);
        assert!(run.stderr.contains(why), "{def}: {}", run.stderr);
        assert_eq!(run.stdout, "", "{def}: the program must not start");
    }
    // Link-time optimization names and types the variables in another unit: the same names
    // and types are read there (tests/ltovars.rs reads their values).
    let lto = gcc("linevars_lto", &["fixtures/linevars.c"], &["-O2", "-g", "-flto"]);
    for place in ["fill:7", "fill"] {
        assert_eq!(vars_listing(place, s(&lto)), vars_listing(place, p), "{place}");
    }
    let out = Command::new(uprobe_run()).args(["--vars", "fill:5", p]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("shares its address") && err.contains("probe fill:3 instead"), "{err}");
}
