//! The `repr(C)` types of `include/uprobe.h`. Field order and names are a contract.

use core::ffi::{c_char, c_int, c_uint, c_ulong, c_void};

/// `struct pt_regs`, in the x86_64 kernel UAPI order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// `UPROBE_NO_VECTORS`: the probe's handlers (and an entry handler's) use no vector or
/// floating-point register, so a jump probe need not save them around the call.
pub const UPROBE_NO_VECTORS: c_uint = 1;
/// Every flag this runtime knows; a `flags` word with any other bit set is taken as none
/// (a probe object whose padding was never zeroed stays on the safe side).
pub const UPROBE_KNOWN_FLAGS: c_uint = UPROBE_NO_VECTORS;

impl Uprobe {
    /// Whether the probe declares its handlers free of vector registers (see
    /// [`UPROBE_NO_VECTORS`]).
    pub fn vector_free(&self) -> bool {
        self.flags & !UPROBE_KNOWN_FLAGS == 0 && self.flags & UPROBE_NO_VECTORS != 0
    }
}

/// `enum uprobe_type`.
pub const UPTY_UPROBE: c_int = 0;
pub const UPTY_URETPROBE: c_int = 1;

pub type UprobeHandler = unsafe extern "C" fn(*mut Uprobe, *mut PtRegs);
pub type RegistrationCallback = unsafe extern "C" fn(*mut Uprobe, c_int, c_int, c_int);
pub type UretprobeHandler = unsafe extern "C" fn(*mut UretprobeInstance, *mut PtRegs);
pub type UretprobeEntryHandler = unsafe extern "C" fn(*mut UretprobeInstance, *mut PtRegs) -> c_int;

/// `struct uprobe`.
#[repr(C)]
#[derive(Debug)]
pub struct Uprobe {
    pub pid: libc::pid_t,
    /// `UPROBE_*` flags (in what was the padding after `pid`: the layout is unchanged).
    pub flags: c_uint,
    pub vaddr: c_ulong,
    pub handler: Option<UprobeHandler>,
    pub registration_callback: Option<RegistrationCallback>,
    pub symbol_name: *const c_char,
    pub offset: c_ulong,
    pub reserved: [*mut c_void; 4],
}

/// `struct uretprobe`.
#[repr(C)]
#[derive(Debug)]
pub struct Uretprobe {
    pub u: Uprobe,
    pub handler: Option<UretprobeHandler>,
    pub entry_handler: Option<UretprobeEntryHandler>,
    pub data_size: usize,
    pub maxactive: c_int,
    pub nmissed: c_ulong,
}

/// `struct uretprobe_instance`; `data` follows it.
#[repr(C)]
#[derive(Debug)]
pub struct UretprobeInstance {
    pub rp: *mut Uretprobe,
    pub ret_addr: c_ulong,
    pub reserved: [c_ulong; 2],
}

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
        assert_eq!(offset_of!(Uprobe, flags), 4);
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
