//! Printing reports: every `--interval` from a thread of the runtime's own, and once when the
//! run ends ([`finish`]).
//!
//! [`finish`] is called by `api::handlers::run_exits`, whatever ends the process: `exit`, and
//! also `_exit`, `exec` and a fatal signal, where it runs in that signal's handler, possibly
//! on a thread that was in the middle of anything. So it takes no lock that a hit could hold
//! and waits for none without a bound: the registry (for symbol names) and the reporter's
//! own state are tried for a while, and done without if they stay busy (addresses shown in
//! hex, the whole run's numbers instead of the last interval's). It allocates only from the
//! runtime's own allocator, reads blocks without locking them, and writes with `write(2)`.
//! An attach session reports the same way at detach: `finish` is its end.
//!
//! Only the process that made the blocks reports: a forked child's hits are counted in
//! them, and reported by its parent.
//!
//! Context: the interval thread (normal context, its signals blocked, inside the runtime);
//! the end of the run (normal or fatal-signal context).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::aggregate::hit::{EPOCH, NS_PER_TICK};
use crate::aggregate::merge::{self, Snapshot};
use crate::aggregate::plan::{self, Plans};
use crate::aggregate::tables::{self, EventView, Frame, Interval, Left, Names};
use crate::aggregate::{folded, json, pprof, text};
use crate::base::abi::Uretprobe;
use crate::base::lock::{Mutex, MutexGuard};
use crate::base::{maps, output, sys};
use crate::probe::{deferred, registry, retprobe, table, world};
use crate::trace::clock;
use crate::trace::events::{self, Probe};
use crate::trace::format::Symbols;
use crate::trace::names::{demangle, without_parameters};
use uprobe_contracts::lines::{Bytes, Lines};
use uprobe_contracts::wire;

/// How many modules' line tables reports keep at a time.
const LINE_MODULES: usize = 16;
/// How long the end of the run waits for the interval thread's report, or for the registry.
const PATIENCE_NS: u64 = 200_000_000;
/// How long an interval report lets hits of the closing interval finish before reading it.
const GRACE_NS: u64 = 1_000_000;

/// The process that made the blocks, which alone reports.
static OWNER: AtomicI32 = AtomicI32::new(0);
static FINISHED: AtomicBool = AtomicBool::new(false);
/// The run of reports (an attach session's are a run of their own): an interval thread
/// ends with its run.
static RUN: AtomicU32 = AtomicU32::new(0);
/// Whether the interval thread runs (in this process).
static INTERVAL_THREAD: AtomicBool = AtomicBool::new(false);
/// The first calibration point of `clock::ticks` (ticks, ns).
static TICKS0: AtomicU64 = AtomicU64::new(0);
static NS0: AtomicU64 = AtomicU64::new(0);

/// What the reports remember from one to the next.
struct Reporter {
    /// CLOCK_MONOTONIC at the start, and at the last report.
    start_ns: u64,
    last_ns: u64,
    /// The number of the next interval report.
    next: u64,
    /// The last interval report's snapshot (differences are taken from it).
    before: Option<Snapshot>,
    /// Names found so far: threads (seen alive), symbols, timed functions.
    comms: BTreeMap<i32, String>,
    symbols: BTreeMap<u64, String>,
    functions: BTreeMap<usize, String>,
    /// Source places of frames, from the modules' line tables (read at the first frame
    /// that needs them, kept for the next reports).
    lines: Lines,
    /// The line that opens a text report of a program reached by a followed exec (its
    /// reports come besides those of the program that exec'd it).
    title: Option<String>,
}

static STATE: Mutex<Option<Reporter>> = Mutex::new(None);

/// Starts the reports (start-up, once the events' probes are placed); `followed_exec`: this
/// program was reached by an exec that uprobe-run followed.
pub fn start(followed_exec: bool) {
    OWNER.store(sys::getpid(), Ordering::Relaxed);
    RUN.fetch_add(1, Ordering::SeqCst);
    FINISHED.store(false, Ordering::SeqCst);
    let now = clock::monotonic_ns();
    let mut r = Reporter::new(now);
    if followed_exec {
        let program = sys::readlink(c"/proc/self/exe").unwrap_or_else(|_| "?".into());
        r.title = Some(format!("pid {} ({program}):\n", sys::getpid()));
    }
    *STATE.lock() = Some(r);
    if let Some(period) = plan::plans().and_then(|p| p.request.asked.interval_ns) {
        spawn(period);
    }
}

