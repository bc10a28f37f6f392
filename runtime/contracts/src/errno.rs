//! The runtime's error codes: negative errno values, as in the kernel's uprobes API.

use core::fmt;

/// The errno values the runtime and the kernel's uprobes API are known to return, with their
/// names (x86_64 Linux numbering; a test checks each against the C library's).
pub const NAMES: &[(i32, &str)] = &[
    (1, "EPERM"),
    (2, "ENOENT"),
    (3, "ESRCH"),
    (4, "EINTR"),
    (5, "EIO"),
    (6, "ENXIO"),
    (7, "E2BIG"),
    (8, "ENOEXEC"),
    (9, "EBADF"),
    (11, "EAGAIN"),
    (12, "ENOMEM"),
    (13, "EACCES"),
    (14, "EFAULT"),
    (16, "EBUSY"),
    (17, "EEXIST"),
    (19, "ENODEV"),
    (22, "EINVAL"),
    (28, "ENOSPC"),
    (34, "ERANGE"),
    (38, "ENOSYS"),
    (75, "EOVERFLOW"),
    (95, "EOPNOTSUPP"),
    (114, "EALREADY"),
    (115, "EINPROGRESS"),
];

/// The symbolic name of a (positive) errno value (`"ENOENT"`), if it is in [`NAMES`].
pub fn name(errno: i32) -> Option<&'static str> {
    NAMES.iter().find(|(value, _)| *value == errno).map(|(_, name)| *name)
}

/// A (positive) errno value returned, negated, by a registration call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// `Ok` for 0 or any positive result, `Err` for a negative errno.
    pub const fn from_result(result: i32) -> Result<(), Errno> {
        if result < 0 {
            Err(Errno(result.wrapping_neg()))
        } else {
            Ok(())
        }
    }

    /// The symbolic name (`"ENOENT"`), if it is one the runtime is known to return.
    pub fn name(self) -> Option<&'static str> {
        name(self.0)
    }

    /// The value as the runtime returned it (`-ENOENT`).
    pub const fn negative(self) -> i32 {
        self.0.wrapping_neg()
    }
}

impl fmt::Display for Errno {
    /// `ENOENT (-2)`, or `errno 200 (-200)` for a value without a known name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.negative()),
            None => write!(f, "errno {} ({})", self.0, self.negative()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_map_to_errno() {
        assert_eq!(Errno::from_result(0), Ok(()));
        assert_eq!(Errno::from_result(-libc::EINVAL), Err(Errno(libc::EINVAL)));
    }

    #[test]
    fn numbers_are_the_c_library_s() {
        let libc = [
            (libc::EPERM, "EPERM"),
            (libc::ENOENT, "ENOENT"),
            (libc::ESRCH, "ESRCH"),
            (libc::EINTR, "EINTR"),
            (libc::EIO, "EIO"),
            (libc::ENXIO, "ENXIO"),
            (libc::E2BIG, "E2BIG"),
            (libc::ENOEXEC, "ENOEXEC"),
            (libc::EBADF, "EBADF"),
            (libc::EAGAIN, "EAGAIN"),
            (libc::ENOMEM, "ENOMEM"),
            (libc::EACCES, "EACCES"),
            (libc::EFAULT, "EFAULT"),
            (libc::EBUSY, "EBUSY"),
            (libc::EEXIST, "EEXIST"),
            (libc::ENODEV, "ENODEV"),
            (libc::EINVAL, "EINVAL"),
            (libc::ENOSPC, "ENOSPC"),
            (libc::ERANGE, "ERANGE"),
            (libc::ENOSYS, "ENOSYS"),
            (libc::EOVERFLOW, "EOVERFLOW"),
            (libc::EOPNOTSUPP, "EOPNOTSUPP"),
            (libc::EALREADY, "EALREADY"),
            (libc::EINPROGRESS, "EINPROGRESS"),
        ];
        assert_eq!(NAMES, &libc[..]);
        assert_eq!(name(libc::EBUSY), Some("EBUSY"));
        assert_eq!(name(4000), None);
    }

    #[test]
    fn display_names_the_errno_and_the_raw_value() {
        assert_eq!(Errno(libc::ENOENT).to_string(), "ENOENT (-2)");
        assert_eq!(Errno(libc::EBUSY).to_string(), "EBUSY (-16)");
        assert_eq!(Errno(4000).to_string(), "errno 4000 (-4000)");
    }
}
