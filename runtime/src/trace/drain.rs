//! The drain thread: every few milliseconds it takes the records out of every thread's ring,
//! puts them in time order and writes them, formatted, to the run's output in large writes.
//! A record is held back until it is older than `MARGIN_NS`, so that a record a slower
//! thread is still writing cannot come out before one it precedes. At the end of the run
//! ([`finish`]) everything left is written, then the records dropped per event.
//!
//! The thread is the runtime's: it runs no code of the program (its signals are blocked, its
//! probe hits run no handler), it is not counted as a thread of the program when placement
//! decides whether jumps may be written, and it leaves the program's descriptors alone. A
//! forked child starts its own.
//!
//! Context: its own thread (normal context), and process exit for [`finish`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use crate::base::lock::Mutex;
use crate::base::{output, sys};
use crate::probe::{deferred, registry, world};
use crate::trace::buffers::{self, InUse};
use crate::trace::chrome::chrome_event;
use crate::trace::def::Kind;
use crate::trace::events;
use crate::trace::format::{self, json_string, Line, Symbols};
use crate::trace::{chain, clock};

/// How long the thread sleeps between passes.
const PERIOD_NS: u64 = 5_000_000;
/// How old a record must be before it is written (see the module doc).
const MARGIN_NS: u64 = 10_000_000;

/// How records are written: the run spec's `format`, kept in `FORMAT` as its number.
pub use crate::base::spec::Format;

static FORMAT: AtomicU8 = AtomicU8::new(0);
/// The stream (an attach session's is a stream of its own): a drain thread ends with its
/// stream.
static RUN: AtomicUsize = AtomicUsize::new(0);

/// One record taken out of a ring; its bytes are `at..at + len` of the state's arena.
struct Staged {
    /// The record's clock reading, and it in ns by the calibration of the current pass
    /// (all are converted again at each pass: a record held back from one pass and one
    /// taken in the next are ordered by one line, however early in the run the
    /// calibration still moves).
    clock: u64,
    ns: u64,
    seq: u64,
    tid: i32,
    pid: i32,
    ring: usize,
    at: usize,
    len: usize,
}

/// A call whose entry was recorded and whose return may be (Chrome slices).
struct Open {
    func: u64,
    ns: u64,
    name: String,
    args: String,
    /// The entry's stack (`sf`).
    sf: Option<usize>,
}

