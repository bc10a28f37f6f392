//! Builds the runtime (libuprobe.so) and puts it inside uprobe-run, so that a copied or
//! `cargo install`ed binary needs no file beside it: `src/base/runtime.rs` writes it out on
//! first use. The runtime is built in release mode whatever the profile (its hit path is
//! what users measure), in a target directory of its own (the outer build holds the lock on
//! the usual one), without debug information (the binary carries it; symbols stay).
//!
//! That directory, `<target>/embedded-runtime`, is the one place a build script of the
//! workspace writes outside its `OUT_DIR`, on purpose: one nested build serves every profile
//! and every command. Under `OUT_DIR` each of `cargo clippy`, `cargo doc` and `cargo build
//! --release` gets a directory of its own, so CI would build the runtime three times from
//! clean instead of once (81 MB and about 50 s on two cores each).
//!
//! `UPROBE_EMBED_RUNTIME=PATH` embeds an already built library instead.
//!
//! The bundled handler libraries go in too (`src/base/bundled.rs` writes them out when a run names
//! one by its short name, `--handlers count`): `libcount.so`, built by the same nested build,
//! and the classic C examples of `handlers/c`, compiled with gcc (without gcc they are left
//! out, with a warning, and a run that names them is told so).

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

    let built = match env::var_os("UPROBE_EMBED_RUNTIME").filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => build_runtime(&root, &out),
    };
    let bytes = std::fs::read(&built).unwrap_or_else(|e| panic!("reading {}: {e}", built.display()));
    std::fs::write(out.join("libuprobe.so"), &bytes).expect("write the embedded runtime");
    println!("cargo:rustc-env=UPROBE_RUNTIME_HASH={:016x}", fnv1a(&bytes));

    // The bundled handlers: an empty file stands for one that could not be built.
    let count = built.with_file_name("libcount.so");
    let count = std::fs::read(&count).unwrap_or_default();
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

/// `cargo build --release -p uprobe -p count` into `<target>/embedded-runtime`.
fn build_runtime(root: &Path, out: &Path) -> PathBuf {
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
    let target = out.ancestors().nth(4).map(Path::to_path_buf).unwrap_or_else(|| out.to_path_buf());
    let target_dir = target.join("embedded-runtime");
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
    let status = cmd.status().expect("run cargo to build the runtime");
    assert!(status.success(), "building the runtime (libuprobe.so) failed: {status}");
    target_dir.join("release").join("libuprobe.so")
}

/// FNV-1a, 64 bits: names the runtime's cache directory, so two builds never share a file.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
