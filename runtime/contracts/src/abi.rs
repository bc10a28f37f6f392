//! The C ABI of `runtime/include/uprobe.h`, field for field: the `repr(C)` types that handler
//! libraries (C, or Rust through `uprobe-sdk`) and the runtime share. Field order and names are
//! a contract; the header is the truth, and the tests below compile a C program against it
//! and compare every size and offset.
//!
//! Registration calls return 0 or a negative errno ([`crate::errno::Errno`] names them).

use core::ffi::{c_char, c_int, c_ulong, c_void};

/// `struct pt_regs`: the x86_64 kernel UAPI register frame, in its order and with its names.
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

impl PtRegs {
    /// `regs_return_value(regs)`: meaningful in a return probe.
    pub const fn return_value(&self) -> u64 {
        self.rax
    }

    /// The `n`-th integer argument (0-based) under the System V x86_64 calling convention,
    /// meaningful at a function's first instruction. `None` past the six register arguments.
    pub const fn arg(&self, n: usize) -> Option<u64> {
        match n {
            0 => Some(self.rdi),
            1 => Some(self.rsi),
            2 => Some(self.rdx),
            3 => Some(self.rcx),
            4 => Some(self.r8),
            5 => Some(self.r9),
            _ => None,
        }
    }
}

/// `enum uprobe_type` values passed to a [`RegistrationCallback`]: an entry probe.
pub const UPTY_UPROBE: c_int = 0;
/// See [`UPTY_UPROBE`]: a return probe.
pub const UPTY_URETPROBE: c_int = 1;

/// `pid_t` (an `int` on Linux).
#[allow(non_camel_case_types)]
pub type pid_t = c_int;

/// `void (*handler)(struct uprobe *u, struct pt_regs *regs)`
pub type UprobeHandler = unsafe extern "C" fn(u: *mut Uprobe, regs: *mut PtRegs);

/// `void (*registration_callback)(struct uprobe *u, int reg, enum uprobe_type type, int result)`
pub type RegistrationCallback = unsafe extern "C" fn(u: *mut Uprobe, reg: c_int, ty: c_int, result: c_int);

/// `void (*handler)(struct uretprobe_instance *ri, struct pt_regs *regs)` of a return probe.
pub type UretprobeHandler = unsafe extern "C" fn(ri: *mut UretprobeInstance, regs: *mut PtRegs);

/// `int (*entry_handler)(struct uretprobe_instance *ri, struct pt_regs *regs)`: non-zero
/// skips this return.
pub type UretprobeEntryHandler = unsafe extern "C" fn(ri: *mut UretprobeInstance, regs: *mut PtRegs) -> c_int;

/// `struct uprobe`.
///
/// Probe either `vaddr` (a run-time address) or `symbol_name` (`"sym"` or `"module:sym"`)
/// plus `offset`. The runtime keeps a pointer to a registered probe until it is unregistered,
/// so the object must stay where it is for that long (static storage, or leaked).
#[repr(C)]
#[derive(Debug)]
pub struct Uprobe {
    /// 0 or `getpid()`: the runtime probes its own process only.
    pub pid: pid_t,
    /// Run-time address of the probed instruction.
    pub vaddr: c_ulong,
    /// Called on each hit.
    pub handler: Option<UprobeHandler>,
    /// Reports the result of a (un)registration queued from inside a handler.
    pub registration_callback: Option<RegistrationCallback>,
    /// Kprobe-style alternative to `vaddr`: `"sym"` or `"module:sym"`.
    pub symbol_name: *const c_char,
    /// Added to `symbol_name`'s address.
    pub offset: c_ulong,
    /// Owned by the runtime; zero before registration.
    pub reserved: [*mut c_void; 4],
}

impl Uprobe {
    /// An all-zero probe: no address, no symbol, no handler.
    pub const fn zeroed() -> Self {
        Self {
            pid: 0,
            vaddr: 0,
            handler: None,
            registration_callback: None,
            symbol_name: core::ptr::null(),
            offset: 0,
            reserved: [core::ptr::null_mut(); 4],
        }
    }
}

impl Default for Uprobe {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// `struct uretprobe`: a return probe; `u` names the function entry.
#[repr(C)]
#[derive(Debug)]
pub struct Uretprobe {
    /// The function entry.
    pub u: Uprobe,
    /// Called at each probed return.
    pub handler: Option<UretprobeHandler>,
    /// Called at entry; non-zero: do not probe this return.
    pub entry_handler: Option<UretprobeEntryHandler>,
    /// Bytes of per-instance private data (`ri->data`).
    pub data_size: usize,
    /// Per-thread pending returns; `<= 0`: the runtime's default.
    pub maxactive: c_int,
    /// Returns not probed for lack of room.
    pub nmissed: c_ulong,
}

impl Uretprobe {
    /// An all-zero return probe.
    pub const fn zeroed() -> Self {
        Self { u: Uprobe::zeroed(), handler: None, entry_handler: None, data_size: 0, maxactive: 0, nmissed: 0 }
    }
}

impl Default for Uretprobe {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// `struct uretprobe_instance`; `data_size` bytes of private data follow it (`data`).
#[repr(C)]
#[derive(Debug)]
pub struct UretprobeInstance {
    /// The return probe this instance belongs to.
    pub rp: *mut Uretprobe,
    /// Where the probed function returns to.
    pub ret_addr: c_ulong,
    /// Owned by the runtime.
    pub reserved: [c_ulong; 2],
    /// `char data[]`: the start of the private data.
    pub data: [u8; 0],
}

#[cfg(test)]
mod tests;
