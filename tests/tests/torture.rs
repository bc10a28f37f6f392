//! What probing every libc function, entry and return, must survive: a return probe on
//! `__errno_location`, functions that return twice, coroutines switching stacks, programs
//! that define `unsetenv` themselves, return probes that cannot work, hits from a handler
//! library's own entry points, and code glibc runs with every signal blocked.

use std::path::{Path, PathBuf};
use std::process::Command;

use uprobe_tests::*;

const C_FLAGS: &[&str] = &["-O2", "-g", "-fno-inline", "-pthread"];

fn program(name: &str) -> PathBuf {
    fixture(name, C_FLAGS)
}

/// `(calls, returns, nmissed)` the `ret` handler printed for `func`.
fn ret_counts(run: &Run, func: &str) -> (u64, u64, u64) {
    let line = run
        .lines_with(&format!("ret: {func} "))
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no counts for {func} in:\n{}", run.output));
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .unwrap_or_else(|| panic!("no {name} in {line}"))
            .parse()
            .unwrap()
    };
    (field("calls"), field("returns"), field("nmissed"))
}

/// Runs `program ARGS` under the `ret` handler probing the returns of `funcs`, and checks it
/// behaved exactly as without probes.
fn run_ret(program: &Path, args: &[&str], funcs: &str) -> Run {
    let plain = run_plain(program, args);
    let handler = test_handler("ret");
    let mut argv = vec!["--handlers", handler.to_str().unwrap(), "--param"];
    let funcs = format!("funcs={funcs}");
    argv.push(&funcs);
    argv.push(program.to_str().unwrap());
    argv.extend(args);
    let run = run_uprobe(&argv);
    assert_eq!(run.status.code(), plain.status.code(), "{:?}\n{}", run.status, run.output);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout));
    run
}

#[test]
fn a_return_probe_on_errno_location_is_not_hit_by_the_runtime() {
    // The trampoline used to read errno through __errno_location before marking the thread
    // busy: each return of f re-entered it, up to maxactive deep.
    let prog = program("errno_ret");
    let run = run_ret(&prog, &[], "f,libc.so.6:__errno_location");
    assert_eq!(ret_counts(&run, "f"), (1000, 1000, 0));
    assert_eq!(ret_counts(&run, "libc.so.6:__errno_location"), (0, 0, 0), "the program never calls it");
}

#[test]
fn posix_spawn_children_sharing_memory_leave_the_parent_intact() {
    // system() runs a posix_spawn child on the parent's memory and thread pointer; the child
    // hits probes (execve never returns in it). The parent's handlers must keep running.
    let prog = program("errno_ret");
    let run = run_ret(&prog, &["spawn"], "f,libc.so.6:__errno_location,libc.so.6:execve");
    assert_eq!(ret_counts(&run, "f"), (1000, 1000, 0));
    assert_eq!(ret_counts(&run, "libc.so.6:__errno_location"), (0, 0, 0));
    assert_eq!(ret_counts(&run, "libc.so.6:execve"), (20, 0, 0), "20 children exec'd");
}

