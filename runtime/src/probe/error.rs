//! Why a registration failed, with what a user needs to fix it, and the errno it returns.

use thiserror::Error;

use crate::base::elf;
use crate::insn::decode::{BoundaryError, PlanError};
use crate::insn::patch;
use crate::probe::ssol::SlotError;

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum RegisterError {
    #[error("pid {0} is not this process ({1})")]
    OtherProcess(i32, i32),
    #[error("this probe object is already registered")]
    AlreadyRegistered,
    #[error("neither vaddr nor symbol_name is set")]
    NoAddress,
    #[error("symbol {0:?} not found in any loaded module")]
    UnknownSymbol(String),
    #[error("module {module:?} is not loaded (symbol {symbol:?})")]
    UnknownModule { module: String, symbol: String },
    #[error(
        "module {module:?} is not loaded (symbol {symbol:?}), and a runtime attached to a running \
         process does not see the libraries it loads later: the probe would never be placed"
    )]
    ModuleNotLoadedNow { module: String, symbol: String },
    #[error("bad probe specification {0:?}: {1}")]
    BadSpec(String, elf::SpecError),
    #[error("{0:#x} is not in executable code")]
    NotCode(usize),
    #[error(
        "{addr:#x} is not in executable code: it is {function}'s address in the program's file, \
         as nm shows it, but the program is position-independent and runs at another address: \
         probe it by name (symbol_name \"{function}\"; --param symbol={function} for \
         uprobe_example.so) \
         or at its run-time address {runtime:#x}"
    )]
    LinkTimeAddress { addr: usize, function: String, runtime: usize },
    #[error(
        "{0:#x} is outside every function symbol (padding or data between functions?): \
         give a function's address or name, or run with --raw-address to probe it anyway"
    )]
    OutsideFunctions(usize),
    #[error("{function}+{offset:#x} lies past the end of {function}, which is {size} ({size:#x}) bytes long")]
    PastFunction { function: String, offset: u64, size: usize },
    #[error(
        "{spec}: no sized symbol says where the function at {base:#x} ends, so an offset into \
         it is refused; run with --raw-address to probe it anyway"
    )]
    UnknownExtent { spec: String, base: usize },
    #[error("{0:#x} is in {1}, which the kernel does not let a process patch")]
    KernelPage(usize, String),
    #[error("{0:#x} is {1}, which the runtime's hit path itself calls")]
    UsedByHitPath(usize, &'static str),
    #[error("{0:#x} is inside the runtime itself")]
    InRuntime(usize),
    #[error("{addr:#x} is not an instruction boundary of {function}: {source}")]
    NotBoundary { addr: usize, function: String, source: BoundaryError },
    #[error("{0:#x} does not decode as an instruction")]
    Undecodable(usize),
    #[error("{0:#x} holds a breakpoint that is not ours")]
    ForeignBreakpoint(usize),
    #[error("the instruction at {addr:#x} cannot be probed: {source}")]
    Unsupported { addr: usize, source: PlanError },
    #[error("the instruction at {addr:#x} needs an out-of-line slot: {source}")]
    Slot { addr: usize, source: SlotError },
    #[error("the USDT semaphore of the probe at {addr:#x} (file offset {offset:#x}) cannot be raised: {why}")]
    Semaphore { addr: usize, offset: u64, why: &'static str },
    #[error("cannot patch {addr:#x}: {source}")]
    Patch { addr: usize, source: patch::PatchError },
    #[error(
        "{addr:#x} is not the first instruction of {function} (at {start:#x}): return probes go on a function's entry"
    )]
    NotEntry { addr: usize, function: String, start: usize },
    #[error("{0:#x} is the program's entry point: its stack holds argc, not a return address, so a return probe there is refused")]
    EntryPoint(usize),
    #[error("{function} (at {addr:#x}) returns twice (as setjmp, vfork and getcontext do): its second return would find no record, so return probes are refused there; an entry probe works")]
    ReturnsTwice { addr: usize, function: String },
    #[error("{function} (at {addr:#x}) never returns by ret (no ret or tail call in its code): a return probe there would never fire, so it is refused")]
    NeverReturns { addr: usize, function: String },
    #[error("return probes are refused in Go programs: Go moves goroutine stacks and walks return addresses, which a replaced return address breaks")]
    GoProgram,
    #[error("the probe table is full")]
    TableFull,
    #[error("{function} (at {addr:#x}) runs with every signal blocked in {blocked}, where an int3 would kill the program, and it cannot take a jump here: {why}")]
    TrapUnsafe { addr: usize, function: String, blocked: &'static str, why: String },
}

impl RegisterError {
    /// The negative errno `register_uprobe` returns for this error.
    pub fn errno(&self) -> i32 {
        use RegisterError::*;
        -match self {
            OtherProcess(..) => libc::ESRCH,
            AlreadyRegistered => libc::EEXIST,
            UnknownSymbol(_) | UnknownModule { .. } | ModuleNotLoadedNow { .. } => libc::ENOENT,
            ForeignBreakpoint(_) => libc::EBUSY,
            Slot { .. } | TableFull => libc::ENOMEM,
            GoProgram => libc::ENOTSUP,
            Patch { source, .. } => source.errno,
            NoAddress
            | BadSpec(..)
            | NotCode(_)
            | LinkTimeAddress { .. }
            | OutsideFunctions(_)
            | PastFunction { .. }
            | UnknownExtent { .. }
            | KernelPage(..)
            | InRuntime(_)
            | UsedByHitPath(..)
            | NotBoundary { .. }
            | Semaphore { .. }
            | Undecodable(_)
            | Unsupported { .. }
            | NotEntry { .. }
            | EntryPoint(_)
            | ReturnsTwice { .. }
            | NeverReturns { .. }
            | TrapUnsafe { .. } => libc::EINVAL,
        }
    }

    /// Whether the registration failed because the process refuses writable code (W^X).
    pub fn refuses_writable_code(&self) -> bool {
        let errno = match self {
            RegisterError::Patch { source, .. } => source.errno,
            RegisterError::Slot { source: SlotError::Map { errno, .. }, .. } => *errno,
            _ => return false,
        };
        errno == libc::EACCES || errno == libc::EPERM
    }
}
