//! Return probes.
//!
//! At an entry hit of a return-probed function the runtime saves the real return address in a
//! per-thread, bounded, preallocated return stack and replaces it, on the program's stack,
//! with the address of `uprobe_ret_trampoline`. That trampoline is plain code: when the
//! function returns into it, it saves the general registers, the flags and xmm0-15 (what a
//! handler compiled for x86-64 may change), calls `return_hit` in normal thread context,
//! which runs the return handlers with the registers as a `struct pt_regs`, and resumes at the
//! real return address.
//! A return costs a few dozen nanoseconds, not a signal.
//!
//! Each record remembers the stack slot of the address it replaced. A record whose slot lies
//! below the stack pointer of a later entry or return belongs to a frame that was left without
//! returning (`longjmp`, `siglongjmp`, an exception) and is dropped. Code that reads return
//! addresses (the C++ unwinder, `backtrace()`, `pthread_exit`'s forced unwind) is interposed
//! by the hazards layer (`hazard::unwind`), which uses `with_records`: the real addresses
//! go back on the stack before it runs; after `backtrace()` returns, and when an exception is
//! caught, the frames still live are hooked again, so their returns keep being counted.
//!
//! The records of a thread are touched by entry hits (signal context), by the trampoline and
//! by the interposed functions; all of them run with the thread marked busy (see `thread`), so
//! they never interleave.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::base::abi::{PtRegs, Uretprobe, UretprobeInstance};
use crate::base::output;
use crate::insn::vector;
use crate::probe::returns::{Frame, Left, Lookup, ReturnStack, ARENA_SIZE, MAX_FRAMES};
use crate::probe::table::{Consumer, ProbePoint};
use crate::probe::thread::{self, ThreadState};
use crate::probe::{deferred, rcu};

/// `maxactive` when the probe leaves it at 0 or below: pending returns per thread and probe.
pub const DEFAULT_MAXACTIVE: usize = 64;
/// The largest `data_size` a return probe may ask for.
pub const MAX_DATA_SIZE: usize = 4096;

