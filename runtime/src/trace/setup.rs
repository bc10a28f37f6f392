//! Start-up: the run's definitions (`-e`, `--events FILE`) parsed, resolved against the
//! modules loaded now, made into events and their probes, registered as one placement batch,
//! and the stream started. A definition that is wrong stops the run before `main` with one
//! line naming it, the column and what was expected, and exit status 2; `--lenient` skips
//! the probes that cannot be placed instead. A definition on a module not loaded yet waits
//! for it (armed at its `dlopen`, as `module:symbol` probes are).
//!
//! A [`Frontend`] may take the events instead of the stream (aggregation): their probes then
//! call its handlers, it may add definitions of its own, and it prepares before any probe is
//! placed; records are not kept and no drain thread runs.
//!
//! Context: start-up (before the program's constructors and `main`), normal context.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::base::abi::{Uprobe, UprobeHandler, Uretprobe, UretprobeEntryHandler, UretprobeHandler, UPROBE_NO_VECTORS};
use crate::base::elf::LoadedModule;
use crate::base::{maps, output, sys};
use crate::probe::symbols::View;
use crate::probe::table::{self, Consumer};
use crate::probe::{deferred, registry, semaphore};
use crate::trace::def::{self, DefError, Definition, Kind, Place};
use crate::trace::drain::{self, Format};
use crate::trace::events::{self, EntryProbe, Event, Probe, ReturnProbe};
use crate::trace::resolve::{resolve, where_at};
use crate::trace::{buffers, clock, fetch, filter, quick, record};
use uprobe_contracts::filter::{self as program, Program};

/// What the run asks of the stream.
pub struct Settings {
    /// `-e` definitions, in order.
    pub events: Vec<String>,
    /// `--events` files.
    pub files: Vec<String>,
    /// Compiled predicates: (the definition's number, the program's text).
    pub filters: Vec<(usize, String)>,
    /// `--max-events`.
    pub max_events: Option<u64>,
    /// `--trigger` texts.
    pub triggers: Vec<String>,
    pub format: Format,
    /// Bytes of each thread's buffer.
    pub buffer_size: usize,
    pub lenient: bool,
    /// `-g`: every event records the user stack, as a `$ustack` fetcharg of its own.
    pub call_graph: bool,
    /// In a program reached by a followed exec: what does not apply is reported, not fatal.
    pub followed_exec: bool,
}

/// What the probe of an event calls.
#[derive(Clone, Copy)]
pub struct Handlers {
    /// An entry event's handler.
    pub entry: UprobeHandler,
    /// A return event's return handler, its entry handler, and the bytes of `ri->data` they
    /// share.
    pub ret: UretprobeHandler,
    pub ret_entry: Option<UretprobeEntryHandler>,
    pub data_size: usize,
    /// Whether `entry` touches no vector register (checked by the `hit_code` test), so a jump
    /// probe calling only it skips their save.
    pub vector_free: bool,
}

impl Handlers {
    /// The stream's: each hit becomes a record.
    pub const RECORD: Handlers =
        Handlers { entry: record::on_entry, ret: record::on_return, ret_entry: None, data_size: 0, vector_free: true };
}

/// A definition a front-end adds to the run's (`--latency`): where it came from (`--latency`),
/// its text (`r:GRP/ WHERE`), how much of the text the user did not write (refusals show the
/// rest), and what its probe calls.
pub struct Added {
    pub origin: String,
    pub text: String,
    pub unwritten: usize,
    pub handlers: Handlers,
}

