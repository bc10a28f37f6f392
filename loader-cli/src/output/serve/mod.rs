//! `--serve ADDR`: the aggregations served as Prometheus metrics at `ADDR/metrics` by
//! uprobe-run itself (the probed process opens no port). uprobe-run binds the address, starts
//! the program as its child with one end of a socket pair (the runtime's metrics feed,
//! `runtime/src/aggregate/feed.rs`), asks the runtime for its numbers at each scrape and
//! serves them; it ends when the program ends, with the program's ending, after serving the
//! last numbers for `--serve-linger` seconds.
//!
//! - [`metrics`]: the numbers as metric families and their exposition (pure);
//! - [`process`]: the program as a child: start, signals passed on, its ending;
//! - here: the address, the feed's client, the HTTP server.
//!
//! An attach session can feed the same client once it carries aggregations: what it needs
//! is a socket on which the runtime answers (the agent's channel) in place of the pair.

pub mod metrics;
mod process;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::FromRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::base::error::Error;
use crate::plan::{ServeAddr, ServeAt};

/// How long a scrape waits for the runtime's answer before serving the last one.
const ANSWER_WAIT: Duration = Duration::from_secs(2);
/// The largest answer taken from the feed (the probed process is not trusted).
const ANSWER_MAX: u64 = 256 << 20;
/// Scrapes served at once (each on a thread of its own).
const WORKERS: usize = 4;

/// Where to serve, bound before the program starts.
pub struct Endpoint {
    server: tiny_http::Server,
    /// The socket file made for a unix address, removed at the end.
    path: Option<PathBuf>,
}

/// Binds `addr`.
pub fn bind(addr: &ServeAddr) -> Result<Endpoint, Error> {
    let refused = |reason: String| Error::Serve { addr: addr.text.clone(), reason };
    // Before the server starts its threads (see `process::block_handled`).
    process::block_handled();
    let (server, path) = match &addr.kind {
        ServeAt::Unix(path) => {
            let listener = UnixListener::bind(path).map_err(|e| refused(e.to_string()))?;
            (tiny_http::Server::from_listener(listener, None), Some(path.clone()))
        }
        ServeAt::Tcp(sockaddr) => {
            let listener = TcpListener::bind(sockaddr).map_err(|e| refused(e.to_string()))?;
            (tiny_http::Server::from_listener(listener, None), None)
        }
    };
    Ok(Endpoint { server: server.map_err(|e| refused(e.to_string()))?, path })
}

/// The latest answer, encoded.
#[derive(Default)]
struct Latest {
    /// Answers taken so far.
    seq: u64,
    exposition: String,
    /// The feed is closed (the program ended or exec'd).
    gone: bool,
}

/// uprobe-run's end of the feed.
struct Feed {
    socket: UnixStream,
    latest: Mutex<Latest>,
    arrived: Condvar,
    /// One question on the wire at a time; scrapes that come meanwhile share its answer.
    asking: Mutex<()>,
}

impl Feed {
    /// Reads answers until the feed closes (a thread of its own).
    fn read_answers(&self, mut store: metrics::Store) {
        let mut socket = &self.socket;
        loop {
            let mut len = [0u8; 8];
            if socket.read_exact(&mut len).is_err() {
                break;
            }
            let len = u64::from_le_bytes(len);
            if len > ANSWER_MAX {
                eprintln!("uprobe-run: --serve: an answer of {len} bytes from the program: the feed is closed");
                break;
            }
            let mut text = vec![0u8; len as usize];
            if socket.read_exact(&mut text).is_err() {
                break;
            }
            let parsed = std::str::from_utf8(&text)
                .map_err(|e| e.to_string())
                .and_then(|t| store.update(t).map_err(|e| e.to_string()));
            match parsed {
                Ok(families) => {
                    let exposition = metrics::encode(&families.list);
                    let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
                    latest.seq += 1;
                    latest.exposition = exposition;
                    self.arrived.notify_all();
                }
                Err(e) => {
                    eprintln!("uprobe-run: --serve: an answer that cannot be read ({e}): the feed is closed");
                    break;
                }
            }
        }
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        latest.gone = true;
        self.arrived.notify_all();
    }

