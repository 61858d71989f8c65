//! skiff's framed protocol between the engine and an instance's bootstrap, over a
//! stream socket: `u32 meta length, u32 body length` (big-endian), JSON meta, body.

use std::collections::BTreeMap;
use std::io;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest meta an instance may send (headers, messages).
const MAX_META: usize = 1 << 20;

/// An invocation, engine to instance.
#[derive(Serialize)]
pub struct Request<'a> {
    pub id: u64,
    pub request_id: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: &'a BTreeMap<String, String>,
    pub timeout_ms: u64,
    /// A wasm session hook to call instead of `handle`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub export: Option<&'a str>,
}

/// A control operation, engine to a wasm worker (`checkpoint`, `dump`, `get`), or the
/// answer to a worker's `fetch` (`fetched`).
#[derive(Serialize)]
pub struct Control<'a> {
    pub op: &'a str,
    pub id: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub found: bool,
}

/// What an instance sends: `ready` once the handler is loaded (or `init_error`), then
/// per invocation any `log` frames and one `result` or `error`.
#[derive(Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Message {
    Ready,
    InitError,
    Log {
        id: Option<u64>,
        stream: String,
    },
    Result {
        id: u64,
        status: u16,
        #[serde(default)]
        headers: BTreeMap<String, String>,
    },
    Error {
        id: u64,
        /// 504 when a wasm worker stopped the request at its time limit; else 500.
        #[serde(default)]
        status: Option<u16>,
    },
    /// A wasm worker asks for a value another session published.
    Fetch {
        fetch: u64,
        address: String,
        name: String,
    },
}

pub fn encode(meta: &impl Serialize, body: &[u8]) -> Vec<u8> {
    let meta = serde_json::to_vec(meta).expect("protocol metas serialize");
    let mut frame = Vec::with_capacity(8 + meta.len() + body.len());
    frame.extend_from_slice(&(meta.len() as u32).to_be_bytes());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&meta);
    frame.extend_from_slice(body);
    frame
}

/// Reads one frame; `None` at a clean end of stream. Frames over the limits, or metas
/// that are not a [`Message`], are errors: the instance is then not to be trusted.
pub async fn read<R: AsyncRead + Unpin>(
    r: &mut R,
    max_body: usize,
) -> io::Result<Option<(Message, Vec<u8>)>> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let meta_len = u32::from_be_bytes(head[..4].try_into().unwrap()) as usize;
    let body_len = u32::from_be_bytes(head[4..].try_into().unwrap()) as usize;
    if meta_len > MAX_META || body_len > max_body {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the function sent a frame of {body_len} bytes, over the {max_body}-byte limit"
            ),
        ));
    }
    let mut meta = vec![0; meta_len];
    r.read_exact(&mut meta).await?;
    let mut body = vec![0; body_len];
    r.read_exact(&mut body).await?;
    let message = serde_json::from_slice(&meta)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad frame: {e}")))?;
    Ok(Some((message, body)))
}
