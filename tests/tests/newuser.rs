//! What a new user meets first: output that cannot be written, `-o -`, drops with the
//! default buffer, drops in machine-readable formats, skipped events under `--lenient`, a
//! module name with a typo, bad numbers, the bundled handlers from an installed copy, a reader
//! that goes away mid-stream (records read + lost = hits), and a
//! test suite run with SIGINT and SIGHUP ignored.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use uprobe_tests::*;

/// One test of this file at a time: the drops test measures what the runtime's own thread
/// keeps up with, which a burst of another test beside it would change.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn burst() -> PathBuf {
    fixture("burst", &["-O2", "-Wall"])
}

/// `uprobe-run ARGS` (with `--no-optimize` on the int3 half), nothing else added.
fn uprobe(args: &[&str], cwd: Option<&Path>) -> Output {
    let mut cmd = Command::new(uprobe_run());
    default_signals(&mut cmd).args(int3_only().then_some("--no-optimize")).args(args).stdin(Stdio::null());
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    cmd.output().expect("run uprobe-run")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn output_that_cannot_be_written_is_said_once_and_the_exit_status_is_74() {
    let _serial = serial();
    let prog = burst();
    let prog = prog.to_str().unwrap();
    for args in [
        vec!["--count", "-e", "p libc.so.6:malloc", "-o", "/dev/full", prog, "10"],
        vec!["-e", "p libc.so.6:malloc", "-o", "/dev/full", prog, "10"],
        vec!["--format", "json", "-e", "p libc.so.6:malloc", "-o", "/dev/full", prog, "10"],
    ] {
        let out = uprobe(&args, None);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(74), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("uprobe-run: cannot write the output (/dev/full): No space left on device: lost "),
            "{stderr}"
        );
        // The program itself ran and wrote its own output.
        assert_eq!(text(&out.stdout).lines().count(), 1, "{args:?}");
    }
}

#[test]
fn dash_o_dash_is_standard_output_and_creates_no_file() {
    let _serial = serial();
    let dir = tempfile("dash");
    std::fs::create_dir_all(&dir).unwrap();
    let prog = burst();
    let out = uprobe(&["--count", "-e", "p libc.so.6:free", "-o", "-", prog.to_str().unwrap(), "100"], Some(&dir));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("EVENT ") && stdout.lines().any(|l| l.split_whitespace().next() == Some("free")),
        "{stdout}"
    );
    assert!(!dir.join("-").exists(), "a file named - was created");
    assert_eq!(text(&out.stderr), "");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_default_buffer_drops_nothing_on_a_burst_of_allocations() {
    let _serial = serial();
    let prog = burst();
    let n = 200_000;
    // Whether the runtime's thread keeps up depends on the CPU it gets: on a machine busy
    // with other work it may get none for longer than a buffer lasts. Three runs, one of
    // which drops nothing (a 1M buffer drained every 5 ms drops in every run).
    let mut seen = Vec::new();
    for _ in 0..3 {
        let run =
            run_uprobe(&["-e", "p libc.so.6:malloc", "-e", "p libc.so.6:free", prog.to_str().unwrap(), &n.to_string()]);
        assert!(run.status.success(), "{}", run.stderr);
        let drops: Vec<String> =
            run.output.lines().filter(|l| l.contains("records dropped")).map(str::to_string).collect();
        let count = |event: &str| run.output.lines().filter(|l| l.contains(&format!(": {event}: ("))).count();
        if drops.is_empty() {
            assert!(count("malloc") > n && count("free") >= n, "malloc {} free {}", count("malloc"), count("free"));
            return;
        }
        seen.push(drops);
    }
    panic!("every run dropped records: {seen:?}");
}

/// Records of 256 bytes and more: a 4K buffer holds a dozen, so that even hits on the `int3`
/// path, which the runtime's thread keeps up with, fill it.
const FREE_256: &str = "p libc.so.6:free v=+0(%di):u64[32]";

#[test]
fn json_stays_json_under_drops_and_chrome_shows_them() {
    let _serial = serial();
    let prog = burst();
    let prog = prog.to_str().unwrap();
    let run = run_uprobe(&["--buffer-size", "4K", "--format", "json", "-e", FREE_256, prog, "20000"]);
    assert!(run.status.success(), "{}", run.stderr);
    let lines: Vec<serde_json::Value> =
        run.output.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let dropped: Vec<&serde_json::Value> = lines.iter().filter(|v| v["kind"] == "dropped").collect();
    assert_eq!(dropped.len(), 1, "{}", run.output.lines().last().unwrap_or_default());
    assert_eq!(dropped[0]["event"], "free");
    let n = dropped[0]["dropped"].as_u64().unwrap();
    let records = lines.iter().filter(|v| v["event"] == "free" && v.get("kind").is_none()).count() as u64;
    assert!(n > 0 && records + n >= 20_000, "{records} written, {n} dropped");

    let run = run_uprobe(&["--buffer-size", "4K", "--format", "chrome", "-e", FREE_256, prog, "20000"]);
    let trace: serde_json::Value = serde_json::from_str(&run.output).expect("a Chrome trace");
    let counter = trace["traceEvents"].as_array().unwrap().iter().find(|e| e["ph"] == "C").expect("a counter event");
    assert_eq!(counter["name"], "records dropped");
    assert_eq!(counter["args"]["free"], trace["otherData"]["dropped"]["free"]);
    assert!(counter["args"]["free"].as_u64().unwrap() > 0);
}

