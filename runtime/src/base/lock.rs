//! The runtime's mutex: a futex lock whose waits and wakes are raw system calls (std's mutex
//! calls libc's `syscall()` when contended, and libc may be probed). Normal context; never
//! taken on the hit path.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU32, Ordering};

use crate::base::sys;

const UNLOCKED: u32 = 0;
const LOCKED: u32 = 1;
/// Locked, and a thread may sleep on it.
const CONTENDED: u32 = 2;

pub struct Mutex<T> {
    state: AtomicU32,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through a guard, which only one thread holds at a time.
unsafe impl<T: Send> Sync for Mutex<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for Mutex<T> {}

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Mutex<T> {
        Mutex { state: AtomicU32::new(UNLOCKED), data: UnsafeCell::new(value) }
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        if self.state.compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_err() {
            while self.state.swap(CONTENDED, Ordering::Acquire) != UNLOCKED {
                sys::futex_wait(&self.state, CONTENDED, None);
            }
        }
        MutexGuard { lock: self }
    }

    /// The lock if it is free now, without waiting (code that may run where the lock's holder
    /// is the very thread it interrupted: a fatal signal's end-of-run report).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then_some(MutexGuard { lock: self })
    }

    fn unlock(&self) {
        if self.state.swap(UNLOCKED, Ordering::Release) == CONTENDED {
            sys::futex_wake(&self.state, 1);
        }
    }

    /// Releases a lock whose guard was forgotten (fork: the child's copy of a lock the
    /// forking thread held across `fork`, or one that a thread of the parent held).
    ///
    /// # Safety
    /// No guard of this lock may be in use.
    pub unsafe fn force_unlock(&self) {
        self.state.store(UNLOCKED, Ordering::Release);
    }
}

pub struct MutexGuard<'a, T> {
    lock: &'a Mutex<T>,
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard is the lock's only holder.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard is the lock's only holder.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excludes_across_threads() {
        static M: Mutex<u64> = Mutex::new(0);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..20_000 {
                        *M.lock() += 1;
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*M.lock(), 80_000);
    }
}
