//! Compiles each `handlers/c/*.c` into a handler library `<name>.so` with the system gcc, in
//! this build script's `OUT_DIR` and nowhere else. The crate exports that directory as
//! `c_handlers::LIB_DIR` (the integration tests take the libraries from there); uprobe-run
//! carries its own copies (`loader-cli/build.rs`) and finds them by their short names.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const CFLAGS: &[&str] = &["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror"];

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let include_dir = manifest_dir.join("../../runtime/include");
    let header = include_dir.join("uprobe.h");

    // Watching the directory makes a newly added handler source trigger a rebuild.
    println!("cargo:rerun-if-changed={}", manifest_dir.display());
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rustc-env=C_HANDLERS_LIB_DIR={}", out_dir.display());

    for src in &c_sources(&manifest_dir) {
        println!("cargo:rerun-if-changed={}", src.display());
        let stem = src.file_stem().and_then(|s| s.to_str()).expect("UTF-8 source name");
        compile(src, &include_dir, &out_dir.join(format!("{stem}.so")));
    }
}

/// The `*.c` files directly in `dir`, sorted so the build order is stable.
fn c_sources(dir: &Path) -> Vec<PathBuf> {
    let mut sources: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "c"))
        .collect();
    sources.sort();
    sources
}

/// Compiles under a temporary name and renames, so a test of an earlier build still running
/// never loads a half-written library.
fn compile(src: &Path, include_dir: &Path, out: &Path) {
    let tmp = out.with_extension("so.tmp");
    let mut cmd = Command::new("gcc");
    cmd.args(CFLAGS).arg(format!("-I{}", include_dir.display())).arg("-o").arg(&tmp).arg(src);
    let output = cmd.output().unwrap_or_else(|e| panic!("running gcc for {}: {e} (is gcc installed?)", src.display()));
    if !output.status.success() {
        panic!(
            "gcc failed ({}) compiling {}:\n{:?}\n{}",
            output.status,
            src.display(),
            cmd,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    fs::rename(&tmp, out).unwrap_or_else(|e| panic!("renaming {} to {}: {e}", tmp.display(), out.display()));
}
