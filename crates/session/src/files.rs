//! What a space keeps in its directory:
//!
//! - `checkpoint`: `MAGIC`, version (u32), the first log segment to replay (u64), the
//!   number of entries (u64), then per entry key length (u64), value length (u64), key,
//!   value; last the CRC-32C of everything before it (u32). Integers are little-endian.
//!   Written to `checkpoint.tmp`, fsynced, renamed over, and the directory fsynced.
//! - `wal.<segment>`: log records, each a payload length (u64), the CRC-32C of that length
//!   and the payload (u32), and the payload: an op (1 put, 2 delete), key length (u64),
//!   key, value. A checkpoint starts a new segment; older ones are deleted once it is on
//!   disk. In the newest segment, a bad record and everything after it is a torn append
//!   (never acknowledged: acknowledgement waits for fdatasync) and is cut off.
//! - `lock`: flock'ed by the one process that has the space open.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::mem;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::space::lock;
use crate::{crc, Error};

const CHECKPOINT: &str = "checkpoint";
const CHECKPOINT_TMP: &str = "checkpoint.tmp";
const MAGIC: &[u8; 8] = b"SKIFFSES";
const VERSION: u32 = 1;
const PUT: u8 = 1;
const DELETE: u8 = 2;

pub(crate) type Bytes = Arc<[u8]>;

/// Takes the directory's lock: two processes appending to one log would interleave records.
pub(crate) fn lock_dir(dir: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(
            err.kind(),
            format!("session directory {} is in use: {err}", dir.display()),
        ));
    }
    Ok(file)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn corrupt(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} is corrupt: {what}", path.display()),
    )
}

/// Writes `entries` as the checkpoint whose log starts at segment `segment`.
pub(crate) fn write_checkpoint(
    dir: &Path,
    segment: u64,
    entries: &[(Bytes, Bytes)],
) -> io::Result<()> {
    let tmp = dir.join(CHECKPOINT_TMP);
    let file = File::create(&tmp)?;
    let mut out = BufWriter::with_capacity(
        1 << 20,
        Crc {
            inner: file,
            crc: 0,
        },
    );
    out.write_all(MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&segment.to_le_bytes())?;
    out.write_all(&(entries.len() as u64).to_le_bytes())?;
    for (key, value) in entries {
        out.write_all(&(key.len() as u64).to_le_bytes())?;
        out.write_all(&(value.len() as u64).to_le_bytes())?;
        out.write_all(key)?;
        out.write_all(value)?;
    }
    let Crc {
        inner: mut file,
        crc,
    } = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.write_all(&crc.to_le_bytes())?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(CHECKPOINT))?;
    sync_dir(dir)
}

/// Reads the checkpoint into `map`: the segment its log starts at, or 0 with no checkpoint.
pub(crate) fn read_checkpoint(dir: &Path, map: &mut HashMap<Bytes, Bytes>) -> io::Result<u64> {
    match fs::remove_file(dir.join(CHECKPOINT_TMP)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let path = dir.join(CHECKPOINT);
    let file = match File::open(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        file => file?,
    };
    let size = file.metadata()?.len();
    let mut input = Crc {
        inner: BufReader::with_capacity(1 << 20, file),
        crc: 0,
    };
    let eof = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof => corrupt(&path, "truncated"),
        _ => e,
    };
    let mut magic = [0; 8];
    input.read_exact(&mut magic).map_err(eof)?;
    if &magic != MAGIC {
        return Err(corrupt(&path, "not a session checkpoint"));
    }
    let version = read_u32(&mut input).map_err(eof)?;
    if version != VERSION {
        return Err(corrupt(&path, &format!("unknown version {version}")));
    }
    let segment = read_u64(&mut input).map_err(eof)?;
    let count = read_u64(&mut input).map_err(eof)?;
    // Lengths are checked against the file's size (less header and checksum) before
    // anything is allocated.
    let mut left = size.saturating_sub(32);
    for _ in 0..count {
        let key_len = read_u64(&mut input).map_err(eof)?;
        let value_len = read_u64(&mut input).map_err(eof)?;
        left = left.saturating_sub(16);
        if key_len.saturating_add(value_len) > left {
            return Err(corrupt(&path, "an entry runs past the end"));
        }
        left -= key_len + value_len;
        let key = read_bytes(&mut input, key_len).map_err(eof)?;
        let value = read_bytes(&mut input, value_len).map_err(eof)?;
        map.insert(key, value);
    }
    let crc = input.crc;
    let stored = read_u32(&mut input.inner).map_err(eof)?;
    if stored != crc {
        return Err(corrupt(&path, "checksum mismatch"));
    }
    if input.inner.read(&mut [0])? != 0 {
        return Err(corrupt(&path, "trailing bytes"));
    }
    Ok(segment)
}

