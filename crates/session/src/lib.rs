//! A session's state (XFaaS §3.2): a key-value map held in memory by the session's
//! primary worker. Weak operations are each atomic and applied in order; a strong read
//! opens an atomic read-modify-write on its key that the request's strong write commits.
//! Checkpoints are written atomically and fsynced; `Durability::Wal` also logs every
//! acknowledged write before it returns. Secondary workers reach the primary's state
//! over a Unix socket ([`serve`], [`Remote`]).

mod crc;
mod files;
mod rpc;
mod space;

use std::fmt;
use std::time::Instant;

pub use rpc::{serve, Remote};
pub use space::Space;

/// How a strong read-modify-write is kept linearizable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locking {
    /// A strong read takes the key's lock; the strong write (or the end of the request)
    /// releases it. Other requests' operations on that key wait.
    Pessimistic,
    /// A strong read records the key's version; the strong write commits only if it is
    /// unchanged, else fails with [`Error::Conflict`] and the guest retries.
    Optimistic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// State is on disk after a checkpoint (idle reclaim, shutdown).
    Checkpoint,
    /// Also: every write is in the log, fsynced, before it is acknowledged.
    Wal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Weak,
    Strong,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Optimistic locking: the key changed since this request's strong read.
    Conflict,
    /// A lock was not granted before the request's deadline.
    LockTimeout,
    /// The primary is unreachable (a secondary's RPC failed), or the log write failed.
    Unavailable(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Conflict => f.write_str("the key changed since this request's strong read"),
            Error::LockTimeout => f.write_str("the key's lock was not granted before the deadline"),
            Error::Unavailable(reason) => write!(f, "session state unavailable: {reason}"),
        }
    }
}

impl std::error::Error for Error {}

/// One request's view of the state; `txn` identifies the request (unique within the
/// calling worker), so its open strong reads can be found and released.
pub trait State: Send + Sync {
    fn read(
        &self,
        txn: u64,
        key: &[u8],
        mode: Mode,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, Error>;
    fn write(
        &self,
        txn: u64,
        key: &[u8],
        value: &[u8],
        mode: Mode,
        deadline: Instant,
    ) -> Result<(), Error>;
    /// Whether the key existed.
    fn delete(&self, txn: u64, key: &[u8], deadline: Instant) -> Result<bool, Error>;
    /// The request ended: release whatever it still holds.
    fn finish(&self, txn: u64);
}
