//! What uprobe-run learns about a running process before it touches it, from `/proc`: that it
//! exists and may be traced, that its program is a dynamically linked x86-64 glibc program,
//! where its C library and (if there) the runtime are mapped, and its threads. Each finding
//! that rules an attach out is a refusal naming its cause.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::attach::error::{AttachError, Yama};
use crate::attach::ptrace;
use crate::base::elf;

/// How a runtime an attach loaded from a memory file appears in `/proc/PID/maps` (followed
/// by ` (deleted)`).
pub const MEMFD_PREFIX: &str = "/memfd:libuprobe.so";

/// The file name an attach session's agent thread carries (its `comm`).
pub const AGENT_NAME: &str = "uprobe-agent";

/// How long a process that seems to lack glibc is watched for its exit (see `check_libc`).
const EXIT_CHECKS: u32 = 20;
const EXIT_CHECK_GAP: std::time::Duration = std::time::Duration::from_millis(5);

pub use uprobe_contracts::maps::{parse as parse_maps, Mapping};

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A process about to be attached to.
#[derive(Debug)]
pub struct Target {
    pub pid: i32,
    pub exe: PathBuf,
    /// `starttime` from /proc/PID/stat: tells the process from one reusing its pid.
    pub start_time: u64,
}

fn proc_path(pid: i32, what: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{what}"))
}

/// The value of `key:` in /proc/PID/status.
fn status_field(pid: i32, key: &str) -> Option<String> {
    let text = fs::read_to_string(proc_path(pid, "status")).ok()?;
    text.lines().find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(':')).map(|v| v.trim().to_owned()))
}

/// `kernel.yama.ptrace_scope`.
pub fn yama() -> Yama {
    Yama(fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok().and_then(|s| s.trim().parse().ok()))
}

/// The refusal for a process we may not trace, with what tells why.
pub fn not_permitted(pid: i32) -> AttachError {
    let theirs = status_field(pid, "Uid").and_then(|u| u.split_whitespace().next().map(str::to_owned));
    let ours = ptrace::effective_uid();
    let why = match theirs {
        Some(uid) if uid != ours.to_string() && !has_cap_sys_ptrace() => {
            format!("it runs as uid {uid}, uprobe-run as uid {ours}")
        }
        Some(_) if !has_cap_sys_ptrace() => format!("same uid {ours}, without CAP_SYS_PTRACE"),
        Some(uid) => format!(
            "it runs as uid {uid}; uprobe-run (uid {ours}) has CAP_SYS_PTRACE, yet the kernel refused: a security \
             module, another user namespace, or a process that made itself undumpable"
        ),
        None => format!("uprobe-run runs as uid {ours}"),
    };
    AttachError::NotPermitted { pid, why, yama: yama() }
}

/// Whether uprobe-run's effective capabilities include CAP_SYS_PTRACE.
fn has_cap_sys_ptrace() -> bool {
    const CAP_SYS_PTRACE: u32 = 19;
    status_field(std::process::id() as i32, "CapEff")
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}

/// Maps an error reading `/proc/PID/...` to the refusal it means.
fn proc_error(pid: i32, path: &Path, e: io::Error) -> AttachError {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => AttachError::NoSuchProcess(pid),
        Some(libc::EACCES) | Some(libc::EPERM) => not_permitted(pid),
        _ => AttachError::Read { path: path.into(), source: e },
    }
}

/// The kernel's flag for its own threads (`PF_KTHREAD`, in /proc/PID/stat's `flags`).
const PF_KTHREAD: u64 = 0x0020_0000;

/// `(state, starttime, flags)` of /proc/PID/stat.
fn stat(pid: i32) -> Result<(char, u64, u64), AttachError> {
    let path = proc_path(pid, "stat");
    let text = fs::read_to_string(&path).map_err(|e| proc_error(pid, &path, e))?;
    // The command name may hold anything, parentheses included: fields follow the last ')'.
    let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first().and_then(|s| s.chars().next()).unwrap_or('?');
    let start_time = fields.get(19).and_then(|s| s.parse().ok()).unwrap_or(0);
    let flags = fields.get(6).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok((state, start_time, flags))
}

