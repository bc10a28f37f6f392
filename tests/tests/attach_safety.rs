//! Attaching must never harm the target: whatever becomes of uprobe-run (killed at any
//! instant, interrupted at any instant), whatever another local user does (a library planted
//! where uprobe-run once looked, a socket bound or connected to first), and wherever the
//! process lives (a PID namespace), the process runs on with its output and exit status
//! intact, no thread is left stopped, and it can be attached to again.
//!
//! Every test needs ptrace: where it is not permitted, the test says `SKIPPED` and returns.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uprobe_tests::*;

const WAIT: Duration = Duration::from_secs(30);

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn kill(pid: i32, signal: i32) {
    // SAFETY: kill(2) with plain integers.
    unsafe { libc::kill(pid, signal) };
}

/// Lines of a stream, read by a thread as they come.
struct Lines {
    rx: Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn of(stream: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { rx, seen: Vec::new() }
    }

    /// Waits for a line starting with `prefix` (None: the stream ended or WAIT passed).
    fn wait_for(&mut self, prefix: &str) -> Option<String> {
        if let Some(line) = self.seen.iter().find(|l| l.starts_with(prefix)) {
            return Some(line.clone());
        }
        let deadline = Instant::now() + WAIT;
        while let Ok(line) = self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            self.seen.push(line.clone());
            if line.starts_with(prefix) {
                return Some(line);
            }
        }
        None
    }

    fn rest(&mut self) -> &[String] {
        while let Ok(line) = self.rx.recv_timeout(WAIT) {
            self.seen.push(line);
        }
        &self.seen
    }
}

/// `spin_fp`: threads that compute in their own code and check every result, until SIGUSR1.
fn spin_fp() -> PathBuf {
    fixture("spin_fp", &["-O2", "-g", "-pthread", "-Wall", "-Wextra"])
}

/// A running fixture that prints `ready PID` first.
struct Target {
    child: Child,
    out: Lines,
    pid: i32,
}

impl Target {
    fn start(command: &mut Command) -> Target {
        let mut child = command.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().expect("start the target");
        let mut out = Lines::of(child.stdout.take().unwrap());
        let ready = out.wait_for("ready ").expect("the target's ready line");
        let pid = ready["ready ".len()..].trim().parse().unwrap();
        Target { child, out, pid }
    }

    fn spinning() -> Target {
        Target::start(Command::new(spin_fp()).arg("4"))
    }

