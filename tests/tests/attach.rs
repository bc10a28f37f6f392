//! Attaching to running processes and detaching from them (`uprobe-run --pid`): hits arrive
//! while attached, the process runs on afterwards with its own bookkeeping intact, a blocked
//! `read` never sees EINTR, a thread asleep inside a return-probed function returns its value
//! after the detach, nothing writable and executable is left, and every refusal is one line
//! with exit status 2 and the target untouched.
//!
//! Every test needs ptrace: where it is not permitted, the test says `SKIPPED` and returns.

use std::collections::BTreeSet;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use uprobe_tests::attach::*;
use uprobe_tests::*;

/// Mappings that are writable and executable at once.
fn writable_code(maps: &[String]) -> Vec<String> {
    maps.iter()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('w') && p.contains('x')))
        .cloned()
        .collect()
}

/// The files mapped (paths), and `[anon]` for anonymous memory.
fn mapped_files(maps: &[String]) -> BTreeSet<String> {
    maps.iter().map(|l| l.split_whitespace().nth(5).unwrap_or("[anon]").to_owned()).collect()
}

/// What detach leaves, as docs/attach.md says: the runtime and its own dependency, and anonymous
/// memory (its thread states, allocator and code slots, none both writable and executable).
fn assert_clean_after_detach(before: &[String], after: &[String], handler: &Path) {
    assert_eq!(writable_code(after), Vec::<String>::new(), "writable code after detach");
    let new: Vec<String> = mapped_files(after).difference(&mapped_files(before)).cloned().collect();
    for file in &new {
        let name = file.rsplit('/').next().unwrap();
        // The runtime an attach loads comes from a memory file (`/memfd:libuprobe.so (deleted)`).
        assert!(
            ["libuprobe.so", "memfd:libuprobe.so", "libgcc_s.so.1", "[anon]"].contains(&name),
            "left behind after detach: {file} (all new: {new:?})"
        );
    }
    let handler = std::fs::canonicalize(handler).unwrap();
    assert!(!after.iter().any(|l| l.ends_with(handler.to_str().unwrap())), "{} still mapped", handler.display());
}

#[test]
fn a_running_service_is_attached_and_detached_and_runs_on() {
    need_ptrace!();
    let handler = test_handler("attach_hits");
    let mut target = Target::start(&service(), &["4"]);
    let before = target.maps();
    let mut session = Session::start(target.pid, &["--handlers", path(&handler)]);
    session.expect("work is hit");
    assert_eq!(writable_code(&target.maps()), Vec::<String>::new(), "writable code while attached");
    target.send("tick 5");
    target.out.expect("ticked 5");
    target.send("echo while attached");
    assert_eq!(target.out.expect("read: "), "read: while attached");
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(lines, ["attached", "work is hit", "tick: 5 hits"]);
    assert!(target.alive());
    target.send("tick 3");
    target.out.expect("ticked 3");
    target.send("echo after the detach");
    assert_eq!(target.out.expect("read: "), "read: after the detach");
    assert_clean_after_detach(&before, &target.maps(), &handler);
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    let totals = rest.iter().find(|l| l.starts_with("workers: ")).expect("the service's totals");
    assert!(totals.ends_with(" calls, 0 wrong"), "{totals}");
}

#[test]
fn detach_while_a_thread_sleeps_in_a_return_probed_function() {
    need_ptrace!();
    let handler = test_handler("attach_ret");
    let mut target = Target::start(&service(), &["2"]);
    let session = Session::start(target.pid, &["--handlers", path(&handler)]);
    target.send("sleep");
    target.out.expect("sleeping");
    let mut session = session;
    session.expect("sleepy entered with 21");
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(lines, ["attached", "sleepy entered with 21", "sleepy: 1 entries, 0 returns"]);
    // The call still in progress returns its value to its caller, through the runtime's
    // trampoline, with no handler left to run.
    target.send("wake");
    assert_eq!(target.out.expect("sleepy returned"), "sleepy returned 42");
    target.send("sleep");
    target.out.expect("sleeping");
    target.send("wake");
    assert_eq!(target.out.expect("sleepy returned"), "sleepy returned 42");
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(rest.iter().any(|l| l.ends_with(" calls, 0 wrong")), "{rest:?}");
}