/// Runs `f` on the return stack of the thread `t`. Callers hold the thread's busy mark, which
/// is what makes the access exclusive (entry hits, returns and interposers never nest on a
/// thread).
fn with_stack<R>(t: &ThreadState, f: impl FnOnce(&mut ReturnStack) -> R) -> R {
    // SAFETY: see above: only one of the busy-marked paths runs on this thread at a time, and
    // the cell is never borrowed across them.
    f(unsafe { &mut *t.returns.get() })
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

/// Counts a call of the record `f` that will not return (`why`), in the runtime's words of its
/// probe object (`struct uprobe`'s reserved words), if the probe is still registered: an
/// unregistered probe object may be gone.
pub fn count_left(f: &Frame, why: Left) {
    let t = thread::current();
    let epoch = rcu::read_lock(t);
    // SAFETY: the probe point is never freed; its consumer list is valid in this section.
    let pp = unsafe { &*(f.pp as *const ProbePoint) };
    let list = pp.consumers.load(Ordering::SeqCst);
    // `rp` is touched only while registered: unregister waits for this section before the
    // user may free it. Its reserved words are the runtime's, pointer-sized and aligned.
    // SAFETY: as above, and the words are only ever updated atomically.
    unsafe {
        if !list.is_null() && (*list).probes.contains(&Consumer::Uretprobe(f.rp)) {
            let word = core::ptr::addr_of_mut!((*f.rp).u.reserved[why as usize]).cast::<usize>();
            AtomicUsize::from_ptr(word).fetch_add(1, Ordering::Relaxed);
        }
    }
    rcu::read_unlock(epoch);
}

/// The calls of `rp` counted by [`count_left`], by reason.
///
/// # Safety
/// `rp` is a registered return probe.
pub unsafe fn left_counts(rp: *mut Uretprobe) -> [usize; 3] {
    // SAFETY: as in `count_left`; the caller vouches that `rp` is registered.
    let read = |i: usize| unsafe {
        AtomicUsize::from_ptr(core::ptr::addr_of_mut!((*rp).u.reserved[i]).cast::<usize>()).load(Ordering::Relaxed)
    };
    [read(0), read(1), read(2)]
}

fn count_missed(rp: *mut Uretprobe) {
    // SAFETY: `nmissed` is an aligned unsigned long of a registered probe object; the runtime
    // only ever updates it atomically.
    unsafe { AtomicU64::from_ptr(core::ptr::addr_of_mut!((*rp).nmissed)).fetch_add(1, Ordering::Relaxed) };
}

/// An entry hit of return probe `rp` at probe point `pp` (signal context, thread busy, inside
/// a read-side section). `regs` are the registers at the function's first instruction.
/// Touches no vector register but through `vector::saving_vectors` (a probe declared
/// vector-free is called without their save; the `hit_code` test reads the built code).
///
/// # Safety
/// `rp` is a registered return probe of the consumer list numbered `list`, valid for the
/// read-side section.
pub unsafe fn on_entry(rp: *mut Uretprobe, pp: &ProbePoint, list: u64, regs: &mut PtRegs, t: &ThreadState) {
    // SAFETY: the caller guarantees `rp` is valid.
    let probe = unsafe { &*rp };
    let slot = regs.rsp as usize;
    // SAFETY: at a function's first instruction %rsp points to the return address.
    let ret = unsafe { *(slot as *const usize) };
    let tramp = trampoline();
    let vectors = Consumer::Uretprobe(rp).needs_vectors();
    if !vectors && !VECTOR_FREE_RETURNS.load(Ordering::Relaxed) {
        VECTOR_FREE_RETURNS.store(true, Ordering::Relaxed);
    }
    with_stack(t, |st| {
        // A return address that is already the trampoline's: a hooked function tail-called
        // this one, whose return is the same.
        let chained = ret == tramp;
        if st.depth != 0 {
            st.collect(slot, chained, tramp, false, &mut |f, why| count_left(f, why));
        }
        let orig = if chained {
            match st.find(slot) {
                Lookup::Found(i) => st.frames[i].orig,
                // A hooked address with no record cannot be followed: leave this call alone.
                Lookup::Missing => return count_missed(rp),
            }
        } else {
            ret
        };
        let size = (core::mem::size_of::<UretprobeInstance>() + probe.data_size + 15) & !15;
        let full = |st: &ReturnStack| {
            // A probe cannot have more records pending than the thread has: the count of
            // its own is read only when the thread has maxactive records or more.
            let limit = maxactive(probe);
            st.depth == MAX_FRAMES
                || (st.depth >= limit && pending(st, rp) >= limit)
                || st.arena_top + size > ARENA_SIZE
        };
        if full(st) {
            // Records of calls left without returning, and the gaps of calls that returned on
            // another stack, may hold the room: look at them all (moving instances is no
            // hit-path code: it may use the vector registers).
            let mut room = false;
            vector::saving_vectors(|| {
                st.collect(slot, chained, tramp, true, &mut |f, why| count_left(f, why));
                st.compact();
                room = !full(st);
            });
            if !room {
                return count_missed(rp);
            }
        }
        let offset = st.arena_top;
        let ri = st.instance(offset);
        // SAFETY: `ri` points to `size` free, 16-aligned bytes of this thread's arena.
        unsafe {
            write_instance(ri, rp, orig);
            if let Some(entry) = probe.entry_handler {
                st.arena_top += size; // an entry handler that hits a probe sees the space taken
                let outer_code = t.code.replace(entry as usize);
                let skip = entry(ri, regs) != 0;
                t.code.set(outer_code);
                st.arena_top = offset;
                if skip {
                    return;
                }
            }
        }
        st.arena_top = offset + size;
        let pp = pp as *const ProbePoint as usize;
        st.push(Frame { rp, pp, slot, orig, instance: offset, size, list, vectors, quick: false });
        // SAFETY: the slot holds this call's return address; the function has not run yet.
        unsafe { *(slot as *mut usize) = tramp };
    });
}

/// Fills in the instance at `ri` of a call of `rp` that returns to `orig`, word by word: a
/// struct store could be compiled to vector moves, which the hit paths may not use.
///
/// # Safety
/// `ri` points to a free, 16-aligned instance of this thread's arena.
#[inline(always)]
unsafe fn write_instance(ri: *mut UretprobeInstance, rp: *mut Uretprobe, orig: usize) {
    // SAFETY: the caller's.
    unsafe {
        core::ptr::addr_of_mut!((*ri).rp).write_volatile(rp);
        core::ptr::addr_of_mut!((*ri).ret_addr).write_volatile(orig as _);
        core::ptr::addr_of_mut!((*ri).reserved[0]).write_volatile(0);
        core::ptr::addr_of_mut!((*ri).reserved[1]).write_volatile(0);
    }
}

/// How many records `rp` has pending in `st`, counted with the vector registers saved (the
/// compiler counts with them); asked only of a thread with `maxactive` records or more.
#[cold]
fn pending(st: &ReturnStack, rp: *mut Uretprobe) -> usize {
    let mut n = 0;
    vector::saving_vectors(|| n = st.pending(rp));
    n
}

/// Whether a vector-free return probe was ever entered: until then every return saves the
/// vector registers without asking its record (read by the trampoline).
static VECTOR_FREE_RETURNS: AtomicBool = AtomicBool::new(false);

/// Called by the trampoline once it saved the general registers (`regs`), before the vector
/// registers: whether to save them, i.e. whether the probe of the return's newest record
/// needs them (a record of the same return that needs them and finds them unsaved is called
/// through `vector::saving_vectors`). Normal context; touches no vector register.
extern "C" fn return_vectors(regs: &mut PtRegs) -> u32 {
    let slot = regs as *mut PtRegs as usize + crate::insn::frame::RETURN_CALLER_RSP - 8;
    let t = thread::current();
    if t.quiet() {
        return 0; // no handler runs
    }
    with_stack(t, |st| match st.find(slot) {
        Lookup::Found(i) => u32::from(st.frames[i].vectors),
        Lookup::Missing => 1,
    })
}

/// Called by the trampoline with the registers it saved (normal context; the vector
/// registers too if `vectors_saved`). Runs the return handlers of every record for this
/// return and gives the address to resume at.
extern "C" fn return_hit(regs: &mut PtRegs, vectors_saved: bool) -> usize {
    // The trampoline pushed the resume slot and the registers since the `ret` popped.
    let caller_rsp = regs as *mut PtRegs as usize + crate::insn::frame::RETURN_CALLER_RSP;
    let slot = caller_rsp - 8;
    regs.rsp = caller_rsp as u64;
    let t = thread::current();
    // Busy before anything that may be probed (errno's location included) runs.
    let quiet = t.quiet();
    let mut nested = false;
    t.change_marks(|t| nested = t.busy.replace(true));
    let saved_errno = t.errno();
    let area = regs as *mut PtRegs as usize;
    let outer_vectors =
        t.vectors.replace(match vectors_saved && crate::probe::table::XMM_READERS.load(Ordering::Relaxed) {
            true => crate::insn::vector::saved_xmm(area),
            false => 0,
        });
    let mut resume = 0;
    with_stack(t, |st| {
        // Every record of this slot: the call, and the calls it tail-called, newest first.
        while let Lookup::Found(i) = st.find(slot) {
            let f = &st.frames[i];
            let (rp, pp, list, vectors, instance) = (f.rp, f.pp, f.list, f.vectors, f.instance);
            resume = f.orig;
            regs.rip = f.orig as u64;
            if !quiet {
                let ri = st.instance(instance);
                let vectors = vectors && !vectors_saved;
                run_return_handler(t, Record { rp, pp, list }, ri, regs, vectors);
            }
            st.remove(i);
        }
        if st.depth != 0 {
            st.collect(slot, true, trampoline(), false, &mut |f, why| count_left(f, why));
        }
    });
    if resume == 0 {
        vector::saving_vectors(|| {
            output::message_fixed(b"uprobe-run: fatal: a return reached the trampoline with no record, slot ", slot);
            // SAFETY: abort has no preconditions; there is no address to return to.
            unsafe { libc::abort() };
        });
    }
    t.set_errno(saved_errno);
    t.vectors.set(outer_vectors);
    t.change_marks(|t| t.busy.set(nested));
    if !nested && t.queued.get() != 0 {
        // Registration is no hit-path code: it may use the vector registers.
        vector::saving_vectors(deferred::run_deferred);
    }
    regs.rip as usize
}

/// What a return needs of its record to call its handler.
struct Record {
    rp: *mut Uretprobe,
    /// The entry's probe point, and the number of its consumer list then.
    pp: usize,
    list: u64,
}

/// Calls the return handler of `r.rp` if it is still registered; `save`: with the vector
/// registers saved around it (they were not, and it needs them).
fn run_return_handler(t: &ThreadState, r: Record, ri: *mut UretprobeInstance, regs: &mut PtRegs, save: bool) {
    let epoch = rcu::read_lock(t);
    // SAFETY: the probe point is never freed; its consumer list is valid in this section.
    let pp = unsafe { &*(r.pp as *const ProbePoint) };
    let list = pp.consumers.load(Ordering::SeqCst);
    // SAFETY: as above; `rp` is called only while still registered (its entry's list is in
    // place, or the one in place holds it), and unregister waits for this section to end.
    unsafe {
        if !list.is_null() && ((*list).generation == r.list || registered(&(*list).probes, r.rp)) {
            if let Some(handler) = (*r.rp).handler {
                let outer = t.enter_handler(r.rp as usize, handler as usize);
                if save {
                    vector::saving_vectors(|| handler(ri, regs));
                } else {
                    handler(ri, regs);
                }
                t.leave_handler(outer);
            }
        }
    }
    rcu::read_unlock(epoch);
}

/// Whether `probes` holds return probe `rp` (a list that changed since the call's entry).
#[inline(never)]
fn registered(probes: &[Consumer], rp: *mut Uretprobe) -> bool {
    for c in probes {
        if let Consumer::Uretprobe(p) = *c {
            if p == rp {
                return true;
            }
        }
    }
    false
}

// `uprobe_call_through` (a quick entry's way into its function, see `quick_entry`) calls
// the address 16 bytes below the stack pointer: the return address it pushes is the
// trampoline's, and the return-stack buffer holds it, so the function's `ret` to the
// trampoline is predicted, and the caller's entry is still there for the way out.
// The pushed 0 becomes the address to resume at. A return first tries the quick path when a
// front-end set one (`QUICK_RETURN`, asked with only the flags and the call-clobbered
// registers saved), then builds the whole frame. The vectors are saved where the return's
// record says its probe needs them (`return_vectors`), asked only once a vector-free return
// probe was entered, and never while no registered return probe needs them. The common way
// out is an indirect jump, not a `ret`: a return hooked by writing the trampoline's address
// already took the caller's entry of the return-stack buffer, and a second `ret` would take
// (and mispredict) its caller's, leaving every later return of the program one entry off.
// The quick way out serves only calls made through `uprobe_call_through`, whose caller's
// entry is still there: it leaves by `ret`. (Such a call whose return the quick path leaves
// to the common one, its probe's list changed meanwhile, leaves by the jump: one later
// return of the program mispredicts, nothing else.) The resume address is read just below
// the stack pointer, in the red zone, which signal delivery skips.
crate::insn::frame::trap_free_entry!(
    concat!(
        ".globl uprobe_call_through\n .hidden uprobe_call_through\n",
        ".type uprobe_call_through,@function\n uprobe_call_through:\n call qword ptr [rsp - 16]\n",
        ".size uprobe_call_through, . - uprobe_call_through\n",
    ),
    "uprobe_ret_trampoline",
    concat!(
        "push 0\n push rcx\n mov rcx, qword ptr [rip + {quick}]\n jrcxz 84f\n pop rcx\n jmp 86f\n",
        "84:\n pop rcx\n jmp 85f\n 86:\n",
        crate::insn::frame::save_scratch!(),
        "lea rdi, [rbx + {scratch} + 8]\n call qword ptr [rip + {quick}]\n test rax, rax\n jz 83f\n",
        "mov qword ptr [rbx + {scratch}], rax\n",
        crate::insn::frame::restore_scratch!(),
        "ret\n",
        "83:\n",
        crate::insn::frame::restore_scratch!(),
        "85:\n",
    ),
    "xor r12d, r12d\n cmp qword ptr [rip + {needy}], 0\n je 77f\n mov r12d, 1\n\
     cmp byte ptr [rip + {free}], 0\n je 77f\n mov rdi, rbx\n call {choose}\n mov r12d, eax\n 77:",
    return_hit,
    "lea rsp, [rsp + 8]\n jmp qword ptr [rsp - 8]",
    scratch = const crate::insn::frame::SCRATCH_SIZE;
    choose = sym return_vectors;
    free = sym VECTOR_FREE_RETURNS;
    needy = sym crate::probe::vectors::NEEDY_RETURNS;
    quick = sym QUICK_RETURN
);

/// A front-end's quick return (0: none), `extern "C" fn(caller_rsp: usize) -> usize`, called
/// by the trampoline with the stack pointer the return left (the record's slot is just below)
/// before it saves the registers: the address to resume at if it took the return (see
/// [`quick_return`]), 0 to leave it to the common path. It may touch no vector register.
pub static QUICK_RETURN: AtomicUsize = AtomicUsize::new(0);

/// Records the call whose return address is at `slot`, for return probe `rp` of point `pp`
/// and consumer list `list`, as [`on_entry`] would with an entry handler, when that needs no
/// look at the thread's other records: they are in order above `slot`, there is room, the
/// call is no tail call of a hooked one. Returns the instance's 16 bytes of data, for the
/// caller to write at once (in place of the entry handler), or None, with nothing done.
///
/// The return address is left in place: the caller's code calls the function through
/// `uprobe_call_through` (below) with the stack pointer just above it, which
/// puts the trampoline's address there. Until then the slot holds the real one, which
/// unwinders and [`ReturnStack::collect`] accept as well. The record is marked quick: its
/// return may be taken by [`quick_return`], and leaves by `ret`.
///
/// # Safety
/// As [`on_entry`] (thread busy, read-side section, `rp` registered in list `list`), and `rp`
/// asked for 16 bytes of data.
#[inline(always)]
pub unsafe fn quick_entry(
    t: &ThreadState,
    rp: *mut Uretprobe,
    pp: &ProbePoint,
    list: u64,
    slot: usize,
) -> Option<*mut [u64; 2]> {
    // SAFETY: at a function's first instruction %rsp points to the return address; the
    // caller guarantees `rp` is valid.
    let (orig, probe) = unsafe { (*(slot as *const usize), &*rp) };
    const SIZE: usize = (core::mem::size_of::<UretprobeInstance>() + 16 + 15) & !15;
    if orig == trampoline() {
        return None;
    }
    // SAFETY: as in `with_stack` (the caller holds the busy mark); borrowed here only.
    let st = unsafe { &mut *t.returns.get() };
    if !st.room_in_order(slot, maxactive(probe), SIZE) {
        return None;
    }
    let offset = st.arena_top;
    let ri = st.instance(offset);
    // SAFETY: `ri` points to SIZE free, 16-aligned bytes of this thread's arena: the
    // instance and its 16 bytes of data.
    unsafe { write_instance(ri, rp, orig) };
    st.arena_top = offset + SIZE;
    let pp = pp as *const ProbePoint as usize;
    st.push(Frame { rp, pp, slot, orig, instance: offset, size: SIZE, list, vectors: false, quick: true });
    Some((ri as usize + core::mem::size_of::<UretprobeInstance>()) as *mut [u64; 2])
}

/// The return leaving from `slot` when its record is the thread's newest, from a quick entry,
/// the only one of its slot, and its probe's consumer list is still the entry's: calls
/// `handler` with the instance's 16 bytes of data, takes the record out and
/// gives the real return address; 0, with nothing done, otherwise.
///
/// # Safety
/// The thread is busy, inside a read-side section.
#[inline(always)]
pub unsafe fn quick_return(t: &ThreadState, slot: usize, handler: impl FnOnce([u64; 2])) -> usize {
    // SAFETY: as in `with_stack` (the caller holds the busy mark); borrowed here only.
    let st = unsafe { &mut *t.returns.get() };
    let Some(i) = st.quick_top(slot) else { return 0 };
    let f = st.frames[i];
    // SAFETY: the probe point is never freed; its consumer list is valid in the caller's
    // read-side section, and while it is the entry's, `rp` is registered.
    unsafe {
        let list = (*(f.pp as *const ProbePoint)).consumers.load(Ordering::SeqCst);
        if list.is_null() || (*list).generation != f.list {
            return 0;
        }
    }
    let words = st.instance(f.instance) as usize + core::mem::size_of::<UretprobeInstance>();
    // SAFETY: the record's instance and the 16 bytes of data its quick entry wrote.
    let data = unsafe { [*(words as *const u64), *((words + 8) as *const u64)] };
    handler(data);
    st.remove(i);
    f.orig
}

/// Puts the real return addresses of this thread's hooked frames back on its stack (before
/// code that reads return addresses runs).
pub fn restore_returns() {
    with_records(|st| st.restore_all(trampoline()));
}

/// Hooks the returns of this thread's recorded frames again (after such code ran).
pub fn rehook_returns() {
    with_records(|st| st.rehook_all(trampoline()));
}

/// An exception is thrown (or thrown again) with the stack pointer near `sp`: the real return
/// addresses go back on the stack for the unwinder, and the calls from `sp` up to where it is
/// caught will be forgotten then.
pub fn throwing(sp: usize) {
    with_records(|st| {
        if st.thrown_at == 0 || sp < st.thrown_at {
            st.thrown_at = sp;
        }
        st.restore_all(trampoline());
    });
}

/// An exception was caught in the frame whose return slot is just above `slot`: the calls
/// between the throw and it are gone; hooks the returns of those still live again.
pub fn caught_at(slot: usize) {
    with_records(|st| {
        st.caught(st.thrown_at, slot, &mut |f, why| count_left(f, why));
        st.thrown_at = 0;
        st.rehook_all(trampoline());
    });
}

/// The thread leaves (`pthread_exit`): the real return addresses go back for the unwinder,
/// and its pending calls will not return.
pub fn thread_exiting() {
    with_records(|st| {
        st.restore_all(trampoline());
        st.truncate(0, 0, Left::ThreadExit, &mut |f, why| count_left(f, why));
    });
}

/// How many calls of `rp` are pending on the calling thread (the one ending the process).
pub fn pending_here(rp: *mut Uretprobe) -> usize {
    let mut n = 0;
    with_records(|st| n = st.pending(rp));
    n
}

/// The real return address of the hooked call whose return address sits at `slot`, where a
/// return probe put the trampoline's (hit path, thread busy: a front-end reading a caller).
pub fn hooked_return(slot: usize) -> Option<usize> {
    with_stack(thread::current(), |st| match st.find(slot) {
        Lookup::Found(i) => Some(st.frames[i].orig),
        Lookup::Missing => None,
    })
}

/// Runs `f` on this thread's records with the thread marked busy (normal context; the
/// interposers of `hazard::unwind`).
fn with_records(f: impl FnOnce(&mut ReturnStack)) {
    let t = thread::current();
    let mut nested = false;
    t.change_marks(|t| nested = t.busy.replace(true));
    if !nested {
        with_stack(t, f);
    }
    t.change_marks(|t| t.busy.set(nested));
}
