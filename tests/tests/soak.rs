//! The libc-wide soak: an entry probe and a return probe on every libc function entry (less
//! what the runtime refuses), under real programs: sort, sqlite3, Python with threads, a
//! threaded program that spawns children, and `make -j2`. Each must behave exactly as without
//! probes, and every function's calls must add up: each call returned through its return
//! probe, was not hooked (nmissed), or is one the runtime reports as not returned (pending
//! at exit, left by longjmp or an exception, in a child that exec'd, at a thread's exit).

use std::collections::BTreeMap;
use std::path::Path;

use uprobe_tests::*;

/// Per (pid, address): (function, calls, returns, nmissed) from the soak handler.
type Counts = BTreeMap<(u32, u64), (String, u64, u64, u64)>;

fn soak_counts(run: &Run) -> Counts {
    let mut counts = Counts::new();
    for line in run.output.lines().filter(|l| l.starts_with("soak[") && l.contains(" addr=")) {
        let pid: u32 = line["soak[".len()..line.find(']').unwrap()].parse().unwrap();
        let mut fields = line.split_whitespace().skip(1);
        let name = fields.next().unwrap().to_string();
        let field = |key: &str| -> u64 {
            let v = line.split_whitespace().find_map(|f| f.strip_prefix(key)).unwrap();
            v.strip_prefix("0x").map_or_else(|| v.parse().unwrap(), |h| u64::from_str_radix(h, 16).unwrap())
        };
        if field("ret=") == 1 {
            counts.insert((pid, field("addr=")), (name, field("calls="), field("returns="), field("nmissed=")));
        }
    }
    counts
}

/// Per (pid, address): calls the runtime says did not return.
fn not_returned(run: &Run) -> BTreeMap<(u32, u64), u64> {
    let mut left = BTreeMap::new();
    for line in run.lines_with("uprobe-run: stats: return probe at 0x") {
        let addr = u64::from_str_radix(line.split_whitespace().next().unwrap(), 16).unwrap();
        let pid: u32 = line.split(" in pid ").nth(1).unwrap().split(':').next().unwrap().parse().unwrap();
        let total: u64 = line.split(": ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        left.insert((pid, addr), total);
    }
    left
}

/// Runs `command` plainly and under the soak, and checks output, status and the accounts.
fn soak(name: &str, command: &[&str], dir: Option<&Path>) {
    let (list, _) = function_list("libc.so.6");
    let handler = test_handler("soak");
    let run_in = |cmd: &mut std::process::Command| {
        if let Some(dir) = dir {
            cmd.current_dir(dir);
        }
        cmd.stdin(std::process::Stdio::null()).output().unwrap()
    };
    let plain = run_in(std::process::Command::new(command[0]).args(&command[1..]));
    let out = tempfile("soak");
    let mut cmd = std::process::Command::new(uprobe_run());
    cmd.args(int3_only().then_some("--no-optimize"))
        .arg("--stats")
        .arg("-o")
        .arg(&out)
        .arg("--handlers")
        .arg(&handler)
        .arg("--param")
        .arg(format!("list={}", list.display()))
        .args(["--param", "module=libc.so.6", "--"])
        .args(command);
    let probed = run_in(&mut cmd);
    let output = std::fs::read_to_string(&out).unwrap_or_default();
    let run = Run {
        status: probed.status,
        stdout: String::from_utf8_lossy(&probed.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&probed.stderr).into_owned(),
        output,
    };
    assert_eq!(run.status.code(), plain.status.code(), "{name}: {:?}\n{}", run.status, run.stderr);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout), "{name}: stdout differs");
    let counts = soak_counts(&run);
    assert!(!counts.is_empty(), "{name}: no counts in\n{}", run.output);
    let left = not_returned(&run);
    let mut wrong = Vec::new();
    for (key, (func, calls, returns, nmissed)) in &counts {
        let gone = left.get(key).copied().unwrap_or(0);
        if *calls != returns + nmissed + gone {
            wrong.push(format!(
                "{func} (pid {}): calls {calls} != returns {returns} + nmissed {nmissed} + not returned {gone}",
                key.0
            ));
        }
    }
    assert!(wrong.is_empty(), "{name}: accounts that do not add up:\n{}", wrong.join("\n"));
    let calls: u64 = counts.values().map(|c| c.1).sum();
    let summary = run
        .output
        .lines()
        .find(|l| l.starts_with("soak[") && l.contains("registered="))
        .and_then(|l| l.split(": ").nth(1))
        .unwrap_or_default()
        .to_string();
    eprintln!("soak {name}: {} functions called, {calls} calls, {summary}", counts.len());
}

#[test]
fn sort() {
    let input = tempfile("sort-input");
    let lines: Vec<String> = (0..5000u64).map(|i| format!("{}", (i * 7919) % 5003)).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    soak("sort", &["/usr/bin/sort", "-n", input.to_str().unwrap()], None);
}

#[test]
fn sqlite3() {
    if !Path::new("/usr/bin/sqlite3").exists() {
        eprintln!("SKIPPED: /usr/bin/sqlite3 is not installed (.ci/run installs it)");
        return;
    }
    soak(
        "sqlite3",
        &[
            "/usr/bin/sqlite3",
            ":memory:",
            "create table t(x integer, s text); \
             with recursive n(i) as (select 1 union all select i + 1 from n where i < 2000) \
             insert into t select i, printf('row %d', i) from n; \
             create index ix on t(s); \
             select count(*), sum(x), max(s) from t where x % 3 = 0;",
        ],
        None,
    );
}

#[test]
fn python_with_threads() {
    if !Path::new("/usr/bin/python3").exists() {
        eprintln!("SKIPPED: /usr/bin/python3 is not installed");
        return;
    }
    soak(
        "python3",
        &[
            "/usr/bin/python3",
            "-c",
            // join() returns once a thread let go of its state, before the thread itself has
            // finished: wait until it is gone, so no call is still pending when Python exits
            // (calls pending in other threads when the process ends cannot be accounted).
            "import threading, json, os, time\n\
             out = []\n\
             def work(n): out.append(sum(json.loads(json.dumps(list(range(n))))))\n\
             ts = [threading.Thread(target=work, args=(1000 * i,)) for i in range(4)]\n\
             [t.start() for t in ts]; [t.join() for t in ts]\n\
             while len(os.listdir('/proc/self/task')) > 1: time.sleep(0.01)\n\
             print(sorted(out))",
        ],
        None,
    );
}

#[test]
fn threads_and_spawned_children() {
    let prog = fixture("churn", &["-O2", "-g", "-pthread"]);
    soak("churn", &[prog.to_str().unwrap()], None);
}

#[test]
fn make_j2() {
    if !Path::new("/usr/bin/make").exists() {
        eprintln!("SKIPPED: make is not installed");
        return;
    }
    let dir = tempfile("make-project");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.c"), "int a(void) { return 1; }\n").unwrap();
    std::fs::write(dir.join("b.c"), "int a(void);\nint main(void) { return a() - 1; }\n").unwrap();
    std::fs::write(
        dir.join("Makefile"),
        "prog: a.o b.o\n\tcc -o prog a.o b.o\n\t./prog && echo built\n%.o: %.c\n\tcc -c -o $@ $<\n",
    )
    .unwrap();
    soak("make -j2", &["/usr/bin/make", "-s", "-B", "-j2"], Some(&dir));
}
