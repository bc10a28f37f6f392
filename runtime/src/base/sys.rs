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
    // SAFETY: the x86-64 Linux syscall convention: number in rax, arguments in rdi, rsi, rdx,
    // r10, r8, r9; the kernel clobbers rcx and r11 and returns in rax. The caller vouches
    // for the arguments.
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
/// As [`raw`].
unsafe fn call(kind: Call, nr: libc::c_long, args: [usize; 6]) -> Result<usize, Errno> {
    stats::count_syscall(kind);
    // SAFETY: the caller's promise, passed on.
    let ret = unsafe { raw(nr, args) };
    if (-4095..0).contains(&ret) {
        Err(-ret as Errno)
    } else {
        Ok(ret as usize)
    }
}

/// Reads errno. Calls libc's `__errno_location`: only on a thread already marked busy (see
/// `probe::thread`), where a probe on it runs no handler.
pub fn errno() -> Errno {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() }
}

/// The address of the calling thread's errno (see [`errno`] for when it may be called).
pub fn errno_location() -> *mut i32 {
    // SAFETY: as in `errno`.
    unsafe { libc::__errno_location() }
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

/// Writes all of `buf` to `fd`, retrying on EINTR and short writes.
pub fn write_all(fd: i32, mut buf: &[u8]) -> Result<(), Errno> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid readable slice for its length.
        match unsafe { call(Call::Write, libc::SYS_write, [fd as usize, buf.as_ptr() as usize, buf.len(), 0, 0, 0]) } {
            Ok(n) => buf = &buf[n.min(buf.len())..],
            Err(libc::EINTR) => continue,
            Err(e) => return Err(e),
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

/// A file mapped read-only; unmapped when dropped.
pub struct MappedFile {
    addr: usize,
    len: usize,
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
    let mapped = size.and_then(|len| {
        if len == 0 {
            return Ok(MappedFile { addr: 0, len: 0 });
        }
        let (prot, flags) = (libc::PROT_READ as usize, libc::MAP_PRIVATE as usize);
        // SAFETY: a fresh read-only mapping of an open file touches no existing memory.
        unsafe { call(Call::Mmap, libc::SYS_mmap, [0, len, prot, flags, fd as usize, 0]) }
            .map(|addr| MappedFile { addr, len })
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

pub fn sched_yield() {
    // SAFETY: sched_yield takes no arguments.
    let _ = unsafe { call(Call::Other, libc::SYS_sched_yield, [0; 6]) };
}

/// Sleeps while `*word == expected` (or until woken, or a signal).
pub fn futex_wait(word: &core::sync::atomic::AtomicU32, expected: u32) {
    let op = (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as usize;
    // SAFETY: the kernel only reads the aligned u32 behind a live reference.
    let _ = unsafe { call(Call::Futex, libc::SYS_futex, [word.as_ptr() as usize, op, expected as usize, 0, 0, 0]) };
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

/// A unix seqpacket socket (message boundaries kept), close-on-exec: attach sessions.
pub fn socket_seqpacket() -> Result<i32, Errno> {
    let kind = (libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC) as usize;
    // SAFETY: socket takes plain integers.
    unsafe { call(Call::Other, libc::SYS_socket, [libc::AF_UNIX as usize, kind, 0, 0, 0, 0]) }.map(|fd| fd as i32)
}

/// Connects `fd` to the abstract unix socket `name` (without its leading NUL).
pub fn connect_abstract(fd: i32, name: &[u8]) -> Result<(), Errno> {
    // SAFETY: a zeroed sockaddr_un is valid; the name is copied in bounds below.
    let mut addr: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    if name.len() + 1 > addr.sun_path.len() {
        return Err(libc::ENAMETOOLONG);
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, &b) in name.iter().enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = core::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes.
    unsafe { call(Call::Other, libc::SYS_connect, [fd as usize, &addr as *const _ as usize, len, 0, 0, 0]) }.map(drop)
}

/// Sends `buf` as one message on a socket, without SIGPIPE when the peer is gone (EPIPE then).
pub fn send_nosignal(fd: i32, buf: &[u8]) -> Result<usize, Errno> {
    loop {
        let args = [fd as usize, buf.as_ptr() as usize, buf.len(), libc::MSG_NOSIGNAL as usize, 0, 0];
        // SAFETY: `buf` is readable for its length; no address is passed.
        match unsafe { call(Call::Write, libc::SYS_sendto, args) } {
            Err(libc::EINTR) => continue,
            other => return other,
        }
    }
}

/// Receives one message into `buf`, and the descriptor it carries (SCM_RIGHTS), if any, made
/// close-on-exec. Ok(0): the peer closed the socket.
pub fn recv_with_fd(fd: i32, buf: &mut [u8]) -> Result<(usize, Option<i32>), Errno> {
    let mut control = [0u64; 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = core::mem::size_of_val(&control);
    let n = loop {
        let args = [fd as usize, &mut msg as *mut libc::msghdr as usize, libc::MSG_CMSG_CLOEXEC as usize, 0, 0, 0];
        // SAFETY: `msg` describes writable buffers of the lengths given.
        match unsafe { call(Call::Read, libc::SYS_recvmsg, args) } {
            Err(libc::EINTR) => continue,
            other => break other?,
        }
    };
    // SAFETY: the kernel filled the control buffer, which CMSG_FIRSTHDR/DATA walk within
    // msg_controllen.
    let passed = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if !cmsg.is_null() && (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
            Some(core::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const i32))
        } else {
            None
        }
    };
    Ok((n, passed))
}

/// Waits until one of `fds` is ready or `timeout_ms` passed (-1: no limit); the number ready.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<usize, Errno> {
    let args = [fds.as_mut_ptr() as usize, fds.len(), timeout_ms as isize as usize, 0, 0, 0];
    // SAFETY: `fds` is a writable array of pollfd of the length passed.
    unsafe { call(Call::Other, libc::SYS_poll, args) }
}

/// Blocks the signals of `mask` (bit n-1 for signal n) on the calling thread; returns the
/// mask it had.
pub fn block_signals(mask: u64) -> u64 {
    sigmask(libc::SIG_BLOCK, mask)
}

/// Sets the calling thread's signal mask (as [`block_signals`] returned it).
pub fn set_signal_mask(mask: u64) {
    sigmask(libc::SIG_SETMASK, mask);
}

fn sigmask(how: i32, mask: u64) -> u64 {
    let mut old: u64 = 0;
    let args = [how as usize, &mask as *const u64 as usize, &mut old as *mut u64 as usize, 8, 0, 0];
    // SAFETY: rt_sigprocmask reads and writes one 8-byte set each, both live locals.
    let _ = unsafe { call(Call::Other, libc::SYS_rt_sigprocmask, args) };
    old
}

/// An eventfd counter, close-on-exec: one thread wakes another's `poll`.
pub fn eventfd() -> Result<i32, Errno> {
    // SAFETY: eventfd2 takes plain integers.
    unsafe { call(Call::Other, libc::SYS_eventfd2, [0, libc::EFD_CLOEXEC as usize, 0, 0, 0, 0]) }.map(|fd| fd as i32)
}

/// Sleeps for `ns` nanoseconds (or less, when a signal arrives).
pub fn sleep_ns(ns: u64) {
    let ts = libc::timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 };
    // SAFETY: the kernel reads one timespec; no remainder is asked for.
    let _ = unsafe { call(Call::Other, libc::SYS_nanosleep, [&ts as *const libc::timespec as usize, 0, 0, 0, 0, 0]) };
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
    }
}
