//! Return probes.
//!
//! At an entry hit of a return-probed function the runtime saves the real return address in a
//! per-thread, bounded, preallocated return stack and replaces it, on the program's stack,
//! with the address of [`uprobe_ret_trampoline`]. That trampoline is plain code: when the
//! function returns into it, it saves the general registers, the flags and xmm0-15 (what a
//! handler compiled for x86-64 may change), calls [`return_hit`] in normal thread context,
//! which runs the return handlers with the registers as a `struct pt_regs`, and resumes at the
//! real return address.
//! A return costs a few dozen nanoseconds, not a signal.
//!
//! Each record remembers the stack slot of the address it replaced. A record whose slot lies
//! below the stack pointer of a later entry or return belongs to a frame that was left without
//! returning (`longjmp`, `siglongjmp`, an exception) and is dropped. Code that reads return
//! addresses (the C++ unwinder, `backtrace()`, `pthread_exit`'s forced unwind) is interposed:
//! the real addresses go back on the stack before it runs; after `backtrace()` returns, and
//! when an exception is caught, the frames still live are hooked again, so their returns keep
//! being counted.
//!
//! The records of a thread are touched by entry hits (signal context), by the trampoline and
//! by the interposed functions; all of them run with the thread marked busy (see `trap`), so
//! they never interleave.

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::abi::{PtRegs, Uretprobe, UretprobeInstance};
use crate::registry::{self, Consumer, ProbePoint};
use crate::thread::ThreadState;
use crate::{api, output, sys};

/// Pending returns one thread can hold, over all return probes.
const MAX_FRAMES: usize = 256;
/// Bytes for the instances (`struct uretprobe_instance` and its data) of one thread.
const ARENA_SIZE: usize = 32 * 1024;
/// `maxactive` when the probe leaves it at 0 or below: pending returns per thread and probe.
pub const DEFAULT_MAXACTIVE: usize = 64;
/// The largest `data_size` a return probe may ask for.
pub const MAX_DATA_SIZE: usize = 4096;

#[derive(Clone, Copy)]
struct Frame {
    rp: *mut Uretprobe,
    /// The entry probe point: its consumer list says whether `rp` is still registered.
    pp: *const ProbePoint,
    /// Where on the program's stack the return address was replaced.
    slot: usize,
    /// The real return address.
    orig: usize,
    /// Offset of the instance in the arena.
    instance: usize,
}

const NO_FRAME: Frame = Frame { rp: core::ptr::null_mut(), pp: core::ptr::null(), slot: 0, orig: 0, instance: 0 };

/// A thread's pending returns (kept in its `thread::ThreadState`).
pub struct ReturnStack {
    frames: [Frame; MAX_FRAMES],
    depth: usize,
    arena: [u64; ARENA_SIZE / 8],
    arena_top: usize,
}

impl ReturnStack {
    pub const EMPTY: ReturnStack =
        ReturnStack { frames: [NO_FRAME; MAX_FRAMES], depth: 0, arena: [0; ARENA_SIZE / 8], arena_top: 0 };
}

/// Runs `f` on the return stack of the thread `t`. Callers hold the thread's busy mark, which
/// is what makes the access exclusive (entry hits, returns and interposers never nest on a
/// thread).
fn with_stack<R>(t: &ThreadState, f: impl FnOnce(&mut ReturnStack) -> R) -> R {
    // SAFETY: see above: only one of the busy-marked paths runs on this thread at a time, and
    // the cell is never borrowed across them.
    f(unsafe { &mut *t.returns.get() })
}

impl ReturnStack {
    fn top(&self) -> Option<&Frame> {
        self.depth.checked_sub(1).map(|i| &self.frames[i])
    }

    fn pop(&mut self) -> Frame {
        self.depth -= 1;
        let frame = self.frames[self.depth];
        self.arena_top = frame.instance;
        frame
    }

    /// Drops the records of frames left without returning: those whose slot is below `rsp`
    /// (or at it, when `inclusive`).
    fn drop_dead(&mut self, rsp: usize, inclusive: bool) {
        while let Some(top) = self.top() {
            if top.slot < rsp || (inclusive && top.slot == rsp) {
                self.pop();
            } else {
                break;
            }
        }
    }

