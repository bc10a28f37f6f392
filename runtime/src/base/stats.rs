//! The runtime's own counters: system calls by kind, reads of the address space, traps the
//! runtime took itself, and what placing probes cost. `--stats` prints them at exit; the
//! benchmark and the tests read that line. Relaxed atomics, none of them on a hit's fast path.

use core::fmt::Write;
use core::sync::atomic::{AtomicU64, Ordering};

/// Kinds of system calls, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Read,
    Write,
    Open,
    Close,
    Mmap,
    Munmap,
    Mprotect,
    Membarrier,
    Futex,
    Other,
}

const CALLS: [(Call, &str); 10] = [
    (Call::Read, "read"),
    (Call::Write, "write"),
    (Call::Open, "openat"),
    (Call::Close, "close"),
    (Call::Mmap, "mmap"),
    (Call::Munmap, "munmap"),
    (Call::Mprotect, "mprotect"),
    (Call::Membarrier, "membarrier"),
    (Call::Futex, "futex"),
    (Call::Other, "other"),
];

static SYSCALLS: [AtomicU64; CALLS.len()] = [const { AtomicU64::new(0) }; CALLS.len()];

pub fn count_syscall(kind: Call) {
    SYSCALLS[kind as usize].fetch_add(1, Ordering::Relaxed);
}

/// Counters other than system calls.
pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// `--stats`: print [`summary`] at exit.
pub static PRINT: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Reads of `/proc/self/maps`.
pub static MAPS_READS: Counter = Counter::new();
/// SIGTRAPs taken by a thread while it was inside the runtime (placing probes, reporting):
/// the runtime hitting a probe with a trap.
pub static TRAPS_IN_RUNTIME: Counter = Counter::new();
/// Placement batches written, and the time spent preparing and writing them.
pub static BATCHES: Counter = Counter::new();
pub static PLACEMENT_NS: Counter = Counter::new();
/// Probe points armed, and how many of them with a jump.
pub static POINTS_ARMED: Counter = Counter::new();
pub static JUMPS_WRITTEN: Counter = Counter::new();

/// A snapshot of the system call counters, to count what one stretch of work made.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct Syscalls([u64; CALLS.len()]);

impl Syscalls {
    pub fn now() -> Syscalls {
        let mut s = Syscalls::default();
        for (i, c) in SYSCALLS.iter().enumerate() {
            s.0[i] = c.load(Ordering::Relaxed);
        }
        s
    }

    pub fn since(self, earlier: Syscalls) -> Syscalls {
        let mut s = Syscalls::default();
        for i in 0..CALLS.len() {
            s.0[i] = self.0[i].wrapping_sub(earlier.0[i]);
        }
        s
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub fn get(&self, kind: Call) -> u64 {
        self.0[kind as usize]
    }
}

/// Syscalls made while placing probes (all batches).
static PLACEMENT_SYSCALLS: [AtomicU64; CALLS.len()] = [const { AtomicU64::new(0) }; CALLS.len()];

/// Adds the system calls of one placement batch.
pub fn add_placement_syscalls(s: Syscalls) {
    for (i, n) in s.0.iter().enumerate() {
        PLACEMENT_SYSCALLS[i].fetch_add(*n, Ordering::Relaxed);
    }
}

/// The counters of the `--stats` line, read at one moment (an attach session reports what
/// happened since it started).
#[derive(Clone, Debug, Default)]
pub struct Counters {
    placement_ns: u64,
    batches: u64,
    points: u64,
    jumps: u64,
    placement_syscalls: [u64; CALLS.len()],
    maps_reads: u64,
    traps: u64,
}

impl Counters {
    pub fn now() -> Counters {
        Counters {
            placement_ns: PLACEMENT_NS.get(),
            batches: BATCHES.get(),
            points: POINTS_ARMED.get(),
            jumps: JUMPS_WRITTEN.get(),
            placement_syscalls: core::array::from_fn(|i| PLACEMENT_SYSCALLS[i].load(Ordering::Relaxed)),
            maps_reads: MAPS_READS.get(),
            traps: TRAPS_IN_RUNTIME.get(),
        }
    }
}

/// The `--stats` line (without the `uprobe-run: ` prefix).
pub fn summary() -> String {
    summary_since(&Counters::default())
}

/// The `--stats` line for what happened since `start`.
pub fn summary_since(start: &Counters) -> String {
    let now = Counters::now();
    let mut line = String::new();
    let placement: Vec<u64> =
        now.placement_syscalls.iter().zip(&start.placement_syscalls).map(|(n, s)| n.saturating_sub(*s)).collect();
    let _ = write!(
        line,
        "stats: placement {:.3} ms in {} batches, {} points armed ({} jumps), syscalls {}",
        now.placement_ns.saturating_sub(start.placement_ns) as f64 / 1e6,
        now.batches.saturating_sub(start.batches),
        now.points.saturating_sub(start.points),
        now.jumps.saturating_sub(start.jumps),
        placement.iter().sum::<u64>(),
    );
    let mut sep = " (";
    for ((_, name), n) in CALLS.iter().zip(&placement) {
        if *n > 0 {
            let _ = write!(line, "{sep}{name} {n}");
            sep = ", ";
        }
    }
    if sep == ", " {
        line.push(')');
    }
    let _ = write!(
        line,
        "; maps reads {}; SIGTRAPs in the runtime {}",
        now.maps_reads.saturating_sub(start.maps_reads),
        now.traps.saturating_sub(start.traps)
    );
    line
}
