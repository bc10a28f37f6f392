//! The descriptor of the metrics feed (`uprobe-run --serve`): a socket inherited from
//! uprobe-run, named by the run specification's `feed` record, moved out of the program's
//! way and made close-on-exec at start-up. `hazard::fds` keeps it open against the program's
//! `close`, `closefrom` and `dup2` as it keeps the output.
//!
//! Context: any (the descriptor is read with one atomic load).

use std::sync::atomic::{AtomicI32, Ordering};

use crate::base::{socket, sys};

static FD: AtomicI32 = AtomicI32::new(-1);
/// As the output's: out of the way of programs that expect small numbers.
const FD_FLOOR: i32 = 100;

/// Takes `fd` as the feed: a copy at FD_FLOOR or above, close-on-exec; `fd` itself is
/// closed so that the program finds its number free, as if uprobe-run had not used it.
pub fn adopt(fd: i32) -> Result<(), sys::Errno> {
    let high = sys::dup_at_least(fd, FD_FLOOR)?;
    sys::close(fd);
    FD.store(high, Ordering::Relaxed);
    Ok(())
}

/// The feed's descriptor, if there is one (signal-safe).
pub fn fd() -> Option<i32> {
    Some(FD.load(Ordering::Relaxed)).filter(|&fd| fd >= 0)
}

/// Moves the feed to another descriptor number, out of the way of a `dup2` onto it.
pub fn move_fd() {
    if let Some(fd) = fd() {
        if let Ok(new) = sys::dup_at_least(fd, FD_FLOOR) {
            FD.store(new, Ordering::Relaxed);
        }
    }
}

/// Writes all of `bytes`, without SIGPIPE when uprobe-run is gone (the error is returned).
pub fn send_all(mut bytes: &[u8]) -> Result<(), sys::Errno> {
    let fd = fd().ok_or(libc::EBADF)?;
    while !bytes.is_empty() {
        let n = socket::send_nosignal(fd, bytes)?;
        bytes = &bytes[n..];
    }
    Ok(())
}

/// Shuts the feed down both ways: a read of it waiting returns end of file.
pub fn shutdown(fd: i32) {
    socket::shutdown(fd);
}

/// Closes the feed `fd` and forgets it, unless another feed took its place; whether it did.
pub fn release(fd: i32) -> bool {
    if FD.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
        return false;
    }
    sys::close(fd);
    true
}
