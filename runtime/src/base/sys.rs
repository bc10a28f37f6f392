//! Every system call the runtime makes goes through here, as a raw `syscall` instruction:
//! never through a libc wrapper, because any libc function may carry a probe, and the
//! runtime must not hit its own probes while it places them (or anywhere else). Each call is
//! counted by kind ([`crate::base::stats`]). Raw calls return `-errno` and leave `errno`
//! alone.
//!
//! Every function here is async-signal-safe unless its doc says otherwise.

use core::ffi::CStr;

use crate::base::stats::{self, Call};

/// A raw errno value.
pub type Errno = i32;

pub const PAGE_SIZE: usize = 4096;

pub fn page_floor(addr: usize) -> usize {
    addr & !(PAGE_SIZE - 1)
}

pub fn page_ceil(addr: usize) -> usize {
    (addr + PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}

/// One raw system call with up to six arguments.
///
/// # Safety
/// The arguments must be what the kernel expects for `nr`; pointers must be valid for what
/// the call reads or writes.
#[inline(always)]
unsafe fn raw(nr: libc::c_long, args: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the x86-64 syscall convention (rax, then rdi rsi rdx r10 r8 r9; rcx and r11
    // clobbered, the result in rax); the caller vouches for the arguments.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") args[0],
            in("rsi") args[1],
            in("rdx") args[2],
            in("r10") args[3],
            in("r8") args[4],
            in("r9") args[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// A counted raw call; `Err(errno)` for the kernel's negative returns.
///
/// # Safety
/// As `raw`.
pub unsafe fn call(kind: Call, nr: libc::c_long, args: [usize; 6]) -> Result<usize, Errno> {
    stats::count_syscall(kind);
    // SAFETY: the caller's promise, passed on.
    let ret = unsafe { raw(nr, args) };
    if (-4095..0).contains(&ret) {
        Err(-ret as Errno)
    } else {
        Ok(ret as usize)
    }
}

/// errno's offset from the thread pointer (libc's static TLS), measured by [`init_errno`].
static ERRNO_OFFSET: core::sync::atomic::AtomicIsize = core::sync::atomic::AtomicIsize::new(isize::MIN);

/// The calling thread's thread pointer (`%fs:0` holds its own address on x86-64).
#[inline(always)]
pub fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reading the TCB self pointer has no side effects.
    unsafe { core::arch::asm!("mov {}, qword ptr fs:0", out(reg) tp, options(nostack, readonly, preserves_flags)) };
    tp
}

/// Measures errno's offset from the thread pointer (start-up, before any probe is placed).
pub fn init_errno() {
    // SAFETY: __errno_location returns this thread's errno slot.
    let at = unsafe { libc::__errno_location() } as usize;
    ERRNO_OFFSET.store(at.wrapping_sub(thread_pointer()) as isize, core::sync::atomic::Ordering::Relaxed);
}

/// The address of the calling thread's errno (signal-safe, no call).
#[inline(always)]
pub fn errno_location() -> *mut i32 {
    let offset = ERRNO_OFFSET.load(core::sync::atomic::Ordering::Relaxed);
    if offset == isize::MIN {
        // SAFETY: as in `init_errno` (not measured yet: before start-up).
        return unsafe { libc::__errno_location() };
    }
    thread_pointer().wrapping_add(offset as usize) as *mut i32
}

/// Reads errno.
#[inline(always)]
pub fn errno() -> Errno {
    // SAFETY: errno_location gives this thread's errno slot, valid for the thread's life.
    unsafe { *errno_location() }
}

/// The 8 bytes at `addr` of this process, or None where they are not mapped readable. A
/// system call, not a load: it cannot fault, whatever the signal mask and handlers are (a
/// thread glibc runs with every signal blocked, a posix_spawn child).
pub fn read_u64_checked(addr: usize) -> Option<u64> {
    let mut value = 0u64;
    let local = libc::iovec { iov_base: (&mut value as *mut u64).cast(), iov_len: 8 };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: 8 };
    // SAFETY: the kernel writes at most 8 bytes into `value` and reads nothing of ours but the
    // two iovecs; a bad `addr` is an EFAULT, not a fault.
    let n = unsafe {
        call(
            Call::Other,
            libc::SYS_process_vm_readv,
            [getpid() as usize, &local as *const libc::iovec as usize, 1, &remote as *const libc::iovec as usize, 1, 0],
        )
    };
    (n == Ok(8)).then_some(value)
}

/// Whether thread `tid` of this process still exists.
pub fn thread_exists(tid: i32) -> bool {
    // SAFETY: signal 0 only checks that the target exists.
    let rc = unsafe { raw(libc::SYS_tgkill, [getpid() as usize, tid as usize, 0, 0, 0, 0]) };
    rc != -(libc::ESRCH as isize)
}

/// Whether thread `tid` of process `pid` still exists (any process: per-thread storage shared
/// with forked children names its owners by both).
pub fn thread_alive(pid: i32, tid: i32) -> bool {
    // SAFETY: signal 0 only checks that the target exists.
    let rc = unsafe { raw(libc::SYS_tgkill, [pid as usize, tid as usize, 0, 0, 0, 0]) };
    rc != -(libc::ESRCH as isize)
}

/// The calling thread's name as the kernel keeps it (`comm`, NUL-padded; PR_GET_NAME).
pub fn thread_name() -> [u8; 16] {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes to the buffer it is given.
    let _ = unsafe { raw(libc::SYS_prctl, [libc::PR_GET_NAME as usize, name.as_mut_ptr() as usize, 0, 0, 0, 0]) };
    name
}

pub fn getpid() -> i32 {
    // SAFETY: getpid takes no arguments.
    unsafe { raw(libc::SYS_getpid, [0; 6]) as i32 }
}

/// The calling thread's id.
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments.
    unsafe { raw(libc::SYS_gettid, [0; 6]) as i32 }
}

/// Maps `len` bytes of fresh anonymous memory exactly at `addr`, never replacing a mapping.
pub fn mmap_anon_at(addr: usize, len: usize, prot: i32) -> Result<usize, Errno> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    // SAFETY: MAP_FIXED_NOREPLACE never unmaps anything; the kernel either maps at `addr` or fails.
    let got = unsafe { call(Call::Mmap, libc::SYS_mmap, [addr, len, prot as usize, flags as usize, usize::MAX, 0])? };
    if got != addr {
        // Kernels before 4.17 treat the flag as a hint: give the mapping back.
        // SAFETY: `got` is the mapping just created, of `len` bytes, referenced by nobody.
        unsafe { munmap(got, len) };
        return Err(libc::EEXIST);
    }
    Ok(addr)
}

