//! What a runtime loaded into a running process sees during an attach session, as a launched
//! one does: libraries loaded after the attach, an end by `_exit` or a fatal signal, the
//! program's own SIGTRAP handler and masks set after the attach, and children forked during
//! the session (which run without its probes).
//!
//! The fixture (`attach_late.c`) waits for commands on its stdin, so that the attach lands
//! before the work. Every test needs ptrace: where it is not permitted, the test says
//! `SKIPPED` and returns.

use std::path::PathBuf;

use uprobe_tests::attach::*;
use uprobe_tests::*;

fn late() -> PathBuf {
    fixture("attach_late", &["-O2", "-g", "-no-pie", "-pthread"])
}

fn late_lib() -> PathBuf {
    gcc("libattach_dl.so", &["fixtures/dl_lib.c"], &["-shared", "-fPIC", "-O2", "-g", "-fno-inline"])
}

fn libcount() -> PathBuf {
    artefact("libcount.so")
}

/// The hit counts of libcount's table, by row.
fn rows(lines: &[String]) -> Vec<(String, u64)> {
    let run =
        Run { status: Default::default(), stdout: String::new(), stderr: String::new(), output: lines.join("\n") };
    count_table(&run)
}

fn row(name: &str, hits: u64) -> (String, u64) {
    (name.to_string(), hits)
}

/// A session counting `gated`, `tiny` and `PROBES` in the target.
fn counting(pid: i32, more: &str) -> Session {
    let probes = format!("probes=gated,tiny{more}");
    Session::start(pid, &["--handlers", path(&libcount()), "--param", &probes])
}

#[test]
fn a_library_loaded_after_the_attach_is_probed_from_its_dlopen() {
    need_ptrace!();
    let lib = late_lib();
    let mut target = Target::start(&late(), &[]);
    // Before: refused, "libattach_dl" not loaded (-ENOENT), the session failed (status 127).
    let session = counting(target.pid, ",libattach_dl:lib_func");
    // sum of 7i+3 for i < n
    target.send(&format!("dlopen {} 100", lib.display()));
    assert_eq!(target.out.expect("lib_func "), "lib_func 100 times = 34950");
    // Unloaded and loaded again: probed again.
    target.send(&format!("dlopen {} 50", lib.display()));
    assert_eq!(target.out.expect("lib_func "), "lib_func 50 times = 8725");
    target.send("call 3");
    target.out.expect("called 3");
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(rows(&lines), vec![row("gated", 3), row("tiny", 3), row("libattach_dl:lib_func", 150)], "{lines:?}");
    // Detached: the library is no longer followed, nor probed.
    target.send(&format!("dlopen {} 10", lib.display()));
    assert_eq!(target.out.expect("lib_func "), "lib_func 10 times = 345");
    let (status, _) = target.finish();
    assert_eq!(status.code(), Some(0));
}

/// A session on the fixture, which makes `calls` calls and then `ending`: the process's exit
/// status, and the session's table, which must come all the same (before: none, and
/// "ended without the handlers' uprobe_exit").
fn session_through_the_end(calls: u64, ending: &str) -> std::process::ExitStatus {
    let mut target = Target::start(&late(), &[]);
    let pid = target.pid;
    let mut session = counting(pid, "");
    target.send(&format!("call {calls}"));
    target.out.expect(&format!("called {calls}"));
    target.send(ending);
    let ended = target.child.wait().unwrap();
    let (status, lines) = session.wait();
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(rows(&lines), vec![row("gated", calls), row("tiny", calls)], "{ending}: {lines:?}");
    assert_eq!(session.own_lines().last().unwrap(), &format!("uprobe-run: process {pid} exited"));
    ended
}

#[test]
fn an_end_by_exit_underscore_still_gives_the_session_its_report() {
    need_ptrace!();
    assert_eq!(session_through_the_end(4, "_exit 5").code(), Some(5));
}

#[test]
fn a_process_killed_by_sigsegv_still_gives_the_session_its_report() {
    need_ptrace!();
    let status = session_through_the_end(2, "segv");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGSEGV));
}

