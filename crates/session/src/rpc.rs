//! Secondary workers reach the primary's space over a Unix socket.
//!
//! Frames are a length (u32, little-endian, at most `MAX_FRAME`) and a body. A request's
//! body: op (1 read, 2 write, 3 delete, 4 finish), txn (u64), the deadline as remaining
//! milliseconds (u32, rounded up), mode (0 weak, 1 strong), key length (u32), key, and for
//! a write the value (the rest). A reply's body: a tag and its payload: 0 nothing (read:
//! absent; delete: did not exist; write, finish: done), 1 a value (read: the rest; delete:
//! existed), 2 conflict, 3 lock timeout, 4 unavailable (the rest, the reason).
//!
//! A connection serves one request at a time, and a [`Remote`] gives each txn its own
//! connection from first call to `finish`, so a request waiting for a lock never blocks
//! another. The server keeps each connection's txns apart from every other's and, when
//! the connection closes, finishes the txns still open on it: a secondary that dies
//! leaves no lock behind.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufReader, Read, Write};
use std::mem;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::space::{lock, txn};
use crate::{Error, Mode, Space, State};

const MAX_FRAME: usize = 64 << 20;
const READ: u8 = 1;
const WRITE: u8 = 2;
const DELETE: u8 = 3;
const FINISH: u8 = 4;
const NOTHING: u8 = 0;
const VALUE: u8 = 1;
const CONFLICT: u8 = 2;
const LOCK_TIMEOUT: u8 = 3;
const UNAVAILABLE: u8 = 4;
/// How long past a request's deadline a reply may take (the log's fsync) before the
/// primary counts as gone.
const GRACE: Duration = Duration::from_secs(10);

/// Serves `space` to secondaries connecting to `listener`, a thread per connection. Spawns
/// the accepting thread and returns its handle; it runs as long as the process.
pub fn serve(space: Arc<Space>, listener: UnixListener) -> io::Result<JoinHandle<()>> {
    thread::Builder::new()
        .name("session-accept".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else {
                    // Out of descriptors and the like: back off instead of spinning.
                    thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let space = space.clone();
                // A connection whose thread cannot start is dropped: the client sees it closed.
                let _ = thread::Builder::new()
                    .name("session-conn".into())
                    .spawn(move || serve_connection(&space, stream));
            }
        })
}

fn serve_connection(space: &Space, stream: UnixStream) {
    let origin = space.new_origin();
    let mut open = HashSet::new();
    let mut input = BufReader::new(&stream);
    let mut request = Vec::new();
    let mut reply = Vec::new();
    while read_frame(&mut input, &mut request).is_ok() {
        let Some(()) = answer(space, origin, &request, &mut open, &mut reply) else {
            break;
        };
        if (&stream).write_all(&reply).is_err() {
            break;
        }
    }
    for t in open {
        space.finish_as(txn(origin, t));
    }
}

/// Runs one request and frames its reply; None if the request is malformed.
fn answer(
    space: &Space,
    origin: u64,
    request: &[u8],
    open: &mut HashSet<u64>,
    reply: &mut Vec<u8>,
) -> Option<()> {
    let (&op, rest) = request.split_first()?;
    let (t, rest) = rest.split_first_chunk::<8>()?;
    let (ms, rest) = rest.split_first_chunk::<4>()?;
    let (&mode, rest) = rest.split_first()?;
    let (key_len, rest) = rest.split_first_chunk::<4>()?;
    let key_len = u32::from_le_bytes(*key_len) as usize;
    if key_len > rest.len() {
        return None;
    }
    let (key, value) = rest.split_at(key_len);
    let t = u64::from_le_bytes(*t);
    let deadline = Instant::now() + Duration::from_millis(u32::from_le_bytes(*ms).into());
    let mode = match mode {
        0 => Mode::Weak,
        1 => Mode::Strong,
        _ => return None,
    };
    let id = txn(origin, t);
    if op == FINISH {
        open.remove(&t);
        space.finish_as(id);
    } else {
        open.insert(t);
    }
    let result = match op {
        READ => space.read_as(id, key, mode, deadline),
        WRITE => space
            .write_as(id, key, Some(value), mode, deadline)
            .map(|_| None),
        DELETE => space
            .write_as(id, key, None, Mode::Weak, deadline)
            .map(|existed| existed.then(Vec::new)),
        FINISH => Ok(None),
        _ => return None,
    };
    reply.clear();
    reply.extend_from_slice(&[0; 4]);
    match result {
        Ok(None) => reply.push(NOTHING),
        Ok(Some(v)) => {
            reply.push(VALUE);
            reply.extend_from_slice(&v);
        }
        Err(Error::Conflict) => reply.push(CONFLICT),
        Err(Error::LockTimeout) => reply.push(LOCK_TIMEOUT),
        Err(Error::Unavailable(reason)) => {
            reply.push(UNAVAILABLE);
            reply.extend_from_slice(reason.as_bytes());
        }
    }
    let len = (reply.len() - 4) as u32;
    reply[..4].copy_from_slice(&len.to_le_bytes());
    Some(())
}

