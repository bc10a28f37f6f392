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

/// Prepares the line of probe object `key`, placed at `addr` (whose symbol is `symbol`), whose
/// handler is at `handler` (registration time, normal context).
pub fn describe(key: usize, addr: usize, symbol: Option<&str>, handler: usize) {
    let symbol = symbol.map_or_else(String::new, |s| format!(" ({s})"));
    let text = Box::into_raw(Box::new(format!("probe at {addr:#x}{symbol} in {}", library_of(handler))));
    let mut i = slot(key);
    for _ in 0..TABLE_SIZE {
        match KEYS[i].compare_exchange(0, key, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => {}
            Err(k) if k == key => {}
            Err(_) => {
                i = (i + 1) % TABLE_SIZE;
                continue;
            }
        }
        // A replaced text is left allocated: a fault may be reading it.
        TEXTS[i].store(text, Ordering::Release);
        return;
    }
}

/// Frees the line of probe object `key`, which is unregistered and whose handlers can no
/// longer run (after a grace period): no fault path can be reading it.
pub fn forget(key: usize) {
    let mut i = slot(key);
    for _ in 0..TABLE_SIZE {
        match KEYS[i].load(Ordering::Acquire) {
            0 => return,
            k if k == key => {
                let text = TEXTS[i].swap(core::ptr::null_mut(), Ordering::AcqRel);
                if !text.is_null() {
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
                // SAFETY: texts are leaked and never freed.
                return unsafe { TEXTS[i].load(Ordering::Acquire).as_ref() }.map(String::as_str);
            }
            _ => i = (i + 1) % TABLE_SIZE,
        }
    }
    None
}
