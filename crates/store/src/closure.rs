//! The shared-library closure of ELF files: what the dynamic loader will open, found by
//! reading PT_INTERP and DT_NEEDED/RUNPATH rather than by running `ldd` (which executes
//! the loader on the file: not something to do to a tenant's binary).
//!
//! Two uses: [`elf_closure`] for host files (an interpreter, a native handler), whose
//! libraries are host files at the same paths in the environment; [`tree_closure`] for
//! the shared objects of a package tree about to become part of an environment, whose
//! libraries may be in the tree itself (an `$ORIGIN` RUNPATH: `numpy.libs/`), already in
//! the environment (the runtime layer), or on the host.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use goblin::elf::Elf;

/// Where glibc's loader looks when no ld.so.cache entry or RUNPATH says otherwise.
const SYSTEM_DIRS: [&str; 6] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// The machine the loader here runs: shared objects built for another one (test data,
/// other platforms' binaries some packages carry) are never loaded, so they need nothing.
#[cfg(target_arch = "x86_64")]
const MACHINE: u16 = goblin::elf::header::EM_X86_64;
#[cfg(target_arch = "aarch64")]
const MACHINE: u16 = goblin::elf::header::EM_AARCH64;

/// At most this many missing libraries are named in one error.
const MISSING_SHOWN: usize = 8;

/// The loader and every library `files` need, transitively (paths as the loader would
/// open them). Files that are not ELF, or are static, need nothing.
pub fn elf_closure(files: &[PathBuf]) -> Result<BTreeSet<PathBuf>> {
    let none = |_: &Path| false;
    let mut resolver = Resolver {
        tree: None,
        have: &none,
        found: BTreeSet::new(),
        missing: Vec::new(),
    };
    resolver.run(files.iter().map(|f| (f.clone(), f.clone())).collect())?;
    if let Some((file, lib)) = resolver.missing.first() {
        bail!("{} needs {lib}, which is not installed", file.display());
    }
    Ok(resolver.found)
}

/// The host libraries that the shared objects (`*.so`, `*.so.*`, `*.node`) in `tree`
/// need, transitively, when `tree` is at `/<at>` in an environment that already has
/// the files `have` says it has (paths inside the environment, absolute). A library the
/// tree holds itself (found through an `$ORIGIN` RUNPATH or RPATH) or that `have` has
/// is satisfied; any other must be on the host, and is returned at the path the loader
/// will open (the same inside the environment). A library found nowhere is an error
/// naming it and the file that needs it, relative to the environment's root.
pub fn tree_closure(
    tree: &Path,
    at: &str,
    have: &dyn Fn(&Path) -> bool,
) -> Result<BTreeSet<PathBuf>> {
    let mount = Path::new("/").join(at);
    let mut objects = Vec::new();
    shared_objects(tree, &mut objects)?;
    let roots = objects
        .into_iter()
        .map(|host| {
            let env = mount.join(host.strip_prefix(tree).expect("below the tree"));
            (env, host)
        })
        .collect();
    let mut resolver = Resolver {
        tree: Some((tree, &mount)),
        have,
        found: BTreeSet::new(),
        missing: Vec::new(),
    };
    resolver.run(roots)?;
    if !resolver.missing.is_empty() {
        let mut lines: Vec<String> = resolver
            .missing
            .iter()
            .take(MISSING_SHOWN)
            .map(|(file, lib)| {
                format!(
                    "{} needs {lib}, which is not on this machine",
                    file.strip_prefix("/").unwrap_or(file).display()
                )
            })
            .collect();
        if resolver.missing.len() > MISSING_SHOWN {
            lines.push(format!(
                "and {} more missing libraries",
                resolver.missing.len() - MISSING_SHOWN
            ));
        }
        bail!("{}", lines.join("\n"));
    }
    Ok(resolver.found)
}

