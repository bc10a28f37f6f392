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