/// Maps `len` bytes of anonymous read-write memory anywhere.
pub fn mmap_anon(len: usize) -> Result<usize, Errno> {
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as usize;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as usize;
    // SAFETY: an anonymous private mapping with no fixed address touches no existing memory.
    unsafe { call(Call::Mmap, libc::SYS_mmap, [0, len, prot, flags, usize::MAX, 0]) }
}

/// Reserves `len` bytes of anonymous read-write memory that costs nothing until touched
/// (MAP_NORESERVE): per-thread buffers sized for the worst case.
pub fn mmap_reserve(len: usize) -> Result<usize, Errno> {
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as usize;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as usize;
    // SAFETY: an anonymous private mapping with no fixed address touches no existing memory.
    unsafe { call(Call::Mmap, libc::SYS_mmap, [0, len, prot, flags, usize::MAX, 0]) }
}

/// Reserves `len` bytes of anonymous read-write memory shared with the children this process
/// forks (MAP_SHARED, MAP_NORESERVE: it costs nothing until touched): per-thread counters that
/// a child's threads keep adding to, as the kernel's counts include a child's hits.
pub fn mmap_shared_reserve(len: usize) -> Result<usize, Errno> {
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as usize;
    let flags = (libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as usize;
    // SAFETY: an anonymous mapping with no fixed address touches no existing memory.
    unsafe { call(Call::Mmap, libc::SYS_mmap, [0, len, prot, flags, usize::MAX, 0]) }
}

/// Makes the pages of `[addr, addr + len)` present and writable without changing their
/// contents (MADV_POPULATE_WRITE, Linux 5.14): a ring's next pages, faulted in by the drain
/// thread instead of the hit path. Where the kernel lacks it, nothing happens.
pub fn populate_write(addr: usize, len: usize) {
    const MADV_POPULATE_WRITE: usize = 23;
    // SAFETY: the advice only faults pages in; the range is a reservation of ours.
    let _ = unsafe { call(Call::Other, libc::SYS_madvise, [addr, len, MADV_POPULATE_WRITE, 0, 0, 0]) };
}

/// Gives back a mapping made by one of the `mmap_*` functions.
///
/// # Safety
/// Nothing may use the range afterwards.
pub unsafe fn munmap(addr: usize, len: usize) {
    // SAFETY: the caller guarantees the range is an unused mapping of ours.
    let _ = unsafe { call(Call::Munmap, libc::SYS_munmap, [addr, len, 0, 0, 0, 0]) };
}

/// Changes the protection of whole pages.
pub fn mprotect(addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
    // SAFETY: mprotect only changes access rights; callers never drop PROT_EXEC from text that
    // may be running, so no thread can fault on it.
    unsafe { call(Call::Mprotect, libc::SYS_mprotect, [addr, len, prot as usize, 0, 0, 0]).map(drop) }
}

/// Writes all of `buf` to `fd`, retrying on EINTR and short writes; an error comes with how
/// many bytes were written before it (a write cut short, as by a reader that went away).
pub fn write_all(fd: i32, mut buf: &[u8]) -> Result<(), (Errno, usize)> {
    let len = buf.len();
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid readable slice for its length.
        match unsafe { call(Call::Write, libc::SYS_write, [fd as usize, buf.as_ptr() as usize, buf.len(), 0, 0, 0]) } {
            Ok(n) => buf = &buf[n.min(buf.len())..],
            Err(libc::EINTR) => continue,
            Err(e) => return Err((e, len - buf.len())),
        }
    }
    Ok(())
}