    fn instance(&mut self, offset: usize) -> *mut UretprobeInstance {
        (self.arena.as_mut_ptr() as usize + offset) as *mut UretprobeInstance
    }

    /// Puts the real return addresses back on the stack where the trampoline's is.
    fn restore_all(&mut self) {
        let tramp = trampoline();
        for f in &self.frames[..self.depth] {
            // SAFETY: `slot` is a live stack slot of this thread that held its return address.
            unsafe {
                if *(f.slot as *const usize) == tramp {
                    *(f.slot as *mut usize) = f.orig;
                }
            }
        }
    }

    /// Hooks the returns of the recorded frames again.
    fn rehook_all(&mut self) {
        let tramp = trampoline();
        for f in &self.frames[..self.depth] {
            // SAFETY: as in `restore_all`; only slots still holding their real address change.
            unsafe {
                if *(f.slot as *const usize) == f.orig {
                    *(f.slot as *mut usize) = tramp;
                }
            }
        }
    }
}

extern "C" {
    /// The return trampoline (assembly below).
    fn uprobe_ret_trampoline();
}

/// The address the runtime puts in place of hooked return addresses.
pub fn trampoline() -> usize {
    uprobe_ret_trampoline as *const () as usize
}

fn maxactive(rp: &Uretprobe) -> usize {
    if rp.maxactive > 0 {
        rp.maxactive as usize
    } else {
        DEFAULT_MAXACTIVE
    }
}

fn count_missed(rp: *mut Uretprobe) {
    // SAFETY: `nmissed` is an aligned unsigned long of a registered probe object; the runtime
    // only ever updates it atomically.
    unsafe { AtomicU64::from_ptr(core::ptr::addr_of_mut!((*rp).nmissed)).fetch_add(1, Ordering::Relaxed) };
}

/// An entry hit of return probe `rp` at probe point `pp` (signal context, thread busy, inside
/// a read-side section). `regs` are the registers at the function's first instruction.
///
/// # Safety
/// `rp` is a registered return probe, valid for the read-side section.
pub unsafe fn on_entry(rp: *mut Uretprobe, pp: &ProbePoint, regs: &mut PtRegs) {
    // SAFETY: the caller guarantees `rp` is valid.
    let probe = unsafe { &*rp };
    let slot = regs.rsp as usize;
    // SAFETY: at a function's first instruction %rsp points to the return address.
    let ret = unsafe { *(slot as *const usize) };
    let tramp = trampoline();
    with_stack(crate::thread::current(), |st| {
        // A frame at this very slot is dead unless this is a tail call from a hooked frame.
        st.drop_dead(slot, ret != tramp);
        let orig = if ret == tramp {
            match st.top() {
                Some(top) if top.slot == slot => top.orig,
                // A hooked address with no record cannot be followed: leave this call alone.
                _ => return count_missed(rp),
            }
        } else {
            ret
        };
        let pending = st.frames[..st.depth].iter().filter(|f| f.rp == rp).count();
        let size = (core::mem::size_of::<UretprobeInstance>() + probe.data_size + 15) & !15;
        if st.depth == MAX_FRAMES || pending >= maxactive(probe) || st.arena_top + size > ARENA_SIZE {
            return count_missed(rp);
        }
        let offset = st.arena_top;
        let ri = st.instance(offset);
        // SAFETY: `ri` points to `size` free, 16-aligned bytes of this thread's arena.
        unsafe {
            ri.write(UretprobeInstance { rp, ret_addr: orig as _, reserved: [0; 2] });
            if let Some(entry) = probe.entry_handler {
                st.arena_top += size; // an entry handler that hits a probe sees the space taken
                let skip = entry(ri, regs) != 0;
                st.arena_top = offset;
                if skip {
                    return;
                }
            }
        }
        st.arena_top = offset + size;
        st.frames[st.depth] = Frame { rp, pp, slot, orig, instance: offset };
        st.depth += 1;
        // SAFETY: the slot holds this call's return address; the function has not run yet.
        unsafe { *(slot as *mut usize) = tramp };
    });
}