    /// Threads of the process stopped (state `t` or `T`), and its tracer.
    fn stopped_threads(&self) -> (Vec<String>, String) {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid)).unwrap();
        let mut stopped = Vec::new();
        for task in tasks.filter_map(Result::ok) {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            let state = stat.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next()).unwrap_or('?');
            if state == 't' || state == 'T' {
                stopped.push(task.file_name().to_string_lossy().into_owned());
            }
        }
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:")).unwrap_or("?").trim().to_owned();
        (stopped, tracer)
    }

    /// Asserts that no thread is stopped or traced, within a few seconds (a tracer killed a
    /// moment ago may still be on its way out).
    fn assert_running(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (stopped, tracer) = self.stopped_threads();
            if stopped.is_empty() && tracer == "0" {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: threads {stopped:?} stopped, tracer {tracer}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends a `spin_fp` (SIGUSR1) and checks its output and exit status.
    fn finish_spinning(mut self, what: &str) {
        kill(self.pid, libc::SIGUSR1);
        let status = self.child.wait().unwrap();
        let lines = self.out.rest().to_vec();
        assert_eq!(status.code(), Some(0), "{what}: the target's status {status:?}, output {lines:?}");
        let last = lines.iter().find(|l| l.starts_with("spin: ")).unwrap_or_else(|| panic!("{what}: {lines:?}"));
        assert!(last.ends_with(" rounds, 0 wrong"), "{what}: {last}");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn attach_command(uprobe_run: &Path, pid: i32, args: &[&str]) -> Command {
    let mut command = Command::new(uprobe_run);
    command.args(int3_only().then_some("--no-optimize")).arg("-v").arg("--pid").arg(pid.to_string()).args(args);
    command.env_remove("UPROBE_LIB");
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    command
}

/// A session of `attach_hits` on `pid`: attached, a hit seen, ended by SIGINT with status 0
/// and its count line. Retries while an earlier session's agent is still there (one whose
/// uprobe-run was killed ends by itself after 5 s).
fn full_session(uprobe_run: &Path, pid: i32, what: &str) {
    let handler = test_handler("attach_hits");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut child = attach_command(uprobe_run, pid, &["--handlers", handler.to_str().unwrap()]).spawn().unwrap();
        let mut err = Lines::of(child.stderr.take().unwrap());
        if err.wait_for("work is hit").is_none() {
            // Ended by itself (a refusal), or stuck: ended here.
            let _ = child.kill();
            let status = child.wait().unwrap();
            let busy = err.seen.iter().any(|l| l.contains("already has an attach session"));
            assert!(busy && Instant::now() < deadline, "{what}: the attach after failed ({status:?}): {:?}", err.seen);
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        kill(child.id() as i32, libc::SIGINT);
        let status = child.wait().unwrap();
        let lines = err.rest();
        assert_eq!(status.code(), Some(0), "{what}: {lines:?}");
        assert!(lines.iter().any(|l| l.starts_with("tick: ") && l.ends_with(" hits")), "{what}: {lines:?}");
        return;
    }
}

/// How long an attach of `attach_hits` to a fresh spin_fp takes here (the sweeps cover it).
fn attach_time(uprobe_run: &Path) -> Duration {
    let target = Target::spinning();
    let handler = test_handler("attach_hits");
    let started = Instant::now();
    let mut child = attach_command(uprobe_run, target.pid, &["--handlers", handler.to_str().unwrap()]).spawn().unwrap();
    let mut err = Lines::of(child.stderr.take().unwrap());
    err.wait_for("uprobe-run: attached to process").expect("the first attach");
    let took = started.elapsed();
    kill(child.id() as i32, libc::SIGINT);
    assert_eq!(child.wait().unwrap().code(), Some(0));
    target.finish_spinning("the timing run");
    took
}

#[test]
fn killing_uprobe_run_at_any_point_of_the_attach_leaves_the_target_running() {
    need_ptrace!();
    let uprobe_run = uprobe_run();
    let handler = test_handler("attach_hits");
    let span = attach_time(&uprobe_run).mul_f64(1.5);
    let runs = 50;
    for run in 0..runs {
        let what = format!("run {run} (SIGKILL after {:?})", span.mul_f64(run as f64 / runs as f64));
        let target = Target::spinning();
        let mut child =
            attach_command(&uprobe_run, target.pid, &["--handlers", handler.to_str().unwrap()]).spawn().unwrap();
        std::thread::sleep(span.mul_f64(run as f64 / runs as f64));
        let _ = child.kill();
        let _ = child.wait();
        target.assert_running(&what);
        if run % 10 == 9 {
            full_session(&uprobe_run, target.pid, &what);
        }
        target.finish_spinning(&what);
    }
}

#[test]
fn ctrl_c_at_any_point_of_the_attach_ends_it_cleanly_and_a_next_attach_works() {
    need_ptrace!();
    let uprobe_run = uprobe_run();
    let handler = test_handler("attach_hits");
    let span = attach_time(&uprobe_run).mul_f64(1.5);
    let runs = 30;
    let mut ends = [0usize; 3];
    for run in 0..runs {
        let delay = span.mul_f64(run as f64 / runs as f64);
        let what = format!("run {run} (SIGINT after {delay:?})");
        let target = Target::spinning();
        let mut child =
            attach_command(&uprobe_run, target.pid, &["--handlers", handler.to_str().unwrap()]).spawn().unwrap();
        let mut err = Lines::of(child.stderr.take().unwrap());
        std::thread::sleep(delay);
        kill(child.id() as i32, libc::SIGINT);
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > Duration::from_secs(15) {
                let _ = child.kill();
                panic!("{what}: uprobe-run did not end within 15 s of SIGINT: {:?}", err.rest());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let lines = err.rest().to_vec();
        match status.code() {
            // Detached: the handler's last line came.
            Some(0) => {
                assert!(lines.iter().any(|l| l.starts_with("tick: ")), "{what}: {lines:?}");
                ends[0] += 1;
            }
            // Stopped before the agent ran: the process as before.
            Some(2) => {
                let end = "interrupted during the attach; the process runs on as before";
                assert!(lines.last().is_some_and(|l| l.ends_with(end)), "{what}: {lines:?}");
                ends[1] += 1;
            }
            // Before it blocked the signal: it had not touched the process yet.
            None if status.signal() == Some(libc::SIGINT) && lines.is_empty() => ends[2] += 1,
            _ => panic!("{what}: status {status:?}: {lines:?}"),
        }
        target.assert_running(&what);
        full_session(&uprobe_run, target.pid, &what);
        target.finish_spinning(&what);
    }
    println!("{} detached, {} interrupted before the agent ran, {} ended before they began", ends[0], ends[1], ends[2]);
}

/// The pid, in this namespace, of the process that `unshare`'s child runs.
fn child_of(pid: i32) -> Option<i32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

#[test]
fn a_process_in_its_own_pid_namespace_is_attached_and_never_frozen() {
    need_ptrace!();
    let probe = Command::new("unshare").args(["-p", "-f", "--mount-proc", "true"]).output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            println!("SKIPPED: unshare -p is not permitted here: {}", String::from_utf8_lossy(&out.stderr).trim());
            return;
        }
        Err(e) => {
            println!("SKIPPED: unshare is not installed ({e})");
            return;
        }
    }
    let uprobe_run = uprobe_run();
    let mut unshare = Command::new("unshare")
        .args(["-p", "-f", "--mount-proc"])
        .arg(spin_fp())
        .arg("4")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = Lines::of(unshare.stdout.take().unwrap());
    let ready = out.wait_for("ready ").expect("ready");
    assert_eq!(ready, "ready 1", "its own namespace");
    let pid = child_of(unshare.id() as i32).expect("unshare's child");
    let target = Target { child: unshare, out, pid };
    for round in 0..3 {
        full_session(&uprobe_run, pid, &format!("round {round}"));
        target.assert_running(&format!("round {round}"));
    }
    target.finish_spinning("in its namespace");
}

/// The abstract unix socket names in /proc/net/unix that start with `prefix`.
fn abstract_names(prefix: &str) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|p| p.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

fn unix_socket(kind: i32) -> i32 {
    // SAFETY: socket takes plain integers.
    unsafe { libc::socket(libc::AF_UNIX, kind | libc::SOCK_CLOEXEC, 0) }
}

fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, &b) in name.as_bytes().iter().take(100).enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len().min(100);
    (addr, len as libc::socklen_t)
}

