//! Timestamps and CPU numbers for records, read on the hit path without a system call and
//! without calling libc.
//!
//! Where the kernel itself keeps time with the TSC (clocksource `tsc`, and the CPU says its
//! TSC is constant and does not stop), a record takes `rdtsc` and the CPU from the thread's
//! rseq area, which glibc registers for every thread it starts and where the kernel keeps the
//! CPU number current; a thread without one takes `rdpid` (or `rdtscp` where there is no
//! `rdpid`): the CPU number Linux keeps in IA32_TSC_AUX. The drain thread turns counts into
//! CLOCK_MONOTONIC nanoseconds with a line through two points read from the vDSO's
//! `__vdso_clock_gettime` (found through `getauxval(AT_SYSINFO_EHDR)` at start-up): the
//! start, and the moment of each drain pass. Elsewhere records call `__vdso_clock_gettime`
//! directly (no system call either, the vDSO is not probeable) and `__vdso_getcpu`.

use core::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};

use crate::base::{elf, maps, sys};

type ClockGettime = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int;
type Getcpu = unsafe extern "C" fn(*mut u32, *mut u32, *mut libc::c_void) -> libc::c_int;

static USE_TSC: AtomicBool = AtomicBool::new(false);
/// `rdpid` reads IA32_TSC_AUX alone: with `rdtsc` it avoids `rdtscp`, which waits for every
/// earlier instruction (the stub's register saves) and costs several times as much here.
static USE_RDPID: AtomicBool = AtomicBool::new(false);
/// Where each thread's `struct rseq` `cpu_id` lies from its thread pointer (glibc's
/// `__rseq_offset`, plus 4), or `NO_RSEQ`: the kernel keeps the word current as the thread
/// moves, so one load gives the CPU where `rdpid` costs about 2 ns here. A thread whose
/// area is not registered reads -1 or -2 there, and takes `rdpid`.
static RSEQ_CPU: AtomicIsize = AtomicIsize::new(NO_RSEQ);
const NO_RSEQ: isize = isize::MIN;
static VDSO_GETTIME: AtomicUsize = AtomicUsize::new(0);
static VDSO_GETCPU: AtomicUsize = AtomicUsize::new(0);
/// The two calibration points (counter, ns): the start, and the latest drain pass.
static TSC0: AtomicU64 = AtomicU64::new(0);
static NS0: AtomicU64 = AtomicU64::new(0);
static TSC1: AtomicU64 = AtomicU64::new(0);
static NS1: AtomicU64 = AtomicU64::new(0);

/// Which clock records use, and where their CPU comes from, for `--verbose` and the claim
/// of docs/events.md (The stream).
pub fn describe() -> String {
    let cpu = match (RSEQ_CPU.load(Ordering::Relaxed) != NO_RSEQ, USE_RDPID.load(Ordering::Relaxed)) {
        (true, _) => "the CPU from the thread's rseq area",
        (false, true) => "the CPU from rdpid",
        (false, false) => "the CPU from rdtscp",
    };
    if USE_TSC.load(Ordering::Relaxed) {
        format!("rdtsc, calibrated against the vDSO's CLOCK_MONOTONIC, {cpu}")
    } else if VDSO_GETTIME.load(Ordering::Relaxed) != 0 {
        "the vDSO's clock_gettime(CLOCK_MONOTONIC) and getcpu".into()
    } else {
        "clock_gettime(CLOCK_MONOTONIC) by system call (no vDSO)".into()
    }
}

