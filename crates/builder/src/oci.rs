//! Importing an OCI image (an OCI layout directory, an OCI archive or a `docker save`
//! tarball) into the store: layers applied in order, whiteouts honoured, every file a
//! store object shared with whatever else has the same bytes. An image is someone
//! else's input: its archive is unpacked as a deploy's is ([`crate::unpack`]), a blob
//! or layer path never leads out of the image (no `..`, no symlink), and no layer entry
//! climbs with `..` or lands below a symlink of the tree.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use oci_spec::image::{ImageIndex, ImageManifest, MediaType};
use skiff_store::{Entry, Store};

/// A layer file, its name in the image, and whether it is gzip-compressed.
struct Layer {
    path: PathBuf,
    name: String,
    gzip: bool,
}

/// An image archive's limits: images are larger than functions.
const IMAGE_LIMITS: crate::unpack::Limits = crate::unpack::Limits {
    bytes: 64 << 30,
    entries: 100_000,
    path: 4096,
};

/// Imports `image` as the environment `name`; returns (id, root).
pub fn import(store: &Store, image: &Path, name: &str) -> Result<(String, PathBuf)> {
    let scratch;
    let dir = if image.is_dir() {
        image.to_path_buf()
    } else {
        // An archive (OCI or docker save): unpack its blobs to a scratch directory.
        scratch = crate::packages::Scratch::new()?;
        crate::unpack::unpack(image, &scratch.0, &IMAGE_LIMITS)
            .with_context(|| format!("{} is not a usable tar archive", image.display()))?;
        scratch.0.clone()
    };
    let layers = if dir.join("index.json").exists() {
        oci_layers(&dir)?
    } else if dir.join("manifest.json").exists() {
        docker_layers(&dir)?
    } else {
        bail!(
            "{} is neither an OCI layout (index.json) nor a docker save archive (manifest.json)",
            image.display()
        );
    };
    let mut tree: BTreeMap<String, Entry> = BTreeMap::new();
    for layer in &layers {
        apply(store, layer, &mut tree).with_context(|| format!("layer {}", layer.name))?;
    }
    for dir in ["proc", "dev", "tmp"] {
        tree.entry(dir.to_owned()).or_insert(Entry::Dir {
            path: dir.to_owned(),
        });
    }
    let entries: Vec<Entry> = tree.into_values().collect();
    let id = crate::env_id(&entries);
    let root = store.build_env(&id, name, &entries)?;
    Ok((id, root))
}

fn blob(dir: &Path, digest: &str) -> Result<PathBuf> {
    let (algorithm, hex) = digest.split_once(':').context("malformed digest")?;
    let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
    if !plain(algorithm) || !plain(hex) {
        bail!("malformed digest {digest:?}");
    }
    inside_image(dir, &format!("blobs/{algorithm}/{hex}"))
}

/// The file at `rel` in the image directory: refused when the path climbs out, is
/// absolute, or resolves (through a symlink) to anything outside the image.
fn inside_image(dir: &Path, rel: &str) -> Result<PathBuf> {
    let out = || anyhow::anyhow!("{rel} leads out of the image");
    let plain = Path::new(rel).components().all(|c| {
        matches!(
            c,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )
    });
    if !plain {
        return Err(out());
    }
    let path = dir.join(rel);
    let resolved = path
        .canonicalize()
        .with_context(|| format!("the image has no {rel}"))?;
    if !resolved.starts_with(dir.canonicalize()?) {
        return Err(out());
    }
    if !resolved.is_file() {
        bail!("{rel} is not a file in the image");
    }
    Ok(resolved)
}

fn oci_layers(dir: &Path) -> Result<Vec<Layer>> {
    let index = ImageIndex::from_file(dir.join("index.json")).context("index.json")?;
    let mut descriptor = index
        .manifests()
        .first()
        .context("the image index lists no manifest")?
        .clone();
    // A nested index (multi-platform): take its first manifest.
    while descriptor.media_type() == &MediaType::ImageIndex {
        let nested = ImageIndex::from_file(blob(dir, descriptor.digest().as_ref())?)?;
        descriptor = nested
            .manifests()
            .first()
            .context("empty nested index")?
            .clone();
    }
    let manifest = ImageManifest::from_file(blob(dir, descriptor.digest().as_ref())?)
        .context("image manifest")?;
    manifest
        .layers()
        .iter()
        .map(|l| {
            let gzip = match l.media_type() {
                MediaType::ImageLayerGzip => true,
                MediaType::ImageLayer => false,
                MediaType::Other(t) if t.ends_with("tar.gzip") || t.ends_with("tar+gzip") => true,
                other => bail!("layer media type {other} is not supported (tar and tar+gzip are)"),
            };
            Ok(Layer {
                path: blob(dir, l.digest().as_ref())?,
                name: l.digest().to_string(),
                gzip,
            })
        })
        .collect()
}