/// Regular files below `dir` named like shared objects (symlinks to them are the same
/// objects under another name).
fn shared_objects(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let kind = entry.file_type()?;
        if kind.is_dir() {
            shared_objects(&entry.path(), out)?;
        } else if kind.is_file() && is_shared_object_name(&entry.file_name().to_string_lossy()) {
            out.push(entry.path());
        }
    }
    Ok(())
}

/// `*.so`, `*.so.*` (a versioned soname) or `*.node` (a node addon).
fn is_shared_object_name(name: &str) -> bool {
    name.ends_with(".so") || name.contains(".so.") || name.ends_with(".node")
}

/// Where a file the loader will open, named by its path inside the environment, comes
/// from.
enum Found {
    /// The package tree has it (this host file).
    Tree(PathBuf),
    /// The environment has it already.
    Have,
    /// The host has it at the same path.
    Host,
    Nowhere,
}

struct Resolver<'a> {
    /// The package tree on the host and where it is inside the environment.
    tree: Option<(&'a Path, &'a Path)>,
    have: &'a dyn Fn(&Path) -> bool,
    /// Host files to add, at the same paths.
    found: BTreeSet<PathBuf>,
    /// (file inside the environment, library it needs) found nowhere.
    missing: Vec<(PathBuf, String)>,
}

impl Resolver<'_> {
    fn locate(&self, env: &Path) -> Found {
        if let Some((tree, mount)) = self.tree {
            if let Ok(rel) = env.strip_prefix(mount) {
                let host = tree.join(rel);
                return if host.is_file() {
                    Found::Tree(host)
                } else {
                    Found::Nowhere
                };
            }
        }
        if (self.have)(env) {
            Found::Have
        } else if env.is_file() {
            Found::Host
        } else {
            Found::Nowhere
        }
    }

    /// Reads every (path inside the environment, host file) in `queue` and what they
    /// need, transitively.
    fn run(&mut self, mut queue: Vec<(PathBuf, PathBuf)>) -> Result<()> {
        let mut seen = BTreeSet::new();
        while let Some((env, host)) = queue.pop() {
            if !seen.insert(env.clone()) {
                continue;
            }
            let bytes =
                std::fs::read(&host).with_context(|| format!("cannot read {}", host.display()))?;
            let Ok(elf) = Elf::parse(&bytes) else {
                continue;
            };
            if elf.header.e_machine != MACHINE {
                continue;
            }
            if let Some(interp) = elf.interpreter {
                let interp = PathBuf::from(interp);
                match self.locate(&interp) {
                    Found::Tree(h) => queue.push((interp, h)),
                    Found::Have => {}
                    Found::Host => {
                        if self.found.insert(interp.clone()) {
                            queue.push((interp.clone(), interp));
                        }
                    }
                    Found::Nowhere => self
                        .missing
                        .push((env.clone(), interp.to_string_lossy().into_owned())),
                }
            }
            // $ORIGIN is the directory the loader finds the file in: inside the
            // environment, which for host files is the same path.
            let origin = env.parent().unwrap_or(Path::new("/")).to_string_lossy();
            let mut dirs: Vec<PathBuf> = elf
                .runpaths
                .iter()
                .chain(elf.rpaths.iter())
                .flat_map(|p| p.split(':'))
                .filter(|d| !d.is_empty())
                .map(|d| {
                    normalize(Path::new(
                        &d.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin),
                    ))
                })
                .collect();
            dirs.extend(SYSTEM_DIRS.iter().map(PathBuf::from));
            'libs: for lib in &elf.libraries {
                for dir in &dirs {
                    let path = normalize(&dir.join(lib));
                    match self.locate(&path) {
                        Found::Tree(h) => {
                            queue.push((path, h));
                            continue 'libs;
                        }
                        Found::Have => continue 'libs,
                        Found::Host => {
                            if self.found.insert(path.clone()) {
                                queue.push((path.clone(), path));
                            }
                            continue 'libs;
                        }
                        Found::Nowhere => {}
                    }
                }
                self.missing.push((env.clone(), lib.to_string()));
            }
        }
        Ok(())
    }
}