/// Finds the vDSO's functions and decides the clock (start-up).
pub fn init() {
    // SAFETY: getauxval has no preconditions.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize;
    let vdso = maps::current().into_iter().find(|m| m.start == base as u64 && base != 0);
    if let Some(m) = vdso {
        // SAFETY: the vDSO is mapped readable for the life of the process.
        let image = unsafe { core::slice::from_raw_parts(m.start as *const u8, (m.end - m.start) as usize) };
        if let Ok(info) = elf::ElfInfo::parse(image) {
            let at = |name: &str| info.symbol(name).map_or(0, |s| base + s.value as usize);
            VDSO_GETTIME.store(at("__vdso_clock_gettime"), Ordering::Relaxed);
            VDSO_GETCPU.store(at("__vdso_getcpu"), Ordering::Relaxed);
        }
    }
    let clocksource = sys::read_file(c"/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .map(|b| String::from_utf8_lossy(&b).trim() == "tsc")
        .unwrap_or(false);
    let flags = sys::read_file(c"/proc/cpuinfo")
        .map(|b| {
            let text = String::from_utf8_lossy(&b);
            let line = text.lines().find(|l| l.starts_with("flags")).unwrap_or("").to_string();
            ["rdtscp", "constant_tsc", "nonstop_tsc"].iter().all(|f| line.split_whitespace().any(|w| w == *f))
        })
        .unwrap_or(false);
    USE_TSC.store(clocksource && flags, Ordering::Relaxed);
    let rdpid = sys::read_file(c"/proc/cpuinfo")
        .map(|b| {
            String::from_utf8_lossy(&b)
                .lines()
                .find(|l| l.starts_with("flags"))
                .is_some_and(|l| l.split_whitespace().any(|w| w == "rdpid"))
        })
        .unwrap_or(false);
    USE_RDPID.store(rdpid, Ordering::Relaxed);
    RSEQ_CPU.store(rseq_cpu_offset().unwrap_or(NO_RSEQ), Ordering::Relaxed);
    let (t, _) = now();
    let ns = monotonic_ns();
    TSC0.store(t, Ordering::Relaxed);
    NS0.store(ns, Ordering::Relaxed);
    TSC1.store(t, Ordering::Relaxed);
    NS1.store(ns, Ordering::Relaxed);
}

/// CLOCK_MONOTONIC in ns, through the vDSO where there is one (normal context).
pub fn monotonic_ns() -> u64 {
    let f = VDSO_GETTIME.load(Ordering::Relaxed);
    if f == 0 {
        return sys::monotonic_ns();
    }
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: the vDSO's clock_gettime, with a valid timespec to fill.
    unsafe { core::mem::transmute::<usize, ClockGettime>(f)(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Where the `cpu_id` of the threads' rseq areas lies from the thread pointer, if glibc
/// registered one for the thread at hand (start-up): `__rseq_size` non-zero, and the word
/// read here the CPU the thread runs on.
fn rseq_cpu_offset() -> Option<isize> {
    // SAFETY: dlsym with RTLD_DEFAULT and C strings; the symbols, where glibc has them
    // (2.35 and later), are a ptrdiff_t and an unsigned int it sets before `main`.
    let (offset, size) = unsafe {
        let offset = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()) as *const isize;
        let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()) as *const u32;
        if offset.is_null() || size.is_null() {
            return None;
        }
        (offset.read(), size.read())
    };
    // `cpu_id_start` then `cpu_id`, both 32-bit, at the start of `struct rseq`.
    let cpu_id = offset.checked_add(4)?;
    // A move to another CPU between the two reads fails one try, not the next.
    let agrees = || {
        let here = rseq_cpu(cpu_id);
        here >= 0 && here as u32 == cpu_by_system_call()
    };
    (size >= 8 && (0..3).any(|_| agrees())).then_some(cpu_id)
}

/// The CPU from the calling thread's rseq area, where it has one (hit path: one load).
#[inline(always)]
fn cpu_from_rseq() -> Option<u32> {
    let rseq = RSEQ_CPU.load(Ordering::Relaxed);
    if rseq == NO_RSEQ {
        return None;
    }
    let cpu = rseq_cpu(rseq);
    (cpu >= 0).then_some(cpu as u32)
}

/// The rseq `cpu_id` word at `offset` from the thread pointer.
#[inline(always)]
fn rseq_cpu(offset: isize) -> i32 {
    let cpu: i32;
    // SAFETY: the word lies in the calling thread's own thread control block, where glibc
    // keeps its rseq area for every thread it starts (`rseq_cpu_offset`).
    unsafe {
        core::arch::asm!("mov {cpu:e}, dword ptr fs:[{off}]", off = in(reg) offset, cpu = out(reg) cpu,
            options(nostack, readonly, preserves_flags))
    };
    cpu
}

/// The CPU as the kernel's `getcpu` system call gives it (start-up).
fn cpu_by_system_call() -> u32 {
    let mut cpu = 0;
    // SAFETY: getcpu fills the place given; the cache argument is unused since Linux 2.6.24.
    unsafe { libc::syscall(libc::SYS_getcpu, &mut cpu as *mut u32, 0usize, 0usize) };
    cpu
}

#[inline(always)]
fn rdtscp() -> (u64, u32) {
    let (lo, hi, aux): (u32, u32, u32);
    // SAFETY: rdtscp reads the time-stamp counter and IA32_TSC_AUX; checked at start-up.
    unsafe { core::arch::asm!("rdtscp", out("eax") lo, out("edx") hi, out("ecx") aux, options(nomem, nostack)) };
    ((u64::from(hi) << 32) | u64::from(lo), aux & 0xfff)
}

#[inline(always)]
fn rdtsc_rdpid() -> (u64, u32) {
    let (lo, hi, aux): (u32, u32, u64);
    // SAFETY: rdtsc reads the time-stamp counter, rdpid IA32_TSC_AUX; checked at start-up.
    unsafe {
        core::arch::asm!("rdtsc", "rdpid {aux}", out("eax") lo, out("edx") hi, aux = out(reg) aux, options(nomem, nostack))
    };
    ((u64::from(hi) << 32) | u64::from(lo), aux as u32 & 0xfff)
}

/// The clock's reading and the CPU, for a record (hit path: no system call, no libc).
#[inline(always)]
pub fn now() -> (u64, u32) {
    if USE_TSC.load(Ordering::Relaxed) {
        if let Some(cpu) = cpu_from_rseq() {
            return (rdtsc(), cpu);
        }
        if USE_RDPID.load(Ordering::Relaxed) {
            return rdtsc_rdpid();
        }
        return rdtscp();
    }
    now_without_tsc()
}

/// [`now`] without the TSC: the vDSO's functions, called with the vector registers saved
/// (the hit path may not have saved them).
#[cold]
fn now_without_tsc() -> (u64, u32) {
    let mut cpu = 0u32;
    let mut ns = 0;
    crate::insn::vector::saving_vectors(|| {
        let getcpu = VDSO_GETCPU.load(Ordering::Relaxed);
        if getcpu != 0 {
            // SAFETY: the vDSO's getcpu, with a valid place for the CPU number.
            unsafe {
                core::mem::transmute::<usize, Getcpu>(getcpu)(&mut cpu, core::ptr::null_mut(), core::ptr::null_mut())
            };
        }
        ns = monotonic_ns();
    });
    (ns, cpu)
}

/// The CPU the thread runs on, without reading the clock (hit path): its rseq area's, or
/// `rdpid`, or `rdtscp` where there is no `rdpid`, or the vDSO's `getcpu`.
#[inline(always)]
pub fn cpu() -> u32 {
    if let Some(cpu) = cpu_from_rseq() {
        return cpu;
    }
    if USE_TSC.load(Ordering::Relaxed) && USE_RDPID.load(Ordering::Relaxed) {
        let aux: u64;
        // SAFETY: rdpid reads IA32_TSC_AUX; checked at start-up.
        unsafe { core::arch::asm!("rdpid {aux}", aux = out(reg) aux, options(nomem, nostack)) };
        return aux as u32 & 0xfff;
    }
    now().1
}

/// A reading for measuring how long something took on one thread (hit path): the TSC alone
/// where records use it, CLOCK_MONOTONIC ns otherwise (see [`ticks_are_ns`]).
#[inline(always)]
pub fn ticks() -> u64 {
    if USE_TSC.load(Ordering::Relaxed) {
        return rdtsc();
    }
    vector_free_ns()
}

/// The time-stamp counter, where `USE_TSC` says records use it.
#[inline(always)]
fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc reads the time-stamp counter; checked at start-up.
    unsafe { core::arch::asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack)) };
    (u64::from(hi) << 32) | u64::from(lo)
}

