//! The in-process side of attaching to a running process and detaching from it: the agent
//! thread that `uprobe-run --pid` starts in the target, and the session it carries out.
//!
//! - [`agent`]: the agent thread: the session's life, and the process's exit during it;
//! - [`session`]: the session's handler libraries, the probes they own, unloading them;
//! - [`hold`]: holding the other threads for a batch's writes, through `uprobe-run`;
//! - [`channel`], [`wire`]: the session socket and its messages (`wire` is the contracts
//!   crate's, shared with `uprobe-run`).
//!
//! Context: normal, on the agent thread (the program's threads running, or held stopped by
//! `uprobe-run` while a batch is written); `agent::at_exit` on the thread that calls `exit`.
//! Nothing here runs on a hit path.

#[allow(unsafe_code)]
pub mod agent;
pub mod channel;
pub mod hold;
#[allow(unsafe_code)]
pub mod session;
pub use uprobe_contracts::wire;
