//! The `repr(C)` types of `include/uprobe.h`. Field order and names are a contract; the header
//! is the truth, and the tests in `abi/header.rs` compile a C program against it and compare
//! every size and offset. Handler libraries (C, or Rust through `uprobe-sdk`) and the runtime
//! share them. Registration calls return 0 or a negative errno ([`crate::errno::Errno`]).

use core::ffi::{c_char, c_int, c_uint, c_ulong, c_void};

/// `struct pt_regs`, in the x86_64 kernel UAPI order and with its names.
///
/// A handler may change the registers; the changes take effect when the thread resumes, and a
/// changed `rip` skips the probed instruction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct PtRegs {
    pub r15: c_ulong,
    pub r14: c_ulong,
    pub r13: c_ulong,
    pub r12: c_ulong,
    pub rbp: c_ulong,
    pub rbx: c_ulong,
    pub r11: c_ulong,
    pub r10: c_ulong,
    pub r9: c_ulong,
    pub r8: c_ulong,
    pub rax: c_ulong,
    pub rcx: c_ulong,
    pub rdx: c_ulong,
    pub rsi: c_ulong,
    pub rdi: c_ulong,
    pub orig_rax: c_ulong,
    pub rip: c_ulong,
    pub cs: c_ulong,
    pub eflags: c_ulong,
    pub rsp: c_ulong,
    pub ss: c_ulong,
}

/// `enum uprobe_type`: an entry probe, in a [`RegistrationCallback`].
pub const UPTY_UPROBE: c_int = 0;
/// `enum uprobe_type`: a return probe.
pub const UPTY_URETPROBE: c_int = 1;

/// `void (*handler)(struct uprobe *u, struct pt_regs *regs)`
pub type UprobeHandler = unsafe extern "C" fn(*mut Uprobe, *mut PtRegs);
/// `void (*registration_callback)(struct uprobe *u, int reg, enum uprobe_type type, int result)`
pub type RegistrationCallback = unsafe extern "C" fn(*mut Uprobe, c_int, c_int, c_int);
/// `void (*handler)(struct uretprobe_instance *ri, struct pt_regs *regs)`
pub type UretprobeHandler = unsafe extern "C" fn(*mut UretprobeInstance, *mut PtRegs);
/// `int (*entry_handler)(struct uretprobe_instance *ri, struct pt_regs *regs)`: non-zero skips
/// this return.
pub type UretprobeEntryHandler = unsafe extern "C" fn(*mut UretprobeInstance, *mut PtRegs) -> c_int;

/// `struct uprobe`: probe either `vaddr` (a run-time address) or `symbol_name` (`"sym"` or
/// `"module:sym"`) plus `offset`; `pid` is 0 or `getpid()`; `reserved` is the runtime's (zero
/// before registration). The runtime keeps a pointer to a registered probe until it is
/// unregistered: the object must stay where it is for that long (static storage, or leaked).
#[repr(C)]
#[derive(Debug)]
#[allow(missing_docs)]
pub struct Uprobe {
    pub pid: libc::pid_t,
    /// `UPROBE_*` flags ([`UPROBE_NO_VECTORS`]); 0 by default. It lies in what was the padding
    /// after `pid`: the layout is the same with or without it.
    pub flags: c_uint,
    pub vaddr: c_ulong,
    pub handler: Option<UprobeHandler>,
    pub registration_callback: Option<RegistrationCallback>,
    pub symbol_name: *const c_char,
    pub offset: c_ulong,
    pub reserved: [*mut c_void; 4],
}

/// `struct uretprobe`: a return probe; `u` names the function entry, `entry_handler` returning
/// non-zero skips a return, `data_size` bytes of private data come with each instance,
/// `maxactive` (<= 0: the default) bounds the pending returns per thread, `nmissed` counts the
/// returns not probed for lack of room.
#[repr(C)]
#[derive(Debug)]
#[allow(missing_docs)]
pub struct Uretprobe {
    pub u: Uprobe,
    pub handler: Option<UretprobeHandler>,
    pub entry_handler: Option<UretprobeEntryHandler>,
    pub data_size: usize,
    pub maxactive: c_int,
    pub nmissed: c_ulong,
}

/// `struct uretprobe_instance`; `data` (`char data[]`, `data_size` bytes) follows it.
#[repr(C)]
#[derive(Debug)]
#[allow(missing_docs)]
pub struct UretprobeInstance {
    pub rp: *mut Uretprobe,
    pub ret_addr: c_ulong,
    pub reserved: [c_ulong; 2],
    pub data: [u8; 0],
}

/// `UPROBE_NO_VECTORS`: the probe's handlers use no vector or floating-point register, so a
/// jump probe need not save them around the call (return probes save them regardless).
pub const UPROBE_NO_VECTORS: c_uint = 1;
/// Every flag the runtime knows; a `flags` word with any other bit set counts as none, so a
/// probe object whose padding was never zeroed stays on the safe side.
pub const UPROBE_KNOWN_FLAGS: c_uint = UPROBE_NO_VECTORS;

mod methods;

#[cfg(test)]
mod header;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn pt_regs_matches_the_kernel_layout() {
        assert_eq!(size_of::<PtRegs>(), 21 * 8);
        assert_eq!(offset_of!(PtRegs, rax), 80);
        assert_eq!(offset_of!(PtRegs, orig_rax), 120);
        assert_eq!(offset_of!(PtRegs, rip), 128);
        assert_eq!(offset_of!(PtRegs, rsp), 152);
    }

    #[test]
    fn uprobe_layout_matches_the_header() {
        assert_eq!(offset_of!(Uprobe, vaddr), 8);
        assert_eq!(offset_of!(Uprobe, handler), 16);
        assert_eq!(offset_of!(Uprobe, registration_callback), 24);
        assert_eq!(offset_of!(Uprobe, symbol_name), 32);
        assert_eq!(offset_of!(Uprobe, offset), 40);
        assert_eq!(size_of::<Uprobe>(), 80);
        assert_eq!(offset_of!(Uretprobe, handler), 80);
        assert_eq!(offset_of!(Uretprobe, nmissed), 112);
        assert_eq!(size_of::<UretprobeInstance>(), 32);
    }
}
