//! `skiff deploy`, `invoke`, `ls`, `describe`, `rm`: commands answered by the daemon.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use crate::client::{ok, request, tar_dir, Target};

pub fn deploy(target: &Target, dir: &Path) -> Result<()> {
    let tar = tar_dir(dir)?;
    let headers = [("content-type".to_owned(), "application/x-tar".to_owned())];
    let (status, body) = request(target, "POST", "/v1/functions", &headers, tar)?;
    let f: serde_json::Value = serde_json::from_slice(&ok(status, body)?)?;
    println!(
        "deployed {} ({} runtime, environment {})",
        f["name"].as_str().unwrap_or("?"),
        f["runtime"].as_str().unwrap_or("?"),
        f["env"].as_str().unwrap_or("?")
    );
    Ok(())
}

pub fn invoke(target: &Target, name: &str, data: Option<&str>, headers: &[String]) -> Result<()> {
    let body = match data {
        Some(file) if file.starts_with('@') => {
            std::fs::read(&file[1..]).with_context(|| format!("cannot read {}", &file[1..]))?
        }
        Some(text) => text.as_bytes().to_vec(),
        None => Vec::new(),
    };
    let headers = headers
        .iter()
        .map(|h| {
            h.split_once(':')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .with_context(|| format!("-H {h:?}: expected KEY:VALUE"))
        })
        .collect::<Result<Vec<_>>>()?;
    let (status, body) = request(target, "POST", &format!("/fn/{name}"), &headers, body)?;
    std::io::stdout().write_all(&ok(status, body)?)?;
    Ok(())
}

pub fn ls(target: &Target) -> Result<()> {
    let (status, body) = request(target, "GET", "/v1/functions", &[], Vec::new())?;
    let list: Vec<serde_json::Value> = serde_json::from_slice(&ok(status, body)?)?;
    println!(
        "{:<24}  {:<8}  {:<20}  ENVIRONMENT",
        "NAME", "RUNTIME", "HANDLER"
    );
    for f in list {
        println!(
            "{:<24}  {:<8}  {:<20}  {}",
            f["name"].as_str().unwrap_or(""),
            f["runtime"].as_str().unwrap_or(""),
            f["handler"].as_str().unwrap_or(""),
            f["env"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

pub fn describe(target: &Target, name: &str) -> Result<()> {
    let (status, body) = request(
        target,
        "GET",
        &format!("/v1/functions/{name}"),
        &[],
        Vec::new(),
    )?;
    let f: serde_json::Value = serde_json::from_slice(&ok(status, body)?)?;
    println!("{}", serde_json::to_string_pretty(&f)?);
    Ok(())
}

pub fn rm(target: &Target, name: &str) -> Result<()> {
    let (status, body) = request(
        target,
        "DELETE",
        &format!("/v1/functions/{name}"),
        &[],
        Vec::new(),
    )?;
    ok(status, body)?;
    println!("removed {name}");
    Ok(())
}
