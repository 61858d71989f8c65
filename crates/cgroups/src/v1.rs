//! cgroup v1: one directory per controller hierarchy.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::{
    kill_pids, oom_kill_count, parse_procs, read_trimmed, update_file, write_file, Backend, Entry,
    Limits, CPU_PERIOD_US,
};

pub(crate) struct V1 {
    memory: PathBuf,
    cpu: PathBuf,
    pids: PathBuf,
}

impl V1 {
    /// `roots` are the pool's directories in the memory, cpu and pids hierarchies.
    pub(crate) fn new(memory: PathBuf, cpu: PathBuf, pids: PathBuf) -> V1 {
        V1 { memory, cpu, pids }
    }
}

impl Backend for V1 {
    fn dirs(&self, slot: &str) -> Vec<PathBuf> {
        [&self.memory, &self.cpu, &self.pids]
            .into_iter()
            .map(|root| root.join(slot))
            .collect()
    }

    fn create_root(&self) -> Result<()> {
        for root in [&self.memory, &self.cpu, &self.pids] {
            std::fs::create_dir_all(root)
                .with_context(|| format!("cannot create cgroup {}", root.display()))?;
        }
        Ok(())
    }

    fn create(&self, slot: &str) -> Result<()> {
        for dir in self.dirs(slot) {
            match std::fs::create_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(e)
                        .with_context(|| format!("cannot create cgroup {}", dir.display()))
                }
                _ => {}
            }
        }
        write_file(
            &self.cpu.join(slot).join("cpu.cfs_period_us"),
            &CPU_PERIOD_US.to_string(),
        )
    }

    fn remove(&self, slot: &str) -> Result<()> {
        for dir in self.dirs(slot) {
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e)
                        .with_context(|| format!("cannot remove cgroup {}", dir.display()))
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn set_limits(&self, slot: &str, limits: &Limits) -> Result<()> {
        let memory = self.memory.join(slot);
        let bytes = limits.memory_bytes.to_string();
        let limit = memory.join("memory.limit_in_bytes");
        if !read_trimmed(&limit).is_ok_and(|current| current == bytes) {
            // memsw (memory+swap) must stay >= the memory limit: raise memory first when
            // growing, memsw first when shrinking; equal values forbid swap. Kernels
            // without swap accounting have no memsw file: nothing to set then.
            let memsw = memory.join("memory.memsw.limit_in_bytes");
            let set_memsw = || match std::fs::write(&memsw, &bytes) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("cannot write {bytes} to {}", memsw.display()))
                }
                _ => Ok(()),
            };
            if write_file(&limit, &bytes).is_err() {
                set_memsw()?;
                write_file(&limit, &bytes)?;
            } else {
                set_memsw()?;
            }
        }
        let quota = (limits.cpus * CPU_PERIOD_US as f64).round() as u64;
        update_file(
            &self.cpu.join(slot).join("cpu.cfs_quota_us"),
            &quota.to_string(),
        )?;
        update_file(
            &self.pids.join(slot).join("pids.max"),
            &limits.pids.to_string(),
        )
    }

    fn entry(&self, slot: &str, entry: &mut Entry) -> Result<()> {
        for dir in self.dirs(slot) {
            // "0" written to `tasks` moves only the writing thread (the new process is
            // single-threaded then), which the kernel does without the global
            // threadgroup lock; `cgroup.procs` takes it, and its writer waits for an RCU
            // grace period unless another move just happened: 5-15 ms on an idle host.
            let path = dir.join("tasks");
            let file = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            entry.join.push(file.into());
        }
        Ok(())
    }

    fn procs(&self, slot: &str) -> Result<Vec<i32>> {
        let mut pids = Vec::new();
        for dir in self.dirs(slot) {
            for pid in parse_procs(&read_trimmed(&dir.join("cgroup.procs"))?) {
                if !pids.contains(&pid) {
                    pids.push(pid);
                }
            }
        }
        Ok(pids)
    }

    fn kill_all(&self, slot: &str) -> Result<()> {
        kill_pids(&self.procs(slot)?);
        Ok(())
    }

    fn oom_kills(&self, slot: &str) -> Result<u64> {
        oom_kill_count(&self.memory.join(slot).join("memory.oom_control"))
    }

    fn memory_usage(&self, slot: &str) -> Result<u64> {
        let text = read_trimmed(&self.memory.join(slot).join("memory.usage_in_bytes"))?;
        text.parse().context("bad memory.usage_in_bytes")
    }

    fn reset(&self, slot: &str) -> Result<()> {
        if self.memory_usage(slot)? > crate::RESET_THRESHOLD {
            write_file(&self.memory.join(slot).join("memory.force_empty"), "0")?;
        }
        Ok(())
    }
}
