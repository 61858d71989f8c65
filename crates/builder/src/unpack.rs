//! Unpacking an archive that someone else made (a function's deploy, an image): every
//! entry lands inside the destination or the whole archive is refused, with the entry
//! named in the error. No `..`, no absolute paths, no entry written through a symlink,
//! no symlink or hard link that leads out, no device nodes, fifos, setuid or setgid
//! files; caps on bytes, entries and path length (gzip bombs). Errors name entries as
//! the archive does, never a host path.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};

/// What an archive may unpack to.
#[derive(Clone, Copy)]
pub struct Limits {
    /// Bytes of the (decompressed) archive.
    pub bytes: u64,
    pub entries: usize,
    /// Bytes of an entry's path.
    pub path: usize,
}

/// A function's deploy.
pub const FUNCTION_LIMITS: Limits = Limits {
    bytes: 1 << 30,
    entries: 50_000,
    path: 1024,
};

/// A component of a path is at most this long (Linux's NAME_MAX).
const NAME_MAX: usize = 255;

/// Unpacks the tar (or gzipped tar) at `archive` into `dest`, an empty directory that
/// nothing else writes to while this runs.
pub fn unpack(archive: &Path, dest: &Path, limits: &Limits) -> Result<()> {
    let mut file = BufReader::new(File::open(archive).context("cannot open the archive")?);
    let gzip = file.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gzip {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let capped = Capped {
        inner: reader,
        left: limits.bytes,
    };
    std::fs::create_dir_all(dest).context("cannot create the unpacking directory")?;
    let mut links = Vec::new();
    let mut declared = 0u64;
    let mut archive = tar::Archive::new(capped);
    let entries = archive.entries().map_err(|e| refused(&e, limits))?;
    for (count, entry) in entries.enumerate() {
        let mut entry = entry.map_err(|e| refused(&e, limits))?;
        if count >= limits.entries {
            bail!("the archive has more than {} entries", limits.entries);
        }
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            continue;
        }
        // Refused on its header, before a byte of it is written.
        declared = declared.saturating_add(entry.size());
        if declared > limits.bytes {
            bail!(
                "the archive unpacks to more than {} MiB",
                limits.bytes >> 20
            );
        }
        let rel = relative(&raw, limits)?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        let path = dest.join(&rel);
        if path.symlink_metadata().is_ok_and(|m| m.is_dir()) && !kind.is_dir() {
            bail!("entry {raw}: a directory of the same name is already in the archive");
        }
        make_parents(dest, &rel, &raw)?;
        let mode = entry.header().mode().unwrap_or(0o644);
        match kind {
            tar::EntryType::Directory => {
                if !path.is_dir() {
                    std::fs::create_dir(&path)
                        .with_context(|| format!("entry {raw}: cannot create it"))?;
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if mode & 0o6000 != 0 {
                    bail!("entry {raw} is setuid or setgid, which a function may not have");
                }
                let _ = std::fs::remove_file(&path);
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode & 0o755 | 0o600)
                    .open(&path)
                    .with_context(|| format!("entry {raw}: cannot create it"))?;
                io::copy(&mut entry, &mut out).map_err(|e| refused(&e, limits))?;
                // The mode as asked, without the umask's say.
                std::fs::set_permissions(
                    &path,
                    std::fs::Permissions::from_mode(mode & 0o755 | 0o600),
                )?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| String::from_utf8_lossy(&t).into_owned())
                    .unwrap_or_default();
                if !stays_inside(&rel, &target) {
                    bail!("symlink {raw} points outside the function's directory");
                }
                let _ = std::fs::remove_file(&path);
                std::os::unix::fs::symlink(&target, &path)
                    .with_context(|| format!("entry {raw}: cannot create it"))?;
                links.push(raw);
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| String::from_utf8_lossy(&t).into_owned())
                    .unwrap_or_default();
                let outside = || anyhow::anyhow!("hard link {raw} points outside the archive");
                let target_rel = relative(&target, limits).map_err(|_| outside())?;
                let source = dest.join(&target_rel);
                // Only to a file this archive made, reached without a symlink.
                if target_rel.as_os_str().is_empty()
                    || below_symlink(dest, &target_rel)
                    || !source.symlink_metadata().is_ok_and(|m| m.is_file())
                {
                    return Err(outside());
                }
                let _ = std::fs::remove_file(&path);
                std::fs::hard_link(&source, &path)
                    .with_context(|| format!("entry {raw}: cannot create it"))?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                bail!("entry {raw} is a device node, which a function may not have")
            }
            tar::EntryType::Fifo => bail!("entry {raw} is a fifo, which a function may not have"),
            other => bail!("entry {raw} has a type this archive may not hold ({other:?})"),
        }
    }
    // Each symlink was checked where it was made; one that leads out only through
    // another (`a -> b/..` with `b -> .`) shows when the whole tree is there.
    let root = dest.canonicalize()?;
    for raw in links {
        let rel = relative(&raw, limits)?;
        if let Ok(resolved) = dest.join(rel).canonicalize() {
            if !resolved.starts_with(&root) {
                bail!("symlink {raw} points outside the function's directory");
            }
        }
    }
    Ok(())
}

