//! A pool of pre-created loopback-only network namespaces for `network: none`.
//!
//! Creating a network namespace takes the kernel's global net lock and costs
//! milliseconds, so they are made ahead of time, kept alive by bind mounts of their nsfs
//! files under `DATA/pool/netns/ns/<i>`, and claimed like cgroup slots. Sockets die with
//! the processes that held them, so a released namespace is clean for the next sandbox.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use skiff_pool::{Claim, Claims};

/// Namespaces made on first use of `network: none`.
pub const DEFAULT_SIZE: usize = 32;

pub struct NetnsPool {
    ns_dir: PathBuf,
    claims: Claims,
}

impl NetnsPool {
    pub fn open(data: &Path) -> Result<NetnsPool> {
        let state = data.join("pool").join("netns");
        let run = skiff_pool::run_dir(data)
            .with_context(|| format!("cannot mount the run directory in {}", data.display()))?;
        let claims = Claims::new(&state, run.join("netns"))
            .with_context(|| format!("cannot create {}", state.display()))?;
        Ok(NetnsPool {
            ns_dir: state.join("ns"),
            claims,
        })
    }

    /// Claims a namespace for `owner`; returns its slot and a descriptor to `setns` to.
    pub fn acquire(&self, owner: &str) -> Result<(usize, OwnedFd)> {
        let mut size = self.claims.size()?;
        if size == 0 {
            self.resize(DEFAULT_SIZE)?;
            size = DEFAULT_SIZE;
        }
        let hint = std::process::id() as usize;
        let Some(slot) = self.claims.claim(size, hint, owner)? else {
            bail!("the network namespace pool is exhausted: all {size} are in use");
        };
        let path = self.ns_dir.join(slot.to_string());
        let opened = File::open(&path)
            .ok()
            .filter(|_| is_nsfs(&path))
            .map(OwnedFd::from);
        match opened {
            Some(fd) => Ok((slot, fd)),
            // Gone after a reboot: re-create the pool, then retry once.
            None => self
                .resize(size)
                .and_then(|()| Ok(File::open(&path)?.into()))
                .map(|fd| (slot, fd))
                .inspect_err(|_| {
                    let _ = self.claims.release(slot);
                }),
        }
    }

    pub fn release(&self, slot: usize) -> Result<()> {
        Ok(self.claims.release(slot)?)
    }

    pub fn claims(&self) -> Result<Vec<Claim>> {
        Ok(self.claims.list()?)
    }

    /// Makes sure namespaces `0..size` exist (off the hot path).
    pub fn resize(&self, size: usize) -> Result<()> {
        let _lock = self.claims.lock()?;
        std::fs::create_dir_all(&self.ns_dir)?;
        for slot in 0..size {
            let path = self.ns_dir.join(slot.to_string());
            if !is_nsfs(&path) {
                create_namespace(&path).with_context(|| {
                    format!("cannot create network namespace {}", path.display())
                })?;
            }
        }
        for slot in size..self.claims.size()? {
            remove_namespace(&self.ns_dir.join(slot.to_string()))?;
        }
        Ok(self.claims.set_size(size)?)
    }

    /// Unmounts and removes every namespace of the pool. Fails if one is in use.
    pub fn destroy(&self) -> Result<Vec<PathBuf>> {
        let _lock = self.claims.lock()?;
        if let Some(c) = self.claims.list()?.first() {
            bail!(
                "network namespace {} is in use by sandbox {}",
                c.slot,
                c.owner
            );
        }
        let mut removed = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&self.ns_dir) {
            for entry in entries.flatten() {
                remove_namespace(&entry.path())?;
                removed.push(entry.path());
            }
        }
        self.claims.set_size(0)?;
        Ok(removed)
    }
}

fn is_nsfs(path: &Path) -> bool {
    const NSFS_MAGIC: i64 = 0x6e73_6673;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs into a zeroed local struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == NSFS_MAGIC }
}

fn remove_namespace(path: &Path) -> Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid C string; the mount (if any) is ours.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Creates a namespace with loopback up, pinned by a bind mount at `path`. Runs on a
/// short-lived thread, whose namespace change affects only itself.
fn create_namespace(path: &Path) -> Result<()> {
    File::create(path)?;
    let target = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    std::thread::spawn(move || -> Result<()> {
        // SAFETY: unshare affects only this thread; the ioctl and mount get valid
        // buffers and C strings.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error()).context("unshare(CLONE_NEWNET)");
            }
            loopback_up()?;
            let own = c"/proc/thread-self/ns/net";
            if libc::mount(
                own.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error()).context("bind mount");
            }
        }
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("namespace thread panicked"))?
}

unsafe fn loopback_up() -> Result<()> {
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
    if sock < 0 {
        return Err(std::io::Error::last_os_error()).context("socket");
    }
    let sock = <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(sock);
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    req.name[..2].copy_from_slice(b"lo");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    if libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req) != 0 {
        return Err(std::io::Error::last_os_error()).context("SIOCGIFFLAGS lo");
    }
    req.flags |= libc::IFF_UP as libc::c_short;
    if libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req) != 0 {
        return Err(std::io::Error::last_os_error()).context("SIOCSIFFLAGS lo");
    }
    Ok(())
}