/// Opens `path` read-only, close-on-exec.
pub fn open_read(path: &CStr) -> Result<i32, Errno> {
    let flags = (libc::O_RDONLY | libc::O_CLOEXEC) as usize;
    // SAFETY: a NUL-terminated path; openat with AT_FDCWD reads nothing else.
    unsafe { call(Call::Open, libc::SYS_openat, [libc::AT_FDCWD as usize, path.as_ptr() as usize, flags, 0, 0, 0]) }
        .map(|fd| fd as i32)
}

/// Opens `path` for appending (created with mode 0644 if missing), close-on-exec.
pub fn open_append(path: &CStr) -> Result<i32, Errno> {
    let flags = (libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC) as usize;
    // SAFETY: as in `open_read`.
    unsafe { call(Call::Open, libc::SYS_openat, [libc::AT_FDCWD as usize, path.as_ptr() as usize, flags, 0o644, 0, 0]) }
        .map(|fd| fd as i32)
}

/// A close-on-exec duplicate of `fd` numbered `floor` or above.
pub fn dup_at_least(fd: i32, floor: i32) -> Result<i32, Errno> {
    // SAFETY: duplicating a descriptor has no memory effects.
    unsafe {
        call(Call::Other, libc::SYS_fcntl, [fd as usize, libc::F_DUPFD_CLOEXEC as usize, floor as usize, 0, 0, 0])
    }
    .map(|fd| fd as i32)
}

