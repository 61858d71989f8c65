//! The shared read-only layer (FRE §4.1.3): every file of every environment is a hard
//! link to one immutable object in `DATA/store`, named by its sha256. Identical files
//! across runtimes, packages and functions are one inode: one copy on disk and in the
//! page cache.
//!
//! An environment is `DATA/envs/<id>/root` (directories, hard links, symlinks) plus
//! `DATA/envs/<id>/env.json` (its entries). It is built under a temporary name and
//! renamed into place, so a half-built environment is never visible, and two builds of
//! the same id race harmlessly: the second rename finds the first's result.

pub mod closure;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// One path of an environment, relative to its root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Entry {
    Dir {
        path: String,
    },
    File {
        path: String,
        digest: String,
        executable: bool,
        size: u64,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl Entry {
    pub fn path(&self) -> &str {
        match self {
            Entry::Dir { path } | Entry::File { path, .. } | Entry::Symlink { path, .. } => path,
        }
    }
}

/// What `env.json` records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnvRecord {
    pub id: String,
    pub name: String,
    pub entries: Vec<Entry>,
}

/// Sizes of one environment for `skiff envs`.
#[derive(Debug, Clone)]
pub struct EnvUsage {
    pub id: String,
    pub name: String,
    pub files: usize,
    /// Bytes of all its files.
    pub total: u64,
    /// Bytes of files no other environment links.
    pub unique: u64,
    /// Bytes of files other environments link too.
    pub shared: u64,
}

#[derive(Debug, Default)]
pub struct FsckReport {
    pub checked: usize,
    pub corrupt: Vec<Corrupt>,
}

/// A store object whose content no longer hashes to its name.
#[derive(Debug)]
pub struct Corrupt {
    pub object: PathBuf,
    pub expected: String,
    pub found: String,
}

pub struct Store {
    objects: PathBuf,
    envs: PathBuf,
}

impl Store {
    pub fn open(data: &Path) -> Result<Store> {
        let store = Store {
            objects: data.join("store"),
            envs: data.join("envs"),
        };
        for dir in [&store.objects, &store.envs, &store.envs.join("by-name")] {
            fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        Ok(store)
    }

    fn object_path(&self, digest: &str, executable: bool) -> PathBuf {
        // The mode lives in the inode, which every link shares: executables and plain
        // files with the same bytes are two objects.
        let name = if executable {
            format!("{digest}-x")
        } else {
            digest.to_owned()
        };
        self.objects.join(&digest[..2]).join(name)
    }

    /// Adds the file at `src` (hashing while copying) and returns its entry at `path`.
    pub fn put_file(&self, src: &Path, path: &str) -> Result<Entry> {
        let meta = fs::metadata(src).with_context(|| format!("cannot read {}", src.display()))?;
        let executable = meta.permissions().mode() & 0o111 != 0;
        let mut input =
            File::open(src).with_context(|| format!("cannot read {}", src.display()))?;
        self.put_reader(&mut input, path, executable, Some(meta.modified()?))
    }

    /// Adds the bytes `input` yields as the file `path` of an environment.
    pub fn put_reader(
        &self,
        input: &mut dyn Read,
        path: &str,
        executable: bool,
        mtime: Option<std::time::SystemTime>,
    ) -> Result<Entry> {
        let tmp = self
            .objects
            .join(format!(".tmp-{}-{}", std::process::id(), unique()));
        let mut output = File::create(&tmp)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 256 << 10];
        let mut size = 0u64;
        loop {
            let n = input.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            output.write_all(&buf[..n])?;
            size += n as u64;
        }
        let digest = hex(&hasher.finalize());
        let object = self.object_path(&digest, executable);
        if object.exists() {
            fs::remove_file(&tmp)?;
        } else {
            // Keep the source's mtime: Python trusts a .pyc only while its source's mtime
            // matches the one recorded inside it, and the first file stored with given
            // bytes is the one every environment shares.
            if let Some(mtime) = mtime {
                output.set_modified(mtime)?;
            }
            output.sync_all()?;
            fs::set_permissions(
                &tmp,
                fs::Permissions::from_mode(if executable { 0o555 } else { 0o444 }),
            )?;
            fs::create_dir_all(object.parent().expect("objects have a parent"))?;
            // Atomic: a concurrent writer of the same bytes renames the same content.
            fs::rename(&tmp, &object)?;
        }
        Ok(Entry::File {
            path: path.to_owned(),
            digest,
            executable,
            size,
        })
    }

    pub fn env_root(&self, id: &str) -> PathBuf {
        self.envs.join(id).join("root")
    }

    pub fn env_exists(&self, id: &str) -> bool {
        self.envs.join(id).join("env.json").exists()
    }

