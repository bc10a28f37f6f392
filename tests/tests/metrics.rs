//! `--serve`: the aggregations served as Prometheus metrics by uprobe-run. A real Prometheus
//! server (Debian's `prometheus` package) scrapes a session every second while a gated
//! fixture holds its program alive; its query API returns exactly the fixture's counts and
//! bucket counts, string keys escaped. The exposition passes `promtool check metrics`.
//! Scrapes while threads come and go lose nothing; the program's ending is uprobe-run's; a
//! signal sent to uprobe-run reaches the program; each refusal is one line and exit 2
//! before the program starts. Loopback only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use uprobe_tests::{fixture, int3_only, tempfile, uprobe_run};

fn program() -> PathBuf {
    fixture("metrics", &["-O1", "-g", "-fno-inline", "-pthread", "-Wall", "-Wextra"])
}

/// The child's status, waited for at most 60 s (a hang fails the test instead of stalling it).
fn wait_for(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("uprobe-run did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `prometheus` and `promtool`, or why the test cannot run.
fn prometheus_tools() -> Result<(PathBuf, PathBuf), String> {
    let find = |name: &str| {
        std::env::var_os("PATH")
            .and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file()))
            .ok_or_else(|| format!("{name} is not installed (apt-get install prometheus)"))
    };
    Ok((find("prometheus")?, find("promtool")?))
}

/// A GET over HTTP/1.0: (status, body).
fn get(addr: &str, path: &str) -> std::io::Result<(u32, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    Ok((status, body))
}

fn url_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A uprobe-run --serve session on the gated fixture: stdin to release it, stdout lines.
struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    output: PathBuf,
}

