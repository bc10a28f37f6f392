//! A session only its two ends can use: an intruder process (`intruder.c`) that, during the
//! whole session, connects to every socket of the target and of uprobe-run that has an
//! address (from /proc/PID/fd and /proc/net/unix), opens each through /proc/PID/fd, and, as
//! user nobody, tries to take every descriptor of both with pidfd_getfd, changes nothing:
//! the session's counts are exact, and none of its tries succeeds.

use uprobe_tests::attach::*;
use uprobe_tests::*;

#[test]
fn an_intruder_trying_every_socket_of_both_ends_during_the_session_changes_nothing() {
    need_ptrace!();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: the intruder reads both ends' descriptors and becomes user nobody: it needs root");
        return;
    }
    let prog = fixture("attach_late", &["-O2", "-g", "-no-pie", "-pthread"]);
    let intruder = fixture("intruder", &["-O2", "-g"]);
    let mut target = Target::start(&prog, &[]);
    let mut spy = std::process::Command::new(&intruder)
        .arg(target.pid.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut spied = Lines::of(spy.stdout.take().unwrap(), "the intruder's stdout");
    spied.expect("watching ");
    let count = artefact("libcount.so");
    let session = Session::start(target.pid, &["--handlers", path(&count), "--param", "probes=gated,tiny"]);
    for round in 1..=20 {
        target.send(&format!("call {round}"));
        target.out.expect(&format!("called {round}"));
    }
    let (status, lines) = session.end(libc::SIGINT);
    // SAFETY: kill(2) with our own child's pid.
    unsafe { libc::kill(spy.id() as i32, libc::SIGTERM) };
    let report = spied.expect("rounds ");
    spy.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{lines:?}");
    let hits = (1..=20).sum::<u64>();
    let rows: Vec<String> = lines.iter().filter(|l| l.starts_with("count: ") && !l.contains("HITS")).cloned().collect();
    assert_eq!(rows.len(), 2, "{lines:?}");
    assert!(rows.iter().all(|r| r.ends_with(&format!(" {hits}"))), "{rows:?}");
    let numbers: Vec<u64> = report.split_whitespace().skip(1).step_by(2).map(|n| n.parse().unwrap()).collect();
    let [rounds, sockets, named, connected, opened, taken] = numbers[..] else { panic!("{report}") };
    assert!(rounds > 0 && sockets > 0, "the intruder saw the session's sockets: {report}");
    assert_eq!((named, connected, opened, taken), (0, 0, 0, 0), "{report}");
    println!("intruder: {report}");
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(!rest.iter().any(|l| l.contains("wrong")), "{rest:?}");
}
