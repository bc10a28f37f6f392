//! [`Probe`]: a `struct uprobe` with the handler's own state, handed back to the handler.

use crate::abi::{PtRegs, Uprobe};
use crate::Errno;
use core::cell::UnsafeCell;
use core::ffi::CStr;

/// What a [`Probe`] calls on each hit, in signal context: no allocation, no locks,
/// async-signal-safe calls only. The probe's `state` is shared by every thread that hits it,
/// so change it through atomics.
pub type OnHit<T> = fn(probe: &Probe<T>, regs: &mut PtRegs);

/// A `struct uprobe` followed by user state.
///
/// The `Uprobe` comes first, so the `struct uprobe *` the runtime passes to the handler is a
/// pointer to the whole `Probe`; a generic trampoline casts it back and calls the Rust
/// handler with `&Probe<T>`.
///
/// The runtime keeps a pointer to a registered probe, so registration takes `&'static self`:
/// keep probes in a `static` or leak them (`Box::leak`) at init.
///
/// ```no_run
/// use core::sync::atomic::{AtomicU64, Ordering};
/// use uprobe_sdk::{Probe, PtRegs};
///
/// fn on_hit(probe: &Probe<AtomicU64>, _regs: &mut PtRegs) {
///     probe.state.fetch_add(1, Ordering::Relaxed);
/// }
///
/// static MAIN: Probe<AtomicU64> = Probe::at_symbol(c"main", 0, AtomicU64::new(0), on_hit);
///
/// #[no_mangle]
/// pub extern "C" fn uprobe_init() -> i32 {
///     match MAIN.register() {
///         Ok(()) => 0,
///         Err(e) => {
///             uprobe_sdk::uprobe_println!("cannot probe main: {e}");
///             1
///         }
///     }
/// }
/// ```
#[repr(C)]
pub struct Probe<T> {
    raw: UnsafeCell<Uprobe>,
    on_hit: OnHit<T>,
    pub state: T,
}

// SAFETY: after construction the `Uprobe` is written only by the runtime, inside
// register/unregister, which it serialises itself; everything else about a `Probe` is shared
// immutably, or through `T`, which must be `Sync` itself.
unsafe impl<T: Sync> Sync for Probe<T> {}

// SAFETY: the raw pointers in `Uprobe` are a `&'static CStr` and runtime-owned slots, neither
// tied to a thread.
unsafe impl<T: Send> Send for Probe<T> {}

impl<T> Probe<T> {
    /// A probe on `symbol` (`"sym"` or `"module:sym"`) plus `offset` bytes.
    pub const fn at_symbol(symbol: &'static CStr, offset: u64, state: T, on_hit: OnHit<T>) -> Self {
        let mut raw = Self::raw();
        raw.symbol_name = symbol.as_ptr();
        raw.offset = offset;
        Self { raw: UnsafeCell::new(raw), on_hit, state }
    }

    /// A probe on the run-time address `vaddr`.
    pub const fn at_address(vaddr: u64, state: T, on_hit: OnHit<T>) -> Self {
        let mut raw = Self::raw();
        raw.vaddr = vaddr;
        Self { raw: UnsafeCell::new(raw), on_hit, state }
    }

    const fn raw() -> Uprobe {
        let mut raw = Uprobe::zeroed();
        raw.handler = Some(trampoline::<T>);
        raw
    }

    /// Registers the probe with the runtime. Not for signal context (from a handler the
    /// runtime defers the call and returns `EINPROGRESS`).
    pub fn register(&'static self) -> Result<(), Errno> {
        // SAFETY: `self` is 'static, so the probe stays valid and in place for good.
        Errno::from_result(unsafe { crate::sys::register(self.raw.get()) })
    }

    /// Removes the probe; its handler is not called any more once this returns.
    pub fn unregister(&'static self) {
        // SAFETY: `self` is 'static; the runtime ignores probes it does not know.
        unsafe { crate::sys::unregister(self.raw.get()) }
    }

    /// The probed address: as given, or as the runtime filled it in at registration.
    /// 0 if neither.
    pub fn vaddr(&self) -> u64 {
        // SAFETY: a plain read of one field; the runtime writes the probe only inside
        // register/unregister, which do not run concurrently with set-up code.
        unsafe { (*self.raw.get()).vaddr }
    }

