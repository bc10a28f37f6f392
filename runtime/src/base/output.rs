//! The run's output: stderr as it was at start-up, or the `-o` file; while attach sessions
//! run, their own descriptors too (see `route`).
//!
//! Signal-safe: whole lines are written with one `write(2)` each from a per-thread line
//! buffer, so lines of different threads and processes never interleave mid-line.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::base::{route, socket, sys};

static FD: AtomicI32 = AtomicI32::new(2);
/// The output is a socket (an attach session's): written with `send`, which raises no
/// SIGPIPE in the program when the other end is gone.
static SOCKET: AtomicBool = AtomicBool::new(false);
/// No per-thread line buffer (a runtime loaded into a running process, whose thread-local
/// storage cannot be reached from the hit paths): each call writes what it is given.
static UNBUFFERED: AtomicBool = AtomicBool::new(false);
const LINE_MAX: usize = 4096;
/// The lowest descriptor number the runtime's output takes, out of the way of programs that
/// expect the next open() to return a small number.
const FD_FLOOR: i32 = 100;

struct LineBuf {
    bytes: [u8; LINE_MAX],
    len: usize,
}

thread_local! {
    static PENDING: RefCell<LineBuf> = const { RefCell::new(LineBuf { bytes: [0; LINE_MAX], len: 0 }) };
}

/// The first error a write of the output met (an errno), 0 while none did.
static FAILED: AtomicI32 = AtomicI32::new(0);
/// Event records, reports and lines that were not written because the output failed.
static LOST_RECORDS: AtomicU64 = AtomicU64::new(0);
static LOST_REPORTS: AtomicU64 = AtomicU64::new(0);
static LOST_LINES: AtomicU64 = AtomicU64::new(0);
/// The output as the user named it, for the message (set up once at start-up).
static NAME: OnceLock<String> = OnceLock::new();

/// What a failed write loses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lost<'a> {
    /// Formatted event records, each ending at its offset of the bytes, in order: those not
    /// wholly written are lost (what follows the last record, such as end lines, is not one).
    Records(&'a [usize]),
    /// An aggregation report.
    Report,
    /// A line of a handler or of the runtime.
    Line,
}

/// Writes `bytes` to the output descriptor; a failure is remembered, with what it lost, for
/// [`report_failure`] (signal-safe).
pub fn write_counted(bytes: &[u8], lost: Lost) -> bool {
    let fd = FD.load(Ordering::Relaxed);
    let written = match SOCKET.load(Ordering::Relaxed) {
        true => send_all(fd, bytes),
        false => sys::write_all(fd, bytes),
    };
    match written {
        Ok(()) => true,
        Err((e, written)) => {
            note_failure(e, written, lost);
            false
        }
    }
}

/// The largest message `uprobe-run` reads from a session's output socket at once.
const SESSION_MESSAGE: usize = 60 * 1024;

/// Writes `bytes` to a session's output socket in messages `uprobe-run` reads whole, waiting
/// for room (only the runtime's own threads write records and reports: the drain and
/// interval threads, the agent); no SIGPIPE when `uprobe-run` is gone.
fn send_all(fd: i32, bytes: &[u8]) -> Result<(), (sys::Errno, usize)> {
    let mut done = 0;
    for chunk in bytes.chunks(SESSION_MESSAGE) {
        socket::send_nosignal(fd, chunk).map_err(|e| (e, done))?;
        done += chunk.len();
    }
    Ok(())
}

/// Whether the output is an attach session's socket.
pub fn in_session() -> bool {
    SOCKET.load(Ordering::Relaxed)
}

/// Sends `bytes` as a file of kind `kind` for `uprobe-run` to write (attach: see
/// `uprobe_contracts::wire::FILE_PART`), in messages it reads whole, each marked; at least
/// one, so that an empty file arrives too. Counted as a lost report if the socket fails.
pub fn send_file(kind: u8, bytes: &[u8]) {
    use uprobe_contracts::wire::FILE_PART;
    let fd = FD.load(Ordering::Relaxed);
    let mut message = Vec::with_capacity(SESSION_MESSAGE);
    for chunk in bytes.chunks(SESSION_MESSAGE - 2).chain(bytes.is_empty().then_some(&[][..])) {
        message.clear();
        message.extend_from_slice(&[FILE_PART, kind]);
        message.extend_from_slice(chunk);
        if let Err(e) = socket::send_nosignal(fd, &message) {
            note_failure(e, 0, Lost::Report);
            return;
        }
    }
}

