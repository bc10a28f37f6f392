//! Compiles each `handlers/c/*.c` into a handler library `<name>.so` with the system gcc and
//! copies it into the cargo profile directory (`target/<profile>/`), where `uprobe-run` and
//! the integration tests expect the built handler libraries.

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

    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out: the profile directory is three up.
    let profile_dir = out_dir
        .ancestors()
        .nth(3)
        .unwrap_or_else(|| panic!("unexpected OUT_DIR layout: {}", out_dir.display()))
        .to_path_buf();

    // Watching the directory makes a newly added handler source trigger a rebuild.
    println!("cargo:rerun-if-changed={}", manifest_dir.display());
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rustc-env=C_HANDLERS_LIB_DIR={}", profile_dir.display());

    let sources = c_sources(&manifest_dir);
    for src in &sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let stem = src.file_stem().and_then(|s| s.to_str()).expect("UTF-8 source name");
        let built = out_dir.join(format!("{stem}.so"));
        compile(src, &include_dir, &built);
        install(&built, &profile_dir.join(format!("{stem}.so")));
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

fn compile(src: &Path, include_dir: &Path, out: &Path) {
    let mut cmd = Command::new("gcc");
    cmd.args(CFLAGS).arg(format!("-I{}", include_dir.display())).arg("-o").arg(out).arg(src);
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
}

/// Copies via a temporary name and renames, so a test running concurrently never loads a
/// half-written library.
fn install(built: &Path, dest: &Path) {
    let tmp = dest.with_extension("so.tmp");
    fs::copy(built, &tmp).unwrap_or_else(|e| panic!("copying {} to {}: {e}", built.display(), tmp.display()));
    fs::rename(&tmp, dest).unwrap_or_else(|e| panic!("renaming {} to {}: {e}", tmp.display(), dest.display()));
}
