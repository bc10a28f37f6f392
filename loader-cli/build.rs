//! Builds the runtime (libuprobe.so) and puts it inside a release build of uprobe-run, so
//! that a copied or `cargo install`ed binary needs no file beside it: `src/base/runtime.rs`
//! writes it out on first use. The runtime is built in release mode (its hit path is what
//! users measure), by a nested cargo in a target directory of its own inside this script's
//! `OUT_DIR` (the outer build holds the lock on the usual one; a build script writes nowhere
//! else), without debug information (the binary carries it; symbols stay).
//!
//! Only the release profile carries the runtime (`PROFILE` is `release`: `cargo build
//! --release`, `cargo test --release`, `cargo install`). Every other command (`cargo check`,
//! `cargo clippy`, `cargo doc`, a debug build) gets an `OUT_DIR` of its own, and a nested
//! build in each would cost CI a minute of two cores apiece; there uprobe-run carries no
//! runtime and takes the `libuprobe.so` the workspace build puts beside it
//! (`target/debug/libuprobe.so`), or `$UPROBE_LIB`, and says so when neither is there.
//!
//! `UPROBE_EMBED_RUNTIME=PATH` embeds an already built library instead, in any profile.
//!
//! The bundled handler libraries go in too (`src/base/bundled.rs` writes them out when a run names
//! one by its short name, `--handlers count`): `libcount.so`, built by the same nested build
//! (release only, as the runtime), and the classic C examples of `handlers/c`, compiled with
//! gcc (without gcc they are left out, with a warning, and a run that names them is told so).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("loader-cli lies in the workspace").to_path_buf();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for watched in [
        "runtime/src",
        "runtime/contracts/src",
        "runtime/contracts/Cargo.toml",
        "runtime/memfns",
        "runtime/include",
        "runtime/Cargo.toml",
        "handlers/count",
        "handlers/sdk",
        "handlers/c/uprobe_example.c",
        "handlers/c/uretprobe_example.c",
        "Cargo.lock",
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=UPROBE_EMBED_RUNTIME");

    let release = env::var("PROFILE").is_ok_and(|p| p == "release");
    let built = match env::var_os("UPROBE_EMBED_RUNTIME").filter(|v| !v.is_empty()) {
        Some(path) => Some(PathBuf::from(path)),
        None => release.then(|| build_runtime(&root, &out)),
    };
    // An empty file stands for a library not carried (the runtime and libcount.so outside
    // release builds; a bundled handler that could not be built).
    let read = |path: &Path| std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let bytes = built.as_deref().map(read).unwrap_or_default();
    std::fs::write(out.join("libuprobe.so"), &bytes).expect("write the embedded runtime");
    println!("cargo:rustc-env=UPROBE_RUNTIME_HASH={:016x}", fnv1a(&bytes));

    let count = built.map(|b| b.with_file_name("libcount.so"));
    let count = count.and_then(|c| std::fs::read(c).ok()).unwrap_or_default();
    std::fs::write(out.join("libcount.so"), &count).expect("write the embedded libcount.so");
    for name in ["uprobe_example", "uretprobe_example"] {
        let src = root.join("handlers/c").join(format!("{name}.c"));
        let dest = out.join(format!("{name}.so"));
        if !compile_c(&src, &root.join("runtime/include"), &dest) {
            println!("cargo:warning=gcc could not build {}: uprobe-run will not carry {name}.so", src.display());
            std::fs::write(&dest, b"").expect("write an empty placeholder");
        }
    }
}

/// Compiles a C handler library with gcc; false if that fails.
fn compile_c(src: &Path, include: &Path, out: &Path) -> bool {
    Command::new("gcc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra"])
        .arg(format!("-I{}", include.display()))
        .arg("-o")
        .arg(out)
        .arg(src)
        .status()
        .is_ok_and(|s| s.success())
}

/// `cargo build --release -p uprobe -p count` into `OUT_DIR/runtime-build`.
fn build_runtime(root: &Path, out: &Path) -> PathBuf {
    let target_dir = out.join("runtime-build");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "-p", "uprobe", "-p", "count", "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .args(["--config", "profile.release.debug=0"]);
    // What cargo tells a build script about this package is not for the nested build; its
    // own settings (home, registries, network) are.
    for (name, _) in env::vars_os() {
        let name = name.to_string_lossy();
        let keep = ["CARGO_HOME", "CARGO_NET_", "CARGO_REGISTRIES_", "CARGO_HTTP_", "CARGO_REGISTRY_"]
            .iter()
            .any(|k| name.starts_with(k));
        if name.starts_with("CARGO_") && !keep {
            cmd.env_remove(name.as_ref());
        }
    }
    // `cargo clippy --release` lints the workspace, not the library it carries (under the
    // wrapper the nested build would compile the runtime a second time, and lint it).
    cmd.env_remove("RUSTC_WORKSPACE_WRAPPER");
    let status = cmd.status().expect("run cargo to build the runtime");
    assert!(status.success(), "building the runtime (libuprobe.so) failed: {status}");
    target_dir.join("release").join("libuprobe.so")
}

/// FNV-1a, 64 bits: names the runtime's cache directory, so two builds never share a file.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
