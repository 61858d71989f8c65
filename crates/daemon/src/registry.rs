//! Deployed functions: `DATA/functions/<name>.json` (written to a temporary file, fsynced,
//! renamed, directory fsynced: an acknowledged deploy survives a crash) and the
//! function's source in `DATA/functions/<name>/`; a deploy works in a scratch directory
//! beside them until it is installed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
pub use skiff_manifest::{Network, Runtime};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Function {
    pub name: String,
    pub runtime: Runtime,
    pub handler: String,
    /// The environment in the store.
    pub env: String,
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u64,
    pub timeout_ms: u64,
    /// The manifest's `env`: variables every instance starts with.
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    #[serde(default)]
    pub network: Network,
    #[serde(default)]
    pub scale: Scale,
    /// `wasm` functions with sessions.
    #[serde(default)]
    pub session: Option<Session>,
    pub deployed_unix: u64,
}

/// The manifest's `session`, in plain numbers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Session {
    pub key: skiff_manifest::SessionKey,
    /// Requests one worker runs at once; more start secondaries.
    pub max_concurrency: u32,
    /// Idle this long: checkpoint, then the workers end.
    pub keep_alive_ms: u64,
    pub durability: skiff_manifest::Durability,
    pub locking: skiff_manifest::Locking,
}

impl From<&skiff_manifest::Session> for Session {
    fn from(s: &skiff_manifest::Session) -> Session {
        Session {
            key: s.key.clone(),
            max_concurrency: s.max_concurrency.0,
            keep_alive_ms: s.keep_alive.0.as_millis() as u64,
            durability: s.durability,
            locking: s.locking,
        }
    }
}

/// The manifest's `scale`, in plain numbers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scale {
    /// Invocations one instance serves at once.
    pub concurrency: u32,
    pub min_instances: u32,
    pub max_instances: u32,
    pub keep_alive_ms: u64,
    /// Requests that may wait when every instance is busy.
    pub queue: u32,
}

impl Default for Scale {
    fn default() -> Scale {
        Scale::from(&skiff_manifest::Scale::default())
    }
}

impl From<&skiff_manifest::Scale> for Scale {
    fn from(s: &skiff_manifest::Scale) -> Scale {
        Scale {
            concurrency: s.concurrency.0,
            min_instances: s.min_instances,
            max_instances: s.max_instances.0,
            keep_alive_ms: s.keep_alive.0.as_millis() as u64,
            queue: s.queue.0,
        }
    }
}

pub struct Registry {
    dir: PathBuf,
    /// Per function name: held by a deploy or removal from start to end, so those of
    /// one name run one at a time.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A deploy's scratch (`DATA/functions/.incoming-PID-N`, and its body beside it as
/// `.incoming-PID-N.tar`): removed when dropped (an installed deploy's directory was
/// renamed away before).
pub struct Scratch {
    pub dir: PathBuf,
    pub body: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.body);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const SCRATCH_PREFIX: &str = ".incoming-";

/// Removes the scratch of deploys that did not finish: all of it when no daemon runs,
/// else only that of processes that are gone. Returns what it removed.
pub fn remove_scratch(data: &Path, daemon_running: bool) -> Result<Vec<PathBuf>> {
    let dir = data.join("functions");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(SCRATCH_PREFIX)) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
        // SAFETY: kill(2) with signal 0 only asks whether the process exists.
        if daemon_running && pid.is_some_and(|pid| unsafe { libc::kill(pid, 0) } == 0) {
            continue;
        }
        let path = entry.path();
        let gone = if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if gone.is_ok() {
            removed.push(path);
        }
    }
    Ok(removed)
}

impl Registry {
    pub fn open(data: &Path) -> Result<Registry> {
        let dir = data.join("functions");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Registry {
            dir,
            locks: Mutex::new(HashMap::new()),
        })
    }

    /// The lock that deploys and removals of `name` hold.
    pub fn lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap();
        // Those nobody holds go: names that are tried once do not pile up.
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        locks.entry(name.to_owned()).or_default().clone()
    }

    pub fn source_dir(&self, name: &str) -> std::io::Result<PathBuf> {
        crate::names::inside(&self.dir, name, "")
    }

    /// A new scratch place for a deploy, unique in this process.
    pub fn scratch(&self) -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = format!("{SCRATCH_PREFIX}{}-{n}", std::process::id());
        Scratch {
            dir: self.dir.join(&base),
            body: self.dir.join(format!("{base}.tar")),
        }
    }

    pub fn get(&self, name: &str) -> Option<Function> {
        let path = crate::names::inside(&self.dir, name, ".json").ok()?;
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    pub fn list(&self) -> Result<Vec<Function>> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "json") {
                if let Ok(f) = serde_json::from_slice(&std::fs::read(&path)?) {
                    all.push(f);
                }
            }
        }
        all.sort_by(|a: &Function, b| a.name.cmp(&b.name));
        Ok(all)
    }

    pub fn put(&self, f: &Function) -> Result<()> {
        use std::io::Write;
        let path = crate::names::inside(&self.dir, &f.name, ".json")?;
        let tmp = self.dir.join(format!(".{}.json.tmp", f.name));
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&serde_json::to_vec_pretty(f)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(())
    }

    /// Removes a function; returns whether it existed.
    pub fn remove(&self, name: &str) -> Result<bool> {
        let record = crate::names::inside(&self.dir, name, ".json")?;
        if !record.exists() {
            return Ok(false);
        }
        std::fs::remove_file(&record)?;
        let _ = std::fs::remove_dir_all(self.source_dir(name)?);
        Ok(true)
    }
}
