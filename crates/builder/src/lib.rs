//! Builds function environments (FRE §4.3): a runtime layer made once from what the
//! machine has and shared by every function of that runtime, plus the function's code,
//! composed into one tree of hard links in the store.
//!
//! Runtime layers are environments themselves (`runtime-python3`, `runtime-node`),
//! keyed by the interpreter's path, size and mtime: a warm build re-hashes only the
//! function's own files.

pub mod oci;
mod packages;
pub mod unpack;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use skiff_manifest::{Manifest, Runtime};
use skiff_store::{add_tree, closure::elf_closure, Entry, Store};

/// Directories every environment has: mount points for the sandbox.
const SKELETON: [&str; 5] = ["proc", "dev", "tmp", "work", "code"];

/// Directories a runtime layer's own tree has (not its entries, which functions take):
/// a template runs in that tree and mounts on them.
const TEMPLATE_MOUNT_POINTS: [&str; 3] = ["proc", "dev", "tmp"];

fn dir_entry(path: &str) -> Entry {
    Entry::Dir { path: path.into() }
}

/// Where the function's code goes inside its environment.
pub const CODE_DIR: &str = "code";

/// Parts of the Python standard library a function does not need: tests, IDLE, Tk, the
/// static library for embedding. The rest stays, down to ensurepip, lib2to3, pydoc_data
/// and venv: a function imports what the machine's python imports.
const PYTHON_SKIP: [&str; 5] = [
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "config-3.11-x86_64-linux-gnu",
];

/// Progress reports for a caller's progress bar.
pub enum Progress<'a> {
    /// A step starts.
    Step(&'a str),
    /// A file was added to the store.
    File(u64),
}

pub struct Built {
    pub id: String,
    pub name: String,
    pub root: PathBuf,
    /// The runtime layer was already built.
    pub runtime_reused: bool,
}

pub fn build(store: &Store, dir: &Path, progress: &mut dyn FnMut(Progress)) -> Result<Built> {
    let manifest = Manifest::load(dir)?;
    manifest.check_code(dir)?;
    let mut entries: Vec<Entry> = SKELETON.map(dir_entry).to_vec();

    let mut runtime_reused = true;
    if let Some((layer, reused)) = runtime_layer(store, manifest.runtime, progress)? {
        entries.extend(layer);
        runtime_reused = reused;
    }
    let code = dir.join(&manifest.code);
    let packages = packages::layer(
        store,
        manifest.runtime,
        &manifest.packages,
        [dir, &code],
        &entries,
        progress,
    )?;
    entries.extend(packages);

    progress(Progress::Step("function code"));
    let mut code_entries = Vec::new();
    let skip = |rel: &Path| {
        rel.components().any(|c| {
            matches!(
                c.as_os_str().to_str(),
                Some(".git" | "__pycache__" | "node_modules")
            )
        })
    };
    add_tree(store, &code, CODE_DIR, &skip, &mut code_entries)?;
    if manifest.runtime == Runtime::Python3 {
        let bytecode = code_bytecode(store, &code, &code_entries)?;
        code_entries.extend(bytecode);
    }
    if manifest.runtime == Runtime::Wasm {
        progress(Progress::Step("compiling the module"));
        code_entries.push(compiled_module(store, &code, &manifest)?);
    }
    progress(Progress::File(code_entries.len() as u64));
    if manifest.runtime == Runtime::Binary {
        // A native handler brings its own shared-library closure.
        let handler = code.join(manifest.handler.trim_start_matches("./"));
        let closure = elf_closure(&[handler]).map_err(|e| {
            // The handler as the sandbox sees it, not the (daemon's scratch) host copy.
            let host = format!("{}/", code.display());
            anyhow::anyhow!("{}", format!("{e:#}").replace(&host, "/code/"))
        })?;
        entries.extend(host_files(store, &closure)?);
    }
    entries.extend(code_entries);

    let id = env_id(&entries);
    let root = store.build_env(&id, &manifest.name.0, &entries)?;
    Ok(Built {
        id,
        name: manifest.name.0,
        root,
        runtime_reused,
    })
}