/// Something that uses the run's events other than the stream.
pub trait Frontend {
    /// What the probes of the `-e` and `--events` definitions call.
    fn handlers(&self) -> Handlers;
    /// Definitions of its own.
    fn added(&self) -> Vec<Added>;
    /// Called with the events made (each knows its definition), before any probe is placed:
    /// the line to refuse the run with, if what it was asked does not fit them.
    fn prepare(&self, events: &'static [Event]) -> Result<(), String>;
}

/// Threads with a buffer of their own at once; more share nothing and drop their records.
const THREADS: usize = 256;
/// A thread's buffer when `--buffer-size` is not given.
pub const DEFAULT_BUFFER: usize = 4 << 20;
/// Exit status of a run refused over its definitions.
const REFUSED: i32 = 2;

/// A definition and where it came from (`-e`, `FILE:LINE`, a front-end's).
struct Source {
    origin: String,
    def: Definition,
    /// Bytes at the start of the text that the user did not write (see [`Added`]).
    unwritten: usize,
    handlers: Handlers,
    filter: Option<Program>,
}

/// The predicate of the `n`th definition, as `uprobe-run` compiled it, checked against it.
fn program_for(n: usize, def: &Definition, settings: &Settings) -> Result<Option<Program>, String> {
    let mut found = settings.filters.iter().filter(|(i, _)| *i == n);
    let Some((_, text)) = found.next() else {
        return match def.filter {
            Some(_) => Err("a filter compiled by uprobe-run (run the program through uprobe-run)".into()),
            None => Ok(None),
        };
    };
    match Program::decode(text) {
        Ok(p) if found.next().is_none() && program::fits(&p, &program::fields_of(def)) => Ok(Some(p)),
        _ => Err("a filter program that fits the definition (run the program through uprobe-run)".into()),
    }
}

/// One probe a definition resolved to.
struct Target {
    source: usize,
    name: String,
    /// `symbol_name` for the core ("module:symbol+off"), or an address.
    spec: Option<String>,
    addr: usize,
    /// Resolved to nothing, and skipped by `--lenient`: an event that reports say was
    /// skipped, with no probe.
    skipped: bool,
}

/// Reads, resolves and registers the definitions and starts the stream; false when there
/// are none; the line to refuse the run with (see [`refuse_line`]).
pub fn start(settings: &Settings) -> Result<bool, String> {
    start_with(settings, None)
}

/// [`start`], the events going to `frontend` instead of the stream when one is given.
pub fn start_with(settings: &Settings, frontend: Option<&dyn Frontend>) -> Result<bool, String> {
    let mut texts: Vec<(String, String)> = settings.events.iter().map(|t| ("-e".to_string(), t.clone())).collect();
    for file in &settings.files {
        let c = CString::new(file.as_str()).unwrap_or_default();
        let text = match sys::read_file(&c) {
            Ok(t) => String::from_utf8_lossy(&t).into_owned(),
            Err(e) => return Err(format!("--events {file}: {}", std::io::Error::from_raw_os_error(e))),
        };
        for (n, line) in def::file_lines(&text) {
            texts.push((format!("{file}:{n}"), line.to_string()));
        }
    }
    let handlers = frontend.map_or(Handlers::RECORD, |f| f.handlers());
    let added = frontend.map(|f| f.added()).unwrap_or_default();
    if texts.is_empty() && added.is_empty() {
        return Ok(false);
    }
    let mut sources = Vec::new();
    // Definitions are numbered as `uprobe-run` numbers them for their filters: the `-e` and
    // files' ones, then the front-end's (`--latency`).
    let written = texts.len();
    for (n, (origin, text)) in texts.into_iter().enumerate() {
        match def::parse(&text).map(|d| with_call_graph(d, settings)) {
            Ok(def) => match program_for(n, &def, settings) {
                Ok(filter) => sources.push(Source { origin, def, unwritten: 0, handlers, filter }),
                Err(what) => refuse(&origin, &text, 0, &DefError { at: 0, what }, settings)?,
            },
            Err(e) => refuse(&origin, &text, 0, &e, settings)?,
        }
    }
    for (n, a) in added.into_iter().enumerate() {
        let parsed = def::parse(&a.text).and_then(|def| {
            program_for(written + n, &def, settings).map(|p| (def, p)).map_err(|what| DefError { at: 0, what })
        });
        match parsed {
            Ok((def, filter)) => {
                sources.push(Source { origin: a.origin, def, unwritten: a.unwritten, handlers: a.handlers, filter })
            }
            Err(e) => refuse(&a.origin, &a.text, a.unwritten, &e, settings)?,
        }
    }
    let targets = registry::with_view(|view| resolve_all(view, &sources, settings))?;
    // Event names are unique within their group, as in tracefs.
    let mut names: Vec<(&str, &str)> = Vec::new();
    for t in &targets {
        let s = &sources[t.source];
        if names.contains(&(s.def.group.as_str(), t.name.as_str())) {
            let e = DefError { at: 0, what: format!("an event name not used before ({} is)", t.name) };
            refuse(&s.origin, &s.def.text, s.unwritten, &e, settings)?;
        }
        names.push((&s.def.group, &t.name));
    }
    if targets.is_empty() {
        return Ok(false);
    }
    if frontend.is_none() {
        if let Err(e) = buffers::init(THREADS, settings.buffer_size) {
            output::message(format_args!("cannot reserve the event buffers: {}", std::io::Error::from_raw_os_error(e)));
            return Ok(false);
        }
    }
    clock::init();
    let mut made: Vec<Event> =
        targets.iter().enumerate().map(|(i, t)| make_event(i as u32, t, &sources[t.source])).collect();
    filter::triggers(&mut made, &settings.triggers)?;
    events::publish(made);
    filter::init(frontend.is_none(), settings.max_events);
    if let Some(f) = frontend {
        f.prepare(events::all())?;
    }
    // `$ustack`: the modules' unwind tables, made before any probe that walks them.
    if events::all().iter().any(|e| e.args.iter().any(|a| a.is_stack())) {
        crate::probe::stacks::enable();
    }
    if frontend.is_none() {
        quick::enable();
    }
    registry::ON_ARMED.store(on_armed as fn(usize, usize) as usize, Ordering::Release);
    register(&targets, &sources, settings)?;
    set_file_bases();
    if frontend.is_some() {
        return Ok(true);
    }
    drain::start(settings.format);
    if registry::VERBOSE.load(Ordering::Relaxed) {
        output::message(format_args!("{} events; records timed with {}", targets.len(), clock::describe()));
    }
    extern "C" fn child() {
        buffers::after_fork();
        drain::after_fork();
    }
    // Once per process (attach sessions make streams again).
    static ONCE: AtomicBool = AtomicBool::new(false);
    if !ONCE.swap(true, Ordering::SeqCst) {
        // SAFETY: a plain function that stays loaded for the life of the process.
        unsafe { libc::pthread_atfork(None, None, Some(child)) };
    }
    Ok(true)
}

/// `def` with a stack of its own under `-g` (unless it records one already).
fn with_call_graph(mut def: Definition, settings: &Settings) -> Definition {
    if settings.call_graph && !def.args.iter().any(|a| a.is_stack()) {
        let stack = fetch::Fetch::Ustack(fetch::MAX_STACK_DEPTH);
        def.args.push(fetch::FetchArg { name: "ustack".into(), fetch: stack, ty: fetch::Type::STACK, named: None });
    }
    def
}

/// Says why the run cannot go on, and ends it before `main`, unless it is an exec'd program.
pub fn refuse_line(line: &str, settings: &Settings) -> ! {
    if settings.followed_exec {
        output::message(format_args!("{line}"));
    }
    let _ = sys::write_all(2, format!("uprobe-run: {line}\n").as_bytes());
    output::flush();
    sys::exit_now(REFUSED)
}

/// A definition that is wrong as written (it does not parse, an event name used twice):
/// refused even with `--lenient`, which skips only what cannot be placed.
fn refuse(origin: &str, text: &str, unwritten: usize, e: &DefError, settings: &Settings) -> Result<(), String> {
    refuse_or_skip(origin, text, unwritten, e, settings, false)
}

/// A definition that cannot be placed, in a text whose first `unwritten` bytes the user did
/// not write: the rest is shown, and the column counted in it. `--lenient` skips it.
fn refuse_shown(origin: &str, text: &str, unwritten: usize, e: &DefError, settings: &Settings) -> Result<(), String> {
    refuse_or_skip(origin, text, unwritten, e, settings, settings.lenient)
}

/// The line naming the definition, then the end of the run, or the definition skipped where
/// `skip` (or in a program reached by a followed exec, which must run whatever it lacks).
fn refuse_or_skip(
    origin: &str,
    text: &str,
    unwritten: usize,
    e: &DefError,
    settings: &Settings,
    skip: bool,
) -> Result<(), String> {
    let shown = text.get(unwritten..).unwrap_or(text);
    let e = DefError { at: e.at.saturating_sub(unwritten), what: e.what.clone() };
    let line = format!("{origin} '{shown}': {e}");
    if skip || settings.followed_exec {
        output::message(format_args!("{line}; skipped"));
        return Ok(());
    }
    Err(line)
}

fn resolve_all(view: &mut View, sources: &[Source], settings: &Settings) -> Result<Vec<Target>, String> {
    let own = record::on_entry as *const () as usize;
    let modules: Vec<LoadedModule> = view.modules().iter().filter(|m| !m.holds(own)).cloned().collect();
    let mut targets = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        match resolve(view, &modules, &s.def) {
            Ok(found) => targets.extend(found.into_iter().map(|(name, spec, addr)| Target {
                source: i,
                name,
                spec,
                addr,
                skipped: false,
            })),
            Err(e) => {
                refuse_shown(&s.origin, &s.def.text, s.unwritten, &e, settings)?;
                // Still here: --lenient skipped it; reports say so instead of leaving it out.
                let name = s.def.event.clone().unwrap_or_else(|| s.def.default_name(None));
                targets.push(Target { source: i, name, spec: None, addr: 0, skipped: true });
            }
        }
    }
    Ok(targets)
}

