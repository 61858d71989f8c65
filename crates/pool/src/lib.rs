//! Claims on a fixed set of pre-created slots, shared by every skiff process on the node.
//!
//! A pool's state directory holds `size` (the number of slots) and `lock` (taken while
//! the resources are created or removed, never on the hot path); its claims live in the
//! data directory's run directory ([`run_dir`]), a tmpfs: claims churn on every sandbox
//! start, and on a disk file system each one allocates and frees an inode; they also
//! vanish with a reboot, as the cgroups and namespaces they stand for do. A slot `i` is
//! claimed by creating the symlink `claims/i` whose target names the owner
//! (a sandbox id). `symlink(2)` creates exclusively and atomically, so a claim costs one
//! syscall, carries its owner, and needs no lock and no daemon; a crashed owner leaves a
//! symlink that `skiff gc` finds and releases. The resources themselves (cgroups,
//! namespaces) are never renamed: on cgroup v1 a rename takes the kernel's cgroup_mutex
//! and v2 cannot rename at all.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The state of one pool.
#[derive(Debug, Clone)]
pub struct Claims {
    state: PathBuf,
    dir: PathBuf,
}

const TMPFS_MAGIC: i64 = 0x0102_1994;

/// `DATA/run`: a tmpfs for state that lives as long as the kernel objects it describes
/// (claims, records of running sandboxes). Mounted on first use, and again after a reboot.
pub fn run_dir(data: &Path) -> io::Result<PathBuf> {
    let dir = data.join("run");
    if is_tmpfs_mount(&dir) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    let _lock = lock_file(&data.join("run.lock"))?;
    if !is_tmpfs_mount(&dir) {
        let target = CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        // SAFETY: valid C strings.
        let r = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                flags,
                c"mode=0700,size=64m".as_ptr().cast(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(dir)
}

/// Unmounts the run directory (with every claim and record in it).
pub fn remove_run_dir(data: &Path) -> io::Result<bool> {
    let dir = data.join("run");
    if !is_tmpfs_mount(&dir) {
        return Ok(false);
    }
    let target = CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: a valid C string.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(
            err.kind(),
            format!("cannot unmount {}: {err}", dir.display()),
        ));
    }
    let _ = std::fs::remove_dir(&dir);
    let _ = std::fs::remove_file(data.join("run.lock"));
    Ok(true)
}

/// Whether a tmpfs is mounted at `path` itself: on a file system of its own (another
/// device than its parent's) of type tmpfs. Being *on* a tmpfs is not enough: the data
/// directory itself may live on one.
pub fn is_tmpfs_mount(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let (Ok(here), Some(Ok(parent))) = (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) else {
        return false;
    };
    // SAFETY: statfs into a zeroed local struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let tmpfs =
        unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == TMPFS_MAGIC };
    tmpfs && here.dev() != parent.dev()
}

/// Claims made by `skiff serve` (its instances and sandboxes) have owners starting with
/// this: a daemon that restarts, and `skiff gc`, tell them from `skiff run`'s by it.
pub const SERVE_OWNER_PREFIX: &str = "serve-";
/// The file in the data directory `skiff serve` keeps locked while it serves it.
pub const SERVE_LOCK: &str = "serve.lock";

/// Takes an exclusive lock on `path` (created if needed), held until the file is dropped.
pub fn lock_file(path: &Path) -> io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::create(path)?;
    // SAFETY: a valid descriptor; the lock lives as long as the returned File.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// Like [`lock_file`], but `None` at once if another process holds the lock.
pub fn try_lock_file(path: &Path) -> io::Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    // SAFETY: a valid descriptor; the lock lives as long as the returned File.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        return Err(err);
    }
    Ok(Some(file))
}

/// A claim as found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub slot: usize,
    pub owner: String,
    /// How long ago the claim was made (from the symlink's ctime).
    pub age: Duration,
}