fn read_frame(input: &mut impl Read, frame: &mut Vec<u8>) -> io::Result<()> {
    let mut len = [0; 4];
    input.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a {len}-byte frame"),
        ));
    }
    frame.resize(len, 0);
    input.read_exact(frame)
}

/// A secondary's handle on the primary's space: `State` calls forwarded over the socket.
/// Each txn holds a connection of its own from its first call until `finish(txn)`, which
/// returns it to a pool; so every request must be finished.
pub struct Remote {
    path: PathBuf,
    pool: Mutex<Pool>,
}

#[derive(Default)]
struct Pool {
    idle: Vec<UnixStream>,
    txns: HashMap<u64, Arc<Mutex<Conn>>>,
    /// Keys each txn read strongly and has not written strongly: what the primary still
    /// holds for it. A txn with none needs no `finish` round trip (most requests).
    open: HashMap<u64, HashSet<Vec<u8>>>,
}

enum Conn {
    Unopened,
    Open(UnixStream),
    /// It failed mid-request: the primary has released the request's locks (or is gone),
    /// so the request must not go on as if it still held them.
    Broken(String),
}

impl Remote {
    /// Connects to the primary serving at `path`.
    pub fn connect(path: &Path) -> io::Result<Remote> {
        let stream = UnixStream::connect(path)?;
        Ok(Remote {
            path: path.to_owned(),
            pool: Mutex::new(Pool {
                idle: vec![stream],
                ..Pool::default()
            }),
        })
    }

    fn call(&self, t: u64, request: &[u8], deadline: Instant) -> Result<(u8, Vec<u8>), Error> {
        let conn = {
            let mut pool = lock(&self.pool);
            if let Some(conn) = pool.txns.get(&t) {
                conn.clone()
            } else {
                let conn = pool.idle.pop().map_or(Conn::Unopened, Conn::Open);
                let conn = Arc::new(Mutex::new(conn));
                pool.txns.insert(t, conn.clone());
                conn
            }
        };
        let mut conn = lock(&conn);
        let stream = match mem::replace(&mut *conn, Conn::Unopened) {
            Conn::Open(stream) => stream,
            // Nothing of this txn's is on the primary yet: a later call may try again.
            Conn::Unopened => {
                UnixStream::connect(&self.path).map_err(|e| Error::Unavailable(self.reason(e)))?
            }
            Conn::Broken(reason) => {
                *conn = Conn::Broken(reason.clone());
                return Err(Error::Unavailable(reason));
            }
        };
        let timeout = deadline.saturating_duration_since(Instant::now()) + GRACE;
        match exchange(&stream, request, timeout) {
            Ok(reply) => {
                *conn = Conn::Open(stream);
                Ok(reply)
            }
            Err(e) => {
                let reason = self.reason(e);
                *conn = Conn::Broken(reason.clone());
                Err(Error::Unavailable(reason))
            }
        }
    }

    fn reason(&self, e: io::Error) -> String {
        format!("session primary at {}: {e}", self.path.display())
    }
}