#[test]
fn lenient_shows_a_skipped_event_as_skipped_never_as_a_count() {
    let _serial = serial();
    let prog = burst();
    let bad = format!("p {}:main+1", prog.display());
    let p = prog.to_str().unwrap();
    let run = run_uprobe(&["--lenient", "--count", "-e", &bad, "-e", "p libc.so.6:free", p, "10"]);
    assert!(run.status.success(), "{}", run.stderr);
    let row = run.output.lines().find(|l| l.starts_with("main_1 ")).unwrap_or_else(|| panic!("{}", run.output));
    assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["main_1", "skipped"]);
    let run = run_uprobe(&["--lenient", "--count", "--format", "json", "-e", &bad, "-e", "p libc.so.6:free", p, "10"]);
    let skipped: Vec<serde_json::Value> = run
        .output
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] == "main_1")
        .collect();
    assert_eq!(skipped.len(), 1, "{}", run.output);
    assert_eq!(skipped[0]["skipped"], true);
    assert!(skipped[0].get("count").is_none(), "{}", skipped[0]);
    // A function that does not exist is skipped the same way, and shown.
    let run = run_uprobe(&["--lenient", "--count", "-e", "p:nf libc.so.6:nosuchfn", "-e", "p libc.so.6:free", p, "10"]);
    assert!(run.status.success(), "{}", run.stderr);
    let row = run.output.lines().find(|l| l.starts_with("nf ")).unwrap_or_else(|| panic!("{}", run.output));
    assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["nf", "skipped"]);
    // A definition that is wrong as written is refused, --lenient or not.
    let out = uprobe(&["--lenient", "--count", "-e", "p libc.so.6:free x=%zz", p, "10"], None);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "", "the program ran");
    assert!(text(&out.stderr).ends_with("not %zz\n"), "{}", text(&out.stderr));
}

#[test]
fn a_module_no_file_answers_to_is_refused_before_the_program_starts() {
    let _serial = serial();
    let prog = burst();
    let out = uprobe(&["--count", "-e", "p libcc.so.6:malloc", prog.to_str().unwrap(), "10"], None);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(text(&out.stdout), "", "the program ran");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("\"libcc.so.6\"") && stderr.contains("(closest: libc.so.6"), "{stderr}");
    // A library that exists but is not loaded at start-up still waits for its load.
    let out = uprobe(&["--count", "-e", "p libz.so.1:deflate", prog.to_str().unwrap(), "10"], None);
    if Path::new("/lib/x86_64-linux-gnu/libz.so.1").exists() {
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

#[test]
fn bad_numbers_and_kernel_threads_are_named() {
    let _serial = serial();
    for (option, value) in [
        ("--interval", "-1"),
        ("--buffer-size", "-1"),
        ("--buffer-size", "-1M"),
        ("--top", "-1"),
        ("--pid", "-1"),
        ("--top", "0"),
        ("--max-events", "-1"),
        ("--max-events", "0"),
    ] {
        let out = uprobe(&[option, value, "--count", "-e", "p libc:malloc", "true"], None);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{option} {value}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&format!("invalid value '{value}' for '{option}")), "{stderr}");
    }
    let kthreadd = std::fs::read_to_string("/proc/2/stat").unwrap_or_default();
    if !kthreadd.contains("(kthreadd)") {
        println!("skipped the kernel-thread case: process 2 is not kthreadd here (a PID namespace?)");
        return;
    }
    let out = uprobe(&["--pid", "2", "--handlers", "count", "--param", "probes=main"], None);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "uprobe-run: process 2 (kthreadd) is a kernel thread: it runs no user-space code to probe\n"
    );
}

