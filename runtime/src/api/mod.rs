//! The face of the runtime: the exported C API of `include/uprobe.h`, loading the handler
//! libraries, and start-up.
//!
//! - [`exports`]: `register_uprobe` and the other C functions; [`printf`]: `uprobe_printf`;
//! - [`handlers`]: handler libraries, their `uprobe_init` (one placement batch each) and
//!   `uprobe_exit`;
//! - [`ending`]: the end-of-run report, whichever way the process ends;
//! - `init`: start-up, from `.init_array`, before the program's constructors and `main`;
//! - [`attach`]: `uprobe_attach_begin`, which `uprobe-run --pid` calls in a running process.
//!
//! Context: normal (start-up, the program's calls), or a handler for the C functions.

#[allow(unsafe_code)]
pub mod attach;
#[allow(unsafe_code)]
pub mod ending;
#[allow(unsafe_code)]
pub mod exports;
#[allow(unsafe_code)]
pub mod handlers;
#[allow(unsafe_code)]
mod init;
#[allow(unsafe_code)]
pub mod printf;
