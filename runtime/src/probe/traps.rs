//! Where an `int3` must not go: functions glibc runs with every signal blocked by a raw
//! system call, where the kernel answers a trap by killing the process (a blocked SIGTRAP
//! raised by the CPU cannot be delivered), or in a `posix_spawn` child after it reset every
//! signal handler to the default. A probe there takes the jump even under `--no-optimize`;
//! where a jump cannot be written it is refused.
//!
//! The list was measured on glibc 2.36 by probing every libc function entry with `int3` and
//! bisecting the sets that killed threaded programs, `posix_spawn`, `system`, `popen`,
//! `make -j2` and Python: see the table of docs/hazards.md.
//!
//! Pure: names in, answers out.

/// (function, where glibc runs it with every signal blocked).
const TRAP_UNSAFE: &[(&str, &str)] = &[
    ("__ctype_init", "a new thread, before its signal mask is set"),
    ("_setjmp", "a new thread, before its signal mask is set"),
    ("__sigsetjmp", "a new thread, before its signal mask is set"),
    ("getpagesize", "an exiting thread"),
    ("__getpagesize", "an exiting thread"),
    ("madvise", "an exiting thread"),
    ("__madvise", "an exiting thread"),
    ("munmap", "an exiting thread, and posix_spawn"),
    ("__munmap", "an exiting thread, and posix_spawn"),
    ("free", "an exiting detached thread"),
    ("__libc_free", "an exiting detached thread"),
    ("cfree", "an exiting detached thread"),
    ("__lll_lock_wait_private", "thread start and exit"),
    ("__lll_lock_wake_private", "thread start and exit"),
    ("__libc_sigaction", "a posix_spawn child"),
    ("sigprocmask", "a posix_spawn child"),
    ("pthread_sigmask", "a posix_spawn child"),
    ("execve", "a posix_spawn child"),
    ("dup2", "a posix_spawn child"),
    ("__dup2", "a posix_spawn child"),
    ("getuid", "a posix_spawn child"),
    ("getgid", "a posix_spawn child"),
    ("getenv", "a posix_spawnp child (PATH search)"),
    ("strchrnul", "a posix_spawnp child (PATH search)"),
    ("strchr", "a posix_spawnp child (PATH search)"),
    ("index", "a posix_spawnp child (PATH search)"),
    ("mempcpy", "a posix_spawnp child (PATH search)"),
    ("__mempcpy", "a posix_spawnp child (PATH search)"),
    ("strlen", "a posix_spawnp child (PATH search)"),
    ("strnlen", "a posix_spawnp child (PATH search)"),
    ("strncmp", "a posix_spawnp child (PATH search)"),
    ("__libc_alloca_cutoff", "a posix_spawnp child (PATH search)"),
];

/// Whether `module` (a path) is the C library the list is about.
pub fn is_libc(module: &str) -> bool {
    module.rsplit('/').next().is_some_and(|base| base.starts_with("libc.so"))
}

/// The functions of the list, with where glibc runs them with every signal blocked.
pub fn list() -> &'static [(&'static str, &'static str)] {
    TRAP_UNSAFE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_about_libc() {
        assert!(is_libc("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!is_libc("/usr/lib/x86_64-linux-gnu/libcrypt.so.1") || is_libc("libc.so.6"));
        assert!(!is_libc("/usr/bin/myprog"));
        assert!(list().iter().any(|(f, _)| *f == "madvise"));
    }
}