    /// The `struct uprobe *` the runtime knows this probe by.
    pub fn as_raw(&self) -> *mut Uprobe {
        self.raw.get()
    }
}

/// Probes to remove together, gathered at set-up: [`ProbeList::unregister`] then allocates
/// nothing (with every libc function probed, a `malloc` before the probes are gone would hit
/// them), probes at one address stop in the same instant (their handlers saw the same hits),
/// and the runtime waits one grace period for all (`unregister_uprobes`).
pub struct ProbeList(Vec<*mut Uprobe>);

// SAFETY: the pointers are only handed to the runtime, which serialises (un)registration.
unsafe impl Send for ProbeList {}
// SAFETY: as above; `unregister` takes `&self` and writes nothing of the list.
unsafe impl Sync for ProbeList {}

impl ProbeList {
    pub fn new<T: 'static>(probes: impl IntoIterator<Item = &'static Probe<T>>) -> ProbeList {
        ProbeList(probes.into_iter().map(|p| p.raw.get()).collect())
    }

    /// Removes every probe of the list at once; no handler of theirs runs once this returns.
    pub fn unregister(&self) {
        // SAFETY: every probe is 'static (see `new`); the runtime ignores probes it does not
        // know, and only reads the list.
        unsafe { crate::sys::unregister_all(&self.0) }
    }
}

/// The C handler of every `Probe<T>`. Signal context.
extern "C" fn trampoline<T>(u: *mut Uprobe, regs: *mut PtRegs) {
    // The runtime calls this only for probes registered through `Probe::register`, whose
    // `Uprobe` is the first field of a `#[repr(C)] Probe<T>` (UnsafeCell is transparent).
    // SAFETY: so the cast is sound; `regs` is the thread's frame, exclusive for the call.
    let (probe, regs) = unsafe { (&*(u as *const Probe<T>), &mut *regs) };
    (probe.on_hit)(probe, regs);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::fake::{CALLS, REGISTER_RESULT};
    use core::sync::atomic::{AtomicU64, Ordering};

    fn count(probe: &Probe<AtomicU64>, regs: &mut PtRegs) {
        probe.state.fetch_add(regs.rdi, Ordering::Relaxed);
        regs.rax = 42;
    }

    #[test]
    fn trampoline_hands_back_the_whole_probe() {
        let probe: &'static Probe<AtomicU64> = Box::leak(Box::new(Probe::at_address(0x1000, AtomicU64::new(0), count)));
        let mut regs = PtRegs { rdi: 3, ..PtRegs::default() };
        // The runtime's view: a handler taking the `struct uprobe *`.
        // SAFETY: test-only read of a probe nobody else sees.
        let handler = unsafe { (*probe.as_raw()).handler }.unwrap();
        for _ in 0..2 {
            // SAFETY: the handler is the SDK's trampoline, given the probe it was made for.
            unsafe { handler(probe.as_raw(), &mut regs) };
        }
        assert_eq!(probe.state.load(Ordering::Relaxed), 6);
        assert_eq!(regs.rax, 42);
        assert_eq!(probe.vaddr(), 0x1000);
    }

    #[test]
    fn symbol_probe_carries_name_and_offset() {
        let probe = Probe::at_symbol(c"libc.so.6:malloc", 4, (), |_, _| {});
        // SAFETY: test-only read of a probe nobody else sees.
        let raw = unsafe { &*probe.as_raw() };
        // SAFETY: set from a &'static CStr in `at_symbol`.
        let name = unsafe { CStr::from_ptr(raw.symbol_name) };
        assert_eq!(name, c"libc.so.6:malloc");
        assert_eq!(raw.offset, 4);
        assert_eq!(raw.vaddr, 0);
        assert!(raw.reserved.iter().all(|p| p.is_null()));
    }

    #[test]
    fn register_maps_negative_errno() {
        let probe: &'static Probe<()> = Box::leak(Box::new(Probe::at_address(1, (), |_, _| {})));
        REGISTER_RESULT.with(|r| *r.borrow_mut() = -libc::EINVAL);
        assert_eq!(probe.register(), Err(Errno(libc::EINVAL)));
        REGISTER_RESULT.with(|r| *r.borrow_mut() = 0);
        assert_eq!(probe.register(), Ok(()));
        probe.unregister();
        let addr = probe.as_raw() as usize;
        let calls = CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()));
        assert_eq!(calls, [(true, addr), (true, addr), (false, addr)]);
    }
}