/// The classic example as the seed states it: `./myprog &`, then `uprobe-run --pid $! ...
/// --param vaddr=0x... --param pid=$!`, Ctrl-C to end.
#[test]
fn the_classic_example_attached_to_a_running_program() {
    need_ptrace!();
    let prog = myprog();
    let addr = nm_address(&prog, "myfunc");
    let example = artefact("uprobe_example.so");
    let mut target = Target::start(&prog, &["--stdin"]);
    let pid = target.pid.to_string();
    let vaddr = format!("vaddr={addr:#x}");
    let pid_param = format!("pid={pid}");
    let mut session =
        Session::start(target.pid, &["--handlers", path(&example), "--param", &vaddr, "--param", &pid_param]);
    for i in 0..3 {
        target.send("call");
        target.out.expect(&format!("myfunc({i}) = "));
    }
    session.expect("Hit #3");
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    let mut expected = vec![format!("Registering uprobe on pid {pid}, vaddr {addr:#x}")];
    expected.extend((1..=3).map(|n| format!("Hit #{n} on probepoint at {addr:#x}")));
    expected.push("Probepoint was hit 3 times".into());
    assert_eq!(lines, expected);
    target.send("call");
    assert_eq!(target.out.expect("myfunc(3)"), "myfunc(3) = 10");
    // A pid other than the process's own is refused, as in a launched run: -ESRCH.
    let other = format!("pid={}", std::process::id());
    let mut session = Session::begin(target.pid, &["--handlers", path(&example), "--param", &vaddr, "--param", &other]);
    let (status, lines) = session.wait();
    assert_eq!(status.code(), Some(127), "{lines:?}");
    assert!(lines.iter().any(|l| l == "register_uprobe() failed, returned -3"), "{lines:?}");
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_failing_uprobe_init_removes_its_probes_and_leaves_the_process_running() {
    need_ptrace!();
    let prog = myprog();
    let example = artefact("uprobe_example.so");
    let mut target = Target::start(&prog, &["--stdin"]);
    let before = target.maps();
    // Not an instruction boundary: myfunc starts with push %rbp; mov %rsp,%rbp.
    let vaddr = format!("vaddr={:#x}", nm_address(&prog, "myfunc") + 2);
    let mut session = Session::begin(target.pid, &["--handlers", path(&example), "--param", &vaddr]);
    let (status, lines) = session.wait();
    assert_eq!(status.code(), Some(127), "{lines:?}");
    let own = session.own_lines();
    assert!(own.iter().any(|l| l.contains("is not an instruction boundary of myfunc")), "{own:?}");
    let last = own.last().unwrap();
    assert!(last.ends_with("uprobe_example.so: uprobe_init() failed, returned -22"), "{last}");
    target.send("call");
    assert_eq!(target.out.expect("myfunc(0)"), "myfunc(0) = 1");
    assert_clean_after_detach(&before, &target.maps(), &example);
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_probe_on_a_module_the_process_has_not_loaded_is_refused_not_left_waiting() {
    need_ptrace!();
    let prog = myprog();
    let count = artefact("libcount.so");
    let mut target = Target::start(&prog, &["--stdin"]);
    let mut session = Session::begin(target.pid, &["--handlers", path(&count), "--param", "probes=lbc:malloc"]);
    let (status, lines) = session.wait();
    assert_eq!(status.code(), Some(127), "{lines:?}");
    let own = session.own_lines();
    assert!(
        own.iter().any(|l| l.contains(
            "module \"lbc\" is not loaded (symbol \"malloc\"), and a runtime attached to a running process does \
             not see the libraries it loads later"
        )),
        "{own:?} {lines:?}"
    );
    target.send("call");
    assert_eq!(target.out.expect("myfunc(0)"), "myfunc(0) = 1");
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn sigterm_duration_and_the_process_exit_end_the_session() {
    need_ptrace!();
    let prog = myprog();
    let example = artefact("uprobe_example.so");
    let vaddr = format!("vaddr={:#x}", nm_address(&prog, "myfunc"));
    let mut target = Target::start(&prog, &["--stdin"]);
    let quiet = ["--handlers", path(&example), "--param", &vaddr, "--param", "verbose=0"];
    // SIGTERM.
    let session = Session::start(target.pid, &quiet);
    target.send("call");
    target.out.expect("myfunc(0)");
    let (status, lines) = session.end(libc::SIGTERM);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(lines.last().unwrap(), "Probepoint was hit 1 times", "{lines:?}");
    // The end of --duration.
    let mut session = Session::start(target.pid, &[&quiet[..], &["--duration", "1"]].concat());
    target.send("call");
    target.out.expect("myfunc(1)");
    let (status, lines) = session.wait();
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(lines.last().unwrap(), "Probepoint was hit 1 times", "{lines:?}");
    // The process's exit: the handlers' uprobe_exit still reports, then uprobe-run ends.
    let mut session = Session::start(target.pid, &quiet);
    target.send("call");
    target.send("call");
    target.out.expect("myfunc(3)");
    let pid = target.pid;
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0));
    let (status, lines) = session.wait();
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(lines.last().unwrap(), "Probepoint was hit 2 times", "{lines:?}");
    assert_eq!(session.own_lines().last().unwrap(), &format!("uprobe-run: process {pid} exited"));
}

#[test]
fn a_process_killed_during_the_session_is_said_to_have_ended_without_the_report() {
    need_ptrace!();
    let prog = myprog();
    let example = artefact("uprobe_example.so");
    let vaddr = format!("vaddr={:#x}", nm_address(&prog, "myfunc"));
    let mut target = Target::start(&prog, &["--stdin"]);
    let mut session = Session::start(target.pid, &["--handlers", path(&example), "--param", &vaddr]);
    target.send("call");
    target.out.expect("myfunc(0)");
    let pid = target.pid;
    // SAFETY: kill takes plain integers; the target is our child, not yet waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    drop(target.stdin.take());
    let status = target.child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    let (status, lines) = session.wait();
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert!(!lines.iter().any(|l| l.starts_with("Probepoint was hit")), "{lines:?}");
    assert_eq!(
        session.own_lines().last().unwrap(),
        &format!(
            "uprobe-run: process {pid} ended without the handlers' uprobe_exit: killed by a signal, or ended by \
             _exit (an attached runtime takes over neither)"
        )
    );
}

#[test]
fn an_exec_during_the_session_ends_it() {
    need_ptrace!();
    let handler = test_handler("attach_hits");
    let target = Target::start(&service(), &["2"]);
    let mut session = Session::start(target.pid, &["--handlers", path(&handler)]);
    session.expect("work is hit");
    // The service execs /bin/sleep on SIGUSR2: the session's program is gone.
    // SAFETY: kill(2) with our own child's pid.
    unsafe { libc::kill(target.pid, libc::SIGUSR2) };
    let (status, lines) = session.wait();
    assert_eq!(status.code(), Some(0), "{lines:?}");
    let own = session.own_lines();
    let end = format!("uprobe-run: process {} exec'd ", target.pid);
    assert!(
        own.last().is_some_and(|l| l.starts_with(&end) && l.ends_with("the session ended with the program it ran")),
        "{own:?}"
    );
}

/// The service run by uprobe-run itself, counting `tick` into `own`, ticked twice.
fn counted_service(own: &Path) -> Target {
    let mut launch = Command::new(uprobe_run());
    launch.args(int3_only().then_some("--no-optimize"));
    let count = artefact("libcount.so");
    launch.args(["--handlers", path(&count), "--param", "probes=tick", "-o", path(own), path(&service()), "2"]);
    let mut target = Target::start_with(&mut launch);
    target.send("tick 2");
    target.out.expect("ticked 2");
    target
}

/// Ends a [`counted_service`], checks its own count (every tick of the run, 9 in all) and
/// returns its output.
fn finish_counted_service(target: Target, own: &Path) -> String {
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    let run =
        Run { status, stdout: String::new(), stderr: String::new(), output: std::fs::read_to_string(own).unwrap() };
    assert_eq!(count_table(&run), [("tick".to_string(), 9)], "{}", run.output);
    run.output
}

#[test]
fn attaching_to_a_process_started_by_uprobe_run_adds_to_its_own_probes() {
    need_ptrace!();
    let own = tempfile("own-output");
    let handler = test_handler("attach_hits");
    let mut target = counted_service(&own);
    let session = Session::start(target.pid, &["--handlers", path(&handler), "--param", "tag=session"]);
    target.send("tick 4");
    target.out.expect("ticked 4");
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(lines, ["session attached", "session work is hit", "session tick: 4 hits"]);
    target.send("tick 3");
    target.out.expect("ticked 3");
    let output = finish_counted_service(target, &own);
    assert!(!output.contains("session"), "the session's output went to the process's: {output}");
}

#[test]
fn a_session_with_the_library_the_run_already_uses_gets_its_own_copy() {
    need_ptrace!();
    let count = artefact("libcount.so");
    let own = tempfile("own-output");
    let mut target = counted_service(&own);
    // The same libcount.so, with its own probe list: its statics are the session's.
    let session = Session::start(target.pid, &["--handlers", path(&count), "--param", "probes=tick,work"]);
    target.send("tick 4");
    target.out.expect("ticked 4");
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    let session_run = Run { status, stdout: String::new(), stderr: String::new(), output: lines.join("\n") };
    let table = count_table(&session_run);
    assert_eq!(table.len(), 2, "{lines:?}");
    assert_eq!(table[0], ("tick".to_string(), 4), "{lines:?}");
    // The run's own instance went on counting through the session and after it.
    target.send("tick 3");
    target.out.expect("ticked 3");
    finish_counted_service(target, &own);
}

#[test]
fn a_second_session_at_once_is_refused_and_a_hundred_in_a_row_stay_bounded() {
    need_ptrace!();
    let prog = myprog();
    let example = artefact("uprobe_example.so");
    let vaddr = format!("vaddr={:#x}", nm_address(&prog, "myfunc"));
    let mut target = Target::start(&prog, &["--stdin"]);
    let args = ["--handlers", path(&example), "--param", &vaddr, "--param", "verbose=0"];
    let first = Session::start(target.pid, &args);
    let (status, err) = attach_once(target.pid, &args);
    assert_eq!(status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(&format!("uprobe-run: process {} already has an attach session", target.pid)), "{err}");
    target.send("call");
    target.out.expect("myfunc(0)");
    let (status, lines) = first.end(libc::SIGINT);
    assert_eq!((status.code(), lines.last().unwrap().as_str()), (Some(0), "Probepoint was hit 1 times"));

    let cycles = 100;
    let mut rss = Vec::new();
    for i in 1..=cycles {
        let session = Session::start(target.pid, &args);
        target.send("call");
        target.out.expect(&format!("myfunc({i})"));
        let (status, lines) = session.end(libc::SIGINT);
        assert_eq!(status.code(), Some(0), "cycle {i}: {lines:?}");
        assert_eq!(lines.last().unwrap(), "Probepoint was hit 1 times", "cycle {i}");
        rss.push(target.vm_rss_kb());
    }
    let growth = rss[cycles - 1] as i64 - rss[0] as i64;
    println!(
        "RSS over {cycles} attach/detach cycles: {} kB after the first, {} kB after the last ({growth:+} kB)",
        rss[0],
        rss[cycles - 1]
    );
    assert!(growth < 2048, "RSS grew by {growth} kB over {cycles} cycles: {rss:?}");
    target.send("call");
    let n = cycles + 1;
    assert_eq!(target.out.expect(&format!("myfunc({n})")), format!("myfunc({n}) = {}", n * n + 1));
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0));
}