impl Reporter {
    fn new(now: u64) -> Reporter {
        Reporter {
            start_ns: now,
            last_ns: now,
            next: 1,
            before: None,
            comms: BTreeMap::new(),
            symbols: BTreeMap::new(),
            functions: BTreeMap::new(),
            lines: Lines::new(LINE_MODULES),
            title: None,
        }
    }
}

/// Takes the first calibration point of `clock::ticks`, and a second `wait_ns` later
/// (start-up, before any timed call).
pub fn calibrate_start(wait_ns: u64) {
    if clock::ticks_are_ns() {
        return;
    }
    let (t, n) = reading();
    TICKS0.store(t, Ordering::Relaxed);
    NS0.store(n, Ordering::Relaxed);
    sys::sleep_ns(wait_ns);
    calibrate();
}

/// A (ticks, ns) pair read as close together as a few tries allow.
fn reading() -> (u64, u64) {
    let mut best = (0, 0, u64::MAX);
    for _ in 0..5 {
        let before = clock::monotonic_ns();
        let t = clock::ticks();
        let after = clock::monotonic_ns();
        if after - before < best.2 {
            best = (t, before + (after - before) / 2, after - before);
        }
    }
    (best.0, best.1)
}

/// Ns per tick from the first calibration point to now: the longer the run, the closer.
fn calibrate() {
    if clock::ticks_are_ns() {
        return;
    }
    let (t0, n0) = (TICKS0.load(Ordering::Relaxed), NS0.load(Ordering::Relaxed));
    let (t1, n1) = reading();
    if t1 > t0 && n1 > n0 {
        let per_tick = (u128::from(n1 - n0) << 32) / u128::from(t1 - t0);
        NS_PER_TICK.store(per_tick.min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }
}

/// Starts the interval thread, with every asynchronous signal blocked so that none of the
/// program's handlers runs on it; it runs no program code and counts as the runtime's.
fn spawn(period: u64) {
    extern "C" fn main(arg: *mut libc::c_void) -> *mut libc::c_void {
        // Its probe hits (none expected: it calls no libc) run no handler.
        core::mem::forget(deferred::Inside::enter());
        let period = arg as u64;
        let run = RUN.load(Ordering::SeqCst);
        let mut deadline = clock::monotonic_ns() + period;
        loop {
            let now = clock::monotonic_ns();
            if deadline > now {
                sys::sleep_ns(deadline - now);
                continue;
            }
            deadline += period;
            if FINISHED.load(Ordering::Acquire) || RUN.load(Ordering::SeqCst) != run {
                if INTERVAL_THREAD.swap(false, Ordering::SeqCst) {
                    world::RUNTIME_THREADS.fetch_sub(1, Ordering::SeqCst);
                }
                return core::ptr::null_mut();
            }
            report(false);
        }
    }
    // The thread's argument is the period, as a number.
    match world::spawn(main, period as usize) {
        Ok(()) => INTERVAL_THREAD.store(true, Ordering::SeqCst),
        Err(rc) => {
            output::message(format_args!("cannot start the interval reports (error {rc}): one report at the end only"))
        }
    }
}

/// In the child of `fork`: the interval thread stayed in the parent (the child reports
/// nothing: the parent counts its hits), so it no longer counts as a runtime thread here.
pub fn after_fork() {
    if INTERVAL_THREAD.swap(false, Ordering::SeqCst) {
        world::RUNTIME_THREADS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The run's last report (see the module doc); later calls, and calls in a forked child,
/// print nothing.
pub fn finish() {
    if plan::plans().is_none() || sys::getpid() != OWNER.load(Ordering::Relaxed) {
        return;
    }
    if FINISHED.swap(true, Ordering::AcqRel) {
        return;
    }
    deferred::inside(|| report(true));
}

/// The reporter's state, waited for at most PATIENCE_NS.
fn state() -> Option<MutexGuard<'static, Option<Reporter>>> {
    let deadline = clock::monotonic_ns() + PATIENCE_NS;
    loop {
        if let Some(guard) = STATE.try_lock() {
            return Some(guard);
        }
        if clock::monotonic_ns() > deadline {
            return None;
        }
        sys::sleep_ns(1_000_000);
    }
}

fn report(end: bool) {
    let Some(plans) = plan::plans() else { return };
    let mut guard = state();
    let mut fresh = None;
    // Without the state (the interval thread held it too long), the whole run's numbers.
    let (r, known) = match guard.as_mut().and_then(|g| g.as_mut()) {
        Some(r) => (r, true),
        None => (fresh.insert(Reporter::new(clock::monotonic_ns())), false),
    };
    calibrate();
    let intervals = plans.request.asked.interval_ns.is_some() && known;
    let cumulative = plans.request.asked.cumulative;
    let now_ns = clock::monotonic_ns();
    let now = merge::take(plans);
    // Turn the interval over at once (the calls that return in between are counted in the
    // next interval and have their min and max in this one: a few microseconds' worth), and
    // let the hits that read the old interval finish before its min and max are read.
    let closing = EPOCH.fetch_add(1, Ordering::AcqRel);
    let mut shown = match (&r.before, intervals && !cumulative) {
        (Some(before), true) => merge::since(&now, before),
        _ => now.clone(),
    };
    if intervals && !cumulative && !plans.latencies.is_empty() {
        sys::sleep_ns(GRACE_NS);
        for (lat, (min, max)) in shown.latencies.iter_mut().zip(merge::extremes(plans, closing)) {
            (lat.min, lat.max) = if lat.calls > 0 { (min, max) } else { (None, None) };
        }
        // Keyed calls keep their interval's extremes in their keys' slots: the whole
        // function's are theirs too.
        for ((l, id), (min, max)) in merge::keyed_extremes(plans, closing) {
            if let Some(lat) = shown.keyed_latencies.get_mut(&(l, id)).filter(|lat| lat.calls > 0) {
                (lat.min, lat.max) = (min, max);
            }
            if let Some(lat) = shown.latencies.get_mut(l).filter(|lat| lat.calls > 0) {
                lat.add(&merge::Latency { min, max, ..merge::Latency::default() });
            }
        }
    }
    let frame = Frame {
        pid: sys::getpid(),
        interval: intervals.then_some(Interval {
            index: r.next,
            from_ns: if cumulative { 0 } else { r.last_ns - r.start_ns },
            to_ns: now_ns - r.start_ns,
            cumulative,
        }),
        end,
        ts: now_ns,
    };
    let left: Vec<Left> =
        if end { plans.latencies.iter().map(|l| left_of(plans, l.event, &now)).collect() } else { Vec::new() };
    let all = events::all();
    let views: Vec<EventView> =
        all.iter().map(|e| EventView { name: &e.name, group: &e.group, args: &e.args }).collect();
    // Text and folded lines name an event by one word; JSON has the group beside the name.
    let labels = tables::labels(&views);
    let labelled: Vec<EventView> = views.iter().zip(&labels).map(|(v, l)| EventView { name: l, ..*v }).collect();
    let mut names = Known { r, deadline: clock::monotonic_ns() + PATIENCE_NS, owners: &shown.names, maps: None };
    let mut out = String::new();
    if plans.request.folded {
        let (lines, left_out) = folded::lines(plans, &labelled, &shown, &mut names);
        folded::write(&mut out, &lines);
        if left_out > 0 {
            output::message(format_args!("{left_out} hits are not in the folded stacks (see a text report)"));
        }
    } else if plans.request.json {
        json::write(&mut out, plans, &views, &shown, &frame, &left, &mut names);
    } else {
        out.push_str(names.r.title.as_deref().unwrap_or(""));
        text::write(&mut out, plans, &labelled, &shown, &frame, &left, &mut names);
    }
    // In an attach session, uprobe-run writes the files, as the user who asked for them.
    if let Some(path) = plans.request.asked.flamegraph.as_deref().filter(|_| end) {
        let (lines, _) = folded::lines(plans, &labelled, &now, &mut names);
        let title = format!("uprobe-run: {} (pid {})", plans.by.as_ref().map_or("", |b| b.name.as_str()), frame.pid);
        if output::in_session() {
            let mut text = String::new();
            folded::write(&mut text, &lines);
            output::send_file(wire::FOLDED, text.as_bytes());
        } else if let Err(line) = folded::svg(path, &title, &lines) {
            output::message(format_args!("{line}"));
        }
    }
    if let Some(path) = plans.request.asked.pprof.as_deref().filter(|_| end) {
        let mut profile = pprof::profile(plans, &labelled, &now, &mut names);
        profile.duration_nanos = (now_ns - names.r.start_ns) as i64;
        if output::in_session() {
            output::send_file(wire::PPROF, &profile.encode());
        } else if let Err(line) = pprof::write(path, &profile) {
            output::message(format_args!("{line}"));
        }
    }
    let r = names.r;
    r.next += 1;
    r.last_ns = now_ns;
    r.before = Some(now);
    // Output that cannot be written is counted as lost: the program must go on.
    output::write_counted(out.as_bytes(), output::Lost::Report);
}

/// The whole run's numbers so far as JSON report lines (the metrics feed): read as the
/// reports read them, without turning the interval over or touching what the next interval
/// report shows.
pub fn whole_run_json(out: &mut String) {
    let Some(plans) = plan::plans() else { return };
    let mut guard = state();
    let mut fresh = None;
    let r = match guard.as_mut().and_then(|g| g.as_mut()) {
        Some(r) => r,
        None => fresh.insert(Reporter::new(clock::monotonic_ns())),
    };
    let snap = merge::take(plans);
    let frame = Frame { pid: sys::getpid(), interval: None, end: false, ts: clock::monotonic_ns() };
    let all = events::all();
    let views: Vec<EventView> =
        all.iter().map(|e| EventView { name: &e.name, group: &e.group, args: &e.args }).collect();
    let mut names = Known { r, deadline: clock::monotonic_ns() + PATIENCE_NS, owners: &snap.names, maps: None };
    json::write(out, plans, &views, &snap, &frame, &[], &mut names);
}

/// The return probe of timed event `event`.
fn return_probe(event: usize) -> Option<*mut Uretprobe> {
    match events::all().get(event)?.probe {
        // SAFETY: the probe objects are leaked, valid for the life of the process.
        Probe::Return(p) => Some(unsafe { core::ptr::addr_of_mut!((*p).rp) }),
        Probe::Entry(_) => None,
    }
}

/// What became of the timed calls of `event` that did not return, as its return probe
/// counted them.
fn left_of(plans: &Plans, event: usize, snap: &Snapshot) -> Left {
    let Some(rp) = return_probe(event) else { return Left::default() };
    let Some(l) = plans.events[event].latency else { return Left::default() };
    // SAFETY: the timed events' return probes are registered for the life of the process
    // (never unregistered); `nmissed` is only ever updated atomically.
    let ([gone, children, thread_exit], missed) = unsafe {
        (retprobe::left_counts(rp), AtomicU64::from_ptr(core::ptr::addr_of_mut!((*rp).nmissed)).load(Ordering::Relaxed))
    };
    let counted = Left {
        pending: retprobe::pending_here(rp) as u64,
        gone: gone as u64,
        thread_exit: thread_exit as u64,
        children: children as u64,
        elsewhere: 0,
        missed,
    };
    Left::of(&snap.latencies[l], counted)
}

/// Names as the process knows them, found for a report without waiting for long.
struct Known<'a> {
    r: &'a mut Reporter,
    deadline: u64,
    owners: &'a [(i32, [u8; 16])],
    /// The address space, read when an address has no symbol.
    maps: Option<Vec<maps::Mapping>>,
}

impl Known<'_> {
    /// `sym+0xoff` for `addr`, or None; the registry is tried until the report's deadline.
    fn symbol(&mut self, addr: u64) -> Option<String> {
        loop {
            match registry::try_symbolize(addr as usize) {
                Some(found) => return found,
                None if clock::monotonic_ns() > self.deadline => return None,
                None => sys::sleep_ns(1_000_000),
            }
        }
    }
}