fn make_event(index: u32, t: &Target, s: &Source) -> Event {
    let symbol_name = t.spec.as_ref().map_or(core::ptr::null(), |spec| {
        CString::new(spec.as_str()).unwrap_or_default().into_raw() as *const core::ffi::c_char
    });
    let u = Uprobe {
        pid: 0,
        // A probe that reads %xmmN has the vector registers saved, where the reads find them.
        flags: match (s.handlers.vector_free, s.def.args.iter().any(|a| a.xmm().is_some())) {
            (_, true) => table::READS_XMM,
            (true, false) => UPROBE_NO_VECTORS,
            (false, false) => 0,
        },
        vaddr: t.addr as _,
        handler: Some(s.handlers.entry),
        registration_callback: None,
        symbol_name,
        offset: 0,
        reserved: [core::ptr::null_mut(); 4],
    };
    let probe = match s.def.kind {
        Kind::Entry => Probe::Entry(Box::into_raw(Box::new(EntryProbe { u, event: index }))),
        Kind::Return => Probe::Return(Box::into_raw(Box::new(ReturnProbe {
            rp: Uretprobe {
                u: Uprobe { handler: None, ..u },
                handler: Some(s.handlers.ret),
                entry_handler: s.handlers.ret_entry,
                data_size: s.handlers.data_size,
                maxactive: 0,
                nmissed: 0,
            },
            event: index,
        }))),
    };
    Event {
        name: t.name.clone(),
        group: s.def.group.clone(),
        definition: s.def.text.clone(),
        kind: s.def.kind,
        args: s.def.args.clone(),
        probe,
        file_base: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        filter: s.filter.clone(),
        filter_failed: AtomicU64::new(0),
        filter_passed: AtomicU64::new(0),
        on: AtomicBool::new(true),
        triggers: Vec::new(),
        gated: s.filter.is_some(),
        skipped: AtomicBool::new(t.skipped),
        fixed_len: record::numbers_only(&s.def.args).unwrap_or(0),
    }
}

