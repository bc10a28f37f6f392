//! exec: the program that execs reports first; by default the exec'd program runs without
//! the runtime, and the runtime's entry leaves LD_PRELOAD while the user's own entries stay;
//! with --follow-exec the exec'd program runs with the same handlers, and probes that do not
//! apply to it are reported and skipped.

use uprobe_tests::*;

const FLAGS: &[&str] = &["-O2", "-g", "-fno-inline"];

fn user_preload() -> String {
    gcc("preload_mark.so", &["fixtures/preload_mark.c"], &["-shared", "-fPIC"]).to_str().unwrap().to_string()
}

fn row(hits: u64) -> (String, u64) {
    ("work".to_string(), hits)
}

#[test]
fn an_execd_program_runs_without_the_runtime_and_keeps_the_users_preload() {
    let prog = fixture("exec", FLAGS);
    let count = artefact("libcount.so");
    let preload = user_preload();
    let run = run_uprobe_env(
        &["--handlers", count.to_str().unwrap(), "--param", "probes=work", prog.to_str().unwrap()],
        &[("LD_PRELOAD", &preload)],
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(
        run.stdout,
        format!(
            "parent: sum=9\nchild: LD_PRELOAD={preload} UPROBE_RUN_SPEC=unset sum=4\nparent: child status 0, work(9)=19\n"
        )
    );
    assert_eq!(run.stderr, "");
    // The forked child reports before its exec (its copy of the counts: 3 hits), the exec'd
    // program has no runtime, the parent reports at its exit.
    assert_eq!(count_table(&run), vec![row(3), row(4)]);
    assert_eq!(run.output.lines().count(), 4, "{}", run.output);
}

#[test]
fn follow_exec_runs_the_execd_program_with_the_same_handlers() {
    let prog = fixture("exec", FLAGS);
    let count = artefact("libcount.so");
    let runtime = artefact("libuprobe.so");
    let preload = user_preload();
    let run = run_uprobe_env(
        &["--follow-exec", "--handlers", count.to_str().unwrap(), "--param", "probes=work", prog.to_str().unwrap()],
        &[("LD_PRELOAD", &preload)],
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(
        run.stdout,
        format!(
            "parent: sum=9\nchild: LD_PRELOAD={preload}:{} UPROBE_RUN_SPEC=set sum=4\nparent: child status 0, work(9)=19\n",
            runtime.display()
        )
    );
    // The forked child's report before its exec, the exec'd program's table (the parent
    // waits for it), then the parent's.
    assert_eq!(count_table(&run), vec![row(3), row(2), row(4)]);
    assert_eq!(run.output.lines().count(), 6, "{}", run.output);
}

#[test]
fn follow_exec_reports_and_skips_probes_that_do_not_apply() {
    let prog = fixture("exec", FLAGS);
    let count = artefact("libcount.so");
    let run = run_uprobe(&[
        "--follow-exec",
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        "probes=work",
        prog.to_str().unwrap(),
        "/bin/true",
    ]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, "parent: sum=9\nparent: child status 0, work(9)=19\n");
    let true_path = std::fs::canonicalize("/bin/true").unwrap();
    let lines: Vec<&str> = run.output.lines().collect();
    // The forked child's report before its exec comes first.
    assert_eq!(count_table(&Run { output: lines[..2].join("\n"), ..run.clone() }), vec![row(3)]);
    assert_eq!(
        lines[2..5],
        [
            "uprobe-run: register_uprobe(work): symbol \"work\" not found in any loaded module",
            "count: cannot probe work: ENOENT (-2)",
            &format!(
                "uprobe-run: {}: uprobe_init() failed, returned 1; {} (exec'd) runs without it",
                count.display(),
                true_path.display()
            ),
        ],
        "{}",
        run.output
    );
    assert_eq!(count_table(&run), vec![row(3), row(4)]);
    assert_eq!(lines.len(), 7, "{}", run.output);
}
