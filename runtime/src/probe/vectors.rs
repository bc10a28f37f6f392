//! Which probes skip the vector save without declaring `UPROBE_NO_VECTORS`: at registration,
//! the code of a probe's handlers is read (`insn::vecfree`) inside the mapping that holds each
//! one, and a probe whose handlers all use general registers only is marked in its object's
//! runtime word ([`Consumer::code_word`]) before it joins its point's list. The registered
//! return probes that need the save are counted ([`NEEDY_RETURNS`]): while none does, the
//! return trampoline skips it without asking.
//!
//! Normal context, under the registry lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::base::{output, usercopy};
use crate::insn::vecfree::{self, Touches};
use crate::probe::symbols::View;
use crate::probe::table::{Consumer, VECTOR_FREE_CODE};

/// The handlers' entries of `consumer` (none set: none).
fn handlers(consumer: Consumer) -> Vec<usize> {
    // SAFETY: a probe object being registered is valid (C ABI).
    unsafe {
        match consumer {
            Consumer::Uprobe(u) => (*u).handler.map(|h| h as usize).into_iter().collect(),
            Consumer::Uretprobe(rp) => [(*rp).handler.map(|h| h as usize), (*rp).entry_handler.map(|h| h as usize)]
                .into_iter()
                .flatten()
                .collect(),
        }
    }
}

/// Reads the code of the handler at `entry`, within its mapping, which must not be writable
/// (once per handler while the modules stay; `verbose`: says what was found).
fn check(view: &mut View, entry: usize, verbose: bool) -> bool {
    if let Some(known) = view.handler_code.get(&entry) {
        return known.is_ok();
    }
    // Code in writable memory may be other code by the time it runs: not read.
    let found = match view.mapping(entry).filter(|m| m.read && m.exec && !m.write) {
        None => Err(Touches::Unreadable { at: entry as u64 }),
        Some(m) => vecfree::check(entry as u64, &mut |addr, buf| {
            let n = buf.len().min(m.end.saturating_sub(addr) as usize);
            if addr < m.start || n == 0 || !usercopy::copy(&mut buf[..n], addr as usize) {
                return 0;
            }
            n
        }),
    };
    if verbose {
        let name =
            view.symbolize(entry).map_or_else(|| format!("{entry:#x}"), |n| n.trim_end_matches("+0x0").to_string());
        match &found {
            Ok(()) => {
                output::message(format_args!("handler {name} touches no vector register: its hits skip their save"))
            }
            Err(why) => {
                output::message(format_args!("handler {name} may touch vector registers ({why}): its hits save them"))
            }
        }
    }
    let ok = found.is_ok();
    view.handler_code.insert(entry, found);
    ok
}

/// Marks `consumer` (being registered) whether its handlers' code is free of vector
/// instructions (no handler: nothing runs); a probe that declares `UPROBE_NO_VECTORS` is not
/// read.
pub fn mark(view: &mut View, consumer: Consumer, verbose: bool) {
    // SAFETY: a probe object being registered is valid (C ABI).
    let declared = unsafe { (*consumer.placement()).vector_free() };
    let free = !declared && handlers(consumer).into_iter().all(|h| check(view, h, verbose));
    consumer.code_word().store(if free { VECTOR_FREE_CODE } else { 0 }, Ordering::Relaxed);
}

/// How many registered return probes need the vector registers saved ([`Registered`], counted
/// before a probe's list is published): while none does, the trampoline saves them
/// for no return and asks no record (a record of an older one, unregistered since, runs no
/// handler; one that does finds them unsaved and saves them around its handler).
pub static NEEDY_RETURNS: AtomicUsize = AtomicUsize::new(0);

/// The registered probes: each one's key (its object's address) and the address it was placed
/// at, counting the return probes that need the vector registers saved (see
/// [`NEEDY_RETURNS`], which the return trampoline reads).
#[derive(Default)]
pub struct Registered {
    by_key: BTreeMap<usize, (usize, bool)>,
}

impl Registered {
    pub const fn new() -> Registered {
        Registered { by_key: BTreeMap::new() }
    }

    /// Notes `consumer`, placed at `addr` and marked (see [`mark`]), before it joins a list.
    pub fn insert(&mut self, consumer: Consumer, addr: usize) {
        let needy = consumer.is_return() && consumer.needs_vectors();
        if needy {
            NEEDY_RETURNS.fetch_add(1, Ordering::SeqCst);
        }
        if let Some((_, was_needy)) = self.by_key.insert(consumer.key(), (addr, needy)) {
            Self::forget(was_needy);
        }
    }

    /// Forgets the probe `key`, and gives where it was placed.
    pub fn remove(&mut self, key: usize) -> Option<usize> {
        let (addr, needy) = self.by_key.remove(&key)?;
        Self::forget(needy);
        Some(addr)
    }

    fn forget(needy: bool) {
        if needy {
            NEEDY_RETURNS.fetch_sub(1, Ordering::SeqCst);
        }
    }

    pub fn clear(&mut self) {
        for (_, (_, needy)) in core::mem::take(&mut self.by_key) {
            Self::forget(needy);
        }
    }

    pub fn contains_key(&self, key: &usize) -> bool {
        self.by_key.contains_key(key)
    }

    /// The probes' keys and addresses.
    pub fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.by_key.iter().map(|(&key, &(addr, _))| (key, addr))
    }

    /// The addresses the probes were placed at.
    pub fn values(&self) -> impl Iterator<Item = usize> + '_ {
        self.by_key.values().map(|&(addr, _)| addr)
    }
}
