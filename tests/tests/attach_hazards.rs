//! Attach must never harm its target: a session's output that uprobe-run does not read never
//! holds the process's threads, the runtime and a Rust handler's set-up and report code never
//! trap on libc-wide probes, and a handler's table is read after its probes are gone.
//!
//! Every test needs ptrace: where it is not permitted, the test says `SKIPPED` and returns.

use uprobe_tests::attach::*;
use uprobe_tests::*;

/// Sends `signal` to process `pid` (one of this test's children).
fn kill(pid: u32, signal: i32) {
    // SAFETY: kill(2) with plain integers.
    unsafe { libc::kill(pid as i32, signal) };
}

/// Continues a stopped uprobe-run however the test ends.
struct Continue(u32);

impl Drop for Continue {
    fn drop(&mut self) {
        kill(self.0, libc::SIGCONT);
    }
}

#[test]
fn a_stopped_uprobe_run_never_holds_the_threads_of_a_handler_that_prints() {
    need_ptrace!();
    let handler = test_handler("print_hits");
    let mut target = Target::start(&service(), &["2"]);
    let mut session = Session::start(target.pid, &["--handlers", path(&handler)]);
    target.send("tick 3");
    target.out.expect("ticked 3");
    for n in 1..=3 {
        session.expect(&format!("tick hit {n}"));
    }
    // Stopped, as by Ctrl-Z: far more lines than the session socket holds are printed.
    let ticks = 200_000;
    kill(session.child.id(), libc::SIGSTOP);
    let stopped = Continue(session.child.id());
    target.send(&format!("tick {ticks}"));
    // Before: the ticking thread blocked in uprobe_printf until uprobe-run read again.
    target.out.expect(&format!("ticked {ticks}"));
    target.send("echo still running");
    target.out.expect("read: still running");
    drop(stopped);
    kill(session.child.id(), libc::SIGINT);
    let (status, lines) = session.wait();
    let own = session.own_lines();
    assert_eq!(status.code(), Some(0), "{own:?}");
    let printed = lines.iter().filter(|l| l.starts_with("tick hit ")).count();
    assert!(lines.contains(&format!("print_hits: {} hits", ticks + 3)), "{own:?}");
    let dropped_line = own.iter().find(|l| l.contains(" of output dropped: ")).expect("a line with the drops");
    let dropped: usize = dropped_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(dropped > 0, "{dropped_line}");
    // Every hit's line either reached uprobe-run or was counted as dropped.
    assert_eq!(printed + dropped, ticks + 3, "{printed} printed, {dropped_line}");
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(rest.iter().any(|l| l.ends_with(" 0 wrong")), "{rest:?}");
}

fn libcount() -> std::path::PathBuf {
    artefact("libcount.so")
}

/// The hit counts of libcount's table, by row.
fn count_rows(lines: &[String]) -> Vec<(String, u64)> {
    let run =
        Run { status: Default::default(), stdout: String::new(), stderr: String::new(), output: lines.join("\n") };
    count_table(&run)
}

#[test]
fn libcount_attached_reads_its_table_after_its_probes_are_gone_so_aliases_agree() {
    need_ptrace!();
    let target = Target::start(&service(), &["4"]);
    // Thirty probes at one address: the table is printed while the workers call work().
    let aliases: Vec<&str> = (0..30).map(|i| if i % 2 == 0 { "work" } else { "work+0" }).collect();
    let probes = format!("probes={}", aliases.join(","));
    for round in 0..5 {
        let session = Session::start(target.pid, &["--handlers", path(&libcount()), "--param", &probes]);
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (status, lines) = session.end(libc::SIGINT);
        assert_eq!(status.code(), Some(0), "{lines:?}");
        let rows = count_rows(&lines);
        assert_eq!(rows.len(), 30, "{lines:?}");
        assert!(rows[0].1 > 0, "{rows:?}");
        assert!(rows.iter().all(|r| r.1 == rows[0].1), "round {round}: probes at one address disagree: {rows:?}");
    }
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(rest.iter().any(|l| l.ends_with(" 0 wrong")), "{rest:?}");
}

/// A libcount probe file for every libc function entry the runtime places a probe on in
/// process `pid` (the rest are found with the coverage handler and left out: the vDSO's,
/// functions with no room for a jump where it must take one).
fn libc_wide_probes(pid: i32) -> std::path::PathBuf {
    let (names, _) = function_list("libc.so.6");
    let coverage = test_handler("coverage");
    let list = format!("list={}", names.display());
    let mut session =
        Session::start(pid, &["--handlers", path(&coverage), "--param", &list, "--param", "module=libc.so.6"]);
    session.expect("coverage: ");
    kill(session.child.id(), libc::SIGINT);
    let (status, _) = session.wait();
    assert_eq!(status.code(), Some(0), "{:?}", session.own_lines());
    let refused: Vec<String> = session
        .own_lines()
        .iter()
        .filter_map(|l| l.strip_prefix("uprobe-run: register_uprobe(libc.so.6:")?.split(')').next().map(str::to_owned))
        .collect();
    let specs: Vec<String> = std::fs::read_to_string(&names)
        .unwrap()
        .lines()
        .filter(|n| !refused.iter().any(|r| r == n))
        .map(|n| format!("libc.so.6:{n}"))
        .collect();
    assert!(specs.len() > 1500, "{} probes, refused {refused:?}", specs.len());
    let file = tempfile("libc_specs");
    std::fs::write(&file, specs.join("\n")).unwrap();
    file
}

