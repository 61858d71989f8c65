//! Package layers: PyPI packages (pip) for python3, npm packages for node, from the
//! manifest's `packages`, a python function's `requirements.txt`, and a node function's
//! `package.json` (with its `package-lock.json` or `npm-shrinkwrap.json`: `npm ci`).
//!
//! A layer is keyed by the resolved list (every name and version pip or npm chose, and
//! the runtime layer it was built for), so two functions that resolve to the same
//! packages share one layer, and its files are store objects shared with every other
//! layer that has the same bytes. It is also named by its inputs (the runtime layer, the
//! manifest's list, the requirements file, package.json and its lock): a build with the
//! same inputs reuses it without running pip or npm, as an image build reuses a cached
//! layer (pin versions, or change the list, to pick up new releases). Inputs that name
//! local paths (`-e .`, `file:` dependencies) are never reused that way. Downloads go
//! through pip's and npm's own caches.
//!
//! Native code: the layer also holds the host libraries its shared objects need (the
//! libstdc++ and libgcc_s of manylinux wheels and node addons), found at build time from
//! their ELF headers; a library found nowhere fails the build, not the import.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};
use skiff_manifest::Runtime;
use skiff_store::{add_tree, closure::tree_closure, Entry, Store};

use crate::{env_id, find_program, hex_digest, host_files, Progress};

/// Where Debian's Python looks for third-party packages.
const PYTHON_SITE: &str = "usr/lib/python3/dist-packages";
/// Where `require` finds packages for code in /code.
const NODE_MODULES: &str = "code/node_modules";
/// A python function's requirements, beside its skiff.yaml (or in its code directory).
const REQUIREMENTS: &str = "requirements.txt";
/// node's package manifest and the locks `npm ci` installs exactly.
const PACKAGE_JSON: &str = "package.json";
const LOCKS: [&str; 2] = ["npm-shrinkwrap.json", "package-lock.json"];
/// Where node-gyp finds node's headers (Debian's nodejs ships them): without them it
/// downloads them, which a machine without the internet cannot.
const NODE_HEADERS: &str = "/usr/include/node/node.h";
/// How much of a failed pip or npm run's output an error shows.
const ERROR_LINES: usize = 20;
const ERROR_BYTES: usize = 2500;

/// What a function asks to install.
struct Inputs<'a> {
    packages: &'a [String],
    /// requirements.txt (python3).
    requirements: Option<PathBuf>,
    /// package.json and its lock, if any (node).
    package_json: Option<(PathBuf, Option<PathBuf>)>,
}

impl Inputs<'_> {
    fn is_empty(&self) -> bool {
        self.packages.is_empty() && self.requirements.is_none() && self.package_json.is_none()
    }

    /// A hash of everything that decides what gets installed, or `None` when that
    /// includes files outside the inputs (local paths).
    fn key(&self, runtime: Runtime, have: &[Entry]) -> Result<Option<String>> {
        let mut key = format!("packages v1 {runtime:?} {}\n", env_id(have));
        for p in self.packages {
            if is_local(p) {
                return Ok(None);
            }
            key.push_str(p);
            key.push('\n');
        }
        if let Some(req) = &self.requirements {
            if !requirements_key(req, &mut key, 0)? {
                return Ok(None);
            }
        }
        if let Some((json, lock)) = &self.package_json {
            let text = std::fs::read_to_string(json)
                .with_context(|| format!("cannot read {PACKAGE_JSON}"))?;
            if text.contains("\"file:") || text.contains("\"link:") {
                return Ok(None);
            }
            key.push_str(&format!("\n{PACKAGE_JSON}\n{text}"));
            if let Some(lock) = lock {
                let text = std::fs::read(lock).context("cannot read the package lock")?;
                key.push_str(&format!("\nlock\n{}", hex_digest(&text)));
            }
        }
        Ok(Some(format!(
            "packages.{}",
            &hex_digest(key.as_bytes())[..16]
        )))
    }
}

/// Whether a requirement names something on this machine rather than in a registry.
fn is_local(req: &str) -> bool {
    let r = req.trim();
    r.starts_with('.')
        || r.starts_with('/')
        || r.starts_with("-e")
        || r.starts_with("--editable")
        || r.contains("file:")
}