impl Known<'_> {
    /// `with` the report's line tables and the module file at `at` (path, inode, file
    /// offset of `at`), read only while it is still the file mapped (the same inode).
    fn in_module<T>(
        &mut self,
        at: u64,
        with: impl FnOnce(&mut Lines, &str, u64, u64, Reader) -> Option<T>,
    ) -> Option<T> {
        let maps = self.maps.get_or_insert_with(maps::current);
        let m = maps::find(maps, at as usize).filter(|m| m.is_file())?;
        let (path, inode, offset) = (m.path.clone(), m.inode, at - m.start + m.offset);
        let mut read = |p: &str| -> Option<Bytes> {
            let file = sys::map_file(&std::ffi::CString::new(p).ok()?).ok()?;
            (p != path || file.ino == inode).then(|| Box::new(Mapped(file)) as Bytes)
        };
        with(&mut self.r.lines, &path, inode, offset, &mut read)
    }

    /// The name of a function at `at` that the loaded module does not export, from the
    /// symbol table of its file or its debug file.
    fn debug_symbol(&mut self, at: u64) -> Option<(String, u64)> {
        self.in_module(at, |lines, path, inode, offset, read| lines.symbol(path, inode, offset, read))
    }
}

type Reader<'a> = &'a mut dyn FnMut(&str) -> Option<Bytes>;

