//! A manifest checked against its function's files: the handler must be there, and be
//! something its runtime can load. `skiff validate`, `skiff build` and the daemon's
//! deploy (which builds) all call [`Manifest::check_code`], so a broken function is
//! refused before anything is built, with the same message everywhere. Messages name
//! files relative to the function's directory: the daemon checks a scratch copy whose
//! host path means nothing to the user (and is not theirs to see).

use std::fs::Metadata;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Result};

use crate::{Manifest, Runtime};

/// What a `#!` line or a module's first bytes are read from.
const HEAD_BYTES: usize = 256;

/// The function's code directory, and how its files are named to the user.
struct Code {
    dir: PathBuf,
    /// `dir` itself, canonical: a handler that resolves outside it is refused.
    canonical: PathBuf,
    /// The code directory relative to the function's directory, `""` or `"src/"`.
    prefix: String,
}

impl Code {
    /// `rel` as the user knows it: relative to the function's directory.
    fn shown(&self, rel: &str) -> String {
        format!("{}{rel}", self.prefix)
    }

    /// The entry at `rel` (symlinks followed), `None` when there is none.
    fn find(&self, handler: &str, rel: &str) -> Result<Option<Metadata>> {
        // In the sandbox the code is all there is: no `..` or link out of it, whether
        // what it leads to exists or not (the daemon's neighbours are not the user's).
        let outside = || {
            anyhow::anyhow!(
                "handler {handler}: {} points outside the function's code",
                self.shown(rel)
            )
        };
        if Path::new(rel)
            .components()
            .any(|c| c == Component::ParentDir)
        {
            return Err(outside());
        }
        let Ok(resolved) = self.dir.join(rel).canonicalize() else {
            return Ok(None);
        };
        if !resolved.starts_with(&self.canonical) {
            return Err(outside());
        }
        Ok(resolved.metadata().ok())
    }

    /// The first bytes of the file at `rel`.
    fn head(&self, rel: &str) -> Result<Vec<u8>> {
        let mut head = Vec::with_capacity(HEAD_BYTES);
        std::fs::File::open(self.dir.join(rel))
            .and_then(|f| f.take(HEAD_BYTES as u64).read_to_end(&mut head))
            .map_err(|e| anyhow::anyhow!("cannot read {}: {}", self.shown(rel), e.kind()))?;
        Ok(head)
    }
}

impl Manifest {
    /// Checks the handler against the function's files in `dir` (the manifest's
    /// directory) without building anything.
    pub fn check_code(&self, dir: &Path) -> Result<()> {
        let relative: PathBuf = Path::new(&self.code)
            .components()
            .filter(|c| *c != Component::CurDir)
            .collect();
        let prefix = match relative.to_str() {
            Some("") | None => String::new(),
            Some(path) => format!("{}/", path.trim_end_matches('/')),
        };
        let code_dir = dir.join(&relative);
        let Ok(canonical) = code_dir.canonicalize() else {
            bail!("code: the function has no directory {}", self.code);
        };
        // Only the function's own files are built into its environment, never the host's.
        if !dir
            .canonicalize()
            .is_ok_and(|function| canonical.starts_with(function))
        {
            bail!(
                "code: {} points outside the function's directory",
                self.code
            );
        }
        let code = Code {
            dir: code_dir,
            canonical,
            prefix,
        };
        match self.runtime {
            Runtime::Python3 => python_module(&code, &self.handler),
            Runtime::Node => node_module(&code, &self.handler),
            Runtime::Binary => executable(&code, &self.handler),
            Runtime::Wasm => wasm_module(&code, &self.handler),
        }
    }
}

/// `pkg.main.handle`: `pkg/main.py`, a `pkg/main/` package, or compiled `pkg/main`
/// (`.pyc`, an extension module), as `import` finds it with `/code` first on its path.
fn python_module(code: &Code, handler: &str) -> Result<()> {
    let (module, _) = handler.rsplit_once('.').expect("checked at parsing");
    let rel = module.replace('.', "/");
    let package = code.find(handler, &rel)?.is_some_and(|m| m.is_dir());
    if package
        || code.find(handler, &format!("{rel}.py"))?.is_some()
        || code.find(handler, &format!("{rel}.pyc"))?.is_some()
    {
        return Ok(());
    }
    let (parent, stem) = rel.rsplit_once('/').unwrap_or(("", &rel));
    let extension = std::fs::read_dir(code.dir.join(parent))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix(stem)
                .is_some_and(|rest| rest.starts_with('.') && rest.ends_with(".so"))
        });
    if extension {
        return Ok(());
    }
    bail!(
        "handler {handler}: the function has no {} (nor a package {}/)",
        code.shown(&format!("{rel}.py")),
        code.shown(&rel)
    )
}

