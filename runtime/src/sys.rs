//! Every raw syscall the runtime makes goes through here, each with the ABI fact it relies on.
//! Functions marked "signal-safe" may be called from the SIGTRAP handler.

use core::ffi::c_void;

/// A raw errno value.
pub type Errno = i32;

fn last_errno() -> Errno {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Reads errno (signal-safe).
pub fn errno() -> Errno {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() }
}

/// Writes errno (signal-safe).
pub fn set_errno(value: Errno) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = value }
}

pub fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

pub const PAGE_SIZE: usize = 4096;

pub fn page_floor(addr: usize) -> usize {
    addr & !(PAGE_SIZE - 1)
}

/// Maps `len` bytes of fresh anonymous memory exactly at `addr`, never replacing a mapping.
pub fn mmap_anon_at(addr: usize, len: usize, prot: i32) -> Result<usize, Errno> {
    // SAFETY: MAP_FIXED_NOREPLACE never unmaps anything; the kernel either maps at `addr` or fails.
    let got = unsafe {
        libc::mmap(
            addr as *mut c_void,
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        return Err(last_errno());
    }
    if got as usize != addr {
        // Kernels before 4.17 treat the flag as a hint: give the mapping back.
        // SAFETY: `got` is the mapping just created, of `len` bytes, referenced by nobody.
        unsafe { libc::munmap(got, len) };
        return Err(libc::EEXIST);
    }
    Ok(addr)
}

/// Maps `len` bytes of anonymous read-write memory anywhere (signal-safe: a plain syscall).
pub fn mmap_anon(len: usize) -> Result<usize, Errno> {
    // SAFETY: an anonymous private mapping with no fixed address touches no existing memory.
    let got = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        Err(last_errno())
    } else {
        Ok(got as usize)
    }
}

/// Gives back a mapping made by [`mmap_anon`].
///
/// # Safety
/// Nothing may use the range afterwards.
pub unsafe fn munmap(addr: usize, len: usize) {
    // SAFETY: the caller guarantees the range is an unused mapping of ours.
    unsafe { libc::munmap(addr as *mut c_void, len) };
}

/// Changes the protection of whole pages.
pub fn mprotect(addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
    // SAFETY: mprotect only changes access rights; callers never drop PROT_EXEC from text that
    // may be running, so no thread can fault on it.
    let rc = unsafe { libc::mprotect(addr as *mut c_void, len, prot) };
    if rc == 0 {
        Ok(())
    } else {
        Err(last_errno())
    }
}

/// Writes all of `buf` to `fd`, retrying on EINTR and short writes (signal-safe).
pub fn write_all(fd: i32, mut buf: &[u8]) -> Result<(), Errno> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid readable slice for its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: i32 = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: i32 = 1 << 4;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: i32 = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: i32 = 1 << 6;

/// Registers the process for core-serialising membarriers; false where the kernel lacks them.
pub fn membarrier_register_sync_core() -> bool {
    // SAFETY: membarrier takes plain integers and has no memory effects on the caller.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0) == 0 }
}

/// Makes every thread of the process serialise its instruction stream before it next runs
/// user code, so all of them see freshly written text.
pub fn membarrier_sync_core() -> bool {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0) == 0 }
}

/// Registers the process for private expedited membarriers; false where the kernel lacks them.
pub fn membarrier_register_private_expedited() -> bool {
    // SAFETY: membarrier takes plain integers and has no memory effects on the caller.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
}

/// Makes every running thread of the process execute a full memory barrier.
pub fn membarrier_private_expedited() {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
}

/// The calling thread's id (signal-safe).
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The FS segment base of the calling thread (signal-safe).
pub fn fs_base() -> u64 {
    let mut base: u64 = 0;
    // SAFETY: ARCH_GET_FS writes one u64 to the pointer we pass.
    unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1003, &mut base as *mut u64) };
    base
}

/// The GS segment base of the calling thread (signal-safe).
pub fn gs_base() -> u64 {
    let mut base: u64 = 0;
    // SAFETY: ARCH_GET_GS writes one u64 to the pointer we pass.
    unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1004, &mut base as *mut u64) };
    base
}

/// Ends the process at once without running exit handlers.
pub fn exit_now(status: i32) -> ! {
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(status) }
}