/// [`monotonic_ns`] from a hit path that may not touch the vector registers (the compiler
/// clears the `timespec` with one), where the TSC is not used.
#[cold]
fn vector_free_ns() -> u64 {
    let mut ns = 0;
    crate::insn::vector::saving_vectors(|| ns = monotonic_ns());
    ns
}

/// Whether [`ticks`] are nanoseconds already (no TSC).
pub fn ticks_are_ns() -> bool {
    !USE_TSC.load(Ordering::Relaxed)
}

/// Takes a new calibration point (drain thread, before it converts a pass's records).
pub fn calibrate() {
    if USE_TSC.load(Ordering::Relaxed) {
        let (t, _) = rdtscp();
        NS1.store(monotonic_ns(), Ordering::Relaxed);
        TSC1.store(t, Ordering::Relaxed);
    }
}

/// A record's clock reading in CLOCK_MONOTONIC nanoseconds.
pub fn to_ns(reading: u64) -> u64 {
    if !USE_TSC.load(Ordering::Relaxed) {
        return reading;
    }
    let (t0, n0) = (TSC0.load(Ordering::Relaxed), NS0.load(Ordering::Relaxed));
    let (t1, n1) = (TSC1.load(Ordering::Relaxed), NS1.load(Ordering::Relaxed));
    convert(reading, (t0, n0), (t1, n1))
}

/// The line through two (count, ns) points, at `reading` (pure).
pub fn convert(reading: u64, (t0, n0): (u64, u64), (t1, n1): (u64, u64)) -> u64 {
    if t1 <= t0 || n1 <= n0 {
        return n0;
    }
    let dt = i128::from(reading) - i128::from(t0);
    let ns = i128::from(n0) + dt * i128::from(n1 - n0) / i128::from(t1 - t0);
    ns.max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_through_the_calibration_line() {
        assert_eq!(convert(3000, (1000, 10), (5000, 1010)), 510);
        assert_eq!(convert(1000, (1000, 10), (1000, 10)), 10);
        assert_eq!(convert(500, (1000, 1000), (2000, 2000)), 500);
    }
}