#[test]
fn another_process_can_neither_deny_nor_join_the_session() {
    need_ptrace!();
    let uprobe_run = uprobe_run();
    let handler = test_handler("attach_hits");
    let service = fixture("service", &["-O2", "-g", "-pthread"]);
    let mut child = Command::new(&service).arg("4").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = Lines::of(child.stdout.take().unwrap());
    let pid: i32 = out.wait_for("ready ").unwrap()["ready ".len()..].parse().unwrap();
    let target = Target { child, out, pid };

    // The names a session used to listen on, `uprobe-run/<its pid>/<target pid>`, bound first
    // for the next pids; and every `uprobe-run` socket for this target connected to, as long
    // as the session lasts.
    let next: i32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap().trim().parse().unwrap();
    let mut squatted = Vec::new();
    let mut names = Vec::new();
    for cli in next + 1..next + 200 {
        let fd = unix_socket(libc::SOCK_SEQPACKET);
        let name = format!("uprobe-run/{cli}/{pid}");
        let (addr, len) = abstract_addr(&name);
        names.push(format!("@{name}"));
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len) } == 0 {
            // SAFETY: listen takes plain integers.
            unsafe { libc::listen(fd, 16) };
        }
        squatted.push(fd);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let intruder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut tried = 0usize;
            while !stop.load(Ordering::Relaxed) {
                // Only those of sessions on this target: other tests on this machine attach too.
                let ours = |n: &String| n.ends_with(&format!("/{pid}")) && !names.contains(n);
                for name in abstract_names("@uprobe-run").into_iter().filter(ours) {
                    let fd = unix_socket(libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK);
                    let (addr, len) = abstract_addr(&name[1..]);
                    // SAFETY: as above; the socket is closed right after.
                    unsafe {
                        libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len);
                        libc::close(fd);
                    }
                    tried += 1;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            tried
        })
    };

    let mut session = attach_command(&uprobe_run, pid, &["--handlers", handler.to_str().unwrap()]).spawn().unwrap();
    let mut err = Lines::of(session.stderr.take().unwrap());
    assert!(err.wait_for("work is hit").is_some(), "the session: {:?}", err.seen);
    std::io::Write::write_all(&mut stdin, b"tick 7\n").unwrap();
    let mut target = target;
    assert!(target.out.wait_for("ticked 7").is_some());
    kill(session.id() as i32, libc::SIGINT);
    let status = session.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    let sockets_seen = intruder.join().unwrap();
    let lines = err.rest().to_vec();
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert!(lines.contains(&"tick: 7 hits".to_owned()), "{lines:?}");
    assert_eq!(sockets_seen, 0, "the session had a socket others could connect to");
    for fd in squatted {
        // SAFETY: our own descriptors.
        unsafe { libc::close(fd) };
    }
    std::io::Write::write_all(&mut stdin, b"quit\n").unwrap();
    drop(stdin);
    let status: ExitStatus = target.child.wait().unwrap();
    let rest = target.out.rest().to_vec();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(rest.iter().any(|l| l.starts_with("workers: ") && l.ends_with(" calls, 0 wrong")), "{rest:?}");
}

