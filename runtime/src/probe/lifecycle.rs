//! The registry across the process's life: libraries loaded and unloaded (`dlopen`,
//! `dlclose`), `fork`, and the end of the run (`exec`, what never found its module).
//!
//! Normal context, under the registry lock; the fork steps run in `pthread_atfork` handlers.

use std::sync::atomic::Ordering;

use crate::base::elf;
use crate::base::lock::MutexGuard;
use crate::base::output;
use crate::insn::patch::Session;
use crate::probe::error::RegisterError;
use crate::probe::place::{self, Change, Target};
use crate::probe::registry::{
    flush, pending_consumer, pending_consumers, place, resolve_within, state, target_of, unregister_all, Batch,
    Pending, State, Where, ON_ARMED,
};
use crate::probe::semaphore;
use crate::probe::table::{self, Consumer};

/// Removes every probe still registered or waiting for its module (before an `exec`, once
/// the run's report is done: a program whose exec fails goes on unprobed).
pub fn unregister_everything() {
    let consumers: Vec<Consumer> = {
        let st = state();
        let mut all = pending_consumers(&st);
        for addr in st.registered.values() {
            if let Some(pp) = table::lookup(addr) {
                all.extend(pp.probes().into_iter().filter(|c| st.registered.contains_key(&c.key())));
            }
        }
        all.sort_by_key(|c| c.key());
        all.dedup();
        all
    };
    unregister_all(&consumers);
}

/// Says which probes never found their module ("module:symbol" probes whose module was
/// never loaded: a typo, or a library the program did not use), at the end of the run.
pub fn report_pending() {
    let st = state();
    let never_placed = st.pending.iter().filter(|(_, p)| !p.placed_before);
    for consumer in never_placed.map(|(&key, p)| pending_consumer(key, p)) {
        // SAFETY: pending probe objects stay valid until unregistered (C ABI).
        let probe = unsafe { &*consumer.placement() };
        if let Ok(Where::Symbol(name, offset)) = target_of(probe) {
            let module = name.split(':').next().unwrap_or_default();
            let at = if offset == 0 { name.clone() } else { format!("{name}+{offset:#x}") };
            output::message(format_args!(
                "probe {at} was never placed: no module named {module:?} was loaded while the program ran"
            ));
        }
    }
}

/// Arms the pending probes whose module is now loaded (after `dlopen`), as one batch.
/// Returns each probe that left the pending list, with its address or why it could not be
/// placed.
pub fn arm_pending() -> Vec<(Consumer, Result<usize, RegisterError>)> {
    let mut st = state();
    if st.pending.is_empty() {
        return Vec::new();
    }
    st.begin();
    let mut done = Vec::new();
    for consumer in pending_consumers(&st) {
        // SAFETY: registered (pending) probe objects stay valid until unregistered.
        let probe = unsafe { &*consumer.placement() };
        let Ok(Where::Symbol(name, offset)) = target_of(probe) else { continue };
        let Ok(spec) = elf::parse_spec(&name) else { continue };
        let result = match resolve_within(&mut st.view, &spec, offset) {
            Err(RegisterError::UnknownModule { .. }) => continue,
            Err(e) => Err(e),
            Ok(addr) => place(&mut st, consumer, addr).map(|()| addr),
        };
        st.pending.remove(&consumer.key());
        done.push((consumer, result));
    }
    // Written now, whoever owns a batch: the library is loaded and its callers may run.
    for (consumer, e) in flush(&mut st) {
        if let Some(d) = done.iter_mut().find(|(c, _)| *c == consumer) {
            d.1 = Err(e);
        }
    }
    let hook = ON_ARMED.load(Ordering::Acquire);
    if hook != 0 {
        // SAFETY: set only to a `fn(usize, usize)` by a front-end at start-up.
        let hook: fn(usize, usize) = unsafe { core::mem::transmute::<usize, fn(usize, usize)>(hook) };
        for (consumer, result) in &done {
            if let Ok(addr) = result {
                hook(consumer.key(), *addr);
            }
        }
    }
    done
}

/// Forgets the probes whose code is no longer mapped (after `dlclose`): "module:symbol"
/// probes go back to pending, to be armed when the module is loaded again; the others are
/// returned, with their address, as gone.
pub fn drop_unmapped() -> Vec<(Consumer, usize)> {
    let mut st = state();
    if !st.batch.is_empty() {
        flush(&mut st);
    }
    let maps = st.view.maps(None);
    let gone: Vec<(usize, usize)> = st
        .registered
        .iter()
        .filter(|&(_, addr)| !crate::base::maps::find(&maps, addr).is_some_and(|m| m.exec))
        .collect();
    let mut dropped = Vec::new();
    for (key, addr) in gone {
        st.registered.remove(key);
        semaphore::forget(key);
        let Some(pp) = table::lookup(addr) else { continue };
        let mut probes = pp.probes();
        let Some(&consumer) = probes.iter().find(|c| c.key() == key) else { continue };
        probes.retain(|c| c.key() != key);
        // The code is gone, and its int3 with it: nothing to write back.
        pp.publish(probes);
        // SAFETY: registered probe objects stay valid until unregistered.
        let probe = unsafe { &*consumer.placement() };
        match target_of(probe) {
            Ok(Where::Symbol(name, _)) if name.contains(':') => {
                st.pending.insert(key, Pending { is_return: consumer.is_return(), placed_before: true });
            }
            _ => dropped.push((consumer, addr)),
        }
    }
    dropped
}

thread_local! {
    /// The registry lock, held by the forking thread from `fork`'s prepare step until the
    /// parent and the child go on.
    static FORK_GUARD: std::cell::RefCell<Option<MutexGuard<'static, State>>> = const { std::cell::RefCell::new(None) };
}

/// `fork` prepare step: takes the registry lock, so that the child does not inherit it held by
/// a thread that does not exist there.
pub fn fork_prepare() {
    let guard = state();
    FORK_GUARD.with(|g| *g.borrow_mut() = Some(guard));
}

/// `fork`, parent side: lets the registry go.
pub fn fork_parent() {
    FORK_GUARD.with(|g| g.borrow_mut().take());
}

/// `fork`, child side (one thread). With `disarm`, the child gets its original code back:
/// every armed probe point is restored and forgotten, without waiting for a grace period (no
/// other thread exists).
pub fn fork_child(disarm: bool) {
    let Some(mut st) = FORK_GUARD.with(|g| g.borrow_mut().take()) else {
        return;
    };
    // A batch open in the parent (a fork from `uprobe_init`) has no owner here: the child,
    // alone, writes it now.
    flush(&mut st);
    st.batch = Batch::new();
    if !disarm {
        return;
    }
    let st = &mut *st;
    let mut changes: Vec<Change> =
        table::points().filter(|pp| pp.is_armed()).map(|pp| Change::new(pp, Target::Original)).collect();
    place::write(&mut changes, &mut Session::new(), &mut st.view, &mut st.slots);
    for c in &changes {
        // The old list is left allocated: a copied half-done hit may still hold it.
        c.pp.replace(Vec::new()).leak();
    }
    st.registered.clear();
    // Probes that wait for their module would be armed by a later session here: theirs
    // belonged to a session the child does not have (a runtime loaded by attach).
    if crate::probe::thread::pooled_states() {
        st.pending.clear();
    }
}
