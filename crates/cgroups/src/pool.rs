//! A persistent pool of pre-created cgroups.
//!
//! The cgroups of slot `i` are `<own cgroup>/skiff-<hash>/<i>` in each hierarchy, where
//! the hash names the data directory, so independent skiff installations (and parallel
//! tests) never share slots. Which slots are taken is skiff's own state under the data
//! directory ([`skiff_pool::Claims`]), so a one-shot CLI finds the pool warm.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use skiff_pool::{Claim, Claims};

use crate::v1::V1;
use crate::v2::{Hybrid, V2};
use crate::{Backend, Entry, Hierarchy, Layout, Limits};

/// Slots created on first use when no size was set.
pub const DEFAULT_SIZE: usize = 256;

pub struct CgroupPool {
    backend: Box<dyn Backend>,
    layout: Layout,
    name: String,
    claims: Claims,
}

/// A claimed slot.
#[derive(Debug, Clone)]
pub struct Slot {
    pub index: usize,
    name: String,
    oom_baseline: u64,
}

impl CgroupPool {
    /// The pool of the data directory `data` (its state lives in `data/pool/cgroups`).
    pub fn open(data: &Path) -> Result<CgroupPool> {
        let name = pool_name(data);
        let state = data.join("pool").join("cgroups");
        let run = skiff_pool::run_dir(data)
            .with_context(|| format!("cannot mount the run directory in {}", data.display()))?;
        let claims = Claims::new(&state, run.join("cgroups"))
            .with_context(|| format!("cannot create {}", state.display()))?;
        let hierarchy = Hierarchy::detect_cached(&state.join("hierarchy"))?;
        let v1_root = |c: &str| {
            hierarchy
                .v1_dir(c)
                .map(|d| d.join(&name))
                .unwrap_or_default()
        };
        let v1 = || V1::new(v1_root("memory"), v1_root("cpu"), v1_root("pids"));
        let v2 = |limits| {
            let own = hierarchy
                .v2
                .as_ref()
                .map(|(d, _)| d.clone())
                .unwrap_or_default();
            V2::new(own.clone(), own.join(&name), limits)
        };
        let backend: Box<dyn Backend> = match hierarchy.layout {
            Layout::V1 => Box::new(v1()),
            Layout::V2 => Box::new(v2(true)),
            Layout::Hybrid => Box::new(Hybrid {
                v1: v1(),
                v2: v2(false),
            }),
        };
        Ok(CgroupPool {
            backend,
            layout: hierarchy.layout,
            name,
            claims,
        })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The directory name of this pool in every hierarchy (`skiff-<hash>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cgroup directories of `slot`.
    pub fn dirs(&self, slot: usize) -> Vec<PathBuf> {
        self.backend.dirs(&slot.to_string())
    }

    /// The configured number of slots (0 before first use).
    pub fn size(&self) -> Result<usize> {
        self.claims
            .size()
            .context("cannot read the cgroup pool's size")
    }

    /// Creates (or re-creates, after a reboot) the cgroups of `size` slots and removes
    /// the free ones beyond it. Off the hot path; serialised by a lock file.
    pub fn resize(&self, size: usize) -> Result<()> {
        let _lock = self.claims.lock()?;
        let old = self.size()?;
        self.backend.create_root()?;
        for slot in 0..size {
            self.backend.create(&slot.to_string())?;
        }
        let claimed: Vec<usize> = self.claims()?.iter().map(|c| c.slot).collect();
        if let Some(busy) = claimed.iter().find(|&&s| s >= size) {
            bail!("cannot shrink the pool to {size}: slot {busy} is in use");
        }
        for slot in size..old {
            self.backend.remove(&slot.to_string())?;
        }
        Ok(self.claims.set_size(size)?)
    }

    /// Claims a slot for `owner` and applies `limits`. Creates the pool on first use.
    pub fn acquire(&self, owner: &str, limits: &Limits) -> Result<(Slot, Entry)> {
        let mut size = self.size()?;
        if size == 0 {
            self.resize(DEFAULT_SIZE)?;
            size = DEFAULT_SIZE;
        }
        let Some(index) = self.claims.claim(size, random_hint(), owner)? else {
            bail!(
                "the cgroup pool is exhausted: all {size} slots are in use \
                 (see `skiff ps`; grow it with `skiff pool --size N`)"
            );
        };
        match self.prepare(index, limits) {
            Ok(ready) => Ok(ready),
            // The cgroups vanish with a reboot while our claims persist: re-create them.
            Err(_) if !self.dirs(index).iter().all(|d| d.exists()) => self
                .resize(size)
                .and_then(|()| self.prepare(index, limits))
                .inspect_err(|_| {
                    let _ = self.claims.release(index);
                }),
            Err(e) => {
                let _ = self.claims.release(index);
                Err(e)
            }
        }
    }

    fn prepare(&self, index: usize, limits: &Limits) -> Result<(Slot, Entry)> {
        let name = index.to_string();
        self.backend.set_limits(&name, limits)?;
        let mut entry = Entry::default();
        self.backend.entry(&name, &mut entry)?;
        let oom_baseline = self.backend.oom_kills(&name)?;
        Ok((
            Slot {
                index,
                name,
                oom_baseline,
            },
            entry,
        ))
    }

    /// Whether the kernel OOM-killed a process in `slot` since it was acquired.
    pub fn oom_killed(&self, slot: &Slot) -> bool {
        self.backend
            .oom_kills(&slot.name)
            .is_ok_and(|n| n > slot.oom_baseline)
    }

    pub fn memory_usage(&self, slot: usize) -> Result<u64> {
        self.backend.memory_usage(&slot.to_string())
    }

    /// Pids in `slot`.
    pub fn procs(&self, slot: usize) -> Result<Vec<i32>> {
        self.backend.procs(&slot.to_string())
    }

    /// Kills what is left in `slot`, waits for it to empty, resets it, and frees it.
    pub fn release(&self, slot: usize) -> Result<()> {
        self.empty(slot)?;
        self.backend.reset(&slot.to_string())?;
        self.claims.release(slot)?;
        Ok(())
    }

    /// Kills every process in `slot` and waits until the cgroup is empty. Returns how
    /// many processes it found.
    pub fn empty(&self, slot: usize) -> Result<usize> {
        let name = slot.to_string();
        let found = self.backend.procs(&name)?.len();
        if found == 0 {
            return Ok(0);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            self.backend.kill_all(&name)?;
            std::thread::sleep(Duration::from_millis(1));
            if self.backend.procs(&name)?.is_empty() {
                return Ok(found);
            }
            if Instant::now() > deadline {
                bail!("cgroup slot {slot} did not empty within 10 s");
            }
        }
    }

    pub fn claims(&self) -> Result<Vec<Claim>> {
        Ok(self.claims.list()?)
    }

    /// Frees a claim without touching its cgroups (for claims whose owner is gone and
    /// whose cgroups were emptied by [`CgroupPool::empty`]).
    pub fn unclaim(&self, slot: usize) -> Result<()> {
        Ok(self.claims.release(slot)?)
    }

    /// Removes every cgroup of the pool and its state. Fails if a slot is in use.
    pub fn destroy(&self) -> Result<Vec<PathBuf>> {
        let _lock = self.claims.lock()?;
        if let Some(c) = self.claims()?.first() {
            bail!("slot {} is in use by sandbox {}", c.slot, c.owner);
        }
        let mut removed = Vec::new();
        for slot in 0..self.size()? {
            let name = slot.to_string();
            let present: Vec<PathBuf> = self
                .backend
                .dirs(&name)
                .into_iter()
                .filter(|d| d.exists())
                .collect();
            self.empty(slot)?;
            self.backend.remove(&name)?;
            removed.extend(present);
        }
        // The pool roots: parents of slot 0's directories.
        for dir in self.backend.dirs("0") {
            let root = dir.parent().expect("slot dirs have a parent");
            if root.exists() {
                std::fs::remove_dir(root)
                    .with_context(|| format!("cannot remove cgroup {}", root.display()))?;
                removed.push(root.to_owned());
            }
        }
        self.claims.set_size(0)?;
        Ok(removed)
    }
}

/// `skiff-` and 8 hex digits of the FNV-1a hash of the data directory's absolute path.
fn pool_name(data: &Path) -> String {
    let path = std::path::absolute(data).unwrap_or_else(|_| data.to_owned());
    let hash = path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
    format!("skiff-{:08x}", hash as u32)
}

/// A cheap, well-spread starting slot so concurrent claimers rarely collide.
fn random_hint() -> usize {
    let mut buf = [0u8; 8];
    // SAFETY: buf is valid for 8 bytes; GRND_NONBLOCK never blocks after boot.
    unsafe { libc::getrandom(buf.as_mut_ptr().cast(), 8, libc::GRND_NONBLOCK) };
    u64::from_ne_bytes(buf) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_names_differ_per_data_dir() {
        let a = pool_name(Path::new("/nonexistent/a"));
        let b = pool_name(Path::new("/nonexistent/b"));
        assert_ne!(a, b);
        assert_eq!(a.len(), "skiff-".len() + 8);
    }
}
