//! A handler that faults. While a thread runs a probe's handler it records which probe that
//! is; the runtime's SIGSEGV/SIGBUS handler (see `signals`) then says which probe, which
//! handler library and which address, instead of the program dying silently or hanging, and
//! lets the default action follow.
//!
//! The line is prepared at registration (symbol, library path: `dladdr` is not signal-safe);
//! the fault path only looks it up and writes it.

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::output;

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

/// Prepares the fault line of probe object `key`, placed at `addr`, whose handler is at
/// `handler` (registration time).
pub fn describe(key: usize, addr: usize, handler: usize) {
    let symbol = crate::registry::symbolize(addr).map_or_else(String::new, |s| format!(" ({s})"));
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

fn text_of(key: usize) -> Option<&'static str> {
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

/// Marks the thread as running the handler of probe object `key`; pass the result to
/// [`leave`] (signal-safe).
pub fn enter(key: usize) -> usize {
    crate::thread::current().handling.replace(key)
}

pub fn leave(previous: usize) {
    crate::thread::current().handling.set(previous);
}

/// The probe object whose handler the thread is running (signal-safe).
pub fn current() -> Option<usize> {
    let key = crate::thread::current().handling.get();
    (key != 0).then_some(key)
}

/// Writes the line for a fault of `sig` at `fault_addr` in the handler of `key` (signal
/// context).
pub fn report(key: usize, sig: i32, fault_addr: usize) {
    let mut line = output::Line::new();
    line.push(b"uprobe-run: handler for ");
    line.push(text_of(key).unwrap_or("a probe").as_bytes());
    line.push(if sig == libc::SIGBUS { b" faulted: SIGBUS at " } else { b" faulted: SIGSEGV at " });
    let mut hex = [0u8; 18];
    let mut n = 0;
    let mut started = false;
    hex[..2].copy_from_slice(b"0x");
    for i in (0..16).rev() {
        let digit = (fault_addr >> (4 * i)) & 0xf;
        if digit != 0 || started || i == 0 {
            started = true;
            hex[2 + n] = b"0123456789abcdef"[digit];
            n += 1;
        }
    }
    line.push(&hex[..2 + n]);
    line.push(b"\n");
    output::emit(line.as_bytes());
}