fn consumer(ev: &Event) -> Consumer {
    match ev.probe {
        Probe::Entry(p) => Consumer::Uprobe(p.cast()),
        Probe::Return(p) => Consumer::Uretprobe(p.cast()),
    }
}

/// Registers every event's probe in one placement batch.
fn register(targets: &[Target], sources: &[Source], settings: &Settings) -> Result<(), String> {
    let mut failed = Vec::new();
    deferred::batch(|| {
        for (i, ev) in events::all().iter().enumerate() {
            if ev.skipped.load(Ordering::Relaxed) {
                continue;
            }
            if let Place::FileOffset { ref_ctr: Some(at), .. } = sources[targets[i].source].def.place {
                semaphore::want(ev.key(), at);
            }
            // SAFETY: the probe objects are leaked, valid for the life of the process.
            match deferred::inside(|| unsafe { registry::register(consumer(ev)) }) {
                Ok(_) => {}
                Err(e) if e.refuses_writable_code() => deferred::disable_for_wx(&e),
                Err(e) => failed.push((i, e)),
            }
        }
    });
    for (i, e) in failed {
        let s = &sources[targets[i].source];
        let at = where_at(&s.def);
        let many = matches!(&s.def.place, Place::Symbol { name, .. } if def::is_glob(name));
        let hint = if many { " (--lenient skips the functions a glob matches that cannot be probed)" } else { "" };
        let e = DefError { at, what: format!("a place a probe can go: {e}{hint}") };
        refuse_shown(&s.origin, &s.def.text, s.unwritten, &e, settings)?;
        // Still here: --lenient skipped it.
        if let Some(ev) = events::all().get(i) {
            ev.skipped.store(true, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The probes of the events placed (an attach session removes them at its end).
pub fn consumers() -> Vec<Consumer> {
    events::all().iter().filter(|e| !e.skipped.load(Ordering::Relaxed)).map(consumer).collect()
}

/// `@+OFFSET` needs where each probed file is mapped: from the mappings, for every event
/// placed now.
fn set_file_bases() {
    let maps = maps::current();
    for ev in events::all() {
        set_file_base(ev, ev.address(), &maps);
    }
}

fn set_file_base(ev: &Event, addr: usize, maps: &[maps::Mapping]) {
    if let Some(m) = maps::find(maps, addr).filter(|_| addr != 0) {
        ev.file_base.store(m.start.wrapping_sub(m.offset), Ordering::Relaxed);
    }
}

/// The registry's hook: an event waiting for its module was placed (at a `dlopen`).
fn on_armed(key: usize, addr: usize) {
    if let Some(ev) = events::all().iter().find(|e| e.key() == key) {
        set_file_base(ev, addr, &maps::current());
    }
}