/// A library whose constructor leaves a marker file: what a planted runtime would run.
fn planted_library(marker: &Path) -> PathBuf {
    let source = tempfile("planted").with_extension("c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {{ FILE *f = fopen(\"{}\", \"w\"); if (f) fclose(f); }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let lib = source.with_extension("so");
    let out = Command::new("gcc").args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(&source).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    lib
}

#[test]
fn a_runtime_planted_in_a_shared_directory_by_another_user_never_runs() {
    need_ptrace!();
    if euid() != 0 {
        println!("SKIPPED: planting a directory as another user needs root");
        return;
    }
    // An installed uprobe-run: the binary alone, carrying its runtime.
    let dir = tempfile("installed");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let installed = dir.join("uprobe-run");
    copy_program(&uprobe_run(), &installed);
    // Where it once wrote that runtime for a process of another user, or with HOME unset:
    // `$TMPDIR/uprobe-run-UID/uprobe-run/VERSION-HASH/libuprobe.so`. Its exact name: what a
    // launch with a private TMPDIR writes.
    let private_tmp = dir.join("private-tmp");
    std::fs::create_dir_all(&private_tmp).unwrap();
    let version = Command::new(&installed)
        .arg("--version")
        .env_remove("HOME")
        .env_remove("XDG_CACHE_HOME")
        .env("TMPDIR", &private_tmp)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&version.stdout).into_owned();
    let written = text.lines().find_map(|l| l.strip_prefix("runtime: ")).and_then(|l| l.split(" (").next()).unwrap();
    let leaf = Path::new(written).strip_prefix(private_tmp.join("uprobe-run-0")).unwrap().to_path_buf();

    // A shared sticky directory, where user nobody made that directory first, with the very
    // same runtime in it, then a library of its own swapped in and out.
    let shared = dir.join("shared-tmp");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let planted_dir = shared.join("uprobe-run-0").join(leaf.parent().unwrap());
    std::fs::create_dir_all(&planted_dir).unwrap();
    let mut chown = Command::new("chown");
    chown.args(["-R", "65534:65534"]).arg(shared.join("uprobe-run-0"));
    assert!(chown.status().unwrap().success());
    let marker = dir.join("planted-ran");
    let planted = planted_library(&marker);
    let genuine = planted_dir.join("genuine");
    std::fs::copy(written, &genuine).unwrap();
    let evil = planted_dir.join("evil");
    std::fs::copy(&planted, &evil).unwrap();
    let runtime_path = planted_dir.join("libuprobe.so");
    std::fs::copy(&genuine, &runtime_path).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, genuine, evil, runtime_path) = (stop.clone(), genuine.clone(), evil.clone(), runtime_path.clone());
        std::thread::spawn(move || {
            let (g, e) = (runtime_path.with_extension("g"), runtime_path.with_extension("e"));
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::copy(&genuine, &g);
                let _ = std::fs::rename(&g, &runtime_path);
                std::thread::sleep(Duration::from_micros(300));
                let _ = std::fs::copy(&evil, &e);
                let _ = std::fs::rename(&e, &runtime_path);
                std::thread::sleep(Duration::from_micros(300));
            }
        })
    };

    // A process of another user (nobody), attached to by root with HOME unset.
    let program = dir.join("spin_fp");
    copy_program(&spin_fp(), &program);
    let mut command = Command::new(&program);
    command.arg("4");
    // SAFETY: setgid/setuid in the child before exec are async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let target = Target::start(&mut command);
    let handler = dir.join("attach_hits.so");
    std::fs::copy(test_handler("attach_hits"), &handler).unwrap();
    for attempt in 0..5 {
        let mut session = attach_command(&installed, target.pid, &["--handlers", handler.to_str().unwrap()]);
        session.env_remove("HOME").env_remove("XDG_CACHE_HOME").env("TMPDIR", &shared);
        let mut session = session.spawn().unwrap();
        let mut err = Lines::of(session.stderr.take().unwrap());
        let hit = err.wait_for("work is hit");
        kill(session.id() as i32, libc::SIGINT);
        let status = session.wait().unwrap();
        let lines = err.rest().to_vec();
        assert!(!marker.exists(), "attempt {attempt}: the planted library ran in the process: {lines:?}");
        assert!(hit.is_some() && status.code() == Some(0), "attempt {attempt}: {status:?} {lines:?}");
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", target.pid)).unwrap();
        assert!(!maps.contains(shared.to_str().unwrap()), "attempt {attempt}: mapped from the shared directory");
    }
    // A launch with that TMPDIR refuses the directory rather than use it.
    let mut launch = Command::new(&installed);
    launch.args(["--handlers", handler.to_str().unwrap()]).arg("/bin/true");
    launch.env_remove("HOME").env_remove("XDG_CACHE_HOME").env("TMPDIR", &shared);
    let out = launch.output().unwrap();
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is not a private directory of this user"), "{err}");
    assert!(!marker.exists(), "the planted library ran in the launched program");
    target.finish_spinning("the process of nobody");
}