struct State {
    staged: Vec<Staged>,
    /// The staged records' bytes, one after the other (no allocation per record), and the
    /// arena and output buffer of the previous pass, kept for the next (their pages stay
    /// faulted in).
    arena: Vec<u8>,
    spare: Vec<u8>,
    out: Vec<u8>,
    seq: u64,
    /// Per ring: the claim generation seen, and the owner's name.
    comms: HashMap<usize, (u32, Vec<u8>)>,
    symbols: SymbolCache,
    /// Chrome: open calls per thread, and the threads named so far.
    open: HashMap<i32, Vec<Open>>,
    named: Vec<i32>,
    /// Chrome: the stacks' frames (`stackFrames`).
    frames: chain::Frames,
    first: bool,
    done: bool,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

impl State {
    /// An empty state; `first`: nothing of the stream is written yet.
    fn new(first: bool) -> State {
        State {
            staged: Vec::new(),
            arena: Vec::new(),
            spare: Vec::new(),
            out: Vec::new(),
            seq: 0,
            comms: HashMap::new(),
            symbols: SymbolCache(HashMap::new()),
            open: HashMap::new(),
            named: Vec::new(),
            frames: chain::Frames::default(),
            first,
            done: false,
        }
    }
}

struct SymbolCache(HashMap<u64, String>);

impl SymbolCache {
    /// `sym+0xoff` for `addr`, looked up once.
    fn name(&mut self, addr: u64) -> &str {
        self.0.entry(addr).or_insert_with(|| registry::symbolize(addr as usize).unwrap_or_else(|| format!("{addr:#x}")))
    }
}

impl Symbols for SymbolCache {
    fn symbolize(&mut self, addr: u64) -> String {
        self.name(addr).to_string()
    }
}

/// Starts the stream in `format` and its drain thread (start-up, after the events' probes
/// are placed).
pub fn start(format: Format) {
    FORMAT.store(format as u8, Ordering::Relaxed);
    RUN.fetch_add(1, Ordering::SeqCst);
    *STATE.lock() = Some(State::new(true));
    if format == Format::Chrome {
        write_out(b"{\"traceEvents\":[", &[]);
    }
    spawn();
}

fn format() -> Format {
    match FORMAT.load(Ordering::Relaxed) {
        1 => Format::Json,
        2 => Format::Chrome,
        _ => Format::Text,
    }
}

/// Writes formatted output whose records end at offsets `ends`; the records a failed write
/// did not wholly write are counted as lost (the program must go on).
fn write_out(bytes: &[u8], ends: &[usize]) {
    output::write_counted(bytes, output::Lost::Records(ends));
}

/// Starts the drain thread with every asynchronous signal blocked, so that none of the
/// program's handlers ever runs on it.
fn spawn() {
    extern "C" fn main(run: *mut libc::c_void) -> *mut libc::c_void {
        // Its probe hits (libc, through the loader's symbol lookups) run no handler.
        core::mem::forget(deferred::Inside::enter());
        loop {
            if RUN.load(Ordering::SeqCst) != run as usize {
                world::RUNTIME_THREADS.fetch_sub(1, Ordering::SeqCst);
                return core::ptr::null_mut();
            }
            // Sleeps a period, or less when a hit finds its ring past the high-water mark.
            let seen = buffers::WAKE.load(Ordering::Acquire);
            buffers::SLEEPING.store(true, Ordering::SeqCst);
            if !buffers::any_past_high_water() {
                sys::futex_wait(&buffers::WAKE, seen, Some(PERIOD_NS));
            }
            buffers::SLEEPING.store(false, Ordering::SeqCst);
            if !pass(false) {
                world::RUNTIME_THREADS.fetch_sub(1, Ordering::SeqCst);
                return core::ptr::null_mut();
            }
        }
    }
    if let Err(rc) = world::spawn(main, RUN.load(Ordering::SeqCst)) {
        output::message(format_args!("cannot start the drain thread (error {rc}): events are written at exit only"));
    }
}

/// In the child of `fork`: a fresh stream state and drain thread of its own.
///
/// The drain thread stayed in the parent. When it was in a pass at the fork, the child's copy
/// of the state is locked by no thread of the child and may be half changed: that copy is
/// left alone (its memory is not given back) and the child starts a state of its own.
pub fn after_fork() {
    let mut guard = match STATE.try_lock() {
        Some(guard) => guard,
        None => {
            // SAFETY: the child has one thread, this one, which holds no guard of the state:
            // the lock's holder was a thread of the parent.
            unsafe { STATE.force_unlock() };
            let mut guard = STATE.lock();
            if let Some(copy) = guard.take() {
                core::mem::forget(copy);
                *guard = Some(State::new(false));
            }
            guard
        }
    };
    let Some(st) = guard.as_mut() else { return };
    world::RUNTIME_THREADS.store(0, Ordering::SeqCst);
    for ev in events::all() {
        ev.dropped.store(0, Ordering::Relaxed);
    }
    st.staged.clear();
    st.arena.clear();
    st.open.clear();
    st.comms.clear();
    st.first = false;
    drop(guard);
    spawn();
}

/// Ends the stream: writes every record left, then the drops per event (process exit).
pub fn finish() {
    buffers::close();
    deferred::inside(|| {
        pass(true);
    });
}

/// After [`finish`] of an attach session's stream: its state and its rings' pages are given
/// back (a later session's stream starts afresh).
pub fn release() {
    let had = STATE.lock().take().is_some();
    if had {
        buffers::release_pages();
    }
}

/// One pass; `last`: write everything and end. Returns false once the stream has ended.
fn pass(last: bool) -> bool {
    let mut guard = STATE.lock();
    let Some(st) = guard.as_mut() else { return false };
    if st.done {
        return false;
    }
    clock::calibrate();
    let watermark = if last { u64::MAX } else { clock::to_ns(clock::now().0).saturating_sub(MARGIN_NS) };
    collect(st, true);
    for s in &mut st.staged {
        s.ns = clock::to_ns(s.clock);
    }
    st.staged.sort_unstable_by_key(|s| (s.ns, s.seq));
    let ready = st.staged.partition_point(|s| s.ns <= watermark);
    let batch: Vec<Staged> = st.staged.drain(..ready).collect();
    let held = st.staged.len();
    let mut out = core::mem::take(&mut st.out);
    out.clear();
    let arena = core::mem::replace(&mut st.arena, core::mem::take(&mut st.spare));
    st.arena.clear();
    let mut ends = Vec::with_capacity(batch.len());
    for (i, s) in batch.iter().enumerate() {
        emit(st, s, &arena[s.at..s.at + s.len], &mut out);
        if ends.last().copied().unwrap_or(0) < out.len() {
            ends.push(out.len());
        }
        // Formatting is slower than recording: a ring filling meanwhile is emptied into the
        // new arena, staged after the records held back, and the pages of every ring are
        // faulted in ahead of its writer.
        if i % URGENT_EVERY == URGENT_EVERY - 1 {
            if buffers::any_past_high_water() {
                collect(st, false);
            } else {
                buffers::prefault_in_use();
            }
        }
    }
    // What stays staged moves to the front of the other arena.
    for s in &mut st.staged[..held] {
        let at = st.arena.len();
        st.arena.extend_from_slice(&arena[s.at..s.at + s.len]);
        s.at = at;
    }
    st.spare = arena;
    if last {
        end(st, &mut out);
        st.done = true;
    }
    if !out.is_empty() {
        write_out(&out, &ends);
    }
    st.out = out;
    !last
}

/// How many records are formatted between two looks at the rings' fill.
const URGENT_EVERY: usize = 512;
/// How many bytes of records are taken out of a ring between two looks at its pages.
const PREFAULT_EVERY: usize = 256 << 10;

/// Takes the records out of every ring in use into the staged list and its arena, and faults
/// in the pages each owner will write next; `all`: also recycles the rings of threads that
/// are gone.
fn collect(st: &mut State, all: bool) {
    let pool_base = buffers::pool().map_or(0, |p| p as *const _ as usize);
    for InUse { ring, released } in buffers::in_use() {
        let (tid, pid) = (ring.tid.load(Ordering::Relaxed), ring.pid.load(Ordering::Relaxed));
        let key = ring as *const _ as usize - pool_base;
        // Before the copy, and as it goes (a ring past its high-water mark holds megabytes):
        // the owner goes on writing meanwhile.
        ring.prefault();
        let mut copied = 0;
        ring.drain(|rec| {
            copied += rec.len();
            if copied >= PREFAULT_EVERY {
                copied = 0;
                ring.prefault();
            }
            if let Some(h) = format::header(rec) {
                st.seq += 1;
                st.staged.push(Staged {
                    clock: h.clock,
                    ns: clock::to_ns(h.clock),
                    seq: st.seq,
                    tid,
                    pid,
                    ring: key,
                    at: st.arena.len(),
                    len: rec.len(),
                });
                st.arena.extend_from_slice(rec);
            }
        });
        let generation = ring.generation.load(Ordering::Acquire);
        if st.comms.get(&key).is_none_or(|(g, _)| *g != generation) {
            st.comms.insert(key, (generation, comm_of(tid)));
        }
        ring.prefault();
        if all && released {
            ring.recycle();
        }
    }
}

/// The name of thread `tid` of this process, as the kernel keeps it.
fn comm_of(tid: i32) -> Vec<u8> {
    let path = std::ffi::CString::new(format!("/proc/self/task/{tid}/comm")).unwrap_or_default();
    match sys::read_file(&path) {
        Ok(mut name) => {
            while name.last() == Some(&b'\n') {
                name.pop();
            }
            name
        }
        Err(_) => b"<...>".to_vec(),
    }
}

fn emit(st: &mut State, s: &Staged, bytes: &[u8], out: &mut Vec<u8>) {
    let Some(h) = format::header(bytes) else { return };
    let Some(ev) = events::get(h.event) else { return };
    let Some(values) = format::decode(&ev.args, bytes) else { return };
    let comm = st.comms.get(&s.ring).map_or(&b"<...>"[..], |(_, c)| c.as_slice()).to_vec();
    let probe = st.symbols.name(h.addr).to_string();
    let caller = if ev.kind == Kind::Return { st.symbols.name(h.caller).to_string() } else { String::new() };
    let line = Line {
        name: &ev.name,
        group: &ev.group,
        kind: ev.kind,
        args: &ev.args,
        values: &values,
        ns: s.ns,
        pid: s.pid,
        tid: s.tid,
        cpu: h.cpu,
        comm: &comm,
        probe: &probe,
        caller: &caller,
    };
    match format() {
        Format::Text | Format::Folded => line.text(out, &mut st.symbols),
        Format::Json => line.json(out, &mut st.symbols),
        Format::Chrome => {
            let mut args = String::new();
            line.json_args(&mut args, &mut st.symbols);
            let stack = ev.args.iter().zip(&values).find(|(a, _)| a.is_stack());
            let sf = stack.and_then(|(_, v)| st.frames.id(&format::frames(v), &mut |a| st.symbols.symbolize(a)));
            chrome(st, s, (h.addr, sf), ev.kind, &ev.name, &ev.group, &probe, &comm, args, out);
        }
    }
}

/// Whether a return event is defined for the function at `addr`.
fn has_return_event(addr: u64) -> bool {
    events::all().iter().any(|e| e.kind == Kind::Return && e.address() as u64 == addr)
}

#[allow(clippy::too_many_arguments)]
fn chrome(
    st: &mut State,
    s: &Staged,
    (addr, sf): (u64, Option<usize>),
    kind: Kind,
    name: &str,
    group: &str,
    probe: &str,
    comm: &[u8],
    args: String,
    out: &mut Vec<u8>,
) {
    let mut text = String::new();
    if !st.named.contains(&s.tid) {
        st.named.push(s.tid);
        let mut thread = String::from("{\"name\":");
        json_string(&mut thread, comm);
        thread.push('}');
        separate(&mut st.first, &mut text);
        chrome_event(&mut text, 'M', "thread_name", "__metadata", 0, None, s.pid, s.tid, &thread);
    }
    let function = probe.split('+').next().unwrap_or(probe).to_string();
    match kind {
        Kind::Entry if probe.ends_with("+0x0") && has_return_event(addr) => {
            st.open.entry(s.tid).or_default().push(Open { func: addr, ns: s.ns, name: function, args, sf });
        }
        Kind::Return => {
            let stack = st.open.entry(s.tid).or_default();
            match stack.iter().rposition(|o| o.func == addr) {
                Some(i) => {
                    // Calls above it were left without returning (longjmp, an exception).
                    let open = stack.remove(i);
                    let left: Vec<Open> = stack.drain(i..).collect();
                    for left in left {
                        instant(&mut st.first, &mut text, &left.name, group, left.ns, s, &left.args);
                        chain::with_sf(&mut text, left.sf);
                    }
                    let merged = merge(&open.args, &args);
                    separate(&mut st.first, &mut text);
                    chrome_event(
                        &mut text,
                        'X',
                        &open.name,
                        group,
                        open.ns,
                        Some(s.ns - open.ns),
                        s.pid,
                        s.tid,
                        &merged,
                    );
                    chain::with_sf(&mut text, open.sf.or(sf));
                }
                None => {
                    instant(&mut st.first, &mut text, name, group, s.ns, s, &args);
                    chain::with_sf(&mut text, sf);
                }
            }
        }
        Kind::Entry => {
            instant(&mut st.first, &mut text, name, group, s.ns, s, &args);
            chain::with_sf(&mut text, sf);
        }
    }
    if !text.is_empty() {
        out.extend_from_slice(text.as_bytes());
    }
}

/// The comma between two elements of the event array (none before the first).
fn separate(first: &mut bool, text: &mut String) {
    if !*first {
        text.push_str(",\n");
    }
    *first = false;
}

fn instant(first: &mut bool, text: &mut String, name: &str, group: &str, ns: u64, s: &Staged, args: &str) {
    separate(first, text);
    chrome_event(text, 'i', name, group, ns, None, s.pid, s.tid, args);
}

/// The entry's and the return's `args` objects as one.
fn merge(entry: &str, ret: &str) -> String {
    match (entry.len() > 2, ret.len() > 2) {
        (true, true) => format!("{},{}", &entry[..entry.len() - 1], &ret[1..]),
        (true, false) => entry.to_string(),
        _ => ret.to_string(),
    }
}

/// The end of the stream: Chrome's closing, the drops, in the stream's own format (a
/// reader of JSON lines or of a Chrome trace sees them as it sees records).
fn end(st: &mut State, out: &mut Vec<u8>) {
    let drops: Vec<(String, String, u64)> = events::all()
        .iter()
        .map(|e| (e.name.clone(), e.group.clone(), e.dropped.load(Ordering::Relaxed)))
        .filter(|(_, _, n)| *n > 0)
        .collect();
    if format() == Format::Json {
        let pid = sys::getpid();
        for (name, group, n) in &drops {
            let mut line = format!("{{\"kind\":\"dropped\",\"pid\":{pid},\"event\":");
            json_string(&mut line, name.as_bytes());
            line.push_str(",\"group\":");
            json_string(&mut line, group.as_bytes());
            line.push_str(&format!(",\"dropped\":{n}}}\n"));
            out.extend_from_slice(line.as_bytes());
        }
        return;
    }
    if format() == Format::Chrome {
        let mut text = String::new();
        if !drops.is_empty() {
            // A counter track, "records dropped", one series per event, at the end.
            let mut args = String::from("{");
            for (i, (name, _, n)) in drops.iter().enumerate() {
                if i > 0 {
                    args.push(',');
                }
                json_string(&mut args, name.as_bytes());
                args.push_str(&format!(":{n}"));
            }
            args.push('}');
            let now = clock::to_ns(clock::now().0);
            separate(&mut st.first, &mut text);
            chrome_event(&mut text, 'C', "records dropped", "uprobe-run", now, None, sys::getpid(), 0, &args);
        }
        // Calls still open: their entries, as instants.
        let open: Vec<(i32, Vec<Open>)> = st.open.drain().collect();
        for (tid, stack) in open {
            for o in stack {
                let s = Staged { clock: 0, ns: o.ns, seq: 0, tid, pid: sys::getpid(), ring: 0, at: 0, len: 0 };
                instant(&mut st.first, &mut text, &o.name, "uprobes", o.ns, &s, &o.args);
                chain::with_sf(&mut text, o.sf);
            }
        }
        text.push_str("\n],\"displayTimeUnit\":\"ns\",");
        st.frames.json(&mut text, json_string);
        text.push_str("\"otherData\":{\"dropped\":{");
        for (i, (name, _, n)) in drops.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            json_string(&mut text, name.as_bytes());
            text.push_str(&format!(":{n}"));
        }
        text.push_str("}}}\n");
        out.extend_from_slice(text.as_bytes());
        return;
    }
    for (name, _, n) in drops {
        out.extend_from_slice(
            format!(
                "uprobe-run: event {name}: {n} records dropped (its thread's buffer was full: see --buffer-size)\n"
            )
            .as_bytes(),
        );
    }
}
