//! Which handler library owns a probe, told in one prepared line per probe object ("probe at
//! 0x... (sym+off) in /path/lib.so"), so that a fault in a handler can be named from a signal
//! handler: the line is made at registration (symbol, library path: `dladdr` is not
//! signal-safe); the fault path only looks it up.

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

const TABLE_SIZE: usize = 1 << 14;

/// Probe object (its address) -> "probe at 0x... (sym+off) in /path/lib.so".
static KEYS: [AtomicUsize; TABLE_SIZE] = [const { AtomicUsize::new(0) }; TABLE_SIZE];
static TEXTS: [AtomicPtr<String>; TABLE_SIZE] = [const { AtomicPtr::new(core::ptr::null_mut()) }; TABLE_SIZE];

fn slot(key: usize) -> usize {
    (key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) as usize >> (usize::BITS - 14)
}

/// The path of the shared object holding `addr` (normal context).
fn library_of(addr: usize) -> String {
    // SAFETY: dladdr only reads the loader's tables; dli_fname is a C string it owns.
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        if addr != 0 && libc::dladdr(addr as *const libc::c_void, &mut info) != 0 && !info.dli_fname.is_null() {
            return core::ffi::CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned();
        }
    }
    "an unknown object".into()
}

/// The text of a slot whose probe object was forgotten: the slot may be given to another
/// one (never dereferenced).
fn gone() -> *mut String {
    static GONE: u8 = 0;
    &GONE as *const u8 as *mut String
}

/// Prepares the line of probe object `key`, placed at `addr` (whose symbol is `symbol`), whose
/// handler is at `handler` (registration time, normal context).
pub fn describe(key: usize, addr: usize, symbol: Option<&str>, handler: usize) {
    let symbol = symbol.map_or_else(String::new, |s| format!(" ({s})"));
    let text = Box::into_raw(Box::new(format!("probe at {addr:#x}{symbol} in {}", library_of(handler))));
    // The key's own slot if it has one (its chain ends at an empty slot), else the first
    // empty or forgotten slot of the chain: probe objects at new addresses each session (a
    // handler library's heap) must not fill the table for good.
    'retry: loop {
        let mut i = slot(key);
        let mut free = None;
        for _ in 0..TABLE_SIZE {
            let k = KEYS[i].load(Ordering::Acquire);
            if k == key {
                // A replaced text is left allocated: a fault may be reading it.
                TEXTS[i].store(text, Ordering::Release);
                return;
            }
            if k == 0 || (free.is_none() && TEXTS[i].load(Ordering::Acquire) == gone()) {
                free.get_or_insert((i, k));
            }
            if k == 0 {
                break;
            }
            i = (i + 1) % TABLE_SIZE;
        }
        let Some((i, old)) = free else { break };
        let claimable = old == 0 || TEXTS[i].load(Ordering::Acquire) == gone();
        if !claimable || KEYS[i].compare_exchange(old, key, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            continue 'retry;
        }
        TEXTS[i].store(text, Ordering::Release);
        return;
    }
    // Full: no line for this probe (a fault in its handler is named without it).
    // SAFETY: from Box::into_raw above, never published.
    drop(unsafe { Box::from_raw(text) });
}

/// Frees the line of probe object `key`, which is unregistered and whose handlers can no
/// longer run (after a grace period): no fault path can be reading it. Its slot may then go
/// to another probe object.
pub fn forget(key: usize) {
    let mut i = slot(key);
    for _ in 0..TABLE_SIZE {
        match KEYS[i].load(Ordering::Acquire) {
            0 => return,
            k if k == key => {
                let text = TEXTS[i].swap(gone(), Ordering::AcqRel);
                if !text.is_null() && text != gone() {
                    // SAFETY: texts come from Box::into_raw in `describe`; this one is
                    // unpublished and no reader is left (see above).
                    drop(unsafe { Box::from_raw(text) });
                }
                return;
            }
            _ => i = (i + 1) % TABLE_SIZE,
        }
    }
}

/// The line of probe object `key` (signal-safe).
pub fn text_of(key: usize) -> Option<&'static str> {
    let mut i = slot(key);
    for _ in 0..TABLE_SIZE {
        match KEYS[i].load(Ordering::Acquire) {
            0 => return None,
            k if k == key => {
                let text = TEXTS[i].load(Ordering::Acquire);
                if text == gone() {
                    return None;
                }
                // SAFETY: a published text is freed only once its probe object is forgotten,
                // after which no fault path asks for it.
                return unsafe { text.as_ref() }.map(String::as_str);
            }
            _ => i = (i + 1) % TABLE_SIZE,
        }
    }
    None
}