/// The files and flags of `-r FILE`-style requirement options.
const INCLUDES: [&str; 4] = ["-r", "--requirement", "-c", "--constraint"];

/// Refuses what in the function's package inputs reaches outside its directory `root`
/// (pip and npm would read it, and their errors would echo it): an option in the
/// manifest's `packages`, an absolute path or a `file:` URL, a path with `..` that climbs
/// out, a requirements file that includes one of these or a file outside, or a symlink.
fn check_inputs(root: &Path, packages: &[String], inputs: &Inputs) -> Result<()> {
    for p in packages {
        if p.trim_start().starts_with('-') {
            bail!("packages: {p:?} is an option; list packages (put options in requirements.txt)");
        }
        check_reference(root, root, p, "packages")?;
    }
    if let Some(req) = &inputs.requirements {
        check_requirements(root, req, 0)?;
    }
    if let Some((json, _)) = &inputs.package_json {
        let text = std::fs::read_to_string(json).context("cannot read package.json")?;
        let manifest: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("package.json is not JSON: {e}"))?;
        let base = json.parent().unwrap_or(root);
        for deps in [
            "dependencies",
            "optionalDependencies",
            "peerDependencies",
            "devDependencies",
        ] {
            for spec in manifest[deps]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values())
            {
                let spec = spec.as_str().unwrap_or("");
                if let Some(path) = ["file:", "link:"].iter().find_map(|p| spec.strip_prefix(p)) {
                    check_reference(root, base, path, "package.json")?;
                } else if spec.contains("file:") {
                    check_reference(root, base, spec, "package.json")?;
                }
            }
        }
    }
    Ok(())
}

/// One requirement (or an included file's name) read relative to `base`, inside `root`.
fn check_reference(root: &Path, base: &Path, text: &str, origin: &str) -> Result<()> {
    let t = text.trim();
    let outside =
        || anyhow::anyhow!("{origin}: {t:?} names a path outside the function's directory");
    // Anything path-like (a local project, editable or not, an included file) must stay
    // below `root`.
    let path = t
        .trim_start_matches("--editable")
        .trim_start_matches("-e")
        .trim();
    if path.starts_with('/') || path.starts_with('~') || t.contains("file:") {
        return Err(outside());
    }
    let mut depth = base
        .strip_prefix(root)
        .map_or(0, |rel| rel.components().count());
    for c in Path::new(path).components() {
        match c {
            std::path::Component::ParentDir if depth == 0 => return Err(outside()),
            std::path::Component::ParentDir => depth -= 1,
            std::path::Component::Normal(_) => depth += 1,
            _ => {}
        }
    }
    Ok(())
}

