//! Every way a run ends reports once: the `count` handler's table (its `uprobe_exit`)
//! appears exactly once per process, and the process ends exactly as it does without the
//! runtime: the same exit status, or the same signal with the same core-dump flag. The
//! fixture `endings` calls `work` three times, then ends the way its argument says.

use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use uprobe_tests::*;

const FLAGS: &[&str] = &["-O2", "-g", "-fno-inline"];

fn endings() -> PathBuf {
    fixture("endings", FLAGS)
}

fn row(hits: u64) -> (String, u64) {
    ("work".to_string(), hits)
}

/// How a process ended, and what it and the runtime wrote.
struct Ended {
    status: ExitStatus,
    stdout: String,
    output: String,
}

/// A fresh directory for a run's core file, removed by [`Scratch::drop`].
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile("endings");
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The command for `endings ARGS`, plain or under uprobe-run with `libcount` counting `work`
/// (and `extra` options), run in a scratch directory with core dumps allowed, so that the
/// kernel's core-dump flag can be compared.
fn command(args: &[&str], probed: Option<(&Path, &[&str])>, dir: &Path) -> Command {
    let prog = endings();
    let mut cmd = match probed {
        None => Command::new(&prog),
        Some((out, extra)) => {
            let count = artefact("libcount.so");
            let mut cmd = Command::new(uprobe_run());
            cmd.args(int3_only().then_some("--no-optimize"))
                .arg("-o")
                .arg(out)
                .args(extra)
                .args(["--handlers", count.to_str().unwrap(), "--param", "probes=work"])
                .arg(&prog);
            cmd
        }
    };
    default_signals(&mut cmd).args(args).current_dir(dir).stdin(Stdio::null());
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent. Where the
    // hard limit forbids it, both runs keep the same lower limit: the comparison holds.
    unsafe {
        cmd.pre_exec(|| {
            let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
            libc::setrlimit(libc::RLIMIT_CORE, &unlimited);
            Ok(())
        });
    }
    cmd
}

fn run(args: &[&str], probed: bool, extra: &[&str]) -> Ended {
    let scratch = Scratch::new();
    let out = tempfile("out");
    let output = command(args, probed.then_some((out.as_path(), extra)), &scratch.0).output().expect("run");
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    Ended { status: output.status, stdout: String::from_utf8_lossy(&output.stdout).into_owned(), output: text }
}

/// Runs `endings HOW` plain and probed; asserts the same ending and stdout, and one table.
fn ends_alike(how: &str, hits: u64) -> Ended {
    let plain = run(&[how], false, &[]);
    let probed = run(&[how], true, &[]);
    assert_same_ending(&plain.status, &probed.status, how);
    assert_eq!(probed.stdout, plain.stdout, "{how}");
    assert_eq!(count_table(&probed.output_run()), vec![row(hits)], "{how}: {}", probed.output);
    probed
}

fn assert_same_ending(plain: &ExitStatus, probed: &ExitStatus, how: &str) {
    assert_eq!(probed.code(), plain.code(), "{how}: {probed:?} against {plain:?}");
    assert_eq!(probed.signal(), plain.signal(), "{how}: {probed:?} against {plain:?}");
    assert_eq!(probed.core_dumped(), plain.core_dumped(), "{how}: core dump, {probed:?} against {plain:?}");
}

impl Ended {
    fn output_run(&self) -> Run {
        Run { status: self.status, stdout: self.stdout.clone(), stderr: String::new(), output: self.output.clone() }
    }
}

#[test]
fn returning_from_main_and_exit_report_once() {
    assert_eq!(ends_alike("return", 3).status.code(), Some(0));
    assert_eq!(ends_alike("exit", 3).status.code(), Some(3));
}

#[test]
fn underscore_exit_reports_once_with_the_programs_status() {
    assert_eq!(ends_alike("_exit", 3).status.code(), Some(4));
    assert_eq!(ends_alike("_Exit", 3).status.code(), Some(5));
}

#[test]
fn a_fault_or_abort_reports_then_dies_of_the_same_signal() {
    for (how, sig) in [("abort", libc::SIGABRT), ("segv", libc::SIGSEGV), ("fpe", libc::SIGFPE), ("ill", libc::SIGILL)]
    {
        let probed = ends_alike(how, 3);
        assert_eq!(probed.status.signal(), Some(sig), "{how}");
        // Where the kernel writes plain `core` files, the comparison is not vacuous.
        if cores_are_written() {
            assert!(probed.status.core_dumped(), "{how}: {:?}", probed.status);
        }
    }
}