    /// Makes the environment `id` from `entries` (later entries win over earlier ones at
    /// the same path), names it `name`, and returns its root. Reuses an existing one.
    pub fn build_env(&self, id: &str, name: &str, entries: &[Entry]) -> Result<PathBuf> {
        if !self.env_exists(id) {
            let tmp = self.envs.join(format!(
                ".building-{id}-{}-{}",
                std::process::id(),
                unique()
            ));
            let result = self.materialize(&tmp, id, name, entries).and_then(|()| {
                match fs::rename(&tmp, self.envs.join(id)) {
                    Ok(()) => Ok(()),
                    // Another build of the same environment finished first: keep it.
                    Err(e) if self.env_exists(id) => {
                        let _ = e;
                        Ok(())
                    }
                    Err(e) => Err(e).context("cannot publish the environment"),
                }
            });
            if tmp.exists() {
                let _ = remove_tree(&tmp);
            }
            result?;
        }
        self.set_name(name, id)?;
        Ok(self.env_root(id))
    }

    fn materialize(&self, dir: &Path, id: &str, name: &str, entries: &[Entry]) -> Result<()> {
        let root = dir.join("root");
        fs::create_dir_all(&root)?;
        let mut last: HashMap<&str, &Entry> = HashMap::new();
        let mut order = Vec::new();
        for e in entries {
            if last.insert(e.path(), e).is_none() {
                order.push(e.path());
            }
        }
        let mut kept = Vec::with_capacity(order.len());
        for path in order {
            let entry = last[path];
            check_relative(path)?;
            let target = root.join(path);
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            match entry {
                Entry::Dir { .. } => fs::create_dir_all(&target)?,
                Entry::File {
                    digest, executable, ..
                } => fs::hard_link(self.object_path(digest, *executable), &target)
                    .with_context(|| format!("cannot link {path}"))?,
                Entry::Symlink { target: to, .. } => std::os::unix::fs::symlink(to, &target)?,
            }
            kept.push(entry.clone());
        }
        let record = EnvRecord {
            id: id.to_owned(),
            name: name.to_owned(),
            entries: kept,
        };
        let mut file = File::create(dir.join("env.json"))?;
        file.write_all(&serde_json::to_vec(&record)?)?;
        file.sync_all()?;
        Ok(())
    }

    fn set_name(&self, name: &str, id: &str) -> Result<()> {
        let link = self.envs.join("by-name").join(name);
        let tmp = self
            .envs
            .join("by-name")
            .join(format!(".{name}.{}", unique()));
        std::os::unix::fs::symlink(id, &tmp)?;
        fs::rename(&tmp, &link)?;
        Ok(())
    }

