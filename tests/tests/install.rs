//! An installed uprobe-run: the binary alone, copied to a directory of its own (as `cargo
//! install` leaves it), finds its runtime without any environment variable: the copy it
//! carries, written once to the user's cache directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use uprobe_tests::*;

/// A directory with only a copy of uprobe-run in it, and an empty cache directory.
struct Installed {
    dir: PathBuf,
}

impl Installed {
    fn new() -> Installed {
        let dir = tempfile("installed");
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        copy_program(&uprobe_run(), &dir.join("bin/uprobe-run"));
        Installed { dir }
    }

    fn cache(&self) -> PathBuf {
        self.dir.join("cache")
    }

    fn run(&self, args: &[&str], cwd: &Path) -> Output {
        Command::new(self.dir.join("bin/uprobe-run"))
            .args(args)
            .current_dir(cwd)
            .env_remove("UPROBE_LIB")
            .env("XDG_CACHE_HOME", self.cache())
            .output()
            .expect("run the installed uprobe-run")
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn an_installed_binary_runs_the_classic_example_with_the_runtime_it_carries() {
    let installed = Installed::new();
    let version = installed.run(&["--version"], &installed.dir);
    assert!(version.status.success(), "{version:?}");
    let text = String::from_utf8_lossy(&version.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(format!("uprobe-run {}", env!("CARGO_PKG_VERSION")).as_str()));
    let runtime_line = lines.next().unwrap_or_default();
    let cached = installed.cache().join("uprobe-run");
    let prefix = format!("runtime: {}/", cached.display());
    assert!(runtime_line.starts_with(&prefix), "{text}");
    assert!(runtime_line.ends_with("/libuprobe.so (carried inside uprobe-run, written there on first use)"), "{text}");
    let runtime = PathBuf::from(runtime_line["runtime: ".len()..].split(" (").next().unwrap());

    // The classic example, from the program's directory, as the README shows it.
    let prog = fixture("myprog", &["-O0", "-g", "-no-pie"]);
    let addr = nm_address(&prog, "myfunc");
    let example = artefact("uprobe_example.so");
    let vaddr = format!("vaddr={addr:#x}");
    let args = ["--handlers", example.to_str().unwrap(), "--param", &vaddr, "--param", "verbose=1", "./myprog"];
    let out = installed.run(&args, prog.parent().unwrap());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "myfunc(0) = 1\nmyfunc(1) = 2\nmyfunc(2) = 5\nmyfunc(3) = 10\nmyfunc(4) = 17\n"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut expected = String::new();
    for n in 1..=5 {
        expected += &format!("Hit #{n} on probepoint at {addr:#x}\n");
    }
    expected += "Probepoint was hit 5 times\n";
    assert!(stderr.starts_with("Registering uprobe on pid "), "{stderr}");
    assert!(stderr.ends_with(&expected), "{stderr}");
    assert!(runtime.is_file(), "{} was not written", runtime.display());

    // A second run uses the file as it is.
    let written = std::fs::metadata(&runtime).unwrap().modified().unwrap();
    let again = installed.run(&args, prog.parent().unwrap());
    assert!(again.status.success());
    assert_eq!(std::fs::metadata(&runtime).unwrap().modified().unwrap(), written);
}

#[test]
fn uprobe_lib_still_overrides_the_runtime() {
    let installed = Installed::new();
    let runtime = artefact("libuprobe.so");
    let out = Command::new(installed.dir.join("bin/uprobe-run"))
        .arg("--version")
        .env("UPROBE_LIB", &runtime)
        .output()
        .expect("run the installed uprobe-run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with(&format!("runtime: {} (from UPROBE_LIB)\n", runtime.display())), "{text}");
    assert!(!installed.cache().exists(), "nothing is written when UPROBE_LIB names the runtime");
}
