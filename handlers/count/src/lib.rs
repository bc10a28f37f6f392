//! `count`: a handler library that counts hits per probe and prints a table at exit.
//!
//! ```text
//! uprobe-run --handlers libcount.so --param probes=main,work+4,libc.so.6:puts,0x401136 ./prog
//! ```
//!
//! Each spec is `SYMBOL`, `SYMBOL+OFF`, `MODULE:SYMBOL[+OFF]` or `0xADDRESS`; OFF is decimal or
//! 0x-hex. Long lists go in a file, one spec a line (`#` starts a comment line):
//! `--param probes-file=FILE`, read after `probes`. At exit, one line per probe in the order given:
//!
//! ```text
//! count: PROBE                                    ADDRESS             HITS
//! count: main                                     0x000055d0c0a01139     1
//! ```
#![deny(unsafe_code)]

mod spec;

use spec::{Spec, Target};
use std::ffi::CStr;
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use uprobe_sdk::{uprobe_println, Line, Probe, ProbeList, PtRegs};

/// One probe and what is known about it.
struct Entry {
    spec: String,
    /// The probed address, for the table: known at registration.
    address: AtomicU64,
    /// State: the hit counter.
    probe: Probe<AtomicU64>,
}

/// The probes and their names, from init to exit. Leaked at init: the runtime keeps pointers
/// to a probe and its name until the probe is unregistered.
struct Table {
    entries: &'static [Entry],
    names: Vec<&'static CStr>,
    /// Every probe of `entries`, removed together.
    all: ProbeList,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);
/// A table whose probes are all unregistered, given back when the library is unloaded (the
/// end of an attach session, which would otherwise leave it in the process for good: 60 kB a
/// session with 300 probes) or the process exits.
static RETIRED: Mutex<Option<Table>> = Mutex::new(None);

/// Signal context: one relaxed atomic add, nothing else.
fn on_hit(probe: &Probe<AtomicU64>, _regs: &mut PtRegs) {
    probe.state.fetch_add(1, Ordering::Relaxed);
}

/// The probe list: `--param probes=` and the lines of `--param probes-file=`, in that order.
fn probe_list() -> Result<String, String> {
    let mut list = uprobe_sdk::param("probes").unwrap_or_default();
    if let Some(path) = uprobe_sdk::param("probes-file") {
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read probes-file {path}: {e}"))?;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            list.push(',');
            list.push_str(line);
        }
    }
    Ok(list)
}

fn init() -> i32 {
    const NONE: &str = "count: no probes given (--param probes=SPEC[,SPEC...] or --param probes-file=FILE)";
    let list = match probe_list() {
        Ok(list) => list,
        Err(why) => {
            uprobe_println!("count: {why}");
            return 1;
        }
    };
    let specs = match spec::parse_list(&list) {
        Ok(specs) if specs.is_empty() => {
            uprobe_println!("{NONE}");
            return 1;
        }
        Ok(specs) => specs,
        Err(why) => {
            uprobe_println!("count: {why}");
            return 1;
        }
    };
    let (entries, names): (Vec<Entry>, Vec<Option<&'static CStr>>) = specs.into_iter().map(entry).unzip();
    let entries: &'static [Entry] = Box::leak(entries.into_boxed_slice());
    let table = Table {
        entries,
        names: names.into_iter().flatten().collect(),
        all: ProbeList::new(entries.iter().map(|e| &e.probe)),
    };
    for e in entries.iter() {
        if let Err(errno) = e.probe.register() {
            uprobe_println!("count: cannot probe {}: {errno}", e.spec);
            table.all.unregister();
            retire(table);
            return 1;
        }
        let address = match e.probe.vaddr() {
            0 => uprobe_sdk::lookup(&e.spec).unwrap_or(0),
            vaddr => vaddr,
        };
        e.address.store(address, Ordering::Relaxed);
    }
    let mut current = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    // A second init (not expected) keeps the first set of probes for the table.
    if current.is_none() {
        *current = Some(table);
    }
    0
}

/// A probe for `spec`, and its symbol's name (leaked: see `Table`).
fn entry(spec: Spec) -> (Entry, Option<&'static CStr>) {
    let (probe, name) = match spec.target {
        Target::Address(vaddr) => (Probe::at_address(vaddr, AtomicU64::new(0), on_hit), None),
        Target::Symbol { name, offset } => {
            // `parse_list` refuses NUL bytes.
            let name: &'static CStr = Box::leak(CString::new(name).unwrap_or_default().into_boxed_c_str());
            (Probe::at_symbol(name, offset, AtomicU64::new(0), on_hit), Some(name))
        }
    };
    (Entry { spec: spec.text, address: AtomicU64::new(0), probe }, name)
}

/// Keeps `table`, whose probes are all unregistered, for the library's unloading.
fn retire(table: Table) {
    *RETIRED.lock().unwrap_or_else(|e| e.into_inner()) = Some(table);
}

fn exit() {
    let Some(table) = TABLE.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
    let entries = table.entries;
    // Unregistered first, all at once: on return no handler of a probe runs any more, so the
    // counts read next are final, and probes at one address (aliases) stopped together. Printing with the probes
    // still armed would also hit them (the table's formatting calls libc's memcpy).
    table.all.unregister();
    let mut line = Line::new();
    let _ = spec::write_header(&mut line);
    line.emit();
    for e in entries.iter() {
        line.clear();
        let hits = e.probe.state.load(Ordering::Relaxed);
        // A probe that waited for its module has its address once it was placed.
        let address = match e.address.load(Ordering::Relaxed) {
            0 => e.probe.vaddr(),
            known => known,
        };
        let _ = spec::write_row(&mut line, &e.spec, address, hits);
        line.emit();
    }
    retire(table);
}

/// Gives back a retired table (see `RETIRED`): run by the dynamic loader when it unloads the
/// library, or at the process's exit. Normal context: never from a fatal signal's report.
extern "C" fn give_back() {
    let Some(table) = RETIRED.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
    free(table);
}

#[allow(unsafe_code)]
fn free(table: Table) {
    let entries = table.entries as *const [Entry] as *mut [Entry];
    // Every probe among the entries is unregistered: the runtime holds no pointer to it.
    // SAFETY: leaked by Box::leak in `init`; taken out of RETIRED, their last reference.
    drop(unsafe { Box::from_raw(entries) });
    for name in table.names {
        // SAFETY: leaked in `entry`, referred to only by the probes just given back.
        drop(unsafe { Box::from_raw(name as *const CStr as *mut CStr) });
    }
}

/// The exports the runtime looks up with dlsym on this library's handle.
mod exports {
    // `no_mangle`: uprobe.h fixes these names, and nothing in this library defines them
    // otherwise.
    #[allow(unsafe_code)]
    #[no_mangle]
    pub extern "C" fn uprobe_init() -> core::ffi::c_int {
        super::init()
    }

    // See `uprobe_init`.
    #[allow(unsafe_code)]
    #[no_mangle]
    pub extern "C" fn uprobe_exit() {
        super::exit()
    }

    // A destructor of the library (`.fini_array`: dlclose, or exit).
    #[allow(unsafe_code)]
    #[used]
    #[link_section = ".fini_array"]
    static GIVE_BACK: extern "C" fn() = super::give_back;
}