/// `path` without `.` and `..` components (lexically: as the loader joins RUNPATHs).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_binary_needs_libc_and_the_loader() {
        let closure = elf_closure(&[PathBuf::from("/bin/ls")]).unwrap();
        let names: Vec<String> = closure
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().any(|n| n == "libc.so.6"), "{names:?}");
        assert!(names.iter().any(|n| n.starts_with("ld-linux")), "{names:?}");
    }

    #[test]
    fn a_static_binary_needs_nothing() {
        assert!(elf_closure(&[PathBuf::from("/bin/busybox")])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn normalize_is_lexical() {
        assert_eq!(
            normalize(Path::new("/a/b/../../c/./d")),
            PathBuf::from("/c/d")
        );
        assert_eq!(normalize(Path::new("/../x")), PathBuf::from("/x"));
    }

    /// A scratch tree of shared objects compiled here, removed when dropped.
    struct Tree(PathBuf);

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn cc(args: &[&str]) {
        let out = std::process::Command::new("cc")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// pkg/_ext.so needs pkg.libs/libinner.so.1 (RUNPATH $ORIGIN/../pkg.libs), which
    /// needs libm; pkg/_other.so needs libnowhere.so.9, unless `complete`.
    fn tree(name: &str, complete: bool) -> Tree {
        let root =
            std::env::temp_dir().join(format!("skiff-closure-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("pkg")).unwrap();
        std::fs::create_dir_all(root.join("pkg.libs")).unwrap();
        let t = Tree(root.clone());
        let src = root.join("x.c");
        std::fs::write(&src, "double f(double x) { return x; }\n").unwrap();
        let s = |p: &Path| p.to_str().unwrap().to_owned();
        let inner = root.join("pkg.libs/libinner.so.1");
        cc(&[
            "-shared",
            "-fPIC",
            "-Wl,-soname,libinner.so.1",
            "-Wl,--no-as-needed",
            "-o",
            &s(&inner),
            &s(&src),
            "-lm",
        ]);
        cc(&[
            "-shared",
            "-fPIC",
            "-Wl,-rpath,$ORIGIN/../pkg.libs",
            "-Wl,--no-as-needed",
            "-o",
            &s(&root.join("pkg/_ext.so")),
            &s(&src),
            &s(&inner),
        ]);
        if !complete {
            let missing = root.join("libnowhere.so.9");
            cc(&[
                "-shared",
                "-fPIC",
                "-Wl,-soname,libnowhere.so.9",
                "-o",
                &s(&missing),
                &s(&src),
            ]);
            cc(&[
                "-shared",
                "-fPIC",
                "-Wl,--no-as-needed",
                "-o",
                &s(&root.join("pkg/_other.so")),
                &s(&src),
                &s(&missing),
            ]);
            std::fs::remove_file(&missing).unwrap();
        }
        std::fs::remove_file(&src).unwrap();
        t
    }

    #[test]
    fn a_tree_needs_what_neither_it_nor_the_environment_has() {
        let t = tree("complete", true);
        // The environment has libc and the loader, not libm.
        let have = |p: &Path| {
            let name = p.file_name().unwrap().to_string_lossy();
            name == "libc.so.6" || name.starts_with("ld-linux")
        };
        let found = tree_closure(&t.0, "site", &have).unwrap();
        let names: Vec<String> = found
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["libm.so.6"], "{found:?}");
        assert!(found.iter().all(|p| p.is_file()), "{found:?}");
    }

    #[test]
    fn a_library_found_nowhere_names_it_and_its_user() {
        let t = tree("missing", false);
        let err = tree_closure(&t.0, "usr/lib/python3/dist-packages", &|_| false)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "usr/lib/python3/dist-packages/pkg/_other.so needs libnowhere.so.9, \
             which is not on this machine"
        );
    }
}