/// `index.handler`: what node's `require("/code/index")` loads, `index`, `index.js`,
/// `index.json`, `index.node` or a directory `index/`.
fn node_module(code: &Code, handler: &str) -> Result<()> {
    let (module, export) = handler.rsplit_once('.').expect("checked at parsing");
    for suffix in ["", ".js", ".json", ".node"] {
        if code.find(handler, &format!("{module}{suffix}"))?.is_some() {
            return Ok(());
        }
    }
    // require() does not add these extensions: the handler must name them.
    let named = [".mjs", ".cjs"]
        .iter()
        .map(|ext| format!("{module}{ext}"))
        .find(|file| code.dir.join(file).is_file());
    let hint = named.map_or(String::new(), |file| {
        format!(
            "; to load {}, name it: handler: {file}.{export}",
            code.shown(&file)
        )
    });
    bail!(
        "handler {handler}: the function has no {} (nor a directory {}/){hint}",
        code.shown(&format!("{module}.js")),
        code.shown(module)
    )
}

/// A binary handler: an executable ELF file (its shared libraries come with it). A
/// `#!` script is refused: an environment has no interpreters (no /bin/sh).
fn executable(code: &Code, handler: &str) -> Result<()> {
    let rel = handler.trim_start_matches("./");
    let shown = code.shown(rel);
    let Some(meta) = code.find(handler, rel)? else {
        bail!("handler {handler}: the function has no file {shown}");
    };
    if meta.is_dir() {
        bail!("handler {handler}: {shown} is a directory, not an executable");
    }
    if meta.permissions().mode() & 0o111 == 0 {
        bail!("handler {shown} is not executable: chmod +x {shown}");
    }
    let head = code.head(rel)?;
    if let Some(line) = head.strip_prefix(b"#!") {
        let line = String::from_utf8_lossy(line);
        let interpreter = line.split_whitespace().next().unwrap_or("");
        bail!(
            "handler {shown} starts with #!{interpreter}, which its environment does not have: \
             use a compiled binary or runtime python3/node"
        );
    }
    if !head.starts_with(b"\x7fELF") {
        bail!("handler {shown} is not an executable: it is not an ELF binary");
    }
    Ok(())
}

/// A wasm handler: a binary WebAssembly module (the text format is not accepted).
fn wasm_module(code: &Code, handler: &str) -> Result<()> {
    let shown = code.shown(handler);
    match code.find(handler, handler)? {
        Some(meta) if meta.is_file() => {}
        _ => bail!("handler {handler}: the function has no file {shown}"),
    }
    if !code.head(handler)?.starts_with(b"\0asm") {
        bail!("handler {shown} is not a WebAssembly module: it does not start with \\0asm");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function directory holding `files` (empty ones), checked with `manifest`.
    fn check(name: &str, manifest: &str, files: &[&str]) -> Result<()> {
        let dir = std::env::temp_dir().join(format!("skiff-code-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for file in files {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        let result = Manifest::parse(&format!("name: f\n{manifest}"), "skiff.yaml")
            .unwrap()
            .check_code(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        result
    }

    #[test]
    fn python_modules_are_found_as_import_finds_them() {
        let python = "runtime: python3\nhandler: main.handle\n";
        for (name, files) in [
            ("source", &["main.py"][..]),
            ("bytecode", &["main.pyc"]),
            ("extension", &["main.cpython-311-x86_64-linux-gnu.so"]),
            ("package", &["main/__init__.py"]),
        ] {
            assert!(check(name, python, files).is_ok(), "{name}");
        }
        let dotted = "runtime: python3\nhandler: app.main.handle\n";
        assert!(check("dotted", dotted, &["app/main.py"]).is_ok());
        assert_eq!(
            check("dotted-missing", dotted, &["main.py"])
                .unwrap_err()
                .to_string(),
            "handler app.main.handle: the function has no app/main.py (nor a package app/main/)"
        );
        // `mainly.so` is not the module `main`.
        assert!(check("prefix", python, &["mainly.so"]).is_err());
    }

    #[test]
    fn node_modules_are_found_as_require_finds_them() {
        let node = "runtime: node\nhandler: index.handler\n";
        for (name, files) in [
            ("js", &["index.js"][..]),
            ("json", &["index.json"]),
            ("addon", &["index.node"]),
            ("bare", &["index"]),
            ("directory", &["index/index.js"]),
        ] {
            assert!(check(name, node, files).is_ok(), "{name}");
        }
        assert_eq!(
            check("cjs", node, &["index.cjs"]).unwrap_err().to_string(),
            "handler index.handler: the function has no index.js (nor a directory index/); \
             to load index.cjs, name it: handler: index.cjs.handler"
        );
        let nested = "runtime: node\nhandler: ../index.handler\n";
        assert_eq!(
            check("nested", nested, &[]).unwrap_err().to_string(),
            "handler ../index.handler: ../index points outside the function's code"
        );
    }
}
