//! Constructors and accessors of the ABI types (no layout here: see the parent module).

use super::{PtRegs, Uprobe, Uretprobe, UPROBE_KNOWN_FLAGS, UPROBE_NO_VECTORS};

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

impl Uprobe {
    /// Whether the probe declares its handlers free of vector registers
    /// ([`UPROBE_NO_VECTORS`], with no unknown bit beside it).
    pub const fn vector_free(&self) -> bool {
        self.flags & !UPROBE_KNOWN_FLAGS == 0 && self.flags & UPROBE_NO_VECTORS != 0
    }
}

impl Default for Uprobe {
    fn default() -> Self {
        Self::zeroed()
    }
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