/// The handler module, checked and compiled ahead of time: every worker maps this one
/// file (shared in the page cache) instead of compiling the module itself.
fn compiled_module(store: &Store, code: &Path, manifest: &Manifest) -> Result<Entry> {
    let path = code.join(&manifest.handler);
    let wasm = std::fs::read(&path).with_context(|| format!("cannot read {}", manifest.handler))?;
    let hook = match manifest.session.as_ref().map(|s| &s.key) {
        Some(skiff_manifest::SessionKey::Wasm(export)) => Some(export.as_str()),
        _ => None,
    };
    let exports: Vec<&str> = std::iter::once("handle").chain(hook).collect();
    let compiled = skiff_wasm::compile(&wasm, &exports)
        .with_context(|| format!("handler {}", manifest.handler))?;
    store.put_reader(
        &mut compiled.as_slice(),
        &format!("{CODE_DIR}/{}", compiled_name(&manifest.handler)),
        false,
        None,
    )
}

/// Where a wasm handler's compiled module is, beside it in the code directory.
pub fn compiled_name(handler: &str) -> String {
    format!("{handler}.cwasm")
}

/// Bytecode for the function's Python files, as `__pycache__` entries beside them
/// (unchecked-hash, as the runtime layer's): an instance then loads it instead of
/// compiling its modules on every cold start, which in a forked template also copies
/// the pages the compiler touches. Files that do not compile get none; the instance
/// reports their error when it imports them.
fn code_bytecode(store: &Store, code: &Path, code_entries: &[Entry]) -> Result<Vec<Entry>> {
    let sources: Vec<String> = code_entries
        .iter()
        .filter_map(|e| match e {
            Entry::File { path, .. } if path.ends_with(".py") => {
                Some(path.strip_prefix(&format!("{CODE_DIR}/"))?.to_owned())
            }
            _ => None,
        })
        .collect();
    if sources.is_empty() {
        return Ok(Vec::new());
    }
    let python = find_program(&["/usr/bin/python3.11", "/usr/bin/python3"])?;
    let scratch = packages::Scratch::new()?;
    const COMPILE: &str = "import importlib.util, json, os, py_compile, sys\n\
        code, out = sys.argv[1], sys.argv[2]\n\
        for rel in json.loads(sys.stdin.read()):\n\
        \x20   py_compile.compile(os.path.join(code, rel), \
        cfile=importlib.util.cache_from_source(os.path.join(out, rel)), \
        dfile='/code/' + rel, doraise=False, quiet=2, \
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n";
    let mut child = std::process::Command::new(&python)
        .args(["-I", "-c", COMPILE])
        .arg(code)
        .arg(&scratch.0)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("cannot run python to compile the function's code")?;
    std::io::Write::write_all(
        child.stdin.as_mut().expect("piped"),
        &serde_json::to_vec(&sources)?,
    )?;
    drop(child.stdin.take());
    child.wait()?;
    let mut compiled = Vec::new();
    add_tree(store, &scratch.0, CODE_DIR, &|_| false, &mut compiled)?;
    // Only the new __pycache__ directories and their files: the others exist already.
    Ok(compiled
        .into_iter()
        .filter(|e| !matches!(e, Entry::Dir { path } if !path.ends_with("__pycache__")))
        .collect())
}

/// The wasm runtime layer: skiff's own (static) executable as `/usr/bin/skiff`, which
/// runs as `skiff worker` in the sandbox, so worker and daemon are the same build.
fn worker_layer(store: &Store, progress: &mut dyn FnMut(Progress)) -> Result<(Vec<Entry>, bool)> {
    // The running executable itself, even when its file was replaced since it started
    // (an upgrade, a rebuild): the worker must be the daemon's own build.
    let exe = Path::new("/proc/self/exe");
    let meta = std::fs::metadata(exe).context("finding skiff's own executable")?;
    let key = format!(
        "wasm {} {} {}",
        std::os::unix::fs::MetadataExt::ino(&meta),
        meta.len(),
        std::os::unix::fs::MetadataExt::mtime(&meta)
    );
    let id = format!("runtime-{}", &hex_digest(key.as_bytes())[..16]);
    if store.env_exists(&id) {
        return Ok((store.record(&id)?.entries, true));
    }
    progress(Progress::Step("runtime wasm (once)"));
    let entries = vec![store.put_file(exe, "usr/bin/skiff")?];
    store.build_env(&id, &id, &entries)?;
    Ok((entries, false))
}