impl Session {
    fn start(serve: &str, args: &[&str], mode: &[&str]) -> Session {
        let output = tempfile("metrics_out");
        let mut child = Command::new(uprobe_run())
            .args(int3_only().then_some("--no-optimize"))
            .arg("-o")
            .arg(&output)
            .args(["--serve", serve])
            .args(args)
            .arg(program())
            .args(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start uprobe-run");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stdin = child.stdin.take();
        Session { child, stdin, lines, output }
    }

    fn tell(&mut self, word: &str) {
        writeln!(self.stdin.as_mut().unwrap(), "{word}").unwrap();
    }

    fn wait_done(&self) {
        let line = self.lines.recv_timeout(Duration::from_secs(60)).expect("the fixture said done");
        assert_eq!(line, "done");
    }

    /// Releases the program from its last wait and returns uprobe-run's status.
    fn end(mut self) -> std::process::ExitStatus {
        self.tell("end");
        drop(self.stdin.take());
        let status = wait_for(&mut self.child);
        let _ = std::fs::remove_file(&self.output);
        status
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Prometheus server on a free loopback port, scraping `target` every second.
struct Prometheus {
    child: Child,
    addr: String,
    dir: PathBuf,
}

impl Prometheus {
    fn start(binary: &Path, target: &str) -> Prometheus {
        let dir = tempfile("prometheus");
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: uprobe\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(get(&p.addr, "/-/ready"), Ok((200, _))) {
            assert!(Instant::now() < deadline, "prometheus did not become ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    /// The value of an instant query that names one series, if Prometheus has it.
    fn value(&self, query: &str) -> Option<String> {
        let (_, body) = get(&self.addr, &format!("/api/v1/query?query={}", url_encoded(query))).ok()?;
        let v: Value = serde_json::from_str(&body).ok()?;
        let result = v["data"]["result"].as_array()?;
        assert!(result.len() <= 1, "{query}: more than one series: {body}");
        Some(result.first()?["value"][1].as_str()?.to_string())
    }

    /// Waits until every query has its expected value (the last scrape after the work), or
    /// fails naming what Prometheus has instead.
    fn expect(&self, expected: &[(&str, &str)]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let seen: Vec<Option<String>> = expected.iter().map(|(q, _)| self.value(q)).collect();
            if seen.iter().zip(expected).all(|(s, (_, want))| s.as_deref() == Some(*want)) {
                return;
            }
            if Instant::now() > deadline {
                let report: Vec<String> =
                    expected.iter().zip(&seen).map(|((q, want), s)| format!("{q}: want {want}, have {s:?}")).collect();
                panic!("Prometheus does not have the numbers:\n{}", report.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn definitions(program: &Path) -> Vec<String> {
    let p = program.display();
    vec![
        "-e".into(),
        format!("p:uprobes/sized {p}:sized key=%di:s64"),
        "-e".into(),
        format!("p:uprobes/named {p}:named key=+0(%di):string"),
        "-e".into(),
        format!("p:uprobes/value {p}:value v=%di:s64"),
        "--count".into(),
        "--by".into(),
        "key".into(),
        "--lhist".into(),
        "value.v,0,100,25".into(),
        "--hist".into(),
        "sized.key".into(),
        "--latency".into(),
        format!("{p}:nap"),
    ]
}

#[test]
fn prometheus_scrapes_exact_counts_and_buckets() {
    let (prometheus, promtool) = match prometheus_tools() {
        Ok(tools) => tools,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let addr = format!("127.0.0.1:{}", free_port());
    let defs = definitions(&program());
    let args: Vec<&str> = defs.iter().map(String::as_str).collect();
    let mut session = Session::start(&addr, &args, &["gated"]);
    let server = Prometheus::start(&prometheus, &addr);
    // Scraped before the work: the series exist, at zero.
    server.expect(&[("uprobe_hits_total{event=\"value\"}", "0"), ("uprobe_program_running", "1")]);
    session.tell("go");
    session.wait_done();
    let mut expected: Vec<(String, String)> =
        (1..=20).map(|v| (format!("uprobe_hits_total{{event=\"sized\",key=\"{v}\"}}"), v.to_string())).collect();
    let more = [
        // The string keys, escaped on the way and unescaped by PromQL.
        (r#"uprobe_hits_total{event="named",key="quote\"d"}"#, "1"),
        (r#"uprobe_hits_total{event="named",key="back\\slash"}"#, "2"),
        (r#"uprobe_hits_total{event="named",key="new\nline"}"#, "3"),
        (r#"uprobe_hits_total{event="value",group="uprobes"}"#, "100"),
        (r#"uprobe_hits_cut_total{event="sized"}"#, "0"),
        (r#"uprobe_hits_dropped_total{event="sized"}"#, "0"),
        // --lhist value.v,0,100,25 over 0..99: 25 a bucket.
        (r#"uprobe_arg_value_bucket{event="value",le="24"}"#, "25"),
        (r#"uprobe_arg_value_bucket{event="value",le="49"}"#, "50"),
        (r#"uprobe_arg_value_bucket{event="value",le="99"}"#, "100"),
        (r#"uprobe_arg_value_bucket{event="value",le="+Inf"}"#, "100"),
        (r#"uprobe_arg_value_count{event="value"}"#, "100"),
        (r#"uprobe_arg_value_sum{event="value"}"#, "4950"),
        // --hist sized.key: v called v times for v = 1..20, log2 buckets [1,2), [2,4), ...
        (r#"uprobe_arg_value_bucket{event="sized",le="1"}"#, "1"),
        (r#"uprobe_arg_value_bucket{event="sized",le="3"}"#, "6"),
        (r#"uprobe_arg_value_bucket{event="sized",le="7"}"#, "28"),
        (r#"uprobe_arg_value_bucket{event="sized",le="15"}"#, "120"),
        (r#"uprobe_arg_value_bucket{event="sized",le="31"}"#, "210"),
        // 1*1 + 2*2 + ... + 20*20
        (r#"uprobe_arg_value_sum{event="sized"}"#, "2870"),
        (r#"uprobe_latency_seconds_count{function="nap"}"#, "5"),
        (r#"uprobe_latency_seconds_bucket{function="nap",le="+Inf"}"#, "5"),
        (r#"uprobe_events_placed"#, "4"),
    ];
    expected.extend(more.iter().map(|(q, v)| (q.to_string(), v.to_string())));
    let pairs: Vec<(&str, &str)> = expected.iter().map(|(q, v)| (q.as_str(), v.as_str())).collect();
    server.expect(&pairs);
    // Each nap sleeps 200 us or more: 1 ms at least in all.
    assert_eq!(server.value(r#"uprobe_latency_seconds_sum{function="nap"} >= bool 0.001"#).as_deref(), Some("1"));

    let (status, exposition) = get(&addr, "/metrics").unwrap();
    assert_eq!(status, 200);
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check.stdin.take().unwrap().write_all(exposition.as_bytes()).unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}\n{exposition}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    assert_eq!(get(&addr, "/other").unwrap().0, 404);
    // The program's own exit status.
    assert_eq!(session.end().code(), Some(3));
}

/// The counter of `tick` in an exposition.
fn ticks(exposition: &str) -> Option<u64> {
    exposition
        .lines()
        .find(|l| l.starts_with("uprobe_hits_total{") && l.contains("event=\"tick\""))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

#[test]
fn scrapes_while_threads_come_and_go_lose_nothing() {
    let addr = format!("127.0.0.1:{}", free_port());
    let p = program();
    let def = format!("p:uprobes/tick {}:tick", p.display());
    let (threads, calls) = (200u64, 2000u64);
    let mut session =
        Session::start(&addr, &["-e", &def, "--count"], &["churn", &threads.to_string(), &calls.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&addr, "/metrics").ok().and_then(|(_, b)| ticks(&b)).is_none() {
        assert!(Instant::now() < deadline, "no tick counter served");
        std::thread::sleep(Duration::from_millis(20));
    }
    session.tell("go");
    // Four scrapers at once, as fast as answers come, while the threads start and exit:
    // counts only grow, as each scraper sees them.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scrapers: Vec<_> = (0..4)
        .map(|_| {
            let (addr, done) = (addr.clone(), done.clone());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, body) = get(&addr, "/metrics").unwrap();
                    assert_eq!(status, 200);
                    seen.push(ticks(&body).expect("the tick counter"));
                }
                seen
            })
        })
        .collect();
    session.wait_done();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut scrapes = 0;
    for scraper in scrapers {
        let seen = scraper.join().unwrap();
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "a counter went down: {seen:?}");
        scrapes += seen.len();
    }
    let last = ticks(&get(&addr, "/metrics").unwrap().1);
    assert_eq!(last, Some(threads * calls), "after {scrapes} scrapes during the churn");
    assert!(scrapes > 4);
    assert_eq!(session.end().code(), Some(0));
}

#[test]
fn a_signal_to_uprobe_run_reaches_the_program_and_its_ending_is_kept() {
    let addr = format!("127.0.0.1:{}", free_port());
    let def = format!("p:uprobes/tick {}:tick", program().display());
    let session = Session::start(&addr, &["-e", &def, "--count"], &["churn", "1", "1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&addr, "/metrics").ok().and_then(|(_, b)| ticks(&b)).is_none() {
        assert!(Instant::now() < deadline, "no tick counter served");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The program's pid, as the metrics label it.
    let body = get(&addr, "/metrics").unwrap().1;
    let line = body.lines().find(|l| l.starts_with("uprobe_program_running{pid=\"")).unwrap();
    let pid: i32 = line["uprobe_program_running{pid=\"".len()..].split('"').next().unwrap().parse().unwrap();
    assert_ne!(pid, session.child.id() as i32);
    // SAFETY: kill with a child's pid and a signal number.
    unsafe { libc::kill(session.child.id() as i32, libc::SIGTERM) };
    let mut session = session;
    let status = wait_for(&mut session.child);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    // The program got it (and was reaped by uprobe-run): it is gone.
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the program {pid} lives on");
}

/// A GET /metrics on a unix socket.
fn get_unix(path: &Path) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn a_unix_socket_path_serves_the_last_numbers_while_lingering() {
    let path = tempfile("metrics_sock");
    let def = format!("p:uprobes/tick {}:tick", program().display());
    let args = ["-e", &def, "--count", "--serve-linger", "600"];
    let mut session = Session::start(path.to_str().unwrap(), &args, &["churn", "3", "5"]);
    session.tell("go");
    session.wait_done();
    session.tell("end");
    // The program ended: its last numbers stay served (it answers no more).
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let text = get_unix(&path);
        if text.contains("uprobe_program_running{") && text.contains("} 0\n") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(body.lines().any(|l| l.starts_with("uprobe_program_running{") && l.ends_with(" 0")), "{body}");
    assert_eq!(ticks(&body), Some(15), "{body}");
    assert_eq!(ticks(&get_unix(&path)), Some(15));
    assert!(session.child.try_wait().unwrap().is_none(), "uprobe-run did not linger");
    // SIGTERM ends the lingering at once, with the program's status.
    // SAFETY: kill with a child's pid and a signal number.
    unsafe { libc::kill(session.child.id() as i32, libc::SIGTERM) };
    assert_eq!(wait_for(&mut session.child).code(), Some(0));
    assert!(!path.exists(), "the socket file is left behind");
}

#[test]
fn refusals_are_one_line_before_the_program_starts() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let p = program();
    let def = format!("p:uprobes/tick {}:tick", p.display());
    let prog = p.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--serve", &taken, "-e", &def, "--count", prog, "gated"], "--serve 127.0.0.1:"),
        (vec!["--serve", "localhost", "-e", &def, "--count", prog, "gated"], "--serve localhost: not HOST:PORT"),
        (vec!["--serve", "127.0.0.1:1", "-e", &def, prog, "gated"], "--serve: serves aggregations"),
        (vec!["--serve", "127.0.0.1:1", "-e", &def, "--count", "--top", "2", prog, "gated"], "--top: not with --serve"),
        (vec!["--serve-keys", "5", "-e", &def, "--count", prog, "gated"], "--serve-keys: "),
        (
            vec!["--serve", "/nonexistent-dir/m.sock", "-e", &def, "--count", prog, "gated"],
            "--serve /nonexistent-dir/m.sock: ",
        ),
    ];
    for (args, start) in cases {
        let out = Command::new(uprobe_run()).args(&args).stdin(Stdio::null()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with(&format!("uprobe-run: {start}")), "{args:?}: {stderr}");
        // The fixture, run, would have said "done" (stdin at its end releases it).
        assert!(out.stdout.is_empty(), "{args:?}: the program ran");
    }
}

#[test]
fn the_feed_survives_a_program_that_closes_every_descriptor() {
    // closefds closes 0..1023, then close_range and closefrom from 0, calls work() 3 times,
    // and exits 0 only if its next open() gets descriptor 0.
    let prog = fixture("closefds", &["-O2", "-g", "-fno-inline"]);
    let addr = format!("127.0.0.1:{}", free_port());
    let def = format!("p:uprobes/work {}:work", prog.display());
    let mut child = Command::new(uprobe_run())
        .args(int3_only().then_some("--no-optimize"))
        .args(["-o", "/dev/null", "--serve", &addr, "--serve-linger", "600", "-e", &def, "--count"])
        .arg(&prog)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = get(&addr, "/metrics").map(|r| r.1).unwrap_or_default();
        if body.lines().any(|l| l.starts_with("uprobe_program_running{") && l.ends_with(" 0"))
            || Instant::now() > deadline
        {
            break body;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let work = body.lines().find(|l| l.starts_with("uprobe_hits_total{") && l.contains("event=\"work\""));
    assert_eq!(work.and_then(|l| l.rsplit(' ').next()), Some("3"), "{body}");
    // SAFETY: kill with a child's pid and a signal number.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(wait_for(&mut child).code(), Some(0), "the program did not get descriptor 0 back");
}
