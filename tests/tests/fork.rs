//! fork, vfork and posix_spawn: a forked child keeps working probes and its own copy of the
//! handlers' state (each process's uprobe_exit reports its own counts), or gets clean code with
//! --no-follow-fork; vfork+exec and posix_spawn work with probes active.

use uprobe_tests::*;

const FLAGS: &[&str] = &["-O2", "-g", "-fno-inline", "-pthread"];

fn rows(table: &[(&str, u64)]) -> Vec<(String, u64)> {
    table.iter().map(|&(s, n)| (s.to_string(), n)).collect()
}

fn run_fork(extra: &[&str]) -> Run {
    let prog = fixture("fork", FLAGS);
    let count = artefact("libcount.so");
    let mut args = extra.to_vec();
    args.extend(["--handlers", count.to_str().unwrap(), "--param", "probes=work", prog.to_str().unwrap()]);
    let run = run_uprobe(&args);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stderr, "");
    run
}

#[test]
fn a_forked_child_keeps_probes_and_its_own_counts() {
    let run = run_fork(&[]);
    assert_eq!(run.stdout, "parent: sum=6\nchild: probe in text: yes, sum=15\nparent: child status 0, sum=3\n");
    // The child's table first (the parent waits for it): 3 hits inherited + 5 of its own.
    assert_eq!(count_table(&run), rows(&[("work", 8), ("work", 5)]));
}

#[test]
fn no_follow_fork_gives_the_child_clean_code() {
    let run = run_fork(&["--no-follow-fork"]);
    assert_eq!(run.stdout, "parent: sum=6\nchild: probe in text: no, sum=15\nparent: child status 0, sum=3\n");
    // The child keeps the state it had at the fork, and counts nothing more.
    assert_eq!(count_table(&run), rows(&[("work", 3), ("work", 5)]));
}

#[test]
fn forking_while_another_thread_hits_probes() {
    let prog = fixture("fork", FLAGS);
    let count = artefact("libcount.so");
    for extra in [&[][..], &["--no-follow-fork"][..]] {
        let mut args = extra.to_vec();
        args.extend(["--handlers", count.to_str().unwrap(), "--param", "probes=work,spin"]);
        args.extend([prog.to_str().unwrap(), "threads", "200"]);
        let run = run_uprobe(&args);
        assert!(run.status.success(), "{}", run.stderr);
        assert_eq!(run.stdout, "children ok: 200 of 200\n");
        let table = count_table(&run);
        // 200 children and the parent each print a table of two rows.
        assert_eq!(table.len(), 2 * 201, "{}", run.output);
        let work: Vec<u64> = table.iter().filter(|(s, _)| s == "work").map(|&(_, n)| n).collect();
        let expect_child = if extra.is_empty() { 1 } else { 0 };
        assert!(work[..200].iter().all(|&n| n == expect_child), "{work:?}");
        assert_eq!(work[200], 0);
    }
}

/// Events on the hot function keep the drain thread at work (a pass holds the stream's state)
/// while the main thread forks: each child has a stream of its own, which it must be able to
/// take whatever the parent's drain thread was doing at the fork.
#[test]
fn forking_while_the_drain_thread_writes_events() {
    let prog = fixture("fork", FLAGS);
    let p = prog.to_str().unwrap();
    let (spin, work) = (format!("p:spin {p}:spin"), format!("p:work {p}:work x=%di:s32"));
    let run = run_uprobe(&["-e", &spin, "-e", &work, p, "threads", "300", "20"]);
    let text = &run.output;
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert_eq!(run.stdout, "children ok: 300 of 300\n", "{}", run.stderr);
    // Each child writes its own call of work, and no other process calls it.
    assert_eq!(text.lines().filter(|l| l.contains(" work: ")).count(), 300, "{}", run.stderr);
    assert!(text.lines().any(|l| l.contains(" spin: ")));
}

fn run_spawn(mode: &str, probes: &str) -> Run {
    let prog = fixture("spawn", FLAGS);
    let count = artefact("libcount.so");
    let run = run_uprobe(&["--handlers", count.to_str().unwrap(), "--param", probes, prog.to_str().unwrap(), mode]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, format!("{mode}: child status 0, sum=5\n"));
    assert_eq!(run.stderr, "");
    run
}

#[test]
fn vfork_and_exec_with_probes_in_the_child() {
    // The vfork child hits before_exec and libc's execve; its handler runs in the child, on the
    // parent's memory, so the parent's table counts those hits.
    let run = run_spawn("vfork", "probes=work,before_exec,libc.so.6:execve");
    assert_eq!(count_table(&run), rows(&[("work", 2), ("before_exec", 1), ("libc.so.6:execve", 1)]));
}

#[test]
fn posix_spawn_with_probes_active() {
    let run = run_spawn("spawn", "probes=work,libc.so.6:posix_spawn");
    assert_eq!(count_table(&run), rows(&[("work", 2), ("libc.so.6:posix_spawn", 1)]));
}
