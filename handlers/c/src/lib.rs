//! Handler libraries written in C against `runtime/include/uprobe.h`.
//!
//! `build.rs` compiles every `handlers/c/*.c` into `<name>.so` and copies it into the cargo
//! profile directory (e.g. `target/release/uprobe_example.so`), next to `uprobe-run` and
//! `libuprobe.so`. This crate has no Rust code of its own; it only carries the build step.

/// Directory the C handler libraries were copied into by the build script.
pub const LIB_DIR: &str = env!("C_HANDLERS_LIB_DIR");