#[test]
fn an_installed_copy_runs_the_help_examples_with_the_handlers_it_carries() {
    let _serial = serial();
    let dir = tempfile("installed-handlers");
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let bin = dir.join("bin/uprobe-run");
    copy_program(&uprobe_run(), &bin);
    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    let vaddr = format!("vaddr={:#x}", nm_address(&prog, "myfunc"));
    let run = |args: &[&str]| -> Output {
        Command::new(&bin)
            .args(args)
            .current_dir(prog.parent().unwrap())
            .env_remove("UPROBE_LIB")
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .output()
            .unwrap()
    };
    // As --help prints them.
    let out = run(&["--handlers", "uprobe_example", "--param", &vaddr, "./myprog"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("Hit #5 on probepoint") && stderr.ends_with("Probepoint was hit 5 times\n"), "{stderr}");
    let out = run(&["--handlers", "count", "--param", "probes=main,myfunc,libc.so.6:printf", "./myprog"]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["count:", "myfunc", l.split_whitespace().nth(2).unwrap_or(""), "5"]),
        "{stderr}"
    );
    let out = run(&["--handlers", "uretprobe_example.so", "--param", "func=myfunc", "./myprog"]);
    assert!(text(&out.stderr).ends_with("5 calls, 5 returns\n"), "{}", text(&out.stderr));
    // The copies are private to this user.
    let handlers = dir.join("cache/uprobe-run/handlers");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&handlers).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "{mode:o}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The newest built test binary named `name` beside this one.
fn test_binary(name: &str) -> Option<PathBuf> {
    let deps = std::env::current_exe().ok()?.parent()?.to_path_buf();
    let prefix = format!("{name}-");
    std::fs::read_dir(&deps)
        .ok()?
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && !n.contains('.') && e.path().is_file()
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}

#[test]
fn the_signal_tests_pass_when_the_caller_ignores_sigint_and_sighup() {
    let _serial = serial();
    let Some(endings) = test_binary("endings") else {
        println!("skipped: the endings test binary is not built beside this one");
        return;
    };
    let mut cmd = Command::new(&endings);
    cmd.args([
        "--exact",
        "a_raised_terminating_signal_reports_then_ends_the_process_by_it",
        "ctrl_c_and_sigterm_from_outside_report_then_end_the_process_by_that_signal",
    ])
    .stdin(Stdio::null());
    // As `nohup` or `&` in a script leave them.
    // SAFETY: signal is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{:?} {:?}\n{stdout}", out.status, out.status.signal());
    assert!(stdout.contains("test result: ok. 2 passed"), "{stdout}");
}

/// The states of every thread of every process in process group `pgid`.
fn group_states(pgid: i32) -> Vec<char> {
    let mut states = Vec::new();
    for proc in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(proc.path().join("stat")) else { continue };
        let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
        if after.split_whitespace().nth(2).and_then(|g| g.parse::<i32>().ok()) != Some(pgid) {
            continue;
        }
        for task in std::fs::read_dir(proc.path().join("task")).into_iter().flatten().flatten() {
            if let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) {
                states.extend(stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()));
            }
        }
    }
    states
}

#[test]
fn a_reader_that_goes_away_leaves_records_read_plus_lost_equal_to_the_hits() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let _serial = serial();
    let prog = fixture("filter", &["-O1", "-g", "-fno-inline", "-Wall", "-Wextra"]);
    let calls = 20_000;
    let def = format!("p:f/t {}:take size=%di:u64 delta=%si:s32 name=+0(%dx):string flags=%cx:u32", prog.display());
    let mut cmd = Command::new(uprobe_run());
    default_signals(&mut cmd)
        .args(int3_only().then_some("--no-optimize"))
        // Buffers that hold every record: none is dropped while the reader holds the writer up.
        .args(["--buffer-size", "64M", "-o", "-", "-e", &def, prog.to_str().unwrap(), &calls.to_string(), "clean"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().expect("run uprobe-run");
    let pgid = child.id() as i32;
    let mut stdout = child.stdout.take().unwrap();
    // A reader that takes a fixed number of bytes and goes away, as `head -c` does.
    let mut got = vec![0u8; 100_000];
    stdout.read_exact(&mut got).expect("the first bytes of the stream");
    // What the writer put in the pipe beyond them counts as written: stop every writer, take
    // what the pipe holds, then close it, so that the bytes received are all that was written.
    // SAFETY: signals to the process group of the child started above.
    unsafe { libc::killpg(pgid, libc::SIGSTOP) };
    while group_states(pgid).iter().any(|s| !matches!(s, 'T' | 'Z' | 'X')) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let fd = stdout.as_raw_fd();
    // SAFETY: fcntl on the pipe this test owns.
    unsafe { libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK) };
    let mut rest = Vec::new();
    let _ = stdout.read_to_end(&mut rest);
    got.extend_from_slice(&rest);
    drop(stdout);
    // SAFETY: as above.
    unsafe { libc::killpg(pgid, libc::SIGCONT) };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let status = child.wait().unwrap();
    let received = text(&got).split_inclusive('\n').filter(|l| l.ends_with('\n') && l.contains(" t: (")).count();
    let lost: usize = stderr
        .split_once("Broken pipe: lost ")
        .and_then(|(_, rest)| rest.strip_suffix(" event records\n"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no lost records said ({status:?}): {stderr}"));
    assert!(received > 0 && lost > 0, "received {received}, lost {lost}");
    assert_eq!(received + lost, calls, "received {received} + lost {lost}: {stderr}");
}
