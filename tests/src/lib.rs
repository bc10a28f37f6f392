//! Helpers for the integration tests: build the workspace and the C fixtures, run programs
//! under `uprobe-run`, and read what the handlers printed.
//!
//! Fixture programs live in `tests/fixtures`, test-only handler libraries in `tests/handlers`;
//! both are compiled with the system `gcc` at test time into `target/fixtures`.

pub mod attach;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, Once};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// Where `cargo build --release` puts the runtime, the CLI and the handler libraries.
pub fn release_dir() -> PathBuf {
    target_dir().join("release")
}

/// Builds the whole workspace in release mode once per test process.
pub fn ensure_built() {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--release", "--workspace", "--quiet"])
            .current_dir(workspace_root())
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build --release failed");
    });
}

pub fn uprobe_run() -> PathBuf {
    ensure_built();
    release_dir().join("uprobe-run")
}

/// A built artefact of the workspace (`libcount.so`, `uprobe_example.so`, ...): a C handler
/// library of `handlers/c` from where its build script compiled it (`c_handlers::LIB_DIR`),
/// anything else from `target/release`.
pub fn artefact(name: &str) -> PathBuf {
    ensure_built();
    if let Some(path) = name.strip_suffix(".so").and_then(c_handlers::library) {
        return path;
    }
    let path = release_dir().join(name);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

fn fixtures_out() -> PathBuf {
    let dir = target_dir().join("fixtures");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

static COMPILE: Mutex<()> = Mutex::new(());

/// Compiles `sources` (paths relative to `tests/`) with gcc into `target/fixtures/out`.
pub fn gcc(out: &str, sources: &[&str], flags: &[&str]) -> PathBuf {
    compile("gcc", out, sources, flags)
}

/// Compiles `sources` with `compiler` (gcc or g++) into `target/fixtures/out`, unless the
/// output is newer than every source.
pub fn compile(compiler: &str, out: &str, sources: &[&str], flags: &[&str]) -> PathBuf {
    let _one_at_a_time = COMPILE.lock().unwrap_or_else(|e| e.into_inner());
    let tests = workspace_root().join("tests");
    let dest = fixtures_out().join(out);
    let newest_source =
        sources.iter().filter_map(|s| std::fs::metadata(tests.join(s)).and_then(|m| m.modified()).ok()).max().unwrap();
    let fresh = std::fs::metadata(&dest).and_then(|m| m.modified()).is_ok_and(|t| t >= newest_source);
    if !fresh {
        let tmp = dest.with_extension(format!("tmp{}", std::process::id()));
        let output = Command::new(compiler)
            .args(sources.iter().map(|s| tests.join(s)))
            .args(flags)
            .arg("-I")
            .arg(workspace_root().join("runtime/include"))
            .arg("-o")
            .arg(&tmp)
            .output()
            .expect("run gcc");
        assert!(output.status.success(), "{compiler} {out} failed:\n{}", String::from_utf8_lossy(&output.stderr));
        std::fs::rename(&tmp, &dest).unwrap();
    }
    dest
}

/// A fixture program from `tests/fixtures/NAME.c`, built with `flags`.
pub fn fixture(name: &str, flags: &[&str]) -> PathBuf {
    gcc(name, &[&format!("fixtures/{name}.c")], flags)
}

/// The directory compiled fixtures are written to.
pub fn fixtures_dir() -> PathBuf {
    fixtures_out()
}

/// A test handler library from `tests/handlers/NAME.c`.
pub fn test_handler(name: &str) -> PathBuf {
    gcc(&format!("{name}.so"), &[&format!("handlers/{name}.c")], &["-shared", "-fPIC", "-O2", "-Wall", "-Werror"])
}

/// The signals whose default action the tests rely on: those they send or the fixtures
/// raise, and those a shell running the suite in the background (`nohup`, `&` in a script,
/// many CI runners) leaves ignored, or a caller blocked.
const DEFAULT_SIGNALS: [i32; 9] = [
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGPIPE,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGCHLD,
];

/// Makes the command's process start with the default action and unblocked for each of
/// `DEFAULT_SIGNALS`, whatever the test process inherited: a test that sends a signal, or
/// whose program raises one, then sees what it would see from an interactive shell.
pub fn default_signals(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal and sigprocmask are async-signal-safe and touch no memory of the parent;
    // the set lives on the child's stack.
    unsafe {
        command.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in DEFAULT_SIGNALS {
                libc::signal(sig, libc::SIG_DFL);
                libc::sigaddset(&mut set, sig);
            }
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        })
    }
}

/// One run of a program under uprobe-run.
#[derive(Clone, Debug)]
pub struct Run {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// What the runtime and the handlers wrote (`-o` file).
    pub output: String,
}

