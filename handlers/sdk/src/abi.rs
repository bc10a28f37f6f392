//! The C ABI of `runtime/include/uprobe.h`, field for field.
//!
//! The functions are resolved when the handler library is loaded, against the `libuprobe.so`
//! that `uprobe-run` preloads; a handler library must not link against it.

use core::ffi::{c_char, c_int, c_ulong, c_void};

/// `struct pt_regs`: the x86_64 kernel UAPI register frame, in its order and with its names.
///
/// A handler may change the registers; the changes take effect when the thread resumes, and a
/// changed `rip` skips the probed instruction.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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

/// `void (*handler)(struct uprobe *u, struct pt_regs *regs)`
pub type UprobeHandler = extern "C" fn(u: *mut Uprobe, regs: *mut PtRegs);

/// `void (*registration_callback)(struct uprobe *u, int reg, enum uprobe_type type, int result)`
pub type RegistrationCallback = extern "C" fn(u: *mut Uprobe, reg: c_int, ty: c_int, result: c_int);

/// `enum uprobe_type` values passed to a [`RegistrationCallback`].
pub const UPTY_UPROBE: c_int = 0;
/// See [`UPTY_UPROBE`].
pub const UPTY_URETPROBE: c_int = 1;

/// `struct uprobe`.
///
/// Probe either `vaddr` (a run-time address) or `symbol_name` (`"sym"` or `"module:sym"`)
/// plus `offset`. The runtime keeps a pointer to a registered probe until it is unregistered,
/// so the object must stay where it is for that long (static storage, or leaked).
#[repr(C)]
#[derive(Debug)]
pub struct Uprobe {
    /// 0 or `getpid()`: the runtime probes its own process only.
    pub pid: libc::pid_t,
    /// `UPROBE_*` flags (`UPROBE_NO_VECTORS`: the handlers use no vector register).
    pub flags: core::ffi::c_uint,
    pub vaddr: c_ulong,
    pub handler: Option<UprobeHandler>,
    pub registration_callback: Option<RegistrationCallback>,
    pub symbol_name: *const c_char,
    pub offset: c_ulong,
    /// Owned by the runtime; zero before registration.
    pub reserved: [*mut c_void; 4],
}

impl Uprobe {
    /// An all-zero probe: no address, no symbol, no handler.
    pub const fn zeroed() -> Self {
        Self {
            pid: 0,
            flags: 0,
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
    pub u: Uprobe,
    pub handler: Option<extern "C" fn(ri: *mut UretprobeInstance, regs: *mut PtRegs)>,
    /// Non-zero: do not probe this return.
    pub entry_handler: Option<extern "C" fn(ri: *mut UretprobeInstance, regs: *mut PtRegs) -> c_int>,
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

/// `struct uretprobe_instance`; `data_size` bytes of private data follow it.
#[repr(C)]
#[derive(Debug)]
pub struct UretprobeInstance {
    pub rp: *mut Uretprobe,
    pub ret_addr: c_ulong,
    pub reserved: [c_ulong; 2],
    pub data: [u8; 0],
}

extern "C" {
    /// 0 on success, a negative errno otherwise.
    pub fn register_uprobe(u: *mut Uprobe) -> c_int;
    pub fn unregister_uprobe(u: *mut Uprobe);
    /// `num` probes at once: probes at one address stop together.
    pub fn unregister_uprobes(us: *mut *mut Uprobe, num: c_int);
    /// 0 on success, a negative errno otherwise.
    pub fn register_uretprobe(rp: *mut Uretprobe) -> c_int;
    pub fn unregister_uretprobe(rp: *mut Uretprobe);
    /// The value of `--param name=value`, or NULL. Not for signal context.
    pub fn uprobe_param(name: *const c_char) -> *const c_char;
    /// Async-signal-safe formatted output to the run's output (`-o`, default stderr).
    pub fn uprobe_printf(fmt: *const c_char, ...) -> c_int;
    /// `"sym"`, `"module:sym+off"` -> run-time address, 0 if none.
    pub fn uprobe_lookup(spec: *const c_char) -> c_ulong;
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    // Offsets as the C compiler lays out uprobe.h on x86_64.
    #[test]
    fn pt_regs_layout() {
        assert_eq!(size_of::<PtRegs>(), 21 * 8);
        assert_eq!(offset_of!(PtRegs, rax), 10 * 8);
        assert_eq!(offset_of!(PtRegs, rip), 16 * 8);
        assert_eq!(offset_of!(PtRegs, ss), 20 * 8);
    }

    #[test]
    fn uprobe_layout() {
        assert_eq!(offset_of!(Uprobe, pid), 0);
        assert_eq!(offset_of!(Uprobe, vaddr), 8);
        assert_eq!(offset_of!(Uprobe, handler), 16);
        assert_eq!(offset_of!(Uprobe, registration_callback), 24);
        assert_eq!(offset_of!(Uprobe, symbol_name), 32);
        assert_eq!(offset_of!(Uprobe, offset), 40);
        assert_eq!(offset_of!(Uprobe, reserved), 48);
        assert_eq!(size_of::<Uprobe>(), 80);
    }

    #[test]
    fn uretprobe_layout() {
        assert_eq!(offset_of!(Uretprobe, handler), 80);
        assert_eq!(offset_of!(Uretprobe, entry_handler), 88);
        assert_eq!(offset_of!(Uretprobe, data_size), 96);
        assert_eq!(offset_of!(Uretprobe, maxactive), 104);
        assert_eq!(offset_of!(Uretprobe, nmissed), 112);
        assert_eq!(size_of::<Uretprobe>(), 120);
        assert_eq!(offset_of!(UretprobeInstance, data), 32);
    }

    #[test]
    fn arguments_follow_sysv_order() {
        let regs = PtRegs { rdi: 1, rsi: 2, rdx: 3, rcx: 4, r8: 5, r9: 6, rax: 7, ..PtRegs::default() };
        let args: Vec<_> = (0..7).map(|n| regs.arg(n)).collect();
        assert_eq!(args, [Some(1), Some(2), Some(3), Some(4), Some(5), Some(6), None]);
        assert_eq!(regs.return_value(), 7);
    }
}