/// Whether the kernel writes a plain `core` file and the hard limit lets the runs ask for one.
fn cores_are_written() -> bool {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct passed.
    let allowed = unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut limit) } == 0 && limit.rlim_max > 1 << 24;
    allowed && std::fs::read_to_string("/proc/sys/kernel/core_pattern").is_ok_and(|p| p.trim() == "core")
}

#[test]
fn a_raised_terminating_signal_reports_then_ends_the_process_by_it() {
    let signals = [
        ("int", libc::SIGINT),
        ("term", libc::SIGTERM),
        ("hup", libc::SIGHUP),
        ("quit", libc::SIGQUIT),
        ("usr1", libc::SIGUSR1),
        ("pipe", libc::SIGPIPE),
        ("alrm", libc::SIGALRM),
    ];
    for (how, sig) in signals {
        let probed = ends_alike(how, 3);
        assert_eq!(probed.status.signal(), Some(sig), "{how}");
    }
}

/// `endings wait`, killed from outside by `sig` once it has said "ready".
fn killed(sig: i32, probed: bool) -> Ended {
    let scratch = Scratch::new();
    let out = tempfile("out");
    let extra: &[&str] = &[];
    let mut child = command(&["wait"], probed.then_some((out.as_path(), extra)), &scratch.0)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = String::new();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    while !stdout.ends_with("ready\n") {
        let before = stdout.len();
        reader.read_line(&mut stdout).unwrap();
        assert!(stdout.len() > before, "the program ended before it was ready: {stdout:?}");
    }
    // SAFETY: kill takes plain integers; the child is ours and not yet waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut reader, &mut rest).unwrap();
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    Ended { status, stdout: stdout + &rest, output: text }
}

#[test]
fn ctrl_c_and_sigterm_from_outside_report_then_end_the_process_by_that_signal() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGQUIT] {
        let plain = killed(sig, false);
        let probed = killed(sig, true);
        assert_eq!(probed.status.signal(), Some(sig));
        assert_same_ending(&plain.status, &probed.status, &format!("signal {sig}"));
        assert_eq!(probed.stdout, plain.stdout);
        assert_eq!(count_table(&probed.output_run()), vec![row(3)], "signal {sig}: {}", probed.output);
    }
}

#[test]
fn the_programs_own_handler_runs_and_the_report_waits_for_the_real_end() {
    let handled = ends_alike("handled", 3);
    assert_eq!(handled.status.code(), Some(0));
    assert_eq!(handled.stdout, "sum 6, ending by handled\nhandled\n");
    let handled_exit = ends_alike("handled_exit", 3);
    assert_eq!(handled_exit.status.code(), Some(9));
}

#[test]
fn exec_reports_before_the_new_program_starts() {
    let probed = ends_alike("exec", 3);
    assert_eq!(probed.status.code(), Some(0));
    // The exec'd /bin/true runs without the runtime: nothing follows the table.
    assert_eq!(probed.output.lines().count(), 2, "{}", probed.output);
}

#[test]
fn with_follow_exec_the_old_program_reports_and_then_the_new_one_starts_probed() {
    let probed = run(&["exec"], true, &["--follow-exec"]);
    assert_eq!(probed.status.code(), Some(0));
    assert_eq!(count_table(&probed.output_run()), vec![row(3)], "{}", probed.output);
    // /bin/true has no `work`: its copy of the handlers says so and it runs without them.
    let lines: Vec<&str> = probed.output.lines().collect();
    assert_eq!(lines.len(), 5, "{}", probed.output);
    assert!(lines[2].contains("symbol \"work\" not found"), "{}", probed.output);
    assert!(lines[4].ends_with("runs without it"), "{}", probed.output);
}

#[test]
fn an_exec_that_cannot_start_keeps_the_program_probed_and_reports_once_at_the_end() {
    // execl of a missing file: the program goes on, its fourth call is counted.
    let probed = ends_alike("exec_fail", 4);
    assert_eq!(probed.stdout, "sum 6, ending by exec_fail\nexec failed, going on: 11\n");
}

#[test]
fn a_fork_child_and_its_parent_each_report_once() {
    // The child's copy of the counts has its own call: 4; the parent's: 3.
    let plain = run(&["fork"], false, &[]);
    let probed = run(&["fork"], true, &[]);
    assert_same_ending(&plain.status, &probed.status, "fork");
    assert_eq!(count_table(&probed.output_run()), vec![row(4), row(3)], "{}", probed.output);
    // A vfork child shares the parent's memory: only the process reports.
    assert_eq!(ends_alike("vfork", 3).status.code(), Some(0));
}

