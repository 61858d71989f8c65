//! The worker's end of skiff's framed protocol (see the daemon's `protocol.rs`): its
//! stdin is a socket to the daemon, read by one thread and written by many.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use serde::Serialize;

/// Largest frame the daemon sends (a request body is at most 6 MiB).
const MAX_FRAME: usize = 16 << 20;

/// What the worker sends.
#[derive(Serialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Out<'a> {
    Ready,
    InitError,
    Log {
        id: Option<u64>,
        stream: &'a str,
    },
    Result {
        id: u64,
        status: u16,
        headers: BTreeMap<String, String>,
    },
    Error {
        id: u64,
        status: u16,
    },
    /// Asks the daemon for a value another session published.
    Fetch {
        fetch: u64,
        address: &'a str,
        name: &'a str,
    },
}

pub struct Channel {
    reader: Mutex<UnixStream>,
    writer: Mutex<UnixStream>,
}

impl Channel {
    /// The daemon's socket, which is our stdin.
    pub fn stdin() -> io::Result<Channel> {
        // SAFETY: fd 0 is the daemon's socketpair end, owned by this process from here on.
        let stream = unsafe { UnixStream::from_raw_fd(0) };
        Ok(Channel {
            writer: Mutex::new(stream.try_clone()?),
            reader: Mutex::new(stream),
        })
    }

    /// Sends one frame. A failed send means the daemon is gone; the reader sees it too
    /// and the worker ends.
    pub fn send(&self, meta: &Out<'_>, body: &[u8]) {
        let meta = serde_json::to_vec(meta).expect("frames serialize");
        let mut frame = Vec::with_capacity(8 + meta.len() + body.len());
        frame.extend_from_slice(&(meta.len() as u32).to_be_bytes());
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&meta);
        frame.extend_from_slice(body);
        let _ = self.writer.lock().unwrap().write_all(&frame);
    }

    /// The next frame's meta and body; `None` when the daemon closed the channel.
    pub fn recv(&self) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut reader = self.reader.lock().unwrap();
        let mut head = [0u8; 8];
        match reader.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let meta_len = u32::from_be_bytes(head[..4].try_into().unwrap()) as usize;
        let body_len = u32::from_be_bytes(head[4..].try_into().unwrap()) as usize;
        if meta_len + body_len > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "frame too large",
            ));
        }
        let mut meta = vec![0; meta_len];
        reader.read_exact(&mut meta)?;
        let mut body = vec![0; body_len];
        reader.read_exact(&mut body)?;
        Ok(Some((meta, body)))
    }
}
