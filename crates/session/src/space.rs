//! The primary's state: a map split into shards, each a mutex and a condvar, so requests
//! on different keys rarely meet and an uncontended operation is one short critical
//! section. A key's pessimistic lock is its entry's owner; waiters sleep on the shard's
//! condvar. Which keys each request has open (locked, or read at some version) is kept in
//! one table, consulted only by strong operations and `finish`.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::files::{self, Bytes, Log};
use crate::{Durability, Error, Locking, Mode, State};

const SHARDS: usize = 64;

/// Which shard holds `key`: an FxHash-style fold, cheaper than the maps' SipHash. Keys
/// chosen to collide only crowd their own session's state into one shard.
fn shard_of(key: &[u8]) -> usize {
    let mut h = key.len() as u64;
    for chunk in key.chunks(8) {
        let mut word = [0; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    (h >> 58) as usize % SHARDS
}

/// A request inside the space: the worker it came from (0 for the primary's own requests,
/// a connection number for a secondary's) above its txn there, so workers' txns never meet.
pub(crate) type Txn = u128;

pub(crate) fn txn(origin: u64, txn: u64) -> Txn {
    (u128::from(origin) << 64) | u128::from(txn)
}

/// Locks, ignoring poison: no critical section here leaves its data half-changed.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Entry {
    /// None while a pessimistic strong read holds the lock of an absent key.
    value: Option<Bytes>,
    version: u64,
    /// The log record that wrote the value: whoever sees it waits until it is durable, so
    /// nothing observed is lost in a crash.
    lsn: u64,
    owner: Option<Txn>,
}

#[derive(Default)]
struct Shard {
    map: HashMap<Bytes, Entry>,
    /// Versions come from here, so a key's version never repeats, even across a delete.
    clock: u64,
    /// The version and lsn of every absent key: the latest of any entry removed here.
    gone: u64,
    gone_lsn: u64,
    waiters: usize,
    len: usize,
    bytes: u64,
}

impl Shard {
    /// The value, version and lsn of `key`; None while a request other than `t` holds its
    /// lock (no request, for None).
    fn observe(&self, key: &[u8], t: Option<Txn>) -> Option<Seen> {
        match self.map.get(key) {
            Some(e) if t.is_some() && e.owner.is_some_and(|o| Some(o) != t) => None,
            Some(e) => Some((e.value.clone(), e.version, e.lsn)),
            None => Some((None, self.gone, self.gone_lsn)),
        }
    }

    /// Takes `key`'s lock for `t` (nobody else holds it); whether `t` did not already.
    fn lock(&mut self, key: &[u8], t: Txn) -> bool {
        if let Some(e) = self.map.get_mut(key) {
            return e.owner.replace(t) != Some(t);
        }
        let entry = Entry {
            value: None,
            version: self.gone,
            lsn: self.gone_lsn,
            owner: Some(t),
        };
        self.map.insert(key.into(), entry);
        true
    }

    /// Releases `key`'s lock if `t` holds it; whether it did.
    fn unlock(&mut self, key: &[u8], t: Txn) -> bool {
        match self.map.get_mut(key) {
            Some(e) if e.owner == Some(t) => {
                e.owner = None;
                if e.value.is_none() {
                    self.remove(key);
                }
                true
            }
            _ => false,
        }
    }

    fn set(&mut self, key: &[u8], value: Option<Bytes>, lsn: u64) {
        self.clock += 1;
        let version = self.clock;
        let size = |v: &Option<Bytes>| v.as_ref().map(|v| (key.len() + v.len()) as u64);
        if let Some(n) = size(&value) {
            self.len += 1;
            self.bytes += n;
        }
        let Some(e) = self.map.get_mut(key) else {
            if let Some(value) = value {
                let entry = Entry {
                    value: Some(value),
                    version,
                    lsn,
                    owner: None,
                };
                self.map.insert(key.into(), entry);
            }
            return;
        };
        if let Some(n) = size(&e.value) {
            self.len -= 1;
            self.bytes -= n;
        }
        *e = Entry {
            value,
            version,
            lsn,
            owner: e.owner,
        };
        if e.value.is_none() && e.owner.is_none() {
            self.remove(key);
        }
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(e) = self.map.remove(key) {
            self.gone = self.gone.max(e.version);
            self.gone_lsn = self.gone_lsn.max(e.lsn);
        }
    }
}

/// A key's value, version and lsn.
type Seen = (Option<Bytes>, u64, u64);

/// A request's open strong reads: each key and the version read (used when optimistic).
type OpenReads = Vec<(Vec<u8>, u64)>;

#[repr(align(128))] // a cache line pair each, so shards do not share one
struct Slot {
    shard: Mutex<Shard>,
    released: Condvar,
}

/// A session's state, as its primary worker holds it. See [`State`] for the semantics.
pub struct Space {
    dir: PathBuf,
    locking: Locking,
    shards: Box<[Slot]>,
    open: Mutex<HashMap<Txn, OpenReads>>,
    log: Option<Log>,
    /// The log segment being written (a checkpoint starts the next); held through one.
    segment: Mutex<u64>,
    origins: AtomicU64,
    _lock: File,
}

impl Space {
    /// Opens the space kept in `dir` (created if missing): its checkpoint, then every log
    /// record written since. A corrupt checkpoint or log segment is an error; only a torn
    /// last record of the log is dropped, since it was never acknowledged.
    pub fn open(dir: &Path, durability: Durability, locking: Locking) -> io::Result<Space> {
        std::fs::create_dir_all(dir)?;
        let dir_lock = files::lock_dir(dir)?;
        let mut map = HashMap::new();
        let mut segment = files::read_checkpoint(dir, &mut map)?;
        files::remove_segments_before(dir, segment)?;
        let segments = files::segments(dir)?;
        for (i, &s) in segments.iter().enumerate() {
            files::replay(dir, s, i + 1 == segments.len(), &mut map)?;
        }
        segment = segment.max(segments.last().copied().unwrap_or(0));
        let log = match durability {
            Durability::Wal => Some(Log::new(files::open_segment(dir, segment)?)),
            Durability::Checkpoint => None,
        };
        let shards: Box<[Slot]> = (0..SHARDS)
            .map(|_| Slot {
                shard: Mutex::default(),
                released: Condvar::new(),
            })
            .collect();
        for (key, value) in map {
            let mut shard = lock(&shards[shard_of(&key)].shard);
            shard.len += 1;
            shard.bytes += (key.len() + value.len()) as u64;
            shard.map.insert(
                key,
                Entry {
                    value: Some(value),
                    version: 0,
                    lsn: 0,
                    owner: None,
                },
            );
        }
        Ok(Space {
            dir: dir.to_owned(),
            locking,
            shards,
            open: Mutex::default(),
            log,
            segment: Mutex::new(segment),
            origins: AtomicU64::new(1),
            _lock: dir_lock,
        })
    }

    /// Writes the whole map to the checkpoint file atomically, then drops the log it covers.
    /// Operations wait only while the map is copied (references, not bytes) and the log
    /// flushed; the file is written after.
    pub fn checkpoint(&self) -> io::Result<()> {
        let mut segment = lock(&self.segment);
        let next = *segment + 1;
        let log_file = match self.log {
            Some(_) => Some(files::open_segment(&self.dir, next)?),
            None => None,
        };
        let shards = self.lock_all();
        let entries = collect(&shards);
        if let (Some(log), Some(file)) = (&self.log, log_file) {
            log.rotate(file)?;
        }
        drop(shards);
        *segment = next;
        files::write_checkpoint(&self.dir, next, &entries)?;
        files::remove_segments_before(&self.dir, next)
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.lock_all().iter().map(|s| s.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys' and values' total size.
    pub fn bytes(&self) -> u64 {
        self.lock_all().iter().map(|s| s.bytes).sum()
    }

    /// Every key and value, as of one moment.
    pub fn entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let entries = collect(&self.lock_all());
        entries
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect()
    }

    /// The key's value, for operators: it does not wait for locks or the log.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let seen = lock(&self.slot(key).shard).observe(key, None);
        seen.and_then(|(value, _, _)| value).map(|v| v.to_vec())
    }

    /// A fresh namespace for one secondary connection's txns.
    pub(crate) fn new_origin(&self) -> u64 {
        self.origins.fetch_add(1, Ordering::Relaxed)
    }

    fn slot(&self, key: &[u8]) -> &Slot {
        &self.shards[shard_of(key)]
    }

    fn lock_all(&self) -> Vec<MutexGuard<'_, Shard>> {
        self.shards.iter().map(|s| lock(&s.shard)).collect()
    }

    /// `key`'s shard and what it holds for `key`, once no other request holds its lock.
    fn acquire<'a>(
        &'a self,
        slot: &'a Slot,
        t: Txn,
        key: &[u8],
        deadline: Instant,
    ) -> Result<(MutexGuard<'a, Shard>, Seen), Error> {
        let mut shard = lock(&slot.shard);
        loop {
            if let Some(seen) = shard.observe(key, Some(t)) {
                return Ok((shard, seen));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::LockTimeout);
            }
            shard.waiters += 1;
            shard = slot
                .released
                .wait_timeout(shard, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            shard.waiters -= 1;
        }
    }

    fn durable(&self, lsn: u64) -> Result<(), Error> {
        match &self.log {
            Some(log) => log.wait(lsn),
            None => Ok(()),
        }
    }

    /// Notes an open strong read of `key` by `t`.
    fn remember(&self, t: Txn, key: &[u8], version: u64) {
        let mut open = lock(&self.open);
        let keys = open.entry(t).or_default();
        match keys.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = version,
            None => keys.push((key.to_vec(), version)),
        }
    }

    /// Drops `t`'s open strong read of `key`, returning the version it read.
    fn forget(&self, t: Txn, key: &[u8]) -> Option<u64> {
        let mut open = lock(&self.open);
        let keys = open.get_mut(&t)?;
        let i = keys.iter().position(|(k, _)| k == key)?;
        let (_, version) = keys.swap_remove(i);
        if keys.is_empty() {
            open.remove(&t);
        }
        Some(version)
    }

    pub(crate) fn read_as(
        &self,
        t: Txn,
        key: &[u8],
        mode: Mode,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, Error> {
        let slot = self.slot(key);
        let (mut shard, (value, version, lsn)) = self.acquire(slot, t, key, deadline)?;
        if mode == Mode::Strong {
            match self.locking {
                Locking::Pessimistic => {
                    if shard.lock(key, t) {
                        self.remember(t, key, version);
                    }
                }
                Locking::Optimistic => self.remember(t, key, version),
            }
        }
        drop(shard);
        self.durable(lsn)?;
        Ok(value.map(|v| v.to_vec()))
    }

    /// Puts `value` (deletes, with None); whether the key existed.
    pub(crate) fn write_as(
        &self,
        t: Txn,
        key: &[u8],
        value: Option<&[u8]>,
        mode: Mode,
        deadline: Instant,
    ) -> Result<bool, Error> {
        // Copies and encodes before taking the lock: values can be megabytes.
        let record = self.log.as_ref().map(|_| files::record(key, value));
        let value: Option<Bytes> = value.map(Bytes::from);
        let slot = self.slot(key);
        let (mut shard, (old, version, mut lsn)) = self.acquire(slot, t, key, deadline)?;
        let strong = mode == Mode::Strong;
        if strong && self.locking == Locking::Optimistic {
            if let Some(seen) = self.forget(t, key) {
                if seen != version {
                    return Err(Error::Conflict);
                }
            }
        }
        let existed = old.is_some();
        // Deleting an absent key changes nothing, so it is neither logged nor versioned.
        if existed || value.is_some() {
            if let (Some(log), Some(record)) = (&self.log, record) {
                lsn = log.append(record);
            }
            shard.set(key, value, lsn);
        }
        if strong && self.locking == Locking::Pessimistic && shard.unlock(key, t) {
            self.forget(t, key);
            if shard.waiters > 0 {
                slot.released.notify_all();
            }
        }
        drop(shard);
        self.durable(lsn)?;
        Ok(existed)
    }

    pub(crate) fn finish_as(&self, t: Txn) {
        let Some(keys) = lock(&self.open).remove(&t) else {
            return;
        };
        if self.locking == Locking::Optimistic {
            return;
        }
        for (key, _) in keys {
            let slot = self.slot(&key);
            let mut shard = lock(&slot.shard);
            if shard.unlock(&key, t) && shard.waiters > 0 {
                slot.released.notify_all();
            }
        }
    }
}