#[test]
fn libc_wide_probes_never_trap_the_runtime_or_a_rust_handler_attached_or_launched() {
    need_ptrace!();
    let mut target = Target::start(&service(), &["2"]);
    let probes = libc_wide_probes(target.pid);
    let probes_file = format!("probes-file={}", probes.display());
    for round in 0..2 {
        let mut session =
            Session::start(target.pid, &["--stats", "--handlers", path(&libcount()), "--param", &probes_file]);
        target.send("echo attached");
        target.out.expect("read: attached");
        kill(session.child.id(), libc::SIGINT);
        let (status, lines) = session.wait();
        let own = session.own_lines();
        assert_eq!(status.code(), Some(0), "{own:?}");
        let rows = count_rows(&lines);
        assert!(rows.len() > 1500 && rows.iter().any(|r| r.0 == "libc.so.6:read" && r.1 > 0), "{own:?}");
        let run = Run { status, stdout: String::new(), stderr: String::new(), output: own.join("\n") };
        // Before: 82,000 traps from the table's formatting in libc's memcpy, with every probe
        // still armed, and a detach of 200 ms. Left: the runtime's checks of the dynamic
        // loader's generation at detach (`dl_iterate_phdr`, which takes the loader's lock with
        // `pthread_mutex_lock`/`unlock`): two checks, three traps each, where those three
        // functions have an int3; and the runtime's own `dlopen` of the handler library,
        // which passes through the session's internal probe on `dlopen` (an int3 with
        // --no-optimize) before the handler's probes are armed.
        assert!(stats(&run).traps_in_runtime <= 7, "round {round}: {:?}", stats(&run));
    }
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(rest.iter().any(|l| l.ends_with(" 0 wrong")), "{rest:?}");

    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    let plain = run_plain(&prog, &[]);
    let run = run_uprobe(&["--stats", "--handlers", path(&libcount()), "--param", &probes_file, path(&prog)]);
    assert_eq!((run.status.code(), run.stdout.as_bytes()), (plain.status.code(), plain.stdout.as_slice()));
    assert!(count_table(&run).len() > 1500, "{}", run.output);
    assert!(stats(&run).traps_in_runtime <= 6, "{:?}", stats(&run));
    eprintln!("libc-wide, launched: {:?}", stats(&run));
}

/// The first 16 bytes of `symbol` of `program` as process `pid` has them now.
fn code_bytes(pid: i32, program: &std::path::Path, symbol: &str) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let exe = std::fs::canonicalize(program).unwrap();
    let base = maps(pid)
        .iter()
        .find(|l| l.ends_with(exe.to_str().unwrap()))
        .map(|l| u64::from_str_radix(l.split('-').next().unwrap(), 16).unwrap())
        .unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    mem.seek(SeekFrom::Start(base + nm_address(program, symbol))).unwrap();
    let mut bytes = vec![0u8; 16];
    mem.read_exact(&mut bytes).unwrap();
    bytes
}

#[test]
fn a_uprobe_init_that_faults_aborts_or_hangs_ends_the_session_not_the_process() {
    need_ptrace!();
    let handler = test_handler("init_misbehaves");
    let service = service();
    let mut target = Target::start(&service, &["2"]);
    let original = code_bytes(target.pid, &service, "work");
    let cases = [
        ("segv", "uprobe_init() faulted: SIGSEGV at 0x0;"),
        ("abort", "uprobe_init() faulted: SIGABRT (abort);"),
        ("hang", "uprobe_init() did not return within 10 s;"),
    ];
    for (how, said) in cases {
        let param = format!("how={how}");
        let mut session = Session::begin(target.pid, &["--handlers", path(&handler), "--param", &param]);
        if how == "hang" {
            // Ctrl-C while it hangs: the session still ends, at the bound.
            std::thread::sleep(std::time::Duration::from_millis(500));
            kill(session.child.id(), libc::SIGINT);
        }
        let (status, _) = session.wait();
        let own = session.own_lines();
        assert_eq!(status.code(), Some(127), "{how}: {own:?}");
        assert!(
            own.iter().any(|l| l.starts_with("uprobe-run: ") && l.contains(said) && l.ends_with("the process runs on")),
            "{how}: {own:?}"
        );
        assert!(target.alive(), "{how}: the process died");
        assert_eq!(code_bytes(target.pid, &service, "work"), original, "{how}: work() is still patched");
        target.send(&format!("echo after {how}"));
        target.out.expect(&format!("read: after {how}"));
    }
    // A session after them works as ever.
    let hits = test_handler("attach_hits");
    let mut session = Session::start(target.pid, &["--handlers", path(&hits)]);
    target.send("tick 5");
    target.out.expect("ticked 5");
    session.expect("work is hit");
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!((status.code(), lines.last().map(String::as_str)), (Some(0), Some("tick: 5 hits")), "{lines:?}");
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(rest.iter().any(|l| l.ends_with(" 0 wrong")), "{rest:?}");
}