    /// The numbers now: an answer to a question asked after this call began, or the last
    /// one when the program does not answer in time (stopped, busy) or is gone.
    fn scrape(&self) -> String {
        let before = self.latest.lock().unwrap_or_else(|e| e.into_inner()).seq;
        let _asking = self.asking.lock().unwrap_or_else(|e| e.into_inner());
        let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        if latest.seq > before || latest.gone {
            return latest.exposition.clone();
        }
        let asked = latest.seq;
        drop(latest);
        if (&self.socket).write_all(b"?").is_err() {
            return self.latest.lock().unwrap_or_else(|e| e.into_inner()).exposition.clone();
        }
        let deadline = Instant::now() + ANSWER_WAIT;
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        while latest.seq == asked && !latest.gone {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            latest = self.arrived.wait_timeout(latest, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        latest.exposition.clone()
    }

    /// Waits (at most `wait`) for the feed to close: the program's last answer is then read.
    fn wait_gone(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        while !latest.gone {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            latest = self.arrived.wait_timeout(latest, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

fn serve_requests(server: Arc<tiny_http::Server>, feed: Arc<Feed>) {
    for request in server.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or("");
        let response = match (request.method(), path) {
            (tiny_http::Method::Get, "/metrics") => {
                let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], prometheus::TEXT_FORMAT.as_bytes());
                let mut r = tiny_http::Response::from_string(feed.scrape());
                if let Ok(h) = header {
                    r.add_header(h);
                }
                r.with_status_code(200)
            }
            (tiny_http::Method::Get, _) => {
                tiny_http::Response::from_string("not found: the metrics are at /metrics\n").with_status_code(404)
            }
            _ => tiny_http::Response::from_string("only GET\n").with_status_code(405),
        };
        // A scraper that went away: nothing to do.
        let _ = request.respond(response);
    }
}

/// The socket pair's descriptors: (uprobe-run's, the program's), for serving at `addr`.
pub fn socket_pair(addr: &ServeAddr) -> Result<(i32, i32), Error> {
    process::socket_pair().map_err(|e| Error::Serve { addr: addr.text.clone(), reason: format!("socketpair: {e}") })
}

/// Starts `command` (its specification names `program_end` as the feed), serves until it
/// ends and `linger` after, then ends as it ended.
pub fn run(
    endpoint: Endpoint,
    command: Command,
    ours: i32,
    program_end: i32,
    keys: usize,
    linger: Duration,
) -> Result<std::convert::Infallible, std::io::Error> {
    if let Some(path) = endpoint.path {
        let _ = process::SOCKET_FILE.set(path);
    }
    let start = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let socket = stream(ours);
    let _ = socket.set_write_timeout(Some(ANSWER_WAIT));
    let mut child = process::spawn(command, program_end).inspect_err(|_| {
        if let Some(path) = process::SOCKET_FILE.get() {
            let _ = std::fs::remove_file(path);
        }
    })?;
    let phase: process::Shared = Arc::new(Mutex::new(process::Phase::Running(child.id() as i32)));
    process::forward_signals(Arc::clone(&phase));
    let feed = Arc::new(Feed {
        socket,
        latest: Mutex::new(Latest::default()),
        arrived: Condvar::new(),
        asking: Mutex::new(()),
    });
    let reader = Arc::clone(&feed);
    let store = metrics::Store::new(keys, start);
    std::thread::spawn(move || reader.read_answers(store));
    let server = Arc::new(endpoint.server);
    for _ in 0..WORKERS {
        let (server, feed) = (Arc::clone(&server), Arc::clone(&feed));
        std::thread::spawn(move || serve_requests(server, feed));
    }
    let status = process::wait(&mut child, &phase)?;
    feed.wait_gone(Duration::from_secs(1));
    // SIGINT, SIGTERM (...) end the wait, or, come before the program's end, skip it (see
    // `process::forward_signals`).
    if !linger.is_zero() && !process::asked_to_end() {
        std::thread::sleep(linger);
    }
    process::end_as(status)
}

#[allow(unsafe_code)]
fn stream(fd: i32) -> UnixStream {
    // SAFETY: `fd` is uprobe-run's end of a socket pair it made, owned by nothing else.
    unsafe { UnixStream::from_raw_fd(fd) }
}