impl Target {
    /// Checks process `pid` and what it runs; touches nothing.
    pub fn open(pid: i32) -> Result<Target, AttachError> {
        if pid <= 0 {
            return Err(AttachError::NoSuchProcess(pid));
        }
        if pid as u32 == std::process::id() {
            return Err(AttachError::Itself(pid));
        }
        let (state, start_time, flags) = stat(pid)?;
        if flags & PF_KTHREAD != 0 {
            let name = fs::read_to_string(proc_path(pid, "comm")).map(|c| c.trim().to_owned()).unwrap_or_default();
            return Err(AttachError::KernelThread { pid, name });
        }
        if state == 'Z' || state == 'X' {
            return Err(AttachError::Zombie(pid));
        }
        if state == 'T' {
            return Err(AttachError::Stopped(pid));
        }
        let exe_link = proc_path(pid, "exe");
        let exe = fs::read_link(&exe_link).map_err(|e| proc_error(pid, &exe_link, e))?;
        if let Some(tracer_pid) = status_field(pid, "TracerPid").and_then(|t| t.parse::<i32>().ok()).filter(|&t| t != 0)
        {
            let tracer = fs::read_to_string(proc_path(tracer_pid, "comm"))
                .map(|c| c.trim().to_owned())
                .unwrap_or_else(|_| "another process".into());
            return Err(AttachError::AlreadyTraced { pid, tracer_pid, tracer });
        }
        let target = Target { pid, exe, start_time };
        target.check_program()?;
        target.check_libc()?;
        if let Some(agent) = target.threads().into_iter().find(|&tid| target.comm(tid).as_deref() == Some(AGENT_NAME)) {
            return Err(AttachError::AlreadyAttached { pid, agent: agent.to_string() });
        }
        Ok(target)
    }

    /// The program: ELF64 x86-64, with a dynamic loader.
    fn check_program(&self) -> Result<(), AttachError> {
        let path = proc_path(self.pid, "exe");
        let mut bytes = Vec::new();
        let read = |bytes: &mut Vec<u8>, len: usize| -> io::Result<()> {
            let mut file = fs::File::open(&path)?;
            bytes.clear();
            file.by_ref().take(len as u64).read_to_end(bytes).map(drop)
        };
        read(&mut bytes, elf::HEADER_LEN).map_err(|e| proc_error(self.pid, &path, e))?;
        let problem = |problem| AttachError::Elf { pid: self.pid, exe: self.exe.clone(), problem };
        let needed = elf::prefix_len(&bytes).map_err(problem)?;
        read(&mut bytes, needed).map_err(|e| proc_error(self.pid, &path, e))?;
        let elf = elf::inspect(&bytes).map_err(problem)?;
        if !elf.has_interp {
            return Err(AttachError::Static { pid: self.pid, exe: self.exe.clone() });
        }
        Ok(())
    }

    /// glibc is mapped (not musl, not no C library at all). A refusal waits up to
    /// `EXIT_CHECKS * EXIT_CHECK_GAP` for a process that is on its way out to end.
    fn check_libc(&self) -> Result<(), AttachError> {
        let maps = self.maps()?;
        let not_glibc = |what: String| AttachError::NotGlibc { pid: self.pid, exe: self.exe.clone(), what };
        if let Some(m) = maps.iter().find(|m| file_name(&m.path).starts_with("ld-musl")) {
            return Err(not_glibc(format!("it uses musl ({})", m.path)));
        }
        if self.libc(&maps).is_none() {
            // An exiting process loses its mappings (all, or some of them) before it is a
            // zombie: give it a moment to show that it is gone before calling it not glibc.
            let exiting = maps.is_empty().then_some(AttachError::ExitedDuringAttach { pid: self.pid });
            let cause = self.changed().or(exiting).or_else(|| {
                (0..EXIT_CHECKS).find_map(|_| {
                    std::thread::sleep(EXIT_CHECK_GAP);
                    self.changed()
                })
            });
            return Err(cause.unwrap_or_else(|| not_glibc("no libc.so.6 is mapped in it".into())));
        }
        Ok(())
    }

    pub fn maps(&self) -> Result<Vec<Mapping>, AttachError> {
        let path = proc_path(self.pid, "maps");
        // Gone now: it was there when checked, so it exited since.
        let text = fs::read_to_string(&path).map_err(|e| match proc_error(self.pid, &path, e) {
            AttachError::NoSuchProcess(pid) => AttachError::ExitedDuringAttach { pid },
            other => other,
        })?;
        Ok(parse_maps(&text))
    }

