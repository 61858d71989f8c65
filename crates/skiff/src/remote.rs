//! `skiff deploy`, `invoke`, `ls`, `describe`, `rm`, `logs`: commands answered by the
//! daemon.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, Result};

use crate::client::{ok, request, request_streaming, tar_dir, Target};

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

pub fn invoke(
    target: &Target,
    name: &str,
    data: Option<&str>,
    headers: &[String],
    is_async: bool,
) -> Result<()> {
    // As curl's --data-binary: the bytes as they are (curl's -d would drop a file's newlines).
    let body = match data {
        None => Vec::new(),
        Some("@-") => {
            let mut stdin = Vec::new();
            std::io::stdin()
                .read_to_end(&mut stdin)
                .context("cannot read standard input")?;
            stdin
        }
        Some(data) => match data.strip_prefix('@') {
            Some(file) => std::fs::read(file).with_context(|| format!("cannot read {file}"))?,
            None => data.as_bytes().to_vec(),
        },
    };
    let headers = headers
        .iter()
        .map(|h| {
            h.split_once(':')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .with_context(|| format!("-H {h:?}: expected KEY:VALUE"))
        })
        .collect::<Result<Vec<_>>>()?;
    let route = if is_async { "async" } else { "fn" };
    let (status, body) = request(target, "POST", &format!("/{route}/{name}"), &headers, body)?;
    let body = ok(status, body)?;
    if is_async {
        let accepted: serde_json::Value = serde_json::from_slice(&body)?;
        let id = accepted["id"].as_str().unwrap_or("?");
        println!("{id}");
        eprintln!("skiff: accepted; see `skiff invocation {id}`");
    } else {
        std::io::stdout().write_all(&body)?;
    }
    Ok(())
}

/// `skiff invocation ID`: an invocation's record (status, timings, logs, result).
pub fn invocation(target: &Target, id: &str) -> Result<()> {
    show(target, &format!("/v1/invocations/{id}"))
}

/// `skiff logs NAME`: the function's log lines; with `follow`, new ones as they come.
pub fn logs(
    target: &Target,
    name: &str,
    follow: bool,
    tail: usize,
    invocation: Option<&str>,
) -> Result<()> {
    let mut path = format!("/v1/functions/{name}/logs?tail={tail}&follow={follow}");
    if let Some(id) = invocation {
        path.push_str(&format!("&invocation={id}"));
    }
    let mut pending = Vec::new();
    let mut out = std::io::stdout().lock();
    let status = request_streaming(target, "GET", &path, &[], Vec::new(), &mut |chunk| {
        pending.extend_from_slice(chunk);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            match serde_json::from_slice::<serde_json::Value>(&line) {
                Ok(v) if v.get("line").is_some() => {
                    let invocation = v["invocation"].as_str().unwrap_or("-");
                    writeln!(
                        out,
                        "{} {} {}: {}",
                        v["ts"].as_str().unwrap_or(""),
                        invocation,
                        v["stream"].as_str().unwrap_or(""),
                        v["line"].as_str().unwrap_or("")
                    )?;
                    out.flush()?;
                }
                _ => {}
            }
        }
        Ok(())
    })?;
    // An error answer is one JSON object without a newline: still pending.
    ok(status, pending)?;
    Ok(())
}

/// The daemon's instances, if a daemon serving `data` answers on the target.
pub fn instances(target: &Target, data: &Path) -> Vec<serde_json::Value> {
    let serves_data = request(target, "GET", "/healthz", &[], Vec::new())
        .ok()
        .and_then(|(_, body)| serde_json::from_slice::<serde_json::Value>(&body).ok())
        .is_some_and(|h| h["data"].as_str() == data.to_str());
    if !serves_data {
        return Vec::new();
    }
    request(target, "GET", "/v1/instances", &[], Vec::new())
        .ok()
        .and_then(|(status, body)| ok(status, body).ok())
        .and_then(|body| serde_json::from_slice(&body).ok())
        .unwrap_or_default()
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
    show(target, &format!("/v1/functions/{name}"))
}

/// Prints the JSON the daemon answers `GET path` with, indented.
fn show(target: &Target, path: &str) -> Result<()> {
    let (status, body) = request(target, "GET", path, &[], Vec::new())?;
    let value: serde_json::Value = serde_json::from_slice(&ok(status, body)?)?;
    println!("{}", serde_json::to_string_pretty(&value)?);
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