impl Claims {
    /// A pool whose size and lock live in `state` and whose claims live in `claims`.
    pub fn new(state: impl Into<PathBuf>, claims: impl Into<PathBuf>) -> io::Result<Claims> {
        let (state, dir) = (state.into(), claims.into());
        std::fs::create_dir_all(&state)?;
        std::fs::create_dir_all(&dir)?;
        Ok(Claims { state, dir })
    }

    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// The configured number of slots (0 before the pool was first made).
    pub fn size(&self) -> io::Result<usize> {
        match std::fs::read_to_string(self.state.join("size")) {
            Ok(text) => text.trim().parse().map_err(|_| {
                io::Error::other(format!("corrupt {}", self.state.join("size").display()))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Records the number of slots (atomically); 0 forgets the pool.
    pub fn set_size(&self, size: usize) -> io::Result<()> {
        let path = self.state.join("size");
        if size == 0 {
            return match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let tmp = self.state.join("size.tmp");
        std::fs::write(&tmp, size.to_string())?;
        std::fs::rename(&tmp, path)
    }

    /// Takes the pool's lock, held until the returned file is dropped.
    pub fn lock(&self) -> io::Result<std::fs::File> {
        lock_file(&self.state.join("lock"))
    }

    /// Claims a free slot below `size` for `owner`, probing from `hint`. Returns `None`
    /// when every slot is taken. With a random hint the first probe nearly always wins.
    pub fn claim(&self, size: usize, hint: usize, owner: &str) -> io::Result<Option<usize>> {
        let target = CString::new(owner).map_err(io::Error::other)?;
        for i in 0..size {
            let slot = (hint + i) % size;
            let link = self.path_c(slot);
            // SAFETY: both are valid NUL-terminated strings.
            if unsafe { libc::symlink(target.as_ptr(), link.as_ptr()) } == 0 {
                return Ok(Some(slot));
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EEXIST) {
                return Err(err);
            }
        }
        Ok(None)
    }

    /// Releases `slot`; releasing a free slot is not an error (gc and an owner may race).
    pub fn release(&self, slot: usize) -> io::Result<()> {
        match std::fs::remove_file(self.dir.join(slot.to_string())) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every current claim, in slot order.
    pub fn list(&self) -> io::Result<Vec<Claim>> {
        let now = SystemTime::now();
        let mut claims = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let Some(slot) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let (Ok(target), Ok(meta)) = (
                std::fs::read_link(entry.path()),
                std::fs::symlink_metadata(entry.path()),
            ) else {
                continue; // released while we looked
            };
            let changed = SystemTime::UNIX_EPOCH + Duration::new(meta_ctime(&meta), 0);
            claims.push(Claim {
                slot,
                owner: target.to_string_lossy().into_owned(),
                age: now.duration_since(changed).unwrap_or_default(),
            });
        }
        claims.sort_by_key(|c| c.slot);
        Ok(claims)
    }

    fn path_c(&self, slot: usize) -> CString {
        let path = self.dir.join(slot.to_string());
        CString::new(OsStr::as_bytes(path.as_os_str())).expect("claim path has no NUL")
    }
}

fn meta_ctime(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.ctime().max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> Claims {
        let dir =
            std::env::temp_dir().join(format!("skiff-pool-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Claims::new(&dir, dir.join("claims")).unwrap()
    }

    #[test]
    fn claims_are_exclusive_until_released() {
        let claims = scratch("exclusive");
        assert_eq!(claims.claim(2, 0, "a").unwrap(), Some(0));
        assert_eq!(claims.claim(2, 0, "b").unwrap(), Some(1));
        assert_eq!(claims.claim(2, 1, "c").unwrap(), None);
        let owners: Vec<_> = claims
            .list()
            .unwrap()
            .into_iter()
            .map(|c| c.owner)
            .collect();
        assert_eq!(owners, ["a", "b"]);
        claims.release(0).unwrap();
        claims.release(0).unwrap();
        assert_eq!(claims.claim(2, 1, "c").unwrap(), Some(0));
        std::fs::remove_dir_all(claims.state_dir()).unwrap();
    }

    #[test]
    fn concurrent_claimers_never_share_a_slot() {
        let claims = scratch("concurrent");
        let won: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|t| {
                    let claims = &claims;
                    s.spawn(move || claims.claim(8, t, &format!("t{t}")).unwrap())
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().unwrap())
                .collect()
        });
        let mut sorted = won.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(won.len(), 8);
        assert_eq!(sorted.len(), 8);
        std::fs::remove_dir_all(claims.state_dir()).unwrap();
    }
}