    /// glibc's mapping at file offset 0 (its load address).
    pub fn libc<'m>(&self, maps: &'m [Mapping]) -> Option<&'m Mapping> {
        maps.iter().find(|m| m.offset == 0 && file_name(&m.path) == "libc.so.6")
    }

    /// The first mapping of the file named `name` (at offset 0), e.g. an already loaded runtime.
    pub fn mapped<'m>(&self, maps: &'m [Mapping], name: &str) -> Option<&'m Mapping> {
        maps.iter().find(|m| m.offset == 0 && file_name(&m.path) == name)
    }

    /// The runtime's first mapping, if the process has it: `libuprobe.so` (preloaded, or
    /// loaded from a file), or the memory file an attach loaded it from
    /// (`/memfd:libuprobe.so...`, see `attach::load`).
    pub fn runtime<'m>(&self, maps: &'m [Mapping]) -> Option<&'m Mapping> {
        let runtime = |m: &&Mapping| {
            file_name(&m.path) == "libuprobe.so" || m.path.strip_prefix(MEMFD_PREFIX) == Some(" (deleted)")
        };
        maps.iter().filter(|m| m.offset == 0).find(runtime)
    }

    /// The thread of the process whose id in the process's own PID namespace is `ns_tid`
    /// (the last `NSpid` of its status): the id uprobe-run knows it by.
    pub fn host_tid(&self, ns_tid: i32) -> Option<i32> {
        self.threads().into_iter().find(|&tid| {
            let status = fs::read_to_string(proc_path(self.pid, &format!("task/{tid}/status"))).unwrap_or_default();
            let ns = status.lines().find_map(|l| l.strip_prefix("NSpid:"));
            ns.and_then(|ids| ids.split_whitespace().last()).and_then(|id| id.parse().ok()) == Some(ns_tid)
        })
    }

    /// The descriptors of the process whose link reads `link` (e.g. `/memfd:NAME (deleted)`).
    pub fn fds_linked_to(&self, link: &str) -> Vec<i32> {
        let Ok(dir) = fs::read_dir(proc_path(self.pid, "fd")) else { return Vec::new() };
        dir.filter_map(|e| e.ok())
            .filter(|e| fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == link))
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// A path to a file mapped in the process, as uprobe-run can open it (through the
    /// process's root, which may be another mount namespace's).
    pub fn file(&self, path: &str) -> PathBuf {
        proc_path(self.pid, "root").join(path.trim_start_matches('/'))
    }

    /// The process's threads now.
    pub fn threads(&self) -> Vec<i32> {
        let mut tids: Vec<i32> = fs::read_dir(proc_path(self.pid, "task"))
            .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default();
        tids.sort_unstable();
        tids
    }

    /// Whether thread `tid` runs with a user shadow stack (`x86_Thread_features: shstk`).
    pub fn shadow_stack(&self, tid: i32) -> bool {
        let status = fs::read_to_string(proc_path(self.pid, &format!("task/{tid}/status"))).unwrap_or_default();
        has_shadow_stack(&status)
    }

    /// The name (`comm`) of thread `tid`.
    pub fn comm(&self, tid: i32) -> Option<String> {
        fs::read_to_string(proc_path(self.pid, &format!("task/{tid}/comm"))).ok().map(|c| c.trim().to_owned())
    }

    /// The state letter of thread `tid` (`R`, `S`, `D`, `Z`...).
    pub fn thread_state(&self, tid: i32) -> char {
        let text = fs::read_to_string(proc_path(self.pid, &format!("task/{tid}/stat"))).unwrap_or_default();
        text.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next()).unwrap_or('?')
    }

    /// Whether the process is still the one we checked (not gone, not replaced by an exec).
    pub fn changed(&self) -> Option<AttachError> {
        match stat(self.pid) {
            Err(_) => Some(AttachError::ExitedDuringAttach { pid: self.pid }),
            Ok((state, _, _)) if state == 'Z' || state == 'X' => {
                Some(AttachError::ExitedDuringAttach { pid: self.pid })
            }
            Ok((_, start, _)) if start != self.start_time => Some(AttachError::ExitedDuringAttach { pid: self.pid }),
            Ok(_) => {
                let now = fs::read_link(proc_path(self.pid, "exe")).ok()?;
                (now != self.exe)
                    .then(|| AttachError::ExecdDuringAttach { pid: self.pid, now: now.display().to_string() })
            }
        }
    }
}

/// Whether a status file says `x86_Thread_features: ... shstk ...` (Linux 6.6 and later).
fn has_shadow_stack(status: &str) -> bool {
    let features = status.lines().find_map(|l| l.strip_prefix("x86_Thread_features:"));
    features.is_some_and(|f| f.split_whitespace().any(|w| w == "shstk"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_with_a_shadow_stack_is_seen() {
        assert!(has_shadow_stack("Name:\tx\nx86_Thread_features:\tshstk wrss\nx86_Thread_features_locked:\tshstk\n"));
        assert!(!has_shadow_stack("Name:\tx\nx86_Thread_features:\t\nx86_Thread_features_locked:\tshstk\n"));
        assert!(!has_shadow_stack("Name:\tx\n"));
    }

    #[test]
    fn maps_lines_parse() {
        let text = "7f12a000-7f12b000 r-xp 00001000 08:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7ffd0000-7ffd1000 rw-p 00000000 00:00 0 \n";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 2);
        assert_eq!(maps[0].start, 0x7f12a000);
        assert_eq!(maps[0].offset, 0x1000);
        assert_eq!(maps[0].inode, 1234);
        assert_eq!(file_name(&maps[0].path), "libc.so.6");
        assert_eq!(maps[1].path, "");
    }

    #[test]
    fn this_process_is_refused_as_itself_and_a_bad_pid_as_missing() {
        assert!(matches!(Target::open(std::process::id() as i32), Err(AttachError::Itself(_))));
        assert!(matches!(Target::open(0), Err(AttachError::NoSuchProcess(0))));
        assert!(matches!(Target::open(i32::MAX), Err(AttachError::NoSuchProcess(_))));
    }
}