#[test]
fn a_crashing_uprobe_exit_is_named_and_the_programs_buffered_output_is_kept() {
    let prog = endings();
    let handler = test_handler("crash_exit");
    let run = run_uprobe(&["--handlers", handler.to_str().unwrap(), prog.to_str().unwrap(), "buffered"]);
    assert_eq!(run.stdout, "sum 6, ending by buffered\nstill buffered\n");
    assert_eq!(run.status.signal(), Some(libc::SIGSEGV), "{:?}", run.status);
    assert_eq!(run.output, format!("uprobe-run: {}: uprobe_exit() faulted: SIGSEGV at 0x0\n", handler.display()));
}

#[test]
fn a_crashing_uprobe_init_is_named_and_its_exit_is_not_called() {
    let prog = endings();
    let handler = test_handler("crash_exit");
    let run =
        run_uprobe(&["--handlers", handler.to_str().unwrap(), "--param", "in=init", prog.to_str().unwrap(), "return"]);
    assert_eq!(run.status.signal(), Some(libc::SIGSEGV), "{:?}", run.status);
    assert_eq!(run.stdout, "");
    assert_eq!(run.output, format!("uprobe-run: {}: uprobe_init() faulted: SIGSEGV at 0x0\n", handler.display()));
}

#[test]
fn the_event_stream_and_the_aggregations_end_with_every_ending_too() {
    let prog = endings();
    let def = format!("p:w {}:work x=%di", prog.display());
    for how in ["return", "_exit", "term", "segv", "exec"] {
        let plain = run_plain(&prog, &[how]);
        let stream = run_uprobe(&["-e", &def, prog.to_str().unwrap(), how]);
        assert_same_ending(&plain.status, &stream.status, how);
        let records: Vec<&str> = stream.output.lines().filter(|l| l.contains(" w: (work+0x0) x=")).collect();
        assert_eq!(records.len(), 3, "{how}: {}", stream.output);
        let counted = run_uprobe(&["-e", &def, "--count", prog.to_str().unwrap(), how]);
        assert_same_ending(&plain.status, &counted.status, how);
        assert_eq!(counted.output, "EVENT        COUNT\nw                3\n\n", "{how}");
    }
}

#[test]
fn a_signal_sent_while_the_report_runs_neither_cuts_it_nor_changes_the_ending() {
    let prog = endings();
    let handler = test_handler("slow_exit");
    for (how, status) in [("_exit", 4), ("exit", 3)] {
        let out = tempfile("out");
        let mut child = default_signals(&mut Command::new(uprobe_run()))
            .arg("-o")
            .arg(&out)
            .args(["--handlers", handler.to_str().unwrap(), prog.to_str().unwrap(), how])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while !std::fs::read_to_string(&out).unwrap_or_default().contains("exit start") {
            assert!(started.elapsed().as_secs() < 10, "no report started");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // SAFETY: kill takes plain integers; the child is ours and not yet waited for.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let ended = child.wait().unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        assert_eq!(ended.code(), Some(status), "{how}: {ended:?}");
        assert_eq!(text, "exit start\nexit end\n", "{how}");
    }
}

#[test]
fn probes_on_the_functions_that_end_the_process_are_in_its_report() {
    // _exit, _Exit, exit's own _exit and the exec functions end the process right after the
    // report: their probes hit before it, with the arguments of the call.
    let prog = endings();
    let defs = [
        "-e",
        "p:quit libc.so.6:_exit status=%di:s32",
        "-e",
        "p:run libc.so.6:execve path=+0(%di):string argv0=+0(+0(%si)):string",
        "-e",
        "p:runl libc.so.6:execl path=+0(%di):string",
    ];
    let cases = [
        ("_exit", "quit: (_exit+0x0) status=4"),
        ("_Exit", "quit: (_exit+0x0) status=5"),
        ("exit", "quit: (_exit+0x0) status=3"),
        ("exec", "runl: (execl+0x0) path=\"/bin/true\""),
    ];
    for (how, record) in cases {
        let mut args = defs.to_vec();
        args.extend([prog.to_str().unwrap(), how]);
        let run = run_uprobe(&args);
        // `comm-tid [cpu] seconds: EVENT: ...`: what follows the timestamp.
        let records: Vec<&str> = run.output.lines().filter_map(|l| l.split_once(": ").map(|(_, r)| r)).collect();
        assert!(records.contains(&record), "{how}: no {record:?} in\n{}", run.output);
        if how == "exec" {
            // execl ends in execve, with the path and the argument vector it built.
            let execve = "run: (execve+0x0) path=\"/bin/true\" argv0=\"true\"";
            assert!(records.iter().any(|r| r.ends_with(execve)), "{}", run.output);
        }
    }
}