/// A requirements file and the files it includes: references inside `root`, included
/// files regular (not links), at most 8 deep.
fn check_requirements(root: &Path, path: &Path, depth: usize) -> Result<()> {
    let name = path.strip_prefix(root).unwrap_or(Path::new(REQUIREMENTS));
    let origin = name.display().to_string();
    if depth > 8 || !is_regular_file(path) {
        bail!("{origin} is not a regular file in the function's directory");
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {origin}"))?;
    let base = path.parent().unwrap_or(root);
    for line in text.lines() {
        let line = line.split(" #").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let included = INCLUDES
            .iter()
            .find_map(|flag| line.strip_prefix(flag))
            .map(|rest| rest.trim_start_matches('=').trim());
        match included {
            Some(file) => {
                check_reference(root, base, file, &origin)?;
                check_requirements(root, &base.join(file), depth + 1)?;
            }
            None => check_reference(root, base, line, &origin)?,
        }
    }
    Ok(())
}

/// A regular file itself, not a symlink to one.
fn is_regular_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

/// Adds a requirements file's content to `key`, with the files it includes (`-r`, `-c`);
/// false when it names local paths.
fn requirements_key(path: &Path, key: &mut String, depth: usize) -> Result<bool> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {}", file_name(path)))?;
    key.push_str(&format!("\n{REQUIREMENTS}\n{text}"));
    for line in text.lines() {
        let line = line.split(" #").next().unwrap_or("").trim();
        if is_local(line) {
            return Ok(false);
        }
        let included = INCLUDES
            .iter()
            .find_map(|flag| line.strip_prefix(flag))
            .map(|rest| rest.trim_start_matches('=').trim());
        if let Some(included) = included {
            let file = path.parent().unwrap_or(Path::new(".")).join(included);
            if depth > 8 || !file.is_file() || !requirements_key(&file, key, depth + 1)? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The package layer of the function in `dirs[0]` (with its code in `dirs[1]`), for an
/// environment that has `have` already (the runtime layer); empty when it asks for no
/// packages.
pub fn layer(
    store: &Store,
    runtime: Runtime,
    packages: &[String],
    dirs: [&Path; 2],
    have: &[Entry],
    progress: &mut dyn FnMut(Progress),
) -> Result<Vec<Entry>> {
    // Links are not followed: a package.json linked to a host file is not read.
    let find = |name: &str| {
        dirs.iter()
            .map(|d| d.join(name))
            .find(|p| is_regular_file(p))
    };
    let inputs = Inputs {
        packages,
        requirements: (runtime == Runtime::Python3)
            .then(|| find(REQUIREMENTS))
            .flatten(),
        package_json: (runtime == Runtime::Node)
            .then(|| find(PACKAGE_JSON))
            .flatten()
            .map(|json| {
                let dir = json.parent().expect("a file has a parent").to_path_buf();
                let lock = LOCKS
                    .iter()
                    .map(|l| dir.join(l))
                    .find(|p| is_regular_file(p));
                (json, lock)
            }),
    };
    if inputs.is_empty() {
        return Ok(Vec::new());
    }
    check_inputs(dirs[0], packages, &inputs)?;
    progress(Progress::Step("packages"));
    let alias = inputs.key(runtime, have)?;
    if let Some(record) = alias.as_deref().and_then(|a| store.resolve(a).ok()) {
        return Ok(record.entries);
    }
    let work = Scratch::new()?;
    let (mut resolved, site, prefix) = match runtime {
        Runtime::Python3 => python(&work.0, &inputs)?,
        Runtime::Node => node(&work.0, &inputs)?,
        _ => bail!("packages: only python3 and node functions take packages"),
    };
    resolved.insert(0, format!("{runtime:?} {}", env_id(have)));
    // Inputs that name local paths (a wheel in the function's directory) may install
    // anything under a registry package's name and version: such a layer is named by its
    // content, never by the resolved list, so no other function is handed it.
    let by_list = alias.as_ref().map(|_| {
        format!(
            "packages-{}",
            &hex_digest(resolved.join("\n").as_bytes())[..16]
        )
    });
    let entries = match by_list.as_deref().filter(|id| store.env_exists(id)) {
        Some(id) => store.record(id)?.entries,
        None => {
            let mut entries = Vec::new();
            if site.is_dir() {
                // Shared objects find their libraries in the tree, in the runtime layer,
                // or on the host: those are added at the same paths.
                let paths: std::collections::HashSet<&str> = have.iter().map(Entry::path).collect();
                let has = |p: &Path| {
                    p.strip_prefix("/")
                        .ok()
                        .and_then(Path::to_str)
                        .is_some_and(|p| paths.contains(p))
                };
                let libraries = tree_closure(&site, prefix, &has)?;
                if runtime == Runtime::Python3 {
                    compile(&site)?;
                }
                add_tree(store, &site, prefix, &build_leftover, &mut entries)?;
                entries.extend(host_files(store, &libraries)?);
            }
            progress(Progress::File(entries.len() as u64));
            entries
        }
    };
    let id = by_list.unwrap_or_else(|| format!("packages-{}", env_id(&entries)));
    if !store.env_exists(&id) {
        store.build_env(&id, &id, &entries)?;
    }
    if let Some(alias) = &alias {
        // Names the layer by its inputs as well (not a valid function name: no clash).
        store.build_env(&id, alias, &entries)?;
    }
    Ok(entries)
}

/// node-gyp's intermediate files beside a compiled addon (`build/Release/obj.target`,
/// ...): only the addon itself is loaded.
fn build_leftover(rel: &Path) -> bool {
    let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
    parts.windows(3).any(|w| {
        w[0] == "build"
            && matches!(w[1], "Release" | "Debug")
            && matches!(w[2], "obj.target" | "obj" | ".deps")
    })
}

/// pip resolves and installs into a target directory.
fn python(work: &Path, inputs: &Inputs) -> Result<(Vec<String>, PathBuf, &'static str)> {
    let python = find_program(&["/usr/bin/python3.11", "/usr/bin/python3"])?;
    let site = work.join("site");
    let report = work.join("report.json");
    let mut cmd = Command::new(&python);
    cmd.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        "--no-compile",
        "--no-warn-script-location",
        "--target",
    ])
    .arg(&site)
    .arg("--report")
    .arg(&report);
    let mut shown = vec![(work.to_path_buf(), String::new())];
    if let Some(req) = &inputs.requirements {
        let dir = req.parent().expect("a file has a parent");
        // As `pip install -r requirements.txt` in the function's directory: its local
        // paths are relative to it.
        cmd.current_dir(dir).arg("-r").arg(req);
        shown.push((dir.to_path_buf(), String::new()));
    } else {
        cmd.current_dir(work);
    }
    cmd.args(inputs.packages);
    run(&mut cmd, &shown).context("pip install")?;
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
    // Scripts pip writes point at the build machine's interpreter: not part of a layer.
    let _ = std::fs::remove_dir_all(site.join("bin"));
    Ok((resolved, site, PYTHON_SITE))
}

/// Byte-compiles with hashes (a timestamp-checked .pyc would go stale: store objects
/// keep the first copy's mtime).
fn compile(site: &Path) -> Result<()> {
    let python = find_program(&["/usr/bin/python3.11", "/usr/bin/python3"])?;
    run(
        Command::new(&python)
            .args([
                "-m",
                "compileall",
                "-q",
                "--invalidation-mode",
                "unchecked-hash",
            ])
            .arg(site),
        &[(site.to_path_buf(), PYTHON_SITE.to_owned())],
    )
    .context("compileall")
}

/// npm installs into the scratch directory: `npm ci` where package.json comes with a
/// lock, `npm install` otherwise, without dev dependencies; then the manifest's packages.
fn node(work: &Path, inputs: &Inputs) -> Result<(Vec<String>, PathBuf, &'static str)> {
    let shown = vec![(work.to_path_buf(), String::new())];
    let npm = |args: &[&str]| {
        let mut cmd = Command::new("npm");
        cmd.args(args)
            .args([
                "--omit=dev",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(work)
            .current_dir(work);
        if Path::new(NODE_HEADERS).is_file() {
            // Addons without a prebuilt binary for this node build from source with the
            // machine's own headers (npm hands npm_config_* to install scripts).
            cmd.env("npm_config_nodedir", "/usr");
        }
        cmd
    };
    let mut ci = false;
    match &inputs.package_json {
        Some((json, lock)) => {
            std::fs::copy(json, work.join(PACKAGE_JSON))
                .with_context(|| format!("cannot read {PACKAGE_JSON}"))?;
            if let Some(lock) = lock {
                std::fs::copy(lock, work.join(file_name(lock)))
                    .with_context(|| format!("cannot read {}", file_name(lock)))?;
                ci = true;
            }
        }
        None => std::fs::write(work.join(PACKAGE_JSON), "{\"private\": true}\n")?,
    }
    if ci {
        run(&mut npm(&["ci"]), &shown).context("npm ci")?;
    }
    if !ci || !inputs.packages.is_empty() {
        let mut cmd = npm(&["install"]);
        cmd.args(inputs.packages);
        run(&mut cmd, &shown).context("npm install")?;
    }
    let lock = LOCKS
        .iter()
        .map(|l| work.join(l))
        .find(|p| p.is_file())
        .context("npm wrote no package-lock.json")?;
    let lock: serde_json::Value = serde_json::from_slice(&std::fs::read(lock)?)?;
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
    Ok((resolved, work.join("node_modules"), NODE_MODULES))
}

/// Runs a package tool; when it fails, the error is the end of what it said (the lines
/// that say why), with `paths` (scratch directories) shown as their replacement.
fn run(cmd: &mut Command, paths: &[(PathBuf, String)]) -> Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {}", cmd.get_program().to_string_lossy()))?;
    if !out.status.success() {
        bail!("{}", tool_error(&out, paths));
    }
    Ok(())
}

/// What a failed tool said, without its chatter: the last lines of its error output
/// (else of its standard output), at most `ERROR_LINES` lines and about `ERROR_BYTES`.
fn tool_error(out: &Output, paths: &[(PathBuf, String)]) -> String {
    let said = |bytes: &[u8]| -> Vec<String> {
        let mut text = String::from_utf8_lossy(bytes).into_owned();
        // Longest first: a scratch path inside another is replaced whole.
        let mut paths: Vec<_> = paths.iter().collect();
        paths.sort_by_key(|(p, _)| std::cmp::Reverse(p.as_os_str().len()));
        for (path, shown) in paths {
            let path = path.to_string_lossy();
            let with_slash = format!("{path}/");
            let shown_slash = if shown.is_empty() {
                String::new()
            } else {
                format!("{shown}/")
            };
            text = text.replace(&with_slash, &shown_slash);
            text = text.replace(&*path, if shown.is_empty() { "." } else { shown });
        }
        text.lines()
            .map(str::trim_end)
            .filter(|l| !chatter(l))
            .map(|l| {
                if l.len() > 300 {
                    let mut end = 300;
                    while !l.is_char_boundary(end) {
                        end -= 1;
                    }
                    format!("{}...", &l[..end])
                } else {
                    l.to_owned()
                }
            })
            .collect()
    };
    let mut lines = said(&out.stderr);
    if lines.is_empty() {
        lines = said(&out.stdout);
    }
    let mut tail: Vec<String> = Vec::new();
    let mut bytes = 0;
    for line in lines.into_iter().rev().take(ERROR_LINES) {
        bytes += line.len() + 1;
        if bytes > ERROR_BYTES && !tail.is_empty() {
            break;
        }
        tail.push(line);
    }
    tail.reverse();
    if tail.is_empty() {
        format!("{} and said nothing", out.status)
    } else {
        tail.join("\n")
    }
}

/// Lines of pip's and npm's output that say nothing about why they failed.
fn chatter(line: &str) -> bool {
    let l = line.trim();
    if l.is_empty() {
        return true;
    }
    // npm repeats a status code alone on a line between the lines of its message.
    if let Some(rest) = l.strip_prefix("npm error") {
        let rest = rest.trim();
        if rest.is_empty() || rest.chars().all(|c| c.is_ascii_digit()) {
            return true;
        }
    }
    const NOISE: [&str; 14] = [
        "npm warn",
        "npm WARN",
        "npm notice",
        "A complete log of this run can be found in",
        "WARNING: Running pip as the 'root' user",
        "[notice]",
        "gyp info",
        "gyp ERR! System",
        "gyp ERR! command",
        "gyp ERR! cwd",
        "gyp ERR! node -v",
        "gyp ERR! node-gyp -v",
        "gyp ERR! not ok",
        "gyp ERR! stack",
    ];
    NOISE.iter().any(|n| l.contains(n))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn failed(stderr: &str) -> Output {
        Output {
            status: std::process::ExitStatus::from_raw(1 << 8),
            stdout: Vec::new(),
            stderr: stderr.as_bytes().to_vec(),
        }
    }

    #[test]
    fn npm_says_why_without_chatter_or_scratch_paths() {
        let out = failed(
            "npm warn Unknown user config \"nodedir\".\n\
             npm error code E404\n\
             npm error 404 Not Found - GET https://registry.npmjs.org/no-such-pkg - Not found\n\
             npm error 404\n\
             npm error 404  'no-such-pkg@*' is not in this registry.\n\
             npm error path /tmp/skiff-packages-1-2/node_modules/x\n\
             npm error A complete log of this run can be found in: /root/.npm/_logs/x.log\n",
        );
        let shown = tool_error(
            &out,
            &[(PathBuf::from("/tmp/skiff-packages-1-2"), String::new())],
        );
        assert_eq!(
            shown,
            "npm error code E404\n\
             npm error 404 Not Found - GET https://registry.npmjs.org/no-such-pkg - Not found\n\
             npm error 404  'no-such-pkg@*' is not in this registry.\n\
             npm error path node_modules/x"
        );
    }

    #[test]
    fn pip_says_why_and_long_output_keeps_its_end() {
        let mut text = String::new();
        for i in 0..100 {
            text.push_str(&format!("  compiling part {i} of a long build\n"));
        }
        text.push_str(
            "WARNING: Running pip as the 'root' user can result in broken permissions\n\
             ERROR: Could not find a version that satisfies the requirement nope (from versions: none)\n\
             ERROR: No matching distribution found for nope\n",
        );
        let shown = tool_error(&failed(&text), &[]);
        assert_eq!(shown.lines().count(), ERROR_LINES, "{shown}");
        assert!(shown.ends_with(
            "ERROR: Could not find a version that satisfies the requirement nope (from versions: none)\n\
             ERROR: No matching distribution found for nope"
        ));
        assert!(!shown.contains("root' user"));
        assert_eq!(
            tool_error(&failed(""), &[]),
            "exit status: 1 and said nothing"
        );
    }

    #[test]
    fn inputs_that_reach_outside_the_function_are_refused() {
        let dir = Scratch::new().unwrap();
        let root = dir.0.as_path();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/more.txt"), "six\n").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("linked.txt")).unwrap();
        let req = root.join(REQUIREMENTS);
        let check = |packages: &[&str], requirements: Option<&str>, json: Option<&str>| {
            let packages: Vec<String> = packages.iter().map(|p| p.to_string()).collect();
            let _ = std::fs::remove_file(&req);
            if let Some(text) = requirements {
                std::fs::write(&req, text).unwrap();
            }
            let pj = root.join(PACKAGE_JSON);
            let _ = std::fs::remove_file(&pj);
            if let Some(text) = json {
                std::fs::write(&pj, text).unwrap();
            }
            let inputs = Inputs {
                packages: &packages,
                requirements: requirements.map(|_| req.clone()),
                package_json: json.map(|_| (pj.clone(), None)),
            };
            check_inputs(root, &packages, &inputs).map_err(|e| e.to_string())
        };
        assert_eq!(check(&["six==1.16.0", "./local"], None, None), Ok(()));
        assert!(check(&["-r/etc/shadow"], None, None)
            .unwrap_err()
            .contains("is an option"));
        for bad in [
            "/etc",
            "../x",
            "sub/../../x",
            "file:///etc/x",
            "pkg @ file:///etc/x",
        ] {
            let err = check(&[bad], None, None).unwrap_err();
            assert!(
                err.contains("outside the function's directory"),
                "{bad}: {err}"
            );
        }
        assert_eq!(
            check(&[], Some("six\n-r sub/more.txt\n-e ./sub\n"), None),
            Ok(())
        );
        for bad in [
            "-r /etc/shadow\n",
            "-r ../x\n",
            "--requirement=linked.txt\n",
            "-c ../../y\n",
            "-e /etc\n",
            "--editable /etc\n",
        ] {
            assert!(check(&[], Some(bad), None).is_err(), "{bad}");
        }
        let json = |dep: &str| format!("{{\"dependencies\": {{\"a\": \"{dep}\"}}}}");
        assert_eq!(check(&[], None, Some(&json("file:./sub"))), Ok(()));
        assert!(check(&[], None, Some(&json("file:../../etc"))).is_err());
        assert!(check(&[], None, Some(&json("link:/etc"))).is_err());
    }

    #[test]
    fn inputs_with_local_paths_are_not_cached_by_content() {
        let dir = Scratch::new().unwrap();
        let req = dir.0.join(REQUIREMENTS);
        let key = |text: &str| {
            std::fs::write(&req, text).unwrap();
            Inputs {
                packages: &[],
                requirements: Some(req.clone()),
                package_json: None,
            }
            .key(Runtime::Python3, &[])
            .unwrap()
        };
        let a = key("numpy==2.0.0\n");
        assert!(a.as_deref().is_some_and(|k| k.starts_with("packages.")));
        assert_ne!(a, key("numpy==2.0.1\n"));
        assert_eq!(key("-e ./mine\n"), None);
        std::fs::write(dir.0.join("more.txt"), "six\n").unwrap();
        let b = key("-r more.txt\n");
        std::fs::write(dir.0.join("more.txt"), "six==1.16.0\n").unwrap();
        assert_ne!(b, key("-r more.txt\n"));
        assert_eq!(key("-r missing.txt\n"), None);
    }

    #[test]
    fn node_gyp_leftovers_are_skipped() {
        assert!(build_leftover(Path::new(
            "better-sqlite3/build/Release/obj.target/x.o"
        )));
        assert!(!build_leftover(Path::new(
            "better-sqlite3/build/Release/better_sqlite3.node"
        )));
    }
}