impl Run {
    /// The `NAME=VALUE` text of each record of trace event `event`, in order.
    pub fn records(&self, event: &str) -> Vec<String> {
        let tag = format!(" {event}: (");
        self.output
            .lines()
            .filter_map(|l| l.split_once(&tag))
            .map(|(_, rest)| rest.split_once(") ").map_or("", |(_, a)| a).to_string())
            .collect()
    }

    /// Output lines starting with `prefix`, prefix removed.
    pub fn lines_with(&self, prefix: &str) -> Vec<String> {
        self.output.lines().filter_map(|l| l.strip_prefix(prefix)).map(str::to_string).collect()
    }
}

/// Whether this test run keeps every probe on the int3 path: the suite runs twice, once as is
/// and once with `UPROBE_TEST_NO_OPTIMIZE=1`, which adds `--no-optimize` to every run.
pub fn int3_only() -> bool {
    std::env::var_os("UPROBE_TEST_NO_OPTIMIZE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Runs `uprobe-run ARGS` as is (no `-o`): its status and both streams.
pub fn uprobe_run_raw(args: &[&str]) -> Output {
    Command::new(uprobe_run()).args(args).output().expect("run uprobe-run")
}

/// Runs `uprobe-run ARGS` with `-o` pointing to a fresh file, and collects everything.
pub fn run_uprobe(args: &[&str]) -> Run {
    run_uprobe_env(args, &[])
}

/// The classic example (`uprobe_example.so`) on `prog` with its probe at `vaddr`, and `more`
/// arguments before the program.
pub fn run_example(prog: &Path, vaddr: u64, more: &[&str]) -> Run {
    let example = artefact("uprobe_example.so");
    let vaddr = format!("vaddr={vaddr:#x}");
    let mut args = vec!["--handlers", example.to_str().unwrap(), "--param", &vaddr];
    args.extend_from_slice(more);
    args.push(prog.to_str().unwrap());
    run_uprobe(&args)
}

/// Like [`run_uprobe`], with extra environment variables for uprobe-run and the program.
pub fn run_uprobe_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = tempfile("out");
    let output = default_signals(&mut Command::new(uprobe_run()))
        .args(int3_only().then_some("--no-optimize"))
        .arg("-o")
        .arg(&out)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run uprobe-run");
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    finish(output, text)
}

/// Runs a program directly, without the runtime.
pub fn run_plain(program: &Path, args: &[&str]) -> Output {
    default_signals(&mut Command::new(program)).args(args).stdin(Stdio::null()).output().expect("run program")
}

fn finish(output: Output, text: String) -> Run {
    Run {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        output: text,
    }
}

/// A fresh path under target/fixtures/tmp.
pub fn tempfile(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = fixtures_out().join("tmp");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)))
}

/// Copies the executable `from` to `to` by `cp`, so that this process never holds the copy
/// open for writing: a copy written here would lend its descriptor to every child another
/// test thread forks meanwhile, and running the copy would fail with ETXTBSY until that child
/// execs.
pub fn copy_program(from: &Path, to: &Path) {
    let status = Command::new("cp").arg("--preserve=mode").arg(from).arg(to).status().expect("run cp");
    assert!(status.success(), "cp {} {}", from.display(), to.display());
}

/// The link-time address of `symbol` in `program` (what `nm` shows).
pub fn nm_address(program: &Path, symbol: &str) -> u64 {
    let data = std::fs::read(program).unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    uprobe_contracts::elf::symbol(&data, symbol).unwrap_or_else(|e| panic!("{}: {e}", program.display())).vaddr
}

/// Instruction offsets of `symbol` in `program`, from `objdump -d`, with their mnemonics.
pub fn instructions(program: &Path, symbol: &str) -> Vec<(u64, String)> {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", &format!("--disassemble={symbol}")])
        .arg(program)
        .output()
        .expect("run objdump");
    let text = String::from_utf8_lossy(&out.stdout);
    let start = nm_address(program, symbol);
    text.lines()
        .filter_map(|l| {
            let (addr, rest) = l.trim_start().split_once(":\t")?;
            let addr = u64::from_str_radix(addr, 16).ok()?;
            Some((addr - start, rest.split_whitespace().next()?.to_string()))
        })
        .collect()
}

/// The parsed table the `count` handler prints at exit: (spec, hits) in order.
pub fn count_table(run: &Run) -> Vec<(String, u64)> {
    run.lines_with("count: ")
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] != "HITS").then(|| (f[0].to_string(), f[2].parse().unwrap()))
        })
        .collect()
}

