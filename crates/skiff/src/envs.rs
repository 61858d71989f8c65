//! `skiff validate`, `build`, `envs` and `fsck`: function environments in the store.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use skiff_builder::Progress;
use skiff_manifest::Manifest;
use skiff_store::Store;

pub fn validate(dir: &Path) -> Result<()> {
    let m = Manifest::load(dir)?;
    m.check_code(dir)?;
    println!(
        "{}: ok ({} function {:?}, handler {})",
        dir.join(skiff_manifest::FILE_NAME).display(),
        format!("{:?}", m.runtime).to_lowercase(),
        m.name.0,
        m.handler
    );
    Ok(())
}

pub fn build(data: &Path, dir: &Path) -> Result<()> {
    let started = Instant::now();
    let store = Store::open(data)?;
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {pos} files").expect("valid template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    let built = skiff_builder::build(&store, dir, &mut |p| match p {
        Progress::Step(step) => {
            bar.set_position(0);
            bar.set_message(step.to_owned());
        }
        Progress::File(n) => bar.inc(n),
    });
    bar.finish_and_clear();
    let built = built?;
    let usage = store.usage()?;
    let mine = usage.iter().find(|u| u.id == built.id);
    println!(
        "built {}: environment {} ({} files, {}, {} unique) in {:.2?}{}",
        built.name,
        built.id,
        mine.map_or(0, |u| u.files),
        human(mine.map_or(0, |u| u.total)),
        human(mine.map_or(0, |u| u.unique)),
        started.elapsed(),
        if built.runtime_reused {
            ""
        } else {
            "; runtime layer built"
        }
    );
    Ok(())
}

pub fn list(data: &Path, rm: Option<&str>) -> Result<()> {
    let store = Store::open(data)?;
    if let Some(name) = rm {
        let record = store.resolve(name)?;
        store.remove_env(&record.id)?;
        println!(
            "removed environment {} ({}); `skiff gc` frees its unshared files",
            record.name, record.id
        );
        return Ok(());
    }
    println!(
        "{:<24}  {:<18}  {:>7}  {:>10}  {:>10}  {:>10}",
        "NAME", "ID", "FILES", "TOTAL", "UNIQUE", "SHARED"
    );
    for u in store.usage()? {
        println!(
            "{:<24}  {:<18}  {:>7}  {:>10}  {:>10}  {:>10}",
            u.name,
            u.id,
            u.files,
            human(u.total),
            human(u.unique),
            human(u.shared)
        );
    }
    println!("store on disk: {}", human(store.disk_bytes()?));
    Ok(())
}

pub fn import(data: &Path, image: &Path, name: &str) -> Result<()> {
    skiff_manifest::Name::try_from(name.to_owned()).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let started = Instant::now();
    let store = Store::open(data)?;
    let (id, _) = skiff_builder::oci::import(&store, image, name)?;
    let usage = store.usage()?;
    let mine = usage.iter().find(|u| u.id == id);
    println!(
        "imported {} as {name}: environment {id} ({} files, {}) in {:.2?}",
        image.display(),
        mine.map_or(0, |u| u.files),
        human(mine.map_or(0, |u| u.total)),
        started.elapsed()
    );
    Ok(())
}

/// Exit 0 when the store is intact, 1 when something is corrupt.
pub fn fsck(data: &Path) -> Result<i32> {
    let report = Store::open(data)?.fsck()?;
    for c in &report.corrupt {
        println!(
            "corrupt: {} (content hashes to {})",
            c.object.display(),
            c.found
        );
    }
    println!(
        "fsck: {} files checked, {} corrupt",
        report.checked,
        report.corrupt.len()
    );
    Ok(if report.corrupt.is_empty() { 0 } else { 1 })
}

fn human(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MB", bytes as f64 / 1_048_576.0),
    }
}