pub fn close(fd: i32) {
    // SAFETY: closing a descriptor has no memory effects.
    let _ = unsafe { call(Call::Close, libc::SYS_close, [fd as usize, 0, 0, 0, 0, 0]) };
}

/// Reads up to `buf.len()` bytes from `fd`.
pub fn read(fd: i32, buf: &mut [u8]) -> Result<usize, Errno> {
    loop {
        // SAFETY: `buf` is a valid writable slice for its length.
        match unsafe { call(Call::Read, libc::SYS_read, [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0]) }
        {
            Err(libc::EINTR) => continue,
            other => return other,
        }
    }
}

/// The whole content of a (small, or pseudo) file such as `/proc/self/maps`. Normal context:
/// it allocates.
pub fn read_file(path: &CStr) -> Result<Vec<u8>, Errno> {
    let fd = open_read(path)?;
    let mut data: Vec<u8> = Vec::with_capacity(16 * 1024);
    let result = loop {
        if data.capacity() - data.len() < 4096 {
            data.reserve(data.capacity());
        }
        let len = data.len();
        let spare = data.capacity() - len;
        // SAFETY: the spare capacity is allocated; `read` initialises what it reports.
        let buf = unsafe { core::slice::from_raw_parts_mut(data.as_mut_ptr().add(len), spare) };
        match read(fd, buf) {
            Ok(0) => break Ok(()),
            // SAFETY: `n` bytes past `len` were just written.
            Ok(n) => unsafe { data.set_len(len + n) },
            Err(e) => break Err(e),
        }
    };
    close(fd);
    result.map(|()| data)
}

/// A file mapped read-only (`ino`: its inode); unmapped when dropped.
pub struct MappedFile {
    addr: usize,
    len: usize,
    pub ino: u64,
}

impl MappedFile {
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the mapping covers `len` readable bytes for the life of `self`.
        unsafe { core::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: our own mapping; `bytes` borrows end with `self`.
            unsafe { munmap(self.addr, self.len) };
        }
    }
}

/// Maps the file at `path` read-only (ELF files: no copy through a read buffer).
pub fn map_file(path: &CStr) -> Result<MappedFile, Errno> {
    let fd = open_read(path)?;
    // SAFETY: a zeroed stat is valid output space for fstat.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is writable and of the kernel's struct stat layout on x86-64.
    let size =
        unsafe { call(Call::Other, libc::SYS_fstat, [fd as usize, &mut st as *mut libc::stat as usize, 0, 0, 0, 0]) }
            .map(|_| st.st_size as usize);
    let (ino, (prot, flags)) = (st.st_ino, (libc::PROT_READ as usize, libc::MAP_PRIVATE as usize));
    let mapped = size.and_then(|len| match len {
        0 => Ok(MappedFile { addr: 0, len: 0, ino }),
        // SAFETY: a fresh read-only mapping of an open file touches no existing memory.
        _ => unsafe { call(Call::Mmap, libc::SYS_mmap, [0, len, prot, flags, fd as usize, 0]) }
            .map(|addr| MappedFile { addr, len, ino }),
    });
    close(fd);
    mapped
}

/// The target of the symbolic link at `path`.
pub fn readlink(path: &CStr) -> Result<String, Errno> {
    let mut buf = [0u8; 4096];
    // SAFETY: a NUL-terminated path and a writable buffer of the length passed.
    let n = unsafe {
        call(
            Call::Other,
            libc::SYS_readlinkat,
            [libc::AT_FDCWD as usize, path.as_ptr() as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0],
        )?
    };
    Ok(String::from_utf8_lossy(&buf[..n.min(buf.len())]).into_owned())
}