/// The entry's path relative to the destination, refused when it is absolute, climbs
/// with `..` or is too long.
fn relative(raw: &str, limits: &Limits) -> Result<PathBuf> {
    if raw.len() > limits.path {
        bail!(
            "entry {}...: its path is longer than {} bytes",
            raw.chars().take(60).collect::<String>(),
            limits.path
        );
    }
    let mut rel = PathBuf::new();
    for component in Path::new(raw).components() {
        match component {
            Component::Normal(name) if name.len() <= NAME_MAX => rel.push(name),
            Component::Normal(_) => {
                bail!("entry {raw}: a name in its path is longer than {NAME_MAX} bytes")
            }
            Component::CurDir => {}
            Component::ParentDir => bail!("entry {raw} climbs out of the archive with .."),
            Component::RootDir | Component::Prefix(_) => {
                bail!("entry {raw} has an absolute path")
            }
        }
    }
    Ok(rel)
}

/// Whether `rel`'s parent, or a directory above it, is a symlink.
fn below_symlink(dest: &Path, rel: &Path) -> bool {
    let mut at = dest.to_path_buf();
    let parents: Vec<_> = rel.components().collect();
    parents[..parents.len().saturating_sub(1)].iter().any(|c| {
        at.push(c);
        at.symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
    })
}

/// Creates the directories above `rel` that the archive did not list, refusing to go
/// through a symlink (an entry written through one could land anywhere).
fn make_parents(dest: &Path, rel: &Path, raw: &str) -> Result<()> {
    let mut at = dest.to_path_buf();
    let parts: Vec<_> = rel.components().collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        at.push(part);
        match at.symlink_metadata() {
            Ok(m) if m.file_type().is_symlink() => {
                bail!("entry {raw} is below a symlink")
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!("entry {raw} is below a file"),
            Err(_) => std::fs::create_dir(&at)
                .with_context(|| format!("entry {raw}: cannot create its directory"))?,
        }
    }
    Ok(())
}

/// Whether a symlink at `rel` to `target` stays below the archive's root, read as
/// paths (the links it may go through are checked once all are made).
fn stays_inside(rel: &Path, target: &str) -> bool {
    if target.is_empty() || target.starts_with('/') {
        return false;
    }
    let mut depth = rel.components().count() as i64 - 1;
    for component in Path::new(target).components() {
        match component {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return false,
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

/// The decompressed archive, cut off past its cap.
struct Capped<R> {
    inner: R,
    left: u64,
}

/// The marker of a cut-off archive, found again in [`refused`].
const CAPPED: &str = "the archive is larger than its cap";

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            // One byte more than allowed tells a full archive from a cut one.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(io::Error::other(CAPPED)),
            };
        }
        let max = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..max])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// A read error as the user is told it: the cap by name, else what the reader said.
fn refused(e: &io::Error, limits: &Limits) -> anyhow::Error {
    if e.to_string() == CAPPED {
        anyhow::anyhow!(
            "the archive unpacks to more than {} MiB",
            limits.bytes >> 20
        )
    } else {
        anyhow::anyhow!("the archive cannot be read: {e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_are_read_as_paths_from_where_they_are() {
        let inside = [
            ("a", "b"),
            ("d/a", "../b"),
            ("d/e/a", "../../b/./c"),
            ("a", "."),
        ];
        for (at, target) in inside {
            assert!(stays_inside(Path::new(at), target), "{at} -> {target}");
        }
        let outside = [
            ("a", ".."),
            ("d/a", "../.."),
            ("a", "/etc"),
            ("a", ""),
            ("a", "b/../../c"),
        ];
        for (at, target) in outside {
            assert!(!stays_inside(Path::new(at), target), "{at} -> {target}");
        }
    }

    #[test]
    fn entry_paths_never_leave_the_destination() {
        assert_eq!(
            relative("./a/./b/", &FUNCTION_LIMITS).unwrap(),
            Path::new("a/b")
        );
        assert_eq!(relative("./", &FUNCTION_LIMITS).unwrap(), Path::new(""));
        for bad in [
            "../a",
            "a/../../b",
            "/etc/passwd",
            &"a/".repeat(600),
            &"n".repeat(256),
        ] {
            assert!(relative(bad, &FUNCTION_LIMITS).is_err(), "{bad}");
        }
    }
}
