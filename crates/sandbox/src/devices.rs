//! The /dev every sandbox gets, made once per data directory.
//!
//! A read-only tmpfs with the device nodes, the /proc/self/fd links and an empty `shm`
//! directory lives at `DATA/pool/dev`; a sandbox bind-mounts it as its /dev and puts its
//! own tmpfs on /dev/shm: two mount calls instead of nineteen on the hot path. The nodes
//! are made with mknod rather than bound from the host's /dev, so the template is one
//! mount: every mount in the host's table is copied into each new sandbox and torn down
//! again, so each one costs every start.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// (name, major, minor) of the character devices every sandbox gets.
const NODES: [(&str, u32, u32); 6] = [
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];
const LINKS: [(&str, &str); 4] = [
    ("/proc/self/fd", "fd"),
    ("/proc/self/fd/0", "stdin"),
    ("/proc/self/fd/1", "stdout"),
    ("/proc/self/fd/2", "stderr"),
];

fn template_dir(data: &Path) -> PathBuf {
    data.join("pool").join("dev")
}

/// The template's path, creating it if it is not mounted (first use, or after a reboot).
pub fn ensure(data: &Path) -> Result<PathBuf> {
    let dir = template_dir(data);
    if skiff_pool::is_tmpfs_mount(&dir) {
        return Ok(dir);
    }
    std::fs::create_dir_all(data.join("pool"))?;
    let _lock = skiff_pool::lock_file(&data.join("pool").join("dev.lock"))?;
    if !skiff_pool::is_tmpfs_mount(&dir) {
        create(&dir)
            .with_context(|| format!("cannot create the /dev template {}", dir.display()))?;
    }
    Ok(dir)
}

/// Unmounts and removes the template; returns whether there was one.
pub fn remove(data: &Path) -> Result<bool> {
    let dir = template_dir(data);
    let mounted = skiff_pool::is_tmpfs_mount(&dir);
    if mounted {
        let c = cstr(&dir)?;
        // SAFETY: a valid path; MNT_DETACH takes the node binds along.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot unmount {}", dir.display()));
        }
    }
    let _ = std::fs::remove_dir(&dir);
    let _ = std::fs::remove_file(data.join("pool").join("dev.lock"));
    Ok(mounted)
}

fn create(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let target = cstr(dir)?;
    let flags = (libc::MS_NOSUID | libc::MS_NOEXEC) as libc::c_ulong;
    mount(
        c"tmpfs",
        &target,
        Some(c"tmpfs"),
        flags,
        Some(c"mode=755,size=64k"),
    )?;
    for (name, major, minor) in NODES {
        let path = cstr(&dir.join(name))?;
        // SAFETY: a valid path; mode and device number are plain integers.
        let made = unsafe {
            libc::mknod(
                path.as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(major, minor),
            ) == 0
                && libc::chmod(path.as_ptr(), 0o666) == 0
        };
        if !made {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("mknod /dev/{name}"));
        }
    }
    for (target, name) in LINKS {
        std::os::unix::fs::symlink(target, dir.join(name))?;
    }
    std::fs::create_dir(dir.join("shm"))?;
    mount(
        c"tmpfs",
        &target,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | flags,
        Some(c"mode=755,size=64k"),
    )
}

fn mount(
    src: &std::ffi::CStr,
    dst: &std::ffi::CStr,
    fstype: Option<&std::ffi::CStr>,
    flags: libc::c_ulong,
    data: Option<&std::ffi::CStr>,
) -> Result<()> {
    // SAFETY: valid C strings or NULL.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            fstype.map_or(std::ptr::null(), |c| c.as_ptr()),
            flags,
            data.map_or(std::ptr::null(), |c| c.as_ptr().cast()),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("mount {src:?} on {dst:?}"));
    }
    Ok(())
}

fn cstr(path: &Path) -> Result<CString> {
    Ok(CString::new(path.as_os_str().as_encoded_bytes())?)
}