/// Called by the trampoline with the registers it saved (normal context). Runs the return
/// handlers of every record for this return and gives the address to resume at.
extern "C" fn return_hit(regs: &mut PtRegs) -> usize {
    let saved_errno = sys::errno();
    // The trampoline pushed the resume slot and 21 registers since the `ret` popped.
    let caller_rsp = regs as *mut PtRegs as usize + 22 * 8;
    let slot = caller_rsp - 8;
    regs.rsp = caller_rsp as u64;
    regs.cs = 0x33;
    regs.ss = 0x2b;
    let t = crate::thread::current();
    let nested = t.busy.replace(true);
    let quiet = nested || t.depth.get() != 0;
    let mut resume = 0;
    with_stack(t, |st| {
        st.drop_dead(slot, false);
        while let Some(top) = st.top().copied().filter(|f| f.slot == slot) {
            resume = top.orig;
            regs.rip = top.orig as u64;
            if !quiet {
                run_return_handler(t, &top, st.instance(top.instance), regs);
            }
            st.pop();
        }
    });
    t.busy.set(nested);
    if resume == 0 {
        output::message_fixed(b"uprobe-run: fatal: a return reached the trampoline with no record, slot ", slot);
        // SAFETY: abort has no preconditions; there is no address to return to.
        unsafe { libc::abort() };
    }
    if !nested && t.queued.get() != 0 {
        api::run_deferred();
    }
    sys::set_errno(saved_errno);
    regs.rip as usize
}

fn run_return_handler(t: &ThreadState, frame: &Frame, ri: *mut UretprobeInstance, regs: &mut PtRegs) {
    let epoch = registry::read_lock(t);
    // SAFETY: the probe point is never freed; its consumer list is valid in this section.
    let pp = unsafe { &*frame.pp };
    let list = pp.consumers.load(Ordering::SeqCst);
    // SAFETY: as above; `rp` is called only while it is still registered, and unregister
    // waits for this section to end before the user may free it.
    unsafe {
        if !list.is_null() && (*list).probes.contains(&Consumer::Uretprobe(frame.rp)) {
            if let Some(handler) = (*frame.rp).handler {
                let outer = t.handling.replace(frame.rp as usize);
                handler(ri, regs);
                t.handling.set(outer);
            }
        }
    }
    registry::read_unlock(epoch);
}

core::arch::global_asm!(
    ".pushsection .text.uprobe_ret_trampoline,\"ax\",@progbits",
    ".globl uprobe_ret_trampoline",
    ".hidden uprobe_ret_trampoline",
    ".type uprobe_ret_trampoline,@function",
    ".p2align 4",
    "uprobe_ret_trampoline:",
    "push 0", // becomes the address to resume at
    save_pt_regs_asm!(),
    "mov rdi, rbx",
    "call {return_hit}",
    "mov qword ptr [rbx + 168], rax",
    restore_pt_regs_asm!(),
    "ret",
    ".size uprobe_ret_trampoline, . - uprobe_ret_trampoline",
    ".popsection",
    return_hit = sym return_hit,
    vector_area = sym crate::vector::AREA_SIZE,
    vector_mask = sym crate::vector::MASK,
);

// Interposed functions that read or discard return addresses.

/// The next definition of `name` after this library (the one the program would have called).
fn next_symbol(cache: &AtomicPtr<c_void>, name: &core::ffi::CStr) -> *mut c_void {
    let mut p = cache.load(Ordering::Acquire);
    if p.is_null() {
        // SAFETY: dlsym with RTLD_NEXT and a C string; runs in normal context.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        cache.store(p, Ordering::Release);
    }
    p
}