/// Remembers a write of the output that failed after `written` bytes (signal-safe).
pub fn note_failure(errno: i32, written: usize, lost: Lost) {
    let _ = FAILED.compare_exchange(0, errno.max(1), Ordering::AcqRel, Ordering::Relaxed);
    match lost {
        Lost::Records(ends) => {
            let whole = ends.partition_point(|&end| end <= written);
            LOST_RECORDS.fetch_add((ends.len() - whole) as u64, Ordering::Relaxed)
        }
        Lost::Report => LOST_REPORTS.fetch_add(1, Ordering::Relaxed),
        Lost::Line => LOST_LINES.fetch_add(1, Ordering::Relaxed),
    };
}

/// In the child of `fork`: the parent's failed writes are the parent's to tell.
pub fn after_fork() {
    FAILED.store(0, Ordering::Relaxed);
    for lost in [&LOST_RECORDS, &LOST_REPORTS, &LOST_LINES] {
        lost.store(0, Ordering::Relaxed);
    }
}

/// Whether a write of the output failed in this process.
pub fn failed() -> bool {
    FAILED.load(Ordering::Acquire) != 0
}

/// The line that says the output failed and what was lost (None while nothing failed).
pub fn failure_line() -> Option<String> {
    let errno = FAILED.load(Ordering::Acquire);
    if errno == 0 {
        return None;
    }
    let mut lost = Vec::new();
    let count = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    for (n, one, many) in [
        (LOST_RECORDS.load(Ordering::Relaxed), "event record", "event records"),
        (LOST_REPORTS.load(Ordering::Relaxed), "report", "reports"),
        (LOST_LINES.load(Ordering::Relaxed), "line", "lines"),
    ] {
        if n > 0 {
            lost.push(count(n, one, many));
        }
    }
    let name = NAME.get().map_or("standard error", String::as_str);
    Some(format!(
        "uprobe-run: cannot write the output ({name}): {}: lost {}\n",
        errno_text(errno),
        if lost.is_empty() { "nothing".to_string() } else { lost.join(", ") }
    ))
}

/// Says once, on the process's standard error, that the output failed (end of the run).
pub fn report_failure() {
    static SAID: AtomicBool = AtomicBool::new(false);
    if let Some(line) = failure_line() {
        if !SAID.swap(true, Ordering::AcqRel) {
            let _ = sys::write_all(2, line.as_bytes());
        }
    }
}

/// An errno's text without Rust's ` (os error N)`.
fn errno_text(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    let suffix = format!(" (os error {errno})");
    text.strip_suffix(&suffix).unwrap_or(&text).to_string()
}

/// Opens the output: appends to `path` (`-`: standard output), or duplicates stderr.
pub fn init(path: Option<&str>) -> Result<(), String> {
    if let Some(p) = path {
        let _ = NAME.set(if p == "-" { "standard output".to_string() } else { p.to_string() });
    }
    let fd = match path {
        Some("-") => sys::dup_at_least(1, 0).unwrap_or(-1),
        Some(p) => {
            let c = std::ffi::CString::new(p).map_err(|_| format!("{p}: bad path"))?;
            sys::open_append(&c).map_err(|e| format!("{p}: {}", std::io::Error::from_raw_os_error(e)))?
        }
        None => sys::dup_at_least(2, 0).unwrap_or(-1),
    };
    match sys::dup_at_least(fd, FD_FLOOR) {
        Ok(high) => {
            sys::close(fd);
            FD.store(high, Ordering::Relaxed);
        }
        Err(_) if fd >= 0 => FD.store(fd, Ordering::Relaxed),
        Err(_) => {}
    }
    Ok(())
}

/// Uses `fd` (already open, close-on-exec, out of the program's way) as the output.
pub fn set_fd(fd: i32) {
    FD.store(fd, Ordering::Relaxed);
}