fn docker_layers(dir: &Path) -> Result<Vec<Layer>> {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json"))?)?;
    let layers = manifest[0]["Layers"]
        .as_array()
        .context("manifest.json lists no layers")?;
    layers
        .iter()
        .map(|l| {
            let name = l.as_str().context("a layer path is not a string")?;
            let path = inside_image(dir, name)?;
            let mut magic = [0u8; 2];
            File::open(&path)?.read_exact(&mut magic)?;
            Ok(Layer {
                gzip: magic == [0x1f, 0x8b],
                name: name.to_owned(),
                path,
            })
        })
        .collect()
}

/// Applies one layer to `tree` (path -> entry), as an overlay filesystem would.
fn apply(store: &Store, layer: &Layer, tree: &mut BTreeMap<String, Entry>) -> Result<()> {
    let file = File::open(&layer.path)?;
    let reader: Box<dyn Read> = if layer.gzip {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut archive = tar::Archive::new(reader);
    for item in archive.entries()? {
        let mut item = item?;
        let raw = item.path()?.to_string_lossy().into_owned();
        let path = clean(&raw)?;
        if path.is_empty() {
            continue;
        }
        let (parent, base) = path
            .rsplit_once('/')
            .map_or(("", path.as_str()), |(p, b)| (p, b));
        if base == ".wh..wh..opq" {
            // Opaque directory: drop what lower layers put inside it.
            let prefix = format!("{parent}/");
            tree.retain(|p, _| !parent.is_empty() && !p.starts_with(&prefix));
            continue;
        }
        if let Some(hidden) = base.strip_prefix(".wh.") {
            if matches!(hidden, "" | "." | "..") {
                bail!("whiteout {raw} names no entry of the layer's tree");
            }
            let target = if parent.is_empty() {
                hidden.to_owned()
            } else {
                format!("{parent}/{hidden}")
            };
            let prefix = format!("{target}/");
            tree.retain(|p, _| p != &target && !p.starts_with(&prefix));
            continue;
        }
        // The store makes the tree on the host: an entry below a symlink would be
        // written wherever the symlink leads.
        let mut above = path.as_str();
        while let Some((up, _)) = above.rsplit_once('/') {
            if matches!(tree.get(up), Some(Entry::Symlink { .. })) {
                bail!("layer entry {raw} is below the symlink {up}");
            }
            above = up;
        }
        let header = item.header().clone();
        let entry = match header.entry_type() {
            tar::EntryType::Directory => Entry::Dir { path: path.clone() },
            tar::EntryType::Symlink => Entry::Symlink {
                path: path.clone(),
                target: item
                    .link_name()?
                    .context("symlink without target")?
                    .to_string_lossy()
                    .into_owned(),
            },
            tar::EntryType::Link => {
                let target = clean(
                    &item
                        .link_name()?
                        .context("hard link without target")?
                        .to_string_lossy(),
                )?;
                match tree.get(&target) {
                    Some(Entry::File {
                        digest,
                        executable,
                        size,
                        ..
                    }) => Entry::File {
                        path: path.clone(),
                        digest: digest.clone(),
                        executable: *executable,
                        size: *size,
                    },
                    _ => bail!("hard link {path} to {target}, which is not a file"),
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let executable = header.mode()? & 0o111 != 0;
                let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(header.mtime()?);
                store.put_reader(&mut item, &path, executable, Some(mtime))?
            }
            // Device nodes, fifos: a sandbox gets its /dev from skiff, never from an image.
            _ => continue,
        };
        // A file replacing a directory replaces everything below it too.
        if !matches!(entry, Entry::Dir { .. }) {
            let prefix = format!("{path}/");
            tree.retain(|p, _| !p.starts_with(&prefix));
        }
        tree.insert(path, entry);
    }
    Ok(())
}

/// `./usr/bin/` -> `usr/bin` (a leading `/` is the layer's root); refuses to climb
/// out with `..`.
fn clean(raw: &str) -> Result<String> {
    let parts: Vec<&str> = raw
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        bail!("layer entry {raw} climbs out of the image's root with ..");
    }
    Ok(parts.join("/"))
}