/// References to every present entry of the locked shards.
fn collect(shards: &[MutexGuard<'_, Shard>]) -> Vec<(Bytes, Bytes)> {
    let mut entries = Vec::with_capacity(shards.iter().map(|s| s.len).sum());
    for shard in shards {
        for (key, e) in &shard.map {
            if let Some(value) = &e.value {
                entries.push((key.clone(), value.clone()));
            }
        }
    }
    entries
}

/// The primary's own requests; `txn` is theirs alone (secondaries' are kept apart).
impl State for Space {
    fn read(
        &self,
        txn: u64,
        key: &[u8],
        mode: Mode,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.read_as(self::txn(0, txn), key, mode, deadline)
    }

    fn write(
        &self,
        txn: u64,
        key: &[u8],
        value: &[u8],
        mode: Mode,
        deadline: Instant,
    ) -> Result<(), Error> {
        self.write_as(self::txn(0, txn), key, Some(value), mode, deadline)
            .map(drop)
    }

    /// Waits like a weak write; it does not release the request's lock on the key (only a
    /// strong write or `finish` does).
    fn delete(&self, txn: u64, key: &[u8], deadline: Instant) -> Result<bool, Error> {
        self.write_as(self::txn(0, txn), key, None, Mode::Weak, deadline)
    }

    fn finish(&self, txn: u64) {
        self.finish_as(self::txn(0, txn))
    }
}