macro_rules! next {
    ($name:literal, $ty:ty) => {{
        static CACHE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
        let p = next_symbol(&CACHE, $name);
        if p.is_null() {
            output::message(format_args!("fatal: {:?} not found after the runtime", $name));
            // SAFETY: abort has no preconditions; there is no function to forward to.
            unsafe { libc::abort() };
        }
        // SAFETY: the symbol is the libc/libgcc function of this very name and signature.
        unsafe { core::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

/// Runs `f` on this thread's records with the thread marked busy.
fn with_records(f: impl FnOnce(&mut ReturnStack)) {
    let t = crate::thread::current();
    let nested = t.busy.replace(true);
    if !nested {
        with_stack(t, f);
    }
    t.busy.set(nested);
}

/// `_Unwind_RaiseException`: the unwinder walks return addresses, so they must be real.
///
/// # Safety
/// The libgcc contract.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_RaiseException(exception: *mut c_void) -> c_int {
    with_records(ReturnStack::restore_all);
    let real = next!(c"_Unwind_RaiseException", unsafe extern "C" fn(*mut c_void) -> c_int);
    // SAFETY: forwarding the caller's arguments to the real function.
    unsafe { real(exception) }
}

/// `_Unwind_ForcedUnwind` (thread exit and cancellation through the unwinder).
///
/// # Safety
/// The libgcc contract.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_ForcedUnwind(exception: *mut c_void, stop: *mut c_void, arg: *mut c_void) -> c_int {
    with_records(ReturnStack::restore_all);
    let real = next!(c"_Unwind_ForcedUnwind", unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void) -> c_int);
    // SAFETY: forwarding the caller's arguments to the real function.
    unsafe { real(exception, stop, arg) }
}

/// `_Unwind_Backtrace`: real addresses while it walks, hooks again afterwards.
///
/// # Safety
/// The libgcc contract.
#[no_mangle]
pub unsafe extern "C" fn _Unwind_Backtrace(trace: *mut c_void, arg: *mut c_void) -> c_int {
    with_records(ReturnStack::restore_all);
    let real = next!(c"_Unwind_Backtrace", unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int);
    // SAFETY: forwarding the caller's arguments to the real function.
    let rc = unsafe { real(trace, arg) };
    with_records(ReturnStack::rehook_all);
    rc
}

/// `backtrace(3)`: glibc reaches the unwinder without going through the PLT, so it is
/// interposed itself.
///
/// # Safety
/// The glibc contract.
#[no_mangle]
pub unsafe extern "C" fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int {
    const ROOM: usize = 256;
    if size <= 0 {
        return 0;
    }
    with_records(ReturnStack::restore_all);
    let real = next!(c"backtrace", unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int);
    // The real backtrace leaves out its own frame but sees this one: drop it, so the caller
    // gets the frames it would get without the runtime.
    let size = size as usize;
    let mut room = [core::ptr::null_mut::<c_void>(); ROOM + 1];
    // SAFETY: each call gets a buffer of the size passed with it; copies stay within the
    // caller's `size` entries.
    let n = unsafe {
        if size <= ROOM {
            let n = real(room.as_mut_ptr(), size as c_int + 1).max(1) as usize;
            core::ptr::copy_nonoverlapping(room.as_ptr().add(1), buffer, n - 1);
            n - 1
        } else {
            // Too many to stage on the stack: the deepest frame is lost when the trace fills it.
            let n = real(buffer, size as c_int).max(1) as usize;
            core::ptr::copy(buffer.add(1), buffer, n - 1);
            n - 1
        }
    };
    with_records(ReturnStack::rehook_all);
    n as c_int
}

/// `pthread_exit(3)`: glibc unwinds through its own handle on the unwinder.
///
/// # Safety
/// The glibc contract.
#[no_mangle]
pub unsafe extern "C" fn pthread_exit(retval: *mut c_void) -> ! {
    with_records(ReturnStack::restore_all);
    let real = next!(c"pthread_exit", unsafe extern "C" fn(*mut c_void) -> !);
    // SAFETY: forwarding the caller's argument to the real function.
    unsafe { real(retval) }
}

/// The body of `__cxa_begin_catch`: the frames below the catching one are gone; hook the
/// returns of the frames still live again.
extern "C" fn begin_catch(exception: *mut c_void, own_slot: usize) -> *mut c_void {
    with_records(|st| {
        st.drop_dead(own_slot, true);
        st.rehook_all();
    });
    let real = next!(c"__cxa_begin_catch", unsafe extern "C" fn(*mut c_void) -> *mut c_void);
    // SAFETY: forwarding the caller's argument to the real function.
    unsafe { real(exception) }
}

/// `__cxa_begin_catch`, entered with the catching frame's stack just above its return slot.
///
/// # Safety
/// The C++ ABI contract.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn __cxa_begin_catch() {
    core::arch::naked_asm!("mov rsi, rsp", "jmp {body}", body = sym begin_catch)
}
