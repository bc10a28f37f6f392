//! What the numbers were measured on.

use crate::json::{num, obj, text};
use serde_json::Value;
use std::fs;

#[derive(Clone, Debug)]
pub struct Machine {
    pub kernel: String,
    pub cpu: String,
    pub cpus: usize,
    pub mem_gib: f64,
    pub compiler: String,
    /// /proc/loadavg's 1, 5 and 15 minute averages when the run started.
    pub load: String,
}

impl Machine {
    pub fn probe() -> Machine {
        let read = |p: &str| fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let mem_kb: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let compiler = std::process::Command::new("gcc")
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.lines().next().map(str::to_owned))
            .unwrap_or_else(|| "unknown".into());
        let load = read("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        Machine {
            load,
            kernel: format!("{} {}", read("/proc/sys/kernel/ostype").trim(), read("/proc/sys/kernel/osrelease").trim()),
            cpu,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mem_gib: mem_kb / (1024.0 * 1024.0),
            compiler,
        }
    }

    /// One line for the table's header.
    pub fn summary(&self) -> String {
        format!("{}, {}, {} CPUs, {:.0} GiB, x86_64", self.kernel, self.cpu, self.cpus, self.mem_gib)
    }

    pub fn to_json(&self) -> Value {
        obj([
            ("kernel", text(&self.kernel)),
            ("cpu", text(&self.cpu)),
            ("nproc", Value::from(self.cpus as i64)),
            ("mem_gib", num((self.mem_gib * 10.0).round() / 10.0)),
            ("arch", text(std::env::consts::ARCH)),
            ("fixture_compiler", text(&self.compiler)),
            ("loadavg_at_start", text(&self.load)),
        ])
    }
}
