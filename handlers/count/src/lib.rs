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
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use uprobe_sdk::{uprobe_println, Line, Probe, ProbeList, PtRegs};

/// One probe and what is known about it. Allocated once, at init, and never freed.
struct Entry {
    spec: String,
    /// The probed address, for the table: known at registration.
    address: AtomicU64,
    /// State: the hit counter.
    probe: Probe<AtomicU64>,
}

static ENTRIES: OnceLock<&'static [Entry]> = OnceLock::new();
/// Every probe of `ENTRIES`, removed together at exit.
static ALL: OnceLock<ProbeList> = OnceLock::new();

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
    let entries: &'static [Entry] = Box::leak(specs.into_iter().map(entry).collect());
    for (n, e) in entries.iter().enumerate() {
        if let Err(errno) = e.probe.register() {
            uprobe_println!("count: cannot probe {}: {errno}", e.spec);
            entries[..n].iter().for_each(|e| e.probe.unregister());
            return 1;
        }
        let address = match e.probe.vaddr() {
            0 => uprobe_sdk::lookup(&e.spec).unwrap_or(0),
            vaddr => vaddr,
        };
        e.address.store(address, Ordering::Relaxed);
    }
    // A second init (not expected) keeps the first set of probes for the table.
    let _ = ALL.set(ProbeList::new(entries.iter().map(|e| &e.probe)));
    let _ = ENTRIES.set(entries);
    0
}

fn entry(spec: Spec) -> Entry {
    let probe = match spec.target {
        Target::Address(vaddr) => Probe::at_address(vaddr, AtomicU64::new(0), on_hit),
        Target::Symbol { name, offset } => {
            // `parse_list` refuses NUL bytes; the name lives as long as the probe: for good.
            let name = CString::new(name).unwrap_or_default();
            Probe::at_symbol(Box::leak(name.into_boxed_c_str()), offset, AtomicU64::new(0), on_hit)
        }
    };
    Entry { spec: spec.text, address: AtomicU64::new(0), probe }
}

fn exit() {
    let Some(entries) = ENTRIES.get() else { return };
    // Unregistered first, all at once: on return no handler of a probe runs any more, so the
    // counts read next are final, and probes at one address (aliases) stopped together. Printing with the probes
    // still armed would also hit them (the table's formatting calls libc's memcpy).
    if let Some(all) = ALL.get() {
        all.unregister();
    }
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
}
