//! Instruction work: what is x86, knowing nothing of probes or handlers.
//!
//! - [`decode`]: instruction boundaries, the plan for a displaced instruction (emulate or run
//!   out of line) and its relocated copy (pure);
//! - [`emulate`]: carrying out a planned instruction on a register file (pure);
//! - [`jump`]: whether a function entry may take a 5-byte jump, and its bytes (pure);
//! - [`stub`]: the bytes of a jump probe's stub (pure);
//! - [`frame`]: the assembly that saves and restores a `struct pt_regs` on the trap-free paths;
//! - [`vector`]: how much vector state that assembly saves;
//! - [`patch`]: the code-writing protocol (pages made writable once per batch, synced steps);
//! - [`unwind`]: call-frame information compiled into rows, and one unwind step (pure);
//! - [`vecfree`]: whether a handler's code provably touches no vector state (pure).
//!
//! Context: the pure modules run anywhere; `patch` runs in normal context (placement).

pub mod decode;
pub mod emulate;
pub mod frame;
pub mod jump;
#[allow(unsafe_code)]
pub mod patch;
pub mod stub;
pub mod unwind;
pub mod vecfree;
#[allow(unsafe_code)]
pub mod vector;