    /// The environment named `name_or_id` (a name, or an id).
    pub fn resolve(&self, name_or_id: &str) -> Result<EnvRecord> {
        let id = fs::read_link(self.envs.join("by-name").join(name_or_id))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| name_or_id.to_owned());
        self.record(&id)
            .with_context(|| format!("no environment named {name_or_id:?} (see `skiff envs`)"))
    }

    pub fn record(&self, id: &str) -> Result<EnvRecord> {
        let bytes = fs::read(self.envs.join(id).join("env.json"))?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    pub fn records(&self) -> Result<Vec<EnvRecord>> {
        let mut records = Vec::new();
        for entry in fs::read_dir(&self.envs)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "by-name" {
                continue;
            }
            if let Ok(r) = self.record(&name) {
                records.push(r);
            }
        }
        records.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(records)
    }

    /// Total, unique and shared bytes per environment. An object's link count says how
    /// many environment files use it (one link is the store's own).
    pub fn usage(&self) -> Result<Vec<EnvUsage>> {
        let records = self.records()?;
        let mut usage = Vec::new();
        for r in &records {
            let files: Vec<(PathBuf, u64)> = r
                .entries
                .iter()
                .filter_map(|e| match e {
                    Entry::File {
                        digest,
                        executable,
                        size,
                        ..
                    } => Some((self.object_path(digest, *executable), *size)),
                    _ => None,
                })
                .collect();
            let mut own: HashMap<&PathBuf, u64> = HashMap::new();
            for (object, _) in &files {
                *own.entry(object).or_default() += 1;
            }
            let mut u = EnvUsage {
                id: r.id.clone(),
                name: r.name.clone(),
                files: files.len(),
                total: files.iter().map(|(_, size)| size).sum(),
                unique: 0,
                shared: 0,
            };
            for (object, size) in &files {
                let links = fs::metadata(object).map_or(1, |m| m.nlink());
                if links.saturating_sub(1) <= own[object] {
                    u.unique += size;
                } else {
                    u.shared += size;
                }
            }
            usage.push(u);
        }
        Ok(usage)
    }

    /// Bytes the store holds on disk (each object once).
    pub fn disk_bytes(&self) -> Result<u64> {
        let mut total = 0;
        for object in self.objects()? {
            total += fs::metadata(&object)?.len();
        }
        Ok(total)
    }

    fn objects(&self) -> Result<Vec<PathBuf>> {
        let mut all = Vec::new();
        for shard in fs::read_dir(&self.objects)? {
            let shard = shard?;
            if !shard.file_type()?.is_dir() {
                continue;
            }
            for object in fs::read_dir(shard.path())? {
                all.push(object?.path());
            }
        }
        Ok(all)
    }

    /// Removes an environment (its record first, so a crash leaves no half-record).
    pub fn remove_env(&self, id: &str) -> Result<()> {
        let dir = self.envs.join(id);
        let doomed = self.envs.join(format!(".removing-{id}-{}", unique()));
        fs::rename(&dir, &doomed).with_context(|| format!("no environment {id}"))?;
        remove_tree(&doomed)?;
        Ok(())
    }

    /// Removes interrupted builds and objects no environment links. Returns what it
    /// removed, one line each.
    pub fn gc(&self) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        for entry in fs::read_dir(&self.envs)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".building-") || name.starts_with(".removing-") {
                if name.starts_with(".building-") && builder_alive(&name) {
                    continue;
                }
                remove_tree(&entry.path())?;
                removed.push(format!("interrupted environment build {name}"));
            }
        }
        for entry in fs::read_dir(self.envs.join("by-name"))? {
            let entry = entry?;
            if !entry.path().join("env.json").exists() && fs::read_link(entry.path()).is_ok() {
                let target = fs::read_link(entry.path())?;
                if !self.envs.join(&target).join("env.json").exists() {
                    fs::remove_file(entry.path())?;
                    removed.push(format!(
                        "name {} of a removed environment",
                        entry.file_name().to_string_lossy()
                    ));
                }
            }
        }
        for object in self.objects()? {
            let name = file_name(&object);
            let meta = fs::metadata(&object)?;
            if name.starts_with(".tmp-") || meta.nlink() == 1 {
                fs::remove_file(&object)?;
                removed.push(format!("store object {name} ({} bytes)", meta.len()));
            }
        }
        for entry in fs::read_dir(&self.objects)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp-") {
                fs::remove_file(entry.path())?;
                removed.push(format!("partial store object {name}"));
            }
        }
        Ok(removed)
    }

    /// Re-hashes every object; returns the corrupt ones (path, expected, found).
    pub fn fsck(&self) -> Result<FsckReport> {
        let mut report = FsckReport::default();
        for object in self.objects()? {
            let name = file_name(&object);
            let expected = name.trim_end_matches("-x").to_owned();
            let found = hash_file(&object)?;
            report.checked += 1;
            if found != expected {
                report.corrupt.push(Corrupt {
                    object,
                    expected,
                    found,
                });
            }
        }
        Ok(report)
    }
}

/// Adds every file, directory and symlink below `src` at `prefix` (relative), skipping
/// paths for which `skip` says so.
pub fn add_tree(
    store: &Store,
    src: &Path,
    prefix: &str,
    skip: &dyn Fn(&Path) -> bool,
    entries: &mut Vec<Entry>,
) -> Result<()> {
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut children: Vec<_> = fs::read_dir(&dir)
            .with_context(|| format!("cannot read {}", dir.display()))?
            .collect::<io::Result<_>>()?;
        children.sort_by_key(|e| e.file_name());
        for child in children {
            let path = child.path();
            let rel = path.strip_prefix(src).expect("below src");
            if skip(rel) {
                continue;
            }
            let dest = Path::new(prefix).join(rel).to_string_lossy().into_owned();
            let kind = child.file_type()?;
            if kind.is_dir() {
                entries.push(Entry::Dir { path: dest });
                stack.push(path);
            } else if kind.is_symlink() {
                let target = fs::read_link(&path)?.to_string_lossy().into_owned();
                entries.push(Entry::Symlink { path: dest, target });
            } else if kind.is_file() {
                entries.push(store.put_file(&path, &dest)?);
            }
        }
    }
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

fn check_relative(path: &str) -> Result<()> {
    if path.is_empty() || path.starts_with('/') || path.split('/').any(|p| p == "..") {
        bail!("environment path {path:?} leaves the environment");
    }
    Ok(())
}

fn hash_file(path: &Path) -> Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hex(&hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A process-unique suffix for temporary names.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `.building-<id>-<pid>-<n>`: whether the builder process still runs.
fn builder_alive(name: &str) -> bool {
    let mut parts = name.rsplitn(3, '-');
    let _n = parts.next();
    parts
        .next()
        .and_then(|pid| pid.parse::<i32>().ok())
        // SAFETY: signal 0 only checks for existence.
        .is_some_and(|pid| pid != std::process::id() as i32 && unsafe { libc::kill(pid, 0) } == 0)
}

/// Removes a tree whose files may be read-only.
fn remove_tree(dir: &Path) -> io::Result<()> {
    fs::remove_dir_all(dir)
}