/// The process's anonymous memory, in kB (`/proc/PID/smaps_rollup`).
fn anonymous_kb(pid: i32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let line = rollup.lines().find(|l| l.starts_with("Anonymous:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn sessions_of_many_probes_leave_no_memory_behind() {
    need_ptrace!();
    let mut target = Target::start(&service(), &["2"]);
    let libc_wide = libc_wide_probes(target.pid);
    let all = std::fs::read_to_string(&libc_wide).unwrap();
    // Functions the workers and the main thread run (usleep, read) among them.
    let mut specs: Vec<&str> = all.lines().filter(|l| !l.contains("exit") && !l.contains("abort")).take(298).collect();
    specs.extend(["libc.so.6:usleep", "libc.so.6:read"]);
    let list = tempfile("probes300");
    std::fs::write(&list, specs.join("\n")).unwrap();
    let probes_file = format!("probes-file={}", list.display());
    let session = |target: &mut Target, round: usize| {
        let mut session = Session::start(target.pid, &["--handlers", path(&libcount()), "--param", &probes_file]);
        target.send(&format!("echo {round}"));
        target.out.expect(&format!("read: {round}"));
        let (status, lines) = {
            kill(session.child.id(), libc::SIGINT);
            session.wait()
        };
        assert_eq!(status.code(), Some(0), "round {round}: {:?}", session.own_lines());
        let rows = count_rows(&lines);
        assert_eq!(rows.len(), 300, "round {round}");
        assert!(rows.iter().any(|r| r.0 == "libc.so.6:read" && r.1 > 0), "round {round}: {rows:?}");
    };
    // The first sessions load the runtime and fill its caches and allocator.
    for round in 0..5 {
        session(&mut target, round);
    }
    let before = (anonymous_kb(target.pid), target.vm_rss_kb());
    for round in 5..105 {
        session(&mut target, round);
    }
    let after = (anonymous_kb(target.pid), target.vm_rss_kb());
    eprintln!(
        "100 sessions of 300 probes: anonymous {} -> {} kB, RSS {} -> {} kB",
        before.0, after.0, before.1, after.1
    );
    // Before: 62 kB a session (6 MB), libcount's probes and names left behind by each session
    // (the library is unloaded, its leaks stay). 256 kB over 100 sessions is less than 9 bytes
    // a probe a session: a leak of any per-probe record shows.
    assert!(after.0 <= before.0 + 256, "anonymous memory grew {before:?} -> {after:?} (kB)");

    // The runtime's part alone: a C library whose probes and names are static.
    let names: Vec<&str> = specs.iter().map(|s| s.trim_start_matches("libc.so.6:")).collect();
    std::fs::write(&list, names.join("\n")).unwrap();
    let handler = test_handler("static_probes");
    let args =
        ["--handlers", path(&handler), "--param", &format!("list={}", list.display()), "--param", "module=libc.so.6"];
    let before = anonymous_kb(target.pid);
    for round in 0..100 {
        let mut session = Session::start(target.pid, &args);
        session.expect("static_probes: 300 registered");
        let (status, _) = session.end(libc::SIGINT);
        assert_eq!(status.code(), Some(0), "round {round}");
    }
    let after = anonymous_kb(target.pid);
    eprintln!("100 sessions of 300 static probes: anonymous {before} -> {after} kB");
    assert!(after <= before + 256, "anonymous memory grew {before} -> {after} kB");

    // Every libc function, libcount's probe objects at new heap addresses now and then:
    // before, each address kept a slot of the runtime's table of probe owners for good, and
    // once it was full every registration leaked its line (200 kB a session).
    // The first two make the probe points, stubs and slots of every libc function (kept, and
    // reused by every later session: a thread may still run in a slot).
    let wide = format!("probes-file={}", libc_wide.display());
    let mut before = 0;
    for round in 0..32 {
        if round == 2 {
            before = anonymous_kb(target.pid);
        }
        let mut session = Session::start(target.pid, &["--handlers", path(&libcount()), "--param", &wide]);
        target.send(&format!("echo wide {round}"));
        target.out.expect(&format!("read: wide {round}"));
        kill(session.child.id(), libc::SIGINT);
        let (status, lines) = session.wait();
        assert_eq!(status.code(), Some(0), "round {round}: {:?}", session.own_lines());
        assert!(count_rows(&lines).len() > 1500, "round {round}");
    }
    let after = anonymous_kb(target.pid);
    eprintln!("30 sessions of every libc function: anonymous {before} -> {after} kB");
    assert!(after <= before + 256, "anonymous memory grew {before} -> {after} kB");
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(rest.iter().any(|l| l.ends_with(" 0 wrong")), "{rest:?}");
}
