//! Records of running sandboxes under `DATA/sandboxes/`, so `ps`, `kill` and `gc` work
//! from any process, and a crashed skiff's leftovers can be found.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub pid: i32,
    /// The process's start time in clock ticks since boot (/proc/PID/stat field 22):
    /// with the pid it names the process even after the pid is reused.
    pub start_time: u64,
    pub cgroup_slot: usize,
    pub netns_slot: Option<usize>,
    pub created_unix: u64,
    pub detached: bool,
    pub command: Vec<String>,
}

/// Records live in the run directory (tmpfs): they churn on every start and mean
/// nothing after a reboot.
pub fn dir(data: &Path) -> PathBuf {
    data.join("run").join("sandboxes")
}

/// Detached sandboxes' output, kept on disk.
pub fn log_path(data: &Path, id: &str) -> PathBuf {
    data.join("logs").join(format!("{id}.log"))
}

impl Record {
    pub fn save(&self, data: &Path) -> Result<()> {
        let dir = dir(data);
        let tmp = dir.join(format!(".{}.tmp", self.id));
        std::fs::write(&tmp, serde_json::to_vec(self)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, dir.join(format!("{}.json", self.id)))?;
        Ok(())
    }

    pub fn remove(&self, data: &Path) {
        let dir = dir(data);
        let _ = std::fs::remove_file(dir.join(format!("{}.json", self.id)));
        let _ = std::fs::remove_file(log_path(data, &self.id));
    }

    /// Whether the recorded process still runs (a zombie counts as gone).
    pub fn is_alive(&self) -> bool {
        start_time(self.pid).is_some_and(|(t, state)| t == self.start_time && state != 'Z')
    }
}

/// Every record, oldest first.
pub fn load_all(data: &Path) -> Result<Vec<Record>> {
    let mut records = Vec::new();
    let entries = match std::fs::read_dir(dir(data)) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(records),
        Err(e) => return Err(e).context("cannot list sandbox records"),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json") {
            // A record being replaced can vanish between listing and reading.
            if let Ok(bytes) = std::fs::read(&path) {
                let record: Record = serde_json::from_slice(&bytes)
                    .with_context(|| format!("corrupt sandbox record {}", path.display()))?;
                records.push(record);
            }
        }
    }
    records.sort_by_key(|r| (r.created_unix, r.id.clone()));
    Ok(records)
}

/// The record whose id is `id` or starts with it.
pub fn find(data: &Path, id: &str) -> Result<Record> {
    let mut matches: Vec<Record> = load_all(data)?
        .into_iter()
        .filter(|r| r.id.starts_with(id))
        .collect();
    match matches.len() {
        0 => bail!("no such sandbox: {id}"),
        1 => Ok(matches.remove(0)),
        n => bail!("{n} sandboxes match {id:?}: give more of the id"),
    }
}

/// (start time, state) of `pid` from /proc/PID/stat.
pub fn start_time(pid: i32) -> Option<(u64, char)> {
    let stat = skiff_cgroups::read_small(Path::new(&format!("/proc/{pid}/stat"))).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    // `rest` starts at field 3 (state); the start time is field 22.
    let start = fields.nth(22 - 4)?.parse().ok()?;
    Some((start, state))
}