#[test]
fn the_programs_sigtrap_handler_and_masks_set_after_the_attach_keep_probes_working() {
    need_ptrace!();
    let mut target = Target::start(&late(), &[]);
    let session = counting(target.pid, "");
    // tiny() is an int3 probe. Before: the program's handler took the probe's traps (10 own
    // traps, no hit counted), and a thread blocking SIGTRAP was killed at its first hit.
    target.send("trap 5");
    assert_eq!(target.out.expect("own traps"), "own traps 5, handler kept yes");
    target.send("block 4");
    assert_eq!(target.out.expect("blocked"), "blocked 4: yes yes");
    target.send("call 1");
    target.out.expect("called 1");
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(rows(&lines), vec![row("gated", 1), row("tiny", 5 + 4 + 4 + 1)], "{lines:?}");
    // Detached: the program's calls reach libc as before the attach.
    target.send("trap 3");
    assert_eq!(target.out.expect("own traps"), "own traps 3, handler kept yes");
    target.send("block 2");
    assert_eq!(target.out.expect("blocked"), "blocked 2: yes yes");
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
}

/// `len` bytes of process `pid`'s memory at `addr`.
fn peek(pid: i32, addr: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut buf = vec![0; len];
    mem.read_exact_at(&mut buf, addr).unwrap();
    buf
}

/// The sockets among process `pid`'s descriptors.
fn sockets(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|l| l.display().to_string())
        .filter(|l| l.starts_with("socket:"))
        .collect()
}

#[test]
fn a_child_forked_during_the_session_runs_without_its_probes() {
    need_ptrace!();
    let prog = late();
    let mut target = Target::start(&prog, &[]);
    let places = [nm_address(&prog, "gated"), nm_address(&prog, "tiny")];
    let clean: Vec<Vec<u8>> = places.iter().map(|&a| peek(target.pid, a, 5)).collect();
    let session = counting(target.pid, "");
    let probed: Vec<Vec<u8>> = places.iter().map(|&a| peek(target.pid, a, 5)).collect();
    assert_ne!(probed, clean, "the probes are in the parent's code");
    target.send("fork 6");
    let child: i32 = target.out.expect("child ")["child ".len()..].parse().unwrap();
    // Before: the child kept the session's probes and handlers, and its sockets.
    let code: Vec<Vec<u8>> = places.iter().map(|&a| peek(child, a, 5)).collect();
    assert_eq!(code, clean, "the child's code is its own again");
    assert_eq!(sockets(child), Vec::<String>::new(), "the child holds nothing of the session");
    target.send("go");
    assert_eq!(target.out.expect("child called"), "child called 6");
    assert_eq!(target.out.expect("child exited"), "child exited 7");
    target.send("call 2");
    target.out.expect("called 2");
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(rows(&lines), vec![row("gated", 2), row("tiny", 2)], "{lines:?}");
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(!rest.iter().any(|l| l.contains("wrong")), "{rest:?}");
}

/// The pid, in this namespace, of the process `unshare`'s child runs.
fn child_of(pid: u32) -> i32 {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    children.split_whitespace().next().expect("unshare's child").parse().unwrap()
}

/// Whether `unshare ARGS true` works here; says why not.
fn unshare_permitted(args: &[&str]) -> Result<(), String> {
    match std::process::Command::new("unshare").args(args).arg("true").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "unshare {} is not permitted here: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("unshare is not installed ({e})")),
    }
}

/// The fixture started by `unshare ARGS`: in its own namespaces, its pid there 1.
fn contained(args: &[&str], program: &str) -> Target {
    let mut command = std::process::Command::new("unshare");
    command.args(args).arg(program);
    let mut target = Target::start_with(&mut command);
    assert_eq!(target.pid, 1, "its own pid namespace");
    target.pid = child_of(target.child.id());
    target
}

const NAMESPACES: [&str; 6] = ["--pid", "--mount", "--net", "--ipc", "--fork", "--mount-proc"];

