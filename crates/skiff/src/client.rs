//! The CLI's side of `skiff serve`: deploy, invoke, ls, describe, rm over the daemon's
//! Unix socket (or `--host URL`).

use std::path::Path;

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// Where the daemon is: its socket, or a `http://HOST:PORT` URL.
pub struct Target<'a> {
    pub socket: &'a Path,
    pub host: Option<&'a str>,
}

/// Sends one request; returns the status and the body.
pub fn request(
    target: &Target,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Result<(u16, Vec<u8>)> {
    let mut whole = Vec::new();
    let status = request_streaming(target, method, path, headers, body, &mut |chunk| {
        whole.extend_from_slice(chunk);
        Ok(())
    })?;
    Ok((status, whole))
}

/// Sends one request and hands the response body to `sink` as it arrives; returns the
/// status.
pub fn request_streaming(
    target: &Target,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<u16> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "skiff");
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req.body(Full::new(Bytes::from(body)))?;
        match target.host {
            Some(url) => {
                let addr = url.trim_start_matches("http://").trim_end_matches('/');
                let stream = tokio::net::TcpStream::connect(addr)
                    .await
                    .with_context(|| format!("cannot reach skiff at {url}"))?;
                send(stream, req, sink).await
            }
            None => {
                let stream = tokio::net::UnixStream::connect(target.socket)
                    .await
                    .with_context(|| {
                        format!(
                            "cannot reach skiff at {} (is `skiff serve` running?)",
                            target.socket.display()
                        )
                    })?;
                send(stream, req, sink).await
            }
        }
    })
}

async fn send<T>(
    io: T,
    req: hyper::Request<Full<Bytes>>,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<u16>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(conn);
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            sink(data)?;
        }
    }
    Ok(status)
}

/// The body of a 2xx answer, or the daemon's error message as an error.
pub fn ok(status: u16, body: Vec<u8>) -> Result<Vec<u8>> {
    if (200..300).contains(&status) {
        return Ok(body);
    }
    let message = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
    bail!("{message} (HTTP {status})")
}

/// A tar of the function's directory, as `POST /v1/functions` takes it.
pub fn tar_dir(dir: &Path) -> Result<Vec<u8>> {
    if !dir.join("skiff.yaml").is_file() {
        bail!("{} has no skiff.yaml", dir.display());
    }
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder
        .append_dir_all(".", dir)
        .with_context(|| format!("cannot read {}", dir.display()))?;
    Ok(builder.into_inner()?)
}
