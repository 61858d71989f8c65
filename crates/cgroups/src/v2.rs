//! cgroup v2: one unified directory per slot.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::{
    kill_pids, oom_kill_count, parse_procs, read_trimmed, update_file, write_file, Backend, Entry,
    Limits, CPU_PERIOD_US,
};

pub(crate) struct V2 {
    /// This process's own v2 cgroup (the pool root's parent).
    own: PathBuf,
    root: PathBuf,
    /// false on a hybrid host, where the v2 tree carries no controllers: it then serves
    /// only for process tracking, `cgroup.kill` and `CLONE_INTO_CGROUP`.
    limits: bool,
}

const CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

impl V2 {
    pub(crate) fn new(own: PathBuf, root: PathBuf, limits: bool) -> V2 {
        V2 { own, root, limits }
    }

    fn enable_controllers(&self, dir: &std::path::Path) -> Result<()> {
        let wanted: String = CONTROLLERS.iter().map(|c| format!("+{c} ")).collect();
        let path = dir.join("cgroup.subtree_control");
        match std::fs::write(&path, wanted.trim_end()) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => bail!(
                "cannot enable cgroup controllers in {}: it holds processes (cgroup v2 allows \
                 controllers only for cgroups without their own processes); run skiff in a \
                 delegated cgroup, e.g. `systemd-run -p Delegate=yes --scope skiff ...`",
                dir.display()
            ),
            Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
        }
    }
}

impl Backend for V2 {
    fn dirs(&self, slot: &str) -> Vec<PathBuf> {
        vec![self.root.join(slot)]
    }

    fn create_root(&self) -> Result<()> {
        if self.limits {
            let offered = read_trimmed(&self.own.join("cgroup.controllers"))?;
            for c in CONTROLLERS {
                if !offered.split_whitespace().any(|o| o == c) {
                    bail!(
                        "the cgroup v2 controller {c:?} is not delegated to {}",
                        self.own.display()
                    );
                }
            }
            let enabled = read_trimmed(&self.own.join("cgroup.subtree_control"))?;
            if CONTROLLERS
                .iter()
                .any(|c| !enabled.split_whitespace().any(|e| e == *c))
            {
                self.enable_controllers(&self.own)?;
            }
        }
        std::fs::create_dir_all(&self.root)
            .with_context(|| format!("cannot create cgroup {}", self.root.display()))?;
        if self.limits {
            self.enable_controllers(&self.root)?;
        }
        Ok(())
    }

    fn create(&self, slot: &str) -> Result<()> {
        let dir = self.root.join(slot);
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                Err(e).with_context(|| format!("cannot create cgroup {}", dir.display()))
            }
            _ => Ok(()),
        }
    }

    fn remove(&self, slot: &str) -> Result<()> {
        let dir = self.root.join(slot);
        match std::fs::remove_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove cgroup {}", dir.display()))
            }
            _ => Ok(()),
        }
    }

    fn set_limits(&self, slot: &str, limits: &Limits) -> Result<()> {
        if !self.limits {
            return Ok(());
        }
        let dir = self.root.join(slot);
        update_file(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            update_file(&swap, "0")?;
        }
        let quota = (limits.cpus * CPU_PERIOD_US as f64).round() as u64;
        update_file(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
        update_file(&dir.join("pids.max"), &limits.pids.to_string())
    }

    fn entry(&self, slot: &str, entry: &mut Entry) -> Result<()> {
        let dir = self.root.join(slot);
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&dir)
            .with_context(|| format!("cannot open cgroup {}", dir.display()))?;
        entry.clone_into = Some(file.into());
        Ok(())
    }

    fn procs(&self, slot: &str) -> Result<Vec<i32>> {
        Ok(parse_procs(&read_trimmed(
            &self.root.join(slot).join("cgroup.procs"),
        )?))
    }

    fn kill_all(&self, slot: &str) -> Result<()> {
        // cgroup.kill (Linux 5.14) kills the whole subtree atomically, forks included.
        if write_file(&self.root.join(slot).join("cgroup.kill"), "1").is_err() {
            kill_pids(&self.procs(slot)?);
        }
        Ok(())
    }

    fn oom_kills(&self, slot: &str) -> Result<u64> {
        oom_kill_count(&self.root.join(slot).join("memory.events"))
    }

    fn memory_usage(&self, slot: &str) -> Result<u64> {
        read_trimmed(&self.root.join(slot).join("memory.current"))?
            .parse()
            .context("bad memory.current")
    }

    fn reset(&self, slot: &str) -> Result<()> {
        if !self.limits {
            return Ok(());
        }
        let usage = self.memory_usage(slot)?;
        if usage > crate::RESET_THRESHOLD {
            // memory.reclaim (Linux 5.19) may stop short (EAGAIN): what is left is
            // reclaimable and costs the next sandbox nothing it cannot get back.
            let _ = std::fs::write(
                self.root.join(slot).join("memory.reclaim"),
                usage.to_string(),
            );
        }
        Ok(())
    }
}

/// Hybrid hosts: limits from v1, tracking and spawning from the controller-less v2 tree.
pub(crate) struct Hybrid {
    pub(crate) v1: crate::v1::V1,
    pub(crate) v2: V2,
}

impl Backend for Hybrid {
    fn dirs(&self, slot: &str) -> Vec<PathBuf> {
        let mut dirs = self.v1.dirs(slot);
        dirs.extend(self.v2.dirs(slot));
        dirs
    }
    fn create_root(&self) -> Result<()> {
        self.v1.create_root()?;
        self.v2.create_root()
    }
    fn create(&self, slot: &str) -> Result<()> {
        self.v1.create(slot)?;
        self.v2.create(slot)
    }
    fn remove(&self, slot: &str) -> Result<()> {
        self.v1.remove(slot)?;
        self.v2.remove(slot)
    }
    fn set_limits(&self, slot: &str, limits: &Limits) -> Result<()> {
        self.v1.set_limits(slot, limits)
    }
    fn entry(&self, slot: &str, entry: &mut Entry) -> Result<()> {
        self.v2.entry(slot, entry)?;
        self.v1.entry(slot, entry)
    }
    fn procs(&self, slot: &str) -> Result<Vec<i32>> {
        self.v1.procs(slot)
    }
    fn kill_all(&self, slot: &str) -> Result<()> {
        self.v2.kill_all(slot)?;
        self.v1.kill_all(slot)
    }
    fn oom_kills(&self, slot: &str) -> Result<u64> {
        self.v1.oom_kills(slot)
    }
    fn memory_usage(&self, slot: &str) -> Result<u64> {
        self.v1.memory_usage(slot)
    }
    fn reset(&self, slot: &str) -> Result<()> {
        self.v1.reset(slot)
    }
}
