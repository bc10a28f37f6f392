//! Handler libraries written in C against `runtime/include/uprobe.h`.
//!
//! `build.rs` compiles every `handlers/c/*.c` into `<name>.so` in its `OUT_DIR`, which
//! [`LIB_DIR`] names. This crate has no Rust code of its own; it carries the build step and
//! tells the integration tests where the libraries are. A built `uprobe-run` carries its own
//! copies of the examples: `--handlers uprobe_example` names one wherever it is installed.

use std::path::{Path, PathBuf};

/// The directory the build script compiled the C handler libraries into (its `OUT_DIR`).
pub const LIB_DIR: &str = env!("C_HANDLERS_LIB_DIR");

/// The library the build script made of `handlers/c/<stem>.c`, if it made one.
pub fn library(stem: &str) -> Option<PathBuf> {
    let path = Path::new(LIB_DIR).join(format!("{stem}.so"));
    path.is_file().then_some(path)
}