/// A refusal of `uprobe-run --pid PID ARGS`: status 2, one line starting with `start` and
/// containing `cause`, the process's mappings unchanged and the process alive.
fn assert_refused(pid: i32, args: &[&str], start: &str, cause: &str) {
    let before = maps(pid);
    let (status, err) = attach_once(pid, args);
    assert_eq!(status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(start) && err.contains(cause), "expected {start:?} ... {cause:?}, got {err:?}");
    assert_eq!(maps(pid), before, "the target was changed");
    assert!(alive(pid));
}

#[test]
fn refusals_name_their_cause_and_leave_the_target_alone() {
    need_ptrace!();
    // No such process: a pid that was just reaped.
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id() as i32;
    gone.wait().unwrap();
    let (status, err) = attach_once(pid, &[]);
    assert_eq!(
        (status.code(), err.as_str()),
        (Some(2), format!("uprobe-run: process {pid}: no such process\n").as_str())
    );

    // A static program, a 32-bit one, one without glibc.
    let stat = gcc("myprog_static", &["fixtures/myprog_attach.c"], &["-O0", "-static"]);
    let tiny32 = gcc("tiny32", &["fixtures/tiny32.S"], &["-m32", "-nostdlib", "-static"]);
    let nolibc = gcc("nolibc", &["fixtures/nolibc.c"], &["-nostdlib", "-fno-stack-protector", "-pie", "-fPIE"]);
    let cases = [
        (&stat, "static executable"),
        (&tiny32, "32-bit ELF (ELFCLASS32): only ELF64 x86-64 is supported"),
        (&nolibc, "no libc.so.6 is mapped in it: only programs using glibc can be attached to"),
    ];
    for (program, cause) in cases {
        let mut child = Command::new(program).stdin(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
        let pid = child.id() as i32;
        // Until its own code runs (the loader, if any, is done).
        let deadline = Instant::now() + WAIT;
        while maps(pid).iter().any(|l| l.contains("ld-linux")) && program == &nolibc && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_refused(pid, &[], &format!("uprobe-run: process {pid} ({}): ", program.display()), cause);
        let _ = child.kill();
        let _ = child.wait();
    }

    let prog = myprog();
    let target = Target::start(&prog, &["--stdin"]);
    // Stopped (Ctrl-Z): a thread it would start could not run.
    // SAFETY: kill(2) with our own child's pid.
    unsafe { libc::kill(target.pid, libc::SIGSTOP) };
    let stat = format!("/proc/{}/stat", target.pid);
    while !std::fs::read_to_string(&stat).unwrap().contains(") T ") {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_refused(target.pid, &[], &format!("uprobe-run: process {} is stopped", target.pid), "kill -CONT");
    // SAFETY: as above.
    unsafe { libc::kill(target.pid, libc::SIGCONT) };
    // Traced already (by strace, where installed).
    match Command::new("strace").args(["-p", &target.pid.to_string(), "-o", "/dev/null"]).stderr(Stdio::null()).spawn()
    {
        Err(_) => println!("SKIPPED (this part): strace is not installed"),
        Ok(mut strace) => {
            let status = format!("/proc/{}/status", target.pid);
            let deadline = Instant::now() + WAIT;
            while std::fs::read_to_string(&status).unwrap().contains("TracerPid:\t0\n") && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let start = format!("uprobe-run: process {} is already traced by strace (pid {})", target.pid, strace.id());
            assert_refused(target.pid, &[], &start, "detach it first");
            let _ = strace.kill();
            let _ = strace.wait();
        }
    }

    // Another user (uprobe-run run as nobody): not permitted, and the sysctl is named.
    if euid() != 0 {
        println!("SKIPPED (this part): running uprobe-run as another user needs root");
    } else {
        let mut command = attach_command(target.pid, &[]);
        // SAFETY: setgid/setuid in the child before exec are async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        let before = target.maps();
        let out = command.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        let start = format!(
            "uprobe-run: process {}: not permitted to trace it (it runs as uid 0, uprobe-run as uid 65534; kernel.yama.ptrace_scope",
            target.pid
        );
        assert!(err.starts_with(&start) && err.lines().count() == 1, "{err}");
        assert_eq!(target.maps(), before);
    }
    assert!(target.alive());
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[test]
fn a_process_that_exits_or_execs_during_the_attach_is_refused() {
    need_ptrace!();
    let handler = test_handler("attach_end");
    for (signal, end) in [(libc::SIGUSR1, "exited during the attach"), (libc::SIGUSR2, "exec'd during the attach")] {
        let target = Target::start(&service(), &["1"]);
        let param = format!("signal={signal}");
        let (status, err) = attach_once(target.pid, &["--handlers", path(&handler), "--param", &param]);
        assert_eq!(status.code(), Some(2), "{err}");
        let start = format!("uprobe-run: process {} {end}", target.pid);
        assert!(err.starts_with(&start) && err.lines().count() == 1, "{err}");
    }
}