fn exchange(
    mut stream: &UnixStream,
    request: &[u8],
    timeout: Duration,
) -> io::Result<(u8, Vec<u8>)> {
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request)?;
    stream.set_read_timeout(Some(timeout))?;
    let mut reply = Vec::new();
    read_frame(&mut stream, &mut reply)?;
    let tag = *reply
        .first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "an empty reply"))?;
    reply.remove(0);
    Ok((tag, reply))
}

fn request(
    op: u8,
    t: u64,
    deadline: Option<Instant>,
    mode: Mode,
    key: &[u8],
    value: &[u8],
) -> Vec<u8> {
    let ms = deadline.map_or(0, |d| {
        let left = d.saturating_duration_since(Instant::now());
        u32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u32::MAX)
    });
    let mut r = Vec::with_capacity(4 + 18 + key.len() + value.len());
    r.extend_from_slice(&[0; 4]);
    r.push(op);
    r.extend_from_slice(&t.to_le_bytes());
    r.extend_from_slice(&ms.to_le_bytes());
    r.push(u8::from(mode == Mode::Strong));
    r.extend_from_slice(&(key.len() as u32).to_le_bytes());
    r.extend_from_slice(key);
    r.extend_from_slice(value);
    let len = (r.len() - 4) as u32;
    r[..4].copy_from_slice(&len.to_le_bytes());
    r
}

fn outcome(tag: u8, payload: Vec<u8>) -> Result<Option<Vec<u8>>, Error> {
    match tag {
        NOTHING => Ok(None),
        VALUE => Ok(Some(payload)),
        CONFLICT => Err(Error::Conflict),
        LOCK_TIMEOUT => Err(Error::LockTimeout),
        UNAVAILABLE => Err(Error::Unavailable(
            String::from_utf8_lossy(&payload).into_owned(),
        )),
        _ => Err(Error::Unavailable(format!("unknown reply {tag}"))),
    }
}

impl State for Remote {
    fn read(
        &self,
        txn: u64,
        key: &[u8],
        mode: Mode,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, Error> {
        let (tag, payload) = self.call(
            txn,
            &request(READ, txn, Some(deadline), mode, key, &[]),
            deadline,
        )?;
        let value = outcome(tag, payload)?;
        if mode == Mode::Strong {
            lock(&self.pool)
                .open
                .entry(txn)
                .or_default()
                .insert(key.to_vec());
        }
        Ok(value)
    }

    fn write(
        &self,
        txn: u64,
        key: &[u8],
        value: &[u8],
        mode: Mode,
        deadline: Instant,
    ) -> Result<(), Error> {
        let (tag, payload) = self.call(
            txn,
            &request(WRITE, txn, Some(deadline), mode, key, value),
            deadline,
        )?;
        let done = outcome(tag, payload).map(drop);
        // A strong write commits or conflicts: either way the primary let go of the key.
        if mode == Mode::Strong && matches!(done, Ok(()) | Err(Error::Conflict)) {
            if let Some(open) = lock(&self.pool).open.get_mut(&txn) {
                open.remove(key);
            }
        }
        done
    }

    fn delete(&self, txn: u64, key: &[u8], deadline: Instant) -> Result<bool, Error> {
        let (tag, payload) = self.call(
            txn,
            &request(DELETE, txn, Some(deadline), Mode::Weak, key, &[]),
            deadline,
        )?;
        outcome(tag, payload).map(|v| v.is_some())
    }

    /// Releases the request's locks on the primary and returns its connection to the pool.
    fn finish(&self, txn: u64) {
        let (conn, holds) = {
            let mut pool = lock(&self.pool);
            let holds = pool.open.remove(&txn).is_some_and(|keys| !keys.is_empty());
            let Some(conn) = pool.txns.remove(&txn) else {
                return;
            };
            (conn, holds)
        };
        let Conn::Open(stream) = mem::replace(&mut *lock(&conn), Conn::Unopened) else {
            return;
        };
        if !holds {
            lock(&self.pool).idle.push(stream);
            return;
        }
        if exchange(
            &stream,
            &request(FINISH, txn, None, Mode::Weak, &[], &[]),
            GRACE,
        )
        .is_ok()
        {
            lock(&self.pool).idle.push(stream);
        }
    }
}
