//! Deployed functions: `DATA/functions/<name>.json` (written to a temporary file, fsynced,
//! renamed, directory fsynced: an acknowledged deploy survives a crash) and the
//! function's source in `DATA/functions/<name>/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
}

impl Registry {
    pub fn open(data: &Path) -> Result<Registry> {
        let dir = data.join("functions");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Registry { dir })
    }

    pub fn source_dir(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn incoming_dir(&self) -> PathBuf {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        self.dir
            .join(format!(".incoming-{}-{nanos}", std::process::id()))
    }

    pub fn get(&self, name: &str) -> Option<Function> {
        let bytes = std::fs::read(self.dir.join(format!("{name}.json"))).ok()?;
        serde_json::from_slice(&bytes).ok()
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
        let tmp = self.dir.join(format!(".{}.json.tmp", f.name));
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&serde_json::to_vec_pretty(f)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(format!("{}.json", f.name)))?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(())
    }

    /// Removes a function; returns whether it existed.
    pub fn remove(&self, name: &str) -> Result<bool> {
        let record = self.dir.join(format!("{name}.json"));
        if !record.exists() {
            return Ok(false);
        }
        std::fs::remove_file(&record)?;
        let _ = std::fs::remove_dir_all(self.source_dir(name));
        Ok(true)
    }
}