/// Whether `path` (relative to `dirfd`; `flags` may hold `AT_SYMLINK_NOFOLLOW`) is a
/// regular file the process may execute: what `execve` checks first.
pub fn may_execute_at(dirfd: i32, path: &CStr, flags: i32) -> bool {
    // SAFETY: a zeroed stat is a valid buffer for the kernel to fill.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a writable stat buffer.
    let stat = unsafe {
        call(
            Call::Other,
            libc::SYS_newfstatat,
            [dirfd as usize, path.as_ptr() as usize, &mut st as *mut libc::stat as usize, flags as usize, 0, 0],
        )
    };
    if stat.is_err() || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return false;
    }
    let args = [dirfd as usize, path.as_ptr() as usize, libc::X_OK as usize, (flags | libc::AT_EACCESS) as usize, 0, 0];
    // SAFETY: a NUL-terminated path and plain integers.
    match unsafe { call(Call::Other, libc::SYS_faccessat2, args) } {
        // Kernels before 5.8: faccessat, which checks with the real ids (the same here:
        // the runtime never runs in a setuid program).
        Err(libc::ENOSYS) => {
            // SAFETY: as above.
            unsafe { call(Call::Other, libc::SYS_faccessat, [args[0], args[1], args[2], 0, 0, 0]).is_ok() }
        }
        other => other.is_ok(),
    }
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: usize = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: usize = 1 << 4;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: usize = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: usize = 1 << 6;

fn membarrier(cmd: usize) -> bool {
    // SAFETY: membarrier takes plain integers and has no memory effects on the caller.
    unsafe { call(Call::Membarrier, libc::SYS_membarrier, [cmd, 0, 0, 0, 0, 0]).is_ok() }
}

/// Registers the process for core-serialising membarriers; false where the kernel lacks them.
pub fn membarrier_register_sync_core() -> bool {
    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE)
}

/// Makes every thread of the process serialise its instruction stream before it next runs
/// user code, so all of them see freshly written text.
pub fn membarrier_sync_core() -> bool {
    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)
}

/// Registers the process for private expedited membarriers; false where the kernel lacks them.
pub fn membarrier_register_private_expedited() -> bool {
    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
}

/// Makes every running thread of the process execute a full memory barrier.
pub fn membarrier_private_expedited() {
    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
}

/// The FS segment base of the calling thread.
pub fn fs_base() -> u64 {
    let mut base: u64 = 0;
    // SAFETY: ARCH_GET_FS writes one u64 to the pointer we pass.
    let _ = unsafe { call(Call::Other, libc::SYS_arch_prctl, [0x1003, &mut base as *mut u64 as usize, 0, 0, 0, 0]) };
    base
}

/// The GS segment base of the calling thread.
pub fn gs_base() -> u64 {
    let mut base: u64 = 0;
    // SAFETY: ARCH_GET_GS writes one u64 to the pointer we pass.
    let _ = unsafe { call(Call::Other, libc::SYS_arch_prctl, [0x1004, &mut base as *mut u64 as usize, 0, 0, 0, 0]) };
    base
}

/// Sets the calling thread's signal mask to `mask` (signals 1..=64 as bits 0..=63) and
/// returns the old one; a raw call, past the interposed `sigprocmask`.
pub fn set_signal_mask(mask: u64) -> u64 {
    let mut old: u64 = 0;
    // SAFETY: rt_sigprocmask reads and writes one 8-byte kernel sigset each.
    let _ = unsafe {
        call(
            Call::Other,
            libc::SYS_rt_sigprocmask,
            [libc::SIG_SETMASK as usize, &mask as *const u64 as usize, &mut old as *mut u64 as usize, 8, 0, 0],
        )
    };
    old
}

/// Sleeps for `ns` nanoseconds (or until a signal).
pub fn sleep_ns(ns: u64) {
    let ts = libc::timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 };
    // SAFETY: nanosleep reads one timespec; no remainder is asked for.
    let _ = unsafe { call(Call::Other, libc::SYS_nanosleep, [&ts as *const libc::timespec as usize, 0, 0, 0, 0, 0]) };
}

pub fn sched_yield() {
    // SAFETY: sched_yield takes no arguments.
    let _ = unsafe { call(Call::Other, libc::SYS_sched_yield, [0; 6]) };
}