/// Uses the socket `fd` (or nothing, with -1) as the output (attach).
pub fn set_socket(fd: i32) {
    SOCKET.store(true, Ordering::Relaxed);
    FD.store(fd, Ordering::Relaxed);
}

/// Writes every call's bytes at once, without a per-thread line buffer (attach).
pub fn set_unbuffered() {
    UNBUFFERED.store(true, Ordering::Relaxed);
}

/// The output's descriptor (signal-safe).
pub fn fd() -> i32 {
    FD.load(Ordering::Relaxed)
}

/// Moves the output to another descriptor number, out of the way of a `dup2` onto it.
pub fn move_fd() {
    if let Ok(new) = sys::dup_at_least(fd(), FD_FLOOR) {
        FD.store(new, Ordering::Relaxed);
    }
}

/// Writes to the descriptor routed for code at `caller`, or to the run's output.
fn write_out(caller: usize, bytes: &[u8]) {
    // Output that cannot be written is dropped (the program must go on), and counted.
    let _ = match route::fd_for(caller) {
        Some(fd) => send(fd, bytes),
        None if SOCKET.load(Ordering::Relaxed) => send(FD.load(Ordering::Relaxed), bytes),
        None => sys::write_all(FD.load(Ordering::Relaxed), bytes).map_err(|(e, n)| {
            note_failure(e, n, Lost::Line);
            e
        }),
    };
}

/// The thread that may wait for room on a session socket (the agent), or 0.
static WAITER: AtomicI32 = AtomicI32::new(0);
/// Messages dropped because a session socket was full (see [`send`]).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Lets thread `tid` (the agent: its lines are the session's own, and it runs no program
/// code) wait for room on a full session socket; 0: nobody.
pub fn set_waiter(tid: i32) {
    WAITER.store(tid, Ordering::Relaxed);
}

/// How many messages were dropped since the last call, and starts counting again.
pub fn take_dropped() -> u64 {
    DROPPED.swap(0, Ordering::Relaxed)
}

