//! libuprobe.so: in-process user-space probes for x86_64 Linux.
//!
//! `uprobe-run` preloads this library into the probed program. Its constructor reads the run's
//! specification, loads the handler libraries and calls their `uprobe_init`; they register
//! probes through the C ABI in `include/uprobe.h`. A probe replaces the first byte of the probed
//! instruction with `int3`; the SIGTRAP handler ([`trap`]) runs the handlers with the registers
//! as a `struct pt_regs`, then emulates the displaced instruction in the signal context or
//! resumes in an out-of-line copy of it ([`ssol`]). Nothing single-steps.
//!
//! Where things live:
//! - [`decode`]: instruction boundaries, the plan for a displaced instruction, relocation (pure);
//! - [`emulate`]: executing a planned instruction on a register file (pure);
//! - [`trap`]: the SIGTRAP handler, i.e. the hit path of `int3` probes;
//! - [`jump`]: trap-free probes: the jump, its stub and the safety analysis;
//! - [`registry`]: the probe table (lock-free on the hit path) and (un)registration;
//! - [`patch`], [`ssol`]: writing live text and out-of-line slots;
//! - [`resolve`], [`maps`]: symbols of the loaded ELF modules and the address space;
//! - [`retprobe`]: return probes: the per-thread return stack, the trampoline, unwinders;
//! - [`api`]: the exported C functions; [`handlers`]: loading handler libraries;
//! - [`printf`], [`output`]: `uprobe_printf` and the run's output; [`fds`]: keeping its
//!   descriptor open in programs that close every descriptor;
//! - [`spec`]: what `uprobe-run` passes in the environment;
//! - [`thread`]: the runtime's per-thread state;
//! - [`signals`], [`faults`]: the program's own signal actions and masks (interposed), and a
//!   handler that faults; [`interpose`]: finding the functions interposers stand in for;
//! - [`dl`]: `dlopen`/`dlclose`, arming probes of libraries loaded later;
//! - [`fork`], [`disable`]: children of `fork`, and processes where the runtime must stay off;
//! - [`alloc`]: the runtime's own allocator, usable from signal context;
//! - [`sys`]: every raw syscall the runtime makes.
#![deny(unsafe_code)]

pub mod abi;
#[allow(unsafe_code)]
pub mod alloc;
#[allow(unsafe_code)]
pub mod api;
pub mod decode;
pub mod disable;
#[allow(unsafe_code)]
pub mod dl;
pub mod emulate;
#[allow(unsafe_code)]
pub mod faults;
#[allow(unsafe_code)]
pub mod fds;
#[allow(unsafe_code)]
pub mod fork;
#[allow(unsafe_code)]
pub mod handlers;
#[allow(unsafe_code)]
mod init;
#[allow(unsafe_code)]
pub mod interpose;
#[allow(unsafe_code)]
pub mod jump;
pub mod maps;
#[allow(unsafe_code)]
pub mod output;
#[allow(unsafe_code)]
pub mod patch;
#[allow(unsafe_code)]
pub mod printf;
#[allow(unsafe_code)]
pub mod registry;
pub mod resolve;
#[allow(unsafe_code)]
pub mod retprobe;
#[allow(unsafe_code)]
pub mod signals;
pub mod spec;
#[allow(unsafe_code)]
pub mod ssol;
#[allow(unsafe_code)]
pub mod sys;
#[allow(unsafe_code)]
pub mod thread;
#[allow(unsafe_code)]
pub mod trap;

#[global_allocator]
static ALLOCATOR: alloc::RuntimeAlloc = alloc::RuntimeAlloc;
