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
//! The calls an exec makes, the function the program called and the `execve` glibc's
//! functions end in, would hit their probes after the report: they hit before it
//! (`probe::dispatch::hit_ahead`), with the registers the calls would have.
//!
//! Context: the program's calls, possibly from its signal handlers (exec is
//! async-signal-safe): nothing here allocates or calls libc.

use core::ffi::{c_char, c_int, CStr};
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::base::abi::PtRegs;
use crate::base::sys;
use crate::hazard::endings::{end, in_vfork_child, Ending};
use crate::hazard::environ;
use crate::probe::dispatch;

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
    // SAFETY: the trampoline passes its pushed registers; the caller's stack (its return
    // address, then any stack arguments) lies right above them.
    let (saved, entry_rsp) = unsafe { (&*saved, saved.add(1) as usize) };
    let Some(&(real, _, target)) = EXECS.get(index) else { return end(Ending::Exec) };
    let mut resolved = [0u8; 4096];
    // What the kernel will be asked to run, where it can be known (None: it cannot start).
    let file: Option<usize> = match target {
        Target::Path => runnable(libc::AT_FDCWD, saved.rdi as *const c_char, 0).then_some(saved.rdi),
        Target::Search => found_in_path(saved.rdi as *const c_char, &mut resolved),
        Target::At => {
            let flags = saved.r8 as c_int;
            let path = saved.rsi as *const c_char;
            // SAFETY: execveat's path argument is a C string (an empty one with AT_EMPTY_PATH).
            let empty = !path.is_null() && unsafe { *path } == 0;
            let by_descriptor = empty && flags & libc::AT_EMPTY_PATH != 0;
            (by_descriptor || runnable(saved.rdi as c_int, path, flags)).then_some(0)
        }
        Target::Fd => Some(0),
    };
    let Some(file) = file else { return };
    // A vfork child's calls hit their probes themselves: it reports nothing.
    if in_vfork_child() {
        return;
    }
    // The calls the exec makes would hit their probes only after the report: they hit now.
    let mut regs = PtRegs {
        rdi: saved.rdi as u64,
        rsi: saved.rsi as u64,
        rdx: saved.rdx as u64,
        rcx: saved.rcx as u64,
        r8: saved.r8 as u64,
        r9: saved.r9 as u64,
        rax: saved.rax as u64,
        rsp: entry_rsp as u64,
        ..PtRegs::default()
    };
    dispatch::hit_ahead(real.load(Ordering::Acquire), &mut regs);
    if index != EXECVE && matches!(target, Target::Path | Target::Search) {
        // glibc's exec functions end in `execve`, with the path found and an argument vector.
        let mut argv = [0usize; MAX_LISTED];
        let (args, envp) = arguments(index, saved, entry_rsp, &mut argv);
        let mut inner = PtRegs { rdi: file as u64, rsi: args as u64, rdx: envp as u64, rsp: entry_rsp as u64, ..regs };
        dispatch::hit_ahead(REAL_EXECVE.load(Ordering::Acquire), &mut inner);
    }
    end(Ending::Exec);
}

/// The trampolines' index of `execve`.
const EXECVE: usize = 0;
/// The most `execl` arguments read back into a vector for the `execve` hit.
const MAX_LISTED: usize = 256;

/// The argument vector and environment the exec function at `index` passes to `execve`:
/// its own for the `v` functions; for the `l` ones, the variadic list read back from the
/// registers and the caller's stack into `argv` (and, for `execle`, the environment after
/// its NULL); `environ` where the function takes none.
fn arguments(index: usize, saved: &Saved, entry_rsp: usize, argv: &mut [usize; MAX_LISTED]) -> (usize, usize) {
    // SAFETY: reading the process's `environ` pointer.
    let environ = unsafe { libc::environ } as usize;
    match index {
        // execv, execvp: (path, argv); execvpe: (file, argv, envp).
        1 | 2 => (saved.rsi, environ),
        3 => (saved.rsi, saved.rdx),
        // execl, execlp, execle: (path, arg0, ..., NULL[, envp]).
        _ => {
            let registers = [saved.rsi, saved.rdx, saved.rcx, saved.r8, saved.r9];
            // A variadic call's arguments past the sixth lie on the caller's stack above its
            // return address, up to and including the terminating NULL (and execle's envp after
            // it), as the C calling convention places them.
            let word = |i: usize| {
                registers.get(i).copied().unwrap_or_else(|| {
                    // SAFETY: `entry_rsp + 8 * (i - 4)` is such a stack argument (see above).
                    unsafe { *((entry_rsp + 8 * (i - 4)) as *const usize) }
                })
            };
            let mut n = 0;
            while n < MAX_LISTED - 1 {
                let arg = word(n);
                argv[n] = arg;
                if arg == 0 {
                    break;
                }
                n += 1;
            }
            argv[n] = 0;
            let envp = if index == 6 { word(n + 1) } else { environ };
            (argv.as_ptr() as usize, envp)
        }
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

/// What an `execvp`-style search runs: a name with a '/' is a path; otherwise each `PATH`
/// directory is tried (glibc's default when `PATH` is unset), the path found written into
/// `buf`. The address of the path, or None when nothing can run.
fn found_in_path(file: *const c_char, buf: &mut [u8; 4096]) -> Option<usize> {
    if file.is_null() {
        return None;
    }
    // SAFETY: the program passed `file` to exec as a C string.
    let name = unsafe { CStr::from_ptr(file) }.to_bytes();
    if name.is_empty() {
        return None;
    }
    if name.contains(&b'/') {
        return runnable(libc::AT_FDCWD, file, 0).then_some(file as usize);
    }
    let path = environ::value("PATH").unwrap_or(b"/bin:/usr/bin");
    let found = path.split(|&b| b == b':').any(|dir| {
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
    });
    found.then_some(buf.as_ptr() as usize)
}