#[test]
fn a_process_in_its_own_pid_mount_net_and_ipc_namespaces_is_attached_from_outside() {
    need_ptrace!();
    let lib = late_lib();
    let prog = late();
    let with_user: Vec<&str> = [&["--user", "--map-root-user"][..], &NAMESPACES].concat();
    for args in [NAMESPACES.to_vec(), with_user] {
        if let Err(why) = unshare_permitted(&args) {
            println!("SKIPPED: {why}");
            continue;
        }
        let mut target = contained(&args, path(&prog));
        let session = counting(target.pid, ",libattach_dl:lib_func");
        target.send(&format!("dlopen {} 100", lib.display()));
        assert_eq!(target.out.expect("lib_func "), "lib_func 100 times = 34950");
        target.send("call 3");
        target.out.expect("called 3");
        let (status, lines) = session.end(libc::SIGINT);
        assert_eq!(status.code(), Some(0), "{args:?}: {lines:?}");
        assert_eq!(
            rows(&lines),
            vec![row("gated", 3), row("tiny", 3), row("libattach_dl:lib_func", 100)],
            "{args:?}: {lines:?}"
        );
        let (status, rest) = target.finish();
        assert_eq!(status.code(), Some(0), "{args:?}: {rest:?}");
    }
}

/// Copies `file` into `root` at the same path, unless it is there (a file the process maps
/// must not be rewritten under it).
fn copy_in(root: &std::path::Path, file: &std::path::Path) {
    let to = root.join(file.strip_prefix("/").unwrap());
    if to.exists() {
        return;
    }
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    copy_program(file, &to);
}

/// The libraries `ldd` says `file` needs.
fn needed(file: &std::path::Path) -> Vec<PathBuf> {
    let out = std::process::Command::new("ldd").arg(file).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')).map(PathBuf::from))
        .collect()
}

#[test]
fn a_process_with_a_root_of_its_own_is_attached_where_the_libraries_are_there_and_refused_where_not() {
    need_ptrace!();
    let args: Vec<&str> = NAMESPACES.to_vec();
    if let Err(why) = unshare_permitted(&args) {
        println!("SKIPPED: {why}");
        return;
    }
    // A root of its own, as a container image has: the fixture, and what it and the runtime
    // need (the runtime itself is loaded from a memory file, and needs no file there).
    let root = tempfile("croot");
    let prog = late();
    let mut files = vec![prog.clone()];
    files.extend(needed(&prog));
    files.extend(needed(&artefact("libuprobe.so")));
    for file in &files {
        copy_in(&root, file);
    }
    std::fs::create_dir_all(root.join("proc")).unwrap();
    let root_arg = format!("--root={}", root.display());
    let args: Vec<&str> = [&args[..], &[root_arg.as_str()]].concat();
    let mut target = contained(&args, path(&prog));
    let count = libcount();
    let probes = ["--handlers", path(&count), "--param", "probes=gated,tiny"];
    // Not there: refused, the process untouched.
    let (status, err) = attach_once(target.pid, &probes);
    assert_eq!(status.code(), Some(2), "{err}");
    assert_eq!(
        err,
        format!(
            "uprobe-run: process {} runs in a mount namespace with a root of its own ({}): {} is not there; make it \
             reachable at the same path inside (a bind mount, or a copy)\n",
            target.pid,
            root.display(),
            count.display()
        )
    );
    assert!(!target.maps().iter().any(|m| m.contains("uprobe")), "nothing loaded");
    // A copy at the same path: attached.
    copy_in(&root, &count);
    for file in needed(&count) {
        copy_in(&root, &file);
    }
    let session = Session::start(target.pid, &probes);
    target.send("call 4");
    target.out.expect("called 4");
    let (status, lines) = session.end(libc::SIGINT);
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(rows(&lines), vec![row("gated", 4), row("tiny", 4)], "{lines:?}");
    let (status, rest) = target.finish();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    let _ = std::fs::remove_dir_all(&root);
}