#[test]
fn return_probes_on_functions_that_return_twice_are_refused() {
    let prog = program("twice");
    let handler = test_handler("ret");
    for func in ["_setjmp", "setjmp", "__sigsetjmp", "vfork", "getcontext"] {
        let run = run_uprobe(&[
            "--handlers",
            handler.to_str().unwrap(),
            "--param",
            &format!("funcs=libc.so.6:{func}"),
            prog.to_str().unwrap(),
        ]);
        assert_eq!(run.status.code(), Some(127), "{func}: {}", run.output);
        assert_eq!(run.stdout, "", "{func}");
        assert!(
            run.output
                .contains("returns twice (as setjmp, vfork and getcontext do): its second return would find no record"),
            "{func}: {}",
            run.output
        );
    }
    // Entry probes on them work, in a program that uses every one and whose threads leave
    // through pthread_exit (glibc's thread start calls _setjmp).
    let plain = run_plain(&prog, &[]);
    let count = artefact("libcount.so");
    let run = run_uprobe(&[
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        "probes=libc.so.6:_setjmp,libc.so.6:__sigsetjmp,libc.so.6:getcontext,libc.so.6:vfork",
        prog.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{:?} {}", run.status, run.output);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout));
    let counts = count_table(&run);
    let hits = |p: &str| counts.iter().find(|(s, _)| s == p).map(|(_, n)| *n).unwrap();
    assert_eq!(hits("libc.so.6:vfork"), 1);
    assert_eq!(hits("libc.so.6:getcontext"), 1);
    assert!(hits("libc.so.6:_setjmp") >= 4, "four thread starts: {counts:?}");
}

#[test]
fn coroutines_on_their_own_stacks_keep_their_pending_returns() {
    let prog = program("coro");
    // swapcontext: each call returns when its context is resumed, on another stack.
    let run = run_ret(&prog, &[], "ping,pong,swapcontext");
    assert_eq!(ret_counts(&run, "ping"), (100, 100, 0));
    assert_eq!(ret_counts(&run, "pong"), (100, 100, 0));
    assert_eq!(ret_counts(&run, "swapcontext"), (201, 201, 0));
    // A hand-written switch; the two coroutines' last switches are never resumed.
    let run = run_ret(&prog, &["asm"], "ping,pong,switch_stack");
    assert_eq!(ret_counts(&run, "ping"), (100, 100, 0));
    assert_eq!(ret_counts(&run, "pong"), (100, 100, 0));
    assert_eq!(ret_counts(&run, "switch_stack"), (203, 201, 0));
}

#[test]
fn a_program_defining_unsetenv_itself_still_loses_the_runtime_at_exec() {
    let prog = program("own_env");
    let count = artefact("libcount.so");
    let run = run_uprobe_env(
        &["--handlers", count.to_str().unwrap(), "--param", "probes=main", prog.to_str().unwrap()],
        &[("LD_PRELOAD", "")],
    );
    assert!(run.status.success(), "{}", run.output);
    assert_eq!(run.stdout, "LD_PRELOAD=unset UPROBE_RUN_SPEC=unset\n");
    // bash exports its own unsetenv: the commands it runs must not inherit the runtime.
    if Path::new("/bin/bash").exists() {
        let run = run_uprobe(&[
            "--handlers",
            count.to_str().unwrap(),
            "--param",
            "probes=libc.so.6:getenv",
            "/bin/bash",
            "-c",
            "for i in 1 2 3; do /usr/bin/env; done | grep -c -e UPROBE_RUN_SPEC -e libuprobe || true",
        ]);
        assert!(run.status.success(), "{}", run.output);
        assert_eq!(run.stdout, "0\n");
    }
}

#[test]
fn return_probes_on_the_entry_point_and_on_functions_that_never_return_are_refused() {
    let prog = program("noreturn");
    let handler = test_handler("ret");
    for (func, why) in [
        ("_start", "is the program's entry point: its stack holds argc, not a return address"),
        ("die", "never returns by ret (no ret or tail call in its code)"),
    ] {
        let run = run_uprobe(&[
            "--handlers",
            handler.to_str().unwrap(),
            "--param",
            &format!("funcs={func}"),
            prog.to_str().unwrap(),
        ]);
        assert_eq!(run.status.code(), Some(127), "{func}: {}", run.output);
        assert!(run.output.contains(why), "{func}: {}", run.output);
        assert_eq!(run.stdout, "");
    }
}

#[test]
fn hits_from_a_handler_librarys_own_entry_points_run_no_handler() {
    // The kernel counts no free and no write in /usr/bin/true; the handler library's own
    // uprobe_init and uprobe_exit (which print the table) must not be counted either.
    let count = artefact("libcount.so");
    let run = run_uprobe(&[
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        "probes=libc.so.6:free,libc.so.6:write",
        "/bin/true",
    ]);
    assert!(run.status.success(), "{}", run.output);
    assert_eq!(count_table(&run), [("libc.so.6:free".to_string(), 0), ("libc.so.6:write".to_string(), 0)]);
}

/// The offset of the second instruction of the code a probe on `libc.so.6:NAME` gets (for an
/// IFUNC, the implementation the loader chose), from `uprobe-run -l` and objdump.
fn second_instruction(prog: &Path, name: &str) -> u64 {
    let list = Command::new(uprobe_run()).args(["-l", &format!("libc.so.6:{name}")]).arg(prog).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    let line = list.lines().find(|l| l.starts_with(&format!("libc.so.6:{name} "))).expect("listed");
    // `libc.so.6:NAME -> IMPLEMENTATION OFFSET SIZE STRATEGY`, or `libc.so.6:NAME OFFSET ...`.
    let fields: Vec<&str> = line.split_whitespace().collect();
    let offset = if fields[1] == "->" { fields[3] } else { fields[1] };
    let start = u64::from_str_radix(&offset[2..], 16).unwrap();
    let dump = Command::new("objdump")
        .args(["-d", &format!("--start-address={start:#x}"), &format!("--stop-address={:#x}", start + 32)])
        .arg(std::fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6").unwrap())
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    let addresses: Vec<u64> = dump
        .lines()
        .filter_map(|l| l.trim_start().split_once(":\t").and_then(|(a, _)| u64::from_str_radix(a, 16).ok()))
        .collect();
    addresses[1] - start
}

#[test]
fn code_glibc_runs_with_every_signal_blocked_takes_a_jump_even_without_optimizing() {
    // New threads, exiting threads and posix_spawn children run these with every signal
    // blocked: an int3 there kills the program.
    let prog = program("churn");
    let plain = run_plain(&prog, &[]);
    let count = artefact("libcount.so");
    let probes = "libc.so.6:__ctype_init,libc.so.6:_setjmp,libc.so.6:getpagesize,libc.so.6:madvise,libc.so.6:munmap,libc.so.6:execve,libc.so.6:__libc_sigaction";
    let param = format!("probes={probes}");
    let mut args = vec!["-v", "--handlers", count.to_str().unwrap(), "--param", &param, prog.to_str().unwrap()];
    if !int3_only() {
        args.insert(0, "--no-optimize"); // the int3-only pass adds it itself
    }
    let run = run_uprobe(&args);
    assert!(run.status.success(), "{:?}\n{}", run.status, run.output);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout));
    let jumps = run.output.lines().filter(|l| l.starts_with("uprobe-run: probe at ") && l.ends_with("): jump")).count();
    assert_eq!(jumps, 7, "{}", run.output);
    let hits: u64 = count_table(&run).iter().map(|(_, n)| n).sum();
    assert!(hits > 24, "{:?}", count_table(&run));
    // An IFUNC implementation with no symbol (strchrnul in Debian's libc) takes the jump too,
    // measured by its FDE: the posix_spawnp children that run it survive, and it counts.
    let run = run_uprobe(&[
        "-v",
        "--handlers",
        count.to_str().unwrap(),
        "--param",
        "probes=libc.so.6:strchrnul",
        prog.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{:?}\n{}", run.status, run.output);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout));
    assert!(run.output.lines().any(|l| l.contains("(strchrnul+0x0): jump")), "{}", run.output);
    assert!(count_table(&run)[0].1 > 0, "{}", run.output);
    // Where a jump cannot be written (its second instruction: not the function's entry), the
    // probe is refused with the reason.
    let second = format!("probes=libc.so.6:strchrnul+{:#x}", second_instruction(&prog, "strchrnul"));
    let run = run_uprobe(&["--handlers", count.to_str().unwrap(), "--param", &second, prog.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(127), "{}", run.output);
    assert!(run.output.contains("runs with every signal blocked in a posix_spawnp child"), "{}", run.output);
}

#[test]
fn probe_sites_that_something_else_changed_are_reported_at_exit() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let tracefs = match tracefs() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    // A position-independent program: nm gives file offsets, as uprobe_events wants them.
    let prog = fixture("pause", &["-O2", "-g", "-fno-inline", "-pie", "-fPIE"]);
    let offset = nm_address(&prog, "work");
    let count = artefact("libcount.so");
    let out = tempfile("changed");
    let mut child = default_signals(&mut Command::new(uprobe_run()))
        .args(int3_only().then_some("--no-optimize"))
        .arg("-o")
        .arg(&out)
        .args(["--handlers", count.to_str().unwrap(), "--param", "probes=work"])
        .arg(&prog)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "ready 3\n");
    // A kernel uprobe on the same function, added and removed while the program runs: the
    // kernel puts its own breakpoint there and, leaving, the bytes of the file back.
    let group = format!("uprobe_run_{}", std::process::id());
    let events = tracefs.join("uprobe_events");
    let define = format!("p:{group}/work {}:{offset:#x}\n", prog.display());
    let append =
        |text: &str| std::fs::OpenOptions::new().append(true).open(&events).unwrap().write_all(text.as_bytes());
    append(&define).unwrap();
    let enable = tracefs.join("events").join(&group).join("work").join("enable");
    std::fs::write(&enable, "1").unwrap();
    std::fs::write(&enable, "0").unwrap();
    append(&format!("-:{group}/work\n")).unwrap();
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let output = std::fs::read_to_string(&out).unwrap();
    assert!(
        output.contains("(work+0x0): its code was changed by something else while it was probed (a kernel uprobe"),
        "{output}"
    );
}