/// Sends one message on a session socket. A program thread never waits: `uprobe-run` may be
/// stopped (Ctrl-Z) or its output not read, and a handler printing on every hit would then
/// hold every probed thread. When the socket's buffer (1 MiB, set by `uprobe-run`) is full
/// the message is dropped and counted (signal-safe).
fn send(fd: i32, bytes: &[u8]) -> Result<(), sys::Errno> {
    loop {
        match socket::send_nowait(fd, bytes) {
            Err(libc::EAGAIN) if sys::gettid() == WAITER.load(Ordering::Relaxed) => {
                let mut fds = [libc::pollfd { fd, events: libc::POLLOUT, revents: 0 }];
                match socket::poll(&mut fds, -1) {
                    Ok(_) | Err(libc::EINTR) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(libc::EAGAIN) => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
                return Err(libc::EAGAIN);
            }
            other => return other.map(drop),
        }
    }
}

/// Appends `bytes` to this thread's line and writes every completed line (signal-safe).
pub fn emit(bytes: &[u8]) {
    emit_from(0, bytes);
}

/// [`emit`] for code at address `caller` (`uprobe_printf`'s caller): where a session routes
/// that code's output, it goes there (signal-safe).
pub fn emit_from(caller: usize, bytes: &[u8]) {
    let write_out = |bytes: &[u8]| write_out(caller, bytes);
    if UNBUFFERED.load(Ordering::Relaxed) {
        write_out(bytes);
        return;
    }
    PENDING.with(|cell| {
        let Ok(mut line) = cell.try_borrow_mut() else {
            // Re-entered on this thread (a signal interrupted an emit): write straight through.
            write_out(bytes);
            return;
        };
        for &b in bytes {
            if line.len == LINE_MAX {
                let len = line.len;
                write_out(&line.bytes[..len]);
                line.len = 0;
            }
            let len = line.len;
            line.bytes[len] = b;
            line.len += 1;
            if b == b'\n' {
                write_out(&line.bytes[..len + 1]);
                line.len = 0;
            }
        }
    });
}

/// Writes this thread's unfinished line, if any.
pub fn flush() {
    if UNBUFFERED.load(Ordering::Relaxed) {
        return;
    }
    let write_out = |bytes: &[u8]| write_out(0, bytes);
    PENDING.with(|cell| {
        if let Ok(mut line) = cell.try_borrow_mut() {
            let len = line.len;
            if len > 0 {
                write_out(&line.bytes[..len]);
                line.len = 0;
            }
        }
    });
}

/// A fixed-size line for the runtime's own messages (no allocation).
pub struct Line {
    bytes: [u8; 512],
    len: usize,
}

impl Line {
    pub fn new() -> Line {
        Line { bytes: [0; 512], len: 0 }
    }

    pub fn push(&mut self, s: &[u8]) {
        let n = s.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl Default for Line {
    fn default() -> Self {
        Line::new()
    }
}

impl core::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

/// How the runtime's own lines are written: as they are; as JSON objects (`--format json`:
/// every line of the output parses); or on stderr (`--format chrome`: the output is one JSON
/// document a line would break).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Messages {
    Plain = 0,
    Json = 1,
    Stderr = 2,
    /// An attach session's Chrome trace: each line a message of its own on the session's
    /// socket, marked with [`ASIDE`] for `uprobe-run`'s stderr.
    Aside = 3,
}

/// The first byte of a session's message that is a line for `uprobe-run`'s stderr.
pub const ASIDE: u8 = 1;

static MESSAGES: AtomicI32 = AtomicI32::new(Messages::Plain as i32);
/// A duplicate of the process's stderr, for [`Messages::Stderr`].
static STDERR: AtomicI32 = AtomicI32::new(2);

/// How the runtime's own lines are written from now on (start-up).
pub fn set_messages(how: Messages) {
    if how == Messages::Stderr {
        if let Ok(fd) = sys::dup_at_least(2, FD_FLOOR) {
            STDERR.store(fd, Ordering::Relaxed);
        }
    }
    MESSAGES.store(how as i32, Ordering::Relaxed);
}

/// Writes one of the runtime's own lines (`uprobe-run: ...\n`) as [`set_messages`] says
/// (signal-safe).
fn say(text: &[u8]) {
    match MESSAGES.load(Ordering::Relaxed) {
        1 => {
            let mut line = Line::new();
            line.push(b"{\"kind\":\"message\",\"text\":\"");
            let body = text.strip_suffix(b"\n").unwrap_or(text);
            // Room is kept for the closing.
            for &b in body.iter().take(400) {
                match b {
                    b'"' | b'\\' => line.push(&[b'\\', b]),
                    b if b < 0x20 => line.push(b"?"),
                    b => line.push(&[b]),
                }
            }
            line.push(b"\"}\n");
            emit(line.as_bytes());
        }
        2 => {
            let _ = sys::write_all(STDERR.load(Ordering::Relaxed), text);
        }
        3 => {
            let mut line = Line::new();
            line.push(&[ASIDE]);
            line.push(text);
            let _ = send(FD.load(Ordering::Relaxed), line.as_bytes());
        }
        _ => emit(text),
    }
}

/// Writes `uprobe-run: <message>` as one line (set-up time).
pub fn message(args: core::fmt::Arguments) {
    use core::fmt::Write;
    let mut line = Line::new();
    let _ = write!(line, "uprobe-run: {args}");
    line.push(b"\n");
    say(line.as_bytes());
}

/// Writes a fixed message followed by an address in hex (signal-safe).
pub fn message_fixed(text: &[u8], addr: usize) {
    let mut line = Line::new();
    line.push(text);
    let mut hex = [0u8; 18];
    hex[..2].copy_from_slice(b"0x");
    for i in 0..16 {
        hex[2 + i] = b"0123456789abcdef"[(addr >> (60 - 4 * i)) & 0xf];
    }
    line.push(&hex);
    line.push(b"\n");
    say(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_truncates_instead_of_overflowing() {
        let mut l = Line::new();
        l.push(&[b'a'; 600]);
        assert_eq!(l.as_bytes().len(), 512);
    }
}