/// A file listing the defined function symbols of the system library `module` (from
/// `nm -D`), one a line, and how many there are: the input of the `coverage` test handler.
pub fn function_list(module: &str) -> (PathBuf, usize) {
    let path = format!("/lib/x86_64-linux-gnu/{module}");
    let out = Command::new("nm").args(["-D", "--defined-only", &path]).output().expect("run nm");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && matches!(f[1], "T" | "t" | "i" | "W")).then(|| f[2].split('@').next().unwrap().to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    let list = tempfile("functions");
    std::fs::write(&list, names.join("\n")).unwrap();
    (list, names.len())
}

/// The runtime's `--stats` line of a run.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Stats {
    pub placement_ms: f64,
    pub batches: u64,
    pub points: u64,
    pub jumps: u64,
    pub syscalls: u64,
    pub maps_reads: u64,
    pub traps_in_runtime: u64,
}

/// Parses the `uprobe-run: stats: ...` line of a run made with `--stats`.
pub fn stats(run: &Run) -> Stats {
    let line =
        run.lines_with("uprobe-run: stats: ").pop().unwrap_or_else(|| panic!("no stats line in:\n{}", run.output));
    let number_after = |key: &str| -> f64 {
        let at = line.find(key).unwrap_or_else(|| panic!("no {key:?} in {line}")) + key.len();
        line[at..].trim_start().split(|c: char| !c.is_ascii_digit() && c != '.').next().unwrap().parse().unwrap()
    };
    Stats {
        placement_ms: number_after("placement "),
        batches: number_after("ms in ") as u64,
        points: number_after("batches, ") as u64,
        jumps: number_after("armed (") as u64,
        syscalls: number_after("syscalls ") as u64,
        maps_reads: number_after("maps reads ") as u64,
        traps_in_runtime: number_after("SIGTRAPs in the runtime ") as u64,
    }
}

/// The tracefs directory with a writable `uprobe_events` (kernel uprobes, the reference the
/// tests compare against), mounting it where it is not and the tests run as root; None, with
/// the reason, where the machine has none.
pub fn tracefs() -> Result<PathBuf, String> {
    let candidates = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];
    let usable = |d: &str| {
        let events = Path::new(d).join("uprobe_events");
        std::fs::OpenOptions::new().append(true).open(&events).is_ok().then(|| PathBuf::from(d))
    };
    if let Some(d) = candidates.iter().find_map(|d| usable(d)) {
        return Ok(d);
    }
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        let _ = Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]).output();
        if let Some(d) = usable("/sys/kernel/tracing") {
            return Ok(d);
        }
    }
    Err("no writable tracefs uprobe_events (needs root and a kernel with CONFIG_UPROBE_EVENTS)".into())
}

/// `run` with the kernel's `events` of tracefs `group` enabled, its result and the trace
/// they wrote, read from a trace instance of its own (other programs clearing the main
/// buffer cannot empty it).
pub fn kernel_run<T>(tracing: &Path, group: &str, events: &[&str], run: impl FnOnce() -> T) -> (T, String) {
    let instance = tracing.join("instances").join(format!("{group}{}", std::process::id()));
    let made = std::fs::create_dir(&instance).is_ok();
    let at = if made { instance.clone() } else { tracing.to_path_buf() };
    let enable = |e: &str, v: &str| std::fs::write(at.join("events").join(group).join(e).join("enable"), v);
    for e in events {
        enable(e, "1").unwrap();
    }
    let out = run();
    for e in events {
        let _ = enable(e, "0");
    }
    let trace = std::fs::read_to_string(at.join("trace")).unwrap_or_default();
    if made {
        let _ = std::fs::remove_dir(&instance);
    }
    (out, trace)
}

/// A fixture's dump of code it read from its own memory: the first line of `stdout`,
/// "ADDRESS HEX"; None where it says "int3" (no jump to read).
pub fn code_dump(stdout: &str) -> Option<(u64, Vec<u8>)> {
    let line = stdout.lines().next().unwrap_or_default();
    if line == "int3" {
        return None;
    }
    let (at, hex) = line.split_once(' ').unwrap_or_else(|| panic!("{line}"));
    let at = u64::from_str_radix(at.trim_start_matches("0x"), 16).unwrap();
    Some((at, (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()))
}

/// The C++ program `except` and its shared library `libexcept_lib.so` (exceptions thrown
/// across both), built: the program's path.
pub fn except_program() -> PathBuf {
    let dir = fixtures_dir();
    compile("g++", "libexcept_lib.so", &["fixtures/except_lib.cc"], &["-O2", "-g", "-fPIC", "-shared"]);
    compile(
        "g++",
        "except",
        &["fixtures/except.cc"],
        &["-O2", "-g", "-fno-inline", &format!("-L{}", dir.display()), "-lexcept_lib", "-Wl,-rpath,$ORIGIN"],
    )
}