fn read_u32(input: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    input.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(input: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    input.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_bytes(input: &mut impl Read, len: u64) -> io::Result<Bytes> {
    let mut v = vec![0; len as usize];
    input.read_exact(&mut v)?;
    Ok(v.into())
}

/// Checksums what passes through it.
struct Crc<T> {
    inner: T,
    crc: u32,
}

impl<W: Write> Write for Crc<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc::update(self.crc, &buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Crc<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc = crc::update(self.crc, &buf[..n]);
        Ok(n)
    }
}

fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("wal.{segment:020}"))
}

/// The log segments in `dir`, oldest first.
pub(crate) fn segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        if let Some(n) = name.to_str().and_then(|n| n.strip_prefix("wal.")) {
            if let Ok(n) = n.parse() {
                found.push(n);
            }
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// Deletes the segments a checkpoint starting at `segment` made obsolete.
pub(crate) fn remove_segments_before(dir: &Path, segment: u64) -> io::Result<()> {
    for old in segments(dir)?.into_iter().filter(|&s| s < segment) {
        fs::remove_file(segment_path(dir, old))?;
    }
    Ok(())
}

/// Creates (or opens, to append to) a segment and makes its name durable.
pub(crate) fn open_segment(dir: &Path, segment: u64) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(segment_path(dir, segment))?;
    sync_dir(dir)?;
    Ok(file)
}

/// Applies a segment's records to `map`. In the newest segment (`last`) a bad record ends
/// it and is cut off; in an older one it is corruption.
pub(crate) fn replay(
    dir: &Path,
    segment: u64,
    last: bool,
    map: &mut HashMap<Bytes, Bytes>,
) -> io::Result<()> {
    let path = segment_path(dir, segment);
    let file = OpenOptions::new().read(true).write(true).open(&path)?;
    let size = file.metadata()?.len();
    let mut input = BufReader::with_capacity(1 << 20, &file);
    let mut valid = 0u64;
    while let Some(payload) = next_record(&mut input, size - valid)? {
        if !apply(&payload, map) {
            break;
        }
        valid += 12 + payload.len() as u64;
    }
    if valid < size {
        if !last {
            return Err(corrupt(&path, &format!("bad record at offset {valid}")));
        }
        file.set_len(valid)?;
        file.sync_all()?;
    }
    Ok(())
}

/// The next record's payload, if the segment's remaining `left` bytes start with a whole,
/// intact record.
fn next_record(input: &mut impl Read, left: u64) -> io::Result<Option<Vec<u8>>> {
    if left < 12 {
        return Ok(None);
    }
    let len = read_u64(input)?;
    let stored = read_u32(input)?;
    if len > left - 12 {
        return Ok(None);
    }
    let mut payload = vec![0; len as usize];
    input.read_exact(&mut payload)?;
    Ok((record_crc(&payload) == stored).then_some(payload))
}

fn record_crc(payload: &[u8]) -> u32 {
    crc::update(
        crc::update(0, &(payload.len() as u64).to_le_bytes()),
        payload,
    )
}

fn apply(payload: &[u8], map: &mut HashMap<Bytes, Bytes>) -> bool {
    let Some((&op, rest)) = payload.split_first() else {
        return false;
    };
    let Some((key_len, rest)) = rest.split_first_chunk::<8>() else {
        return false;
    };
    let key_len = u64::from_le_bytes(*key_len);
    if key_len > rest.len() as u64 {
        return false;
    }
    let (key, value) = rest.split_at(key_len as usize);
    match op {
        PUT => {
            map.insert(key.into(), value.into());
        }
        DELETE if value.is_empty() => {
            map.remove(key);
        }
        _ => return false,
    }
    true
}

