//! The `exec` family (`execve`, `execv`, `execvp`, `execvpe`, `execl`, `execlp`, `execle`,
//! `fexecve`, `execveat`), interposed so that the end-of-run report comes before the new
//! program replaces this one.
//!
//! An exec that fails returns to the program. Before reporting, the interposer checks what
//! the kernel will check first: that the file (or, for the `p` functions, one file in
//! `PATH`) exists, is a regular file and may be executed. An exec that fails that check,
//! like a shell's or Python's search through `PATH`, leaves the program probed, its report
//! still to come. One that passes and still fails (a bad ELF or interpreter, `E2BIG`) has
//! reported: the program goes on without probes and reports nothing more.
//!
//! Context: the program's calls, possibly from its signal handlers (exec is
//! async-signal-safe): nothing here allocates or calls libc.

use core::ffi::{c_char, c_int, CStr};
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::base::sys;
use crate::hazard::endings::{end, Ending};
use crate::hazard::environ;

/// What an exec function's first arguments name.
#[derive(Clone, Copy)]
enum Target {
    /// `rdi` is a path.
    Path,
    /// `rdi` is a file name searched in `PATH` unless it contains a '/'.
    Search,
    /// `rdi` is a descriptor (`fexecve`): not checked.
    Fd,
    /// `rdi` is a directory descriptor, `rsi` a path, `r8` the flags (`execveat`).
    At,
}

/// Finds libc's `name` for the trampoline whose target is `real`.
fn resolve(real: &AtomicUsize, name: &CStr) {
    if real.load(Ordering::Acquire) == 0 {
        // SAFETY: dlsym with RTLD_NEXT and a C string.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        real.store(p, Ordering::Release);
    }
}

/// Start-up: every trampoline gets somewhere to jump.
pub fn resolve_all() {
    for (real, name, _) in EXECS {
        resolve(real, name);
    }
}

/// An exec function interposed by a trampoline: it saves the argument registers (the
/// variadic ones take their arguments on the stack too, which stays untouched), runs
/// `before_exec` with them, restores them and jumps to libc's function, which returns to
/// the program itself if the exec fails.
macro_rules! exec_trampoline {
    ($name:ident, $real:ident, $index:literal) => {
        static $real: AtomicUsize = AtomicUsize::new(0);

        #[doc = concat!("`", stringify!($name), "`, interposed: see the module doc.")]
        ///
        /// # Safety
        /// The libc contract: the arguments reach libc's function untouched.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "push rdi",
                "push rsi",
                "push rdx",
                "push rcx",
                "push r8",
                "push r9",
                "push rax", // the vector register count of a variadic call
                // Seven pushes after the call's return address: the stack is aligned.
                "mov rdi, rsp",
                concat!("mov esi, ", $index),
                "call {before}",
                "pop rax",
                "pop r9",
                "pop r8",
                "pop rcx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "jmp qword ptr [rip + {real}]",
                before = sym before_exec,
                real = sym $real,
            )
        }
    };
}

exec_trampoline!(execve, REAL_EXECVE, 0);
exec_trampoline!(execv, REAL_EXECV, 1);
exec_trampoline!(execvp, REAL_EXECVP, 2);
exec_trampoline!(execvpe, REAL_EXECVPE, 3);
exec_trampoline!(execl, REAL_EXECL, 4);
exec_trampoline!(execlp, REAL_EXECLP, 5);
exec_trampoline!(execle, REAL_EXECLE, 6);
exec_trampoline!(fexecve, REAL_FEXECVE, 7);
exec_trampoline!(execveat, REAL_EXECVEAT, 8);

/// In the trampolines' index order.
const EXECS: [(&AtomicUsize, &CStr, Target); 9] = [
    (&REAL_EXECVE, c"execve", Target::Path),
    (&REAL_EXECV, c"execv", Target::Path),
    (&REAL_EXECVP, c"execvp", Target::Search),
    (&REAL_EXECVPE, c"execvpe", Target::Search),
    (&REAL_EXECL, c"execl", Target::Path),
    (&REAL_EXECLP, c"execlp", Target::Search),
    (&REAL_EXECLE, c"execle", Target::Path),
    (&REAL_FEXECVE, c"fexecve", Target::Fd),
    (&REAL_EXECVEAT, c"execveat", Target::At),
];

/// The argument registers as the trampoline pushed them.
#[repr(C)]
struct Saved {
    rax: usize,
    r9: usize,
    r8: usize,
    rcx: usize,
    rdx: usize,
    rsi: usize,
    rdi: usize,
}

/// Runs before an `exec` of the program: the report, unless the exec will surely fail.
/// First makes sure every trampoline has somewhere to jump (an exec before the runtime's
/// start-up, from another library's constructor).
extern "C" fn before_exec(saved: *const Saved, index: usize) {
    resolve_all();
    // SAFETY: the trampoline passes its pushed registers.
    let saved = unsafe { &*saved };
    let will_fail = match EXECS.get(index).map(|e| e.2) {
        Some(Target::Path) => !runnable(libc::AT_FDCWD, saved.rdi as *const c_char, 0),
        Some(Target::Search) => !found_in_path(saved.rdi as *const c_char),
        Some(Target::At) => {
            let flags = saved.r8 as c_int;
            let path = saved.rsi as *const c_char;
            // SAFETY: execveat's path argument is a C string (an empty one with AT_EMPTY_PATH).
            let empty = !path.is_null() && unsafe { *path } == 0;
            let by_descriptor = empty && flags & libc::AT_EMPTY_PATH != 0;
            if by_descriptor {
                false
            } else {
                !runnable(saved.rdi as c_int, path, flags)
            }
        }
        Some(Target::Fd) | None => false,
    };
    if !will_fail {
        end(Ending::Exec);
    }
}

/// Whether `path` (relative to `dirfd`) is a regular file this process may execute.
fn runnable(dirfd: c_int, path: *const c_char, flags: c_int) -> bool {
    if path.is_null() {
        return false;
    }
    // SAFETY: the program passed `path` to exec as a C string.
    let path = unsafe { CStr::from_ptr(path) };
    sys::may_execute_at(dirfd, path, flags & libc::AT_SYMLINK_NOFOLLOW)
}

/// Whether an `execvp`-style search finds something to run: a name with a '/' is a path;
/// otherwise each `PATH` directory is tried (glibc's default when `PATH` is unset).
fn found_in_path(file: *const c_char) -> bool {
    if file.is_null() {
        return false;
    }
    // SAFETY: the program passed `file` to exec as a C string.
    let name = unsafe { CStr::from_ptr(file) }.to_bytes();
    if name.is_empty() {
        return false;
    }
    if name.contains(&b'/') {
        return runnable(libc::AT_FDCWD, file, 0);
    }
    let path = environ::value("PATH").unwrap_or(b"/bin:/usr/bin");
    let mut buf = [0u8; 4096];
    path.split(|&b| b == b':').any(|dir| {
        // An empty entry is the current directory.
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let len = dir.len() + 1 + name.len();
        if len + 1 > buf.len() {
            return false;
        }
        buf[..dir.len()].copy_from_slice(dir);
        buf[dir.len()] = b'/';
        buf[dir.len() + 1..len].copy_from_slice(name);
        buf[len] = 0;
        CStr::from_bytes_with_nul(&buf[..=len]).is_ok_and(|p| sys::may_execute_at(libc::AT_FDCWD, p, 0))
    })
}