impl Symbols for Known<'_> {
    fn symbolize(&mut self, addr: u64) -> String {
        if let Some(s) = self.r.symbols.get(&addr) {
            return s.clone();
        }
        // No symbol (a stripped library's own function): FILE+OFFSET, as tracefs takes it.
        let name = self.symbol(addr).or_else(|| {
            let m = maps::find(self.maps.get_or_insert_with(maps::current), addr as usize)?.clone();
            let file = m.path.rsplit('/').next().filter(|_| m.is_file())?;
            Some(format!("{file}+{:#x}", addr - m.start + m.offset))
        });
        match name {
            Some(s) => {
                self.r.symbols.insert(addr, s.clone());
                s
            }
            None => format!("{addr:#x}"),
        }
    }
}

impl Names for Known<'_> {
    fn comm(&mut self, tid: i32) -> String {
        let path = std::ffi::CString::new(format!("/proc/{tid}/comm")).unwrap_or_default();
        if let Ok(mut name) = sys::read_file(&path) {
            while name.last() == Some(&b'\n') {
                name.pop();
            }
            let name = String::from_utf8_lossy(&name).into_owned();
            self.r.comms.insert(tid, name.clone());
            return name;
        }
        if let Some(name) = self.r.comms.get(&tid) {
            return name.clone();
        }
        match self.owners.iter().find(|(t, _)| *t == tid) {
            Some((_, name)) => {
                let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                String::from_utf8_lossy(&name[..len]).into_owned()
            }
            None => format!("tid {tid}"),
        }
    }

    fn skipped(&mut self, event: usize) -> bool {
        events::all().get(event).is_some_and(|e| e.skipped.load(Ordering::Relaxed))
    }

    fn trapped(&mut self, event: usize) -> bool {
        let addr = events::all().get(event).map_or(0, |e| e.address());
        addr != 0 && table::lookup(addr).is_some_and(|pp| !pp.jumped.load(Ordering::Relaxed))
    }

    fn frame(&mut self, addr: u64, caller: bool) -> String {
        let at = addr - u64::from(caller);
        let name = self.symbolize(at);
        // Named by the call's last byte, shown at the return address.
        let name = match name.rsplit_once("+0x").map(|(s, off)| (s, u64::from_str_radix(off, 16))) {
            Some((sym, Ok(off))) if caller => format!("{sym}+{:#x}", off + 1),
            _ => name,
        };
        let maps = self.maps.get_or_insert_with(maps::current);
        let module = maps::find(maps, at as usize).filter(|m| m.is_file() || m.path == "[vdso]");
        let Some(module) = module.map(|m| m.path.rsplit('/').next().unwrap_or_default().to_string()) else {
            return name;
        };
        match name.rsplit_once('+') {
            // A stripped module's frame is FILE+OFFSET, unless its debug file names it.
            Some((sym, _)) if sym == module => match self.debug_symbol(at) {
                Some((sym, off)) => {
                    let sym = demangle(&sym).map_or(sym.clone(), |d| without_parameters(&d).to_string());
                    format!("{sym}+{:#x} ({module})", off + u64::from(caller))
                }
                None => name,
            },
            Some((sym, off)) => {
                let sym = demangle(sym).map_or(sym.to_string(), |d| without_parameters(&d).to_string());
                format!("{sym}+{off} ({module})")
            }
            None => format!("{name} ({module})"),
        }
    }

    fn place(&mut self, addr: u64, caller: bool) -> Option<String> {
        self.in_module(addr - u64::from(caller), |lines, path, inode, offset, read| {
            lines.place(path, inode, offset, read).map(|p| p.to_string())
        })
    }

    fn module(&mut self, addr: u64) -> Option<pprof::Module> {
        let maps = self.maps.get_or_insert_with(maps::current);
        let m = maps::find(maps, addr as usize).filter(|m| m.is_file())?;
        let mut module =
            pprof::Module { start: m.start, end: m.end, offset: m.offset, path: m.path.clone(), ..Default::default() };
        module.build_id = self
            .in_module(addr, |lines, path, inode, _, read| Some(lines.build_id(path, inode, read)))
            .map_or_else(String::new, |id| pprof::hex(&id));
        Some(module)
    }

    fn function(&mut self, event: usize) -> String {
        if let Some(f) = self.r.functions.get(&event) {
            return f.clone();
        }
        let Some(ev) = events::all().get(event) else { return String::new() };
        let from_symbol = (ev.address() != 0).then(|| self.symbol(ev.address() as u64)).flatten().map(|s| {
            let name = s.split('+').next().unwrap_or(&s).to_string();
            demangle(&name).map_or(name, |d| without_parameters(&d).to_string())
        });
        match from_symbol {
            Some(f) => {
                self.r.functions.insert(event, f.clone());
                f
            }
            None => ev.name.strip_suffix("__return").unwrap_or(&ev.name).to_string(),
        }
    }
}

/// A mapped file as the line tables read it.
struct Mapped(sys::MappedFile);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}