/// A log record that puts `value` (or deletes, with None).
pub(crate) fn record(key: &[u8], value: Option<&[u8]>) -> Vec<u8> {
    let (op, value) = match value {
        Some(value) => (PUT, value),
        None => (DELETE, &[][..]),
    };
    let mut r = Vec::with_capacity(12 + 9 + key.len() + value.len());
    r.extend_from_slice(&[0; 12]);
    r.push(op);
    r.extend_from_slice(&(key.len() as u64).to_le_bytes());
    r.extend_from_slice(key);
    r.extend_from_slice(value);
    let crc = record_crc(&r[12..]);
    let len = (r.len() - 12) as u64;
    r[..8].copy_from_slice(&len.to_le_bytes());
    r[8..12].copy_from_slice(&crc.to_le_bytes());
    r
}

/// The write-ahead log with group commit: writers append records (under their key's shard
/// lock, so the log orders each key's writes as the map did) and then wait; one waiter at
/// a time writes and fdatasyncs everything appended so far while the others queue behind.
pub(crate) struct Log {
    state: Mutex<LogState>,
    flushed: Condvar,
    /// Every record up to this sequence number is on disk.
    durable: AtomicU64,
}

struct LogState {
    file: Arc<File>,
    pending: Vec<Vec<u8>>,
    /// The last record's sequence number.
    appended: u64,
    flushing: bool,
    /// A failed write or fsync: what is in memory may not be on disk, so nothing more is
    /// acknowledged (retrying fsync after an error can report success for lost pages).
    failed: Option<String>,
}

impl Log {
    pub(crate) fn new(file: File) -> Log {
        Log {
            state: Mutex::new(LogState {
                file: Arc::new(file),
                pending: Vec::new(),
                appended: 0,
                flushing: false,
                failed: None,
            }),
            flushed: Condvar::new(),
            durable: AtomicU64::new(0),
        }
    }

    /// Queues a record; its sequence number is what to wait for.
    pub(crate) fn append(&self, record: Vec<u8>) -> u64 {
        let mut s = lock(&self.state);
        s.pending.push(record);
        s.appended += 1;
        s.appended
    }

    /// Returns once record `lsn` is on disk.
    pub(crate) fn wait(&self, lsn: u64) -> Result<(), Error> {
        if lsn <= self.durable.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut s = lock(&self.state);
        loop {
            if lsn <= self.durable.load(Ordering::Acquire) {
                return Ok(());
            }
            if let Some(e) = &s.failed {
                return Err(Error::Unavailable(e.clone()));
            }
            if s.flushing {
                s = self.flushed.wait(s).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            s.flushing = true;
            let batch = mem::take(&mut s.pending);
            let upto = s.appended;
            let file = s.file.clone();
            drop(s);
            let result = flush(&file, batch);
            s = lock(&self.state);
            s.flushing = false;
            self.settle(&mut s, upto, result);
        }
    }

    fn settle(&self, s: &mut LogState, upto: u64, result: io::Result<()>) {
        match result {
            Ok(()) => self.durable.store(upto, Ordering::Release),
            Err(e) => s.failed = Some(format!("write-ahead log: {e}")),
        }
        self.flushed.notify_all();
    }

    /// Makes everything appended so far durable in the current segment and continues in
    /// `next`. The caller holds every shard lock, so nothing is appended meanwhile.
    pub(crate) fn rotate(&self, next: File) -> io::Result<()> {
        let mut s = lock(&self.state);
        while s.flushing {
            s = self.flushed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(e) = &s.failed {
            return Err(io::Error::other(e.clone()));
        }
        let batch = mem::take(&mut s.pending);
        let upto = s.appended;
        let result = flush(&s.file, batch);
        let failed = result
            .as_ref()
            .err()
            .map(|e| io::Error::new(e.kind(), e.to_string()));
        self.settle(&mut s, upto, result);
        match failed {
            Some(e) => Err(e),
            None => {
                s.file = Arc::new(next);
                Ok(())
            }
        }
    }
}

fn flush(mut file: &File, batch: Vec<Vec<u8>>) -> io::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    file.write_all(&batch.concat())?;
    file.sync_data()
}