#[test]
fn a_process_that_exits_during_the_attach_is_said_to_have_exited() {
    need_ptrace!();
    let uprobe_run = uprobe_run();
    let handler = test_handler("attach_hits");
    for run in 0..20 {
        // Ends by itself within a few tens of milliseconds: somewhere in the attach.
        let ms = (5 + 5 * run).to_string();
        let mut child = Command::new(spin_fp()).args(["4", &ms]).stdout(Stdio::piped()).spawn().unwrap();
        let mut out = Lines::of(child.stdout.take().unwrap());
        let pid: i32 = out.wait_for("ready ").unwrap()["ready ".len()..].parse().unwrap();
        let result = attach_command(&uprobe_run, pid, &["--handlers", handler.to_str().unwrap()]).output().unwrap();
        let err = String::from_utf8_lossy(&result.stderr);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "run {run}: the target: {status:?} ({err})");
        let own: Vec<&str> = err.lines().filter(|l| l.starts_with("uprobe-run: ")).collect();
        let ended = format!("uprobe-run: process {pid} exited");
        let gone = format!("uprobe-run: process {pid}: no such process");
        let zombie = format!("uprobe-run: process {pid} is a zombie");
        let fine = own.iter().all(|l| {
            l.starts_with(&ended)
                || l.starts_with(&gone)
                || l.starts_with(&zombie)
                || l.starts_with("uprobe-run: probe at ")
                || l.starts_with("uprobe-run: handler ")
                || l.starts_with("uprobe-run: attached to ")
                || l.starts_with(&format!("uprobe-run: process {pid} ended without"))
        });
        assert!(fine, "run {run}: {err}");
    }
}