/// The runtime layer's entries, building it on first use. `None` for runtimes that
/// bring nothing (binary, wasm).
fn runtime_layer(
    store: &Store,
    runtime: Runtime,
    progress: &mut dyn FnMut(Progress),
) -> Result<Option<(Vec<Entry>, bool)>> {
    let interpreter = match runtime {
        Runtime::Python3 => find_program(&["/usr/bin/python3.11", "/usr/bin/python3"])?,
        Runtime::Node => find_program(&["/usr/bin/node", "/usr/local/bin/node"])?,
        Runtime::Wasm => return worker_layer(store, progress).map(Some),
        Runtime::Binary => return Ok(None),
    };
    let meta = std::fs::metadata(&interpreter)?;
    // "rooted": the layer's own tree has the mount points a template needs to run in it;
    // "stdlib": python's has ensurepip, lib2to3, pydoc_data and venv (a store's older
    // layer lacks them).
    let key = format!(
        "{runtime:?} rooted stdlib {} {} {}",
        interpreter.display(),
        meta.len(),
        std::os::unix::fs::MetadataExt::mtime(&meta)
    );
    let id = format!("runtime-{}", &hex_digest(key.as_bytes())[..16]);
    if store.env_exists(&id) {
        let mut entries = store.record(&id)?.entries;
        entries.retain(|e| !TEMPLATE_MOUNT_POINTS.map(dir_entry).contains(e));
        return Ok(Some((entries, true)));
    }
    progress(Progress::Step(match runtime {
        Runtime::Python3 => "runtime python3 (once)",
        _ => "runtime node (once)",
    }));
    let mut entries = Vec::new();
    let name = interpreter
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    entries.push(store.put_file(&interpreter, &format!("usr/bin/{name}"))?);
    let mut natives = vec![interpreter.clone()];
    match runtime {
        Runtime::Python3 => {
            entries.push(Entry::Symlink {
                path: "usr/bin/python3".into(),
                target: name.clone(),
            });
            let stdlib = Path::new("/usr/lib/python3.11");
            let skip = |rel: &Path| {
                let first = rel.components().next().and_then(|c| c.as_os_str().to_str());
                let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
                first.is_some_and(|f| PYTHON_SKIP.contains(&f))
                    // Keep the plain bytecode; the optimised variants are for -O runs.
                    || name.contains(".opt-1.pyc")
                    || name.contains(".opt-2.pyc")
            };
            let before = entries.len();
            add_tree(store, stdlib, "usr/lib/python3.11", &skip, &mut entries)?;
            progress(Progress::File((entries.len() - before) as u64));
            for entry in &entries[before..] {
                if let Entry::File { path, .. } = entry {
                    if path.ends_with(".so") {
                        natives.push(Path::new("/").join(path));
                    }
                }
            }
        }
        _ => {
            if name != "node" {
                entries.push(Entry::Symlink {
                    path: "usr/bin/node".into(),
                    target: name.clone(),
                });
            }
        }
    }
    entries.extend(host_files(store, &elf_closure(&natives)?)?);
    let count = entries.len() as u64;
    // A template runs in this tree (its own root, as a sandbox's): it mounts these.
    let mount_points = TEMPLATE_MOUNT_POINTS.map(dir_entry);
    store.build_env(&id, &id, &[&mount_points[..], &entries].concat())?;
    progress(Progress::File(count));
    Ok(Some((entries, false)))
}

/// Store entries for host files, at the same paths inside the environment.
fn host_files(store: &Store, files: &std::collections::BTreeSet<PathBuf>) -> Result<Vec<Entry>> {
    files
        .iter()
        .map(|f| {
            let rel = f
                .strip_prefix("/")
                .unwrap_or(f)
                .to_string_lossy()
                .into_owned();
            store.put_file(f, &rel)
        })
        .collect()
}

pub(crate) fn find_program(candidates: &[&str]) -> Result<PathBuf> {
    candidates
        .iter()
        .map(|c| std::fs::canonicalize(c).unwrap_or_else(|_| PathBuf::from(c)))
        .find(|p| p.is_file())
        .with_context(|| format!("none of {candidates:?} is installed"))
}

/// An environment's id: a hash of its entries, so the same inputs give the same id.
pub(crate) fn env_id(entries: &[Entry]) -> String {
    let bytes = serde_json::to_vec(entries).expect("entries serialize");
    hex_digest(&bytes)[..16].to_owned()
}

pub(crate) fn hex_digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
