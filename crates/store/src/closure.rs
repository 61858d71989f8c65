//! The shared-library closure of ELF executables: what the dynamic loader will open,
//! found by reading PT_INTERP and DT_NEEDED/RUNPATH rather than by running `ldd` (which
//! executes the loader on the file: not something to do to a tenant's binary).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
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

/// The loader and every library `files` need, transitively (paths as the loader would
/// open them). Files that are not ELF, or are static, need nothing.
pub fn elf_closure(files: &[PathBuf]) -> Result<BTreeSet<PathBuf>> {
    let mut found = BTreeSet::new();
    let mut queue: Vec<PathBuf> = files.to_vec();
    let mut seen = BTreeSet::new();
    while let Some(file) = queue.pop() {
        if !seen.insert(file.clone()) {
            continue;
        }
        let bytes =
            std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let Ok(elf) = Elf::parse(&bytes) else {
            continue;
        };
        if let Some(interp) = elf.interpreter {
            found.insert(PathBuf::from(interp));
        }
        let origin = file.parent().unwrap_or(Path::new("/")).to_path_buf();
        let mut dirs: Vec<PathBuf> = elf
            .runpaths
            .iter()
            .chain(elf.rpaths.iter())
            .flat_map(|p| p.split(':'))
            .map(|d| PathBuf::from(d.replace("$ORIGIN", &origin.to_string_lossy())))
            .collect();
        dirs.extend(SYSTEM_DIRS.iter().map(PathBuf::from));
        for lib in &elf.libraries {
            let path = dirs
                .iter()
                .map(|d| d.join(lib))
                .find(|p| p.exists())
                .with_context(|| {
                    format!("{} needs {lib}, which is not installed", file.display())
                })?;
            if found.insert(path.clone()) {
                queue.push(path);
            }
        }
    }
    Ok(found)
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
}
