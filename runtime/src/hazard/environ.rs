//! The process environment, read and edited in place through `environ`, never through
//! `getenv`/`setenv`/`unsetenv`: a program may define those names itself (bash exports its
//! own `unsetenv`, which does nothing before bash has read its environment), and the runtime
//! must take itself out of what the program's children inherit whatever they do.
//!
//! Normal context, start-up: before the program's constructors, no other thread; [`value`]
//! also from the exec interposers.

use core::ffi::{c_char, CStr};
use std::ffi::CString;

/// The `NAME=value` entries, as (index, bytes).
fn entries() -> Vec<(usize, &'static [u8])> {
    let mut out = Vec::new();
    // SAFETY: `environ` is the process's NULL-terminated array of C strings; at start-up no
    // other thread changes it.
    unsafe {
        let env = libc::environ;
        if env.is_null() {
            return out;
        }
        let mut i = 0;
        while !(*env.add(i)).is_null() {
            out.push((i, CStr::from_ptr(*env.add(i)).to_bytes()));
            i += 1;
        }
    }
    out
}

fn value_of<'a>(entry: &'a [u8], name: &str) -> Option<&'a [u8]> {
    entry.strip_prefix(name.as_bytes()).and_then(|rest| rest.strip_prefix(b"="))
}

/// The value of `name`.
pub fn get(name: &str) -> Option<String> {
    value(name).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The value of `name` as the environment holds it, found without allocating (the exec
/// interposers use it, which may run in a signal handler).
pub fn value(name: &str) -> Option<&'static [u8]> {
    // At start-up no other thread changes `environ`, and an exec's caller does not change it
    // concurrently either (glibc's execvp reads it the same way).
    // SAFETY: `environ` is the process's NULL-terminated array of C strings, stable here.
    unsafe {
        let env = libc::environ;
        if env.is_null() {
            return None;
        }
        let mut i = 0;
        while !(*env.add(i)).is_null() {
            if let Some(v) = value_of(CStr::from_ptr(*env.add(i)).to_bytes(), name) {
                return Some(v);
            }
            i += 1;
        }
    }
    None
}

/// Removes every `name=` entry, closing the gap in the array.
pub fn remove(name: &str) {
    for (i, _) in entries().into_iter().rev().filter(|(_, e)| value_of(e, name).is_some()) {
        // SAFETY: `i` indexes a live entry of the NULL-terminated array; the shift moves the
        // later entries and the terminating NULL one place down, within the array.
        unsafe {
            let env = libc::environ;
            let mut j = i;
            while !(*env.add(j)).is_null() {
                *env.add(j) = *env.add(j + 1);
                j += 1;
            }
        }
    }
}

/// Gives `name` the value `value`, replacing its first entry (which must exist: the runtime
/// only rewrites variables it was started with). The new string is never freed: the
/// environment may hold it for the life of the process.
pub fn replace(name: &str, value: &str) -> bool {
    let Some((i, _)) = entries().into_iter().find(|(_, e)| value_of(e, name).is_some()) else {
        return false;
    };
    let Ok(entry) = CString::new(format!("{name}={value}")) else {
        return false;
    };
    let entry: *mut c_char = entry.into_raw();
    // SAFETY: `i` indexes a live entry; the old string is left alone (the loader or libc
    // owns it), the slot takes a string that lives forever.
    unsafe { *libc::environ.add(i) = entry };
    true
}
