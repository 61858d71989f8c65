//! Package layers: PyPI packages (pip) for python3, npm packages for node. A layer is
//! keyed by the resolved list (every name and version pip or npm chose), so two functions
//! that resolve to the same packages share one layer, and its files are store objects
//! shared with every other layer that has the same bytes. Downloads go through pip's and
//! npm's own caches.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use skiff_manifest::Runtime;
use skiff_store::{add_tree, Entry, Store};

use crate::{find_program, hex_digest};

/// Where Debian's Python looks for third-party packages.
const PYTHON_SITE: &str = "usr/lib/python3/dist-packages";
/// Where `require` finds packages for code in /code.
const NODE_MODULES: &str = "code/node_modules";

pub fn layer(store: &Store, runtime: Runtime, packages: &[String]) -> Result<Vec<Entry>> {
    let work = Scratch::new()?;
    let (resolved, site, prefix) = match runtime {
        Runtime::Python3 => python(&work.0, packages)?,
        Runtime::Node => node(&work.0, packages)?,
        _ => bail!("packages: only python3 and node functions take packages"),
    };
    let id = format!(
        "packages-{}",
        &hex_digest(resolved.join("\n").as_bytes())[..16]
    );
    if store.env_exists(&id) {
        return Ok(store.record(&id)?.entries);
    }
    let mut entries = Vec::new();
    add_tree(store, &site, prefix, &|_| false, &mut entries)?;
    store.build_env(&id, &id, &entries)?;
    Ok(entries)
}

/// pip resolves, installs into a target directory, and byte-compiles with hashes (a
/// timestamp-checked .pyc would go stale: store objects keep the first copy's mtime).
fn python(work: &Path, packages: &[String]) -> Result<(Vec<String>, PathBuf, &'static str)> {
    let python = find_program(&["/usr/bin/python3.11", "/usr/bin/python3"])?;
    let site = work.join("site");
    let report = work.join("report.json");
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
            "--target",
        ])
        .arg(&site)
        .arg("--report")
        .arg(&report)
        .args(packages))
    .context("pip install")?;
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&report)?)?;
    let mut resolved: Vec<String> = report["install"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|i| {
                    format!(
                        "{}=={}",
                        i["metadata"]["name"].as_str().unwrap_or("?"),
                        i["metadata"]["version"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    resolved.sort();
    resolved.insert(0, "python3".into());
    // Scripts pip writes point at the build machine's interpreter: not part of a layer.
    let _ = std::fs::remove_dir_all(site.join("bin"));
    run(Command::new(&python)
        .args([
            "-m",
            "compileall",
            "-q",
            "--invalidation-mode",
            "unchecked-hash",
        ])
        .arg(&site))
    .context("compileall")?;
    Ok((resolved, site, PYTHON_SITE))
}

fn node(work: &Path, packages: &[String]) -> Result<(Vec<String>, PathBuf, &'static str)> {
    std::fs::write(work.join("package.json"), "{\"private\": true}\n")?;
    run(Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
        .arg(work)
        .args(packages))
    .context("npm install")?;
    let lock: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.join("package-lock.json"))?)?;
    let mut resolved: Vec<String> = lock["packages"]
        .as_object()
        .map(|p| {
            p.iter()
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, v)| format!("{k}@{}", v["version"].as_str().unwrap_or("?")))
                .collect()
        })
        .unwrap_or_default();
    resolved.sort();
    resolved.insert(0, "node".into());
    Ok((resolved, work.join("node_modules"), NODE_MODULES))
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        bail!("{last}");
    }
    Ok(())
}

/// A scratch directory removed when dropped.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new() -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!(
            "skiff-packages-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
