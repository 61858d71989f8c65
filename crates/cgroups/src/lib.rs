//! cgroups for skiff sandboxes.
//!
//! [`Hierarchy::detect`] reads which cgroup layout the host has (v1, v2 or hybrid) and
//! where this process sits in each hierarchy; every cgroup skiff makes lives below that
//! path (delegation). [`Backend`] is the one interface over the layouts, and
//! [`CgroupPool`] keeps pre-created cgroups that sandboxes claim and release without
//! creating or removing anything on the hot path.

mod detect;
mod pool;
mod v1;
mod v2;

pub use detect::{Hierarchy, Layout};
pub use pool::{CgroupPool, Slot};

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use anyhow::Result;

/// Resource limits of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_bytes: u64,
    /// CPU time per wall second (0.5 = half a CPU).
    pub cpus: f64,
    pub pids: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory_bytes: 256 << 20,
            cpus: 1.0,
            pids: 64,
        }
    }
}

/// Charge an empty slot may keep: the kernel objects of the last sandbox (~100 KB) are
/// freed lazily and cannot be forced out, so only page cache above this is worth the
/// milliseconds a forced reclaim costs.
pub(crate) const RESET_THRESHOLD: u64 = 1 << 20;

/// The CFS period skiff uses on both versions; quota = cpus × period.
pub(crate) const CPU_PERIOD_US: u64 = 100_000;

/// What a new process needs to enter a cgroup, opened before it is spawned.
#[derive(Debug, Default)]
pub struct Entry {
    /// A cgroup v2 directory for `clone3(CLONE_INTO_CGROUP)`.
    pub clone_into: Option<OwnedFd>,
    /// `tasks` files the new (single-threaded) process writes "0" to (v1 hierarchies).
    pub join: Vec<OwnedFd>,
}

impl Entry {
    /// Moves the running, single-threaded process `pid` (one this process did not spawn
    /// into the cgroup itself: a fork of a function's template) into the cgroup.
    pub fn admit(&self, pid: i32) -> Result<()> {
        use anyhow::Context;
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let pid = pid.to_string();
        if let Some(dir) = &self.clone_into {
            // The v2 directory: its cgroup.procs, through the directory we hold open.
            let path = format!("/proc/self/fd/{}/cgroup.procs", dir.as_raw_fd());
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|mut f| f.write_all(pid.as_bytes()))
                .context("cannot move the process into its cgroup (v2)")?;
        }
        for tasks in &self.join {
            std::fs::File::from(tasks.try_clone()?)
                .write_all(pid.as_bytes())
                .context("cannot move the process into its cgroup (v1)")?;
        }
        Ok(())
    }
}

/// One cgroup layout. Slots are named directories below the pool's root.
pub trait Backend: Send + Sync {
    /// Directories this backend manages for `slot` (one per hierarchy).
    fn dirs(&self, slot: &str) -> Vec<PathBuf>;
    /// Creates the pool root and enables controllers (off the hot path).
    fn create_root(&self) -> Result<()>;
    fn create(&self, slot: &str) -> Result<()>;
    fn remove(&self, slot: &str) -> Result<()>;
    fn set_limits(&self, slot: &str, limits: &Limits) -> Result<()>;
    /// Adds what a process needs to enter `slot` to `entry`.
    fn entry(&self, slot: &str, entry: &mut Entry) -> Result<()>;
    /// Pids of every process in `slot`.
    fn procs(&self, slot: &str) -> Result<Vec<i32>>;
    /// Kills every process in `slot` (without waiting).
    fn kill_all(&self, slot: &str) -> Result<()>;
    /// Cumulative count of OOM kills in `slot`.
    fn oom_kills(&self, slot: &str) -> Result<u64>;
    fn memory_usage(&self, slot: &str) -> Result<u64>;
    /// Drops what an empty `slot` still has charged (page cache of files the last
    /// sandbox read), so the next sandbox starts with its whole memory limit.
    fn reset(&self, slot: &str) -> Result<()>;
}

/// Reads a small pseudo-file (cgroup and /proc files) in one `read`, skipping the
/// `statx` and growing reads of `fs::read_to_string`, which show on the hot path.
pub fn read_small(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut buf = [0u8; 4096];
    let mut len = 0;
    loop {
        let n = file.read(&mut buf[len..])?;
        if n == 0 || len + n == buf.len() {
            len += n;
            break;
        }
        len += n;
    }
    if len == buf.len() {
        // Larger than a page: fall back to the general path.
        return std::fs::read_to_string(path);
    }
    Ok(String::from_utf8_lossy(&buf[..len]).into_owned())
}

pub(crate) fn read_trimmed(path: &std::path::Path) -> Result<String> {
    use anyhow::Context;
    Ok(read_small(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .trim()
        .to_owned())
}

pub(crate) fn write_file(path: &std::path::Path, value: &str) -> Result<()> {
    use anyhow::Context;
    std::fs::write(path, value)
        .with_context(|| format!("cannot write {value:?} to {}", path.display()))
}

/// Writes `value` unless the file already holds it. A reused slot mostly keeps its
/// limits, and a read is far cheaper than a write here (cpu.cfs_quota_us walks the
/// whole task-group tree under a global mutex).
pub(crate) fn update_file(path: &std::path::Path, value: &str) -> Result<()> {
    if read_small(path).is_ok_and(|current| current.trim() == value) {
        return Ok(());
    }
    write_file(path, value)
}

/// The `oom_kill N` counter of a v1 `memory.oom_control` or a v2 `memory.events`.
pub(crate) fn oom_kill_count(path: &std::path::Path) -> Result<u64> {
    Ok(read_trimmed(path)?
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0))
}

pub(crate) fn parse_procs(text: &str) -> Vec<i32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

pub(crate) fn kill_pids(pids: &[i32]) {
    for &pid in pids {
        // SAFETY: plain syscall; the pids come from a cgroup skiff owns.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}