/// Sleeps while `*word == expected` (or until woken, or a signal; or `ns` have passed).
pub fn futex_wait(word: &core::sync::atomic::AtomicU32, expected: u32, ns: Option<u64>) {
    let op = (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as usize;
    let ts = ns.map(|ns| libc::timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 });
    let timeout = ts.as_ref().map_or(0, |t| t as *const libc::timespec as usize);
    // SAFETY: the kernel only reads the aligned u32 behind a live reference, and the timespec.
    let _ =
        unsafe { call(Call::Futex, libc::SYS_futex, [word.as_ptr() as usize, op, expected as usize, timeout, 0, 0]) };
}

/// Wakes up to `n` threads sleeping on `word`.
pub fn futex_wake(word: &core::sync::atomic::AtomicU32, n: u32) {
    let op = (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as usize;
    // SAFETY: as in `futex_wait`.
    let _ = unsafe { call(Call::Futex, libc::SYS_futex, [word.as_ptr() as usize, op, n as usize, 0, 0, 0]) };
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: the kernel writes one timespec to the pointer we pass.
    let _ = unsafe {
        call(
            Call::Other,
            libc::SYS_clock_gettime,
            [libc::CLOCK_MONOTONIC as usize, &mut ts as *mut libc::timespec as usize, 0, 0, 0, 0],
        )
    };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Blocks the signals of `mask` (bit n-1 for signal n) on the calling thread; returns the
/// mask it had.
pub fn block_signals(mask: u64) -> u64 {
    sigmask(libc::SIG_BLOCK, mask)
}

fn sigmask(how: i32, mask: u64) -> u64 {
    let mut old: u64 = 0;
    let args = [how as usize, &mask as *const u64 as usize, &mut old as *mut u64 as usize, 8, 0, 0];
    // SAFETY: rt_sigprocmask reads and writes one 8-byte set each, both live locals.
    let _ = unsafe { call(Call::Other, libc::SYS_rt_sigprocmask, args) };
    old
}

/// The value of the auxiliary vector entry `kind` (`AT_*`), from /proc/self/auxv.
pub fn auxv(kind: u64) -> Option<u64> {
    let data = read_file(c"/proc/self/auxv").ok()?;
    data.chunks_exact(16)
        .map(|e| {
            let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
            (word(&e[..8]), word(&e[8..]))
        })
        .find(|&(k, _)| k == kind)
        .map(|(_, v)| v)
}

/// Arms (or, with 0, cancels) the process's SIGALRM timer.
pub fn alarm(seconds: u32) {
    // SAFETY: alarm takes a plain integer.
    let _ = unsafe { call(Call::Other, libc::SYS_alarm, [seconds as usize, 0, 0, 0, 0, 0]) };
}

/// Ends the process at once without running exit handlers.
pub fn exit_now(status: i32) -> ! {
    loop {
        // SAFETY: exit_group does not return.
        unsafe { raw(libc::SYS_exit_group, [status as usize, 0, 0, 0, 0, 0]) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_calls_report_errno_and_read_files() {
        assert_eq!(getpid(), std::process::id() as i32);
        assert_eq!(open_read(c"/nonexistent/file"), Err(libc::ENOENT));
        let maps = read_file(c"/proc/self/maps").unwrap();
        assert!(maps.len() > 100 && maps.ends_with(b"\n"));
        let exe = readlink(c"/proc/self/exe").unwrap();
        let mapped = map_file(&std::ffi::CString::new(exe).unwrap()).unwrap();
        assert_eq!(&mapped.bytes()[..4], b"\x7fELF");
        assert!(monotonic_ns() > 0);
        assert_eq!(auxv(libc::AT_PAGESZ), Some(4096));
        let word = 0x0102_0304_0506_0708u64;
        assert_eq!(read_u64_checked(&word as *const u64 as usize), Some(word));
        assert_eq!(read_u64_checked(8), None);
    }
}
